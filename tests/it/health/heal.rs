//! Healing: `restart: on-failure` brings a killed workload back with exactly
//! one new process and its reader restarted on the new pid; a workload that
//! keeps dying stops being healed after its attempts; `restartResource`
//! restarts one by hand.

use std::time::Duration;

use serde_json::json;

use super::support::{fast_health, health_events, node, tagged, until};
use crate::support::deployments::{create_blueprint, deploy, settled, with_process_provider};
use crate::support::processes::{alive, signal};
use crate::support::{data, eventually};

/// `db` heals itself; `web` reads its pid; `side` only waits for it.
const HEALING: &str = r#"
resources:
  db:
    type: process.v1.service
    restart: { policy: on-failure, attempts: 3, window: 10m, delay: 100ms, max_delay: 1s }
    config: { command: sleep, args: ["300"] }
  web:
    type: process.v1.service
    depends_on: [db]
    config:
      command: sleep
      args: ["300"]
      env: { DB_PID: "{{ resources.db.outputs.pid }}" }
  side:
    type: process.v1.service
    depends_on: [db]
    config: { command: sleep, args: ["300"] }
"#;

/// The value of `name` in a process's environment.
fn env_of(pid: i32, name: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{name}=");
    env.split(|b| *b == 0)
        .find_map(|v| v.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

fn pid_of(deployment: &serde_json::Value, key: &str) -> i32 {
    node(deployment, key)["outputs"]["pid"].as_i64().unwrap() as i32
}

#[tokio::test]
async fn on_failure_brings_a_killed_workload_back_once_and_its_reader_follows() {
    let (app, _, _repo) = with_process_provider(fast_health).await;
    let blueprint = create_blueprint(&app, "healing", HEALING).await;
    let id = deploy(&app, &blueprint, "heals", json!({})).await;
    settled(&app, &id, &["COMPLETE"]).await;
    let before = until(&app, &id, "HEALTHY", |d| d["health"] == "HEALTHY").await;
    let (db_pid, web_pid, side_pid) = (
        pid_of(&before, "db"),
        pid_of(&before, "web"),
        pid_of(&before, "side"),
    );
    assert_eq!(env_of(web_pid, "DB_PID"), Some(db_pid.to_string()));

    signal(db_pid, libc::SIGKILL);
    let healed = until(&app, &id, "db restarted and HEALTHY", |d| {
        let db = node(d, "db");
        d["state"] == "COMPLETE"
            && db["restarts"] == 1
            && db["health"] == "HEALTHY"
            && db["outputs"]["pid"].as_i64() != Some(db_pid as i64)
    })
    .await;
    let new_db = pid_of(&healed, "db");
    assert!(alive(new_db), "the new db process runs");
    let db_id = node(&healed, "db")["id"].as_str().unwrap().to_owned();
    assert_eq!(tagged(&db_id), [new_db], "exactly one process runs for db");
    let new_web = pid_of(&healed, "web");
    assert_ne!(new_web, web_pid, "web reads db's pid: it was replaced");
    assert_eq!(
        env_of(new_web, "DB_PID"),
        Some(new_db.to_string()),
        "web runs with the new pid"
    );
    assert!(!alive(web_pid), "the old web is gone");
    assert_eq!(
        pid_of(&healed, "side"),
        side_pid,
        "side only waits for db: it stays"
    );
    assert!(alive(side_pid));
    let events = health_events(&app, &id).await;
    assert!(
        events
            .iter()
            .any(|(k, s, _)| k.as_deref() == Some("db[0]") && s == "DOWN"),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_workload_that_keeps_dying_stops_being_healed_after_its_attempts() {
    let (app, _, _repo) = with_process_provider(fast_health).await;
    let starts = tempfile::NamedTempFile::new().unwrap();
    let source = format!(
        r#"
resources:
  flaky:
    type: process.v1.service
    restart: {{ policy: always, attempts: 2, window: 1m, delay: 100ms, max_delay: 200ms }}
    config:
      command: sh
      args: ["-c", "echo start >> {0}; sleep 0.4; exit 3"]
      sandbox: {{ write: ["{0}"] }}
"#,
        starts.path().display()
    );
    let blueprint = create_blueprint(&app, "flaky", &source).await;
    let id = deploy(&app, &blueprint, "flaky", json!({})).await;
    let gave_up = until(&app, &id, "the crash loop stopped", |d| {
        node(d, "flaky")["healthReason"]
            .as_str()
            .is_some_and(|r| r.starts_with("crash loop"))
    })
    .await;
    let flaky = node(&gave_up, "flaky");
    assert_eq!(flaky["health"], "DOWN");
    assert_eq!(flaky["healthReason"], "crash loop: 2 restarts in 1m");
    assert_eq!(flaky["restarts"], 2);
    let count = || {
        std::fs::read_to_string(starts.path())
            .unwrap()
            .lines()
            .count()
    };
    assert_eq!(count(), 3, "started once, then restarted twice");
    // Nothing more starts: the next look would be due well within a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(count(), 3, "healing stopped");
}

#[tokio::test]
async fn restart_resource_restarts_one_replica_by_hand() {
    let (app, _, _repo) = with_process_provider(fast_health).await;
    let blueprint = create_blueprint(&app, "healing", HEALING).await;
    let id = deploy(&app, &blueprint, "by-hand", json!({})).await;
    let before = settled(&app, &id, &["COMPLETE"]).await;
    let old = before.node("db").pid().unwrap();
    let body = app
        .gql(
            "mutation($id: ID!) { restartResource(deploymentId: $id, key: \"db\") { state } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&body)["restartResource"]["state"], "IN_PROGRESS");
    let after = until(&app, &id, "restarted", |d| {
        d["state"] == "COMPLETE" && node(d, "db")["restarts"] == 1
    })
    .await;
    assert_ne!(pid_of(&after, "db") as i64, old);
    eventually(Duration::from_secs(10), "the old db gone", || async {
        (!alive(old as i32)).then_some(())
    })
    .await;
    let body = app
        .gql(
            "mutation($id: ID!) { restartResource(deploymentId: $id, key: \"nope\") { state } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "NOT_FOUND",
        "{body}"
    );
}
