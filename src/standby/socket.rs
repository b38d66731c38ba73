//! A standby's relay of a websocket (`/exec`) to the leader: the same
//! socket opened there, then frames relayed both ways until either side closes, the
//! leader is replaced, or this replica starts leading.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::ws::{CloseFrame, Message as ClientMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as UpstreamMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame as UpstreamClose;
use uuid::Uuid;

use super::relay::{CONNECT_TIMEOUT, Relay, Sent, Shared, forwarded_headers, relay_http};
use crate::api::ErrorCode;
use crate::api::http::edge_error;

/// The close code of a relayed websocket whose leader went away.
const SERVICE_RESTART: u16 = 1012;

/// A websocket (`/exec`): opens the same socket to the leader, then relays
/// frames both ways until either side closes.
pub(super) async fn relay_ws(
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
            let request = upstream_request(&leader, &parts.uri, &parts.headers, peer);
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
    uri: &axum::http::Uri,
    client: &HeaderMap,
    peer: SocketAddr,
) -> Result<tokio_tungstenite::tungstenite::handshake::client::Request, String> {
    let url = format!(
        "{}{}",
        leader
            .replacen("https://", "wss://", 1)
            .replacen("http://", "ws://", 1),
        uri.path_and_query().map_or("/", |p| p.as_str())
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
