//! HTTP and websocket handlers for `/graphql`, `/graphql/ws`, and the operational
//! routes (`/healthz`, `/readyz`, `/metrics`). This file holds the state they
//! share, the `/graphql` POST and the plain routes; who is calling is read in
//! `caller`, the websocket served in `ws`.

mod caller;
mod exec;
mod files;
mod reach;
mod tar_check;
#[cfg(test)]
mod tests;
mod ws;
mod ws_executor;
mod ws_sockets;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use async_graphql::BatchRequest;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use self::caller::PeerSocket;
use self::caller::{caller_from_headers, client_of};
pub use self::exec::exec_ws;
pub use self::files::{get_files, put_files};
pub use self::ws::graphql_ws;
pub use self::ws_sockets::{SendQueues, SocketCounts};
use super::documents::{DocumentCache, Validation};
use super::settings::RequestLimits;
use super::{ApiError, Caller, ClientAddress, CorbelSchema, ErrorCode, GraphqlLimits};
use crate::auth::Auth;
use crate::repository::Repositories;

/// Whether the server can serve now (`/readyz`); the app wires it to the store.
pub type Readiness =
    Arc<dyn Fn() -> futures_util::future::BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// What the handlers share: one allocation, so a request's `State` is a
/// reference count, not a clone of every part (which showed in profiles).
pub type HttpState = Arc<HttpShared>;

/// A schema built the first time it is used.
pub type LazySchema = std::sync::LazyLock<CorbelSchema, Box<dyn FnOnce() -> CorbelSchema + Send>>;

/// The parts of [`HttpState`].
pub struct HttpShared {
    /// With the extensions (cost, audit, policy): mutations, subscriptions.
    pub schema: CorbelSchema,
    /// Without them: queries, checked first (see [`read_schema`]).
    pub reads: CorbelSchema,
    /// `reads` without validation, for queries already validated once
    /// (`DocumentCache::passed`); built when first needed.
    pub valid_reads: LazySchema,
    pub auth: Auth,
    pub repositories: Repositories,
    /// For `/exec`.
    pub deployments: crate::deploy::Deployments,
    pub audit: crate::audit::Audit,
    /// `[api]`: the largest upload.
    pub api: crate::api::ApiLimits,
    pub readiness: Readiness,
    pub limits: GraphqlLimits,
    /// Proxies whose `X-Forwarded-For` names the client (`login.trusted_proxies`).
    pub trusted_proxies: Vec<IpAddr>,
    pub documents: Arc<DocumentCache>,
    /// Requests without a token run through this gate (see [`anonymous_gate`]).
    pub anonymous_gate: Arc<tokio::sync::Semaphore>,
    /// Signed-in callers' websocket operations run through this one (see
    /// [`signed_in_ws_gate`]).
    pub signed_in_ws_gate: Arc<tokio::sync::Semaphore>,
    /// Cancelled once the HTTP server has drained: open websockets then close.
    pub ws_close: CancellationToken,
    /// Every open websocket, so shutdown can wait for them.
    pub ws_tasks: TaskTracker,
    /// The websockets open from each client address, against
    /// `ws_max_sockets_per_address`.
    pub ws_sockets: Arc<SocketCounts>,
    /// The bytes queued over all websockets, against `ws_send_queue_total_bytes`.
    pub ws_queues: Arc<SendQueues>,
    /// A standby's (`--cluster`): where a websocket's mutations go (the
    /// leader); `None` runs them here.
    pub forward_mutations: Option<ForwardMutation>,
}

/// Sends a mutation to the leader: the request as GraphQL's JSON, the
/// caller's token (if any) and address; the leader's answer.
pub type ForwardMutation = Arc<
    dyn Fn(
            serde_json::Value,
            Option<String>,
            ClientAddress,
        ) -> futures_util::future::BoxFuture<'static, async_graphql::Response>
        + Send
        + Sync,
>;

/// The gate anonymous requests pass one at a time per two cores: however many
/// arrive, they leave the other cores to `/healthz`, probes and signed-in callers.
pub fn anonymous_gate() -> Arc<tokio::sync::Semaphore> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Arc::new(tokio::sync::Semaphore::new((cores / 2).max(1)))
}

/// The gate signed-in callers' websocket operations pass, four at once per
/// core: a socket may have `ws_max_subscriptions` operations live and an
/// address `ws_max_sockets_per_address` sockets, so without it a few clients
/// keep every worker busy (and every answer being built in memory) while
/// `/healthz` and other clients wait. Four a core lets operations waiting on
/// the store overlap. An HTTP request runs one operation per connection at a
/// time, each of a batch after the other.
pub fn signed_in_ws_gate() -> Arc<tokio::sync::Semaphore> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Arc::new(tokio::sync::Semaphore::new(cores * 4))
}

pub async fn graphql_post(State(state): State<HttpState>, request: Request) -> Response {
    // Dropped with the handler's future: when it returns, or when hyper drops it
    // because the client closed the connection.
    let _in_flight = crate::telemetry::graphql_in_flight();
    let (parts, body) = request.into_parts();
    let batch = match read_batch(body, state.limits.max_body_bytes).await {
        Ok(batch) => batch,
        Err(refused) => return refused,
    };
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
    let deadline = tokio::time::Instant::now() + limits.timeout;
    let mut run = BatchRun {
        state: &state,
        client: client_of(&parts, &state.trusted_proxies),
        caller,
        limits,
        is_batch,
        deadline,
        stopped: None,
        headers: HeaderMap::new(),
        bodies: Vec::with_capacity(requests.len()),
        total: 0,
    };
    let _gate = run.enter_gate().await;
    for request in requests {
        if let Err(failed) = run.run(request).await {
            return failed;
        }
    }
    json_response(run.headers, run.bodies, is_batch)
}

/// The body as a GraphQL request or batch, or the response refusing it (too
/// large, or not a request).
async fn read_batch(body: Body, max_bytes: usize) -> Result<BatchRequest, Response> {
    let Ok(bytes) = axum::body::to_bytes(body, max_bytes).await else {
        return Err(edge_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::BadRequest,
            &format!("request body is larger than the limit of {max_bytes} bytes"),
        ));
    };
    parse_body(&bytes)
        .map_err(|message| edge_error(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, &message))
}

/// One POST's requests as they run, one after the other, into one response.
struct BatchRun<'a> {
    state: &'a HttpState,
    caller: Caller,
    client: ClientAddress,
    limits: RequestLimits,
    is_batch: bool,
    /// The whole batch's: waiting at the anonymous gate counts against it.
    deadline: tokio::time::Instant,
    /// Set once a request has timed out or filled the response: the rest of the
    /// batch is not run.
    stopped: Option<ApiError>,
    /// The responses' HTTP headers (a `login`'s cookie), those sent in full.
    headers: HeaderMap,
    /// Each response, serialised.
    bodies: Vec<Vec<u8>>,
    /// The bytes of `bodies`, against `max_response_bytes`.
    total: usize,
}

impl BatchRun<'_> {
    /// Waits at the anonymous gate, for a caller without a token; a wait past
    /// the deadline stops the batch.
    async fn enter_gate(&mut self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if self.caller.is_signed_in() {
            return None;
        }
        let gate = self.state.anonymous_gate.clone();
        match tokio::time::timeout_at(self.deadline, gate.acquire_owned()).await {
            Ok(permit) => permit.ok(),
            Err(_) => {
                self.stopped = Some(timeout_error(&self.limits));
                None
            }
        }
    }

    /// Runs one request of the batch and adds its response; `Err` with the
    /// response to send instead of the batch's when it cannot be serialised.
    async fn run(&mut self, request: async_graphql::Request) -> Result<(), Response> {
        let operation = operation_name(&request);
        let started = Instant::now();
        let mut response = self.execute(request).await;
        mark_errors(&mut response);
        crate::telemetry::record_graphql(
            &operation,
            response.errors.is_empty(),
            started.elapsed().as_secs_f64(),
        );
        let mut body = match serde_json::to_vec(&response) {
            Ok(body) => body,
            Err(e) => {
                let e = ApiError::internal(&e);
                return Err(api_error_response(StatusCode::INTERNAL_SERVER_ERROR, e));
            }
        };
        if self.total + body.len() > self.limits.max_response_bytes {
            let e = too_large_error(&self.limits, self.is_batch);
            self.stopped = Some(e.clone());
            let mut refused = error_response(e);
            mark_errors(&mut refused);
            body = serde_json::to_vec(&refused).unwrap_or_default();
        } else {
            for (name, value) in response.http_headers.iter() {
                self.headers.append(name, value.clone());
            }
        }
        self.total += body.len();
        self.bodies.push(body);
        Ok(())
    }

    /// The response to one request: its error once the batch has stopped or
    /// its deadline passed, else what the schema answers in time.
    async fn execute(&mut self, mut request: async_graphql::Request) -> async_graphql::Response {
        if let Some(e) = &self.stopped {
            return error_response(e.clone());
        }
        if tokio::time::Instant::now() >= self.deadline {
            let e = timeout_error(&self.limits);
            self.stopped = Some(e.clone());
            return error_response(e);
        }
        let validation = self.state.documents.prepare(&mut request);
        let (schema, validation) = match read_schema(
            self.state,
            &mut request,
            &self.caller,
            &self.limits,
            validation,
        ) {
            Err(refused) => return async_graphql::Response::from_errors(vec![refused]),
            Ok(chosen) => chosen,
        };
        request.data.insert(self.caller.clone());
        request.data.insert(self.client);
        match run_within(self.state, schema, validation, request, self.deadline).await {
            Some(response) => response,
            None => {
                let e = timeout_error(&self.limits);
                self.stopped = Some(e.clone());
                error_response(e)
            }
        }
    }
}

/// The schema to run `request` on: a query passes the checks the extensions
/// would make (its cost, then the policy on its root fields; the audit trail
/// keeps mutations only) and runs without them, on `state.reads`, or on
/// `state.valid_reads` when its document already passed validation
/// ([`Validation::Done`]); anything else (a mutation, a document that does
/// not parse, an unknown operation name) runs on the schema with the
/// extensions, which answer for it. With it, what validation the run still
/// owes the document cache (only a query's counts).
fn read_schema<'a>(
    state: &'a HttpState,
    request: &mut async_graphql::Request,
    caller: &Caller,
    limits: &RequestLimits,
    validation: Validation,
) -> Result<(&'a CorbelSchema, Validation), async_graphql::ServerError> {
    use async_graphql::parser::types::OperationType;
    if operation_type(request) != Some(OperationType::Query) {
        return Ok((&state.schema, Validation::Always));
    }
    let Ok(document) = request.parsed_query() else {
        return Ok((&state.schema, Validation::Always));
    };
    super::cost::check(document, limits)?;
    super::policy::check(document, caller)?;
    match validation {
        Validation::Done => Ok((&*state.valid_reads, validation)),
        Validation::Once | Validation::Always => Ok((&state.reads, validation)),
    }
}

/// `request` run on `schema` (as [`read_schema`] chose it) within
/// `deadline`, `None` past it; a document validated for the first time
/// ([`Validation::Once`]) is marked in the document cache once it passes.
async fn run_within(
    state: &HttpState,
    schema: &CorbelSchema,
    validation: Validation,
    request: async_graphql::Request,
    deadline: tokio::time::Instant,
) -> Option<async_graphql::Response> {
    let validating = (validation == Validation::Once).then(|| request.query.clone());
    let response = tokio::time::timeout_at(deadline, schema.execute(request))
        .await
        .ok()?;
    if let Some(query) = validating
        && response.errors.is_empty()
    {
        state.documents.passed(&query);
    }
    Some(response)
}

/// The type of the operation `request` runs; `None` when its document does not
/// parse or names no operation it holds.
fn operation_type(
    request: &mut async_graphql::Request,
) -> Option<async_graphql::parser::types::OperationType> {
    use async_graphql::parser::types::DocumentOperations;
    let name = request.operation_name.clone();
    let document = request.parsed_query().ok()?;
    let operation = match (&document.operations, name) {
        (DocumentOperations::Single(operation), None) => operation,
        (DocumentOperations::Multiple(operations), Some(name)) => operations.get(name.as_str())?,
        // One named operation, run without naming it.
        (DocumentOperations::Multiple(operations), None) if operations.len() == 1 => {
            operations.values().next()?
        }
        _ => return None,
    };
    Some(operation.node.ty)
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

fn too_large_error(limits: &RequestLimits, is_batch: bool) -> ApiError {
    let key = limits.key("max_response_bytes");
    ApiError::limit(
        &key,
        limits.max_response_bytes,
        format!(
            "the response would be larger than {} bytes (`{key}`); ask for less{}",
            limits.max_response_bytes,
            if is_batch { " or split the batch" } else { "" }
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
