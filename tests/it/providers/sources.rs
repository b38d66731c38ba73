//! Where a provider's code comes from: a changed ref, and `git daemon`.

use serde_json::json;

use crate::support::data;
use crate::support::git::GitDaemon;
use crate::support::provider_repos::{ProviderRepo, process_metadata};
use crate::support::providers::{create_provider, spawn_quick, wait_status};

/// A changed ref is fetched into the same source directory at the next load,
/// and built into a build directory of its own commit: the first commit's
/// build is left as it was.
#[tokio::test]
async fn an_updated_ref_is_checked_out_at_the_next_load() {
    let app = spawn_quick().await;
    let metadata = process_metadata().replace(
        "echo building the process provider",
        "git rev-parse HEAD >> \"$CORBEL_BUILD_DIR/built\"",
    );
    let repo = ProviderRepo::new(&metadata, &[]);
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
    let second = repo.commit(&metadata, &[("NOTES", "a second commit")]);
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
        Some(second.clone())
    );
    let dir = app.store.data_dir().join("providers").join(&id);
    assert!(dir.join("src").join("NOTES").exists());
    for commit in [&first, &second] {
        let built = std::fs::read_to_string(dir.join("builds").join(commit).join("built"))
            .unwrap_or_else(|e| panic!("commit {commit}'s build directory: {e}"));
        assert_eq!(built.trim(), commit.as_str(), "built once, there, from it");
    }
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

/// A monorepo: the provider is in a subdirectory, named by `path`; its build
/// and run commands run there.
#[tokio::test]
async fn a_provider_loads_from_a_subdirectory() {
    let app = spawn_quick().await;
    let metadata = process_metadata().replace(
        "echo building the process provider",
        "test -f HERE && echo building in the subdirectory",
    );
    let repo = ProviderRepo::with_files(&[
        ("README", "a monorepo"),
        ("providers/process/corbel-provider.yaml", &metadata),
        ("providers/process/HERE", ""),
    ]);

    // Without `path`, the message speaks of the repository and points at it.
    let (id, _) = create_provider(
        &app,
        json!({ "name": "rooted", "gitUrl": repo.url(), "autoLoad": true }),
    )
    .await;
    let failed = wait_status(&app, &id, "FAILED").await;
    let message = failed.status_message.unwrap_or_default();
    assert!(
        message.contains(&format!(
            "corbel-provider.yaml not found at the root of {}",
            repo.url()
        )) && message.contains("`providers/process`")
            && message.contains("set the provider's `path`")
            && !message.contains(&app.store.data_dir().display().to_string()),
        "{message}"
    );

    let (id, _) = create_provider(
        &app,
        json!({ "name": "nested", "gitUrl": repo.url(), "path": "./providers/process/" }),
    )
    .await;
    let connected = wait_status(&app, &id, "CONNECTED").await;
    assert_eq!(connected.resolved_commit, Some(repo.head()));
    let body = app
        .gql(
            "query($id: ID!) { provider(id: $id) { path } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&body)["provider"]["path"], "providers/process");
    assert!(
        crate::support::providers::logs(&app, &id)
            .await
            .contains("building in the subdirectory")
    );
    app.stop().await;
}

#[tokio::test]
async fn bad_paths_and_missing_local_sources_are_named() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    for (path, expected) in [
        ("../elsewhere", "must stay inside the repository"),
        ("/etc", "must be relative to the repository's root"),
        ("a\u{7}b", "contains a control character"),
    ] {
        let body = app
            .gql(
                "mutation($input: CreateProviderInput!) { createProvider(input: $input) { token } }",
                json!({ "input": { "name": "bad", "gitUrl": repo.url(), "path": path } }),
            )
            .await;
        let message = body["errors"][0]["message"].as_str().unwrap_or_default();
        assert_eq!(
            crate::support::error_code(&body),
            Some("VALIDATION"),
            "{body}"
        );
        assert!(
            message.contains("path: ") && message.contains(expected),
            "{message}"
        );
    }
    let missing = "/nonexistent/corbel/provider";
    let body = app
        .gql(
            "mutation($input: CreateProviderInput!) { createProvider(input: $input) { token } }",
            json!({ "input": { "name": "nowhere", "gitUrl": missing } }),
        )
        .await;
    let message = body["errors"][0]["message"].as_str().unwrap_or_default();
    assert_eq!(
        crate::support::error_code(&body),
        Some("VALIDATION"),
        "{body}"
    );
    assert!(
        message.contains(&format!(
            "no git repository at `{missing}`: it does not exist"
        )),
        "{message}"
    );

    // A subdirectory that is not in the repository fails the load, named.
    let (id, _) = create_provider(
        &app,
        json!({ "name": "nodir", "gitUrl": repo.url(), "path": "not/here" }),
    )
    .await;
    let failed = wait_status(&app, &id, "FAILED").await;
    assert!(
        failed
            .status_message
            .as_deref()
            .unwrap_or_default()
            .contains("path `not/here` does not exist in the repository"),
        "{:?}",
        failed.status_message
    );
    app.stop().await;
}
