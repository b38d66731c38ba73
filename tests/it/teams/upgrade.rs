//! A database of the release before projects, moved into projects at the
//! next start.

use serde_json::json;

use super::ONE_SERVICE;
use crate::support::{TestApp, data};

/// A database of the release before projects (the schema of its seven
/// migrations, with rows as it wrote them) moves into projects at the next
/// start: its blueprint and deployment into `default`, owned by `admin`, its
/// element installation into `platform`; nothing is lost.
#[tokio::test]
async fn a_database_of_the_release_before_projects_moves_into_default() {
    use migration::MigratorTrait;
    use sea_orm::ConnectionTrait;
    use sea_orm::sea_query::{Alias, Query};

    let store = std::sync::Arc::new(crate::support::TestStore::fresh().await);
    let db = corbel::store::connect(&store.config().database().unwrap())
        .await
        .unwrap();
    migration::Migrator::up(&db, Some(7)).await.unwrap();
    let now = chrono::Utc::now();
    let admin = uuid::Uuid::new_v4();
    let blueprint = uuid::Uuid::new_v4();
    let (deployment, installation) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let insert = |table: &str, columns: &[&str], values: Vec<sea_orm::sea_query::SimpleExpr>| {
        Query::insert()
            .into_table(Alias::new(table))
            .columns(columns.iter().map(|c| Alias::new(*c)))
            .values_panic(values)
            .to_owned()
    };
    db.execute(&insert(
        "users",
        &[
            "id",
            "username",
            "role",
            "disabled",
            "created_at",
            "updated_at",
        ],
        vec![
            admin.into(),
            "admin".into(),
            "ADMIN".into(),
            false.into(),
            now.into(),
            now.into(),
        ],
    ))
    .await
    .unwrap();
    db.execute(&insert(
        "blueprints",
        &["id", "name", "source", "created_at", "updated_at"],
        vec![
            blueprint.into(),
            "old".into(),
            ONE_SERVICE.into(),
            now.into(),
            now.into(),
        ],
    ))
    .await
    .unwrap();
    for (id, name, element) in [
        (deployment, "old-1", None),
        (
            installation,
            "installation of x 1.0.0",
            Some(uuid::Uuid::new_v4()),
        ),
    ] {
        db.execute(&insert(
            "deployments",
            &[
                "id",
                "name",
                "blueprint_id",
                "element_id",
                "source",
                "variables",
                "state",
                "on_failure",
                "created_at",
                "updated_at",
            ],
            vec![
                id.into(),
                name.into(),
                element.is_none().then_some(blueprint).into(),
                element.into(),
                ONE_SERVICE.into(),
                "{}".into(),
                "DESTROYED".into(),
                "ROLLBACK".into(),
                now.into(),
                now.into(),
            ],
        ))
        .await
        .unwrap();
    }
    db.close().await.unwrap();

    // The next start migrates it.
    let app = TestApp::spawn_on(store).await;
    let projects = app
        .gql(
            "{ projects { id name members { user { username } role } } }",
            json!({}),
        )
        .await;
    let projects = data(&projects)["projects"].as_array().unwrap().clone();
    let id_of = |name: &str| {
        projects
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no project {name}: {projects:?}"))["id"]
            .clone()
    };
    let default = projects.iter().find(|p| p["name"] == "default").unwrap();
    assert_eq!(
        default["members"],
        json!([{ "user": { "username": "admin" }, "role": "ADMIN" }])
    );
    let body = app
        .gql(
            "query($b: ID!, $d: ID!, $i: ID!) {
               blueprint(id: $b) { name projectId }
               d: deployment(id: $d) { name projectId }
               i: deployment(id: $i) { name projectId } }",
            json!({ "b": blueprint.to_string(), "d": deployment.to_string(), "i": installation.to_string() }),
        )
        .await;
    let body = data(&body);
    assert_eq!(body["blueprint"]["name"], "old");
    assert_eq!(body["blueprint"]["projectId"], id_of("default"));
    assert_eq!(body["d"]["projectId"], id_of("default"));
    assert_eq!(body["i"]["projectId"], id_of("platform"));
}
