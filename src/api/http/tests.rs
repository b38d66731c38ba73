//! The HTTP edge's unit tests: operation names, client addresses, tokens,
//! and websocket close codes.

use std::net::IpAddr;

use axum::http::{HeaderMap, HeaderValue, header};

use super::caller::{bearer_token, client_address};
use super::named_operation;
use super::ws::{close_reason, protocol_close, token_from_init};

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
