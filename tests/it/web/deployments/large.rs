//! A large deployment's page: past 400 nodes the graph is drawn by level
//! (`web/js/pages/levels.js`), each level a list that draws only the rows in
//! its view, so 1,000 replicas are a few dozen rows in the page; scrolling
//! draws the later ones, and a row opens its node's panel by mouse and by
//! keyboard.

use std::sync::Arc;

use serde_json::json;

use super::node;
use crate::support::browser::Browser;
use crate::support::deployments::{create_blueprint, deploy, settled};
use crate::support::provider_repos::{ProviderRepo, fixture_metadata};
use crate::support::providers::{create_provider, wait_status};
use crate::support::settings::quick;
use crate::support::{TestApp, TestStore};

const REPLICAS: usize = 1_000;

/// `many` (no-op replicas of the fixture), then `last` after it.
const BLUEPRINT: &str = r#"
version: "1"
resources:
  many:
    type: fixture.v1.noop
    replicas: 1000
    strategy: AUTO
  last:
    type: fixture.v1.noop
    depends_on: [many]
"#;

/// How many node rows the page holds now.
const ROWS: &str = "return document.querySelectorAll('#dag .row').length;";

#[tokio::test]
async fn a_deployment_of_1000_nodes_is_drawn_by_level_with_only_the_rows_in_view() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), quick).await;
    let repo = ProviderRepo::new(&fixture_metadata("normal"), &[]);
    let (provider, _) = create_provider(
        &app,
        json!({ "name": "fixture", "gitUrl": repo.url(), "config": { "capacity": 5000 } }),
    )
    .await;
    wait_status(&app, &provider, "CONNECTED").await;
    let blueprint = create_blueprint(&app, "many", BLUEPRINT).await;
    // The page is opened while it deploys: its rows follow it live, the
    // ones not drawn too (their key's count, and once scrolled to).
    let id = deploy(&app, &blueprint, "many", json!({})).await;

    let browser = Browser::sign_in(&app).await;
    browser.goto(&format!("/deployments/{id}")).await;
    browser
        .wait_attr(&node("last[0]"), "data-state", "COMPLETE")
        .await;
    browser
        .wait_attr(&node("many[0]"), "data-state", "COMPLETE")
        .await;
    assert!(browser.all("#dag svg").await.is_empty(), "no SVG drawing");
    // Two levels; each key's header says what it follows and counts its
    // nodes by state (of every replica, drawn or not).
    assert_eq!(browser.all("#dag .level").await.len(), 2);
    browser
        .wait_text(r#"#dag .level-key[data-resource="last"]"#, "after many")
        .await;
    browser
        .wait_text(
            r#"#dag .level-key[data-resource="many"]"#,
            &format!("{REPLICAS} complete"),
        )
        .await;
    let rows = browser.js(ROWS).await.as_u64().unwrap();
    assert!(rows > 10 && rows < 100, "{rows} rows drawn of {REPLICAS}");
    assert!(browser.all(&node("many[999]")).await.is_empty());

    // Scrolled to its end, the list draws the last replicas, not the first.
    browser
        .js("const v = document.querySelector('#dag .level-view'); v.scrollTop = v.scrollHeight; return true;")
        .await;
    browser
        .wait_attr(&node("many[999]"), "data-state", "COMPLETE")
        .await;
    browser
        .wait_js(
            "the first replicas are dropped",
            r#"!document.querySelector('#dag [data-key="many[0]"]')"#,
        )
        .await;
    let rows = browser.js(ROWS).await.as_u64().unwrap();
    assert!(rows < 100, "{rows} rows drawn after scrolling");

    // A row opens its node's panel by mouse, and its neighbour by keyboard.
    browser.click(&node("many[999]")).await;
    browser.wait_text("#node-panel h2", "many[999]").await;
    browser
        .wait_attr(&node("many[999]"), "aria-pressed", "true")
        .await;
    let active = browser.client.active_element().await.unwrap();
    let keys = [fantoccini::key::Key::Up, fantoccini::key::Key::Enter].map(|k| k.to_string());
    active.send_keys(&keys.concat()).await.unwrap();
    browser.wait_text("#node-panel h2", "many[998]").await;
    browser
        .wait_attr(&node("many[999]"), "aria-pressed", "false")
        .await;
    browser.screenshot("deployment-large").await;
    browser.close().await;
    let done = settled(&app, &id, &["COMPLETE"]).await;
    assert_eq!(done.nodes.len(), REPLICAS + 1);
}
