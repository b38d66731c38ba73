//! Providers that cannot load fail with the reason; bad input is refused.

use std::sync::Arc;

use serde_json::json;

use crate::support::nginx::free_port;
use crate::support::provider_repos::{
    ProviderRepo, fixture_metadata, shell_metadata, workspace_bin,
};
use crate::support::providers::{create_provider, logs, spawn_quick, wait_status};
use crate::support::settings::quick;
use crate::support::types::Provider;
use crate::support::{TestApp, TestStore, data, error_code};

/// Loads `metadata` from a fresh repository and returns the provider once it
/// has `FAILED`, with its log.
async fn fails(app: &TestApp, name: &str, url: &str, reference: &str) -> (Provider, String) {
    let (id, _) = create_provider(
        app,
        json!({ "name": name, "gitUrl": url, "ref": reference }),
    )
    .await;
    let failed = wait_status(app, &id, "FAILED").await;
    let log = logs(app, &id).await;
    (failed, log)
}

#[tokio::test]
async fn broken_providers_fail_with_the_reason() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |config| {
        quick(config);
        config.provider.start_timeout = std::time::Duration::from_secs(4);
        config.provider.build_timeout = std::time::Duration::from_secs(1);
    })
    .await;

    let silent = ProviderRepo::new(
        &shell_metadata("silent", "true", "echo waiting forever; exec sleep 600"),
        &[],
    );
    let (failed, _) = fails(&app, "silent", &silent.url(), "").await;
    let message = failed.status_message.as_deref().unwrap();
    assert!(message.contains("did not register within 4s"), "{message}");
    assert!(
        message.contains("waiting forever"),
        "the log tail: {message}"
    );

    let wrong_token = ProviderRepo::new(
        &shell_metadata(
            "wrong-token",
            "true",
            &format!(
                "CORBEL_PROVIDER_TOKEN=cbp_wrong exec {}",
                workspace_bin("corbel-provider-process").display()
            ),
        ),
        &[],
    );
    let (failed, log) = fails(&app, "wrong-token", &wrong_token.url(), "").await;
    let message = failed.status_message.as_deref().unwrap();
    assert!(message.contains("exited before registering"), "{message}");
    assert!(log.contains("the token does not match"), "{log}");

    let old = ProviderRepo::new(&fixture_metadata("old-protocol"), &[]);
    let (failed, _) = fails(&app, "old-protocol", &old.url(), "").await;
    let message = failed.status_message.as_deref().unwrap();
    assert!(
        message.contains("[1, 2, 3]") && message.contains("[99]"),
        "both version lists are named: {message}"
    );

    let broken_build = ProviderRepo::new(
        &shell_metadata("broken-build", "echo compiling widgets; exit 3", "true"),
        &[],
    );
    let (failed, _) = fails(&app, "broken-build", &broken_build.url(), "").await;
    let message = failed.status_message.as_deref().unwrap();
    assert!(message.contains("exit status 3"), "{message}");
    assert!(message.contains("compiling widgets"), "{message}");

    let bad_field = ProviderRepo::new(
        "name: bad\nversion: 0.1.0\nruntime: shell\nshell:\n  run: [not, a, string]\n",
        &[],
    );
    let (failed, _) = fails(&app, "bad-field", &bad_field.url(), "").await;
    let message = failed.status_message.as_deref().unwrap();
    assert!(
        message.contains("corbel-provider.yaml") && message.contains("shell.run"),
        "{message}"
    );

    let (failed, _) = fails(&app, "missing-ref", &silent.url(), "no-such-tag").await;
    let message = failed.status_message.as_deref().unwrap();
    assert!(message.contains("no-such-tag"), "{message}");

    let slow_build = ProviderRepo::new(
        &shell_metadata(
            "slow-build",
            "echo compiling slowly; exec sleep 300",
            "true",
        ),
        &[],
    );
    let (failed, _) = fails(&app, "slow-build", &slow_build.url(), "").await;
    let message = failed.status_message.as_deref().unwrap();
    assert!(message.contains("did not finish within 1s"), "{message}");
    assert!(message.contains("compiling slowly"), "{message}");

    let closed = format!("git://127.0.0.1:{}/nothing.git", free_port());
    let (failed, _) = fails(&app, "unreachable", &closed, "").await;
    let message = failed.status_message.as_deref().unwrap();
    assert!(message.contains("fetch failed"), "{message}");
    app.stop().await;
}

#[tokio::test]
async fn refused_git_urls_and_bad_input_are_validation_errors() {
    let app = spawn_quick().await;
    for (url, wants) in [
        ("ext::sh -c touch% /tmp/pwned", "not allowed"),
        ("ftp://example.com/p.git", "not allowed"),
        ("", "URL"),
    ] {
        let body = app
            .gql(
                "mutation($input: CreateProviderInput!) { createProvider(input: $input) { token } }",
                json!({ "input": { "name": "x", "gitUrl": url, "autoLoad": false } }),
            )
            .await;
        assert_eq!(error_code(&body), Some("VALIDATION"), "{url}: {body}");
        let message = body["errors"][0]["message"].as_str().unwrap();
        assert!(message.contains(wants), "{url}: {message}");
    }
    let body = app
        .gql(
            "mutation($input: CreateProviderInput!) { createProvider(input: $input) { token } }",
            json!({ "input": { "name": "x", "gitUrl": "/srv/p.git", "config": [1, 2], "autoLoad": false } }),
        )
        .await;
    assert_eq!(error_code(&body), Some("VALIDATION"), "{body}");
    // runAs names a user of the host other than root (this test runs as
    // root, as CI does; else every runAs is refused as needing root).
    for (user, wants) in [("no-such-user-here", "no user named"), ("root", "is root")] {
        let body = app
            .gql(
                "mutation($input: CreateProviderInput!) { createProvider(input: $input) { token } }",
                json!({ "input": { "name": "x", "gitUrl": "/srv/p.git", "runAs": user, "autoLoad": false } }),
            )
            .await;
        assert_eq!(error_code(&body), Some("VALIDATION"), "{user}: {body}");
        let message = body["errors"][0]["message"].as_str().unwrap();
        let wants = if nix::unistd::Uid::effective().is_root() {
            wants
        } else {
            "needs the server to run as root"
        };
        assert!(message.contains(wants), "{user}: {message}");
    }
    let listed = app.gql("{ providers { totalCount } }", json!({})).await;
    assert_eq!(
        data(&listed)["providers"]["totalCount"],
        0,
        "nothing was stored"
    );
    app.stop().await;
}
