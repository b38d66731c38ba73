//! The deployment engine's scheduling and waiting, seen from outside through
//! the real process provider: redeploys from a partly finished DAG, a deploy
//! that arrives while its provider is still building, and events delivered in
//! order while many nodes run at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::support::deployments::{
    create_blueprint, deploy, deployment, destroy_and_wait, pids, settled, stored_event_ids,
    with_process_provider,
};
use crate::support::processes::all_gone;
use crate::support::provider_repos::{ProviderRepo, shell_metadata, workspace_bin};
use crate::support::providers::{create_provider, wait_status};
use crate::support::settings::quick;
use crate::support::types::{Deployment, Event};
use crate::support::websocket::{next_json, subscribe};
use crate::support::{TestApp, TestStore, data};

/// `a; b; c needs a,b; d needs a`, where `c` and `d` read their
/// dependencies' outputs (a dependent started too early fails to render).
const DIAMOND: &str = r#"
resources:
  a:
    type: process.v1.service
    config: { command: sleep, args: ["300"] }
  b:
    type: process.v1.service
    config: { command: sleep, args: ["300"] }
  c:
    type: process.v1.service
    depends_on: [a, b]
    config:
      command: sleep
      args: ["300"]
      env: { A: "{{ resources.a.outputs.pid }}", B: "{{ resources.b.outputs.pid }}" }
  d:
    type: process.v1.service
    depends_on: [a]
    config:
      command: sleep
      args: ["300"]
      env: { A: "{{ resources.a.outputs.pid }}" }
"#;

fn pid_by_key(deployment: &Deployment) -> BTreeMap<String, i64> {
    deployment
        .nodes
        .iter()
        .map(|n| (n.key.clone(), n.pid().unwrap_or(-1)))
        .collect()
}

/// Redeploys `keys` and returns the deployment once it settled, with the
/// events of this redeploy (after its "redeploying" event).
async fn redeploy(app: &TestApp, id: &str, keys: &[&str]) -> (Deployment, Vec<Event>) {
    let body = app
        .gql(
            "mutation($id: ID!, $keys: [String!]!) { redeployDeployment(id: $id, resourceKeys: $keys) { state } }",
            json!({ "id": id, "keys": keys }),
        )
        .await;
    assert_eq!(data(&body)["redeployDeployment"]["state"], "IN_PROGRESS");
    let done = settled(app, id, &["COMPLETE", "FAILED"]).await;
    let events: Vec<Event> = app
        .query_as(
            "query($id: ID!) { deployment(id: $id) { events(first: 10000) { id kind nodeKey state message } } }",
            json!({ "id": id }),
            "deployment.events",
        )
        .await;
    let marker = format!("redeploying {}", keys.join(", "));
    let start = events
        .iter()
        .rposition(|e| e.message.as_deref() == Some(marker.as_str()))
        .unwrap_or_else(|| panic!("no `{marker}` event"));
    (done, events[start..].to_vec())
}

fn position(events: &[Event], node: &str, state: &str) -> usize {
    events
        .iter()
        .position(|e| e.is(node, state))
        .unwrap_or_else(|| panic!("no {node} {state} event in {events:#?}"))
}

fn count(events: &[Event], node: &str, state: &str) -> usize {
    events.iter().filter(|e| e.is(node, state)).count()
}

#[tokio::test]
async fn redeploys_from_a_partly_finished_dag_run_each_node_once_in_order() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(&app, "diamond", DIAMOND).await;
    let id = deploy(&app, &blueprint, "diamond", json!({})).await;
    let first = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(first.state, "COMPLETE", "{first:?}");
    let before = pid_by_key(&first);

    // `d` alone: deployed once, and the run ends.
    let (second, events) = redeploy(&app, &id, &["d"]).await;
    assert_eq!(second.state, "COMPLETE", "{second:?}");
    assert_eq!(count(&events, "d[0]", "IN_PROGRESS"), 1, "{events:#?}");
    assert_eq!(count(&events, "d[0]", "COMPLETE"), 1, "{events:#?}");
    for other in ["a[0]", "b[0]", "c[0]"] {
        assert_eq!(count(&events, other, "IN_PROGRESS"), 0, "{other}");
    }
    let after_d = pid_by_key(&second);
    assert_ne!(after_d["d"], before["d"]);
    for key in ["a", "b", "c"] {
        assert_eq!(after_d[key], before[key], "{key} untouched");
    }
    all_gone(&[before["d"] as i32]).await;

    // `b` and its dependent `c`: `c` goes before `b`, and starts after `b`
    // is back.
    let (third, events) = redeploy(&app, &id, &["b"]).await;
    assert_eq!(third.state, "COMPLETE", "{third:?}");
    assert!(position(&events, "c[0]", "DESTROYED") < position(&events, "b[0]", "DESTROYING"));
    assert!(position(&events, "b[0]", "COMPLETE") < position(&events, "c[0]", "IN_PROGRESS"));
    assert_eq!(count(&events, "b[0]", "IN_PROGRESS"), 1);
    assert_eq!(count(&events, "c[0]", "IN_PROGRESS"), 1);
    let after_b = pid_by_key(&third);
    for key in ["a", "d"] {
        assert_eq!(after_b[key], after_d[key], "{key} untouched");
    }
    for key in ["b", "c"] {
        assert_ne!(after_b[key], after_d[key], "{key} replaced");
    }
    all_gone(&[after_d["b"] as i32, after_d["c"] as i32]).await;
    destroy_and_wait(&app, &id, &pids(&third)).await;
    app.stop().await;
}

/// A provider that is loading (here: a build that takes seconds) makes a
/// deploy wait for it instead of failing with "not connected (BUILDING)".
#[tokio::test]
async fn a_deploy_waits_for_a_provider_that_is_still_building() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), quick).await;
    let metadata = shell_metadata(
        "process",
        "sleep 3",
        &format!(
            "echo $$ > provider.pid; exec {}",
            workspace_bin("corbel-provider-process").display()
        ),
    );
    let repo = ProviderRepo::new(&metadata, &[]);
    let (provider, _) = create_provider(
        &app,
        json!({ "name": "process", "gitUrl": repo.url(), "config": { "grace_ms": 200 } }),
    )
    .await;
    wait_status(&app, &provider, "CONNECTED").await;
    let blueprint = create_blueprint(
        &app,
        "one",
        "resources:\n  s:\n    type: process.v1.service\n    config: { command: sleep, args: [\"300\"] }\n",
    )
    .await;
    for (mutation, status) in [("unloadProvider", "UNLOADED"), ("loadProvider", "FETCHING")] {
        let body = app
            .gql(
                &format!("mutation($id: ID!) {{ {mutation}(id: $id) {{ status }} }}"),
                json!({ "id": provider }),
            )
            .await;
        let now = data(&body)[mutation]["status"].as_str().unwrap().to_owned();
        assert!(
            now == status || (status == "FETCHING" && now == "BUILDING"),
            "{mutation}: {now}"
        );
    }
    let id = deploy(&app, &blueprint, "waits", json!({})).await;
    let body = app
        .gql(
            "query($id: ID!) { provider(id: $id) { status } }",
            json!({ "id": provider }),
        )
        .await;
    let status = data(&body)["provider"]["status"].as_str().unwrap();
    assert!(
        ["FETCHING", "BUILDING", "STARTING", "REGISTERING"].contains(&status),
        "the provider was still loading when the deploy arrived: {status}"
    );
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    destroy_and_wait(&app, &id, &pids(&done)).await;
    app.stop().await;
}

/// Many nodes deploy at once, and a subscriber that joins mid-way gets the
/// stored history and then the live events: every event once, in id order,
/// exactly as the history holds them.
#[tokio::test]
async fn events_arrive_in_order_while_many_nodes_run_at_once() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    let mut source = String::from("resources:\n");
    for i in 0..40 {
        source.push_str(&format!(
            "  r{i}:\n    type: process.v1.service\n    config: {{ command: sleep, args: [\"300\"] }}\n"
        ));
    }
    let all: Vec<String> = (0..40).map(|i| format!("r{i}")).collect();
    source.push_str(&format!(
        "  all:\n    type: process.v1.service\n    depends_on: [{}]\n    config: {{ command: sleep, args: [\"300\"] }}\n",
        all.join(", ")
    ));
    let blueprint = create_blueprint(&app, "wide", &source).await;
    let id = deploy(&app, &blueprint, "wide", json!({})).await;
    let mut ws = subscribe(
        app.addr,
        "subscription($id: ID!) { deploymentEvents(id: $id) { id kind state } }",
        json!({ "id": id }),
    )
    .await;
    let mut streamed: Vec<i64> = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(60), next_json(&mut ws))
            .await
            .expect("an event in time")
            .expect("the stream stays open");
        let event = &message["payload"]["data"]["deploymentEvents"];
        streamed.push(event["id"].as_str().unwrap().parse().unwrap());
        if event["kind"] == "STATE" && (event["state"] == "COMPLETE" || event["state"] == "FAILED")
        {
            assert_eq!(event["state"], "COMPLETE");
            break;
        }
    }
    let stored = stored_event_ids(&app, &id).await;
    assert!(streamed.len() > 120, "{} events", streamed.len());
    assert!(streamed.windows(2).all(|w| w[0] < w[1]), "{streamed:?}");
    assert_eq!(streamed, stored[..streamed.len()], "as stored");
    let done = deployment(&app, &id).await;
    destroy_and_wait(&app, &id, &pids(&done)).await;
    app.stop().await;
}
