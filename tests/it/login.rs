//! Login rate limiting: failed attempts per user name and per client address.

use std::net::IpAddr;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::support::{TestApp, TestStore, data, error_code};

const LOGIN: &str =
    "mutation($u: String!, $p: String!) { login(username: $u, password: $p) { token } }";
const PASSWORD: &str = "correct horse battery";

/// A login as `user`, from `forwarded_for` when given (as a proxy would say).
async fn login(
    app: &TestApp,
    client: &reqwest::Client,
    user: &str,
    password: &str,
    forwarded_for: Option<&str>,
) -> Value {
    let mut request = client
        .post(app.url("/graphql"))
        .json(&json!({"query": LOGIN, "variables": {"u": user, "p": password}}));
    if let Some(addr) = forwarded_for {
        request = request.header("X-Forwarded-For", format!("203.0.113.99, {addr}"));
    }
    request.send().await.unwrap().json().await.unwrap()
}

async fn with_password(adjust: impl FnOnce(&mut corbel::config::Config)) -> TestApp {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), adjust).await;
    data(
        &app.gql(
            "mutation($p: String!) { setPassword(newPassword: $p) }",
            json!({"p": PASSWORD}),
        )
        .await,
    );
    app
}

fn assert_limited(body: &Value, what: &str) {
    assert_eq!(error_code(body), Some("RATE_LIMITED"), "{body}");
    let message = body["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains(what) && message.contains("try again in"),
        "{message}"
    );
    assert!(
        body["errors"][0]["extensions"]["retryAfterSeconds"]
            .as_u64()
            .unwrap()
            >= 1,
        "{body}"
    );
    assert!(body["data"].is_null(), "{body}");
}

#[tokio::test]
async fn failed_logins_are_limited_per_address_and_per_user() {
    let app = with_password(|c| {
        c.login.user_burst = 3;
        c.login.user_ceiling = 3;
        c.login.address_burst = 5;
        // No refill within the test, however slowly it runs.
        c.login.user_refill = std::time::Duration::from_secs(3600);
        c.login.address_refill = std::time::Duration::from_secs(3600);
        c.login.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
    })
    .await;
    let client = reqwest::Client::new();

    // One address trying many names trips the address limit...
    for i in 0..5 {
        let body = login(
            &app,
            &client,
            &format!("guess{i}"),
            "nope nope",
            Some("198.51.100.1"),
        )
        .await;
        assert_eq!(error_code(&body), Some("UNAUTHENTICATED"), "{body}");
    }
    let body = login(&app, &client, "admin", PASSWORD, Some("198.51.100.1")).await;
    assert_limited(&body, "this address");
    // ...and nobody else: the right password from another address still works.
    let body = login(&app, &client, "admin", PASSWORD, Some("198.51.100.2")).await;
    assert!(
        data(&body)["login"]["token"]
            .as_str()
            .unwrap()
            .starts_with("cbl_")
    );

    // Many addresses trying one name trip that name's limit...
    for i in 0..3 {
        let body = login(
            &app,
            &client,
            "admin",
            "wrong guess",
            Some(&format!("192.0.2.{i}")),
        )
        .await;
        assert_eq!(error_code(&body), Some("UNAUTHENTICATED"), "{body}");
    }
    let body = login(&app, &client, "admin", PASSWORD, Some("192.0.2.200")).await;
    assert_limited(
        &body,
        "this user name from addresses it has not signed in from",
    );
    // ...but not from an address it signed in from.
    let body = login(&app, &client, "admin", PASSWORD, Some("198.51.100.2")).await;
    assert!(data(&body)["login"]["token"].is_string(), "{body}");
    // ...and no other name.
    let body = login(
        &app,
        &client,
        "someone-else",
        "wrong guess",
        Some("192.0.2.200"),
    )
    .await;
    assert_eq!(error_code(&body), Some("UNAUTHENTICATED"), "{body}");
}

/// One address guessing a name slows down only itself: the right password
/// from another address gets in every time.
#[tokio::test]
async fn one_address_guessing_a_name_never_keeps_its_owner_out() {
    let app = with_password(|c| {
        c.login.user_burst = 2;
        c.login.user_refill = std::time::Duration::from_secs(3600);
        c.login.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
    })
    .await;
    let client = reqwest::Client::new();
    for _ in 0..2 {
        let body = login(&app, &client, "admin", "wrong", Some("198.51.100.66")).await;
        assert_eq!(error_code(&body), Some("UNAUTHENTICATED"), "{body}");
    }
    for _ in 0..3 {
        // The guessing address is refused, even with the right password...
        let body = login(&app, &client, "admin", PASSWORD, Some("198.51.100.66")).await;
        assert_limited(&body, "this user name from this address");
        // ...and the owner, from anywhere else, gets in.
        let body = login(&app, &client, "admin", PASSWORD, Some("203.0.113.10")).await;
        assert!(data(&body)["login"]["token"].is_string(), "{body}");
    }
}

#[tokio::test]
async fn the_peer_address_counts_unless_a_proxy_is_trusted() {
    // No trusted proxy: X-Forwarded-For is the client's own word and is ignored.
    let app = with_password(|c| {
        c.login.address_burst = 2;
        c.login.address_refill = std::time::Duration::from_secs(3600);
    })
    .await;
    let client = reqwest::Client::new();
    for i in 0..2 {
        let body = login(
            &app,
            &client,
            &format!("guess{i}"),
            "nope nope",
            Some(&format!("198.51.100.{i}")),
        )
        .await;
        assert_eq!(error_code(&body), Some("UNAUTHENTICATED"), "{body}");
    }
    let body = login(&app, &client, "admin", PASSWORD, Some("198.51.100.77")).await;
    assert_limited(&body, "this address");

    // Another peer address (loopback has the whole 127/8) is not limited.
    let other: IpAddr = "127.0.0.2".parse().unwrap();
    let elsewhere = reqwest::Client::builder()
        .local_address(other)
        .build()
        .unwrap();
    let body = login(&app, &elsewhere, "admin", PASSWORD, None).await;
    assert!(data(&body)["login"]["token"].as_str().is_some(), "{body}");
}
