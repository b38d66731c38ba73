//! Providers loaded from real git repositories (local bare repos and `git
//! daemon` on loopback), built and run by the shell runtime as real processes:
//! the reference `corbel-provider-process`, and `corbel-provider-fixture`, a
//! provider that misbehaves on purpose.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::binary::serve;
use crate::support::git::GitDaemon;
use crate::support::nginx::free_port;
use crate::support::processes::{alive, gone, provider_pid};
use crate::support::provider_repos::{
    ProviderRepo, fixture_metadata, process_metadata, shell_metadata, workspace_bin,
};
use crate::support::providers::{
    create_provider, logs, nodes, provider, provider_json, spawn_quick, wait_status,
};
use crate::support::settings::quick;
use crate::support::types::Provider;
use crate::support::websocket::{next_json, subscribe};
use crate::support::{ADMIN_TOKEN, TestApp, TestStore, corbel_bin, data, error_code, eventually};

#[tokio::test]
async fn a_provider_loads_from_git_registers_and_unloads() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, token) = create_provider(
        &app,
        json!({
            "name": "process",
            "gitUrl": repo.url(),
            "ref": "v1",
            "config": {"capacity": 7},
            "secretConfig": {"password": "hunter2-secret"},
        }),
    )
    .await;
    assert!(token.starts_with("cbp_"), "{token}");

    let connected = wait_status(&app, &id, "CONNECTED").await;
    assert_eq!(connected.resolved_commit, Some(repo.head()));
    let metadata = connected.metadata.as_ref().expect("metadata");
    assert_eq!(metadata.name, "process");
    assert_eq!(metadata.runtime, "shell");
    assert_eq!(connected.resource_types, ["process.v1.service"]);
    assert_eq!(connected.secret_config_keys, ["password"]);
    assert_eq!(connected.config, json!({"capacity": 7}));
    assert!(connected.last_seen_at.is_some());
    let features = &connected.features;
    assert!(features.contains(&"deploy".to_owned()), "{features:?}");

    // The stored configuration reached the provider: its node has capacity 7.
    let answer = nodes(&app, &id).await;
    let node = &data(&answer)["provider"]["nodes"][0];
    assert_eq!(node["capacity"]["process.v1.service"], 7, "{answer}");

    // Build and run output and Corbel's notes are in the log; secrets are not.
    let log = logs(&app, &id).await;
    assert!(
        log.contains("[build] building the process provider"),
        "{log}"
    );
    assert!(log.contains("registered:"), "{log}");
    assert!(
        !log.contains("hunter2-secret") && !log.contains(&token),
        "{log}"
    );
    let everything = provider_json(&app, &id).await.to_string();
    assert!(!everything.contains("hunter2-secret"), "{everything}");

    // Deleting is refused while loaded.
    let refused = app
        .gql(
            "mutation($id: ID!) { deleteProvider(id: $id) }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(error_code(&refused), Some("CONFLICT"), "{refused}");

    let pid = provider_pid(&app.store, &id);
    assert!(alive(pid));
    let unloaded = app
        .gql(
            "mutation($id: ID!) { unloadProvider(id: $id) { status } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&unloaded)["unloadProvider"]["status"], "UNLOADED");
    gone(pid).await;
    let answer = nodes(&app, &id).await;
    assert_eq!(
        error_code(&answer),
        Some("PROVIDER_UNAVAILABLE"),
        "{answer}"
    );

    let deleted = app
        .gql(
            "mutation($id: ID!) { deleteProvider(id: $id) }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&deleted)["deleteProvider"], true);
    app.stop().await;
}

#[tokio::test]
async fn provider_events_follow_the_lifecycle_live() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, _) = create_provider(
        &app,
        json!({ "name": "watched", "gitUrl": repo.url(), "autoLoad": false }),
    )
    .await;
    let mut ws = subscribe(
        app.addr,
        "subscription($id: ID!) { providerEvents(id: $id) { status message log { stream line } } }",
        json!({ "id": id }),
    )
    .await;
    // The first event is the status now: from then on the stream is live.
    let first = tokio::time::timeout(Duration::from_secs(10), next_json(&mut ws))
        .await
        .expect("the current status in time")
        .expect("the stream is open");
    assert_eq!(
        first["payload"]["data"]["providerEvents"]["status"],
        "UNLOADED"
    );
    let load = app
        .gql(
            "mutation($id: ID!) { loadProvider(id: $id) { status } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&load)["loadProvider"]["status"], "FETCHING");

    let mut statuses = Vec::new();
    let mut lines = Vec::new();
    while statuses.last().map(String::as_str) != Some("CONNECTED") {
        let message = tokio::time::timeout(Duration::from_secs(60), next_json(&mut ws))
            .await
            .expect("an event in time")
            .expect("the stream stays open");
        let event = &message["payload"]["data"]["providerEvents"];
        if let Some(status) = event["status"].as_str()
            && statuses.last().map(String::as_str) != Some(status)
        {
            statuses.push(status.to_owned());
        }
        if let Some(line) = event["log"]["line"].as_str() {
            lines.push(line.to_owned());
        }
    }
    assert_eq!(
        statuses,
        [
            "FETCHING",
            "BUILDING",
            "STARTING",
            "REGISTERING",
            "CONNECTED"
        ]
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("building the process provider")),
        "{lines:?}"
    );
    app.stop().await;
}

/// A provider that dies after registering is restarted, and its new
/// registration replaces the stale link.
#[tokio::test]
async fn a_crashed_provider_is_restarted_and_its_link_replaced() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, _) = create_provider(&app, json!({ "name": "crashy", "gitUrl": repo.url() })).await;
    wait_status(&app, &id, "CONNECTED").await;
    let first = provider_pid(&app.store, &id);
    // SAFETY: killing the provider process this test started through Corbel.
    assert_eq!(unsafe { libc::kill(first, libc::SIGKILL) }, 0);

    let back = eventually(Duration::from_secs(60), "a restart", || async {
        let p = provider(&app, &id).await;
        (p.restarts == 1 && p.status == "CONNECTED").then_some(p)
    })
    .await;
    assert_eq!(back.restarts, 1);
    let second = provider_pid(&app.store, &id);
    assert_ne!(first, second);
    let answer = nodes(&app, &id).await;
    assert!(data(&answer)["provider"]["nodes"][0]["name"].is_string());
    let log = logs(&app, &id).await;
    assert!(log.contains("killed by SIGKILL"), "{log}");
    app.stop().await;
    gone(second).await;
}

/// A provider that stops answering (frozen with SIGSTOP) fails its health
/// checks, goes `DISCONNECTED`, and is replaced by a new process.
#[tokio::test]
async fn a_frozen_provider_fails_health_checks_and_is_restarted() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |config| {
        quick(config);
        config.provider_call_timeout_ms = 1_000;
        config.provider_stop_grace_ms = 300;
    })
    .await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, _) = create_provider(&app, json!({ "name": "frozen", "gitUrl": repo.url() })).await;
    wait_status(&app, &id, "CONNECTED").await;
    let first = provider_pid(&app.store, &id);
    // SAFETY: freezing the provider process this test started through Corbel.
    assert_eq!(unsafe { libc::kill(first, libc::SIGSTOP) }, 0);
    let back = eventually(Duration::from_secs(60), "a restart", || async {
        let p = provider(&app, &id).await;
        (p.restarts == 1 && p.status == "CONNECTED").then_some(p)
    })
    .await;
    assert_eq!(back.restarts, 1);
    gone(first).await;
    let log = logs(&app, &id).await;
    assert!(log.contains("health check failed"), "{log}");
    app.stop().await;
}

/// A changed ref is fetched into the same source directory at the next load.
#[tokio::test]
async fn an_updated_ref_is_checked_out_at_the_next_load() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let first = repo.head();
    let (id, _) = create_provider(
        &app,
        json!({ "name": "moving", "gitUrl": repo.url(), "ref": "v1" }),
    )
    .await;
    assert_eq!(
        wait_status(&app, &id, "CONNECTED").await.resolved_commit,
        Some(first.clone())
    );
    let second = repo.commit(&process_metadata(), &[("NOTES", "a second commit")]);
    assert_ne!(first, second);
    let body = app
        .gql(
            "mutation($id: ID!) { updateProvider(id: $id, input: {ref: \"main\", name: \"moved\"}) { name ref resolvedCommit } }",
            json!({ "id": id }),
        )
        .await;
    let updated = &data(&body)["updateProvider"];
    assert_eq!(updated["name"], "moved");
    assert_eq!(updated["ref"], "main");
    assert_eq!(
        updated["resolvedCommit"], first,
        "nothing changes until a load"
    );
    for mutation in [
        "mutation($id: ID!) { unloadProvider(id: $id) { status } }",
        "mutation($id: ID!) { loadProvider(id: $id) { status } }",
    ] {
        data(&app.gql(mutation, json!({ "id": id })).await);
    }
    assert_eq!(
        wait_status(&app, &id, "CONNECTED").await.resolved_commit,
        Some(second)
    );
    let src = app.store.data_dir().join("providers").join(&id).join("src");
    assert!(src.join("NOTES").exists());
    app.stop().await;
}

#[tokio::test]
async fn a_provider_loads_over_git_daemon() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let base = repo.bare().parent().unwrap().to_owned();
    let daemon = GitDaemon::start(&base).await;
    let port = daemon.port;
    let (id, _) = create_provider(
        &app,
        json!({ "name": "daemon", "gitUrl": format!("git://127.0.0.1:{port}/provider.git"), "ref": "main" }),
    )
    .await;
    let connected = wait_status(&app, &id, "CONNECTED").await;
    assert_eq!(connected.resolved_commit, Some(repo.head()));
    daemon.stop();
    app.stop().await;
}

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
        config.provider_start_timeout_seconds = 4;
        config.provider_build_timeout_seconds = 1;
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
        message.contains("[1]") && message.contains("[99]"),
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
    let listed = app.gql("{ providers { totalCount } }", json!({})).await;
    assert_eq!(
        data(&listed)["providers"]["totalCount"],
        0,
        "nothing was stored"
    );
    app.stop().await;
}

/// A provider that never answers costs its caller the deadline and a clear
/// error; a configuration it does not take is not stored.
#[tokio::test]
async fn a_hanging_provider_gets_a_deadline() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |config| {
        quick(config);
        config.provider_call_timeout_ms = 1_500;
        // Health checks answer (the fixture hangs only on resource calls).
    })
    .await;
    let repo = ProviderRepo::new(&fixture_metadata("hang"), &[]);
    let (id, _) = create_provider(&app, json!({ "name": "hang", "gitUrl": repo.url() })).await;
    wait_status(&app, &id, "CONNECTED").await;

    let answer = nodes(&app, &id).await;
    assert_eq!(
        error_code(&answer),
        Some("PROVIDER_UNAVAILABLE"),
        "{answer}"
    );
    let message = answer["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("did not answer ListNodes within 1500ms"),
        "{message}"
    );

    let answer = app
        .gql(
            "mutation($id: ID!) { configureProvider(id: $id, config: {hang_configure: true}) { config } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(
        error_code(&answer),
        Some("PROVIDER_UNAVAILABLE"),
        "{answer}"
    );
    assert_eq!(provider(&app, &id).await.config, json!({}));
    app.stop().await;
}

#[tokio::test]
async fn configuration_is_sent_live_and_secrets_stay_hidden() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, _) = create_provider(&app, json!({ "name": "conf", "gitUrl": repo.url() })).await;
    wait_status(&app, &id, "CONNECTED").await;
    let answer = app
        .gql(
            "mutation($id: ID!) { configureProvider(id: $id, config: {capacity: 3}, secretConfig: {apiKey: \"s3cr3t-value\"}) { config secretConfigKeys } }",
            json!({ "id": id }),
        )
        .await;
    let configured = &data(&answer)["configureProvider"];
    assert_eq!(configured["config"], json!({"capacity": 3}));
    assert_eq!(configured["secretConfigKeys"], json!(["apiKey"]));
    assert!(!answer.to_string().contains("s3cr3t-value"));
    let answer = nodes(&app, &id).await;
    assert_eq!(
        data(&answer)["provider"]["nodes"][0]["capacity"]["process.v1.service"],
        3
    );

    // A type the provider refuses is not stored.
    let answer = app
        .gql(
            "mutation($id: ID!) { configureProvider(id: $id, config: {capacity: \"many\"}) { config } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(
        error_code(&answer),
        Some("PROVIDER_UNAVAILABLE"),
        "{answer}"
    );
    assert_eq!(provider(&app, &id).await.config, json!({"capacity": 3}));

    // A rotated token is shown once and differs.
    let rotated = app
        .gql(
            "mutation($id: ID!) { rotateProviderToken(id: $id) { token provider { id } } }",
            json!({ "id": id }),
        )
        .await;
    let token = data(&rotated)["rotateProviderToken"]["token"]
        .as_str()
        .unwrap();
    assert!(token.starts_with("cbp_"));
    app.stop().await;
}

/// A repository read through a provider with the `repository` feature.
#[tokio::test]
async fn a_repository_reads_through_a_provider() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&fixture_metadata("normal"), &[]);
    let manifest = "name: hello\nversion: 1.0.0\nresources:\n  app:\n    type: fixture.v1.noop\n";
    let (id, _) = create_provider(
        &app,
        json!({
            "name": "repo-provider",
            "gitUrl": repo.url(),
            "config": { "elements": [
                { "name": "hello", "version": "1.0.0", "manifest_yaml": manifest },
                { "name": "hello", "version": "1.1.0", "manifest_yaml": manifest.replace("1.0.0", "1.1.0") },
            ] },
        }),
    )
    .await;
    let connected = wait_status(&app, &id, "CONNECTED").await;
    assert!(
        connected.features.contains(&"repository".to_owned()),
        "{connected:?}"
    );
    let created = app
        .gql(
            "mutation($input: CreateRepositoryInput!) { createRepository(input: $input) { id } }",
            json!({ "input": { "name": "via-provider", "driver": { "provider": { "providerId": id } } } }),
        )
        .await;
    let repository = data(&created)["createRepository"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let synced = eventually(Duration::from_secs(30), "the sync", || async {
        let body = app
            .gql(
                "query($id: ID!) { repository(id: $id) { status statusMessage driver { ... on ProviderDriver { kind providerId } } } }",
                json!({ "id": repository }),
            )
            .await;
        let r = data(&body)["repository"].clone();
        (r["status"] == "ACTIVE" || r["status"] == "ERROR").then_some(r)
    })
    .await;
    assert_eq!(synced["status"], "ACTIVE", "{synced}");
    assert_eq!(synced["driver"]["providerId"], id.as_str());
    let body = app
        .gql(
            "{ elements(filter: {name: \"hello\"}) { totalCount edges { node { version manifest } } } }",
            json!({}),
        )
        .await;
    let elements = &data(&body)["elements"];
    assert_eq!(elements["totalCount"], 2, "{body}");
    let manifest = elements["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|e| e["node"]["manifest"].as_object().cloned())
        .expect("a manifest read through GetElement");
    assert_eq!(manifest["resources"]["app"]["type"], "fixture.v1.noop");
    app.stop().await;
}

/// Server restarts load `autoLoad` providers again; a provider never outlives
/// its server, even one killed with SIGKILL.
#[tokio::test]
async fn providers_follow_their_server() {
    let store = Arc::new(TestStore::fresh().await);
    let app = TestApp::spawn_with(store.clone(), quick).await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, _) = create_provider(&app, json!({ "name": "follower", "gitUrl": repo.url() })).await;
    wait_status(&app, &id, "CONNECTED").await;
    let pid = provider_pid(&app.store, &id);
    let store = app.stop().await;
    gone(pid).await;

    // The real binary, killed outright: the provider notices and exits.
    let mut served = serve(
        &store,
        &[
            ("CORBEL_ADMIN_TOKEN", ADMIN_TOKEN),
            ("CORBEL_PROVIDER_HEALTH_INTERVAL_MS", "200"),
        ],
    );
    let client = reqwest::Client::new();
    let url = format!("http://{}/graphql", served.addr);
    eventually(Duration::from_secs(60), "the provider to load again", || async {
        let body: Value = client
            .post(&url)
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"query": "query($id: ID!) { provider(id: $id) { status } }", "variables": {"id": id}}))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (body["data"]["provider"]["status"] == "CONNECTED").then_some(())
    })
    .await;
    let pid = provider_pid(&store, &id);
    assert!(alive(pid));
    served.child.kill().unwrap();
    served.child.wait().unwrap();
    gone(pid).await;
}

#[test]
fn corbel_bin_and_provider_bins_sit_together() {
    let process = workspace_bin("corbel-provider-process");
    assert_eq!(process.parent(), corbel_bin().parent());
}
