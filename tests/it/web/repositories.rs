//! The repositories and elements pages in real Chromium, against a repository
//! served by a real nginx: the empty list, a repository added through the form
//! (http driver) whose sync ends on its page live, its invalid entry listed, a
//! refresh seen live on its page and on the list (no reload), an element found
//! by a search kept in the URL, the install preview drawn as a tree (the
//! dependency nested under what requires it, what is already installed
//! marked), install, an uninstall refused with `HAS_DEPENDENTS` naming the
//! dependent, an upgrade to a chosen version, an artifact downloaded with the
//! session cookie, and the element page at 420 px.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use crate::support::browser::Browser;
use crate::support::nginx::Nginx;
use crate::support::repositories::{element_ids, put_element, write_inventory};
use crate::support::{TestApp, data};

/// The elements served at first: `web` needs `lib` and `core`, `lib` needs
/// `core`; and one entry whose version is not valid.
fn served(root: &Path) -> Vec<Value> {
    vec![
        put_element(root, "core", "1.0.0", json!({}), &[]),
        put_element(
            root,
            "core",
            "1.1.0",
            json!({}),
            &[("images", "img-1", "core.qcow2")],
        ),
        put_element(
            root,
            "lib",
            "1.0.0",
            json!({"core": {"from_version": "1.0.0", "to_version": "2.0.0"}}),
            &[],
        ),
        put_element(
            root,
            "web",
            "1.0.0",
            json!({"lib": {}, "core": {"from_version": "1.0.0"}}),
            &[],
        ),
        put_element(
            root,
            "web",
            "1.1.0",
            json!({"lib": {}, "core": {"from_version": "1.0.0"}}),
            &[],
        ),
        json!({"name": "bad", "version": "1.0"}),
    ]
}

/// `"name version"` → installed, for every element.
async fn installed(app: &TestApp) -> BTreeMap<String, bool> {
    let body = app
        .gql(
            "{ elements(first: 500) { nodes { name version installed } } }",
            json!({}),
        )
        .await;
    data(&body)["elements"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                format!(
                    "{} {}",
                    n["name"].as_str().unwrap(),
                    n["version"].as_str().unwrap()
                ),
                n["installed"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// Waits until the page has drawn everything it was loading.
async fn settled(browser: &Browser) {
    browser
        .wait_js(
            "the page is drawn",
            "document.body.dataset.ready && !document.querySelector('[aria-busy]')",
        )
        .await;
}

/// The page at 420 px: the document does not scroll sideways.
async fn fits_420(browser: &Browser, what: &str) {
    browser
        .client
        .set_window_size(420, 900)
        .await
        .expect("a narrow window");
    browser
        .wait_js("the page is 420 px wide", "window.innerWidth === 420")
        .await;
    let width = browser
        .js("return document.documentElement.scrollWidth;")
        .await;
    assert!(
        width.as_i64().is_some_and(|w| w <= 420),
        "{what} scrolls sideways at 420 px: {width} px wide"
    );
    browser
        .client
        .set_window_size(1280, 900)
        .await
        .expect("a wide window again");
}

#[tokio::test]
async fn a_repository_syncs_live_and_its_elements_are_previewed_installed_refused_and_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut entries = served(root);
    write_inventory(root, &entries);
    let nginx = Nginx::start(root);
    let app = TestApp::spawn().await;
    let browser = Browser::sign_in(&app).await;

    // No repository yet: the list says to add one.
    browser.click("header nav a[href='/repositories']").await;
    browser
        .wait_text("#repositories-body .empty", "Add one")
        .await;

    // Added through the form; its page shows the sync end, live.
    browser.click("#add-repository").await;
    browser.fill("#repository-form [name=name]", "main").await;
    browser
        .select("#repository-form [name=driver]", "http")
        .await;
    browser
        .fill("#repository-form [name=url]", &nginx.url())
        .await;
    browser
        .select("#repository-form [name=syncMode]", "COPY")
        .await;
    // A reload would forget this.
    browser.js("window.notReloaded = true;").await;
    browser.click("#repository-form button[type=submit]").await;
    browser.wait_attr("#sync", "data-state", "ACTIVE").await;
    let count = |field: &str, n: u32| {
        format!(
            "document.querySelector('#sync-progress [data-field={field}] strong')?.textContent === '{n}'"
        )
    };
    browser.wait_js("6 entries seen", &count("seen", 6)).await;
    browser
        .wait_js("5 elements stored", &count("stored", 5))
        .await;
    browser
        .wait_js("1 invalid entry", &count("invalid", 1))
        .await;
    let path = browser.path().await;
    let id = path
        .strip_prefix("/repositories/")
        .unwrap_or_else(|| panic!("the form led to {path}"))
        .to_owned();
    browser
        .wait_text(
            "#invalid-elements tr[data-path='inventory.json#/elements/bad/1.0']",
            "Version `1.0` is invalid",
        )
        .await;
    browser
        .find("#repository-elements li[data-name='web'][data-version='1.1.0']")
        .await;

    // A refresh that finds a new element: the counts, and the element list
    // (read again only when the sync's end event arrives), change in place.
    entries.push(put_element(root, "tools", "1.0.0", json!({}), &[]));
    write_inventory(root, &entries);
    browser.click("#refresh").await;
    browser
        .wait_js("6 elements stored", &count("stored", 6))
        .await;
    browser
        .find("#repository-elements li[data-name='tools']")
        .await;
    browser.wait_attr("#sync", "data-state", "ACTIVE").await;
    assert_eq!(
        browser.js("return window.notReloaded === true;").await,
        json!(true),
        "the page was reloaded"
    );
    settled(&browser).await;
    browser.screenshot("repository-detail").await;

    // The list follows a sync started elsewhere (here, through the API).
    browser.click("header nav a[href='/repositories']").await;
    let row = format!("#repositories tr[data-id='{id}']");
    browser
        .wait_text(&format!("{row} [data-field=progress]"), "7 / 6")
        .await;
    entries.push(put_element(root, "extra", "1.0.0", json!({}), &[]));
    write_inventory(root, &entries);
    data(
        &app.gql(
            "mutation($id: ID!) { refreshRepository(id: $id) { id } }",
            json!({"id": id}),
        )
        .await,
    );
    browser
        .wait_text(&format!("{row} [data-field=progress]"), "8 / 7")
        .await;
    browser
        .wait_attr(
            &format!("{row} [data-field=status] .badge"),
            "data-state",
            "ACTIVE",
        )
        .await;
    assert_eq!(
        browser.js("return window.notReloaded === true;").await,
        json!(true),
        "the list was reloaded"
    );

    // core 1.1.0 installed beforehand, for the preview's "already installed".
    let ids = element_ids(&app, &id).await;
    data(
        &app.gql(
            "mutation($id: ID!) { installElement(id: $id) { id } }",
            json!({"id": ids["core 1.1.0"]}),
        )
        .await,
    );

    // The search is in the URL, so a reload keeps it.
    browser.click("header nav a[href='/elements']").await;
    browser.fill("#element-search [name=search]", "we").await;
    browser.click("#element-search button[type=submit]").await;
    browser
        .wait_js(
            "the search in the URL",
            "location.pathname + location.search === '/elements?search=we'",
        )
        .await;
    browser.find("#elements tr[data-name='web']").await;
    settled(&browser).await;
    assert!(
        browser
            .all("#elements tr[data-name='core']")
            .await
            .is_empty()
    );
    browser.goto("/elements?search=we").await;
    browser
        .wait_js(
            "the reloaded page keeps the search",
            "document.querySelector('#element-search [name=search]')?.value === 'we' \
             && document.querySelector('#elements tr[data-name=web]')",
        )
        .await;
    browser
        .click("#elements tr[data-name='web'] a[data-version='1.0.0']")
        .await;

    // The preview: web at the root, lib under it, core (installed) under
    // both; nothing is installed by looking.
    let web = "#resolve-tree > li[data-name='web'][data-version='1.0.0'][data-installed='false']";
    browser.find(web).await;
    let lib = format!("{web} > ul > li[data-name='lib'][data-installed='false']");
    browser.find(&lib).await;
    let core_under_lib =
        format!("{lib} > ul > li[data-name='core'][data-version='1.1.0'][data-installed='true']");
    browser
        .wait_text(&core_under_lib, "already installed")
        .await;
    browser
        .find(&format!(
            "{web} > ul > li[data-name='core'][data-version='1.1.0'][data-installed='true']"
        ))
        .await;
    assert!(
        browser
            .text(&format!("{lib} > .plan-node"))
            .await
            .contains("will be installed")
    );
    browser
        .wait_text("#plan-summary", "2 to install, 1 already installed")
        .await;
    settled(&browser).await;
    browser.screenshot("element-resolve-preview").await;
    assert!(!installed(&app).await["lib 1.0.0"]);
    fits_420(&browser, "the install preview").await;

    // Install: the page shows it installed, with what came with it.
    browser.click("#install").await;
    browser
        .wait_attr("#element-state", "data-installed", "true")
        .await;
    browser.find("#dependencies li[data-name='lib']").await;
    let now = installed(&app).await;
    assert!(
        now["web 1.0.0"] && now["lib 1.0.0"] && now["core 1.1.0"],
        "{now:?}"
    );

    // lib is needed by web: refused, with the code and the dependent named.
    browser.click("#dependencies li[data-name='lib'] a").await;
    browser.wait_text("main h1", "lib 1.0.0").await;
    settled(&browser).await;
    browser.click("#uninstall").await;
    browser.click("#confirm-uninstall").await;
    let refused = browser
        .wait_text("#actions .error[data-code='HAS_DEPENDENTS']", "web 1.0.0")
        .await;
    assert!(refused.contains("HAS_DEPENDENTS"), "{refused}");
    // The dependents are named from the error's `extensions`, not only its message.
    assert!(refused.contains("Needed by: web 1.0.0"), "{refused}");
    assert!(installed(&app).await["lib 1.0.0"]);

    // Back to web, upgraded to the version chosen.
    browser.client.back().await.expect("back");
    browser.wait_text("main h1", "web 1.0.0").await;
    settled(&browser).await;
    browser.select("#upgrade-to", &ids["web 1.1.0"]).await;
    browser.click("#upgrade").await;
    browser
        .wait_js(
            "the upgraded version's page",
            &format!("location.pathname === '/elements/{}'", ids["web 1.1.0"]),
        )
        .await;
    browser.wait_text("main h1", "web 1.1.0").await;
    browser
        .wait_attr("#element-state", "data-installed", "true")
        .await;
    let now = installed(&app).await;
    assert!(now["web 1.1.0"] && !now["web 1.0.0"], "{now:?}");
    settled(&browser).await;
    fits_420(&browser, "an installed element").await;

    // An artifact's link serves the file to the signed-in browser.
    browser.click("#dependencies li[data-name='core'] a").await;
    let link = "#artifacts tr[data-urn='images:img-1'] a";
    browser.wait_text(link, "core.qcow2").await;
    let body = browser
        .client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             fetch(document.querySelector(arguments[0]).href)
               .then(r => r.text().then(t => done(r.status + ' ' + t)))
               .catch(e => done(String(e)));",
            vec![json!(link)],
        )
        .await
        .expect("the artifact is fetched");
    assert_eq!(body, json!("200 contents of core.qcow2"));

    assert!(browser.foreign_requests().await.is_empty());
    browser.close().await;
}
