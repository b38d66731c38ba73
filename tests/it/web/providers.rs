//! The providers pages in real Chromium, against a real provider fetched
//! from git: the empty list, the create form (its errors, the token shown
//! once, the secret value never shown again), the detail page following the
//! provider live to CONNECTED with its log, resource types and node capacity,
//! the list's status changing in place, and every action with its error
//! where it was clicked. The detail page fits 420 px.

use serde_json::{Value, json};

use crate::support::browser::{Browser, PASSWORD, set_admin_password};
use crate::support::provider_repos::{ProviderRepo, process_metadata};
use crate::support::providers::{create_provider, spawn_quick, wait_status};
use crate::support::{TestApp, data};

/// The secret configuration value: typed once, never to be seen again.
const SECRET_VALUE: &str = "hunter2-console-secret-value";

/// True in the page if the secret value is anywhere in its text or markup.
const SECRET_SHOWN: &str = "document.body.innerText.includes('hunter2-console-secret-value') \
     || document.documentElement.outerHTML.includes('hunter2-console-secret-value')";

/// Marks the document; the mark survives anything but a reload.
const MARK: &str = "window.__notReloaded = true; return true;";
const MARKED: &str = "window.__notReloaded === true";

async fn unload_via_api(app: &TestApp, id: &str) {
    let body = app
        .gql(
            "mutation($id: ID!) { unloadProvider(id: $id) { status } }",
            json!({ "id": id }),
        )
        .await;
    data(&body);
}

async fn delete_via_api(app: &TestApp, id: &str) {
    let body = app
        .gql(
            "mutation($id: ID!) { deleteProvider(id: $id) }",
            json!({ "id": id }),
        )
        .await;
    data(&body);
}

/// Makes the window as tall as the page (at least `min` px), for a
/// screenshot of all of it.
async fn fit_height(browser: &Browser, min: i64) {
    let height = browser
        .js("return Math.ceil(document.querySelector('main').getBoundingClientRect().bottom + scrollY) \
             + 16 + outerHeight - innerHeight;")
        .await
        .as_i64()
        .expect("a height");
    browser
        .client
        .set_window_size(1280, height.max(min) as u32)
        .await
        .expect("the window resized");
}

async fn load_via_api(app: &TestApp, id: &str) {
    let body = app
        .gql(
            "mutation($id: ID!) { loadProvider(id: $id) { status } }",
            json!({ "id": id }),
        )
        .await;
    data(&body);
}

#[tokio::test]
async fn a_provider_is_created_followed_live_and_managed_in_the_browser() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let browser = Browser::sign_in(&app).await;

    // No providers yet: the list says what to do, with a link.
    browser.goto("/providers").await;
    browser
        .wait_text("#providers-empty", "No providers yet")
        .await;
    browser
        .find("#providers-empty a[href='/providers/new']")
        .await;
    browser.click("#add-provider").await;
    browser.find("#provider-form").await;
    assert_eq!(browser.path().await, "/providers/new");

    // A configuration that is not JSON is refused beside the form, with its code.
    browser.fill("#provider-form [name=name]", "process").await;
    browser
        .fill("#provider-form [name=gitUrl]", &repo.url())
        .await;
    browser
        .set_value("#provider-form [name=config]", "{capacity: 7")
        .await;
    browser.click("#provider-form button[type=submit]").await;
    browser
        .wait_attr("#provider-form .error", "data-code", "VALIDATION")
        .await;
    browser
        .wait_text("#provider-form .error", "Configuration")
        .await;

    // Fixed, with a secret value and not loaded at once: created, and the
    // token is shown this once.
    browser
        .set_value("#provider-form [name=config]", r#"{"capacity": 7}"#)
        .await;
    browser
        .set_value(
            "#provider-form [name=secretConfig]",
            &format!(r#"{{"password": "{SECRET_VALUE}"}}"#),
        )
        .await;
    browser.click("#provider-form [name=autoLoad]").await;
    browser.click("#provider-form button[type=submit]").await;
    let token = browser.text("#provider-token").await;
    assert!(token.starts_with("cbp_"), "{token}");
    browser
        .wait_text("#provider-created", "shown this once")
        .await;
    assert_eq!(
        browser.js(&format!("return {SECRET_SHOWN};")).await,
        json!(false)
    );
    assert!(browser.all("#provider-form").await.is_empty());

    // The detail page, without a reload: UNLOADED until Load is clicked, then
    // every status as it happens, up to CONNECTED.
    browser.click("#open-provider").await;
    browser
        .wait_attr("#provider-status", "data-state", "UNLOADED")
        .await;
    browser.wait_text("[data-field=autoLoad]", "no").await;
    browser.js(MARK).await;
    browser
        .js("window.__states = []; \
             new MutationObserver(() => window.__states.push( \
               document.querySelector('#provider-status').dataset.state)) \
             .observe(document.querySelector('#provider-status-slot'), { childList: true }); \
             return true;")
        .await;
    browser.click("#load").await;
    browser
        .wait_attr("#provider-status", "data-state", "CONNECTED")
        .await;
    browser.wait_js("the page was not reloaded", MARKED).await;
    let states = browser.js("return window.__states;").await;
    let states: Vec<String> = serde_json::from_value(states).unwrap();
    assert_eq!(
        states.last().map(String::as_str),
        Some("CONNECTED"),
        "{states:?}"
    );
    assert!(
        states
            .iter()
            .any(|s| ["FETCHING", "BUILDING", "STARTING", "REGISTERING"].contains(&s.as_str())),
        "the badge went through the loading states live: {states:?}"
    );

    // The build and run output, and Corbel's own notes, arrive in the log.
    browser
        .wait_text(
            "#provider-logs .line[data-stream=build]",
            "building the process provider",
        )
        .await;
    browser
        .wait_text("#provider-logs .line[data-stream=corbel]", "registered")
        .await;

    // Facts, metadata, resource types and the node with its capacity bar.
    browser
        .wait_text("[data-field=resolvedCommit]", &repo.head())
        .await;
    browser.wait_text("[data-field=runtime]", "shell").await;
    browser
        .wait_text("#resource-types", "process.v1.service")
        .await;
    browser
        .wait_attr(
            "#provider-nodes .cap[data-type='process.v1.service']",
            "data-count",
            "7",
        )
        .await;
    browser
        .wait_text("#provider-nodes .cap .count", "0 of 7")
        .await;
    browser
        .wait_js(
            "nothing used: an empty bar",
            "document.querySelector('#provider-nodes .cap .bar').getBoundingClientRect().width > 20 && \
             document.querySelector('#provider-nodes .cap .bar > span').getBoundingClientRect().width === 0",
        )
        .await;

    // The secret's key is shown; its value nowhere.
    browser.wait_text("#secret-keys", "password").await;
    assert_eq!(
        browser.js(&format!("return {SECRET_SHOWN};")).await,
        json!(false)
    );
    assert_eq!(
        browser
            .js(&format!(
                "return document.body.innerText.includes('{token}');"
            ))
            .await,
        json!(false)
    );
    // Tall enough for the whole page, the log included.
    fit_height(&browser, 900).await;
    browser.js("window.scrollTo(0, 0); return true;").await;
    browser.screenshot("provider-detail").await;
    browser.client.set_window_size(1280, 900).await.unwrap();

    // The list. A provider made elsewhere appears at once; statuses then
    // change in place, without a reload.
    // Through the navigation: the detail page's socket closes as the list's
    // subscription starts on a new one.
    browser.click("header nav a[href='/providers']").await;
    let row = "#provider-list tr[data-name=process]";
    browser
        .wait_attr(&format!("{row} .badge"), "data-state", "CONNECTED")
        .await;
    browser.js(MARK).await;
    browser
        .wait_text(&format!("{row} td.source"), &repo.url())
        .await;
    let id: String = browser
        .attr(row, "data-id")
        .await
        .expect("the row names its provider");
    let (other, _) = create_provider(
        &app,
        json!({ "name": "process-two", "gitUrl": repo.url(), "ref": "v1", "autoLoad": false }),
    )
    .await;
    // Made (not loaded): it appears at once, UNLOADED (ProviderCreated).
    let other_row = "#provider-list tr[data-name=process-two]";
    browser
        .wait_attr(&format!("{other_row} .badge"), "data-state", "UNLOADED")
        .await;
    load_via_api(&app, &other).await;
    browser
        .wait_attr(&format!("{other_row} .badge"), "data-state", "CONNECTED")
        .await;
    browser
        .js(&format!(
            "document.querySelector('{other_row}').__same = true; return true;"
        ))
        .await;
    unload_via_api(&app, &other).await;
    browser
        .wait_attr(&format!("{other_row} .badge"), "data-state", "UNLOADED")
        .await;
    browser
        .wait_js(
            "the row was updated in place",
            &format!("document.querySelector('{other_row}').__same === true"),
        )
        .await;
    browser.wait_js("the list was not reloaded", MARKED).await;
    fit_height(&browser, 420).await;
    browser.screenshot("providers-list").await;
    browser.client.set_window_size(1280, 900).await.unwrap();
    delete_via_api(&app, &other).await;
    // Deleted: its row goes (ProviderDeleted), the page stays.
    browser
        .wait_js(
            "the deleted provider's row goes",
            &format!("!document.querySelector('{other_row}')"),
        )
        .await;
    browser.wait_js("the list was not reloaded", MARKED).await;

    // Delete while loaded: refused, the CONFLICT shown where it was clicked.
    browser.click(&format!("{row} a.name")).await;
    browser
        .wait_attr("#provider-status", "data-state", "CONNECTED")
        .await;
    browser.click("#delete").await;
    browser.click("#delete-confirm").await;
    browser
        .wait_attr("#delete-error .error", "data-code", "CONFLICT")
        .await;

    // Unload: UNLOADED live, and the nodes say calmly they are not available.
    browser.click("#unload").await;
    browser
        .wait_attr("#provider-status", "data-state", "UNLOADED")
        .await;
    browser
        .wait_attr(
            "#provider-nodes [data-code]",
            "data-code",
            "PROVIDER_UNAVAILABLE",
        )
        .await;
    assert!(browser.all("#provider-nodes .error").await.is_empty());

    // Rotate the token: confirmed, then the new one shown once.
    browser.click("#rotate").await;
    browser.click("#rotate-confirm").await;
    let rotated = browser.text("#rotated-token").await;
    assert!(rotated.starts_with("cbp_") && rotated != token, "{rotated}");

    // Edit the configuration: bad JSON is refused with its code; an empty
    // secret field keeps the secret values.
    browser.click("#edit-config").await;
    browser
        .set_value("#config-form [name=config]", "[1, 2")
        .await;
    browser.click("#config-form button[type=submit]").await;
    browser
        .wait_attr("#config-form .error", "data-code", "VALIDATION")
        .await;
    browser
        .set_value("#config-form [name=config]", r#"{"capacity": 3}"#)
        .await;
    browser.click("#config-form button[type=submit]").await;
    browser
        .wait_text("#provider-config", "\"capacity\": 3")
        .await;
    browser.wait_text("#secret-keys", "password").await;
    let stored = app
        .gql(
            "query($id: ID!) { provider(id: $id) { config secretConfigKeys } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(
        data(&stored)["provider"],
        json!({ "config": { "capacity": 3 }, "secretConfigKeys": ["password"] })
    );
    assert_eq!(
        browser.js(&format!("return {SECRET_SHOWN};")).await,
        json!(false)
    );

    // A second provider with the same name: the server's CONFLICT beside the form.
    browser.goto("/providers/new").await;
    browser.fill("#provider-form [name=name]", "process").await;
    browser
        .fill("#provider-form [name=gitUrl]", &repo.url())
        .await;
    browser.click("#provider-form [name=autoLoad]").await;
    browser.click("#provider-form button[type=submit]").await;
    browser
        .wait_attr("#provider-form .error", "data-code", "CONFLICT")
        .await;

    // Delete, now that it is unloaded: back to an empty list.
    browser.goto(&format!("/providers/{id}")).await;
    browser
        .wait_attr("#provider-status", "data-state", "UNLOADED")
        .await;
    browser.click("#delete").await;
    browser.click("#delete-confirm").await;
    browser
        .wait_text("#providers-empty", "No providers yet")
        .await;
    assert_eq!(browser.path().await, "/providers");
    let left = app.gql("{ providers { totalCount } }", json!({})).await;
    assert_eq!(data(&left)["providers"]["totalCount"], json!(0));

    browser.close().await;
}

#[tokio::test]
async fn the_provider_pages_fit_a_420_px_screen() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, _token) = create_provider(
        &app,
        json!({
            "name": "process-with-a-rather-long-name-for-a-narrow-screen",
            "gitUrl": repo.url(),
            "config": { "capacity": 12 },
            "secretConfig": { "password": SECRET_VALUE },
        }),
    )
    .await;
    wait_status(&app, &id, "CONNECTED").await;
    set_admin_password(&app).await;
    let browser = Browser::open_sized(&app, 420).await;
    // Chromium starts no narrower than 500 px whatever `--window-size`
    // says; resizing the window afterwards gives the 420 px asked for.
    browser
        .client
        .set_window_size(420, 900)
        .await
        .expect("a 420 px window");
    assert_eq!(
        browser.js("return window.innerWidth;").await,
        json!(420),
        "the window is 420 px wide"
    );
    browser.sign_in_as("admin", PASSWORD).await;

    browser.goto(&format!("/providers/{id}")).await;
    browser
        .wait_attr("#provider-status", "data-state", "CONNECTED")
        .await;
    browser
        .wait_attr("#provider-nodes .cap", "data-count", "12")
        .await;
    browser
        .wait_text("#provider-logs .line[data-stream=build]", "building")
        .await;
    browser
        .wait_text("[data-field=resolvedCommit]", &repo.head())
        .await;
    let fits = "document.documentElement.scrollWidth <= 420";
    let width = |v: Value| v.as_i64().unwrap_or(-1);
    let measured = width(
        browser
            .js("return document.documentElement.scrollWidth;")
            .await,
    );
    browser.screenshot("provider-detail-narrow").await;
    assert!(measured <= 420, "the detail page is {measured} px wide");
    browser.wait_js("the detail page fits", fits).await;

    // The list and the create form fit too.
    browser.goto("/providers").await;
    browser
        .wait_attr("#provider-list .badge", "data-state", "CONNECTED")
        .await;
    browser.wait_js("the list fits", fits).await;
    browser.goto("/providers/new").await;
    browser.find("#provider-form").await;
    browser.wait_js("the create form fits", fits).await;

    browser.close().await;
}
