//! Local directories, uploads, and sync progress published live.

use std::time::Duration;

use serde_json::json;

use crate::support::repositories::{create_id, element_ids, mutate, settled};
use crate::support::websocket::{connect, init, next_json, send};
use crate::support::{ADMIN_TOKEN, TestApp, data, error_code};

#[tokio::test]
async fn local_directories_and_uploads() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("base.yaml"),
        "name: base\nversion: 1.0.0\nresources: {}\n",
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("nested")).unwrap();
    std::fs::write(
        dir.path().join("nested/app.yml"),
        "name: app\nversion: 0.2.0\nresources: {}\nrequirements:\n  base: {\">=\": 1.0.0}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("notes.yaml"), "just: some yaml\n").unwrap();
    std::fs::write(dir.path().join("README.md"), "not yaml at all").unwrap();
    let app = TestApp::spawn().await;
    let id = create_id(
        &app,
        json!({"name": "local", "driver": {"local": {"path": dir.path()}}, "syncMode": "COPY"}),
    )
    .await;
    settled(&app, &id, "ACTIVE").await;
    let ids = element_ids(&app, &id).await;
    assert_eq!(ids.keys().collect::<Vec<_>>(), ["app 0.2.0", "base 1.0.0"]);
    let installed = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": ids["app 0.2.0"]}),
    )
    .await;
    assert_eq!(data(&installed)["installElement"]["installed"], true);

    // Upload writes a new manifest file into the directory.
    let yaml = "name: extra\nversion: 3.0.0\nresources: {}\n";
    let body = app
        .gql("mutation($r: ID!, $m: String!) { uploadElement(repositoryId: $r, manifest: $m) { name version } }", json!({"r": id, "m": yaml}))
        .await;
    assert_eq!(
        data(&body)["uploadElement"],
        json!({"name": "extra", "version": "3.0.0"})
    );
    assert!(dir.path().join("extra-3.0.0.yaml").exists());
    let again = app
        .gql("mutation($r: ID!, $m: String!) { uploadElement(repositoryId: $r, manifest: $m) { name } }", json!({"r": id, "m": yaml}))
        .await;
    assert_eq!(error_code(&again), Some("CONFLICT"));
    let bad = app
        .gql("mutation($r: ID!, $m: String!) { uploadElement(repositoryId: $r, manifest: $m) { name } }", json!({"r": id, "m": "name: x\nversion: 1.0\nresources: {}\n"}))
        .await;
    assert_eq!(error_code(&bad), Some("VALIDATION"), "{bad}");
    assert!(
        bad["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("field `version`"),
        "{bad}"
    );
}

#[tokio::test]
async fn sync_progress_is_published_live() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..3 {
        std::fs::write(
            dir.path().join(format!("e{i}.yaml")),
            format!("name: e{i}\nversion: 1.0.0\nresources: {{}}\n"),
        )
        .unwrap();
    }
    let app = TestApp::spawn().await;
    let id = create_id(
        &app,
        json!({"name": "live", "driver": {"local": {"path": dir.path()}}}),
    )
    .await;
    settled(&app, &id, "ACTIVE").await;

    let mut ws = connect(app.addr, "graphql-transport-ws").await;
    init(&mut ws, json!({"token": ADMIN_TOKEN})).await;
    send(
        &mut ws,
        json!({"id": "r", "type": "subscribe", "payload": {
        "query": "subscription($id: ID!) { repositoryEvents(id: $id) { status seen stored } }",
        "variables": {"id": id}}}),
    )
    .await;
    // First, where it stands now: a page that loaded the repository and then
    // subscribed cannot miss the end of a short sync.
    let now = tokio::time::timeout(Duration::from_secs(10), next_json(&mut ws))
        .await
        .expect("the first event comes at once")
        .expect("an event");
    assert_eq!(
        now["payload"]["data"]["repositoryEvents"],
        json!({"status": "ACTIVE", "seen": 3, "stored": 3}),
        "{now}"
    );
    // Refresh until the subscriber sees a whole sync: SYNCING, then ACTIVE.
    let mut statuses = Vec::new();
    for _ in 0..50 {
        data(
            &app.gql(
                "mutation($id: ID!) { refreshRepository(id: $id) { id } }",
                json!({"id": id}),
            )
            .await,
        );
        while let Ok(Some(message)) =
            tokio::time::timeout(Duration::from_millis(200), next_json(&mut ws)).await
        {
            let event = message["payload"]["data"]["repositoryEvents"].clone();
            statuses.push(event["status"].as_str().unwrap().to_owned());
            if event["status"] == "ACTIVE" && statuses.contains(&"SYNCING".to_owned()) {
                assert_eq!(event["stored"], 3, "{event}");
                return;
            }
        }
    }
    panic!("no complete sync seen: {statuses:?}");
}
