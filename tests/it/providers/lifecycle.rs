//! A provider loaded from git, registered, watched live, unloaded and deleted,
//! and providers following their server's restarts and death.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::support::processes::{
    alive, gone, provider_exits_when_its_server_is_killed, provider_pid,
};
use crate::support::provider_repos::{ProviderRepo, process_metadata, workspace_bin};
use crate::support::providers::{
    create_provider, logs, nodes, provider_json, spawn_quick, wait_status,
};
use crate::support::settings::quick;
use crate::support::websocket::{next_json, subscribe};
use crate::support::{TestApp, TestStore, corbel_bin, data, error_code};

#[tokio::test]
async fn a_provider_loads_from_git_registers_and_unloads() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, token) = create_provider(
        &app,
        json!({
            "name": "process",
            "gitUrl": repo.url(),
            "ref": "v1",
            "config": {"capacity": 7},
            "secretConfig": {"password": "hunter2-secret"},
        }),
    )
    .await;
    assert!(token.starts_with("cbp_"), "{token}");

    let connected = wait_status(&app, &id, "CONNECTED").await;
    assert_eq!(connected.resolved_commit, Some(repo.head()));
    let metadata = connected.metadata.as_ref().expect("metadata");
    assert_eq!(metadata.name, "process");
    assert_eq!(metadata.runtime, "shell");
    assert_eq!(
        connected.resource_types,
        ["process.v1.service", "process.v1.job"]
    );
    assert_eq!(connected.secret_config_keys, ["password"]);
    assert_eq!(connected.config, json!({"capacity": 7}));
    assert!(connected.last_seen_at.is_some());
    let features = &connected.features;
    assert!(features.contains(&"deploy".to_owned()), "{features:?}");

    // The stored configuration reached the provider: its node has capacity 7.
    let answer = nodes(&app, &id).await;
    let node = &data(&answer)["provider"]["nodes"][0];
    assert_eq!(node["capacity"]["process.v1.service"], 7, "{answer}");

    // Build and run output and Corbel's notes are in the log; secrets are not.
    let log = logs(&app, &id).await;
    assert!(
        log.contains("[build] building the process provider"),
        "{log}"
    );
    assert!(log.contains("registered:"), "{log}");
    assert!(
        !log.contains("hunter2-secret") && !log.contains(&token),
        "{log}"
    );
    let everything = provider_json(&app, &id).await.to_string();
    assert!(!everything.contains("hunter2-secret"), "{everything}");

    // Deleting is refused while loaded.
    let refused = app
        .gql(
            "mutation($id: ID!) { deleteProvider(id: $id) }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(error_code(&refused), Some("CONFLICT"), "{refused}");

    let pid = provider_pid(&app.store, &id);
    assert!(alive(pid));
    let unloaded = app
        .gql(
            "mutation($id: ID!) { unloadProvider(id: $id) { status } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&unloaded)["unloadProvider"]["status"], "UNLOADED");
    gone(pid).await;
    let answer = nodes(&app, &id).await;
    assert_eq!(
        error_code(&answer),
        Some("PROVIDER_UNAVAILABLE"),
        "{answer}"
    );

    let deleted = app
        .gql(
            "mutation($id: ID!) { deleteProvider(id: $id) }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&deleted)["deleteProvider"], true);
    app.stop().await;
}

#[tokio::test]
async fn provider_events_follow_the_lifecycle_live() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, _) = create_provider(
        &app,
        json!({ "name": "watched", "gitUrl": repo.url(), "autoLoad": false }),
    )
    .await;
    let mut ws = subscribe(
        app.addr,
        "subscription($id: ID!) { providerEvents(id: $id) { status message log { stream line } } }",
        json!({ "id": id }),
    )
    .await;
    // The first event is the status now: from then on the stream is live.
    let first = tokio::time::timeout(Duration::from_secs(10), next_json(&mut ws))
        .await
        .expect("the current status in time")
        .expect("the stream is open");
    assert_eq!(
        first["payload"]["data"]["providerEvents"]["status"],
        "UNLOADED"
    );
    let load = app
        .gql(
            "mutation($id: ID!) { loadProvider(id: $id) { status } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&load)["loadProvider"]["status"], "FETCHING");

    let mut statuses = Vec::new();
    let mut lines = Vec::new();
    while statuses.last().map(String::as_str) != Some("CONNECTED") {
        let message = tokio::time::timeout(Duration::from_secs(60), next_json(&mut ws))
            .await
            .expect("an event in time")
            .expect("the stream stays open");
        let event = &message["payload"]["data"]["providerEvents"];
        if let Some(status) = event["status"].as_str()
            && statuses.last().map(String::as_str) != Some(status)
        {
            statuses.push(status.to_owned());
        }
        if let Some(line) = event["log"]["line"].as_str() {
            lines.push(line.to_owned());
        }
    }
    assert_eq!(
        statuses,
        [
            "FETCHING",
            "BUILDING",
            "STARTING",
            "REGISTERING",
            "CONNECTED"
        ]
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("building the process provider")),
        "{lines:?}"
    );
    app.stop().await;
}

/// Server restarts load `autoLoad` providers again; a provider never outlives
/// its server, even one killed with SIGKILL.
#[tokio::test]
async fn providers_follow_their_server() {
    let store = Arc::new(TestStore::fresh().await);
    let app = TestApp::spawn_with(store.clone(), quick).await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, _) = create_provider(&app, json!({ "name": "follower", "gitUrl": repo.url() })).await;
    wait_status(&app, &id, "CONNECTED").await;
    let pid = provider_pid(&app.store, &id);
    let store = app.stop().await;
    gone(pid).await;

    // The real binary, killed outright: the provider notices and exits.
    provider_exits_when_its_server_is_killed(
        &store,
        &id,
        &[("CORBEL_PROVIDER_HEALTH_INTERVAL_MS", "200")],
    )
    .await;
}

#[test]
fn corbel_bin_and_provider_bins_sit_together() {
    let process = workspace_bin("corbel-provider-process");
    assert_eq!(process.parent(), corbel_bin().parent());
}
