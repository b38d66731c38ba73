//! A deployment's events over a subscription: the history replayed, then live.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::data;
use crate::support::deployments::{
    WEB, create_blueprint, deploy, settled, stored_event_ids, with_process_provider,
};
use crate::support::websocket::{next_json, subscribe};

#[tokio::test]
async fn deployment_events_replay_history_then_follow_live() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(&app, "web", WEB).await;
    let id = deploy(
        &app,
        &blueprint,
        "watched",
        json!({ "variables": { "replicas": 1 } }),
    )
    .await;
    settled(&app, &id, &["COMPLETE"]).await;

    let mut ws = subscribe(
        app.addr,
        "subscription($id: ID!) { deploymentEvents(id: $id) { id kind nodeKey state message } }",
        json!({ "id": id }),
    )
    .await;
    let mut seen: Vec<Value> = Vec::new();
    let mut destroying = false;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(60), next_json(&mut ws))
            .await
            .expect("an event in time")
            .expect("the stream stays open");
        let event = message["payload"]["data"]["deploymentEvents"].clone();
        let complete = event["kind"] == "STATE" && event["state"] == "COMPLETE";
        let destroyed = event["kind"] == "STATE" && event["state"] == "DESTROYED";
        seen.push(event);
        if complete && !destroying {
            // The replay reached the end of the history: now act, and the
            // rest must arrive live.
            destroying = true;
            let body = app
                .gql(
                    "mutation($id: ID!) { destroyDeployment(id: $id) { id } }",
                    json!({ "id": id }),
                )
                .await;
            data(&body);
        }
        if destroyed {
            break;
        }
    }
    let ids: Vec<i64> = seen
        .iter()
        .map(|e| e["id"].as_str().unwrap().parse().unwrap())
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(ids, sorted, "in order, each once");
    assert!(
        seen.iter()
            .any(|e| e["nodeKey"] == "db[0]" && e["state"] == "DESTROYED")
    );
    app.stop().await;
}

/// `after:` resumes past an event: the history after it, then live; an id
/// that is not one is refused, naming the argument.
#[tokio::test]
async fn deployment_events_resume_after_an_event() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(&app, "web", WEB).await;
    let id = deploy(
        &app,
        &blueprint,
        "resumed",
        json!({ "variables": { "replicas": 1 } }),
    )
    .await;
    settled(&app, &id, &["COMPLETE"]).await;
    let stored = stored_event_ids(&app, &id).await;
    assert!(stored.len() > 3, "{stored:?}");
    let cut = stored[stored.len() / 2];
    let query = "subscription($id: ID!, $after: ID) { deploymentEvents(id: $id, after: $after) { id kind state } }";
    let mut ws = subscribe(
        app.addr,
        query,
        json!({ "id": id, "after": cut.to_string() }),
    )
    .await;
    let mut seen = Vec::new();
    while seen.len() < stored.iter().filter(|e| **e > cut).count() {
        let message = tokio::time::timeout(Duration::from_secs(30), next_json(&mut ws))
            .await
            .expect("an event in time")
            .expect("the stream stays open");
        let event = &message["payload"]["data"]["deploymentEvents"];
        seen.push(event["id"].as_str().unwrap().parse::<i64>().unwrap());
    }
    let wanted: Vec<i64> = stored.iter().copied().filter(|e| *e > cut).collect();
    assert_eq!(seen, wanted, "exactly the history past {cut}");

    let mut refused = subscribe(app.addr, query, json!({ "id": id, "after": "soon" })).await;
    let message = tokio::time::timeout(Duration::from_secs(30), next_json(&mut refused))
        .await
        .expect("an answer in time")
        .expect("an answer");
    // A resolver's refusal comes as a `next` with errors, as for any field.
    let error = &message["payload"]["errors"][0];
    assert_eq!(error["extensions"]["code"], "VALIDATION", "{message}");
    assert!(
        error["message"].as_str().unwrap().contains("after: `soon`"),
        "{message}"
    );
    app.stop().await;
}

#[tokio::test]
async fn server_events_say_when_a_deployment_changes_state() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(&app, "web", WEB).await;
    let mut ws = subscribe(
        app.addr,
        "subscription { serverEvents { __typename
            ... on ApiTokenCreated { name }
            ... on DeploymentChanged { deploymentId state message } } }",
        json!({}),
    )
    .await;
    // Live once one of our own events comes back.
    let mut live = false;
    for attempt in 0..50 {
        data(
            &app.gql(
                "mutation($n: String!) { createApiToken(name: $n) { token } }",
                json!({ "n": format!("probe-{attempt}") }),
            )
            .await,
        );
        if let Ok(Some(_)) =
            tokio::time::timeout(Duration::from_millis(200), next_json(&mut ws)).await
        {
            live = true;
            break;
        }
    }
    assert!(live, "the subscription never delivered");
    let id = deploy(
        &app,
        &blueprint,
        "listed",
        json!({ "variables": { "replicas": 1 } }),
    )
    .await;
    let mut states = Vec::new();
    while !states.contains(&Value::from("COMPLETE")) {
        let message = tokio::time::timeout(Duration::from_secs(30), next_json(&mut ws))
            .await
            .expect("the deployment's state events within 30s")
            .expect("an event");
        let event = &message["payload"]["data"]["serverEvents"];
        if event["__typename"] == "DeploymentChanged" {
            assert_eq!(event["deploymentId"], id.as_str(), "{event}");
            states.push(event["state"].clone());
        }
    }
    assert!(states.contains(&Value::from("IN_PROGRESS")), "{states:?}");
}
