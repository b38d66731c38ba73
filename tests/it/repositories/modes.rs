//! LAZY and COPY against the same source: the same artifacts listed and
//! served, and a manifest changed at the source refetched on refresh.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::support::nginx::Nginx;
use crate::support::repositories::{
    create_id, element_ids, manifest_of, put_element, refresh, refresh_with, settled,
    write_inventory,
};
use crate::support::{ADMIN_TOKEN, TestApp, data};

/// `(urn, fileName)` of each artifact of an element, and the bytes each
/// `/artifacts/…` URL serves.
async fn artifacts(app: &TestApp, element: &str) -> Vec<(String, String, String)> {
    let body = app
        .gql(
            "query($id: ID!) { element(id: $id) { artifacts { urn fileName url } } }",
            json!({"id": element}),
        )
        .await;
    let mut out = Vec::new();
    for artifact in data(&body)["element"]["artifacts"].as_array().unwrap() {
        let response = app
            .client
            .get(app.url(artifact["url"].as_str().unwrap()))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{artifact}");
        out.push((
            artifact["urn"].as_str().unwrap().to_owned(),
            artifact["fileName"].as_str().unwrap().to_owned(),
            response.text().await.unwrap(),
        ));
    }
    out
}

/// A repository named `mode` in that sync mode, reading `nginx`, once ACTIVE:
/// its id, and its elements' ids by `name version`.
async fn synced(
    app: &TestApp,
    nginx: &Nginx,
    mode: &str,
) -> (String, std::collections::BTreeMap<String, String>) {
    let id = create_id(
        app,
        json!({"name": mode, "driver": {"http": {"url": nginx.url()}}, "syncMode": mode}),
    )
    .await;
    settled(app, &id, "ACTIVE").await;
    let ids = element_ids(app, &id).await;
    (id, ids)
}

#[tokio::test]
async fn lazy_lists_and_serves_the_artifacts_copy_does() {
    let served = tempfile::tempdir().unwrap();
    let root = served.path();
    // `top`: its artifacts only in the top inventory (no per-element listing).
    let top = put_element(
        root,
        "top",
        "1.0.0",
        json!({}),
        &[
            ("images", "img-1", "top.qcow2"),
            ("configs", "c-1", "top.conf"),
        ],
    );
    std::fs::remove_file(root.join("top/1.0.0/inventory.json")).unwrap();
    // `own`: its artifacts only in its own `inventory.json`.
    let mut own = put_element(
        root,
        "own",
        "2.0.0",
        json!({}),
        &[("templates", "t-1", "own.j2")],
    );
    own.as_object_mut().unwrap().remove("index");
    write_inventory(root, &[top, own]);
    let nginx = Nginx::start(root);
    let app = TestApp::spawn().await;

    let mut listed: Vec<Vec<Vec<(String, String, String)>>> = Vec::new();
    for mode in ["COPY", "LAZY"] {
        let (_, ids) = synced(&app, &nginx, mode).await;
        listed.push(vec![
            artifacts(&app, &ids["top 1.0.0"]).await,
            artifacts(&app, &ids["own 2.0.0"]).await,
        ]);
    }
    let want = vec![
        vec![
            (
                "configs:c-1".to_owned(),
                "top.conf".to_owned(),
                "contents of top.conf".to_owned(),
            ),
            (
                "images:img-1".to_owned(),
                "top.qcow2".to_owned(),
                "contents of top.qcow2".to_owned(),
            ),
        ],
        vec![(
            "templates:t-1".to_owned(),
            "own.j2".to_owned(),
            "contents of own.j2".to_owned(),
        )],
    ];
    assert_eq!(listed[0], want, "COPY");
    assert_eq!(listed[1], want, "LAZY lists and serves what COPY does");
}

#[tokio::test]
async fn a_refresh_replaces_the_artifacts_changed_at_the_source() {
    let served = tempfile::tempdir().unwrap();
    let root = served.path();
    let before = [
        ("images", "img-1", "disk.qcow2"),
        ("configs", "c-1", "app.conf"),
        ("templates", "t-1", "app.j2"),
    ];
    // `img-1` gets another file, `c-1` is dropped, `t-1` stays, `a-1` is new.
    let after = [
        ("images", "img-1", "disk-v2.qcow2"),
        ("templates", "t-1", "app.j2"),
        ("artifacts", "a-1", "setup.sh"),
    ];
    // The artifacts are listed in the top inventory only (no element's own
    // `inventory.json`), so what the sync writes is what is read back.
    let listing = |artifacts: &[(&str, &str, &str)]| {
        let mut entries = vec![put_element(root, "app", "1.0.0", json!({}), artifacts)];
        std::fs::remove_file(root.join("app/1.0.0/inventory.json")).unwrap();
        entries.push(put_element(root, "other", "1.0.0", json!({}), &before));
        write_inventory(root, &entries);
    };
    let nginx = Nginx::start(root);
    let app = TestApp::spawn().await;

    for mode in ["COPY", "LAZY"] {
        listing(&before);
        let (id, ids) = synced(&app, &nginx, mode).await;
        assert_eq!(artifacts(&app, &ids["app 1.0.0"]).await.len(), 3, "{mode}");

        listing(&after);
        refresh(&app, &id).await;
        let again = element_ids(&app, &id).await;
        assert_eq!(
            again["app 1.0.0"], ids["app 1.0.0"],
            "{mode}: the same element"
        );
        let contents = |file: &str| format!("contents of {file}");
        assert_eq!(
            artifacts(&app, &ids["app 1.0.0"]).await,
            vec![
                (
                    "artifacts:a-1".to_owned(),
                    "setup.sh".to_owned(),
                    contents("setup.sh")
                ),
                (
                    "images:img-1".to_owned(),
                    "disk-v2.qcow2".to_owned(),
                    contents("disk-v2.qcow2")
                ),
                (
                    "templates:t-1".to_owned(),
                    "app.j2".to_owned(),
                    contents("app.j2")
                ),
            ],
            "{mode}: the listing after the refresh, nothing else"
        );
        assert_eq!(
            artifacts(&app, &ids["other 1.0.0"]).await.len(),
            3,
            "{mode}: an unchanged element keeps its artifacts"
        );
    }
}

/// Writes `name 1.0.0`'s manifest with `description`, and returns its entry
/// with the manifest's digest.
fn publish(root: &std::path::Path, description: &str) -> Value {
    let mut entry = put_element(root, "app", "1.0.0", json!({}), &[]);
    let path = root.join("app/1.0.0/manifests/app.yaml");
    let text = format!("name: app\nversion: 1.0.0\ndescription: {description}\nresources: {{}}\n");
    std::fs::write(&path, &text).unwrap();
    entry["digest"] = json!(format!(
        "sha256:{}",
        hex::encode(Sha256::digest(text.as_bytes()))
    ));
    entry
}

#[tokio::test]
async fn refresh_refetches_a_manifest_changed_at_the_source() {
    let served = tempfile::tempdir().unwrap();
    let root = served.path();
    write_inventory(root, &[publish(root, "one")]);
    let nginx = Nginx::start(root);
    let app = TestApp::spawn().await;
    let mut repos = Vec::new();
    for mode in ["COPY", "LAZY"] {
        let id = create_id(
            &app,
            json!({"name": mode, "driver": {"http": {"url": nginx.url()}}, "syncMode": mode}),
        )
        .await;
        settled(&app, &id, "ACTIVE").await;
        let element = element_ids(&app, &id).await["app 1.0.0"].clone();
        // LAZY: fetched and cached now.
        assert_eq!(
            manifest_of(&app, &element).await["description"],
            "one",
            "{mode}"
        );
        repos.push((mode, id, element));
    }

    // Same name and version, new content, and the inventory's digest says so.
    write_inventory(root, &[publish(root, "two")]);
    for (mode, id, element) in &repos {
        let repo = refresh(&app, id).await;
        assert_eq!(repo.status, "ACTIVE", "{mode}: {repo:?}");
        assert_eq!(
            element_ids(&app, id).await["app 1.0.0"],
            *element,
            "{mode}: same element"
        );
    }
    // COPY stored the new content at sync time; stop the source to show it.
    drop(nginx);
    let (_, _, copy_element) = &repos[0];
    assert_eq!(
        manifest_of(&app, copy_element).await["description"],
        "two",
        "COPY"
    );
    // LAZY dropped its cached manifest: the next use fetches (and fails now).
    let (_, _, lazy_element) = &repos[1];
    let body = app
        .gql(
            "query($id: ID!) { element(id: $id) { manifest } }",
            json!({"id": lazy_element}),
        )
        .await;
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("cannot connect"),
        "{body}"
    );
}

#[tokio::test]
async fn lazy_fetches_the_changed_manifest_on_next_use() {
    let served = tempfile::tempdir().unwrap();
    let root = served.path();
    write_inventory(root, &[publish(root, "one")]);
    let nginx = Nginx::start(root);
    let app = TestApp::spawn().await;
    let id = create_id(
        &app,
        json!({"name": "lazy", "driver": {"http": {"url": nginx.url()}}, "syncMode": "LAZY"}),
    )
    .await;
    settled(&app, &id, "ACTIVE").await;
    let element = element_ids(&app, &id).await["app 1.0.0"].clone();
    assert_eq!(manifest_of(&app, &element).await["description"], "one");
    // Changed without a new digest: the entry is the same, the cache stays.
    let same_entry = publish(root, "one");
    std::fs::write(
        root.join("app/1.0.0/manifests/app.yaml"),
        "name: app\nversion: 1.0.0\ndescription: unnoticed\nresources: {}\n",
    )
    .unwrap();
    write_inventory(root, &[same_entry]);
    refresh(&app, &id).await;
    assert_eq!(manifest_of(&app, &element).await["description"], "one");
    // Asked to, a refresh reads every manifest again.
    refresh_with(&app, &id, true).await;
    assert_eq!(
        manifest_of(&app, &element).await["description"],
        "unnoticed"
    );
    // With its digest, it is noticed.
    write_inventory(root, &[publish(root, "two")]);
    refresh(&app, &id).await;
    assert_eq!(manifest_of(&app, &element).await["description"], "two");
}

/// A source that edits manifests under unchanged entries: a refresh asked to
/// refetch reads every manifest again, and a COPY repository stores it.
#[tokio::test]
async fn a_copy_refresh_asked_to_refetch_reads_every_manifest_again() {
    let served = tempfile::tempdir().unwrap();
    let root = served.path();
    let entry = put_element(root, "app", "1.0.0", json!({}), &[]);
    write_inventory(root, std::slice::from_ref(&entry));
    let nginx = Nginx::start(root);
    let app = TestApp::spawn().await;
    let id = create_id(
        &app,
        json!({"name": "copy", "driver": {"http": {"url": nginx.url()}}, "syncMode": "COPY"}),
    )
    .await;
    settled(&app, &id, "ACTIVE").await;
    let element = element_ids(&app, &id).await["app 1.0.0"].clone();
    assert!(manifest_of(&app, &element).await["description"].is_null());
    std::fs::write(
        root.join("app/1.0.0/manifests/app.yaml"),
        "name: app\nversion: 1.0.0\ndescription: edited\nresources: {}\n",
    )
    .unwrap();
    refresh(&app, &id).await;
    assert!(
        manifest_of(&app, &element).await["description"].is_null(),
        "an unchanged entry keeps what is stored"
    );
    let repo = refresh_with(&app, &id, true).await;
    assert_eq!(repo.status, "ACTIVE");
    assert_eq!(element_ids(&app, &id).await["app 1.0.0"], element);
    // Stored at sync time: without the source, the new content is there.
    drop(nginx);
    assert_eq!(manifest_of(&app, &element).await["description"], "edited");
}
