//! Subscriptions over `/graphql/ws`, in both protocols, fed by the event bus.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::support::{ADMIN_TOKEN, TestApp, data};

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub async fn connect(addr: std::net::SocketAddr, protocol: &str) -> Ws {
    let mut request = format!("ws://{addr}/graphql/ws")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", protocol.parse().unwrap());
    let (ws, response) = tokio_tungstenite::connect_async(request)
        .await
        .expect("websocket connects");
    assert_eq!(response.headers()["sec-websocket-protocol"], protocol);
    ws
}

/// The next JSON message, skipping keep-alives; `None` once the socket closes.
pub async fn next_json(ws: &mut Ws) -> Option<Value> {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("a message within 10s")?;
        match message.ok()? {
            Message::Text(text) => {
                let value: Value = serde_json::from_str(&text).unwrap();
                if matches!(value["type"].as_str(), Some("ka" | "ping" | "pong")) {
                    continue;
                }
                return Some(value);
            }
            Message::Close(_) => return None,
            _ => continue,
        }
    }
}

pub async fn send(ws: &mut Ws, value: Value) {
    ws.send(Message::Text(value.to_string().into()))
        .await
        .unwrap();
}

/// Sends `connection_init` with `payload` and expects the server's ack.
pub async fn init(ws: &mut Ws, payload: Value) {
    send(ws, json!({"type": "connection_init", "payload": payload})).await;
    assert_eq!(next_json(ws).await.unwrap()["type"], "connection_ack");
}

/// Connects with `graphql-transport-ws` as the admin and subscribes to
/// `query` (with `variables`) under id `1`.
pub async fn subscribe(addr: std::net::SocketAddr, query: &str, variables: Value) -> Ws {
    let mut ws = connect(addr, "graphql-transport-ws").await;
    init(
        &mut ws,
        json!({"Authorization": format!("Bearer {ADMIN_TOKEN}")}),
    )
    .await;
    send(
        &mut ws,
        json!({"id": "1", "type": "subscribe", "payload": {"query": query, "variables": variables}}),
    )
    .await;
    ws
}

/// [`subscribe`] to `serverEvents`.
pub async fn subscribe_server_events(addr: std::net::SocketAddr) -> Ws {
    subscribe(
        addr,
        "subscription { serverEvents { __typename ... on ApiTokenCreated { name tokenId } } }",
        json!({}),
    )
    .await
}

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
