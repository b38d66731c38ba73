//! The websocket at `/graphql/ws`: the upgrade (at most
//! `ws_max_sockets_per_address` open per client address), then one task per
//! connection that runs async-graphql's protocol handler with what it lacks of
//! graphql-transport-ws (see [`run_protocol`]) and the bounds HTTP requests
//! have (see `ws_executor`), until the client leaves, stops reading, or the
//! server shuts down.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

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

use super::caller::{PeerSocket, authenticate, bearer_token, caller_from_headers, client_of};
use super::ws_executor::{BoundedExecutor, Credential};
use super::ws_sockets::{self, Full, Outbox, Pace, Queue, SocketSlot};
use super::{HttpState, api_error_response, edge_error};
use crate::api::{ApiError, Caller, ClientAddress, ErrorCode};
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
    let client = client_of(&parts, &state.trusted_proxies);
    // Before anything else is spent on it: the token is checked below.
    let slot = match socket_slot(&state, &client) {
        Ok(slot) => slot,
        Err(refused) => return *refused,
    };
    let caller = match caller_from_headers(&state.auth, headers).await {
        Ok(caller) => caller,
        Err(e) => return api_error_response(StatusCode::INTERNAL_SERVER_ERROR, e),
    };
    let token_from_headers = bearer_token(headers).map(str::to_owned);
    if let Some(socket) = parts.extensions.get::<PeerSocket>() {
        bound_send_buffer(*socket);
    }
    let tasks = state.ws_tasks.clone();
    let max_message = state.limits.max_body_bytes;
    upgrade
        .protocols(ALL_WEBSOCKET_PROTOCOLS)
        .read_buffer_size(READ_BUFFER)
        .max_message_size(max_message)
        .max_frame_size(max_message)
        .on_upgrade(move |socket| {
            let connection = Connection {
                state,
                protocol,
                from_headers: caller,
                token_from_headers,
                client,
            };
            tasks.track_future(serve_ws(connection, socket, slot))
        })
}

/// What a socket reads from the network at a time. tungstenite's default,
/// 128 KiB, is zero-filled on every read, so it is resident for every open
/// socket: 37 MiB for 300 of them (the abuse bench's never-reading sockets).
/// A client's messages are small; a larger one is read in several pieces.
const READ_BUFFER: usize = 16 * 1024;

/// The kernel's send buffer of a GraphQL websocket. Left to itself it grows
/// to `tcp_wmem`'s ceiling (4 MiB here) for a client that does not read: a
/// hundred answers the server would compute, unasked for, before
/// [`ws_sockets::Backlog`] could see the client is not reading. Bounded, the
/// answers back up in the socket's own queue after a few, and the socket's
/// next operations wait (`ws_executor`). Ample for a reader: an event or
/// answer is sent in a few round trips at most.
const SEND_BUFFER: usize = 64 * 1024;

/// Sets the connection's send buffer to [`SEND_BUFFER`] (the kernel doubles
/// it for its own bookkeeping).
fn bound_send_buffer(socket: PeerSocket) {
    // SAFETY: the descriptor is the connection's socket, open while its
    // request is served (this handler runs within it).
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(socket.0) };
    if let Err(e) =
        nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::SndBuf, &SEND_BUFFER)
    {
        tracing::debug!(error = %e, "cannot bound a websocket's send buffer");
    }
}

/// One of the websockets (`/graphql/ws`, `/exec`) the client's address may
/// hold, or the 429 for one more.
pub(super) fn socket_slot(
    state: &HttpState,
    client: &ClientAddress,
) -> Result<Option<SocketSlot>, Box<Response>> {
    let Some(address) = client.0 else {
        return Ok(None);
    };
    let max = state.limits.ws_max_sockets_per_address;
    match state.ws_sockets.take(address, max) {
        Some(slot) => Ok(Some(slot)),
        None => Err(Box::new(too_many_sockets(max))),
    }
}

/// The refusal of one socket more than an address may hold.
fn too_many_sockets(max: usize) -> Response {
    let key = "graphql.ws_max_sockets_per_address";
    let e = ApiError::limit(
        key,
        max,
        format!(
            "this address has {max} websockets open, the most it may (`{key}`): \
             close one, or share one socket between subscriptions"
        ),
    );
    api_error_response(StatusCode::TOO_MANY_REQUESTS, e)
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

/// What one connection runs with.
struct Connection {
    state: HttpState,
    protocol: WebSocketProtocols,
    /// The caller the upgrade's headers named.
    from_headers: Caller,
    /// The token they named it with (a standby sends it on with a mutation).
    token_from_headers: Option<String>,
    client: ClientAddress,
}

/// How [`run_protocol`] ended.
enum Ended {
    /// With a close frame queued, last.
    Closing,
    /// The client went away.
    ClientGone,
    /// The client let more than `ws_send_queue_bytes` pile up unread, or
    /// more than its share of `ws_send_queue_total_bytes` once all sockets
    /// together hold that.
    QueueFull,
}

/// How long what is queued may take to go out once the connection is over.
const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// How long a close frame may take to reach a client that does not read.
const CUT_GRACE: Duration = Duration::from_millis(500);

/// Runs one websocket connection until the client leaves, stops reading, or
/// the server shuts down. Its messages go out through a queue bounded by
/// `ws_send_queue_bytes` (and the server's `ws_send_queue_total_bytes`, see
/// [`ws_sockets::SendQueues`]) and written by [`write_out`]: the protocol runs on
/// while the client reads slowly, and a client that lets the queue fill is
/// cut off with 1008 rather than holding answers in memory.
async fn serve_ws(connection: Connection, socket: WebSocket, _slot: Option<SocketSlot>) {
    let (mut sink, stream) = socket.split();
    let limits = &connection.state.limits;
    let (outbox, queue) = ws_sockets::outbox(
        limits.ws_send_queue_bytes,
        limits.ws_send_queue_total_bytes,
        &connection.state.ws_queues,
    );
    let mut write = Box::pin(write_out(&mut sink, queue));
    let ended = tokio::select! {
        ended = run_protocol(&connection, stream, outbox) => ended,
        () = &mut write => return,
    };
    match ended {
        Ended::Closing => {
            let _ = tokio::time::timeout(DRAIN_GRACE, write).await;
        }
        Ended::ClientGone => {}
        Ended::QueueFull => {
            drop(write);
            tracing::info!(
                client.address = ?connection.client.0,
                "websocket cut off: the client does not read what it is sent"
            );
            let frame = CloseFrame {
                code: axum::extract::ws::close_code::POLICY,
                reason: "send queue full: the client does not read what it is sent".into(),
            };
            let _ = tokio::time::timeout(CUT_GRACE, sink.send(Message::Close(Some(frame)))).await;
        }
    }
}

/// Sends what is queued until a close frame is sent, the client is gone, or
/// every producer is.
async fn write_out(sink: &mut Sink, mut queue: Queue) {
    while let Some((message, charge)) = queue.next().await {
        let close = matches!(message, Message::Close(_));
        let sent = sink.send(message).await;
        drop(charge);
        if sent.is_err() || close {
            return;
        }
    }
}

/// async-graphql's protocol handler, with what it lacks of
/// graphql-transport-ws: the `connection_init` timeout (4408, for the legacy
/// protocol too), a duplicate subscription id (4409), and the protocol's close
/// codes where it uses generic ones: a malformed message is 4400 (not 1002), a
/// refused `connection_init` 4403 (not 1002), `subscribe` before the ack 4401
/// (not 1011). A second `connection_init` is 4429 already. Operations run
/// under the caller's bounds ([`BoundedExecutor`]), at most
/// `ws_max_subscriptions` of them live at once.
async fn run_protocol(
    connection: &Connection,
    stream: SplitStream<WebSocket>,
    outbox: Outbox,
) -> Ended {
    let Connection {
        state, protocol, ..
    } = connection;
    let protocol = *protocol;
    let tracked = Tracked::default();
    let (violation, mut violations) = tokio::sync::mpsc::unbounded_channel::<(u16, String)>();
    let bound = OperationBound {
        outbox: outbox.clone(),
        max: state.limits.ws_max_subscriptions,
    };
    let pace = outbox.pace(state.limits.ws_send_stall);
    let input = client_messages(
        stream,
        pace.clone(),
        tracked.clone(),
        violation,
        protocol,
        bound,
    );
    let auth = state.auth.clone();
    let refused = tracked.init_refused.clone();
    let from_headers = (
        connection.from_headers.clone(),
        connection.token_from_headers.clone(),
    );
    let client = connection.client;
    let executor = BoundedExecutor::new(state.clone(), pace);
    let protocol_handler = async_graphql::http::WebSocket::new(executor, input, protocol)
        .on_connection_init(move |payload| init_data(auth, refused, from_headers, client, payload));
    let mut protocol_handler = std::pin::pin!(protocol_handler);
    let init_deadline = tokio::time::sleep(state.limits.ws_init_timeout);
    let mut init_deadline = std::pin::pin!(init_deadline);
    let mut closing = false;
    loop {
        if outbox.full.is_cancelled() {
            return Ended::QueueFull;
        }
        if closing && tracked.open().is_empty() {
            break;
        }
        let message = tokio::select! {
            message = protocol_handler.next() => message,
            Some((code, reason)) = violations.recv() => Some(WsMessage::Close(code, reason)),
            _ = &mut init_deadline, if !tracked.init_seen.load(Ordering::SeqCst) => {
                if tracked.init_seen.load(Ordering::SeqCst) {
                    continue;
                }
                Some(init_timeout(&outbox, protocol))
            }
            _ = state.ws_close.cancelled(), if !closing => {
                closing = true;
                continue;
            }
            () = outbox.full.cancelled() => return Ended::QueueFull,
        };
        let Some(message) = message else {
            return Ended::ClientGone;
        };
        match forward(&outbox, message, protocol, &tracked) {
            // Each answer may have cost an operation's whole run: let other
            // tasks (`/healthz`, other sockets) have the worker before the next.
            Ok(true) => tokio::task::yield_now().await,
            Ok(false) => return Ended::Closing,
            Err(Full) => return Ended::QueueFull,
        }
    }
    let frame = CloseFrame {
        code: axum::extract::ws::close_code::AWAY,
        reason: "server shutting down".into(),
    };
    match outbox.push(Message::Close(Some(frame))) {
        Ok(()) => Ended::Closing,
        Err(Full) => Ended::QueueFull,
    }
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

/// The most operations a connection may have live, and where to tell the
/// client that a `subscribe` past it is refused.
struct OperationBound {
    outbox: Outbox,
    max: usize,
}

/// The client's messages as async-graphql reads them, noting `connection_init`
/// and the subscriptions opened and ended on the way. A subscription id
/// already open is a violation of graphql-transport-ws: the message is
/// dropped and the violation sent to `violation`. A `subscribe` past
/// `bound.max` live operations is dropped and answered with an `error` for its
/// id; the socket stays open.
fn client_messages(
    stream: SplitStream<WebSocket>,
    pace: Pace,
    tracked: Tracked,
    violation: UnboundedSender<(u16, String)>,
    protocol: WebSocketProtocols,
    bound: OperationBound,
) -> impl Stream<Item = Bytes> + Send + 'static {
    // The next message is read once the client has read what it was sent:
    // one that does not read leaves what it sends in the kernel's buffers.
    let paced = futures_util::stream::unfold((stream, pace), |(mut stream, pace)| async move {
        pace.read().await;
        let message = stream.next().await?;
        Some((message, (stream, pace)))
    });
    paced
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
                Some(Envelope { kind, id: Some(id) }) if kind == "subscribe" || kind == "start" => {
                    if open.contains(&id) {
                        // A subscription id already open is a violation of
                        // graphql-transport-ws (the legacy protocol replaces it).
                        if protocol == WebSocketProtocols::GraphQLWS {
                            let _ = violation.send((
                                close::DUPLICATE_ID,
                                format!("Subscriber for {id} already exists"),
                            ));
                            return std::future::ready(None);
                        }
                    } else if open.len() >= bound.max {
                        let refusal = too_many_operations(&id, bound.max, protocol);
                        // A full queue cuts the socket off; nothing more to do here.
                        let _ = bound.outbox.push(Message::Text(refusal.into()));
                        return std::future::ready(None);
                    } else {
                        open.insert(id);
                    }
                }
                Some(Envelope { kind, id: Some(id) }) if kind == "complete" || kind == "stop" => {
                    open.remove(&id);
                }
                _ => {}
            }
            std::future::ready(Some(bytes))
        })
}

/// The `error` answering a `subscribe` past `ws_max_subscriptions`.
fn too_many_operations(id: &str, max: usize, protocol: WebSocketProtocols) -> String {
    let key = "graphql.ws_max_subscriptions";
    let error = crate::api::cost::to_server_error(ApiError::limit(
        key,
        max,
        format!(
            "this socket has {max} operations live, the most it may (`{key}`): \
             complete one before starting another"
        ),
    ));
    let payload = match protocol {
        WebSocketProtocols::GraphQLWS => serde_json::json!([error]),
        WebSocketProtocols::SubscriptionsTransportWS => serde_json::json!(error),
    };
    serde_json::json!({"id": id, "type": "error", "payload": payload}).to_string()
}

/// The request data of a connection once `connection_init` came: the caller
/// its token names (refused when the token is not valid), else the one the
/// upgrade's headers named.
async fn init_data(
    auth: Auth,
    refused: Arc<AtomicBool>,
    (from_headers, token_from_headers): (Caller, Option<String>),
    client: ClientAddress,
    payload: serde_json::Value,
) -> async_graphql::Result<Data> {
    let from_init = token_from_init(&payload);
    let credential = Credential(from_init.clone().or(token_from_headers));
    let caller = match from_init {
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
    data.insert(credential);
    Ok(data)
}

/// The close for a client that sent no `connection_init` in time; the legacy
/// protocol is first told why in a `connection_error`.
fn init_timeout(outbox: &Outbox, protocol: WebSocketProtocols) -> WsMessage {
    let reason = "Connection initialisation timeout";
    if protocol == WebSocketProtocols::SubscriptionsTransportWS {
        let error = serde_json::json!({
            "type": "connection_error",
            "payload": {"message": reason},
        });
        // A full queue cuts the socket off before the close is sent.
        let _ = outbox.push(Message::Text(error.to_string().into()));
    }
    WsMessage::Close(close::INIT_TIMEOUT, reason.to_owned())
}

/// Queues one of async-graphql's messages for the client, in the protocol's
/// close codes; `Ok(false)` once the connection is over (a close queued).
fn forward(
    outbox: &Outbox,
    message: WsMessage,
    protocol: WebSocketProtocols,
    tracked: &Tracked,
) -> Result<bool, Full> {
    match message {
        WsMessage::Text(text) => {
            // async-graphql writes `type` first: only an ending is read
            // whole, never a (possibly large) `next`.
            let ending =
                text.starts_with(r#"{"type":"complete""#) || text.starts_with(r#"{"type":"error""#);
            if ending
                && let Some(Envelope { kind, id: Some(id) }) = Envelope::read(text.as_bytes())
                && (kind == "complete" || kind == "error")
            {
                tracked.open().remove(&id);
            }
            outbox.push(Message::Text(text.into()))?;
            Ok(true)
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
            outbox.push(Message::Close(Some(frame)))?;
            Ok(false)
        }
    }
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
