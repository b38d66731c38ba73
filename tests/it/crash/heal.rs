//! A heal cut short (issue 37): the server SIGKILLed while a `restart:
//! on-failure` resource is being restarted (a `RESTART` run through the
//! journal), then started again on the same data. Two moments: as the run
//! begins, and while it destroys the reader of the restarted resource (a
//! process that ignores SIGTERM, so its destroy waits out the provider's
//! grace). Each time the run is resumed, not made twice: the deployment ends
//! COMPLETE and HEALTHY, and the world runs exactly one process per node —
//! the one Corbel records —, none twice and nothing else with the test's
//! mark. Runs on both databases (`.config/nextest.toml`'s `postgres`
//! profile).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::Server;
use super::observe::Api;
use super::world::{Leftovers, world};
use crate::health::support::tagged;
use crate::support::deployments::create_blueprint;
use crate::support::processes::{alive, signal};
use crate::support::provider_repos::{ProviderRepo, process_metadata};
use crate::support::providers::{create_provider, wait_status};
use crate::support::settings::quick;
use crate::support::{TestApp, TestStore, eventually, until_seen};

/// Health looked at every 200 ms (the process provider watches anyway);
/// short leases, so that on PostgreSQL the restarted server does not wait
/// long for the killed one's to run out.
const HEALTH_ENV: [(&str, &str); 4] = [
    ("CORBEL_DEPLOY_HEALTH_POLL_INTERVAL_MS", "200"),
    ("CORBEL_DEPLOY_HEALTH_GRACE_MS", "5000"),
    ("CORBEL_CLUSTER_HEARTBEAT_MS", "200"),
    ("CORBEL_CLUSTER_LEASE_MS", "2000"),
];

/// `db` heals itself; `web` reads its pid (so a restart replaces it too) and
/// ignores SIGTERM (so its destroy takes the provider's whole grace).
fn blueprint(mark: &str) -> String {
    format!(
        r#"
resources:
  db:
    type: process.v1.service
    restart: {{ policy: on-failure, attempts: 5, window: 10m, delay: 100ms, max_delay: 1s }}
    config:
      command: sleep
      args: ["3600"]
      env: {{ CHAOS_MARK: "{mark}", CHAOS_KEY: db }}
  web:
    type: process.v1.service
    depends_on: [db]
    config:
      command: sh
      args: ["-c", "trap '' TERM; exec sleep 3600"]
      env: {{ CHAOS_MARK: "{mark}", CHAOS_KEY: web, DB_PID: "{{{{ resources.db.outputs.pid }}}}" }}
"#
    )
}

const VIEW: &str = "query($id: ID!) { deployment(id: $id) { state phase health
  nodes { id key state health restarts outputs } events(first: 10000) { at message } } }";

/// What a strike waits for, light enough to poll often under load.
const PHASES: &str = "query($id: ID!) { deployment(id: $id) { state phase nodes { key state } } }";

async fn view(api: &Api, id: &str) -> Option<Value> {
    let data = api.gql(VIEW, json!({ "id": id })).await.ok()?;
    Some(data["deployment"].clone())
}

fn node<'a>(d: &'a Value, key: &str) -> &'a Value {
    d["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["key"] == key))
        .unwrap_or(&Value::Null)
}

fn pid(d: &Value, key: &str) -> i32 {
    node(d, key)["outputs"]["pid"].as_i64().unwrap_or(-1) as i32
}

/// When to strike, once the workload was killed.
#[derive(Clone, Copy, Debug)]
enum Strike {
    /// The deployment IN_PROGRESS in phase RESTART: the run has just begun.
    AsItBegins,
    /// The run under way, destroying `web` (the grace of its SIGTERM).
    WhileItsReaderGoes,
}

impl Strike {
    fn reached(self, d: &Value) -> bool {
        let restarting = d["state"] == "IN_PROGRESS" && d["phase"] == "RESTART";
        match self {
            Strike::AsItBegins => restarting,
            Strike::WhileItsReaderGoes => restarting && node(d, "web")["state"] == "DESTROYING",
        }
    }
}

/// Waits for the deployment to be healed `restarts` times and to settle
/// (COMPLETE, every node HEALTHY); then the world must be exactly what it
/// records: one process per node, the one its outputs name, and no other
/// process with the mark.
async fn healed(api: &Api, id: &str, mark: &str, restarts: i64) -> Value {
    let d = until_seen(
        Duration::from_secs(120),
        &format!("healed {restarts} times, COMPLETE and HEALTHY"),
        || view(api, id),
        |d| {
            let nodes = d["nodes"].as_array().cloned().unwrap_or_default();
            d["state"] == "COMPLETE"
                && d["phase"].is_null()
                && d["health"] == "HEALTHY"
                && node(d, "db")["restarts"] == restarts
                && nodes
                    .iter()
                    .all(|n| n["state"] == "COMPLETE" && n["health"] == "HEALTHY")
        },
    )
    .await;
    let nodes = d["nodes"].as_array().unwrap();
    for n in nodes {
        let recorded = n["outputs"]["pid"].as_i64().unwrap() as i32;
        let running = tagged(n["id"].as_str().unwrap());
        assert_eq!(running, [recorded], "one process for {}: {d}", n["key"]);
    }
    let marked: Vec<(i32, String)> = world(mark)
        .values()
        .map(|p| (p.pid, p.key.clone()))
        .collect();
    assert_eq!(marked.len(), nodes.len(), "nothing else runs: {marked:?}");
    d
}

#[tokio::test]
async fn a_restart_cut_short_by_a_crash_is_resumed_and_made_once() {
    let mark = uuid::Uuid::new_v4().to_string();
    let _leftovers = Leftovers::new(&mark);
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), quick).await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (provider, _) = create_provider(
        &app,
        json!({ "name": "process", "gitUrl": repo.url(), "config": { "capacity": 50, "grace_ms": 1500 } }),
    )
    .await;
    wait_status(&app, &provider, "CONNECTED").await;
    let blueprint = create_blueprint(&app, "healing", &blueprint(&mark)).await;
    let store = app.stop().await;

    let mut server = Server::start_with(&store, &HEALTH_ENV);
    let mut api = server.api();
    let id = eventually(Duration::from_secs(60), "the deploy to start", || async {
        let data = api
            .gql(
                "mutation($input: DeployBlueprintInput!) { deployBlueprint(input: $input) { id } }",
                json!({ "input": { "blueprintId": blueprint, "name": "heals" } }),
            )
            .await
            .ok()?;
        data["deployBlueprint"]["id"].as_str().map(str::to_owned)
    })
    .await;
    let mut before = healed(&api, &id, &mark, 0).await;

    for (round, strike) in [Strike::AsItBegins, Strike::WhileItsReaderGoes]
        .into_iter()
        .enumerate()
    {
        let (db, web) = (pid(&before, "db"), pid(&before, "web"));
        signal(db, libc::SIGKILL);
        // What it saw last is printed if it times out.
        until_seen(
            Duration::from_secs(30),
            &format!("the RESTART run at {strike:?}"),
            || async {
                let data = api.gql(PHASES, json!({ "id": id })).await.ok()?;
                Some(data["deployment"].clone())
            },
            |d| strike.reached(d),
        )
        .await;
        server.kill();
        server = Server::start_with(&store, &HEALTH_ENV);
        api = server.api();

        let restarts = round as i64 + 1;
        let after = healed(&api, &id, &mark, restarts).await;
        let (new_db, new_web) = (pid(&after, "db"), pid(&after, "web"));
        assert_ne!(new_db, db, "{strike:?}: db runs as a new process");
        assert_ne!(new_web, web, "{strike:?}: web reads db's pid: replaced");
        assert!(!alive(web), "{strike:?}: the old web is gone");
        let resumed = after["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["message"] == "resuming after a restart")
            .count();
        assert_eq!(
            resumed, restarts as usize,
            "{strike:?}: each crash cut a run short, which was resumed"
        );
        before = after;
    }
    server.kill();
}
