//! Authentication: the guard, login, sessions, API tokens.

use serde_json::json;

use crate::support::{ADMIN_TOKEN, TestApp, data, error_code};

#[tokio::test]
async fn everything_but_server_info_and_login_needs_a_valid_token() {
    let app = TestApp::spawn().await;
    let private = [
        "{ me { id } }",
        "mutation { createApiToken(name: \"x\") { token } }",
        "mutation { logout }",
        "mutation { setPassword(newPassword: \"long enough\") }",
        "{ serverInfo { version } me { id } }",
        // A fragment does not hide a private field.
        "{ ...F } fragment F on Query { me { id } }",
        "{ ... on Query { me { id } } }",
    ];
    for query in private {
        // No token and a wrong one are told apart: the fix differs.
        for (token, told) in [
            (None, "needs a token: send `Authorization: Bearer"),
            (Some(""), "needs a token: send `Authorization: Bearer"),
            (
                Some("cbl_not_a_real_token"),
                "the token is not valid (unknown, expired or revoked)",
            ),
        ] {
            let body = app.gql_as(token, query, json!({})).await;
            assert_eq!(
                error_code(&body),
                Some("UNAUTHENTICATED"),
                "{query} with {token:?}: {body}"
            );
            let message = body["errors"][0]["message"].as_str().unwrap_or_default();
            assert!(message.contains(told), "{query} with {token:?}: {body}");
            assert!(body["data"].is_null(), "nothing is served: {body}");
        }
    }
    let public = app
        .gql_as(None, "{ serverInfo { version } __typename }", json!({}))
        .await;
    data(&public);
    let introspection = app
        .gql_as(None, "{ __schema { queryType { name } } }", json!({}))
        .await;
    assert_eq!(
        data(&introspection)["__schema"]["queryType"]["name"],
        "Query"
    );
    // Nothing of the refused mutation happened.
    let tokens = app
        .gql("{ me { apiTokens { totalCount } } }", json!({}))
        .await;
    assert_eq!(data(&tokens)["me"]["apiTokens"]["totalCount"], 1);
}

#[tokio::test]
async fn password_login_sessions_and_api_tokens() {
    let app = TestApp::spawn().await;
    let me = app
        .gql("{ me { username role hasPassword } }", json!({}))
        .await;
    assert_eq!(
        data(&me)["me"],
        json!({"username": "admin", "role": "ADMIN", "hasPassword": false})
    );

    // No password yet: login fails the same way as a wrong one.
    let login = "mutation($u: String!, $p: String!) { login(username: $u, password: $p) { token user { username } } }";
    let refused = app
        .gql_as(None, login, json!({"u": "admin", "p": "whatever-it-is"}))
        .await;
    assert_eq!(error_code(&refused), Some("UNAUTHENTICATED"), "{refused}");

    let short = app
        .gql(
            "mutation { setPassword(newPassword: \"short\") }",
            json!({}),
        )
        .await;
    assert_eq!(error_code(&short), Some("VALIDATION"), "{short}");
    data(
        &app.gql(
            "mutation { setPassword(newPassword: \"correct horse battery\") }",
            json!({}),
        )
        .await,
    );
    let needs_current = app
        .gql(
            "mutation { setPassword(newPassword: \"another good one\") }",
            json!({}),
        )
        .await;
    assert_eq!(
        error_code(&needs_current),
        Some("VALIDATION"),
        "{needs_current}"
    );

    for (user, password) in [
        ("admin", "wrong password"),
        ("nobody", "correct horse battery"),
    ] {
        let body = app
            .gql_as(None, login, json!({"u": user, "p": password}))
            .await;
        assert_eq!(error_code(&body), Some("UNAUTHENTICATED"), "{body}");
        assert_eq!(body["errors"][0]["message"], "invalid username or password");
    }

    // Login returns a session token and sets the same one as a cookie.
    let response = app
        .client
        .post(app.url("/graphql"))
        .json(&json!({"query": login, "variables": {"u": "admin", "p": "correct horse battery"}}))
        .send()
        .await
        .unwrap();
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    let body: serde_json::Value = response.json().await.unwrap();
    let session = data(&body)["login"]["token"].as_str().unwrap().to_owned();
    assert!(
        cookie.starts_with(&format!("corbel_session={session};")),
        "{cookie}"
    );
    assert_ne!(session, ADMIN_TOKEN);

    let by_session = app
        .gql_as(Some(&session), "{ me { username } }", json!({}))
        .await;
    assert_eq!(data(&by_session)["me"]["username"], "admin");
    let by_cookie: serde_json::Value = app
        .client
        .post(app.url("/graphql"))
        .header("Cookie", format!("corbel_session={session}"))
        .json(&json!({"query": "{ me { username } }"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(data(&by_cookie)["me"]["username"], "admin");

    // API tokens: the secret once, then only metadata.
    let made = app
        .gql_as(
            Some(&session),
            "mutation { createApiToken(name: \"ci\") { token apiToken { id name kind } } }",
            json!({}),
        )
        .await;
    let made = &data(&made)["createApiToken"];
    let api_token = made["token"].as_str().unwrap().to_owned();
    assert_eq!(made["apiToken"]["kind"], "API");
    let by_api = app
        .gql_as(
            Some(&api_token),
            "{ me { apiTokens { totalCount edges { node { name kind } } } } }",
            json!({}),
        )
        .await;
    let listed = data(&by_api)["me"]["apiTokens"].clone();
    assert_eq!(listed["totalCount"], 3, "bootstrap, session, ci: {listed}");
    assert!(
        !listed.to_string().contains(&api_token),
        "no secret is listed"
    );
    assert!(
        !listed.to_string().contains(&session),
        "no secret is listed"
    );

    let empty_name = app
        .gql(
            "mutation { createApiToken(name: \"  \") { token } }",
            json!({}),
        )
        .await;
    assert_eq!(error_code(&empty_name), Some("VALIDATION"));

    // Revoking the API token ends it.
    let id = made["apiToken"]["id"].as_str().unwrap();
    data(
        &app.gql(
            "mutation($id: ID!) { revokeApiToken(id: $id) }",
            json!({"id": id}),
        )
        .await,
    );
    let gone = app
        .gql_as(Some(&api_token), "{ me { id } }", json!({}))
        .await;
    assert_eq!(error_code(&gone), Some("UNAUTHENTICATED"));
    assert_eq!(
        gone["errors"][0]["message"], "`me`: the token is not valid (unknown, expired or revoked)",
        "a revoked token is told it is not valid: {gone}"
    );
    let again = app
        .gql(
            "mutation($id: ID!) { revokeApiToken(id: $id) }",
            json!({"id": id}),
        )
        .await;
    assert_eq!(error_code(&again), Some("NOT_FOUND"));
    let bad_id = app
        .gql("mutation { revokeApiToken(id: \"nope\") }", json!({}))
        .await;
    assert_eq!(error_code(&bad_id), Some("VALIDATION"));

    // Logout ends the session.
    data(
        &app.gql_as(Some(&session), "mutation { logout }", json!({}))
            .await,
    );
    let after = app.gql_as(Some(&session), "{ me { id } }", json!({})).await;
    assert_eq!(error_code(&after), Some("UNAUTHENTICATED"));
}

#[tokio::test]
async fn expired_sessions_are_refused() {
    let store = std::sync::Arc::new(crate::support::TestStore::fresh().await);
    let app = TestApp::spawn_with(store, |c| c.session_ttl = std::time::Duration::ZERO).await;
    data(
        &app.gql(
            "mutation { setPassword(newPassword: \"correct horse battery\") }",
            json!({}),
        )
        .await,
    );
    let body = app
        .gql_as(
            None,
            "mutation { login(username: \"admin\", password: \"correct horse battery\") { token } }",
            json!({}),
        )
        .await;
    let session = data(&body)["login"]["token"].as_str().unwrap().to_owned();
    let refused = app.gql_as(Some(&session), "{ me { id } }", json!({})).await;
    assert_eq!(error_code(&refused), Some("UNAUTHENTICATED"), "{refused}");
}
