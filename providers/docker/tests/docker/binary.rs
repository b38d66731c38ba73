//! The real provider binary, started the way Corbel starts it.

use std::process::Command;

use corbel_provider_sdk::serde_json::json;

/// The real binary, started the way Corbel starts it: it registers with what
/// it serves, and a SIGTERM ends it cleanly (it unregisters, exits 0).
#[tokio::test]
async fn the_binary_registers_and_stops_on_sigterm() {
    use corbel_provider_sdk::testing::{DEADLINE, TestRegistry};

    let state = tempfile::tempdir().unwrap();
    let registry = TestRegistry::builder()
        .initial_config(json!({ "capacity": 3 }))
        .start()
        .await;
    let mut provider = tokio::process::Command::new(env!("CARGO_BIN_EXE_corbel-provider-docker"))
        .envs(registry.env("docker-1"))
        .env("CORBEL_STATE_DIR", state.path())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let registered = registry
        .wait_for_registrations(1, DEADLINE)
        .await
        .expect("the binary registers");
    let request = &registered[0].request;
    assert_eq!(request.name, "docker");
    assert_eq!(
        request.resource_types,
        [
            "docker.v1.container",
            "docker.v1.network",
            "docker.v1.volume",
            "docker.v1.job"
        ]
    );
    for feature in [
        "deploy", "destroy", "inspect", "nodes", "data", "power", "watch",
    ] {
        assert!(request.features.iter().any(|f| f == feature), "{feature}");
    }

    let pid = provider.id().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(DEADLINE, provider.wait())
        .await
        .expect("the binary exits after SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(registry.unregistrations().len(), 1);
}
