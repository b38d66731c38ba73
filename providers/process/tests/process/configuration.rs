//! Configuration, of a resource and of the provider: bad values refused
//! naming the field, and the one node with its configured capacity.

use corbel_provider_process::RESOURCE_TYPE;
use corbel_provider_process::job::JOB_TYPE;
use corbel_provider_process::procfs;
use corbel_provider_sdk::Code;
use corbel_provider_sdk::serde_json::json;
use corbel_provider_sdk::testing::outcome;

use super::{host_in, resource};

#[tokio::test]
async fn bad_configuration_is_refused_naming_the_field() {
    let state = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    let bad = resource(RESOURCE_TYPE, "bad", json!({ "args": ["x"] }));
    let failure = outcome(&host.deploy(bad).await.unwrap()).unwrap_err();
    assert_eq!(failure.message, "config.command: missing");
    assert!(!failure.retryable);
    let bad = resource(
        RESOURCE_TYPE,
        "bad",
        json!({ "command": "sleep", "port": "yes" }),
    );
    let failure = outcome(&host.deploy(bad).await.unwrap()).unwrap_err();
    assert_eq!(failure.message, "config.port: expected true or false");

    let refused = host
        .configure(json!({ "capacity": "lots" }))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains("capacity"),
        "{}",
        refused.message()
    );
    for (config, key) in [
        (json!({ "log_max_bytes": 100 }), "log_max_bytes"),
        (json!({ "log_files": "two" }), "log_files"),
    ] {
        let refused = host.configure(config).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert!(refused.message().starts_with(key), "{}", refused.message());
    }
}

#[tokio::test]
async fn one_node_named_after_the_host_with_the_configured_capacity() {
    let state = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    let nodes = host.list_nodes().await.unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].name, procfs::hostname());
    assert_eq!(nodes[0].capacity[RESOURCE_TYPE], 100);
    assert_eq!(nodes[0].capacity[JOB_TYPE], 100, "jobs, as many");
    assert_eq!(nodes[0].labels["os"], "linux");
    host.configure(json!({ "capacity": 5, "unknown": true }))
        .await
        .unwrap();
    assert_eq!(
        host.list_nodes().await.unwrap()[0].capacity[RESOURCE_TYPE],
        5
    );
    let registration = host.registration();
    assert_eq!(
        registration.features,
        [
            "deploy", "destroy", "inspect", "nodes", "watch", "data", "exec", "files"
        ]
    );
    assert_eq!(registration.resource_types, [RESOURCE_TYPE, JOB_TYPE]);
}
