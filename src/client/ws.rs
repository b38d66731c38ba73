//! GraphQL subscriptions over `/graphql/ws`, in `graphql-transport-ws` as
//! the server speaks it (and the web console's `js/api.js` does): the token
//! in `connection_init`, one `subscribe`, then `next` messages until
//! `complete` or `error`. The client pings while it waits, so a server gone
//! without closing the socket is noticed.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::api::Api;
use super::error::ClientError;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Connecting and the `connection_ack` each have this long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);
/// A ping goes out after this long without a message…
const PING_AFTER: Duration = Duration::from_secs(20);
/// …and the server has this long to answer anything before it counts as gone.
const GONE_AFTER: Duration = Duration::from_secs(40);

/// One subscription on a socket of its own.
pub struct Subscription {
    socket: Socket,
    server: String,
    done: bool,
}

impl Subscription {
    /// Opens the socket, signs in with the API's token and subscribes.
    pub async fn start(api: &Api, query: &str, variables: Value) -> Result<Self, ClientError> {
        let url = ws_url(&api.server);
        let server = api.server.clone();
        let unreachable = |e: &dyn std::error::Error| {
            ClientError::Transport(format!(
                "cannot open a websocket to {url}: {}",
                super::error_chain(e)
            ))
        };
        let mut request = url
            .as_str()
            .into_client_request()
            .map_err(|e| unreachable(&e))?;
        request.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            http::HeaderValue::from_static("graphql-transport-ws"),
        );
        let (socket, _) =
            tokio::time::timeout(HANDSHAKE_TIMEOUT, tokio_tungstenite::connect_async(request))
                .await
                .map_err(|_| ClientError::Transport(format!("{url} did not answer in time")))?
                .map_err(|e| unreachable(&e))?;
        let mut subscription = Subscription {
            socket,
            server,
            done: false,
        };
        let payload = match api.token() {
            Some(token) => json!({ "Authorization": format!("Bearer {token}") }),
            None => json!({}),
        };
        subscription
            .send(json!({ "type": "connection_init", "payload": payload }))
            .await?;
        let ack = tokio::time::timeout(HANDSHAKE_TIMEOUT, subscription.message())
            .await
            .map_err(|_| {
                ClientError::Transport(format!("{url} did not acknowledge the connection"))
            })??;
        match ack {
            Some(message) if message["type"] == "connection_ack" => {}
            Some(other) => {
                return Err(ClientError::Transport(format!(
                    "{url} answered `connection_init` with {other}"
                )));
            }
            None => {
                return Err(ClientError::Transport(format!(
                    "{url} closed the connection before acknowledging it"
                )));
            }
        }
        subscription
            .send(json!({
                "id": "1",
                "type": "subscribe",
                "payload": { "query": query, "variables": variables },
            }))
            .await?;
        Ok(subscription)
    }

    /// The next result's `data`; `None` once the server completed the
    /// subscription. A GraphQL error ends it as an error.
    pub async fn next(&mut self) -> Result<Option<Value>, ClientError> {
        if self.done {
            return Ok(None);
        }
        loop {
            let Some(message) = self.message().await? else {
                self.done = true;
                return Err(ClientError::Transport(format!(
                    "the server at {} closed the subscription",
                    self.server
                )));
            };
            match message["type"].as_str() {
                Some("next") => {
                    let payload = &message["payload"];
                    if let Some(error) = payload["errors"].as_array().and_then(|e| e.first()) {
                        self.done = true;
                        return Err(api_error(error));
                    }
                    return Ok(Some(payload["data"].clone()));
                }
                Some("error") => {
                    self.done = true;
                    let first = message["payload"]
                        .as_array()
                        .and_then(|e| e.first())
                        .cloned()
                        .unwrap_or_default();
                    return Err(api_error(&first));
                }
                Some("complete") => {
                    self.done = true;
                    return Ok(None);
                }
                _ => continue,
            }
        }
    }

    /// Ends the subscription and closes the socket, politely and briefly.
    pub async fn close(mut self) {
        let closing = async {
            if !self.done {
                let _ = self.send(json!({ "id": "1", "type": "complete" })).await;
            }
            let _ = self.socket.close(None).await;
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), closing).await;
    }

    async fn send(&mut self, value: Value) -> Result<(), ClientError> {
        self.socket
            .send(Message::Text(value.to_string().into()))
            .await
            .map_err(|e| {
                ClientError::Transport(format!(
                    "the websocket to {} failed: {}",
                    self.server,
                    super::error_chain(&e)
                ))
            })
    }

    /// The next protocol message (pings answered, pongs skipped); `None`
    /// once the socket closed normally. A close the server gives a reason
    /// for is an error with that reason.
    async fn message(&mut self) -> Result<Option<Value>, ClientError> {
        let mut pinged = false;
        loop {
            let wait = if pinged { GONE_AFTER } else { PING_AFTER };
            let next = match tokio::time::timeout(wait, self.socket.next()).await {
                Ok(next) => next,
                Err(_) if pinged => {
                    return Err(ClientError::Transport(format!(
                        "the server at {} stopped answering",
                        self.server
                    )));
                }
                Err(_) => {
                    self.send(json!({ "type": "ping" })).await?;
                    pinged = true;
                    continue;
                }
            };
            pinged = false;
            let message = match next {
                None => return Ok(None),
                Some(Ok(message)) => message,
                Some(Err(e)) => {
                    return Err(ClientError::Transport(format!(
                        "the websocket to {} failed: {}",
                        self.server,
                        super::error_chain(&e)
                    )));
                }
            };
            match message {
                Message::Text(text) => {
                    let value: Value = serde_json::from_str(&text).map_err(|e| {
                        ClientError::Transport(format!("a websocket message that is not JSON: {e}"))
                    })?;
                    match value["type"].as_str() {
                        Some("ping") => self.send(json!({ "type": "pong" })).await?,
                        Some("pong") => {}
                        _ => return Ok(Some(value)),
                    }
                }
                Message::Close(frame) => return closed(frame),
                _ => {}
            }
        }
    }
}

/// A close frame: normal ends are `None`; 4401/4403 mean the token was not
/// taken; anything else carries the server's reason.
fn closed(
    frame: Option<tokio_tungstenite::tungstenite::protocol::CloseFrame>,
) -> Result<Option<Value>, ClientError> {
    let Some(frame) = frame else { return Ok(None) };
    let code = u16::from(frame.code);
    let reason = frame.reason.to_string();
    match code {
        4401 | 4403 => Err(ClientError::NotSignedIn(if reason.is_empty() {
            "the server refused the token".to_owned()
        } else {
            reason
        })),
        _ if frame.code == CloseCode::Normal || frame.code == CloseCode::Away => Ok(None),
        _ => Err(ClientError::Transport(format!(
            "the server closed the websocket ({code}{}{reason})",
            if reason.is_empty() { "" } else { ": " }
        ))),
    }
}

fn api_error(error: &Value) -> ClientError {
    ClientError::Api {
        code: error["extensions"]["code"]
            .as_str()
            .unwrap_or("ERROR")
            .to_owned(),
        message: error["message"]
            .as_str()
            .unwrap_or("an error without a message")
            .to_owned(),
    }
}

/// `http://h:p` → `ws://h:p/graphql/ws`, `https://` → `wss://`.
fn ws_url(server: &str) -> String {
    websocket_url(server, "/graphql/ws")
}

/// The websocket URL of `path` on `server` (`http` becomes `ws`, `https` `wss`).
pub(super) fn websocket_url(server: &str, path: &str) -> String {
    let rest = server
        .strip_prefix("https://")
        .map(|rest| format!("wss://{rest}"))
        .or_else(|| server.strip_prefix("http://").map(|r| format!("ws://{r}")))
        .unwrap_or_else(|| server.to_owned());
    format!("{rest}{path}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn websocket_urls_follow_the_scheme() {
        assert_eq!(
            super::ws_url("http://127.0.0.1:8080"),
            "ws://127.0.0.1:8080/graphql/ws"
        );
        assert_eq!(
            super::ws_url("https://corbel.example/base"),
            "wss://corbel.example/base/graphql/ws"
        );
    }
}
