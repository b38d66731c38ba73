//! HTTP and websocket handlers for `/graphql`, `/graphql/ws`, and the operational
//! routes (`/healthz`, `/readyz`, `/metrics`).

use std::time::Instant;

use async_graphql::http::{ALL_WEBSOCKET_PROTOCOLS, GraphiQLSource, WebSocketProtocols, WsMessage};
use async_graphql::{BatchRequest, BatchResponse, Data};
use axum::body::{Body, Bytes};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use std::sync::Arc;

use super::auth::SESSION_COOKIE;
use super::documents::DocumentCache;
use super::{ApiError, Caller, CorbelSchema, ErrorCode};
use crate::auth::{Auth, Principal};
use crate::repository::Repositories;

/// Whether the server can serve now (`/readyz`); the app wires it to the store.
pub type Readiness =
    Arc<dyn Fn() -> futures_util::future::BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// What the handlers share.
#[derive(Clone)]
pub struct HttpState {
    pub schema: CorbelSchema,
    pub auth: Auth,
    pub repositories: Repositories,
    pub readiness: Readiness,
    pub max_body_bytes: usize,
    pub documents: Arc<DocumentCache>,
    /// Cancelled once the HTTP server has drained: open websockets then close.
    pub ws_close: CancellationToken,
    /// Every open websocket, so shutdown can wait for them.
    pub ws_tasks: TaskTracker,
}

pub async fn graphiql() -> Html<String> {
    Html(
        GraphiQLSource::build()
            .endpoint("/graphql")
            .subscription_endpoint("/graphql/ws")
            .title("Corbel GraphQL")
            .finish(),
    )
}

pub async fn graphql_post(State(state): State<HttpState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, state.max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return edge_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::BadRequest,
                &format!(
                    "request body is larger than the limit of {} bytes",
                    state.max_body_bytes
                ),
            );
        }
    };
    let mut batch = match parse_body(&bytes) {
        Ok(batch) => batch,
        Err(message) => {
            return edge_error(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, &message);
        }
    };
    let caller = match caller_from_headers(&state.auth, &parts.headers).await {
        Ok(caller) => caller,
        Err(e) => {
            return edge_error(StatusCode::INTERNAL_SERVER_ERROR, e.code, &e.message);
        }
    };
    let operations: Vec<String> = match &batch {
        BatchRequest::Single(r) => vec![operation_name(r)],
        BatchRequest::Batch(rs) => rs.iter().map(operation_name).collect(),
    };
    match &mut batch {
        BatchRequest::Single(r) => state.documents.prepare(r),
        BatchRequest::Batch(rs) => rs.iter_mut().for_each(|r| state.documents.prepare(r)),
    }
    let started = Instant::now();
    let mut response = state.schema.execute_batch(batch.data(caller)).await;
    let seconds = started.elapsed().as_secs_f64();
    mark_query_errors(&mut response);
    let outcomes: Vec<&'static str> = match &response {
        BatchResponse::Single(r) => vec![outcome(r)],
        BatchResponse::Batch(rs) => rs.iter().map(outcome).collect(),
    };
    for (operation, outcome) in operations.iter().zip(outcomes) {
        crate::telemetry::record_graphql(operation, outcome, seconds);
    }
    json_response(&response)
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
fn mark_query_errors(response: &mut BatchResponse) {
    let responses: Vec<&mut async_graphql::Response> = match response {
        BatchResponse::Single(r) => vec![r],
        BatchResponse::Batch(rs) => rs.iter_mut().collect(),
    };
    for r in responses {
        for error in &mut r.errors {
            let extensions = error.extensions.get_or_insert_with(Default::default);
            if extensions.get("code").is_none() {
                extensions.set("code", ErrorCode::InvalidQuery.as_str());
            }
        }
    }
}

fn json_response(response: &BatchResponse) -> Response {
    let mut headers = HeaderMap::new();
    for (name, value) in response.http_headers_iter() {
        headers.append(name, value);
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    match serde_json::to_vec(response) {
        Ok(body) => (headers, body).into_response(),
        Err(e) => {
            let e = ApiError::internal(&e);
            edge_error(StatusCode::INTERNAL_SERVER_ERROR, e.code, &e.message)
        }
    }
}

/// A GraphQL-shaped error for failures before execution.
pub fn edge_error(status: StatusCode, code: ErrorCode, message: &str) -> Response {
    let body = serde_json::json!({
        "errors": [{ "message": message, "extensions": { "code": code.as_str() } }]
    });
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
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
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value)
}

async fn caller_from_headers(auth: &Auth, headers: &HeaderMap) -> Result<Caller, ApiError> {
    match bearer_token(headers) {
        Some(token) => authenticate(auth, token).await.map(Caller),
        None => Ok(Caller(None)),
    }
}

async fn authenticate(auth: &Auth, token: &str) -> Result<Option<Principal>, ApiError> {
    auth.authenticate(token).await.map_err(ApiError::from)
}

pub async fn graphql_ws(
    State(state): State<HttpState>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    let Some(protocol) = ws_protocol(&headers) else {
        return edge_error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            "Sec-WebSocket-Protocol must name graphql-transport-ws or graphql-ws",
        );
    };
    let caller = match caller_from_headers(&state.auth, &headers).await {
        Ok(caller) => caller,
        Err(e) => return edge_error(StatusCode::INTERNAL_SERVER_ERROR, e.code, &e.message),
    };
    let tasks = state.ws_tasks.clone();
    upgrade
        .protocols(ALL_WEBSOCKET_PROTOCOLS)
        .on_upgrade(move |socket| tasks.track_future(serve_ws(state, socket, protocol, caller)))
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

/// Runs one websocket connection until the client leaves or the server shuts
/// down; then it says goodbye with a close frame rather than dropping the line.
async fn serve_ws(
    state: HttpState,
    socket: WebSocket,
    protocol: WebSocketProtocols,
    from_headers: Caller,
) {
    let (mut sink, stream) = socket.split();
    // The subscriptions this client has open, so shutdown can wait for their
    // `complete` before closing the socket.
    let open = Arc::new(std::sync::Mutex::new(
        std::collections::HashSet::<String>::new(),
    ));
    let seen_by_input = open.clone();
    let input = stream
        .take_while(|message| std::future::ready(message.is_ok()))
        .filter_map(move |message| {
            let bytes = match message {
                Ok(Message::Text(text)) => Some(Bytes::from(text)),
                Ok(Message::Binary(bytes)) => Some(bytes),
                _ => None,
            };
            if let Some(bytes) = &bytes {
                track(
                    &seen_by_input,
                    bytes,
                    &["subscribe", "start"],
                    &["complete", "stop"],
                );
            }
            std::future::ready(bytes)
        });
    let auth = state.auth.clone();
    let connection = async_graphql::http::WebSocket::new(state.schema.clone(), input, protocol)
        .on_connection_init(move |payload| async move {
            let caller = match token_from_init(&payload) {
                Some(token) => match authenticate(&auth, &token).await {
                    Ok(Some(principal)) => Caller(Some(principal)),
                    Ok(None) => return Err(async_graphql::Error::new("invalid token")),
                    Err(e) => return Err(e.into()),
                },
                None => from_headers,
            };
            let mut data = Data::default();
            data.insert(caller);
            Ok(data)
        });
    let mut connection = std::pin::pin!(connection);
    let mut closing = false;
    loop {
        if closing && open.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            break;
        }
        let message = tokio::select! {
            message = connection.next() => message,
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
                track(&open, text.as_bytes(), &[], &["complete", "error"]);
                sink.send(Message::Text(text.into())).await
            }
            WsMessage::Close(code, reason) => {
                let frame = CloseFrame {
                    code,
                    reason: reason.into(),
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

/// Adds or removes a protocol message's subscription `id` from `open` by its
/// `type`.
fn track(
    open: &std::sync::Mutex<std::collections::HashSet<String>>,
    message: &[u8],
    opens: &[&str],
    closes: &[&str],
) {
    #[derive(serde::Deserialize)]
    struct Envelope {
        #[serde(rename = "type")]
        kind: String,
        id: Option<String>,
    }
    let Ok(Envelope { kind, id: Some(id) }) = serde_json::from_slice::<Envelope>(message) else {
        return;
    };
    let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
    if opens.contains(&kind.as_str()) {
        open.insert(id);
    } else if closes.contains(&kind.as_str()) {
        open.remove(&id);
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
        Ok(Caller(Some(_))) => {}
        Ok(Caller(None)) => {
            let e = ApiError::unauthenticated();
            return edge_error(StatusCode::UNAUTHORIZED, e.code, &e.message);
        }
        Err(e) => return edge_error(StatusCode::INTERNAL_SERVER_ERROR, e.code, &e.message),
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
            edge_error(status, e.code, &e.message)
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
