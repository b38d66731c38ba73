//! What a standby answers itself and what it sends on to the leader: every
//! query (`POST /graphql` whose every operation is a query), GraphQL's
//! websocket, the console, GraphiQL and the probes are answered here from
//! the database (`app::reader_router`); mutations, `/exec`, `/files` and
//! `/artifacts` (a provider's link, the leader's disk) go to the leader. A
//! query that needs a provider's link is answered `ON_LEADER` here, and
//! sent on.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

use super::relay::{Relay, reads_only, relay_read, too_large};
use super::socket::relay_ws;

/// The most of a local answer read to look for `ON_LEADER` in it; a larger
/// one is sent as it is.
const INSPECTED: usize = 64 * 1024 * 1024;

/// The standby's router's layer: sends on what is the leader's.
pub(super) async fn dispatch(
    State(relay): State<Arc<Relay>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let to_leader =
        path == "/exec" || path.starts_with("/files/") || path.starts_with("/artifacts/");
    let graphql_post = path == "/graphql" && request.method() == Method::POST;
    if !to_leader && !graphql_post {
        return next.run(request).await;
    }
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)), |info| info.0);
    if path == "/exec" {
        return relay_ws(State(relay), ConnectInfo(peer), request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, relay.max_body).await else {
        return too_large(relay.max_body);
    };
    if graphql_post && reads_only(&parts.method, &body) {
        let mut local = Request::builder()
            .method(parts.method.clone())
            .uri(parts.uri.clone())
            .version(parts.version);
        if let Some(headers) = local.headers_mut() {
            *headers = parts.headers.clone();
        }
        let Ok(mut local) = local.body(Body::from(body.clone())) else {
            return relay_read(&relay, parts, body, peer).await;
        };
        local.extensions_mut().insert(ConnectInfo(peer));
        let answer = next.run(local).await;
        let (answer_parts, answer_body) = answer.into_parts();
        match axum::body::to_bytes(answer_body, INSPECTED).await {
            Ok(read) if !needs_the_leader(&read) => {
                return Response::from_parts(answer_parts, Body::from(read));
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "a standby's answer could not be read");
            }
        }
    }
    relay_read(&relay, parts, body, peer).await
}

/// Whether an answer says a field needs the leader (`ON_LEADER`).
fn needs_the_leader(answer: &[u8]) -> bool {
    answer
        .windows(b"\"ON_LEADER\"".len())
        .any(|w| w == b"\"ON_LEADER\"")
}
