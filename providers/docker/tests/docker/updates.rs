//! Updates in place: a container's limits and restart policy change without
//! restarting its process, and nothing else does.

use corbel_provider_docker::{CONTAINER, NETWORK};
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::testing::{TestHost, outcome};
use corbel_provider_sdk::{Code, Status, proto};

use super::{
    Cleanup, IMAGE, containers_of, deploy, destroy, docker, host, inspect_format, resource,
};

/// `{{.HostConfig.Memory}} {{.HostConfig.MemorySwap}} {{.HostConfig.NanoCpus}}
/// {{.HostConfig.RestartPolicy.Name}}:{{...MaximumRetryCount}}`, as the
/// engine reports them to the CLI.
fn limits_of(id: &str) -> String {
    inspect_format(
        "container",
        id,
        "{{.HostConfig.Memory}} {{.HostConfig.MemorySwap}} {{.HostConfig.NanoCpus}} \
         {{.HostConfig.RestartPolicy.Name}}:{{.HostConfig.RestartPolicy.MaximumRetryCount}}",
    )
    .unwrap()
}

/// The process the container runs: its pid and when it started.
fn process_of(id: &str) -> String {
    inspect_format("container", id, "{{.State.Pid}} {{.State.StartedAt}}").unwrap()
}

async fn update(
    host: &TestHost,
    resource: &proto::Resource,
    previous: &proto::Resource,
) -> Result<Result<Value, proto::Failure>, Status> {
    let previous: Value = serde_json::from_str(&previous.config_json).unwrap();
    let events = host.update(resource.clone(), previous, json!({})).await?;
    Ok(outcome(&events))
}

#[tokio::test]
async fn limits_and_restart_change_in_place_and_nothing_else_does() {
    let host = host().await;
    let base = json!({ "image": IMAGE, "command": "exec sleep 300" });
    let with = |extra: Value| {
        let mut config = base.clone();
        config
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        config
    };
    let first = resource(
        CONTAINER,
        "sized",
        with(json!({ "limits": { "memory": "64m", "cpus": 0.5 }, "restart": "on-failure:3" })),
    );
    let _cleanup = Cleanup::of(&[&first]);
    let at = |config: Value| proto::Resource {
        config_json: config.to_string(),
        ..first.clone()
    };

    // Describe says which keys change in place: a container's limits and
    // restart policy; nothing of a network.
    let net = resource(NETWORK, "net", json!({}));
    let described = host
        .client()
        .describe_resources(proto::DescribeResourcesRequest {
            resources: vec![first.clone(), net],
        })
        .await
        .unwrap()
        .into_inner()
        .descriptions;
    assert_eq!(described.len(), 1, "{described:?}");
    assert_eq!(described[0].updatable_keys, ["limits", "restart"]);

    let outputs = deploy(&host, &first).await.unwrap();
    let id = outputs["id"].as_str().unwrap().to_owned();
    assert_eq!(limits_of(&id), "67108864 134217728 500000000 on-failure:3");
    let process = process_of(&id);

    // Larger limits and another restart policy: the same container, its
    // process never restarted.
    let bigger = at(with(
        json!({ "limits": { "memory": "128m", "cpus": 1.5 }, "restart": "always" }),
    ));
    let updated = update(&host, &bigger, &first).await.unwrap().unwrap();
    assert_eq!(updated["id"], id.as_str(), "{updated}");
    assert_eq!(updated["state"], "running");
    assert_eq!(limits_of(&id), "134217728 268435456 1500000000 always:0");
    assert_eq!(process_of(&id), process);
    assert_eq!(containers_of(&first), std::slice::from_ref(&id));

    // Idempotent: updating to what it has changes nothing.
    let again = update(&host, &bigger, &bigger).await.unwrap().unwrap();
    assert_eq!(again["id"], id.as_str());
    assert_eq!(limits_of(&id), "134217728 268435456 1500000000 always:0");

    // Smaller again works too (swap follows memory down).
    let smaller = at(with(json!({ "limits": { "memory": "32m" } })));
    update(&host, &smaller, &bigger).await.unwrap().unwrap();
    let seen = limits_of(&id);
    let fields: Vec<&str> = seen.split(' ').collect();
    assert_eq!(fields[..2], ["33554432", "67108864"], "{seen}");
    // The CPU limit left the config: the engine cannot clear it, so it is
    // raised to the host's CPUs; no restart policy is "no".
    let (_, cpus) = docker(&["info", "--format", "{{.NCPU}}"]);
    let cpus: i64 = cpus.parse().unwrap();
    assert_eq!(
        fields[2..],
        [(cpus * 1_000_000_000).to_string(), "no:0".into()]
    );

    // No limits at all: memory is raised to the host's (swap as much again).
    let (_, total) = docker(&["info", "--format", "{{.MemTotal}}"]);
    let total: i64 = total.parse().unwrap();
    update(&host, &at(base.clone()), &smaller)
        .await
        .unwrap()
        .unwrap();
    let seen = limits_of(&id);
    assert!(
        seen.starts_with(&format!("{total} {} ", total * 2)),
        "{seen}"
    );
    assert_eq!(process_of(&id), process);

    // A key the engine cannot change in place is refused, naming it; the
    // container is untouched.
    let other = at(with(json!({ "env": { "A": "b" } })));
    let refused = update(&host, &other, &at(base.clone()))
        .await
        .unwrap()
        .unwrap_err();
    assert!(refused.message.contains("`env` changed"), "{refused:?}");
    assert_eq!(process_of(&id), process);

    // A container that is gone is NOT_FOUND.
    destroy(&host, &first).await.unwrap();
    let gone = update(&host, &bigger, &first).await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
}
