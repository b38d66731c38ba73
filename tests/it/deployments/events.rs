//! A deployment's events over a subscription: the history replayed, then live.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::data;
use crate::support::deployments::{
    WEB, create_blueprint, deploy, destroy, settled, stored_event_ids, with_process_provider,
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
            destroy(&app, &id).await;
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

/// Events older than `[deploy] event_retention_days` are deleted at start
/// (then hourly): a deployment's history moved 100 days back in the store
/// (the only way to have a past) is gone after a restart, a newer one's is
/// kept whole.
#[tokio::test]
async fn events_past_their_retention_are_pruned() {
    use sea_orm::sea_query::Expr;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

    let store = std::sync::Arc::new(crate::support::TestStore::fresh().await);
    let app =
        crate::support::TestApp::spawn_with(store.clone(), crate::support::settings::quick).await;
    // No provider serves the type: each deploy fails at once, with events.
    let blueprint = create_blueprint(
        &app,
        "nowhere",
        "resources:\n  a:\n    type: none.v1.thing\n",
    )
    .await;
    // One after the other: events are written in time order, and the old
    // one's, moved back below, stay before the new one's.
    let old = deploy(&app, &blueprint, "old", json!({})).await;
    settled(&app, &old, &["FAILED"]).await;
    // The state event is stored after the state: wait for it, or it may
    // come after the new one's first events (and, moved back, make the
    // newest stored event an old one: everything is then past retention).
    crate::support::eventually(
        Duration::from_secs(30),
        "the old one's last event",
        || async {
            let body = app
            .gql(
                "query($id: ID!) { deployment(id: $id) { events(first: 10000) { kind state } } }",
                json!({ "id": old }),
            )
            .await;
            let events = data(&body)["deployment"]["events"].clone();
            events
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["kind"] == "STATE" && e["state"] == "FAILED")
                .then_some(())
        },
    )
    .await;
    let new = deploy(&app, &blueprint, "new", json!({})).await;
    settled(&app, &new, &["FAILED"]).await;
    let kept = stored_event_ids(&app, &new).await;
    let gone = stored_event_ids(&app, &old).await;
    assert!(!gone.is_empty() && !kept.is_empty());
    app.stop().await;

    use corbel::store::entities::deployment_event;
    let db = corbel::store::connect(&store.config().database().unwrap())
        .await
        .unwrap();
    deployment_event::Entity::update_many()
        .col_expr(
            deployment_event::Column::At,
            Expr::value(chrono::Utc::now() - chrono::TimeDelta::days(100)),
        )
        .filter(deployment_event::Column::DeploymentId.eq(uuid::Uuid::parse_str(&old).unwrap()))
        .exec(&db)
        .await
        .unwrap();

    let app = crate::support::TestApp::spawn_with(store, |config| {
        crate::support::settings::quick(config);
        config.deploy.event_retention_days = 90;
    })
    .await;
    // (A restart may add events of its own to either.)
    crate::support::eventually(Duration::from_secs(30), "the old events pruned", || async {
        let left = stored_event_ids(&app, &old).await;
        (!gone.iter().any(|id| left.contains(id))).then_some(())
    })
    .await;
    let now = stored_event_ids(&app, &new).await;
    assert!(
        kept.iter().all(|id| now.contains(id)),
        "{kept:?} in {now:?}"
    );
    app.stop().await;
}
