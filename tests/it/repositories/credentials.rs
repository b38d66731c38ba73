//! A repository's credentials at rest: sealed with the server's key, never
//! in the database in the clear, shown redacted, and sealed at start when an
//! earlier version stored them in the clear.

use std::sync::Arc;

use serde_json::json;

use crate::support::nginx::Nginx;
use crate::support::providers::{raw_column, set_raw_column};
use crate::support::repositories::{create_id, put_element, refresh, settled, write_inventory};
use crate::support::{TestApp, TestStore, data};

/// The `driver_spec` column of repository `name`, as stored.
pub(crate) async fn raw_spec(store: &TestStore, name: &str) -> String {
    raw_column(store, "repositories", "driver_spec", name).await
}

async fn shown_url(app: &TestApp, id: &str) -> String {
    let body = app
        .gql(
            "query($id: ID!) { repository(id: $id) { driver { ... on HttpDriver { url } } } }",
            json!({ "id": id }),
        )
        .await;
    data(&body)["repository"]["driver"]["url"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn credentials_are_sealed_at_rest_shown_redacted_and_still_used() {
    let served = tempfile::tempdir().unwrap();
    let core = put_element(served.path(), "core", "1.0.0", json!({}), &[]);
    write_inventory(served.path(), &[core]);
    let nginx = Nginx::start(served.path());
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |_| {}).await;
    let port = nginx.url().rsplit(':').next().unwrap().to_owned();
    let secret_url = format!("http://reader:pa55word@127.0.0.1:{port}/?access_token=t0ken");
    let id = create_id(
        &app,
        json!({"name": "private", "driver": {"http": {"url": secret_url}}}),
    )
    .await;
    let public = create_id(
        &app,
        json!({"name": "public", "driver": {"http": {"url": nginx.url()}}}),
    )
    .await;
    settled(&app, &id, "ACTIVE").await;
    settled(&app, &public, "ACTIVE").await;

    let stored = raw_spec(&app.store, "private").await;
    assert!(stored.starts_with("sealed:v1:"), "{stored}");
    for secret in ["pa55word", "t0ken", "reader"] {
        assert!(!stored.contains(secret), "{stored}");
    }
    // Nothing to hide: stored as it is.
    assert!(raw_spec(&app.store, "public").await.contains(&nginx.url()));
    let shown = shown_url(&app, &id).await;
    assert!(
        !shown.contains("pa55word") && !shown.contains("t0ken"),
        "{shown}"
    );
    assert!(shown.contains(&format!("127.0.0.1:{port}")), "{shown}");

    // Stored in the clear by an earlier version: sealed at the next start,
    // and the repository still syncs with its credentials.
    let store = app.stop().await;
    let clear = json!({"kind": "http", "url": secret_url}).to_string();
    set_raw_column(&store, "repositories", "driver_spec", "private", &clear).await;
    let app = TestApp::spawn_with(store, |_| {}).await;
    let resealed = raw_spec(&app.store, "private").await;
    assert!(
        resealed.starts_with("sealed:v1:") && !resealed.contains("t0ken"),
        "{resealed}"
    );
    let repo = refresh(&app, &id).await;
    assert_ne!(repo.status, "ERROR", "{repo:?}");
    settled(&app, &id, "ACTIVE").await;
    let store = app.stop().await;

    // A second start changes nothing.
    let app = TestApp::spawn_with(store, |_| {}).await;
    assert_eq!(raw_spec(&app.store, "private").await, resealed);
    app.stop().await;
}
