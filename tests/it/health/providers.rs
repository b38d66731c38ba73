//! Health and the providers that report it: a provider away past its grace
//! leaves its resources UNKNOWN, and they are HEALTHY again when it returns;
//! a provider of protocol 1 (no watch) is asked with `Inspect` at the poll
//! interval.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::support::{fast_health, node, until};
use crate::providers::protocol::loaded;
use crate::support::deployments::{create_blueprint, deploy, settled, with_process_provider};
use crate::support::processes::{provider_pid, signal};
use crate::support::settings::quick;
use crate::support::{TestApp, TestStore};

const ONE: &str = r#"
resources:
  one:
    type: process.v1.service
    config: { command: sleep, args: ["300"] }
"#;

#[tokio::test]
async fn a_provider_away_past_its_grace_leaves_its_resources_unknown_until_it_returns() {
    let (app, provider, _repo) = with_process_provider(|config| {
        fast_health(config);
        // Away long enough to pass the grace before it is started again.
        config.provider.backoff_initial = Duration::from_millis(2000);
        config.provider.backoff_max = Duration::from_millis(2000);
    })
    .await;
    let blueprint = create_blueprint(&app, "one", ONE).await;
    let id = deploy(&app, &blueprint, "one", json!({})).await;
    let deployed = settled(&app, &id, &["COMPLETE"]).await;
    let pid = deployed.node("one").pid().unwrap() as i32;

    signal(provider_pid(&app.store, &provider), libc::SIGKILL);
    let away = until(&app, &id, "UNKNOWN", |d| {
        node(d, "one")["health"] == "UNKNOWN"
    })
    .await;
    let reason = node(&away, "one")["healthReason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(reason.contains("`process` is not connected"), "{reason}");
    // The roll-up follows a moment later.
    until(&app, &id, "the deployment UNKNOWN", |d| {
        d["health"] == "UNKNOWN"
    })
    .await;

    let back = until(&app, &id, "HEALTHY again", |d| {
        node(d, "one")["health"] == "HEALTHY"
    })
    .await;
    assert_eq!(
        node(&back, "one")["outputs"]["pid"],
        pid,
        "the same process, adopted"
    );
    assert!(crate::support::processes::alive(pid));
}

const NOOP: &str = r#"
resources:
  thing:
    type: fixture.v1.noop
    config: { label: a }
"#;

#[tokio::test]
async fn a_provider_of_protocol_1_is_polled_with_inspect() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |config| {
        quick(config);
        fast_health(config);
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (provider, _repo) = loaded(&app, "FIXTURE_PROTOCOL=1", &dir.path().join("calls")).await;
    let blueprint = create_blueprint(&app, "noop", NOOP).await;
    let id = deploy(&app, &blueprint, "noop", json!({})).await;
    settled(&app, &id, &["COMPLETE"]).await;
    until(&app, &id, "HEALTHY", |d| d["health"] == "HEALTHY").await;
    // The fixture keeps what it deployed in memory: a new one finds nothing,
    // and only an `Inspect` can tell.
    signal(provider_pid(&app.store, &provider), libc::SIGKILL);
    let down = until(&app, &id, "DOWN", |d| node(d, "thing")["health"] == "DOWN").await;
    assert_eq!(
        node(&down, "thing")["healthReason"],
        "its provider does not find it"
    );
}

#[tokio::test]
async fn a_drifted_resource_is_named_and_a_plan_puts_it_back() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |config| {
        quick(config);
        fast_health(config);
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let observed = dir.path().join("observed.json");
    let env = format!("FIXTURE_OBSERVED={}", observed.display());
    let (_provider, _repo) = loaded(&app, &env, &dir.path().join("calls")).await;
    let blueprint = create_blueprint(&app, "noop", NOOP).await;
    let id = deploy(&app, &blueprint, "noop", json!({})).await;
    settled(&app, &id, &["COMPLETE"]).await;
    // The provider now sees `label` otherwise than it was deployed.
    std::fs::write(&observed, r#"{"label": "changed by hand"}"#).unwrap();
    let drifted = until(&app, &id, "drift", |d| {
        node(d, "thing")["drift"] == json!(["label"])
    })
    .await;
    assert_eq!(
        node(&drifted, "thing")["health"],
        "HEALTHY",
        "drift is not ill health"
    );
    let body = app
        .gql(
            "mutation($id: ID!) { planDeployment(input: {deploymentId: $id}) { changes { key action config { key before after } } } }",
            json!({ "id": id }),
        )
        .await;
    let changes = &crate::support::data(&body)["planDeployment"]["changes"];
    let thing = changes
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["key"] == "thing")
        .unwrap_or_else(|| panic!("{changes}"));
    assert_eq!(thing["action"], "UPDATE", "{changes}");
    assert_eq!(
        thing["config"],
        json!([{ "key": "label", "before": "changed by hand", "after": "a" }])
    );
}
