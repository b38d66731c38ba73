//! A job cut short by a server SIGKILL (issue 39). The provider goes with
//! its server (its watchdog), the job it started does not (its own session).
//! Two jobs in a chain, each waiting for a file the test creates:
//! - `first` ends while no server and no provider run: the next provider
//!   reads how it ended from its status file and does not run it again;
//! - `second` still runs when the next provider comes: it is waited for, not
//!   started twice.
//!
//! Each job appends to its `runs-<key>` file as it starts: one line each at
//! the end, and the deployment COMPLETE with each job's output.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::Server;
use super::observe::Api;
use super::world::Leftovers;
use crate::support::deployments::create_blueprint;
use crate::support::provider_repos::{ProviderRepo, process_metadata};
use crate::support::providers::{create_provider, wait_status};
use crate::support::settings::quick;
use crate::support::{TestApp, TestStore, eventually};

fn blueprint(mark: &str, dir: &Path) -> String {
    let job = |key: &str| {
        format!(
            r#"command: sh
      args: ["-c", "echo run >> runs-{key}; while [ ! -e go-{key} ]; do sleep 0.05; done; echo done-{key}"]
      cwd: {dir}
      env: {{ CHAOS_MARK: "{mark}", CHAOS_KEY: {key} }}"#,
            dir = dir.display()
        )
    };
    format!(
        r#"
resources:
  first:
    type: process.v1.job
    config:
      {}
  second:
    type: process.v1.job
    depends_on: [first]
    config:
      {}
"#,
        job("first"),
        job("second")
    )
}

fn runs(dir: &Path, key: &str) -> usize {
    std::fs::read_to_string(dir.join(format!("runs-{key}")))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

async fn view(api: &Api, id: &str) -> Option<Value> {
    let query = "query($id: ID!) { deployment(id: $id) { state
      nodes { key state outputs } events(first: 10000) { nodeKey message } } }";
    let data = api.gql(query, json!({ "id": id })).await.ok()?;
    Some(data["deployment"].clone())
}

/// Waits until `key`'s job has started (its first line in its runs file).
async fn started(dir: &Path, key: &str) {
    eventually(
        Duration::from_secs(60),
        &format!("{key} running"),
        || async { (runs(dir, key) >= 1).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn a_job_cut_short_by_a_server_sigkill_runs_to_its_end_once() {
    let mark = uuid::Uuid::new_v4().to_string();
    let _leftovers = Leftovers::new(&mark);
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), quick).await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (provider, _) = create_provider(
        &app,
        json!({ "name": "process", "gitUrl": repo.url(), "config": { "capacity": 10 } }),
    )
    .await;
    wait_status(&app, &provider, "CONNECTED").await;
    let blueprint = create_blueprint(&app, "jobs", &blueprint(&mark, dir)).await;
    let store = app.stop().await;

    let mut server = Server::start(&store);
    let api = server.api();
    let id = eventually(Duration::from_secs(60), "the deploy to start", || async {
        let data = api
            .gql(
                "mutation($input: DeployBlueprintInput!) { deployBlueprint(input: $input) { id } }",
                json!({ "input": { "blueprintId": blueprint, "name": "jobs" } }),
            )
            .await
            .ok()?;
        data["deployBlueprint"]["id"].as_str().map(str::to_owned)
    })
    .await;

    // `first` ends while nothing watches it.
    started(dir, "first").await;
    server.kill();
    std::fs::write(dir.join("go-first"), "").unwrap();
    server = Server::start(&store);

    // `second` still runs when the next provider comes, which waits for it.
    started(dir, "second").await;
    server.kill();
    server = Server::start(&store);
    let api = server.api();
    eventually(Duration::from_secs(60), "the next server", || async {
        view(&api, &id)
            .await
            .filter(|d| d["state"] == "IN_PROGRESS")
    })
    .await;
    std::fs::write(dir.join("go-second"), "").unwrap();

    let done = eventually(Duration::from_secs(60), "COMPLETE", || async {
        view(&api, &id).await.filter(|d| d["state"] == "COMPLETE")
    })
    .await;
    let waited = done["events"].as_array().unwrap().iter().any(|e| {
        e["nodeKey"] == "second[0]"
            && e["message"]
                .as_str()
                .is_some_and(|m| m.contains("started before a restart"))
    });
    assert!(
        waited,
        "the next provider waited for second (runs: {}): {done}",
        runs(dir, "second")
    );
    for key in ["first", "second"] {
        assert_eq!(runs(dir, key), 1, "{key} ran once: {done}");
        let node = done["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["key"] == key)
            .unwrap();
        assert_eq!(node["outputs"]["exitStatus"], 0, "{done}");
        assert_eq!(node["outputs"]["output"], format!("done-{key}"), "{done}");
    }
    server.kill();
}
