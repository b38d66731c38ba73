//! Networks and volumes: deployed, inspected and destroyed; two containers
//! talking over a network (and not removed while in use); two providers
//! deploying one network at once; and names held by others.

use std::time::Duration;

use corbel_provider_docker::{CONTAINER, NETWORK, VOLUME};
use corbel_provider_sdk::proto;
use corbel_provider_sdk::serde_json::{Value, json};

use super::{
    Cleanup, IMAGE, deploy, destroy, docker, host, inspect_format, resource, retrieve, unique_id,
};

#[tokio::test]
async fn network_and_volume_deploy_inspect_destroy() {
    let host = host().await;
    let net = resource(NETWORK, "net", json!({ "labels": { "team": "test" } }));
    let data = resource(VOLUME, "data", json!({}));
    let _cleanup = Cleanup::of(&[&net, &data]);

    let net_out = deploy(&host, &net).await.unwrap();
    let net_name = net_out["name"].as_str().unwrap().to_string();
    assert!(net_name.starts_with("corbel-net-"), "{net_out}");
    let labels: Value =
        serde_json::from_str(&inspect_format("network", &net_name, "{{json .Labels}}").unwrap())
            .unwrap();
    assert_eq!(labels["io.corbel.resource"], net.resource_id.as_str());
    assert_eq!(labels["team"], "test");
    assert_eq!(
        inspect_format("network", &net_name, "{{.Id}}").unwrap(),
        net_out["id"].as_str().unwrap()
    );
    assert_eq!(deploy(&host, &net).await.unwrap(), net_out, "idempotent");
    let (_, count) = docker(&[
        "network",
        "ls",
        "-q",
        "--filter",
        &format!("name={net_name}"),
    ]);
    assert_eq!(count.lines().count(), 1);
    let seen = host.inspect(net.clone()).await.unwrap();
    assert!(seen.present);
    assert_eq!(
        serde_json::from_str::<Value>(&seen.outputs_json).unwrap(),
        net_out
    );

    let vol_out = deploy(&host, &data).await.unwrap();
    let vol_name = vol_out["name"].as_str().unwrap().to_string();
    assert!(vol_out["mountpoint"].as_str().unwrap().contains(&vol_name));
    assert_eq!(
        inspect_format(
            "volume",
            &vol_name,
            "{{index .Labels \"io.corbel.resource\"}}"
        )
        .unwrap(),
        data.resource_id
    );
    assert_eq!(deploy(&host, &data).await.unwrap(), vol_out, "idempotent");
    assert!(host.inspect(data.clone()).await.unwrap().present);

    destroy(&host, &net).await.unwrap();
    destroy(&host, &data).await.unwrap();
    assert!(inspect_format("network", &net_name, "{{.Id}}").is_none());
    assert!(inspect_format("volume", &vol_name, "{{.Name}}").is_none());
    assert!(!host.inspect(net.clone()).await.unwrap().present);
    assert!(!host.inspect(data.clone()).await.unwrap().present);
    destroy(&host, &net).await.unwrap();
    destroy(&host, &data).await.unwrap();
}

#[tokio::test]
async fn two_containers_talk_over_a_network_and_logs_show_it() {
    let host = host().await;
    let tag = unique_id("net");
    let net_name = format!("corbel-test-{tag}");
    let net = resource(NETWORK, "net", json!({ "name": net_name }));
    let www = resource(VOLUME, "www", json!({}));
    let _early = Cleanup::of(&[&net, &www]);
    deploy(&host, &net).await.unwrap();
    let www_out = deploy(&host, &www).await.unwrap();
    let server = resource(
        CONTAINER,
        "server",
        json!({
            "image": IMAGE,
            "command": "echo served-by-corbel > /www/index.html && exec httpd -f -p 8080 -h /www",
            "network": net_name,
            "aliases": ["web"],
            "mounts": [{ "volume": www_out["name"], "target": "/www" }],
        }),
    );
    let client = resource(
        CONTAINER,
        "client",
        json!({
            "image": IMAGE,
            "command": "while ! wget -qO- http://web:8080/; do sleep 0.2; done; exec sleep 300",
            "network": net_name,
        }),
    );
    let _cleanup = Cleanup::of(&[&server, &client]);

    let server_out = deploy(&host, &server).await.unwrap();
    assert_eq!(server_out["network"], net_name.as_str());
    assert!(
        server_out["ip"].as_str().is_some_and(|ip| !ip.is_empty()),
        "{server_out}"
    );
    deploy(&host, &client).await.unwrap();

    // describe_resources: a container on a blueprint network depends on it.
    let described = host
        .client()
        .describe_resources(proto::DescribeResourcesRequest {
            resources: vec![net.clone(), server.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(described.descriptions.len(), 1);
    assert_eq!(described.descriptions[0].key, "server");
    assert_eq!(described.descriptions[0].depends_on, ["net"]);
    assert_eq!(
        described.descriptions[0].quota.get("containers"),
        Some(&1),
        "each container counts against a project's `containers` quota"
    );

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let logs = retrieve(&host, "logs", json!({ "tail": 50 }), Some(&client))
            .await
            .unwrap();
        if logs["logs"].as_str().unwrap().contains("served-by-corbel") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "client logs: {logs}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A network or volume still in use is not removed: a retryable failure naming it.
    let busy = destroy(&host, &net).await.unwrap_err();
    assert!(
        busy.retryable && busy.message.contains(&net_name),
        "{busy:?}"
    );
    assert!(inspect_format("network", &net_name, "{{.Id}}").is_some());
    let busy = destroy(&host, &www).await.unwrap_err();
    assert!(busy.retryable, "{busy:?}");

    destroy(&host, &client).await.unwrap();
    destroy(&host, &server).await.unwrap();
    destroy(&host, &net).await.unwrap();
    destroy(&host, &www).await.unwrap();
    assert!(inspect_format("network", &net_name, "{{.Id}}").is_none());
}

/// Two providers (an old instance and its successor) deploying one network
/// at once leave one network: the engine allows two of one name, so the
/// provider removes a duplicate it finds after creating.
#[tokio::test]
async fn two_providers_deploying_one_network_at_once_leave_one() {
    let (one, two) = (host().await, host().await);
    let net = resource(NETWORK, "race", json!({}));
    let _cleanup = Cleanup::of(&[&net]);
    let (a, b) = tokio::join!(deploy(&one, &net), deploy(&two, &net));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b);
    let filter = format!("label=io.corbel.resource={}", net.resource_id);
    let (_, listed) = docker(&["network", "ls", "-q", "--filter", &filter]);
    assert_eq!(listed.lines().count(), 1, "{listed}");
    destroy(&one, &net).await.unwrap();
}

#[tokio::test]
async fn network_and_volume_names_held_by_others_fail_clearly() {
    let host = host().await;
    let foreign = resource(NETWORK, "foreign", json!({}));
    let name = format!("corbel-held-{}", foreign.resource_id);
    let net = resource(NETWORK, "net", json!({ "name": name }));
    let vol = resource(VOLUME, "vol", json!({ "name": name }));
    let _cleanup = Cleanup::of(&[&foreign, &net, &vol]);
    let label = format!("io.corbel.resource={}", foreign.resource_id);
    let (ok, out) = docker(&["network", "create", "--label", &label, &name]);
    assert!(ok, "{out}");
    let (ok, out) = docker(&["volume", "create", "--label", &label, &name]);
    assert!(ok, "{out}");

    let failure = deploy(&host, &net).await.unwrap_err();
    assert!(failure.message.contains(&name), "{failure:?}");
    let failure = deploy(&host, &vol).await.unwrap_err();
    assert!(failure.message.contains(&name), "{failure:?}");
    // Nothing of theirs was made, and the others' are untouched.
    assert!(!host.inspect(net.clone()).await.unwrap().present);
    assert!(!host.inspect(vol.clone()).await.unwrap().present);
    destroy(&host, &net).await.unwrap();
    destroy(&host, &vol).await.unwrap();
    assert!(inspect_format("network", &name, "{{.Id}}").is_some());
    assert!(inspect_format("volume", &name, "{{.Name}}").is_some());
}
