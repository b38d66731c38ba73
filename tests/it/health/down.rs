//! A workload killed behind Corbel's back: its node DOWN with the reason, the
//! deployment rolled up, HEALTH events in order with the rest, the gauges
//! moved, and the deployments filter.

use serde_json::json;

use super::support::{fast_health, gauge, health_events, node, tagged, until};
use crate::support::deployments::{
    WEB, create_blueprint, deploy, destroy_and_wait, pids, settled, with_process_provider,
};
use crate::support::processes::signal;
use crate::support::{data, eventually};

#[tokio::test]
async fn a_workload_killed_behind_corbels_back_is_down_and_says_why() {
    let (app, _, _repo) = with_process_provider(fast_health).await;
    let blueprint = create_blueprint(&app, "web", WEB).await;
    let id = deploy(&app, &blueprint, "web-1", json!({})).await;
    let deployed = settled(&app, &id, &["COMPLETE"]).await;
    let healthy = until(&app, &id, "the deployment HEALTHY", |d| {
        d["health"] == "HEALTHY"
    })
    .await;
    assert!(
        healthy["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["health"] == "HEALTHY"),
        "{healthy}"
    );
    let db = node(&healthy, "db");
    let db_pid = db["outputs"]["pid"].as_i64().unwrap() as i32;
    assert_eq!(
        tagged(db["id"].as_str().unwrap()),
        [db_pid],
        "one process runs for db"
    );

    signal(db_pid, libc::SIGKILL);
    let down = until(&app, &id, "db DOWN", |d| node(d, "db")["health"] == "DOWN").await;
    let db = node(&down, "db");
    let reason = db["healthReason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("SIGKILL"),
        "the reason names the signal: {reason}"
    );
    assert_eq!(db["state"], "COMPLETE", "health is an axis of its own");
    assert_eq!(down["state"], "COMPLETE");
    let down = until(&app, &id, "the deployment DOWN", |d| d["health"] == "DOWN").await;
    assert!(down["healthChangedAt"].is_string());
    assert_eq!(node(&down, "web")["health"], "HEALTHY", "web still runs");

    let events = health_events(&app, &id).await;
    assert!(
        events
            .iter()
            .any(|(key, state, message)| key.as_deref() == Some("db[0]")
                && state == "DOWN"
                && message.contains("SIGKILL")),
        "a HEALTH event for db: {events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(key, state, _)| key.is_none() && state == "DOWN"),
        "a deployment-level HEALTH event: {events:?}"
    );
    eventually(
        std::time::Duration::from_secs(10),
        "the DOWN gauge",
        || async { (gauge(&app, "DOWN").await >= 1.0).then_some(()) },
    )
    .await;

    let body = app
        .gql(
            "{ deployments(health: DOWN) { nodes { name health } } }",
            json!({}),
        )
        .await;
    let listed = &data(&body)["deployments"]["nodes"];
    assert_eq!(listed, &json!([{ "name": "web-1", "health": "DOWN" }]));
    let body = app
        .gql(
            "{ deployments(health: [HEALTHY, DEGRADED]) { totalCount } }",
            json!({}),
        )
        .await;
    assert_eq!(data(&body)["deployments"]["totalCount"], 0);

    destroy_and_wait(&app, &id, &pids(&deployed)).await;
    let gone = until(&app, &id, "the destroyed deployment UNKNOWN", |d| {
        d["health"] == "UNKNOWN"
    })
    .await;
    assert_eq!(gone["state"], "DESTROYED");
}
