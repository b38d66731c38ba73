//! A bad element never fails the whole repository: it is recorded with what
//! is wrong, the others are stored and installable, and the repository stays
//! ACTIVE saying how many are invalid (http COPY and LAZY, local).

use serde_json::json;

use crate::support::nginx::Nginx;
use crate::support::repositories::{
    create_id, element_ids, invalid_elements, manifest_of, mutate, put_element, refresh, settled,
    write_inventory,
};
use crate::support::{TestApp, data, error_code};

/// A served tree: `a`, `b` good; `bad` requires with an unknown key;
/// `missing` is listed but has no manifest.
fn tree(root: &std::path::Path) {
    let a = put_element(root, "a", "1.0.0", json!({}), &[]);
    let b = put_element(
        root,
        "b",
        "1.0.0",
        json!({"a": {"from_version": "1.0.0"}}),
        &[],
    );
    let bad = put_element(root, "bad", "1.0.0", json!({"a": {"about": "1.0.0"}}), &[]);
    let missing = put_element(root, "missing", "2.0.0", json!({}), &[]);
    std::fs::remove_file(root.join("missing/2.0.0/manifests/missing.yaml")).unwrap();
    write_inventory(root, &[a, b, bad, missing]);
}

#[tokio::test]
async fn a_copy_sync_records_bad_manifests_and_stays_active() {
    let served = tempfile::tempdir().unwrap();
    let root = served.path();
    tree(root);
    let nginx = Nginx::start(root);
    let app = TestApp::spawn().await;
    let id = create_id(
        &app,
        json!({"name": "copy", "driver": {"http": {"url": nginx.url()}}, "syncMode": "COPY"}),
    )
    .await;
    let repo = settled(&app, &id, "ACTIVE").await;
    assert_eq!(
        repo.status_message.as_deref(),
        Some("4 elements, 2 invalid"),
        "{repo:?}"
    );
    assert_eq!(repo.invalid_element_count, 2);
    let ids = element_ids(&app, &id).await;
    let invalid = invalid_elements(&app, &id).await;
    assert_eq!(invalid.len(), 2, "{invalid:?}");
    assert_eq!(invalid[0]["path"], "bad/1.0.0/manifests/bad.yaml");
    assert_eq!(
        (&invalid[0]["name"], &invalid[0]["version"]),
        (&json!("bad"), &json!("1.0.0"))
    );
    assert_eq!(invalid[0]["elementId"], json!(ids["bad 1.0.0"]));
    let message = invalid[0]["message"].as_str().unwrap();
    assert!(
        message.contains("`bad`") && message.contains("unknown key `about`"),
        "{message}"
    );
    assert_eq!(invalid[1]["path"], "missing/2.0.0/manifests/missing.yaml");
    let message = invalid[1]["message"].as_str().unwrap();
    assert!(
        message.contains("404") && message.contains("lists missing 2.0.0"),
        "{message}"
    );

    // The good ones are stored and installable.
    let installed = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": ids["b 1.0.0"]}),
    )
    .await;
    assert_eq!(
        data(&installed)["installElement"]["installed"],
        true,
        "{installed}"
    );
    // The bad one is listed, and installing it says why not.
    let refused = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": ids["bad 1.0.0"]}),
    )
    .await;
    assert_eq!(
        error_code(&refused),
        Some("DEPENDENCY_CONSTRAINT_FORMAT"),
        "{refused}"
    );

    // Fixed at the source (the inventory unchanged): the next sync fetches
    // the manifests still missing, and the list follows.
    put_element(
        root,
        "bad",
        "1.0.0",
        json!({"a": {"from_version": "1.0.0"}}),
        &[],
    );
    let repo = refresh(&app, &id).await;
    assert_eq!(repo.status, "ACTIVE", "{repo:?}");
    assert_eq!(
        repo.status_message.as_deref(),
        Some("4 elements, 1 invalid")
    );
    let invalid = invalid_elements(&app, &id).await;
    assert_eq!(invalid.len(), 1, "{invalid:?}");
    assert_eq!(invalid[0]["name"], "missing");
    assert_eq!(
        manifest_of(&app, &ids["bad 1.0.0"]).await["requirements"]["a"]["from_version"],
        "1.0.0"
    );
}

#[tokio::test]
async fn a_lazy_repository_records_a_bad_manifest_when_first_fetched() {
    let served = tempfile::tempdir().unwrap();
    let root = served.path();
    tree(root);
    let nginx = Nginx::start(root);
    let app = TestApp::spawn().await;
    let id = create_id(
        &app,
        json!({"name": "lazy", "driver": {"http": {"url": nginx.url()}}, "syncMode": "LAZY"}),
    )
    .await;
    let repo = settled(&app, &id, "ACTIVE").await;
    assert_eq!((repo.invalid_element_count, repo.status_message), (0, None));
    let ids = element_ids(&app, &id).await;
    assert_eq!(ids.len(), 4, "{ids:?}");

    let body = app
        .gql(
            "query($id: ID!) { element(id: $id) { manifest } }",
            json!({"id": ids["bad 1.0.0"]}),
        )
        .await;
    assert_eq!(
        error_code(&body),
        Some("DEPENDENCY_CONSTRAINT_FORMAT"),
        "{body}"
    );
    let body = app
        .gql(
            "query($id: ID!) { element(id: $id) { manifest } }",
            json!({"id": ids["missing 2.0.0"]}),
        )
        .await;
    assert_eq!(error_code(&body), Some("VALIDATION"), "{body}");
    let invalid = invalid_elements(&app, &id).await;
    let paths: Vec<&str> = invalid
        .iter()
        .map(|i| i["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "bad/1.0.0/manifests/bad.yaml",
            "missing/2.0.0/manifests/missing.yaml"
        ]
    );
    assert!(
        invalid[0]["message"]
            .as_str()
            .unwrap()
            .contains("unknown key `about`"),
        "{invalid:?}"
    );

    // An unchanged entry keeps its record across a sync; a good one is usable.
    let repo = refresh(&app, &id).await;
    assert_eq!(
        (repo.status.as_str(), repo.invalid_element_count),
        ("ACTIVE", 2),
        "{repo:?}"
    );
    let installed = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": ids["b 1.0.0"]}),
    )
    .await;
    assert_eq!(
        data(&installed)["installElement"]["installed"],
        true,
        "{installed}"
    );
}

#[tokio::test]
async fn a_local_directory_records_bad_files_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("good.yaml", "name: good\nversion: 1.0.0\nresources: {}\n");
    write(
        "nested/again.yaml",
        "name: good\nversion: 1.0.0\nresources: {}\n",
    );
    write("broken.yaml", "name: broken\nversion: [\n");
    write("float.yaml", "name: float\nversion: 1.0\nresources: {}\n");
    write("other.yml", "name: other\nversion: 0.1.0\nresources: {}\n");
    write("notes.yaml", "just: some yaml\n");
    let app = TestApp::spawn().await;
    let id = create_id(
        &app,
        json!({"name": "local", "driver": {"local": {"path": dir.path()}}, "syncMode": "COPY"}),
    )
    .await;
    let repo = settled(&app, &id, "ACTIVE").await;
    assert_eq!(
        repo.status_message.as_deref(),
        Some("5 elements, 3 invalid"),
        "{repo:?}"
    );
    let ids = element_ids(&app, &id).await;
    assert_eq!(
        ids.keys().collect::<Vec<_>>(),
        ["good 1.0.0", "other 0.1.0"]
    );
    let invalid = invalid_elements(&app, &id).await;
    let found: Vec<(&str, &str)> = invalid
        .iter()
        .map(|i| (i["path"].as_str().unwrap(), i["message"].as_str().unwrap()))
        .collect();
    assert_eq!(found.len(), 3, "{found:?}");
    assert_eq!(found[0].0, "broken.yaml");
    assert!(
        found[0].1.contains("broken.yaml") && found[0].1.contains("not valid YAML"),
        "{found:?}"
    );
    assert_eq!(found[1].0, "float.yaml");
    assert!(
        found[1].1.contains("field `version`") && found[1].1.contains("as a number"),
        "{found:?}"
    );
    assert_eq!(
        (&invalid[1]["name"], &invalid[1]["version"]),
        (&json!("float"), &json!("1.0"))
    );
    assert_eq!(found[2].0, "nested/again.yaml");
    assert!(
        found[2].1.contains("element `good` 1.0.0 is listed twice"),
        "{found:?}"
    );

    // A fixed file is an element at the next sync, and leaves the list.
    write(
        "float.yaml",
        "name: float\nversion: \"1.0.0\"\nresources: {}\n",
    );
    let repo = refresh(&app, &id).await;
    assert_eq!(
        repo.status_message.as_deref(),
        Some("5 elements, 2 invalid"),
        "{repo:?}"
    );
    assert!(element_ids(&app, &id).await.contains_key("float 1.0.0"));

    // A directory that cannot be read at all is the repository's error.
    let gone = create_id(
        &app,
        json!({"name": "gone", "driver": {"local": {"path": dir.path().join("absent")}}}),
    )
    .await;
    let repo = settled(&app, &gone, "ERROR").await;
    assert!(
        repo.status_message
            .as_deref()
            .unwrap()
            .contains("not a directory"),
        "{repo:?}"
    );
}
