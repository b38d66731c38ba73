//! Databases made by a released server, and what the next server does with
//! them. `tests/it/fixtures/release-11.{sqlite,postgres}.sql` are the SQL
//! dumps of what `make_release_fixture` (ignored; run by hand) left, run by
//! the release of migration 11 (commit 8312c53): the schema as its
//! migrations made it and the rows as its server wrote them through the
//! API, on each database. Each test loads the dump of the database it runs
//! on.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use migration::m20261206_000012_state_texts::{COLUMNS, Id};
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query};
use sea_orm::{ConnectionTrait, Statement};
use serde_json::{Value, json};

use crate::providers::protocol::loaded;
use crate::support::deployments::{create_blueprint, deploy, settled};
use crate::support::providers::spawn_quick;
use crate::support::repositories::{create_id, mutate, settled as repository_settled};
use crate::support::{TestApp, TestStore, data, error_code, eventually};

/// Two fixture resources, one reading the other's output.
const BLUEPRINT: &str = r#"
version: "1"
variables:
  label: { type: string, default: a }
resources:
  base:
    type: fixture.v1.noop
    config: { label: "{{ label }}", size: 1 }
  dep:
    type: fixture.v1.noop
    depends_on: [base]
    config: { label: "{{ resources.base.outputs.label }}" }
"#;

/// Uploads an element to the repository; returns its id.
async fn upload(app: &TestApp, repository: &str, name: &str, resources: &str) -> String {
    let manifest = format!("name: {name}\nversion: 1.0.0\nresources: {resources}\n");
    let body = app
        .gql(
            "mutation($r: ID!, $m: String!) { uploadElement(repositoryId: $r, manifest: $m) { id } }",
            json!({"r": repository, "m": manifest}),
        )
        .await;
    data(&body)["uploadElement"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn install(app: &TestApp, element: &str) -> serde_json::Value {
    mutate(
        app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": element}),
    )
    .await
}

async fn plan(app: &TestApp, deployment: &str, label: &str) -> String {
    let body = app
        .gql(
            "mutation($input: PlanDeploymentInput!) { planDeployment(input: $input) { id } }",
            json!({"input": {"deploymentId": deployment, "variables": {"label": label}}}),
        )
        .await;
    data(&body)["planDeployment"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Makes a release's fixture: a server of this code, through its API, leaves
/// rows in every state column it can reach without faults (a repository,
/// elements new, installed and failed, a connected provider, deployments
/// complete, destroyed and failed with their nodes and events, plans applied
/// and pending); then the database is dumped as SQL into
/// `$CORBEL_FIXTURE_OUT/release-<n>.<sqlite|postgres>.sql`. Run once on
/// SQLite and once with `CORBEL_TEST_POSTGRES_URL`.
#[tokio::test]
#[ignore = "run by hand at a release: makes the fixture of its database"]
async fn make_release_fixture() {
    let out = PathBuf::from(std::env::var("CORBEL_FIXTURE_OUT").expect("CORBEL_FIXTURE_OUT"));
    let release = std::env::var("CORBEL_FIXTURE_RELEASE").expect("CORBEL_FIXTURE_RELEASE");
    let app = spawn_quick().await;
    let dir = tempfile::tempdir().unwrap();
    let (_provider, _repo) = loaded(&app, "", &dir.path().join("calls.jsonl")).await;

    let repository = create_id(
        &app,
        json!({"name": "uploads", "driver": {"migration": {}}}),
    )
    .await;
    repository_settled(&app, &repository, "ACTIVE").await;
    let installed = upload(&app, &repository, "installed", "{}").await;
    upload(&app, &repository, "new", "{}").await;
    let broken = upload(&app, &repository, "broken", "{r: {type: x}}").await;
    data(&install(&app, &installed).await);
    let refused = install(&app, &broken).await;
    assert_eq!(error_code(&refused), Some("DEPLOYMENT_FAILED"), "{refused}");

    let blueprint = create_blueprint(&app, "pair", BLUEPRINT).await;
    let kept = deploy(&app, &blueprint, "kept", json!({})).await;
    assert_eq!(
        settled(&app, &kept, &["COMPLETE", "FAILED"]).await.state,
        "COMPLETE"
    );
    let applied = plan(&app, &kept, "b").await;
    data(
        &app.gql(
            "mutation($id: ID!) { applyPlan(id: $id) { id } }",
            json!({"id": applied}),
        )
        .await,
    );
    assert_eq!(
        settled(&app, &kept, &["COMPLETE", "FAILED"]).await.state,
        "COMPLETE"
    );
    plan(&app, &kept, "c").await;
    let gone = deploy(&app, &blueprint, "gone", json!({})).await;
    assert_eq!(
        settled(&app, &gone, &["COMPLETE", "FAILED"]).await.state,
        "COMPLETE"
    );
    data(
        &app.gql(
            "mutation($id: ID!) { destroyDeployment(id: $id) { id } }",
            json!({"id": gone}),
        )
        .await,
    );
    settled(&app, &gone, &["DESTROYED"]).await;

    let store = app.stop().await;
    // The provider's `secretConfig` was sealed with this run's throwaway
    // key, which no later server has: the fixture holds it as a release
    // before sealing stored it (plain `{}`), which a server seals at start.
    let unseal = "UPDATE providers SET secret_config = '{}'";
    let unsealed = match &store.database_url {
        None => std::process::Command::new("sqlite3")
            .args(["-cmd", ".timeout 10000"])
            .arg(store.data_dir().join("corbel.db"))
            .arg(unseal)
            .status(),
        Some(url) => std::process::Command::new("psql")
            .args([url.as_str(), "-c", unseal])
            .status(),
    };
    assert!(unsealed.unwrap().success());
    let (kind, dump) = match &store.database_url {
        None => (
            "sqlite",
            std::process::Command::new("sqlite3")
                .arg(store.data_dir().join("corbel.db"))
                .arg(".dump")
                .output()
                .unwrap(),
        ),
        Some(url) => (
            "postgres",
            std::process::Command::new("pg_dump")
                .args(["--inserts", "--no-owner", "--no-privileges", url])
                .output()
                .unwrap(),
        ),
    };
    assert!(dump.status.success(), "{dump:?}");
    std::fs::write(
        out.join(format!("release-{release}.{kind}.sql")),
        dump.stdout,
    )
    .unwrap();
}

/// Loads the release of migration 11's database into the store, as that
/// release left it.
async fn load_release_11(store: &TestStore) {
    match &store.database_url {
        None => {
            let path = store.data_dir().join("corbel.db");
            rusqlite::Connection::open(path)
                .unwrap()
                .execute_batch(include_str!("fixtures/release-11.sqlite.sql"))
                .unwrap();
        }
        Some(url) => {
            // psql's own commands (`\restrict`) are not SQL.
            let dump: Vec<&str> = include_str!("fixtures/release-11.postgres.sql")
                .lines()
                .filter(|line| !line.starts_with('\\'))
                .collect();
            // A pool of its own: the dump empties its session's search path.
            let db = sea_orm::Database::connect(url.as_str()).await.unwrap();
            db.execute_unprepared(&dump.join("\n")).await.unwrap();
            db.close().await.unwrap();
        }
    }
}

async fn connect(store: &TestStore) -> corbel::store::Db {
    corbel::store::connect(&store.config().database().unwrap())
        .await
        .unwrap()
}

/// `table.column` → row id → the text it holds.
type Texts = BTreeMap<String, BTreeMap<String, Option<String>>>;

/// Every state column's rows, read as text.
async fn stored_texts(db: &corbel::store::Db) -> Texts {
    let mut texts = Texts::new();
    for column in &COLUMNS {
        let sql = format!("SELECT id, {} AS text FROM {}", column.column, column.table);
        let rows = db
            .query_all_raw(Statement::from_string(db.get_database_backend(), sql))
            .await
            .unwrap();
        let rows = rows.iter().map(|row| {
            let id = match column.id {
                Id::Uuid => row.try_get::<uuid::Uuid>("", "id").unwrap().to_string(),
                Id::Integer => row.try_get::<i64>("", "id").unwrap().to_string(),
            };
            (id, row.try_get::<Option<String>>("", "text").unwrap())
        });
        texts.insert(
            format!("{}.{}", column.table, column.column),
            rows.collect(),
        );
    }
    texts
}

/// The state of each of `stored`'s rows, as the API serves it.
async fn served_texts(app: &TestApp, stored: &Texts) -> Texts {
    let mut served = Texts::new();
    let mut put = |column: &str, id: &Value, text: &Value| {
        served.entry(column.to_owned()).or_default().insert(
            id.as_str().unwrap().to_owned(),
            text.as_str().map(str::to_owned),
        );
    };
    let one = |field: &'static str, selection: &'static str| {
        move |id: String| async move {
            let query = format!("query($id: ID!) {{ {field}(id: $id) {{ id {selection} }} }}");
            data(&app.gql(&query, json!({ "id": id })).await)[field].clone()
        }
    };
    for (column, field, selection) in [
        ("repositories.status", "repository", "status"),
        ("elements.status", "element", "status"),
        ("providers.status", "provider", "status"),
        ("deployment_plans.state", "plan", "state"),
    ] {
        for id in stored[column].keys() {
            let item = one(field, selection)(id.clone()).await;
            put(column, &item["id"], &item[selection]);
        }
    }
    for id in stored["deployments.state"].keys() {
        let selection = "state nodes { id state } events(first: 1000) { id state }";
        let deployment = one("deployment", selection)(id.clone()).await;
        put("deployments.state", &deployment["id"], &deployment["state"]);
        for node in deployment["nodes"].as_array().unwrap() {
            put("deployment_nodes.state", &node["id"], &node["state"]);
        }
        for event in deployment["events"].as_array().unwrap() {
            put("deployment_events.state", &event["id"], &event["state"]);
        }
    }
    served
}

/// The next server migrates a database of the release of migration 11,
/// changes none of its state texts, and serves every one of them as it is
/// stored; a text that names no state, written after, fails the read that
/// meets it, naming the text.
#[tokio::test]
async fn a_database_of_the_last_release_migrates_and_reads_every_state_back() {
    let store = Arc::new(TestStore::fresh().await);
    load_release_11(&store).await;
    let db = connect(&store).await;
    // Its repository's refresh fell due an hour after the fixture was made,
    // and a refresh of a `migration` repository (no inventory) removes its
    // uploaded elements that are not installed: put it off, so this test
    // reads what the release left, whenever it runs.
    db.execute(
        &Query::update()
            .table(Alias::new("repositories"))
            .value(
                Alias::new("next_refresh_at"),
                chrono::Utc::now() + chrono::Duration::days(1),
            )
            .to_owned(),
    )
    .await
    .unwrap();
    let before = stored_texts(&db).await;
    for (column, rows) in &before {
        assert!(!rows.is_empty(), "the fixture has no {column}");
    }
    assert!(
        before["deployment_events.state"]
            .values()
            .any(Option::is_none)
    );
    db.close().await.unwrap();

    let app = TestApp::spawn_on(store.clone()).await;
    // Its provider's repository is gone: it is loaded, and fails, at start.
    let (served, after) = eventually(Duration::from_secs(30), "the provider settles", || async {
        let db = connect(&store).await;
        let after = stored_texts(&db).await;
        db.close().await.unwrap();
        let served = served_texts(&app, &after).await;
        (served == after).then_some((served, after))
    })
    .await;
    // No stored text changed (the provider's status is its new life's; a
    // running server may add events).
    for (column, rows) in &before {
        if column == "providers.status" {
            continue;
        }
        for (id, text) in rows {
            assert_eq!(after[column].get(id), Some(text), "{column} of row {id}");
        }
    }
    assert_eq!(served, after);
    let store = app.stop().await;

    let db = connect(&store).await;
    let (node, deployment): (uuid::Uuid, uuid::Uuid) = db
        .query_one(
            &Query::select()
                .columns([Alias::new("id"), Alias::new("deployment_id")])
                .from(Alias::new("deployment_nodes"))
                .limit(1)
                .to_owned(),
        )
        .await
        .unwrap()
        .map(|row| {
            (
                row.try_get("", "id").unwrap(),
                row.try_get("", "deployment_id").unwrap(),
            )
        })
        .unwrap();
    db.execute(
        &Query::update()
            .table(Alias::new("deployment_nodes"))
            .value(Alias::new("state"), "LOST")
            .and_where(Expr::col(Alias::new("id")).eq(node))
            .to_owned(),
    )
    .await
    .unwrap();
    let refused = corbel::store::deployments::nodes_of(&db, deployment)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("NodeState") && refused.contains("LOST"),
        "{refused}"
    );
}

/// Sets `table.state` of row `id` to `text`.
async fn set_state(db: &corbel::store::Db, table: &str, id: sea_orm::Value, text: &str) {
    db.execute(
        &Query::update()
            .table(Alias::new(table))
            .value(Alias::new("state"), text)
            .and_where(Expr::col(Alias::new("id")).eq(id))
            .to_owned(),
    )
    .await
    .unwrap();
}

/// A row of the last release holding a state this release does not know
/// stops the migration, and so the server's start, naming table, column,
/// row and text; the migration runs again at the next start, until every
/// row reads.
#[tokio::test]
async fn a_state_this_release_does_not_know_is_named_and_the_server_does_not_start() {
    let store = Arc::new(TestStore::fresh().await);
    load_release_11(&store).await;
    let db = connect(&store).await;
    let texts = stored_texts(&db).await;
    let (node, node_state) = texts["deployment_nodes.state"].iter().next().unwrap();
    let node: uuid::Uuid = node.parse().unwrap();
    let (event, event_state) = texts["deployment_events.state"]
        .iter()
        .find(|(_, text)| text.is_some())
        .unwrap();
    let event: i64 = event.parse().unwrap();
    set_state(&db, "deployment_nodes", node.into(), "LOST").await;
    set_state(&db, "deployment_events", event.into(), "gone").await;
    db.close().await.unwrap();

    let start = || async { corbel::app::App::build(&store.config()).await.err() };
    let refused = format!("{:#}", start().await.expect("the start is refused"));
    assert!(refused.contains("2 row(s) hold a state"), "{refused}");
    assert!(
        refused.contains(&format!("deployment_nodes.state of row {node}: `LOST`")),
        "{refused}"
    );
    assert!(
        refused.contains(&format!("deployment_events.state of row {event}: `gone`")),
        "{refused}"
    );

    let db = connect(&store).await;
    set_state(
        &db,
        "deployment_nodes",
        node.into(),
        node_state.as_deref().unwrap(),
    )
    .await;
    db.close().await.unwrap();
    let refused = format!("{:#}", start().await.expect("still refused"));
    assert!(refused.contains("1 row(s) hold a state"), "{refused}");
    assert!(!refused.contains("deployment_nodes"), "{refused}");

    let db = connect(&store).await;
    set_state(
        &db,
        "deployment_events",
        event.into(),
        event_state.as_deref().unwrap(),
    )
    .await;
    db.close().await.unwrap();
    let app = TestApp::spawn_on(store.clone()).await;
    let body = app
        .gql("{ deployments { nodes { state } } }", json!({}))
        .await;
    assert!(
        !data(&body)["deployments"]["nodes"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    app.stop().await;
}

/// What the migration lets through, the server reads: each text it accepts
/// in a column is a state of that column's enum.
#[test]
fn every_text_the_migration_accepts_is_a_state() {
    use corbel::store::states::*;
    for column in &COLUMNS {
        for text in column.texts {
            let known = match (column.table, column.column) {
                ("repositories", "status") => text.parse::<RepositoryStatus>().is_ok(),
                ("elements", "status") => text.parse::<ElementStatus>().is_ok(),
                ("providers", "status") => text.parse::<ProviderStatus>().is_ok(),
                ("deployments", "state") => text.parse::<DeploymentState>().is_ok(),
                ("deployment_nodes", "state") => text.parse::<NodeState>().is_ok(),
                ("deployment_plans", "state") => text.parse::<PlanState>().is_ok(),
                ("deployment_events", "state") => text.parse::<EventState>().is_ok(),
                other => panic!("a state column with no enum: {other:?}"),
            };
            assert!(known, "{}.{}: `{text}`", column.table, column.column);
        }
    }
}
