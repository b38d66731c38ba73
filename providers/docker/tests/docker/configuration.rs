//! Configuration, of a resource and of the provider: the node reporting the
//! engine with its configured capacity, and bad values refused naming the
//! key.

use corbel_provider_docker::CONTAINER;
use corbel_provider_sdk::Code;
use corbel_provider_sdk::serde_json::json;

use super::{Cleanup, IMAGE, containers_of, deploy, host, resource};

#[tokio::test]
async fn list_nodes_reports_the_engine() {
    let host = host().await;
    host.configure(json!({ "capacity": 7 })).await.unwrap();
    let nodes = host.list_nodes().await.unwrap();
    assert_eq!(nodes.len(), 1);
    let node = &nodes[0];
    assert!(!node.name.is_empty());
    assert_eq!(node.capacity["*"], 7);
    assert!(node.labels["cpus"].parse::<u32>().unwrap() >= 1, "{node:?}");
    assert!(node.labels["memory_bytes"].parse::<u64>().unwrap() > 0);
    assert!(!node.labels["engine_version"].is_empty());
    assert_eq!(node.labels["os"], "linux");
}

#[tokio::test]
async fn bad_config_names_the_key() {
    let host = host().await;
    let web = resource(
        CONTAINER,
        "bad",
        json!({ "image": IMAGE, "ports": [{ "container": 0 }] }),
    );
    let _cleanup = Cleanup::of(&[&web]);
    let failure = deploy(&host, &web).await.unwrap_err();
    assert_eq!(
        failure.message,
        "ports[0].container: expected a number 1–65535"
    );
    assert!(!failure.retryable);
    assert!(containers_of(&web).is_empty());

    let missing = resource(
        CONTAINER,
        "noimage",
        json!({ "image": "corbel-no-such-image:0" }),
    );
    let _cleanup_missing = Cleanup::of(&[&missing]);
    let failure = deploy(&host, &missing).await.unwrap_err();
    assert!(
        failure.message.contains("corbel-no-such-image:0") && failure.message.contains("pull"),
        "{failure:?}"
    );

    let refused = host
        .configure(json!({ "capacity": "lots" }))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("capacity"), "{refused:?}");
    let refused = host
        .configure(json!({ "docker_host": 5 }))
        .await
        .unwrap_err();
    assert!(refused.message().contains("docker_host"), "{refused:?}");
}
