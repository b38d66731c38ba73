//! Who is calling over HTTP: the token a request carries (bearer header, or
//! the session cookie from this origin only) and what it names, and the
//! client's address behind trusted proxies.

use std::net::{IpAddr, SocketAddr};

use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, header};

use crate::api::auth::SESSION_COOKIE;
use crate::api::{ApiError, Caller, ClientAddress};
use crate::auth::{Auth, Principal};

/// The socket a request came over (its file descriptor, valid while the
/// request is served), for a handler that tunes its connection: a
/// websocket's send buffer (see `ws::graphql_ws`).
#[derive(Clone, Copy, Debug)]
pub struct PeerSocket(pub std::os::fd::RawFd);

/// Who sent a request (see [`client_address`]); unknown without the peer address.
pub(super) fn client_of(parts: &axum::http::request::Parts, trusted: &[IpAddr]) -> ClientAddress {
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
pub(super) fn client_address(peer: IpAddr, headers: &HeaderMap, trusted: &[IpAddr]) -> IpAddr {
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

/// The token a request carries: the bearer header, else the session cookie.
pub(super) fn bearer_token(headers: &HeaderMap) -> Option<&str> {
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

pub(super) async fn caller_from_headers(
    auth: &Auth,
    headers: &HeaderMap,
) -> Result<Caller, ApiError> {
    match bearer_token(headers) {
        Some(token) => Ok(match authenticate(auth, token).await? {
            Some(principal) => Caller::SignedIn(principal),
            None => Caller::InvalidToken,
        }),
        None => Ok(Caller::Anonymous),
    }
}

pub(super) async fn authenticate(auth: &Auth, token: &str) -> Result<Option<Principal>, ApiError> {
    auth.authenticate(token).await.map_err(ApiError::from)
}
