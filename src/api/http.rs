//! HTTP and websocket handlers for `/graphql`, `/graphql/ws`, and the operational
//! routes (`/healthz`, `/readyz`, `/metrics`).

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use async_graphql::http::{ALL_WEBSOCKET_PROTOCOLS, WebSocketProtocols, WsMessage};
use async_graphql::{BatchRequest, Data};
use axum::body::{Body, Bytes};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use std::sync::Arc;

use super::auth::SESSION_COOKIE;
use super::documents::DocumentCache;
use super::settings::RequestLimits;
use super::{ApiError, Caller, ClientAddress, CorbelSchema, ErrorCode, GraphqlLimits};
use crate::auth::{Auth, Principal};
use crate::repository::Repositories;

/// Whether the server can serve now (`/readyz`); the app wires it to the store.
pub type Readiness =
    Arc<dyn Fn() -> futures_util::future::BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// What the handlers share: one allocation, so a request's `State` is a
/// reference count, not a clone of every part (which showed in profiles).
pub type HttpState = Arc<HttpShared>;

/// The parts of [`HttpState`].
pub struct HttpShared {
    /// With the extensions (cost, audit, policy): mutations, subscriptions.
    pub schema: CorbelSchema,
    /// Without them: queries, checked first (see [`read_schema`]).
    pub reads: CorbelSchema,
    pub auth: Auth,
    pub repositories: Repositories,
    pub readiness: Readiness,
    pub limits: GraphqlLimits,
    /// Proxies whose `X-Forwarded-For` names the client (`login.trusted_proxies`).
    pub trusted_proxies: Vec<IpAddr>,
    pub documents: Arc<DocumentCache>,
    /// Requests without a token run through this gate (see [`anonymous_gate`]).
    pub anonymous_gate: Arc<tokio::sync::Semaphore>,
    /// Cancelled once the HTTP server has drained: open websockets then close.
    pub ws_close: CancellationToken,
    /// Every open websocket, so shutdown can wait for them.
    pub ws_tasks: TaskTracker,
}

/// The gate anonymous requests pass one at a time per two cores: however many
/// arrive, they leave the other cores to `/healthz`, probes and signed-in callers.
pub fn anonymous_gate() -> Arc<tokio::sync::Semaphore> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Arc::new(tokio::sync::Semaphore::new((cores / 2).max(1)))
}

pub async fn graphql_post(State(state): State<HttpState>, request: Request) -> Response {
    // Dropped with the handler's future: when it returns, or when hyper drops it
    // because the client closed the connection.
    let _in_flight = crate::telemetry::graphql_in_flight();
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, state.limits.max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return edge_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::BadRequest,
                &format!(
                    "request body is larger than the limit of {} bytes",
                    state.limits.max_body_bytes
                ),
            );
        }
    };
    let batch = match parse_body(&bytes) {
        Ok(batch) => batch,
        Err(message) => {
            return edge_error(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, &message);
        }
    };
    drop(bytes);
    let caller = match caller_from_headers(&state.auth, &parts.headers).await {
        Ok(caller) => caller,
        Err(e) => {
            return api_error_response(StatusCode::INTERNAL_SERVER_ERROR, e);
        }
    };
    let limits = state.limits.for_caller(caller.is_signed_in());
    let (requests, is_batch) = match batch {
        BatchRequest::Single(r) => (vec![r], false),
        BatchRequest::Batch(rs) => (rs, true),
    };
    if requests.len() > limits.max_batch {
        let key = limits.key("max_batch");
        let e = ApiError::limit(
            &key,
            limits.max_batch,
            format!(
                "the batch has {} requests; at most {} are accepted (`{key}`)",
                requests.len(),
                limits.max_batch
            ),
        );
        return api_error_response(StatusCode::BAD_REQUEST, e);
    }
    let client = client_of(&parts, &state.trusted_proxies);
    let deadline = tokio::time::Instant::now() + limits.timeout;
    // Set once a request has timed out or filled the response: the rest of the
    // batch is not run.
    let mut stopped: Option<ApiError> = None;
    // Waiting at the anonymous gate counts against the request's deadline.
    let _gate = if caller.is_signed_in() {
        None
    } else {
        let gate = state.anonymous_gate.clone();
        match tokio::time::timeout_at(deadline, gate.acquire_owned()).await {
            Ok(permit) => permit.ok(),
            Err(_) => {
                stopped = Some(timeout_error(&limits));
                None
            }
        }
    };
    let mut headers = HeaderMap::new();
    let mut bodies: Vec<Vec<u8>> = Vec::with_capacity(requests.len());
    let mut total = 0usize;
    for mut request in requests {
        let operation = operation_name(&request);
        let started = Instant::now();
        let mut response = if let Some(e) = &stopped {
            error_response(e.clone())
        } else if tokio::time::Instant::now() >= deadline {
            let e = timeout_error(&limits);
            stopped = Some(e.clone());
            error_response(e)
        } else {
            state.documents.prepare(&mut request);
            match read_schema(&state, &mut request, &caller, &limits) {
                Err(refused) => async_graphql::Response::from_errors(vec![refused]),
                Ok(schema) => {
                    request.data.insert(caller.clone());
                    request.data.insert(client);
                    match tokio::time::timeout_at(deadline, schema.execute(request)).await {
                        Ok(response) => response,
                        Err(_) => {
                            let e = timeout_error(&limits);
                            stopped = Some(e.clone());
                            error_response(e)
                        }
                    }
                }
            }
        };
        mark_errors(&mut response);
        crate::telemetry::record_graphql(
            &operation,
            outcome(&response),
            started.elapsed().as_secs_f64(),
        );
        let mut body = match serde_json::to_vec(&response) {
            Ok(body) => body,
            Err(e) => {
                let e = ApiError::internal(&e);
                return api_error_response(StatusCode::INTERNAL_SERVER_ERROR, e);
            }
        };
        if total + body.len() > limits.max_response_bytes {
            let key = limits.key("max_response_bytes");
            let e = ApiError::limit(
                &key,
                limits.max_response_bytes,
                format!(
                    "the response would be larger than {} bytes (`{key}`); ask for less{}",
                    limits.max_response_bytes,
                    if is_batch { " or split the batch" } else { "" }
                ),
            );
            stopped = Some(e.clone());
            let mut refused = error_response(e);
            mark_errors(&mut refused);
            body = serde_json::to_vec(&refused).unwrap_or_default();
        } else {
            for (name, value) in response.http_headers.iter() {
                headers.append(name, value.clone());
            }
        }
        total += body.len();
        bodies.push(body);
    }
    json_response(headers, bodies, is_batch)
}

/// The schema to run `request` on: a query passes the checks the extensions
/// would make (its cost, then the policy on its root fields; the audit trail
/// keeps mutations only) and runs without them, on `state.reads`; anything
/// else (a mutation, a document that does not parse, an unknown operation
/// name) runs on the schema with the extensions, which answer for it.
fn read_schema<'a>(
    state: &'a HttpState,
    request: &mut async_graphql::Request,
    caller: &Caller,
    limits: &RequestLimits,
) -> Result<&'a CorbelSchema, async_graphql::ServerError> {
    use async_graphql::parser::types::{DocumentOperations, OperationType};
    let name = request.operation_name.clone();
    let Ok(document) = request.parsed_query() else {
        return Ok(&state.schema);
    };
    let operation = match (&document.operations, name) {
        (DocumentOperations::Single(operation), None) => operation,
        (DocumentOperations::Multiple(operations), Some(name)) => {
            match operations.get(name.as_str()) {
                Some(operation) => operation,
                None => return Ok(&state.schema),
            }
        }
        // One named operation, run without naming it.
        (DocumentOperations::Multiple(operations), None) if operations.len() == 1 => {
            match operations.values().next() {
                Some(operation) => operation,
                None => return Ok(&state.schema),
            }
        }
        _ => return Ok(&state.schema),
    };
    if operation.node.ty != OperationType::Query {
        return Ok(&state.schema);
    }
    super::cost::check(document, limits)?;
    super::policy::check(document, caller)?;
    Ok(&state.reads)
}

/// Who sent a request (see [`client_address`]); unknown without the peer address.
fn client_of(parts: &axum::http::request::Parts, trusted: &[IpAddr]) -> ClientAddress {
    ClientAddress(
        parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|info| client_address(info.0.ip(), &parts.headers, trusted)),
    )
}

/// Who the client is, as `login` counts failed attempts: the peer address, or
/// for a peer that is a trusted proxy, the last address in `X-Forwarded-For`
/// that is not itself a trusted proxy (every earlier entry is the client's own
/// word, which anyone can forge).
fn client_address(peer: IpAddr, headers: &HeaderMap, trusted: &[IpAddr]) -> IpAddr {
    let is_trusted = |addr: &IpAddr| trusted.contains(&addr.to_canonical());
    if !is_trusted(&peer) {
        return peer;
    }
    let forwarded: Vec<IpAddr> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map_while(|entry| entry.trim().parse::<IpAddr>().ok())
        .collect();
    forwarded
        .iter()
        .rev()
        .find(|addr| !is_trusted(addr))
        .or(forwarded.first())
        .copied()
        .unwrap_or(peer)
}

fn timeout_error(limits: &RequestLimits) -> ApiError {
    let key = limits.key("request_timeout_ms");
    ApiError::new(
        ErrorCode::Timeout,
        format!(
            "the request ran longer than {} ms (`{key}`) and was stopped",
            limits.timeout.as_millis()
        ),
    )
}

fn error_response(e: ApiError) -> async_graphql::Response {
    async_graphql::Response::from_errors(vec![super::cost::to_server_error(e)])
}

/// Parses the body, naming what is wrong with it.
fn parse_body(bytes: &Bytes) -> Result<BatchRequest, String> {
    if bytes.is_empty() {
        return Err("request body is empty: send a JSON object with a `query`".to_owned());
    }
    // Read the two shapes explicitly: serde's untagged enums only say "did not
    // match any variant", which tells a client nothing.
    let batch = if bytes.trim_ascii_start().starts_with(b"[") {
        serde_json::from_slice::<Vec<async_graphql::Request>>(bytes).map(BatchRequest::Batch)
    } else {
        serde_json::from_slice::<async_graphql::Request>(bytes).map(BatchRequest::Single)
    }
    .map_err(|e| format!("request body is not a GraphQL request: {e}"))?;
    let requests = match &batch {
        BatchRequest::Single(r) => std::slice::from_ref(r),
        BatchRequest::Batch(rs) => rs.as_slice(),
    };
    if requests.is_empty() {
        return Err("request body is an empty batch".to_owned());
    }
    if let Some(i) = requests.iter().position(|r| r.query.trim().is_empty()) {
        return Err(match batch {
            BatchRequest::Single(_) => "request has no `query`".to_owned(),
            BatchRequest::Batch(_) => format!("request {i} of the batch has no `query`"),
        });
    }
    Ok(batch)
}

fn operation_name(request: &async_graphql::Request) -> String {
    request
        .operation_name
        .clone()
        .or_else(|| named_operation(&request.query))
        .unwrap_or_default()
}

/// The name of the first operation in `query`, read without a full parse (the
/// parser runs later, inside the schema).
fn named_operation(query: &str) -> Option<String> {
    let mut words = query
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty());
    match words.next()? {
        "query" | "mutation" | "subscription" => {
            let keyword_end = query.find(['{', '(']).unwrap_or(query.len());
            let name = words.next()?;
            let name_at = query.find(name)?;
            (name_at < keyword_end).then(|| name.to_owned())
        }
        _ => None,
    }
}

fn outcome(response: &async_graphql::Response) -> &'static str {
    if response.errors.is_empty() {
        "ok"
    } else {
        "error"
    }
}

/// Errors raised by async-graphql itself (parse, validation, limits, variables)
/// carry no code; they are all about the document, so they get `INVALID_QUERY`.
fn mark_errors(response: &mut async_graphql::Response) {
    for error in &mut response.errors {
        let extensions = error.extensions.get_or_insert_with(Default::default);
        if extensions.get("code").is_none() {
            extensions.set("code", ErrorCode::InvalidQuery.as_str());
        }
    }
}

/// The responses as one JSON body: the one response, or the batch's array.
fn json_response(mut headers: HeaderMap, bodies: Vec<Vec<u8>>, is_batch: bool) -> Response {
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    let body = if is_batch {
        let mut out = Vec::with_capacity(bodies.iter().map(|b| b.len() + 1).sum::<usize>() + 1);
        out.push(b'[');
        for (i, body) in bodies.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(body);
        }
        out.push(b']');
        out
    } else {
        bodies.into_iter().next().unwrap_or_default()
    };
    (headers, body).into_response()
}

/// An [`ApiError`] before execution, GraphQL-shaped, with its extensions.
fn api_error_response(status: StatusCode, e: ApiError) -> Response {
    let body = serde_json::json!({ "errors": [super::cost::to_server_error(e)] });
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// A GraphQL-shaped error for failures before execution.
pub fn edge_error(status: StatusCode, code: ErrorCode, message: &str) -> Response {
    api_error_response(status, ApiError::new(code, message))
}

/// The token a request carries: the bearer header, else the session cookie.
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    if let Some(value) = headers.get(header::AUTHORIZATION)
        && let Ok(value) = value.to_str()
    {
        let value = value.trim();
        if let Some(token) = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
        {
            return Some(token.trim());
        }
    }
    if !same_origin(headers) {
        return None;
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value)
}

/// Whether a request may use the session cookie: it says no `Origin`
/// (not a browser's cross-origin request), or one whose host and port are
/// this request's `Host`. `SameSite=Strict` ignores ports, so without this a
/// page served by another port of the same host could use the session (a
/// WebSocket, or a form-encoded POST that needs no CORS preflight).
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let origin = origin.to_str().unwrap_or_default();
    let Some(authority) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    headers
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
        .is_some_and(|host| host.eq_ignore_ascii_case(authority))
}

async fn caller_from_headers(auth: &Auth, headers: &HeaderMap) -> Result<Caller, ApiError> {
    match bearer_token(headers) {
        Some(token) => Ok(match authenticate(auth, token).await? {
            Some(principal) => Caller::SignedIn(principal),
            None => Caller::InvalidToken,
        }),
        None => Ok(Caller::Anonymous),
    }
}

async fn authenticate(auth: &Auth, token: &str) -> Result<Option<Principal>, ApiError> {
    auth.authenticate(token).await.map_err(ApiError::from)
}

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
    use std::sync::atomic::{AtomicBool, Ordering};

    let (mut sink, stream) = socket.split();
    // The subscriptions this client has open, so shutdown can wait for their
    // `complete` before closing the socket.
    let open = Arc::new(std::sync::Mutex::new(
        std::collections::HashSet::<String>::new(),
    ));
    let init_seen = Arc::new(AtomicBool::new(false));
    let init_refused = Arc::new(AtomicBool::new(false));
    let (violation, mut violations) = tokio::sync::mpsc::unbounded_channel::<(u16, String)>();
    let input = {
        let open = open.clone();
        let init_seen = init_seen.clone();
        stream
            .take_while(|message| std::future::ready(message.is_ok()))
            .filter_map(move |message| {
                let bytes = match message {
                    Ok(Message::Text(text)) => Bytes::from(text),
                    Ok(Message::Binary(bytes)) => bytes,
                    _ => return std::future::ready(None),
                };
                let envelope = Envelope::read(&bytes);
                let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
                match envelope {
                    Some(Envelope { kind, .. }) if kind == "connection_init" => {
                        init_seen.store(true, Ordering::SeqCst);
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
                    Some(Envelope { kind, id: Some(id) })
                        if kind == "complete" || kind == "stop" =>
                    {
                        open.remove(&id);
                    }
                    _ => {}
                }
                std::future::ready(Some(bytes))
            })
    };
    let auth = state.auth.clone();
    let refused = init_refused.clone();
    let connection = async_graphql::http::WebSocket::new(state.schema.clone(), input, protocol)
        .on_connection_init(move |payload| async move {
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
        });
    let mut connection = std::pin::pin!(connection);
    let init_deadline = tokio::time::sleep(state.limits.ws_init_timeout);
    let mut init_deadline = std::pin::pin!(init_deadline);
    let mut closing = false;
    loop {
        if closing && open.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            break;
        }
        let message = tokio::select! {
            message = connection.next() => message,
            Some((code, reason)) = violations.recv() => Some(WsMessage::Close(code, reason)),
            _ = &mut init_deadline, if !init_seen.load(Ordering::SeqCst) => {
                if init_seen.load(Ordering::SeqCst) {
                    continue;
                }
                let reason = "Connection initialisation timeout";
                if protocol == WebSocketProtocols::SubscriptionsTransportWS {
                    let error = serde_json::json!({
                        "type": "connection_error",
                        "payload": {"message": reason},
                    });
                    let _ = sink.send(Message::Text(error.to_string().into())).await;
                }
                Some(WsMessage::Close(close::INIT_TIMEOUT, reason.to_owned()))
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
        let sent = match message {
            WsMessage::Text(text) => {
                if let Some(Envelope { kind, id: Some(id) }) = Envelope::read(text.as_bytes())
                    && (kind == "complete" || kind == "error")
                {
                    open.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                }
                sink.send(Message::Text(text.into())).await
            }
            WsMessage::Close(code, reason) => {
                let (code, reason) = match protocol {
                    WebSocketProtocols::GraphQLWS => {
                        protocol_close(code, reason, init_refused.load(Ordering::SeqCst))
                    }
                    WebSocketProtocols::SubscriptionsTransportWS => (code, reason),
                };
                let frame = CloseFrame {
                    code,
                    reason: close_reason(reason).into(),
                };
                let _ = sink.send(Message::Close(Some(frame))).await;
                return;
            }
        };
        if sent.is_err() {
            return;
        }
    }
    let frame = CloseFrame {
        code: axum::extract::ws::close_code::AWAY,
        reason: "server shutting down".into(),
    };
    let _ = sink.send(Message::Close(Some(frame))).await;
}

/// A close frame's reason fits in 123 bytes; a longer one (serde's list of
/// expected message types) would fail the frame itself.
fn close_reason(mut reason: String) -> String {
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
fn protocol_close(code: u16, reason: String, init_refused: bool) -> (u16, String) {
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
fn token_from_init(payload: &serde_json::Value) -> Option<String> {
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

/// `GET /artifacts/{element}/{urn}`: an element's artifact, streamed from its
/// repository's source. Needs a token like the API.
pub async fn artifact(
    State(state): State<HttpState>,
    axum::extract::Path((element, urn)): axum::extract::Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    match caller_from_headers(&state.auth, &headers).await {
        Ok(Caller::SignedIn(_)) => {}
        Ok(caller) => {
            return api_error_response(StatusCode::UNAUTHORIZED, caller.unauthenticated());
        }
        Err(e) => return api_error_response(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
    let Ok(element) = element.parse::<uuid::Uuid>() else {
        return edge_error(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            "no such element",
        );
    };
    match state.repositories.artifact_stream(element, &urn).await {
        Ok((file_name, stream)) => {
            let disposition = format!(
                "attachment; filename=\"{}\"",
                file_name.replace(['"', '\\'], "_")
            );
            (
                [
                    (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
                    (header::CONTENT_DISPOSITION, disposition),
                ],
                Body::from_stream(stream),
            )
                .into_response()
        }
        Err(e) => {
            let e = ApiError::from(e);
            let status = match e.code {
                ErrorCode::NotFound => StatusCode::NOT_FOUND,
                ErrorCode::SourceUnavailable => StatusCode::BAD_GATEWAY,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            api_error_response(status, e)
        }
    }
}

pub async fn healthz() -> &'static str {
    "ok\n"
}

pub async fn readyz(State(state): State<HttpState>) -> Response {
    match (state.readiness)().await {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        )
            .into_response(),
    }
}

pub async fn metrics() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        Body::from(crate::telemetry::metrics().render()),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_names_are_read_from_the_document() {
        assert_eq!(
            named_operation("query Info { serverInfo { version } }").as_deref(),
            Some("Info")
        );
        assert_eq!(
            named_operation("mutation Go($a: Int) { x }").as_deref(),
            Some("Go")
        );
        assert_eq!(named_operation("{ serverInfo { version } }"), None);
        assert_eq!(named_operation("query { serverInfo { version } }"), None);
        assert_eq!(named_operation("query($a: Int) { a }"), None);
    }

    #[test]
    fn the_client_address_is_the_peer_unless_a_trusted_proxy_forwards() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-forwarded-for",
            HeaderValue::from_static("6.6.6.6, 198.51.100.4, 10.0.0.2"),
        );
        let proxies = [ip("127.0.0.1"), ip("10.0.0.2")];
        // An untrusted peer's header is its own word: ignored.
        assert_eq!(
            client_address(ip("192.0.2.1"), &headers, &proxies),
            ip("192.0.2.1")
        );
        // Through trusted proxies: the last address they did not add themselves;
        // the forged first entry is never used.
        assert_eq!(
            client_address(ip("127.0.0.1"), &headers, &proxies),
            ip("198.51.100.4")
        );
        assert_eq!(
            client_address(ip("127.0.0.1"), &HeaderMap::new(), &proxies),
            ip("127.0.0.1")
        );
    }

    #[test]
    fn close_codes_follow_graphql_transport_ws() {
        assert_eq!(protocol_close(1002, "bad".into(), false).0, 4400);
        assert_eq!(protocol_close(1002, "no".into(), true).0, 4403);
        assert_eq!(protocol_close(1011, "x".into(), false).0, 4401);
        assert_eq!(protocol_close(4429, "again".into(), false).0, 4429);
        assert_eq!(close_reason("é".repeat(100)).len(), 122);
    }

    #[test]
    fn the_cookie_counts_only_from_this_origin() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("corbel_session=tok"),
        );
        assert_eq!(bearer_token(&headers), Some("tok"), "no Origin: a script");
        for (origin, allowed) in [
            ("http://127.0.0.1:8080", true),
            ("https://127.0.0.1:8080", true),
            ("http://127.0.0.1:9999", false),
            ("http://evil.example", false),
            ("null", false),
        ] {
            headers.insert(header::ORIGIN, HeaderValue::from_static(origin));
            assert_eq!(bearer_token(&headers).is_some(), allowed, "{origin}");
        }
        // A bearer header is not ambient: it counts from anywhere.
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer hdr"),
        );
        assert_eq!(bearer_token(&headers), Some("hdr"));
    }

    #[test]
    fn tokens_come_from_header_or_cookie() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=b; corbel_session=tok"),
        );
        assert_eq!(bearer_token(&headers), Some("tok"));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer hdr"),
        );
        assert_eq!(bearer_token(&headers), Some("hdr"));
        let init = serde_json::json!({"Authorization": "Bearer x1"});
        assert_eq!(token_from_init(&init).as_deref(), Some("x1"));
        assert_eq!(
            token_from_init(&serde_json::json!({"token": "t"})).as_deref(),
            Some("t")
        );
        assert_eq!(token_from_init(&serde_json::json!({})), None);
    }
}
