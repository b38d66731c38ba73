//! Subscriptions over `/graphql/ws`, in both protocols, fed by the event bus.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
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

#[tokio::test]
async fn graphql_transport_ws_closes_with_the_protocol_codes() {
    use crate::support::websocket::close_code;
    let store = std::sync::Arc::new(crate::support::TestStore::fresh().await);
    let app = TestApp::spawn_with(store, |c| {
        c.graphql.ws_init_timeout = Duration::from_millis(300);
    })
    .await;
    let subscription = json!({"query": "subscription { serverEvents { __typename } }"});

    // No connection_init in time.
    let mut ws = connect(app.addr, "graphql-transport-ws").await;
    let (code, reason) = close_code(&mut ws).await.expect("a close frame");
    assert_eq!(code, 4408, "{reason}");
    assert!(reason.contains("timeout"), "{reason}");

    // A refused connection_init.
    let mut ws = connect(app.addr, "graphql-transport-ws").await;
    send(
        &mut ws,
        json!({"type": "connection_init", "payload": {"token": "cbl_wrong"}}),
    )
    .await;
    assert_eq!(close_code(&mut ws).await.expect("a close frame").0, 4403);

    // subscribe before the ack.
    let mut ws = connect(app.addr, "graphql-transport-ws").await;
    send(
        &mut ws,
        json!({"id": "1", "type": "subscribe", "payload": subscription}),
    )
    .await;
    assert_eq!(close_code(&mut ws).await.expect("a close frame").0, 4401);

    // A message that is not the protocol's.
    for malformed in ["not json", r#"{"type": "nonsense"}"#] {
        let mut ws = connect(app.addr, "graphql-transport-ws").await;
        init(&mut ws, json!({})).await;
        ws.send(tokio_tungstenite::tungstenite::Message::Text(
            malformed.into(),
        ))
        .await
        .unwrap();
        assert_eq!(
            close_code(&mut ws).await.expect("a close frame").0,
            4400,
            "{malformed}"
        );
    }

    // A second connection_init.
    let mut ws = connect(app.addr, "graphql-transport-ws").await;
    init(&mut ws, json!({})).await;
    send(&mut ws, json!({"type": "connection_init", "payload": {}})).await;
    assert_eq!(close_code(&mut ws).await.expect("a close frame").0, 4429);

    // Two subscriptions under one id.
    let mut ws = connect(app.addr, "graphql-transport-ws").await;
    init(&mut ws, json!({"token": ADMIN_TOKEN})).await;
    send(
        &mut ws,
        json!({"id": "1", "type": "subscribe", "payload": subscription}),
    )
    .await;
    send(
        &mut ws,
        json!({"id": "1", "type": "subscribe", "payload": subscription}),
    )
    .await;
    assert_eq!(close_code(&mut ws).await.expect("a close frame").0, 4409);

    // An initialised connection outlives the init timeout.
    let mut ws = connect(app.addr, "graphql-transport-ws").await;
    init(&mut ws, json!({"token": ADMIN_TOKEN})).await;
    // Not a wait for something: time has to pass the timeout to show it no
    // longer applies.
    tokio::time::sleep(Duration::from_millis(600)).await;
    send(&mut ws, json!({"type": "ping"})).await;
    let reply = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("a reply within 10s")
        .expect("the socket stays open")
        .unwrap();
    assert!(reply.to_text().unwrap().contains("\"pong\""), "{reply:?}");
}

#[tokio::test]
async fn legacy_graphql_ws_times_out_without_init() {
    use crate::support::websocket::close_code;
    let store = std::sync::Arc::new(crate::support::TestStore::fresh().await);
    let app = TestApp::spawn_with(store, |c| {
        c.graphql.ws_init_timeout = Duration::from_millis(300);
    })
    .await;
    let mut ws = connect(app.addr, "graphql-ws").await;
    let error = next_json(&mut ws).await.expect("a connection_error");
    assert_eq!(error["type"], "connection_error", "{error}");
    assert_eq!(close_code(&mut ws).await.expect("a close frame").0, 4408);
}

#[tokio::test]
async fn server_events_say_when_a_provider_is_created_and_deleted() {
    let app = TestApp::spawn().await;
    let mut ws = crate::support::websocket::subscribe(
        app.addr,
        "subscription { serverEvents { __typename
            ... on ApiTokenCreated { name }
            ... on ProviderCreated { providerId name }
            ... on ProviderDeleted { providerId name } } }",
        json!({}),
    )
    .await;
    // Live once a token's event arrives.
    let event =
        |m: &Value| (m["type"] == "next").then(|| m["payload"]["data"]["serverEvents"].clone());
    created_event_seen(&app, &mut ws, event).await;
    let repo = crate::support::provider_repos::ProviderRepo::new(
        &crate::support::provider_repos::process_metadata(),
        &[],
    );
    let (id, _) = crate::support::providers::create_provider(
        &app,
        json!({ "name": "watched", "gitUrl": repo.url(), "autoLoad": false }),
    )
    .await;
    data(
        &app.gql(
            "mutation($id: ID!) { deleteProvider(id: $id) }",
            json!({ "id": id }),
        )
        .await,
    );
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let message = tokio::time::timeout(Duration::from_secs(10), next_json(&mut ws))
            .await
            .expect("the provider's events within 10s")
            .expect("an event");
        if let Some(e) = event(&message)
            && e["__typename"] != "ApiTokenCreated"
        {
            seen.push(e);
        }
    }
    assert_eq!(
        seen,
        vec![
            json!({ "__typename": "ProviderCreated", "providerId": id, "name": "watched" }),
            json!({ "__typename": "ProviderDeleted", "providerId": id, "name": "watched" }),
        ]
    );
}
