//! Operations over the websocket under the bounds an HTTP request from the
//! same caller gets (see `super::graphql_post`): a query or mutation waits at
//! the anonymous gate when its caller has no token (at the wider signed-in
//! gate else: a socket runs many operations at once, an HTTP connection
//! one), passes the cost and policy checks, runs under the caller's deadline and answers within the caller's
//! response size. A subscription's stream has no deadline (it lives as long as
//! the client wants it), but each event it sends is held to the response size.
//!
//! async-graphql's websocket protocol handler calls [`BoundedExecutor`] for
//! every `subscribe` (or the legacy `start`), with the connection's data (the
//! caller `connection_init` named, and the client's address).

use std::any::TypeId;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use async_graphql::parser::types::OperationType;
use async_graphql::{Data, Executor, Request, Response};
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use tokio::sync::Semaphore;
use tokio_util::sync::PollSemaphore;

use super::ws_sockets::{InLine, Pace};
use super::{HttpState, error_response, operation_type, timeout_error, too_large_error};
use crate::api::documents::Validation;
use crate::api::settings::RequestLimits;
use crate::api::{Caller, ClientAddress};

/// How many of one socket's queries and mutations run at once; the rest
/// wait on their socket, so a socket with many asked waits in the server's
/// gate with as many places as one with few.
const RUNNING_PER_SOCKET: usize = 2;

/// The schema, as one websocket runs it.
#[derive(Clone)]
pub(super) struct BoundedExecutor {
    state: HttpState,
    /// This socket's turns, `RUNNING_PER_SOCKET` of them.
    turns: Arc<Semaphore>,
    /// When this socket's client has read enough for more to start.
    pace: Pace,
}

impl BoundedExecutor {
    pub(super) fn new(state: HttpState, pace: Pace) -> Self {
        let turns = Arc::new(Semaphore::new(RUNNING_PER_SOCKET));
        Self { state, turns, pace }
    }
}

impl Executor for BoundedExecutor {
    /// Not called by the websocket handler (it streams); a request without a
    /// connection is an anonymous one.
    async fn execute(&self, request: Request) -> Response {
        let mut answers = self.execute_stream(request, None);
        answers.next().await.unwrap_or_default()
    }

    fn execute_stream(
        &self,
        request: Request,
        session: Option<Arc<Data>>,
    ) -> BoxStream<'static, Response> {
        let caller = session
            .as_deref()
            .and_then(connection_value::<Caller>)
            .unwrap_or(Caller::Anonymous);
        let client = session
            .as_deref()
            .and_then(connection_value::<ClientAddress>)
            .unwrap_or(ClientAddress(None));
        let limits = self.state.limits.for_caller(caller.is_signed_in());
        let operation = Operation {
            in_line: Some(self.pace.in_line()),
            state: self.state.clone(),
            turns: self.turns.clone(),
            pace: self.pace.clone(),
            request,
            caller,
            client,
            limits,
        };
        futures_util::stream::once(operation.start(session))
            .flatten()
            .boxed()
    }
}

/// One `subscribe`, before it runs.
struct Operation {
    /// Counted as waiting for its turn until it has it.
    in_line: Option<InLine>,
    state: HttpState,
    turns: Arc<Semaphore>,
    pace: Pace,
    request: Request,
    caller: Caller,
    client: ClientAddress,
    limits: RequestLimits,
}

impl Operation {
    /// Its answers: a subscription's events, or a query's or mutation's one
    /// response. The document is parsed only once through a turn on its
    /// socket and the caller's gate (see [`Operation::gate`]); a query or
    /// mutation holds both until answered, a subscription's events take theirs step by step ([`Gated`]).
    async fn start(mut self, session: Option<Arc<Data>>) -> BoxStream<'static, Response> {
        let deadline = tokio::time::Instant::now() + self.limits.timeout;
        let gate = self.gate();
        // Waiting at the gate counts against the deadline, as over HTTP;
        // first for a turn on this socket, then for the client to have read
        // what it was sent.
        let entered = tokio::time::timeout_at(deadline, async {
            let turn = self.turns.clone().acquire_owned().await.ok();
            self.in_line = None;
            self.pace.room().await.ok()?;
            Some((turn, gate.clone().acquire_owned().await.ok()))
        });
        let permit = match entered.await {
            Ok(Some(permit)) => permit,
            // The client stopped reading: its socket is cut off, and this
            // operation has no one to answer.
            Ok(None) => return futures_util::stream::empty().boxed(),
            Err(_) => {
                let timeout = error_response(timeout_error(&self.limits));
                return futures_util::stream::once(async { timeout }).boxed();
            }
        };
        // A place given back wakes the next operation at once, ahead of
        // every other task (tokio's LIFO slot): behind a chain of them,
        // a `/healthz` waited 150 ms while 300 sockets opened. Yielding
        // puts this operation at the back of the queue.
        tokio::task::yield_now().await;
        let validation = self.state.documents.prepare(&mut self.request);
        let kind = operation_type(&mut self.request);
        if kind == Some(OperationType::Mutation)
            && let Some(forward) = self.state.forward_mutations.clone()
        {
            // A standby's: the leader runs it, with its own checks.
            let token = session
                .as_deref()
                .and_then(connection_value::<Credential>)
                .and_then(|credential| credential.0);
            let request = serde_json::json!({
                "query": self.request.query,
                "operationName": self.request.operation_name,
                "variables": self.request.variables,
            });
            let response = forward(request, token, self.client).await;
            drop(permit);
            return futures_util::stream::once(async { response }).boxed();
        }
        if kind == Some(OperationType::Subscription) {
            drop(permit);
            // The schema's extensions check its cost and policy, with the
            // caller from the connection's data.
            let limits = self.limits;
            let events = Executor::execute_stream(&self.state.schema, self.request, session);
            let events = Gated {
                events,
                gate: PollSemaphore::new(gate),
            };
            return events.map(move |event| within_size(event, &limits)).boxed();
        }
        // Boxed only now: an operation waiting at the gate holds its request,
        // not the room its run takes (a socket may have a hundred waiting).
        let response = Box::pin(run_operation(self, deadline, validation)).await;
        drop(permit);
        futures_util::stream::once(async { response }).boxed()
    }

    /// The anonymous gate for a caller without a token, as over HTTP; the
    /// wider signed-in one else, so that however many operations signed-in
    /// sockets keep live, the workers keep room for `/healthz` and others.
    fn gate(&self) -> Arc<Semaphore> {
        if self.caller.is_signed_in() {
            self.state.signed_in_ws_gate.clone()
        } else {
            self.state.anonymous_gate.clone()
        }
    }
}

/// A subscription's events, each step of their work (resolving an event,
/// the first poll's checks) taken in turn at the caller's gate: a place is
/// waited for before the stream is polled and given back when the poll
/// returns, so a subscription waiting for events holds none.
struct Gated {
    events: BoxStream<'static, Response>,
    gate: PollSemaphore,
}

impl Stream for Gated {
    type Item = Response;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Response>> {
        // The gate is never closed; if it were, the work would go ungated.
        let _permit = std::task::ready!(self.gate.poll_acquire(cx));
        self.events.poll_next_unpin(cx)
    }
}

/// The token the socket's caller was named by (`connection_init`'s, else
/// the upgrade's): what a standby sends a mutation to the leader with.
#[derive(Clone)]
pub(super) struct Credential(pub Option<String>);

/// One of the connection's values, put there by `connection_init`.
fn connection_value<T: Clone + 'static>(data: &Data) -> Option<T> {
    data.get(&TypeId::of::<T>())?.downcast_ref::<T>().cloned()
}

/// A query or mutation, run as `graphql_post` runs one request of a batch.
async fn run_operation(
    operation: Operation,
    deadline: tokio::time::Instant,
    validation: Validation,
) -> Response {
    let Operation {
        in_line: _,
        state,
        turns: _,
        pace: _,
        mut request,
        caller,
        client,
        limits,
    } = operation;
    let name = super::operation_name(&request);
    let started = Instant::now();
    let (schema, validation) =
        match super::read_schema(&state, &mut request, &caller, &limits, validation) {
            Ok(chosen) => chosen,
            Err(refused) => return Response::from_errors(vec![refused]),
        };
    request.data.insert(caller);
    request.data.insert(client);
    let mut response = match super::run_within(&state, schema, validation, request, deadline).await
    {
        Some(response) => response,
        None => error_response(timeout_error(&limits)),
    };
    super::mark_errors(&mut response);
    crate::telemetry::record_graphql(
        &name,
        response.errors.is_empty(),
        started.elapsed().as_secs_f64(),
    );
    within_size(response, &limits)
}

/// `response`, or the error saying it is larger than the caller may receive.
fn within_size(response: Response, limits: &RequestLimits) -> Response {
    let mut room = Budget(limits.max_response_bytes);
    if serde_json::to_writer(&mut room, &response).is_ok() {
        return response;
    }
    let mut refused = error_response(too_large_error(limits, false));
    super::mark_errors(&mut refused);
    refused
}

/// A writer that counts down the bytes left and fails once they run out, so
/// measuring a response stops at the limit and keeps nothing.
struct Budget(usize);

impl std::io::Write for Budget {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = self
            .0
            .checked_sub(buf.len())
            .ok_or_else(|| std::io::Error::other("over the response limit"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
