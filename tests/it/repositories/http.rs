//! HTTP repositories on a real nginx: lazy sync, install, upgrade, uninstall,
//! and refreshes that add, update and remove elements.

use std::time::Duration;

use serde_json::json;

use crate::support::nginx::Nginx;
use crate::support::repositories::{
    create, create_id, element_ids, labels, mutate, put_element, settled, write_inventory,
};
use crate::support::types::SyncProgress;
use crate::support::{ADMIN_TOKEN, TestApp, data, error_code, eventually};

#[tokio::test]
async fn http_repository_lazy_sync_install_upgrade_uninstall() {
    let served = tempfile::tempdir().unwrap();
    let root = served.path();
    let core_1 = put_element(
        root,
        "core",
        "1.0.0",
        json!({}),
        &[("images", "img-1", "core.qcow2")],
    );
    let core_11 = put_element(root, "core", "1.1.0", json!({}), &[]);
    let core_12 = put_element(root, "core", "1.2.0-dev+abc", json!({}), &[]);
    let core_2 = put_element(root, "core", "2.0.0", json!({}), &[]);
    let web = put_element(
        root,
        "web",
        "1.0.0",
        json!({"core": {"from_version": "1.0.0", "to_version": "2.0.0"}}),
        &[],
    );
    write_inventory(root, &[core_1, core_11, core_12, core_2, web]);
    let nginx = Nginx::start(root);
    let app = TestApp::spawn().await;

    let repo = create(
        &app,
        json!({"name": "main", "driver": {"http": {"url": nginx.url()}}, "syncMode": "LAZY"}),
    )
    .await;
    let id = repo.id;
    let repo = settled(&app, &id, "ACTIVE").await;
    let seen_and_stored = SyncProgress { seen: 5, stored: 5 };
    assert_eq!(repo.progress, Some(seen_and_stored), "{repo:?}");
    let ids = element_ids(&app, &id).await;
    assert_eq!(ids.len(), 5, "{ids:?}");

    // LAZY: the manifest and artifacts arrive on first access.
    let core = &ids["core 1.0.0"];
    let body = app
        .gql(
            "query($id: ID!) { element(id: $id) { manifest artifacts { urn fileName url } } }",
            json!({"id": core}),
        )
        .await;
    let element = &data(&body)["element"];
    assert_eq!(element["manifest"]["name"], "core");
    let body = app
        .gql(
            "query($id: ID!) { element(id: $id) { artifacts { urn fileName url } } }",
            json!({"id": core}),
        )
        .await;
    let artifacts = data(&body)["element"]["artifacts"].clone();
    assert_eq!(artifacts[0]["urn"], "images:img-1", "{artifacts}");
    let url = app.url(artifacts[0]["url"].as_str().unwrap());
    let download = app
        .client
        .get(&url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(download.status(), 200);
    assert_eq!(download.text().await.unwrap(), "contents of core.qcow2");
    assert_eq!(app.client.get(&url).send().await.unwrap().status(), 401);

    // The plan prefers a release over a higher suffixed build: core 1.1.0.
    let web_id = &ids["web 1.0.0"];
    let body = app
        .gql("query($id: ID!) { resolveElement(id: $id) { elements { alreadyInstalled element { name version } } } }", json!({"id": web_id}))
        .await;
    let plan = labels(&data(&body)["resolveElement"]["elements"], "element");
    assert_eq!(plan, ["core 1.1.0", "web 1.0.0"]);

    let installed = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": web_id}),
    )
    .await;
    assert_eq!(data(&installed)["installElement"]["installed"], true);
    assert_eq!(data(&installed)["installElement"]["status"], "ACTIVE");
    let again = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": web_id}),
    )
    .await;
    assert_eq!(error_code(&again), Some("ALREADY_INSTALLED"));
    let other_core = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": ids["core 1.0.0"]}),
    )
    .await;
    assert_eq!(
        error_code(&other_core),
        Some("ALREADY_INSTALLED"),
        "{other_core}"
    );

    let body = app
        .gql(
            "query($id: ID!) { element(id: $id) { dependents { name } } }",
            json!({"id": ids["core 1.1.0"]}),
        )
        .await;
    assert_eq!(
        data(&body)["element"]["dependents"],
        json!([{"name": "web"}])
    );
    let refused = mutate(
        &app,
        "uninstallElement(id: $id)",
        "($id: ID!)",
        json!({"id": ids["core 1.1.0"]}),
    )
    .await;
    assert_eq!(error_code(&refused), Some("HAS_DEPENDENTS"), "{refused}");
    assert_eq!(
        refused["errors"][0]["extensions"]["dependents"],
        json!(["web 1.0.0"])
    );
    let deleting = app
        .gql(
            "mutation($id: ID!) { deleteRepository(id: $id) }",
            json!({"id": id}),
        )
        .await;
    assert_eq!(error_code(&deleting), Some("CONFLICT"));

    // An upgrade that breaks a dependent's constraint is refused; one that keeps
    // it moves the binding.
    let breaking = mutate(
        &app,
        "upgradeElement(id: $a, toId: $b)",
        "($a: ID!, $b: ID!)",
        json!({"a": ids["core 1.1.0"], "b": ids["core 2.0.0"]}),
    )
    .await;
    assert_eq!(
        error_code(&breaking),
        Some("DEPENDENCY_CONSTRAINT"),
        "{breaking}"
    );
    assert!(
        breaking["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("web 1.0.0"),
        "{breaking}"
    );
    let upgraded = mutate(
        &app,
        "upgradeElement(id: $a, toId: $b)",
        "($a: ID!, $b: ID!)",
        json!({"a": ids["core 1.1.0"], "b": ids["core 1.0.0"]}),
    )
    .await;
    assert_eq!(data(&upgraded)["upgradeElement"]["installed"], true);
    let body = app
        .gql(
            "{ elements(filter: {installed: true}) { edges { node { name version } } } }",
            json!({}),
        )
        .await;
    let mut installed = labels(&data(&body)["elements"]["edges"], "node");
    installed.sort();
    assert_eq!(installed, ["core 1.0.0", "web 1.0.0"]);
    let body = app
        .gql(
            "query($id: ID!) { element(id: $id) { dependents { name } } }",
            json!({"id": ids["core 1.0.0"]}),
        )
        .await;
    assert_eq!(
        data(&body)["element"]["dependents"],
        json!([{"name": "web"}])
    );

    for name in ["web 1.0.0", "core 1.0.0"] {
        let gone = mutate(
            &app,
            "uninstallElement(id: $id)",
            "($id: ID!)",
            json!({"id": ids[name]}),
        )
        .await;
        assert_eq!(
            data(&gone)["uninstallElement"]["installed"],
            false,
            "{gone}"
        );
    }
    let deleted = app
        .gql(
            "mutation($id: ID!) { deleteRepository(id: $id) }",
            json!({"id": id}),
        )
        .await;
    assert_eq!(data(&deleted)["deleteRepository"], true);
}

#[tokio::test]
async fn refresh_adds_updates_and_removes_but_keeps_installed() {
    let served = tempfile::tempdir().unwrap();
    let root = served.path();
    let a = put_element(root, "a", "1.0.0", json!({}), &[]);
    let b = put_element(root, "b", "1.0.0", json!({}), &[]);
    let c = put_element(root, "c", "1.0.0", json!({}), &[]);
    write_inventory(root, &[a.clone(), b, c]);
    let nginx = Nginx::start(root);
    let app = TestApp::spawn().await;
    let id = create_id(
        &app,
        json!({"name": "r", "driver": {"http": {"url": nginx.url()}}, "syncMode": "COPY"}),
    )
    .await;
    let first = settled(&app, &id, "ACTIVE").await;
    let ids = element_ids(&app, &id).await;
    data(
        &mutate(
            &app,
            "installElement(id: $id)",
            "($id: ID!)",
            json!({"id": ids["b 1.0.0"]}),
        )
        .await,
    );

    // b and c leave the inventory, d arrives, a changes.
    let d = put_element(root, "d", "1.0.0", json!({}), &[]);
    let mut a2 = a.clone();
    a2["templates"] = json!(["t.j2"]);
    write_inventory(root, &[a2, d]);
    data(
        &app.gql(
            "mutation($id: ID!) { refreshRepository(id: $id) { id } }",
            json!({"id": id}),
        )
        .await,
    );
    eventually(Duration::from_secs(30), "the refresh", || async {
        let body = app
            .gql(
                "query($id: ID!) { repository(id: $id) { status lastSyncedAt } }",
                json!({"id": id}),
            )
            .await;
        let r = data(&body)["repository"].clone();
        (r["status"] == "ACTIVE" && r["lastSyncedAt"].as_str() != first.last_synced_at.as_deref())
            .then_some(())
    })
    .await;
    let after = element_ids(&app, &id).await;
    let names: Vec<&String> = after.keys().collect();
    assert_eq!(
        names,
        ["a 1.0.0", "b 1.0.0", "d 1.0.0"],
        "b stays: it is installed"
    );
    assert_eq!(after["a 1.0.0"], ids["a 1.0.0"], "a changed in place");
    // COPY stored d's manifest at sync time.
    let body = app
        .gql(
            "query($id: ID!) { element(id: $id) { manifest } }",
            json!({"id": after["d 1.0.0"]}),
        )
        .await;
    assert_eq!(data(&body)["element"]["manifest"]["name"], "d");
}

/// An inventory of `names` × 7 versions, as text; `changed` entries (every
/// 100th) carry a digest, which makes them changed entries.
fn many_versions(names: std::ops::Range<usize>, changed: bool) -> String {
    let mut elements = serde_json::Map::new();
    let digest = format!("sha256:{}", "ab".repeat(32));
    for n in names {
        let mut versions = serde_json::Map::new();
        for v in 0..7 {
            let mut entry = json!({"name": format!("e{n:04}"), "version": format!("1.{v}.0")});
            if changed && (n * 7 + v).is_multiple_of(100) {
                entry["digest"] = json!(digest);
            }
            versions.insert(format!("1.{v}.0"), entry);
        }
        elements.insert(format!("e{n:04}"), versions.into());
    }
    json!({"elements": elements}).to_string()
}

async fn ids_named(app: &TestApp, name: &str) -> Vec<(String, String)> {
    let body = app
        .gql(
            "query($n: String!) { elements(filter: {name: $n}, first: 50) { edges { node { id version } } } }",
            json!({"n": name}),
        )
        .await;
    let mut ids: Vec<(String, String)> = data(&body)["elements"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["node"]["version"].as_str().unwrap().to_owned(),
                e["node"]["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    ids.sort();
    ids
}

/// A sync reads what is stored a page at a time (5,000 rows, in name and
/// version order): a refresh of more than two pages, with a page ending in the
/// middle of one name's versions, finds every stored element exactly once —
/// the unchanged and the changed keep their ids, the gone go, the new arrive.
/// An element read twice or missed would be inserted again, which the unique
/// key refuses, and the repository would be in `ERROR`.
#[tokio::test]
async fn a_refresh_across_pages_of_stored_elements_keeps_every_id() {
    let served = tempfile::tempdir().unwrap();
    let root = served.path();
    // 1,430 names × 7 = 10,010 versions: pages of 5,000, 5,000 and 10;
    // e0714's versions straddle the first page's end (714 × 7 = 4,998).
    std::fs::write(root.join("inventory.json"), many_versions(0..1430, false)).unwrap();
    let nginx = Nginx::start(root);
    let app = TestApp::spawn().await;
    let id = create_id(
        &app,
        json!({"name": "many", "driver": {"http": {"url": nginx.url()}}}),
    )
    .await;
    let first = settled(&app, &id, "ACTIVE").await;
    assert_eq!(
        first.progress,
        Some(SyncProgress {
            seen: 10_010,
            stored: 10_010
        })
    );
    let straddling = ids_named(&app, "e0714").await;
    let last = ids_named(&app, "e1429").await;
    assert_eq!((straddling.len(), last.len()), (7, 7));

    // e0000 goes, e1430 arrives, every 100th entry changes.
    std::fs::write(root.join("inventory.json"), many_versions(1..1431, true)).unwrap();
    let repo = crate::support::repositories::refresh(&app, &id).await;
    assert_eq!(repo.status, "ACTIVE", "{repo:?}");
    assert_eq!(
        repo.progress,
        Some(SyncProgress {
            seen: 10_010,
            stored: 10_010
        })
    );
    assert_eq!(
        ids_named(&app, "e0714").await,
        straddling,
        "e0714 4998 changed in place"
    );
    assert_eq!(ids_named(&app, "e1429").await, last);
    assert!(ids_named(&app, "e0000").await.is_empty());
    assert_eq!(ids_named(&app, "e1430").await.len(), 7);
}
