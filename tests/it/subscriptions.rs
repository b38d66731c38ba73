//! Subscriptions over `/graphql/ws`, in both protocols, fed by the event bus.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::support::websocket::{Ws, connect, init, next_json, send, subscribe_server_events};
use crate::support::{ADMIN_TOKEN, TestApp, data};

/// Creates API tokens until the subscriber sees one (the subscription may not be
/// registered yet when the first is made) and returns that event.
async fn created_event_seen(
    app: &TestApp,
    ws: &mut Ws,
    next: impl Fn(&Value) -> Option<Value>,
) -> Value {
    for attempt in 0..50 {
        let name = format!("watched-{attempt}");
        data(
            &app.gql(
                "mutation($n: String!) { createApiToken(name: $n) { token } }",
                json!({"n": name}),
            )
            .await,
        );
        if let Ok(Some(message)) =
            tokio::time::timeout(Duration::from_millis(200), next_json(ws)).await
            && let Some(event) = next(&message)
        {
            return event;
        }
    }
    panic!("no serverEvents message arrived");
}

#[tokio::test]
async fn graphql_transport_ws_delivers_bus_events() {
    let app = TestApp::spawn().await;
    let mut ws = subscribe_server_events(app.addr).await;
    let event = created_event_seen(&app, &mut ws, |m| {
        (m["type"] == "next" && m["id"] == "1")
            .then(|| m["payload"]["data"]["serverEvents"].clone())
    })
    .await;
    assert_eq!(event["__typename"], "ApiTokenCreated");
    assert!(event["name"].as_str().unwrap().starts_with("watched-"));
    assert!(
        !event.to_string().contains("cbl_"),
        "no secret in events: {event}"
    );

    send(&mut ws, json!({"id": "1", "type": "complete"})).await;
    send(&mut ws, json!({"type": "ping"})).await;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("a pong within 10s")
            .expect("the socket stays open")
            .unwrap();
        if message.to_text().unwrap().contains("\"pong\"") {
            break;
        }
    }
}

#[tokio::test]
async fn legacy_graphql_ws_delivers_bus_events() {
    let app = TestApp::spawn().await;
    let mut ws = connect(app.addr, "graphql-ws").await;
    init(&mut ws, json!({"token": ADMIN_TOKEN})).await;
    send(
        &mut ws,
        json!({"id": "7", "type": "start", "payload": {"query": "subscription { serverEvents { __typename } }"}}),
    )
    .await;
    let event = created_event_seen(&app, &mut ws, |m| {
        (m["type"] == "data" && m["id"] == "7")
            .then(|| m["payload"]["data"]["serverEvents"].clone())
    })
    .await;
    assert_eq!(event["__typename"], "ApiTokenCreated");
}

#[tokio::test]
async fn subscriptions_need_a_token() {
    let app = TestApp::spawn().await;
    let mut ws = connect(app.addr, "graphql-transport-ws").await;
    init(&mut ws, json!({})).await;
    send(&mut ws, json!({"id": "1", "type": "subscribe", "payload": {"query": "subscription { serverEvents { __typename } }"}})).await;
    let reply = next_json(&mut ws).await.unwrap();
    // async-graphql reports a refused subscription as `next` with errors, then
    // `complete`; `error` is what the protocol also allows.
    let errors = match reply["type"].as_str() {
        Some("next") => &reply["payload"]["errors"],
        Some("error") => &reply["payload"],
        _ => panic!("unexpected reply {reply}"),
    };
    assert_eq!(
        errors[0]["extensions"]["code"], "UNAUTHENTICATED",
        "{reply}"
    );
    assert!(reply["payload"]["data"].is_null());

    // A wrong token in connection_init closes the connection.
    let mut ws = connect(app.addr, "graphql-transport-ws").await;
    send(
        &mut ws,
        json!({"type": "connection_init", "payload": {"token": "cbl_wrong"}}),
    )
    .await;
    assert!(
        next_json(&mut ws).await.is_none(),
        "the server closes the socket"
    );
}

#[tokio::test]
async fn shutdown_completes_open_subscriptions() {
    let app = TestApp::spawn().await;
    let mut ws = subscribe_server_events(app.addr).await;
    // Make sure the subscription is live before stopping.
    created_event_seen(&app, &mut ws, |m| (m["type"] == "next").then(|| m.clone())).await;
    let stopping = tokio::spawn(app.stop());
    let mut saw_complete = false;
    while let Some(message) = next_json(&mut ws).await {
        if message["type"] == "complete" && message["id"] == "1" {
            saw_complete = true;
        }
    }
    assert!(saw_complete, "the stream was completed, not cut");
    stopping.await.unwrap();
}
