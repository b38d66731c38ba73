//! Bad requests get clear errors with codes, never a panic or a 500.

use serde_json::{Value, json};

use crate::support::{ADMIN_TOKEN, TestApp, data, error_code};

async fn post_raw(app: &TestApp, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let response = app
        .client
        .post(app.url("/graphql"))
        .bearer_auth(ADMIN_TOKEN)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.expect("errors are JSON"))
}

#[tokio::test]
async fn malformed_bodies_are_bad_requests() {
    let app = TestApp::spawn().await;
    for (body, hint) in [
        ("{\"query\": ", "EOF"),
        ("", "empty"),
        ("[1, 2]", "not a GraphQL request"),
        ("{\"variables\": {}}", "no `query`"),
        ("[]", "empty batch"),
        ("\u{0}\u{1}garbage", "not a GraphQL request"),
    ] {
        let (status, reply) = post_raw(&app, body).await;
        assert_eq!(status, 400, "{body:?}: {reply}");
        assert_eq!(error_code(&reply), Some("BAD_REQUEST"), "{reply}");
        let message = reply["errors"][0]["message"].as_str().unwrap();
        assert!(message.contains(hint), "{body:?}: {message}");
    }
}

#[tokio::test]
async fn oversized_bodies_are_refused() {
    let store = std::sync::Arc::new(crate::support::TestStore::fresh().await);
    let app = TestApp::spawn_with(store, |c| c.graphql.max_body_bytes = 1024).await;
    let padding = "x".repeat(4096);
    let (status, reply) = post_raw(
        &app,
        json!({"query": "{ serverInfo { version } }", "variables": {"pad": padding}}).to_string(),
    )
    .await;
    assert_eq!(status, 413);
    assert_eq!(error_code(&reply), Some("BAD_REQUEST"));
    assert!(
        reply["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("1024")
    );
}

#[tokio::test]
async fn invalid_documents_are_named() {
    let app = TestApp::spawn().await;
    let cases = [
        ("{ serverInfo { nope } }", "Unknown field \"nope\""),
        ("{ serverInfo { version }", "expected"),
        ("query($n: Int!) { serverInfo { version } }", "$n"),
        ("{ notAField }", "notAField"),
    ];
    for (query, hint) in cases {
        let body = app.gql(query, json!({})).await;
        assert_eq!(error_code(&body), Some("INVALID_QUERY"), "{query}: {body}");
        let message = body["errors"][0]["message"].as_str().unwrap();
        assert!(message.contains(hint), "{query}: {message}");
    }
    let wrong_type = app
        .gql(
            "mutation($n: String!) { createApiToken(name: $n) { token } }",
            json!({"n": 5}),
        )
        .await;
    assert_eq!(
        error_code(&wrong_type),
        Some("INVALID_QUERY"),
        "{wrong_type}"
    );
}

#[tokio::test]
async fn over_deep_and_over_complex_queries_are_refused() {
    let store = std::sync::Arc::new(crate::support::TestStore::fresh().await);
    let app = TestApp::spawn_with(store, |c| {
        c.graphql.max_depth = 6;
        c.graphql.max_complexity = 40;
    })
    .await;
    let deep =
        "{ __schema { types { fields { type { ofType { ofType { ofType { name } } } } } } } }";
    let body = app.gql(deep, json!({})).await;
    assert_eq!(error_code(&body), Some("INVALID_QUERY"), "{body}");
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("deep"),
        "{body}"
    );

    let wide: String = (0..50)
        .map(|i| format!("a{i}: serverInfo {{ version }} "))
        .collect();
    let body = app.gql(&format!("{{ {wide} }}"), json!({})).await;
    assert_eq!(error_code(&body), Some("INVALID_QUERY"), "{body}");
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("complex"),
        "{body}"
    );

    // Within the limits all is well.
    data(&app.gql("{ serverInfo { version } }", json!({})).await);
}

#[tokio::test]
async fn batches_run_each_request() {
    let app = TestApp::spawn().await;
    let (status, reply) = post_raw(
        &app,
        json!([
            {"query": "{ serverInfo { version } }"},
            {"query": "{ me { username } }"}
        ])
        .to_string(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        reply[0]["data"]["serverInfo"]["version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(reply[1]["data"]["me"]["username"], "admin");
}
