//! Containers: deployed (idempotently, and once when deployed twice at
//! once), inspected and destroyed; one a lost call created but never
//! started, adopted; a name held by a foreign container; and an image built
//! from a context, tagged by its inputs and reused.

use std::time::Duration;

use corbel_provider_docker::{CONTAINER, DockerProvider};
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::testing::TestHost;

use super::{
    Cleanup, IMAGE, container_status, containers_of, deploy, destroy, docker, host, inspect_format,
    resource, retrieve, sleeper, unique_id,
};

#[tokio::test]
async fn container_deploy_inspect_destroy() {
    let host = host().await;
    let web = resource(
        CONTAINER,
        "web",
        json!({
            "image": IMAGE,
            "command": "exec sleep 300",
            "env": { "GREETING": "hi" },
            "ports": [{ "container": 80 }],
            "labels": { "team": "test" },
            "restart": "unless-stopped",
            "limits": { "memory": "64m", "cpus": 0.5 },
        }),
    );
    let _cleanup = Cleanup::of(&[&web]);

    let outputs = deploy(&host, &web).await.unwrap();
    let id = outputs["id"].as_str().unwrap().to_string();
    assert_eq!(outputs["state"], "running", "{outputs}");
    assert_eq!(outputs["image"], IMAGE);
    let name = outputs["name"].as_str().unwrap();
    assert!(name.starts_with("corbel-web-"), "{name}");
    assert_eq!(outputs["ports"][0]["container"], 80);
    assert_eq!(outputs["ports"][0]["protocol"], "tcp");
    assert!(
        outputs["ports"][0]["host"].as_u64().unwrap() > 0,
        "{outputs}"
    );

    // The engine, as another client sees it.
    assert_eq!(containers_of(&web), std::slice::from_ref(&id));
    let labels: Value =
        serde_json::from_str(&inspect_format("container", &id, "{{json .Config.Labels}}").unwrap())
            .unwrap();
    assert_eq!(labels["io.corbel.resource"], web.resource_id.as_str());
    assert_eq!(labels["io.corbel.deployment"], "test-deployment");
    assert_eq!(labels["io.corbel.key"], "web");
    assert_eq!(labels["io.corbel.managed-by"], "corbel-provider-docker");
    assert_eq!(labels["team"], "test");
    assert_eq!(
        inspect_format("container", &id, "{{.HostConfig.Memory}}").unwrap(),
        (64 << 20).to_string()
    );

    // Deploy is idempotent.
    let again = deploy(&host, &web).await.unwrap();
    assert_eq!(again["id"], outputs["id"]);
    assert_eq!(containers_of(&web).len(), 1);

    let inspected = host.inspect(web.clone()).await.unwrap();
    assert!(inspected.present);
    let seen: Value = serde_json::from_str(&inspected.outputs_json).unwrap();
    assert_eq!(seen["id"], outputs["id"]);

    destroy(&host, &web).await.unwrap();
    assert!(containers_of(&web).is_empty());
    assert_eq!(container_status(&id), "gone");
    assert!(!host.inspect(web.clone()).await.unwrap().present);
    // Destroying what is gone succeeds.
    destroy(&host, &web).await.unwrap();
}

#[tokio::test]
async fn deploying_one_resource_twice_at_once_makes_one_container() {
    let host = host().await;
    let web = sleeper("twice");
    let _cleanup = Cleanup::of(&[&web]);
    let (a, b) = tokio::join!(deploy(&host, &web), deploy(&host, &web));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a["id"], b["id"]);
    assert_eq!(containers_of(&web).len(), 1);
    // And a second provider (a restarted one) adopts it as well.
    let other = TestHost::start(DockerProvider::new()).await;
    let c = deploy(&other, &web).await.unwrap();
    assert_eq!(c["id"], a["id"]);
    assert_eq!(containers_of(&web).len(), 1);
    destroy(&other, &web).await.unwrap();
    assert!(containers_of(&web).is_empty());
}

#[tokio::test]
async fn a_container_a_lost_call_created_but_never_started_is_adopted_and_started() {
    let host = host().await;
    let web = sleeper("lost");
    let _cleanup = Cleanup::of(&[&web]);
    let name = format!("corbel-lost-{}", web.resource_id.replace('-', ""));
    let (ok, created) = docker(&[
        "create",
        "--name",
        &name,
        "--label",
        &format!("io.corbel.resource={}", web.resource_id),
        "--label",
        "io.corbel.key=lost",
        "--label",
        "io.corbel.managed-by=corbel-provider-docker",
        IMAGE,
        "sleep",
        "300",
    ]);
    assert!(ok, "{created}");
    assert_eq!(container_status(&created), "created");
    // Inspect finds it already.
    assert!(host.inspect(web.clone()).await.unwrap().present);

    let outputs = deploy(&host, &web).await.unwrap();
    assert_eq!(outputs["id"], created.as_str());
    assert_eq!(outputs["name"], name.as_str());
    assert_eq!(outputs["state"], "running");
    assert_eq!(container_status(&created), "running");
    assert_eq!(containers_of(&web), std::slice::from_ref(&created));
    destroy(&host, &web).await.unwrap();
    assert_eq!(container_status(&created), "gone");
}

#[tokio::test]
async fn a_name_held_by_a_foreign_container_fails_clearly() {
    let host = host().await;
    let foreign = sleeper("foreign");
    let name = format!("corbel-foreign-{}", foreign.resource_id);
    let web = resource(
        CONTAINER,
        "web",
        json!({ "image": IMAGE, "command": ["sleep", "300"], "name": name }),
    );
    let _cleanup = Cleanup::of(&[&foreign, &web]);
    // Labelled with another resource's id, so the guard removes it.
    let (ok, held) = docker(&[
        "create",
        "--name",
        &name,
        "--label",
        &format!("io.corbel.resource={}", foreign.resource_id),
        IMAGE,
        "sleep",
        "300",
    ]);
    assert!(ok, "{held}");
    let failure = deploy(&host, &web).await.unwrap_err();
    assert!(
        failure.message.contains(&name) && failure.message.contains(&held[..12]),
        "{failure:?}"
    );
    assert!(!failure.retryable);
    assert!(containers_of(&web).is_empty());
    assert_eq!(
        container_status(&held),
        "created",
        "the foreign one is untouched"
    );
    // Destroy leaves the foreign container alone (it is not this resource's).
    destroy(&host, &web).await.unwrap();
    assert_eq!(container_status(&held), "created");
}

#[tokio::test]
async fn a_built_image_is_tagged_by_its_inputs_and_reused() {
    let host = host().await;
    let context = tempfile::tempdir().unwrap();
    let marker = unique_id("built");
    std::fs::write(context.path().join("message.txt"), format!("{marker}\n")).unwrap();
    std::fs::write(
        context.path().join("Dockerfile"),
        format!("FROM {IMAGE}\nARG WHO\nCOPY message.txt /message.txt\nRUN echo \"by $WHO\" >> /message.txt\n"),
    )
    .unwrap();
    let config = json!({
        "build": { "context": context.path(), "args": { "WHO": "corbel" } },
        "command": "cat /message.txt; exec sleep 300",
    });
    let one = resource(CONTAINER, "built", config.clone());
    let two = resource(CONTAINER, "built2", config);
    let mut cleanup = Cleanup::of(&[&one, &two]);

    let first = deploy(&host, &one).await.unwrap();
    let tag = first["image"].as_str().unwrap().to_string();
    cleanup.images.push(tag.clone());
    assert!(tag.starts_with("corbel-resource-"), "{first}");
    let second = deploy(&host, &two).await.unwrap();
    assert_eq!(second["image"], tag.as_str(), "same inputs, same tag");
    assert_ne!(second["id"], first["id"]);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let logs = retrieve(&host, "logs", json!({}), Some(&one))
            .await
            .unwrap();
        let text = logs["logs"].as_str().unwrap();
        if text.contains(&marker) && text.contains("by corbel") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "logs: {logs}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    destroy(&host, &one).await.unwrap();
    destroy(&host, &two).await.unwrap();
}
