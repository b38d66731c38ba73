//! serverInfo, readiness, metrics, the web UI and GraphiQL, restarts.

use std::sync::Arc;

use serde_json::json;

use crate::support::{TestApp, TestStore, data};

#[tokio::test]
async fn server_info_is_public_and_names_the_store() {
    let app = TestApp::spawn().await;
    let body = app
        .gql_as(
            None,
            "{ serverInfo { version instanceId database startedAt } }",
            json!({}),
        )
        .await;
    let info = &data(&body)["serverInfo"];
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
    let expected_db = if app.store.is_postgres() {
        "postgres"
    } else {
        "sqlite"
    };
    assert_eq!(info["database"], expected_db);
    let id = info["instanceId"].as_str().unwrap();
    assert_eq!(id.len(), 64, "a SHA-256 in hex: {id}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(chrono::DateTime::parse_from_rfc3339(info["startedAt"].as_str().unwrap()).is_ok());

    // Another store is another instance.
    let other = TestApp::spawn().await;
    let other_body = other
        .gql_as(None, "{ serverInfo { instanceId } }", json!({}))
        .await;
    assert_ne!(
        data(&other_body)["serverInfo"]["instanceId"],
        info["instanceId"]
    );
}

#[tokio::test]
async fn servers_on_one_store_share_the_instance_id() {
    // One at a time: a store has one server (see `lock.rs`); replicas later.
    let store = Arc::new(TestStore::fresh().await);
    let first = TestApp::spawn_on(store.clone()).await;
    let query = "{ serverInfo { instanceId } }";
    let a = first.gql_as(None, query, json!({})).await;
    let store = first.stop().await;
    let second = TestApp::spawn_on(store).await;
    let b = second.gql_as(None, query, json!({})).await;
    assert_eq!(
        data(&a)["serverInfo"]["instanceId"],
        data(&b)["serverInfo"]["instanceId"]
    );
}

#[tokio::test]
async fn readiness_follows_the_store() {
    let app = TestApp::spawn().await;
    let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let alive = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(alive.status(), 200);

    // Make the store look unmigrated behind the server's back.
    let config = app.store.config();
    let db = corbel::store::connect(&config.database().unwrap())
        .await
        .unwrap();
    use sea_orm::ConnectionTrait;
    db.execute_unprepared("DELETE FROM seaql_migrations")
        .await
        .unwrap();
    let not_ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(not_ready.status(), 503);
    let reason = not_ready.text().await.unwrap();
    assert!(reason.contains("pending migrations"), "{reason}");
    assert!(
        reason.contains("m20261130_000001_users_and_tokens"),
        "{reason}"
    );
}

#[tokio::test]
async fn metrics_count_requests_by_operation_and_outcome() {
    let app = TestApp::spawn().await;
    data(
        &app.gql("query MetricsProbeOk { serverInfo { version } }", json!({}))
            .await,
    );
    let failed = app
        .gql("query MetricsProbeBad { serverInfo { nope } }", json!({}))
        .await;
    assert!(failed.get("errors").is_some());

    let text = app.metrics().await;
    assert!(
        text.contains(
            r#"corbel_graphql_requests_total{operation="MetricsProbeOk",outcome="ok"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"corbel_graphql_requests_total{operation="MetricsProbeBad",outcome="error"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"corbel_graphql_request_duration_seconds_bucket{operation="MetricsProbeOk",le="+Inf"} 1"#),
        "{text}"
    );
    assert!(text.contains(&format!(
        r#"corbel_build_info{{version="{}"}} 1"#,
        env!("CARGO_PKG_VERSION")
    )));
}

/// Operation names come from clients: past `OPERATION_SERIES` names, the
/// rest share one series, so made-up names cannot grow `/metrics` (and the
/// server's memory) without end.
#[tokio::test]
async fn operation_names_past_the_bound_share_one_series() {
    use corbel::telemetry::OPERATION_SERIES;
    let app = TestApp::spawn().await;
    let extra = 5;
    for i in 0..OPERATION_SERIES + extra {
        let query = format!("query Made{i} {{ serverInfo {{ version }} }}");
        data(&app.gql(&query, json!({})).await);
    }
    let text = app.metrics().await;
    let labelled: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| l.starts_with("corbel_graphql_requests_total{"))
        .filter_map(|l| l.split("operation=\"").nth(1)?.split('"').next())
        .collect();
    assert!(
        labelled.len() <= OPERATION_SERIES + 1,
        "{} operation labels: {labelled:?}",
        labelled.len()
    );
    assert!(labelled.contains("Made0"), "{labelled:?}");
    let last = format!("Made{}", OPERATION_SERIES + extra - 1);
    assert!(!labelled.contains(last.as_str()), "{labelled:?}");
    let other: u64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix(r#"corbel_graphql_requests_total{operation="other",outcome="ok"} "#)
        })
        .unwrap_or_else(|| panic!("an `other` series: {text}"))
        .parse()
        .unwrap();
    assert!(other >= extra as u64, "{other}");
}

#[tokio::test]
async fn the_web_ui_and_graphiql_are_served() {
    let app = TestApp::spawn().await;
    let index = app.client.get(app.url("/")).send().await.unwrap();
    assert_eq!(index.status(), 200);
    assert!(
        index.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let html = index.text().await.unwrap();
    assert!(html.contains("/ui/js/app.js"), "{html}");

    let script = app
        .client
        .get(app.url("/ui/js/app.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(script.status(), 200);
    assert!(
        script.headers()["content-type"]
            .to_str()
            .unwrap()
            .contains("javascript")
    );
    assert!(script.text().await.unwrap().contains("/sign-in"));
    let missing = app.client.get(app.url("/ui/nope.js")).send().await.unwrap();
    assert_eq!(missing.status(), 404);

    let graphiql = app.client.get(app.url("/graphql")).send().await.unwrap();
    assert_eq!(graphiql.status(), 200);
    let page = graphiql.text().await.unwrap();
    assert!(
        page.contains("/ui/vendor/graphiql/graphiql.min.js"),
        "{page}"
    );
    assert!(page.contains("/ui/js/graphiql-init.js"), "{page}");
    let init = app
        .client
        .get(app.url("/ui/js/graphiql-init.js"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        init.contains("/graphql/ws"),
        "GraphiQL is set up for subscriptions"
    );
}

#[tokio::test]
async fn data_survives_a_restart() {
    let app = TestApp::spawn().await;
    let made = app
        .gql(
            "mutation { createApiToken(name: \"survivor\") { token } }",
            json!({}),
        )
        .await;
    let token = data(&made)["createApiToken"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let store = app.stop().await;

    let again = TestApp::spawn_on(store).await;
    let me = again
        .gql_as(
            Some(&token),
            "{ me { username apiTokens { edges { node { name } } } } }",
            json!({}),
        )
        .await;
    let me = &data(&me)["me"];
    assert_eq!(me["username"], "admin");
    let names: Vec<&str> = me["apiTokens"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["node"]["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"survivor"), "{names:?}");
    // Still one admin: a restart does not bootstrap again.
    assert_eq!(
        names.iter().filter(|n| **n == "CORBEL_ADMIN_TOKEN").count(),
        1,
        "{names:?}"
    );
}

/// The SQLite file is in WAL mode: what the store's `synchronous = NORMAL`
/// needs to be safe, and what lets readers go on while a writer commits. The
/// mode is a property of the file, so a connection that asks for nothing
/// reads it back.
#[tokio::test]
async fn the_sqlite_store_is_written_ahead() {
    let app = TestApp::spawn().await;
    let corbel::store::DatabaseLocation::Sqlite(path) = app.store.config().database().unwrap()
    else {
        assert!(
            app.store.is_postgres(),
            "a store neither SQLite nor PostgreSQL"
        );
        return;
    };
    use sea_orm::{ConnectionTrait, Statement};
    let plain = sea_orm::Database::connect(format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let row = plain
        .query_one_raw(Statement::from_string(
            plain.get_database_backend(),
            "PRAGMA journal_mode",
        ))
        .await
        .unwrap()
        .expect("a row");
    let mode: String = row.try_get_by_index(0).unwrap();
    assert_eq!(mode, "wal");
}
