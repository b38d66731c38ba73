//! A standby's relay of HTTP requests to the leader: who leads (read every
//! heartbeat, and again when a leader does not take a request), waiting for
//! one through a failover, and sending a request on (again, to the next
//! leader, only when it changes nothing).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::api::ErrorCode;
use crate::api::http::{ForwardMutation, edge_error};
use crate::cluster::Cluster;

/// How long the relay of a request waits to connect to the leader.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a new leader may take to start serving, as a request waiting
/// for it counts.
const LEADER_START: Duration = Duration::from_secs(15);
/// How often a request waiting for a leader looks again.
const LEADER_POLL: Duration = Duration::from_millis(100);

/// Headers that belong to one hop, never relayed.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// What a standby forwards through: who leads, the client it sends with, the
/// sockets it relays.
pub(super) struct Relay {
    pub cluster: Cluster,
    /// Who leads, as last read: every heartbeat, and at once when the
    /// leader did not take a request (`None` until then).
    leader: tokio::sync::watch::Sender<Option<Leader>>,
    /// A request body is read whole, up to the API's own limit, so that it
    /// can be sent again to a new leader.
    pub max_body: usize,
    http: reqwest::Client,
    /// Closes relayed websockets (with 1012) when this replica stops
    /// forwarding.
    pub sockets: CancellationToken,
    pub socket_tasks: TaskTracker,
}

impl Relay {
    pub fn new(cluster: &Cluster, max_body: usize) -> anyhow::Result<Self> {
        Ok(Relay {
            cluster: cluster.clone(),
            leader: tokio::sync::watch::Sender::new(None),
            max_body,
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(CONNECT_TIMEOUT)
                .build()
                .context("making the relay's HTTP client")?,
            sockets: CancellationToken::new(),
            socket_tasks: TaskTracker::new(),
        })
    }

    /// How long a request waits for a leader: a lease, a heartbeat for a
    /// standby to claim it, and the new leader's start.
    fn patience(&self) -> Duration {
        let settings = self.cluster.settings();
        settings.lease + settings.heartbeat + LEADER_START
    }

    /// Records who leads, `(id, advertised URL)`.
    pub fn learned(&self, (id, url): (Uuid, String)) -> Leader {
        let leader = Leader {
            id,
            url: url.trim_end_matches('/').to_owned(),
        };
        self.leader.send_if_modified(|now| {
            let changed = now.as_ref() != Some(&leader);
            *now = Some(leader.clone());
            changed
        });
        leader
    }

    /// The leader, waiting until `deadline` for one to appear.
    async fn leader_by(&self, deadline: Instant) -> Result<Leader, Response> {
        if let Some(leader) = self.leader.borrow().clone() {
            return Ok(leader);
        }
        loop {
            match self.who_leads().await {
                // This replica, if it has just claimed the lease: its server
                // starts on the address this relay served, so a request
                // still here goes there.
                Ok(Some(found)) => return Ok(self.learned(found)),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "cannot read who leads"),
            }
            if Instant::now() >= deadline {
                return Err(edge_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorCode::Unavailable,
                    "no replica leads just now (a failover is under way): retry in a few seconds",
                ));
            }
            tokio::time::sleep(LEADER_POLL).await;
        }
    }

    /// Who leads, as the database says within a heartbeat (a second at
    /// least): cut off from it, a query neither answers nor fails.
    pub async fn who_leads(&self) -> anyhow::Result<Option<(Uuid, String)>> {
        let within = self
            .cluster
            .settings()
            .heartbeat
            .max(Duration::from_secs(1));
        match tokio::time::timeout(within, self.cluster.leader()).await {
            Ok(read) => Ok(read?),
            Err(_) => anyhow::bail!("the database did not answer within {within:?}"),
        }
    }

    /// Resolves once another replica than `leader` leads: `leader` can
    /// never act again then (it stopped, or is fenced off), so nothing more
    /// is to be had from it. A leader cut off by the network, or paused,
    /// neither answers nor closes its connections.
    pub async fn replaced(&self, leader: Uuid) {
        let mut read = self.leader.subscribe();
        if read
            .wait_for(|now| now.as_ref().is_some_and(|now| now.id != leader))
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }

    /// Runs `attempt` on the leader's URL; while it says [`Sent::Untaken`]
    /// (the leader could not be reached, or no longer leads), on whoever
    /// leads next, for up to [`Self::patience`]. A leader replaced before it
    /// answered may or may not have taken the request: it is sent to the
    /// next leader only if it is `resendable` (it changes nothing). The
    /// answer, and the leader that gave it.
    pub async fn to_leader<T, F>(
        &self,
        resendable: bool,
        mut attempt: impl FnMut(String) -> F,
    ) -> Result<(T, Uuid), Response>
    where
        F: Future<Output = Sent<T>>,
    {
        let deadline = Instant::now() + self.patience();
        loop {
            let Leader { id, url: leader } = self.leader_by(deadline).await?;
            let sent = tokio::select! {
                sent = attempt(leader.clone()) => sent,
                () = self.replaced(id) => if resendable {
                    Sent::Untaken(format!("{leader} was replaced before it answered"))
                } else {
                    tracing::warn!(leader = %leader, "the leader was replaced before it answered");
                    Sent::Refused(edge_error(
                        StatusCode::BAD_GATEWAY,
                        ErrorCode::Unavailable,
                        &format!(
                            "the leader at {leader} was replaced before it answered: whether \
                             it took the request is not known"
                        ),
                    ))
                }
            };
            match sent {
                Sent::Taken(answer) => return Ok((answer, id)),
                Sent::Refused(refused) => return Err(refused),
                Sent::Untaken(why) => {
                    self.leader.send_replace(None);
                    if Instant::now() >= deadline {
                        tracing::warn!(leader = %leader, error = %why, "cannot reach the leader");
                        return Err(edge_error(
                            StatusCode::BAD_GATEWAY,
                            ErrorCode::Unavailable,
                            &format!(
                                "the leader at {leader} cannot be reached: retry in a few seconds"
                            ),
                        ));
                    }
                    tracing::debug!(leader = %leader, error = %why, "the leader did not take the request; waiting for the next");
                    tokio::time::sleep(LEADER_POLL).await;
                }
            }
        }
    }
}

/// The replica leading, as last read.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Leader {
    id: Uuid,
    url: String,
}

/// What became of one attempt to send a request to the leader.
pub(super) enum Sent<T> {
    /// The leader has it: its answer.
    Taken(T),
    /// It did not reach a leader (why): it may go to the next one.
    Untaken(String),
    /// An answer that ends it here.
    Refused(Response),
}

pub(super) type Shared = State<Arc<Relay>>;

/// Whether a request only reads: a GET or HEAD, or a GraphQL body (one
/// request or a batch) every operation of which is a query. Anything
/// unreadable counts as a write.
pub(super) fn reads_only(method: &axum::http::Method, body: &[u8]) -> bool {
    use async_graphql::parser::types::OperationType;
    if matches!(*method, axum::http::Method::GET | axum::http::Method::HEAD) {
        return true;
    }
    let Ok(parsed) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    let requests = match &parsed {
        serde_json::Value::Array(batch) => batch.iter().collect(),
        one => vec![one],
    };
    !requests.is_empty()
        && requests.into_iter().all(|request| {
            request["query"]
                .as_str()
                .and_then(|query| async_graphql::parser::parse_query(query).ok())
                .is_some_and(|document| {
                    document
                        .operations
                        .iter()
                        .all(|(_, op)| op.node.ty == OperationType::Query)
                })
        })
}

/// The headers to send on: all but hop-by-hop ones and `Host`, with the
/// client's address added to `X-Forwarded-For`.
pub(super) fn forwarded_headers(headers: &HeaderMap, peer: SocketAddr) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(headers.len() + 1);
    for (name, value) in headers {
        if name == header::HOST || HOP_BY_HOP.contains(&name.as_str()) {
            continue;
        }
        if name.as_str().starts_with("sec-websocket-") {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    let forwarded = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(earlier) => format!("{earlier}, {}", peer.ip()),
        None => peer.ip().to_string(),
    };
    if let Ok(value) = HeaderValue::from_str(&forwarded) {
        out.insert(HeaderName::from_static("x-forwarded-for"), value);
    }
    out
}

pub(super) async fn relay_http(
    State(relay): Shared,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, relay.max_body).await else {
        return too_large(relay.max_body);
    };
    relay_read(&relay, parts, body, peer).await
}

/// What a request larger than `max_body` is told.
pub(super) fn too_large(max_body: usize) -> Response {
    edge_error(
        StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::BadRequest,
        &format!("the request body is larger than {max_body} bytes (graphql.max_body_bytes)"),
    )
}

/// Sends a request read whole on to the leader; its answer, streamed back.
pub(super) async fn relay_read(
    relay: &Relay,
    parts: axum::http::request::Parts,
    body: axum::body::Bytes,
    peer: SocketAddr,
) -> Response {
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let headers = forwarded_headers(&parts.headers, peer);
    // A leader that cannot be reached may have just died, or one that lost
    // its lease refused it: the request was not taken, so it goes to
    // whoever leads next.
    let resendable = reads_only(&parts.method, &body);
    let answer = match relay
        .send(parts.method.clone(), &path, headers, body, resendable)
        .await
    {
        Ok(answer) => answer,
        Err(refused) => return refused,
    };
    let mut response = Response::builder().status(answer.status());
    if let Some(headers) = response.headers_mut() {
        for (name, value) in answer.headers() {
            if !HOP_BY_HOP.contains(&name.as_str()) {
                headers.append(name.clone(), value.clone());
            }
        }
    }
    response
        .body(Body::from_stream(answer.bytes_stream()))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

impl Relay {
    /// Sends a request to the leader (see [`Self::to_leader`]); its answer.
    async fn send(
        &self,
        method: axum::http::Method,
        path: &str,
        headers: HeaderMap,
        body: axum::body::Bytes,
        resendable: bool,
    ) -> Result<reqwest::Response, Response> {
        let sent = self
            .to_leader(resendable, |leader| {
                let request = self
                    .http
                    .request(method.clone(), format!("{leader}{path}"))
                    .headers(headers.clone())
                    .body(body.clone());
                async move {
                    match request.send().await {
                        Ok(answer) if answer.headers().contains_key(crate::app::NOT_LEADING) => {
                            Sent::Untaken(format!("{leader} no longer leads"))
                        }
                        Ok(answer) => Sent::Taken(answer),
                        Err(e) if e.is_connect() => Sent::Untaken(crate::error_chain(&e)),
                        // Sent, and then lost: whether the leader took it is
                        // not known, so it is not sent again.
                        Err(e) => {
                            tracing::warn!(leader = %leader, error = %crate::error_chain(&e), "the leader's answer was lost");
                            Sent::Refused(edge_error(
                                StatusCode::BAD_GATEWAY,
                                ErrorCode::Unavailable,
                                &format!(
                                    "the leader at {leader} did not answer: whether it took the \
                                     request is not known"
                                ),
                            ))
                        }
                    }
                }
            })
            .await;
        sent.map(|(answer, _)| answer)
    }
}

/// A standby's websocket mutations (see `api::http::ForwardMutation`),
/// sent to the leader as `POST /graphql` with the caller's token.
pub(super) fn mutations_to_leader(relay: Arc<Relay>) -> ForwardMutation {
    Arc::new(move |request, token, client| {
        let relay = relay.clone();
        Box::pin(async move {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            if let Some(token) = token
                && let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}"))
            {
                headers.insert(header::AUTHORIZATION, value);
            }
            if let Some(address) = client.0
                && let Ok(value) = HeaderValue::from_str(&address.to_string())
            {
                headers.insert(HeaderName::from_static("x-forwarded-for"), value);
            }
            let body = serde_json::to_vec(&request).unwrap_or_default().into();
            let answer = relay
                .send(axum::http::Method::POST, "/graphql", headers, body, false)
                .await;
            let read = match answer {
                Ok(answer) => answer.bytes().await.map_err(|e| crate::error_chain(&e)),
                Err(refused) => {
                    let body = axum::body::to_bytes(refused.into_body(), 64 * 1024).await;
                    body.map_err(|e| e.to_string())
                }
            };
            read.and_then(|bytes| {
                serde_json::from_slice::<async_graphql::Response>(&bytes).map_err(|e| e.to_string())
            })
            .unwrap_or_else(|why| {
                let mut error = async_graphql::ServerError::new(
                    format!("the leader did not answer the mutation: {why}"),
                    None,
                );
                error.extensions = Some({
                    let mut extensions = async_graphql::ErrorExtensionValues::default();
                    extensions.set("code", ErrorCode::Unavailable.as_str());
                    extensions
                });
                async_graphql::Response::from_errors(vec![error])
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use axum::http::Method;

    use super::reads_only;

    fn post(body: &str) -> bool {
        reads_only(&Method::POST, body.as_bytes())
    }

    #[test]
    fn only_reads_are_sent_again_to_a_new_leader() {
        assert!(reads_only(&Method::GET, b""));
        assert!(post(r#"{"query": "{ serverInfo { version } }"}"#));
        assert!(post(
            r#"{"query": "query A { me { id } } query B { replicas { id } }", "operationName": "B"}"#
        ));
        assert!(post(
            r#"[{"query": "{ a: serverInfo { version } }"}, {"query": "query { me { id } }"}]"#
        ));
        // A write, or anything that could hold one, is not.
        assert!(!post(r#"{"query": "mutation { logout }"}"#));
        assert!(!post(
            r#"{"query": "query A { me { id } } mutation B { logout }", "operationName": "A"}"#
        ));
        assert!(!post(
            r#"[{"query": "{ me { id } }"}, {"query": "mutation { logout }"}]"#
        ));
        assert!(!post(r#"{"query": "subscription { x }"}"#));
        assert!(!post(r#"{"query": "{ unclosed"}"#));
        assert!(!post("not json"));
        assert!(!post("[]"));
        assert!(!reads_only(&Method::DELETE, b""));
    }
}
