//! GraphQL subscription clients over `/graphql/ws`.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

// The admin token of whoever includes this file: the tests' support, or the
// `abuse` bench (which includes it by path).
use super::ADMIN_TOKEN;

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
        let message = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .expect("a message within 30s")?;
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

/// Reads until the server closes the socket and returns its close code (and
/// reason), skipping other messages; `None` if it ends without a close frame.
pub async fn close_code(ws: &mut Ws) -> Option<(u16, String)> {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .expect("the server closes within 10s")?;
        match message.ok()? {
            Message::Close(Some(frame)) => {
                return Some((u16::from(frame.code), frame.reason.to_string()));
            }
            Message::Close(None) => return None,
            _ => continue,
        }
    }
}

/// A `graphql-transport-ws` socket from `from` (any loopback address reaches a
/// server on 127.0.0.1), signed in as the admin, whose client reads nothing
/// after the ack, through a small receive buffer.
pub async fn never_reading(
    addr: std::net::SocketAddr,
    from: std::net::IpAddr,
) -> tokio_tungstenite::WebSocketStream<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.bind((from, 0).into()).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let mut request = format!("ws://{addr}/graphql/ws")
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .unwrap();
    let init = json!({"type": "connection_init", "payload": {"token": ADMIN_TOKEN}});
    ws.send(Message::Text(init.to_string().into()))
        .await
        .unwrap();
    let ack = ws.next().await.unwrap().unwrap();
    assert!(ack.to_text().unwrap().contains("connection_ack"), "{ack:?}");
    ws
}
