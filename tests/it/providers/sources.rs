//! Where a provider's code comes from: a changed ref, and `git daemon`.

use serde_json::json;

use crate::support::data;
use crate::support::git::GitDaemon;
use crate::support::provider_repos::{ProviderRepo, process_metadata};
use crate::support::providers::{create_provider, spawn_quick, wait_status};

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
