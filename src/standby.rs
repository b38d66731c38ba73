//! A replica's life (`corbel serve --cluster`): a standby until it leads,
//! then the whole server.
//!
//! Several replicas share one PostgreSQL database. One of them, the holder of
//! the leader lease (`cluster`), runs the whole server: providers, runs,
//! recovery, the singletons. The others are standbys: members with a
//! heartbeat that forward every request they receive to the leader (its
//! advertised URL), as Vault's standbys and Nomad's followers do, so a client
//! may use any replica. When the leader's lease runs out (it died, or was cut
//! off from the database and stopped itself), the standby that claims the
//! lease stops forwarding, takes the database's server lock over (ending the
//! old leader's session) and starts the server on the same address; its
//! start settles the journal the old leader left, as after any crash.
//!
//! A leader that loses its lease stops at once ([`LostLeadership`]): by its
//! own clock that happens a heartbeat before the database would let another
//! take over, so two replicas never act as leader together.
//!
//! Forwarding: HTTP requests are relayed with their headers (less hop-by-hop
//! ones) and bodies streamed both ways, with the client's address added to
//! `X-Forwarded-For`; `/graphql/ws` is relayed frame by frame. When the
//! leader goes away, a relayed websocket is closed with 1012 (service
//! restart): the client subscribes again on any replica, and
//! `deploymentEvents(after:)` resumes past the last event it saw. While no
//! replica leads, a request waits up to one lease for a leader, then gets 503
//! `UNAVAILABLE`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::body::Body;
use axum::extract::ws::{CloseFrame, Message as ClientMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message as UpstreamMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame as UpstreamClose;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::api::ErrorCode;
use crate::api::http::edge_error;
pub use crate::app::LostLeadership;
use crate::app::{App, Listen};
use crate::cluster::Cluster;
use crate::config::Config;
use crate::store::lock::{Holder, ServerLock};

/// How long the relay of a request waits to connect to the leader.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a new leader may take to start serving, as a request waiting
/// for it counts.
const LEADER_START: Duration = Duration::from_secs(15);
/// How often a request waiting for a leader looks again.
const LEADER_POLL: Duration = Duration::from_millis(100);
/// The close code of a relayed websocket whose leader went away.
const SERVICE_RESTART: u16 = 1012;

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

/// Runs this replica until `shutdown` fires: a standby while another leads,
/// the whole server once it leads. Returns [`LostLeadership`] as an error
/// when it led and lost the lease: the process must then end at once.
pub async fn serve(
    config: &Config,
    shutdown: CancellationToken,
    announce: impl FnOnce(SocketAddr, bool),
) -> anyhow::Result<()> {
    let provider_settings = config
        .provider_settings()
        .context("resolving the data directory")?;
    crate::provider::check_socket_paths(&provider_settings)?;
    let location = config.database()?;
    let me = Holder::me("serve", Some(config.listen));
    let lock =
        ServerLock::acquire_data_dir(&provider_settings.data_dir, &location, me.clone()).await?;
    let db = crate::store::connect_limited(&location, Some(config.cluster.lease)).await?;
    crate::store::lock::migrating(&location, &me, async {
        crate::store::migrate(&db)
            .await
            .map_err(anyhow::Error::from)
    })
    .await?;
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let bound = listener
        .local_addr()
        .context("reading the listener's address")?;
    let advertise_url = config
        .cluster
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("http://{bound}"));
    // Membership outlives the server a leader runs: the lease is given up
    // only once that server has stopped, so no successor starts while it
    // still finishes work.
    let membership_stop = CancellationToken::new();
    let cluster = Cluster::join(
        db,
        config.cluster.clone(),
        advertise_url,
        false,
        membership_stop.clone(),
    )
    .await
    .context("joining as a replica")?;
    let membership = tokio::spawn(cluster.clone().run());
    let leading = cluster.leader_epoch().is_some();
    announce(bound, leading);

    let ran = async {
        let listen = if leading {
            Listen::Bound(listener)
        } else if forward_until_leading(
            &cluster,
            config.graphql.max_body_bytes,
            listener,
            &shutdown,
        )
        .await?
        {
            Listen::At(bound)
        } else {
            return Ok(());
        };
        tracing::info!(replica = %cluster.id(), "leading: starting the server");
        let app = App::build_leader(config, lock, cluster.clone(), listen).await?;
        app.show_new_admin_token();
        let stopped = shutdown.clone();
        app.run_until_stopped(async move { stopped.cancelled().await })
            .await
    }
    .await;
    if ran.as_ref().is_err_and(|e| e.is::<LostLeadership>()) {
        // The lease is gone already; nothing more is done here.
        return ran;
    }
    membership_stop.cancel();
    let _ = membership.await;
    ran
}

/// Forwards requests to the leader until this replica leads (true) or
/// `shutdown` fires (false).
async fn forward_until_leading(
    cluster: &Cluster,
    max_body: usize,
    listener: TcpListener,
    shutdown: &CancellationToken,
) -> anyhow::Result<bool> {
    let relay = Arc::new(Relay {
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
    });
    let router = Router::new()
        .route("/healthz", get(crate::api::http::healthz))
        .route("/graphql/ws", get(relay_ws).post(relay_http))
        .fallback(relay_http)
        .with_state(relay.clone());
    let mut leadership = cluster.leadership();
    let promoted = CancellationToken::new();
    let stop = promoted.clone();
    let serving = tokio::spawn(
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .into_future(),
    );
    // Who leads, read every heartbeat: a request or a socket waiting on a
    // leader that has been replaced gives up on it.
    let watching = tokio::spawn({
        let relay = relay.clone();
        let stop = promoted.clone();
        async move {
            let mut every = tokio::time::interval(relay.cluster.settings().heartbeat);
            loop {
                tokio::select! {
                    _ = every.tick() => {}
                    _ = stop.cancelled() => return,
                }
                let read = tokio::select! {
                    read = relay.who_leads() => read,
                    _ = stop.cancelled() => return,
                };
                if let Ok(Some(found)) = read {
                    relay.learned(found);
                }
            }
        }
    });
    tracing::info!("standby: forwarding requests to the leader");
    let leads = loop {
        if leadership.borrow_and_update().is_some() {
            break true;
        }
        tokio::select! {
            changed = leadership.changed() => if changed.is_err() { break false },
            _ = shutdown.cancelled() => break false,
        }
    };
    // The listener is dropped as the graceful shutdown begins, so the server
    // can bind the same address while relayed requests finish.
    promoted.cancel();
    let _ = watching.await;
    if leads {
        // Requests still waiting on the old leader go to this one, whose
        // server starts on the address this relay served.
        relay.learned((cluster.id(), cluster.advertise_url().to_owned()));
    }
    relay.sockets.cancel();
    relay.socket_tasks.close();
    if !leads {
        let _ = serving.await;
        relay.socket_tasks.wait().await;
    } else {
        // Requests under way finish in the background.
        tokio::spawn(serving);
    }
    Ok(leads)
}

struct Relay {
    cluster: Cluster,
    /// Who leads, as last read: every heartbeat, and at once when the
    /// leader did not take a request (`None` until then).
    leader: tokio::sync::watch::Sender<Option<Leader>>,
    /// A request body is read whole, up to the API's own limit, so that it
    /// can be sent again to a new leader.
    max_body: usize,
    http: reqwest::Client,
    /// Closes relayed websockets (with 1012) when this replica stops
    /// forwarding.
    sockets: CancellationToken,
    socket_tasks: TaskTracker,
}

impl Relay {
    /// How long a request waits for a leader: a lease, a heartbeat for a
    /// standby to claim it, and the new leader's start.
    fn patience(&self) -> Duration {
        let settings = self.cluster.settings();
        settings.lease + settings.heartbeat + LEADER_START
    }

    /// Records who leads, `(id, advertised URL)`.
    fn learned(&self, (id, url): (Uuid, String)) -> Leader {
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
    async fn who_leads(&self) -> anyhow::Result<Option<(Uuid, String)>> {
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
    async fn replaced(&self, leader: Uuid) {
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
    async fn to_leader<T, F>(
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
struct Leader {
    id: Uuid,
    url: String,
}

/// What became of one attempt to send a request to the leader.
enum Sent<T> {
    /// The leader has it: its answer.
    Taken(T),
    /// It did not reach a leader (why): it may go to the next one.
    Untaken(String),
    /// An answer that ends it here.
    Refused(Response),
}

type Shared = State<Arc<Relay>>;

/// Whether a request only reads: a GET or HEAD, or a GraphQL body (one
/// request or a batch) every operation of which is a query. Anything
/// unreadable counts as a write.
fn reads_only(method: &axum::http::Method, body: &[u8]) -> bool {
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
fn forwarded_headers(headers: &HeaderMap, peer: SocketAddr) -> HeaderMap {
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

async fn relay_http(
    State(relay): Shared,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, relay.max_body).await else {
        return edge_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::BadRequest,
            &format!(
                "the request body is larger than {} bytes (graphql.max_body_bytes)",
                relay.max_body
            ),
        );
    };
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
    let sent = relay
        .to_leader(resendable, |leader| {
            let request = relay
                .http
                .request(parts.method.clone(), format!("{leader}{path}"))
                .headers(headers.clone())
                .body(body.clone());
            async move {
                match request.send().await {
                    Ok(answer) if answer.headers().contains_key(crate::app::NOT_LEADING) => {
                        Sent::Untaken(format!("{leader} no longer leads"))
                    }
                    Ok(answer) => Sent::Taken(answer),
                    Err(e) if e.is_connect() => Sent::Untaken(crate::error_chain(&e)),
                    // Sent, and then lost: whether the leader took it is not
                    // known, so it is not sent again.
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
    let answer = match sent {
        Ok((answer, _)) => answer,
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

/// `/graphql/ws`: opens the same socket to the leader, then relays frames
/// both ways until either side closes.
async fn relay_ws(
    State(relay): Shared,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &relay).await {
        Ok(upgrade) => upgrade,
        Err(_) => {
            return relay_http(
                State(relay),
                ConnectInfo(peer),
                Request::from_parts(parts, body),
            )
            .await;
        }
    };
    // Nothing happens on a socket before its first message: opening it is
    // always resendable.
    let sent = relay
        .to_leader(true, |leader| {
            let request = upstream_request(&leader, &parts.headers, peer);
            async move {
                let request = match request {
                    Ok(request) => request,
                    Err(unusable) => {
                        return Sent::Refused(edge_error(
                            StatusCode::BAD_GATEWAY,
                            ErrorCode::Unavailable,
                            &unusable,
                        ));
                    }
                };
                let connected = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    tokio_tungstenite::connect_async(request),
                )
                .await;
                match connected {
                    Ok(Ok(connected)) => Sent::Taken(connected),
                    Ok(Err(tokio_tungstenite::tungstenite::Error::Http(refused)))
                        if refused.headers().contains_key(crate::app::NOT_LEADING) =>
                    {
                        Sent::Untaken(format!("{leader} no longer leads"))
                    }
                    Ok(Err(tokio_tungstenite::tungstenite::Error::Http(refused))) => {
                        // The leader refused the socket (a bad protocol, say):
                        // say what it said.
                        let (parts, body) = refused.into_parts();
                        Sent::Refused(Response::from_parts(
                            parts,
                            Body::from(body.unwrap_or_default()),
                        ))
                    }
                    Ok(Err(e)) => Sent::Untaken(crate::error_chain(&e)),
                    Err(_) => Sent::Untaken(format!("no answer within {CONNECT_TIMEOUT:?}")),
                }
            }
        })
        .await;
    let ((upstream, answer), leader) = match sent {
        Ok(connected) => connected,
        Err(refused) => return refused,
    };
    let chosen = answer
        .headers()
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Messages bounded as the leader bounds them.
    let upgrade = upgrade
        .max_message_size(relay.max_body)
        .max_frame_size(relay.max_body);
    let upgrade = match chosen {
        Some(protocol) => upgrade.protocols([protocol]),
        None => upgrade,
    };
    let tasks = relay.socket_tasks.clone();
    upgrade.on_upgrade(move |client| tasks.track_future(pump(client, upstream, relay, leader)))
}

/// The websocket request to the leader at `leader`, with the client's
/// headers and subprotocols.
fn upstream_request(
    leader: &str,
    client: &HeaderMap,
    peer: SocketAddr,
) -> Result<tokio_tungstenite::tungstenite::handshake::client::Request, String> {
    let url = format!(
        "{}/graphql/ws",
        leader
            .replacen("https://", "wss://", 1)
            .replacen("http://", "ws://", 1)
    );
    let Ok(mut request) = url.as_str().into_client_request() else {
        return Err(format!("the leader's URL {leader} is not usable"));
    };
    let headers = request.headers_mut();
    for (name, value) in forwarded_headers(client, peer) {
        if let Some(name) = name
            && name != header::CONTENT_LENGTH
        {
            headers.append(name, value);
        }
    }
    if let Some(protocols) = client.get(header::SEC_WEBSOCKET_PROTOCOL) {
        headers.insert(header::SEC_WEBSOCKET_PROTOCOL, protocols.clone());
    }
    Ok(request)
}

type Upstream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Relays frames both ways until either side closes, this replica stops
/// forwarding, or `leader` is replaced (its socket may never end by itself).
async fn pump(client: WebSocket, upstream: Upstream, relay: Arc<Relay>, leader: Uuid) {
    let closing = relay.sockets.clone();
    let replaced = relay.replaced(leader);
    tokio::pin!(replaced);
    let (mut to_client, mut from_client) = client.split();
    let (mut to_leader, mut from_leader) = upstream.split();
    let gone = |reason: &str| {
        ClientMessage::Close(Some(CloseFrame {
            code: SERVICE_RESTART,
            reason: reason.into(),
        }))
    };
    loop {
        tokio::select! {
            from = from_client.next() => match from {
                Some(Ok(message)) => {
                    let closing_now = matches!(message, ClientMessage::Close(_));
                    if let Some(message) = to_upstream(message)
                        && to_leader.send(message).await.is_err()
                    {
                        let _ = to_client.send(gone("the leader went away: subscribe again")).await;
                        return;
                    }
                    if closing_now {
                        return;
                    }
                }
                _ => {
                    let _ = to_leader.close().await;
                    return;
                }
            },
            from = from_leader.next() => match from {
                Some(Ok(message)) => {
                    let closed = matches!(message, UpstreamMessage::Close(_));
                    if let Some(message) = to_downstream(message) {
                        let _ = to_client.send(message).await;
                    }
                    if closed {
                        return;
                    }
                }
                _ => {
                    let _ = to_client.send(gone("the leader went away: subscribe again")).await;
                    return;
                }
            },
            () = &mut replaced => {
                let _ = to_client.send(gone("the leader was replaced: subscribe again")).await;
                return;
            }
            _ = closing.cancelled() => {
                let _ = to_client.send(gone("this replica leads now: subscribe again")).await;
                let _ = to_leader.close().await;
                return;
            }
        }
    }
}

fn to_upstream(message: ClientMessage) -> Option<UpstreamMessage> {
    Some(match message {
        ClientMessage::Text(text) => UpstreamMessage::text(text.as_str()),
        ClientMessage::Binary(data) => UpstreamMessage::binary(data),
        ClientMessage::Ping(data) => UpstreamMessage::Ping(data),
        ClientMessage::Pong(data) => UpstreamMessage::Pong(data),
        ClientMessage::Close(frame) => UpstreamMessage::Close(frame.map(|f| UpstreamClose {
            code: f.code.into(),
            reason: f.reason.as_str().into(),
        })),
    })
}

fn to_downstream(message: UpstreamMessage) -> Option<ClientMessage> {
    Some(match message {
        UpstreamMessage::Text(text) => ClientMessage::text(text.as_str()),
        UpstreamMessage::Binary(data) => ClientMessage::binary(data),
        UpstreamMessage::Ping(data) => ClientMessage::Ping(data),
        UpstreamMessage::Pong(data) => ClientMessage::Pong(data),
        UpstreamMessage::Close(frame) => ClientMessage::Close(frame.map(|f| CloseFrame {
            code: f.code.into(),
            reason: f.reason.as_str().into(),
        })),
        UpstreamMessage::Frame(_) => return None,
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
