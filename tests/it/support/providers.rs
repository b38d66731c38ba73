//! Providers through the API: creating them, reading them, waiting for a
//! status, their log and their nodes.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use super::settings::quick;
use super::types::Provider;
use super::{TestApp, TestStore, data, eventually};

pub const PROVIDER_FIELDS: &str = "id name gitUrl ref status statusMessage resolvedCommit restarts lastSeenAt features resourceTypes config secretConfigKeys metadata { name version runtime features resourceTypes }";

/// A server on a fresh store with [`quick`] timings.
pub async fn spawn_quick() -> TestApp {
    TestApp::spawn_with(Arc::new(TestStore::fresh().await), quick).await
}

/// Creates a provider; returns its id and its token.
pub async fn create_provider(app: &TestApp, input: Value) -> (String, String) {
    let body = app
        .gql(
            &format!(
                "mutation($input: CreateProviderInput!) {{ createProvider(input: $input) {{ token provider {{ {PROVIDER_FIELDS} }} }} }}"
            ),
            json!({ "input": input }),
        )
        .await;
    let created = &data(&body)["createProvider"];
    (
        created["provider"]["id"].as_str().unwrap().to_owned(),
        created["token"].as_str().unwrap().to_owned(),
    )
}

pub async fn provider(app: &TestApp, id: &str) -> Provider {
    let shown = provider_json(app, id).await;
    Provider::deserialize(&shown).unwrap_or_else(|e| panic!("{shown}: {e}"))
}

/// The provider as the server sent it (every field of [`provider`]).
pub async fn provider_json(app: &TestApp, id: &str) -> Value {
    let body = app
        .gql(
            &format!("query($id: ID!) {{ provider(id: $id) {{ {PROVIDER_FIELDS} }} }}"),
            json!({ "id": id }),
        )
        .await;
    data(&body)["provider"].clone()
}

/// Waits for `status`; a provider that fails on the way fails the test with
/// its message.
pub async fn wait_status(app: &TestApp, id: &str, status: &str) -> Provider {
    eventually(Duration::from_secs(60), status, || async {
        let p = provider(app, id).await;
        if p.status == "FAILED" && status != "FAILED" {
            panic!("provider failed: {:?}", p.status_message);
        }
        (p.status == status).then_some(p)
    })
    .await
}

/// The provider's last 500 log lines, each as `[stream] line`.
pub async fn logs(app: &TestApp, id: &str) -> String {
    let body = app
        .gql(
            "query($id: ID!) { provider(id: $id) { logs(last: 500) { stream line } } }",
            json!({ "id": id }),
        )
        .await;
    data(&body)["provider"]["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            format!(
                "[{}] {}",
                l["stream"].as_str().unwrap(),
                l["line"].as_str().unwrap()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The whole answer (errors included) to the provider's nodes.
pub async fn nodes(app: &TestApp, id: &str) -> Value {
    app.gql(
        "query($id: ID!) { provider(id: $id) { nodes { name capacity used labels } } }",
        json!({ "id": id }),
    )
    .await
}

/// A connection straight to the test's database, past the server.
async fn raw_db(store: &TestStore) -> sea_orm::DatabaseConnection {
    let url = match &store.database_url {
        Some(url) => url.clone(),
        None => format!("sqlite://{}", store.data_dir().join("corbel.db").display()),
    };
    sea_orm::Database::connect(&url)
        .await
        .expect("the test database")
}

/// Column `column` of the row of `table` named `name`, as stored.
pub async fn raw_column(store: &TestStore, table: &str, column: &str, name: &str) -> String {
    use sea_orm::{ConnectionTrait, Statement};
    let db = raw_db(store).await;
    let backend = db.get_database_backend();
    let placeholder = match backend {
        sea_orm::DatabaseBackend::Postgres => "$1",
        _ => "?",
    };
    let sql = format!("SELECT {column} FROM {table} WHERE name = {placeholder}");
    let row = db
        .query_one_raw(Statement::from_sql_and_values(backend, sql, [name.into()]))
        .await
        .unwrap_or_else(|e| panic!("the {table} table: {e}"))
        .unwrap_or_else(|| panic!("no row of {table} named {name}"));
    db.close().await.ok();
    row.try_get("", column).expect(column)
}

/// Writes column `column` of the row of `table` named `name` directly, as an
/// earlier version stored it (a server must not be running on the store).
pub async fn set_raw_column(store: &TestStore, table: &str, column: &str, name: &str, value: &str) {
    use sea_orm::{ConnectionTrait, Statement};
    let db = raw_db(store).await;
    let backend = db.get_database_backend();
    let (first, second) = match backend {
        sea_orm::DatabaseBackend::Postgres => ("$1", "$2"),
        _ => ("?", "?"),
    };
    let sql = format!("UPDATE {table} SET {column} = {first} WHERE name = {second}");
    let done = db
        .execute_raw(Statement::from_sql_and_values(
            backend,
            sql,
            [value.into(), name.into()],
        ))
        .await
        .expect("the update");
    assert_eq!(done.rows_affected(), 1, "{table} {name}");
    db.close().await.ok();
}

/// The `secret_config` column of provider `name`, as stored.
pub async fn raw_secret_config(store: &TestStore, name: &str) -> String {
    raw_column(store, "providers", "secret_config", name).await
}

/// Writes provider `name`'s `secret_config` column directly (a server must
/// not be running on the store).
pub async fn set_raw_secret_config(store: &TestStore, name: &str, value: &str) {
    set_raw_column(store, "providers", "secret_config", name, value).await
}
