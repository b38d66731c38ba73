//! A failed deploy under `ROLLBACK` with the server SIGKILLed twice: once
//! while it deploys (before the failure), once while it rolls back. After each
//! restart the run goes on as what it was, and it ends `FAILED` with nothing
//! its operation made still running — what was made before the first crash
//! included.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::Server;
use super::observe::Api;
use super::world::{Leftovers, world};
use crate::support::deployments::create_blueprint;
use crate::support::provider_repos::{ProviderRepo, process_metadata};
use crate::support::providers::{create_provider, wait_status};
use crate::support::settings::quick;
use crate::support::{TestApp, TestStore, eventually, journal_deployments};

const GOOD: usize = 30;

/// `GOOD` services that ignore SIGTERM (so each destroy waits out the grace
/// period and the rollback takes a while), and `bad`, which needs them all and
/// cannot start.
fn blueprint(mark: &str) -> String {
    let mut source = String::from("resources:\n");
    for i in 0..GOOD {
        source.push_str(&format!(
            "  g{i}:\n    type: process.v1.service\n    config:\n      command: sh\n      args: [\"-c\", \"trap '' TERM; exec sleep 3600\"]\n      env: {{ CHAOS_MARK: \"{mark}\", CHAOS_KEY: g{i} }}\n"
        ));
    }
    let all: Vec<String> = (0..GOOD).map(|i| format!("g{i}")).collect();
    source.push_str(&format!(
        "  bad:\n    type: process.v1.service\n    depends_on: [{}]\n    config: {{ command: sh, args: [\"-c\", \"exit 7\"] }}\n",
        all.join(", ")
    ));
    source
}

async fn view(api: &Api, id: &str) -> Option<Value> {
    api.gql(
        "query($id: ID!) { deployment(id: $id) { state phase error nodes { key state } events(first: 10000) { message } } }",
        json!({ "id": id }),
    )
    .await
    .ok()
    .map(|data| data["deployment"].clone())
}

fn count(deployment: &Value, state: &str) -> usize {
    deployment["nodes"].as_array().map_or(0, |nodes| {
        nodes.iter().filter(|n| n["state"] == state).count()
    })
}

#[tokio::test]
async fn a_rollback_cut_short_by_crashes_destroys_what_its_operation_made() {
    let mark = uuid::Uuid::new_v4().to_string();
    let _leftovers = Leftovers::new(&mark);
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), quick).await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (provider, _) = create_provider(
        &app,
        json!({ "name": "process", "gitUrl": repo.url(), "config": { "capacity": 500, "grace_ms": 1000 } }),
    )
    .await;
    wait_status(&app, &provider, "CONNECTED").await;
    let blueprint = create_blueprint(&app, "doomed", &blueprint(&mark)).await;
    let store = app.stop().await;

    let slow = [("CORBEL_DEPLOY_CONCURRENCY", "2")];
    let mut server = Server::start_with(&store, &slow);
    let api = server.api();
    let id = eventually(Duration::from_secs(60), "the deploy to start", || async {
        let data = api
            .gql(
                "mutation($input: DeployBlueprintInput!) { deployBlueprint(input: $input) { id } }",
                json!({ "input": { "blueprintId": blueprint, "name": "doomed", "onFailure": "ROLLBACK" } }),
            )
            .await
            .ok()?;
        data["deployBlueprint"]["id"].as_str().map(str::to_owned)
    })
    .await;

    // 1. Killed while deploying, with some services up.
    eventually(Duration::from_secs(60), "some services up", || async {
        let d = view(&api, &id).await?;
        (count(&d, "COMPLETE") >= 6 && d["phase"] == "DEPLOY").then_some(())
    })
    .await;
    server.kill();
    let made_before_the_crash = world(&mark).len();
    assert!(
        made_before_the_crash >= 6,
        "{made_before_the_crash} services"
    );

    // 2. The restarted server goes on, `bad` fails, the rollback starts: it
    // is killed again once the rollback has destroyed a few.
    server = Server::start_with(&store, &slow);
    let api = server.api();
    eventually(
        Duration::from_secs(120),
        "the rollback under way",
        || async {
            let d = view(&api, &id).await?;
            (d["phase"] == "ROLLBACK" && count(&d, "DESTROYED") >= 2).then_some(())
        },
    )
    .await;
    server.kill();

    // 3. The rollback resumes as a rollback and ends FAILED, owning nothing.
    server = Server::start(&store);
    let api = server.api();
    let done = eventually(
        Duration::from_secs(120),
        "the deployment to settle",
        || async {
            let d = view(&api, &id).await?;
            (d["state"] == "FAILED" || d["state"] == "COMPLETE").then_some(d)
        },
    )
    .await;
    assert_eq!(done["state"], "FAILED", "{done}");
    assert_eq!(done["phase"], Value::Null);
    let error = done["error"].as_str().unwrap();
    assert!(error.contains("bad[0]"), "{error}");
    assert!(!error.contains("rollback failed"), "{error}");
    assert_eq!(count(&done, "DESTROYED"), GOOD + 1, "{done}");
    let messages: Vec<&str> = done["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["message"].as_str())
        .collect();
    assert!(
        messages.contains(&"resuming the rollback after a restart"),
        "{messages:?}"
    );
    eventually(
        Duration::from_secs(30),
        "nothing of the operation left running",
        || async { world(&mark).is_empty().then_some(()) },
    )
    .await;
    eventually(Duration::from_secs(30), "the journal to drain", || async {
        journal_deployments(&store)
            .await
            .ok()?
            .is_empty()
            .then_some(())
    })
    .await;
    server.kill();
}
