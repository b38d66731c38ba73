//! What the health tests share: fast health timings, and reads of a
//! deployment's health through the API.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{TestApp, data, until_seen};

/// Health looked at every 200 ms; a provider away 500 ms is UNKNOWN.
pub fn fast_health(config: &mut corbel::config::Config) {
    config.deploy.health_poll_interval = Duration::from_millis(200);
    config.deploy.health_grace = Duration::from_millis(500);
}

pub const HEALTH_FIELDS: &str = "id state health healthChangedAt nodes { id key replica state outputs health healthReason healthChangedAt restarts drift }";

/// The deployment with its health and its nodes'.
pub async fn health(app: &TestApp, id: &str) -> Value {
    let body = app
        .gql(
            &format!("query($id: ID!) {{ deployment(id: $id) {{ {HEALTH_FIELDS} }} }}"),
            json!({ "id": id }),
        )
        .await;
    data(&body)["deployment"].clone()
}

/// The node of `key` (replica 0) in a [`health`] answer; null while the
/// deployment has none (not placed yet).
pub fn node<'a>(deployment: &'a Value, key: &str) -> &'a Value {
    static NONE: Value = Value::Null;
    deployment["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["key"] == key && n["replica"] == 0))
        .unwrap_or(&NONE)
}

/// Waits until `check` holds of the deployment's health answer.
pub async fn until(app: &TestApp, id: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    until_seen(
        Duration::from_secs(30),
        what,
        || async { Some(health(app, id).await) },
        check,
    )
    .await
}

/// The deployment's HEALTH events: (nodeKey, state, message).
pub async fn health_events(app: &TestApp, id: &str) -> Vec<(Option<String>, String, String)> {
    let body = app
        .gql(
            "query($id: ID!) { deployment(id: $id) { events(first: 10000) { kind nodeKey state message } } }",
            json!({ "id": id }),
        )
        .await;
    data(&body)["deployment"]["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["kind"] == "HEALTH")
        .map(|e| {
            (
                e["nodeKey"].as_str().map(str::to_owned),
                e["state"].as_str().unwrap_or_default().to_owned(),
                e["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The value of `corbel_resources{health="…"}` on `/metrics`.
pub async fn gauge(app: &TestApp, health: &str) -> f64 {
    let text = app.metrics().await;
    let prefix = format!("corbel_resources{{health=\"{health}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0.0, |v| v.trim().parse().unwrap_or(0.0))
}

/// The pids of live processes whose environment carries
/// `CORBEL_RESOURCE_ID=<node id>` (the process provider's tag): what really
/// runs for a node.
pub fn tagged(node_id: &str) -> Vec<i32> {
    let tag = format!("CORBEL_RESOURCE_ID={node_id}");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let alive = crate::support::processes::stat(*pid).is_some_and(|(s, _)| s != 'Z');
            alive
                && std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == tag.as_bytes()))
        })
        .collect()
}
