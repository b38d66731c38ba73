//! The websocket at `/graphql/ws`: the upgrade, then one task per connection
//! that runs async-graphql's protocol handler with what it lacks of
//! graphql-transport-ws (see [`serve_ws`]), until the client leaves or the
//! server shuts down.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_graphql::Data;
use async_graphql::http::{ALL_WEBSOCKET_PROTOCOLS, WebSocketProtocols, WsMessage};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, Stream, StreamExt};
use tokio::sync::mpsc::UnboundedSender;

use super::caller::{authenticate, caller_from_headers, client_of};
use super::{HttpState, api_error_response, edge_error};
use crate::api::{Caller, ClientAddress, ErrorCode};
use crate::auth::Auth;

pub async fn graphql_ws(
    State(state): State<HttpState>,
    upgrade: WebSocketUpgrade,
    parts: axum::http::request::Parts,
) -> Response {
    let headers = &parts.headers;
    let Some(protocol) = ws_protocol(headers) else {
        return edge_error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            "Sec-WebSocket-Protocol must name graphql-transport-ws or graphql-ws",
        );
    };
    let caller = match caller_from_headers(&state.auth, headers).await {
        Ok(caller) => caller,
        Err(e) => return api_error_response(StatusCode::INTERNAL_SERVER_ERROR, e),
    };
    let client = client_of(&parts, &state.trusted_proxies);
    let tasks = state.ws_tasks.clone();
    let max_message = state.limits.max_body_bytes;
    upgrade
        .protocols(ALL_WEBSOCKET_PROTOCOLS)
        .max_message_size(max_message)
        .max_frame_size(max_message)
        .on_upgrade(move |socket| {
            tasks.track_future(serve_ws(state, socket, protocol, caller, client))
        })
}

/// The first GraphQL subprotocol the client offers that we speak.
fn ws_protocol(headers: &HeaderMap) -> Option<WebSocketProtocols> {
    headers
        .get(header::SEC_WEBSOCKET_PROTOCOL)?
        .to_str()
        .ok()?
        .split(',')
        .find_map(|p| p.trim().parse::<WebSocketProtocols>().ok())
}

/// graphql-transport-ws close codes (the protocol's PROTOCOL.md).
mod close {
    pub const BAD_REQUEST: u16 = 4400;
    pub const UNAUTHORIZED: u16 = 4401;
    pub const FORBIDDEN: u16 = 4403;
    pub const INIT_TIMEOUT: u16 = 4408;
    pub const DUPLICATE_ID: u16 = 4409;
}

/// Runs one websocket connection until the client leaves or the server shuts
/// down; then it says goodbye with a close frame rather than dropping the line.
///
/// async-graphql's `WebSocket` speaks both protocols; this adds what it lacks
/// of graphql-transport-ws: the `connection_init` timeout (4408, for the legacy
/// protocol too), a duplicate subscription id (4409), and the protocol's close
/// codes where it uses generic ones: a malformed message is 4400 (not 1002), a
/// refused `connection_init` 4403 (not 1002), `subscribe` before the ack 4401
/// (not 1011). A second `connection_init` is 4429 already.
async fn serve_ws(
    state: HttpState,
    socket: WebSocket,
    protocol: WebSocketProtocols,
    from_headers: Caller,
    client: ClientAddress,
) {
    let (mut sink, stream) = socket.split();
    let tracked = Tracked::default();
    let (violation, mut violations) = tokio::sync::mpsc::unbounded_channel::<(u16, String)>();
    let input = client_messages(stream, tracked.clone(), violation, protocol);
    let auth = state.auth.clone();
    let refused = tracked.init_refused.clone();
    let connection = async_graphql::http::WebSocket::new(state.schema.clone(), input, protocol)
        .on_connection_init(move |payload| init_data(auth, refused, from_headers, client, payload));
    let mut connection = std::pin::pin!(connection);
    let init_deadline = tokio::time::sleep(state.limits.ws_init_timeout);
    let mut init_deadline = std::pin::pin!(init_deadline);
    let mut closing = false;
    loop {
        if closing && tracked.open().is_empty() {
            break;
        }
        let message = tokio::select! {
            message = connection.next() => message,
            Some((code, reason)) = violations.recv() => Some(WsMessage::Close(code, reason)),
            _ = &mut init_deadline, if !tracked.init_seen.load(Ordering::SeqCst) => {
                if tracked.init_seen.load(Ordering::SeqCst) {
                    continue;
                }
                Some(init_timeout(&mut sink, protocol).await)
            }
            _ = state.ws_close.cancelled(), if !closing => {
                closing = true;
                continue;
            }
        };
        let Some(message) = message else {
            // The client went away.
            return;
        };
        if !forward(&mut sink, message, protocol, &tracked).await {
            return;
        }
    }
    let frame = CloseFrame {
        code: axum::extract::ws::close_code::AWAY,
        reason: "server shutting down".into(),
    };
    let _ = sink.send(Message::Close(Some(frame))).await;
}

/// The server's half of the socket.
type Sink = SplitSink<WebSocket, Message>;

/// What one connection tracks of the protocol, shared by the reader of the
/// client's messages, the `connection_init` handler and the writer.
#[derive(Clone, Default)]
struct Tracked {
    /// The subscriptions this client has open, so shutdown can wait for their
    /// `complete` before closing the socket.
    open: Arc<Mutex<HashSet<String>>>,
    /// Whether `connection_init` came: its timeout no longer applies.
    init_seen: Arc<AtomicBool>,
    /// Whether `connection_init` was refused: async-graphql's close for it
    /// is then 4403, not 4400.
    init_refused: Arc<AtomicBool>,
}

impl Tracked {
    fn open(&self) -> MutexGuard<'_, HashSet<String>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The client's messages as async-graphql reads them, noting `connection_init`
/// and the subscriptions opened and ended on the way. A subscription id
/// already open is a violation of graphql-transport-ws: the message is
/// dropped and the violation sent to `violation`.
fn client_messages(
    stream: SplitStream<WebSocket>,
    tracked: Tracked,
    violation: UnboundedSender<(u16, String)>,
    protocol: WebSocketProtocols,
) -> impl Stream<Item = Bytes> + Send + 'static {
    stream
        .take_while(|message| std::future::ready(message.is_ok()))
        .filter_map(move |message| {
            let bytes = match message {
                Ok(Message::Text(text)) => Bytes::from(text),
                Ok(Message::Binary(bytes)) => bytes,
                _ => return std::future::ready(None),
            };
            let envelope = Envelope::read(&bytes);
            let mut open = tracked.open();
            match envelope {
                Some(Envelope { kind, .. }) if kind == "connection_init" => {
                    tracked.init_seen.store(true, Ordering::SeqCst);
                }
                // A subscription id already open is a violation of graphql-transport-ws.
                Some(Envelope { kind, id: Some(id) })
                    if (kind == "subscribe" || kind == "start")
                        && !open.insert(id.clone())
                        && protocol == WebSocketProtocols::GraphQLWS =>
                {
                    let _ = violation.send((
                        close::DUPLICATE_ID,
                        format!("Subscriber for {id} already exists"),
                    ));
                    return std::future::ready(None);
                }
                Some(Envelope { kind, id: Some(id) }) if kind == "complete" || kind == "stop" => {
                    open.remove(&id);
                }
                _ => {}
            }
            std::future::ready(Some(bytes))
        })
}

/// The request data of a connection once `connection_init` came: the caller
/// its token names (refused when the token is not valid), else the one the
/// upgrade's headers named.
async fn init_data(
    auth: Auth,
    refused: Arc<AtomicBool>,
    from_headers: Caller,
    client: ClientAddress,
    payload: serde_json::Value,
) -> async_graphql::Result<Data> {
    let caller = match token_from_init(&payload) {
        Some(token) => match authenticate(&auth, &token).await {
            Ok(Some(principal)) => Caller::SignedIn(principal),
            Ok(None) => {
                refused.store(true, Ordering::SeqCst);
                return Err(async_graphql::Error::new("Forbidden: invalid token"));
            }
            Err(e) => {
                refused.store(true, Ordering::SeqCst);
                return Err(e.into());
            }
        },
        None => from_headers,
    };
    let mut data = Data::default();
    data.insert(caller);
    data.insert(client);
    Ok(data)
}

/// The close for a client that sent no `connection_init` in time; the legacy
/// protocol is first told why in a `connection_error`.
async fn init_timeout(sink: &mut Sink, protocol: WebSocketProtocols) -> WsMessage {
    let reason = "Connection initialisation timeout";
    if protocol == WebSocketProtocols::SubscriptionsTransportWS {
        let error = serde_json::json!({
            "type": "connection_error",
            "payload": {"message": reason},
        });
        let _ = sink.send(Message::Text(error.to_string().into())).await;
    }
    WsMessage::Close(close::INIT_TIMEOUT, reason.to_owned())
}

/// Sends one of async-graphql's messages to the client, in the protocol's
/// close codes; `false` once the connection is over (a close sent, or the
/// client gone).
async fn forward(
    sink: &mut Sink,
    message: WsMessage,
    protocol: WebSocketProtocols,
    tracked: &Tracked,
) -> bool {
    let sent = match message {
        WsMessage::Text(text) => {
            if let Some(Envelope { kind, id: Some(id) }) = Envelope::read(text.as_bytes())
                && (kind == "complete" || kind == "error")
            {
                tracked.open().remove(&id);
            }
            sink.send(Message::Text(text.into())).await
        }
        WsMessage::Close(code, reason) => {
            let (code, reason) = match protocol {
                WebSocketProtocols::GraphQLWS => {
                    protocol_close(code, reason, tracked.init_refused.load(Ordering::SeqCst))
                }
                WebSocketProtocols::SubscriptionsTransportWS => (code, reason),
            };
            let frame = CloseFrame {
                code,
                reason: close_reason(reason).into(),
            };
            let _ = sink.send(Message::Close(Some(frame))).await;
            return false;
        }
    };
    sent.is_ok()
}

/// A close frame's reason fits in 123 bytes; a longer one (serde's list of
/// expected message types) would fail the frame itself.
pub(super) fn close_reason(mut reason: String) -> String {
    const MAX: usize = 123;
    if reason.len() > MAX {
        let mut end = MAX;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
    }
    reason
}

/// The graphql-transport-ws close code for one async-graphql gives.
pub(super) fn protocol_close(code: u16, reason: String, init_refused: bool) -> (u16, String) {
    match code {
        1002 if init_refused => (close::FORBIDDEN, reason),
        1002 => (close::BAD_REQUEST, reason),
        1011 => (close::UNAUTHORIZED, "Unauthorized".to_owned()),
        _ => (code, reason),
    }
}

/// A protocol message's `type` and `id`, read without the rest.
#[derive(serde::Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    kind: String,
    id: Option<String>,
}

impl Envelope {
    fn read(message: &[u8]) -> Option<Envelope> {
        serde_json::from_slice(message).ok()
    }
}

/// A token in `connection_init`: `{"Authorization": "Bearer …"}` (any case) or
/// `{"token": "…"}`.
pub(super) fn token_from_init(payload: &serde_json::Value) -> Option<String> {
    let object = payload.as_object()?;
    object.iter().find_map(|(key, value)| {
        let value = value.as_str()?.trim();
        match key.to_ascii_lowercase().as_str() {
            "authorization" => Some(
                value
                    .strip_prefix("Bearer ")
                    .or_else(|| value.strip_prefix("bearer "))
                    .unwrap_or(value)
                    .to_owned(),
            ),
            "token" | "authtoken" => Some(value.to_owned()),
            _ => None,
        }
    })
}
