//! Providers that crash, freeze or hang: restarts, health checks, deadlines.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::support::processes::{gone, provider_pid};
use crate::support::provider_repos::{ProviderRepo, fixture_metadata, process_metadata};
use crate::support::providers::{create_provider, logs, nodes, provider, spawn_quick, wait_status};
use crate::support::settings::quick;
use crate::support::{TestApp, TestStore, data, error_code, eventually};

/// A provider that dies after registering is restarted, and its new
/// registration replaces the stale link.
#[tokio::test]
async fn a_crashed_provider_is_restarted_and_its_link_replaced() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, _) = create_provider(&app, json!({ "name": "crashy", "gitUrl": repo.url() })).await;
    wait_status(&app, &id, "CONNECTED").await;
    let first = provider_pid(&app.store, &id);
    // SAFETY: killing the provider process this test started through Corbel.
    assert_eq!(unsafe { libc::kill(first, libc::SIGKILL) }, 0);

    let back = eventually(Duration::from_secs(60), "a restart", || async {
        let p = provider(&app, &id).await;
        (p.restarts == 1 && p.status == "CONNECTED").then_some(p)
    })
    .await;
    assert_eq!(back.restarts, 1);
    let second = provider_pid(&app.store, &id);
    assert_ne!(first, second);
    let answer = nodes(&app, &id).await;
    assert!(data(&answer)["provider"]["nodes"][0]["name"].is_string());
    // Its death is said by its exit status, even when its link's health
    // watch, broken with the process, is seen first.
    let log = logs(&app, &id).await;
    assert!(log.contains("killed by SIGKILL"), "{log}");
    app.stop().await;
    gone(second).await;
}

/// A provider that stops answering (frozen with SIGSTOP) fails its health
/// checks, goes `DISCONNECTED`, and is replaced by a new process.
#[tokio::test]
async fn a_frozen_provider_fails_health_checks_and_is_restarted() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |config| {
        quick(config);
        config.provider.call_timeout = Duration::from_millis(1_000);
        config.provider.stop_grace = Duration::from_millis(300);
    })
    .await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, _) = create_provider(&app, json!({ "name": "frozen", "gitUrl": repo.url() })).await;
    wait_status(&app, &id, "CONNECTED").await;
    let first = provider_pid(&app.store, &id);
    // SAFETY: freezing the provider process this test started through Corbel.
    assert_eq!(unsafe { libc::kill(first, libc::SIGSTOP) }, 0);
    let back = eventually(Duration::from_secs(60), "a restart", || async {
        let p = provider(&app, &id).await;
        (p.restarts == 1 && p.status == "CONNECTED").then_some(p)
    })
    .await;
    assert_eq!(back.restarts, 1);
    gone(first).await;
    let log = logs(&app, &id).await;
    assert!(log.contains("health check failed"), "{log}");
    app.stop().await;
}

/// A provider that never answers costs its caller the deadline and a clear
/// error; a configuration it does not take is not stored.
#[tokio::test]
async fn a_hanging_provider_gets_a_deadline() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |config| {
        quick(config);
        config.provider.call_timeout = Duration::from_millis(1_500);
        // Health checks answer (the fixture hangs only on resource calls).
    })
    .await;
    let repo = ProviderRepo::new(&fixture_metadata("hang"), &[]);
    let (id, _) = create_provider(&app, json!({ "name": "hang", "gitUrl": repo.url() })).await;
    wait_status(&app, &id, "CONNECTED").await;

    let answer = nodes(&app, &id).await;
    assert_eq!(
        error_code(&answer),
        Some("PROVIDER_UNAVAILABLE"),
        "{answer}"
    );
    let message = answer["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("did not answer ListNodes within 1500ms"),
        "{message}"
    );

    let answer = app
        .gql(
            "mutation($id: ID!) { configureProvider(id: $id, config: {hang_configure: true}) { config } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(
        error_code(&answer),
        Some("PROVIDER_UNAVAILABLE"),
        "{answer}"
    );
    assert_eq!(provider(&app, &id).await.config, json!({}));
    app.stop().await;
}
