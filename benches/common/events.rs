//! A deployment's `deploymentEvents`, followed over the websocket
//! (`graphql-transport-ws`), each event with the moment it arrived: what a
//! bench times a change by.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// `deploymentEvents` of `id` over the websocket, each with the moment it
/// arrived.
pub async fn follow(addr: &str, token: &str, id: &str) -> Events {
    let mut request = format!("ws://{addr}/graphql/ws")
        .into_client_request()
        .expect("request");
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("websocket");
    let send = |v: Value| Message::Text(v.to_string().into());
    ws.send(send(json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {token}") } })))
        .await
        .expect("init");
    let query =
        "subscription($id: ID!) { deploymentEvents(id: $id) { kind nodeKey state message } }";
    ws.send(send(json!({ "id": "1", "type": "subscribe", "payload": { "query": query, "variables": { "id": id } } })))
        .await
        .expect("subscribe");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = ws.next().await {
            let Message::Text(text) = message else {
                continue;
            };
            let at = Instant::now();
            let value: Value = serde_json::from_str(&text).unwrap_or_default();
            match value["type"].as_str() {
                Some("next") => {
                    let event = value["payload"]["data"]["deploymentEvents"].clone();
                    if tx.send((at, event)).is_err() {
                        return;
                    }
                }
                Some("ping") => {
                    let _ = ws.send(send(json!({ "type": "pong" }))).await;
                }
                // The server stopping ends it; a waiting reader says so.
                Some("error" | "complete") => return,
                _ => {}
            }
        }
    });
    Events(rx)
}

/// A deployment's events as they arrived.
pub struct Events(mpsc::UnboundedReceiver<(Instant, Value)>);

impl Events {
    fn is_down(event: &Value) -> bool {
        event["kind"] == "HEALTH" && event["state"] == "DOWN"
    }

    /// When the DOWN event of `label` arrived, after `since`.
    pub async fn down(&mut self, label: &str, since: Instant) -> Instant {
        loop {
            let (at, event) = self.next(since).await;
            if at >= since && Self::is_down(&event) && event["nodeKey"] == label {
                return at;
            }
        }
    }

    /// Waits for the deployment's next COMPLETE (a run's end).
    pub async fn complete(&mut self, round: usize, since: Instant) {
        loop {
            let (_, event) = self.next(since).await;
            if event["kind"] == "STATE" && event["nodeKey"].is_null() {
                match event["state"].as_str() {
                    Some("COMPLETE") => return,
                    Some("FAILED") => panic!("round {round}: the restart failed: {event}"),
                    _ => {}
                }
            }
        }
    }

    /// How long after `since` every one of `labels` was DOWN.
    pub async fn all_down(&mut self, mut labels: BTreeSet<String>, since: Instant) -> Duration {
        let mut last = since;
        while !labels.is_empty() {
            let (at, event) = self.next(since).await;
            if at >= since
                && Self::is_down(&event)
                && let Some(label) = event["nodeKey"].as_str()
                && labels.remove(label)
            {
                last = at;
            }
        }
        last - since
    }

    async fn next(&mut self, since: Instant) -> (Instant, Value) {
        let left = Duration::from_secs(60).saturating_sub(since.elapsed());
        tokio::time::timeout(left, self.0.recv())
            .await
            .expect("an event within 60 s")
            .expect("the subscription runs")
    }
}
