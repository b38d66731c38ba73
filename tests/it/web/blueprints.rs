//! The blueprints pages in real Chromium, with the process provider loaded
//! from git: the empty list, the editor (line numbers, Tab, Ctrl+S), a YAML
//! parse error and the checker's problems listed with their paths and marked
//! at their lines, a good save moving the URL to the blueprint with its
//! variables (and types), resources and warnings, routes that survive back,
//! forward and reload, an edit, the list, delete refused (CONFLICT) while a
//! deployment uses the blueprint, and the editor at 420 px.

use serde_json::json;

use crate::support::browser::{Browser, PASSWORD, set_admin_password};
use crate::support::deployments::{
    WEB, create_blueprint, deploy, destroy_and_wait, pids, settled, with_process_provider,
};
use crate::support::{TestApp, data};

const TAB: &str = "\u{e004}";
/// Control down, `s`, Control up: Ctrl+S.
const CTRL_S: &str = "\u{e009}s\u{e009}";

/// Two mistakes the checker finds: `depends_on` names a missing resource
/// (line 11), and `web` reads `db`'s outputs without depending on it (line 15).
const MISTAKE: &str = r#"version: "1"
variables:
  replicas: { type: int, default: 2 }
  greeting: { type: string, default: hello, description: What web says }
resources:
  db:
    type: process.v1.service
    config: { command: sleep, args: ["3600"] }
  web:
    type: process.v1.service
    depends_on: [dbx]
    replicas: "{{ replicas }}"
    config:
      command: sh
      env: { DB_PID: "{{ resources.db.outputs.pid }}" }
"#;

/// Not YAML: `config` is indented less than its sibling (line 5).
const NOT_YAML: &str =
    "version: \"1\"\nresources:\n  web:\n    type: process.v1.service\n   config: {}\n";

/// The mistakes fixed, a required variable, and `cache`, whose type no
/// provider serves (a warning, not an error).
const GOOD: &str = r#"version: "1"
variables:
  replicas: { type: int, default: 2 }
  greeting: { type: string, default: hello, description: What web says }
  extra: { type: object }
resources:
  db:
    type: process.v1.service
    config: { command: sleep, args: ["3600"] }
  web:
    type: process.v1.service
    depends_on: [db]
    replicas: "{{ replicas }}"
    strategy: FILL
    config:
      command: sh
      env: { DB_PID: "{{ resources.db.outputs.pid }}" }
  cache:
    type: memcache.v1.server
"#;

/// The comment Tab and typing add at the end of `GOOD`.
const TYPED: &str = "  # saved with Ctrl+S";

/// Whether the gutter marks `line` as having a problem.
fn marked(line: u32) -> String {
    format!(
        "document.querySelector('.bp-numbers [data-line=\"{line}\"]')?.classList.contains('bad')"
    )
}

async fn blueprint_count(app: &TestApp) -> i64 {
    let body = app.gql("{ blueprints { totalCount } }", json!({})).await;
    data(&body)["blueprints"]["totalCount"].as_i64().unwrap()
}

/// The blueprint id in a `/blueprints/<id>` path.
fn id_in(path: &str) -> String {
    let id = path
        .strip_prefix("/blueprints/")
        .unwrap_or_else(|| panic!("{path} is not a blueprint's page"));
    assert!(
        uuid::Uuid::parse_str(id).is_ok(),
        "{path} does not end in an id"
    );
    id.to_owned()
}

/// Waits for the saved view of GOOD: variables with types, resources, warnings.
async fn shows_saved_good(browser: &Browser) {
    browser
        .wait_text(
            "#bp-variables tr[data-name=replicas] [data-field=type]",
            "int",
        )
        .await;
    browser
        .wait_text(
            "#bp-variables tr[data-name=replicas] [data-field=default]",
            "2",
        )
        .await;
    browser
        .wait_text(
            "#bp-variables tr[data-name=greeting] [data-field=type]",
            "string",
        )
        .await;
    browser
        .wait_text(
            "#bp-variables tr[data-name=greeting] [data-field=description]",
            "What web says",
        )
        .await;
    browser
        .wait_text(
            "#bp-variables tr[data-name=extra] [data-field=type]",
            "object",
        )
        .await;
    browser
        .wait_text(
            "#bp-variables tr[data-name=extra] [data-field=default]",
            "required at deploy",
        )
        .await;
    let web = browser
        .wait_text("#bp-resources tr[data-key=web]", "process.v1.service")
        .await;
    for want in ["db", "{{ replicas }}", "FILL"] {
        assert!(web.contains(want), "web's row {web:?} lacks {want:?}");
    }
    browser
        .wait_text(
            "#bp-resources tr[data-key=db] [data-field=depends-on]",
            "nothing",
        )
        .await;
    browser
        .wait_text("#bp-resources tr[data-key=cache]", "memcache.v1.server")
        .await;
    // The process provider serves db and web; nothing serves cache.
    let warnings = browser
        .wait_text("#bp-warnings", "resources.cache.type")
        .await;
    assert!(!warnings.contains("process.v1.service"), "{warnings}");
    assert_eq!(browser.all("#bp-warnings li").await.len(), 1);
}

#[tokio::test]
async fn a_blueprint_with_mistakes_shows_them_at_their_lines_then_saves() {
    let (app, _provider, _repo) = with_process_provider(|_| {}).await;
    let browser = Browser::sign_in(&app).await;

    // No blueprints: the list says to write one.
    browser.goto("/blueprints").await;
    browser
        .wait_text("#blueprint-list .empty", "No blueprints yet")
        .await;
    browser
        .click("#blueprint-list .empty a[href='/blueprints/new']")
        .await;
    browser.find("#blueprint-form #bp-source").await;
    assert_eq!(browser.path().await, "/blueprints/new");
    // The editor numbers the starter's lines.
    browser
        .wait_js(
            "a number per line",
            "document.querySelectorAll('.bp-numbers > div').length === document.querySelector('#bp-source').value.split('\\n').length",
        )
        .await;

    // Past 32 lines the text scrolls: the numbers stay inside the editor.
    let long = (1..=60)
        .map(|i| format!("# line {i}\n"))
        .collect::<String>();
    browser.set_value("#bp-source", &long).await;
    browser
        .wait_js(
            "the gutter no taller than the text",
            "((box, area) => box.height <= area.height + 4)(document.querySelector('.bp-code').getBoundingClientRect(), \
             document.querySelector('#bp-source').getBoundingClientRect())",
        )
        .await;

    browser.fill("#bp-name", "web-and-db").await;
    browser
        .fill("#bp-description", "A web process and its db")
        .await;

    // Not YAML: the parser's message names the line, which is marked.
    browser.set_value("#bp-source", NOT_YAML).await;
    browser.click("#bp-save").await;
    let problem = browser
        .wait_text("#bp-problems li[data-line='5']", "not valid YAML")
        .await;
    assert!(problem.contains("line 5"), "{problem}");
    browser.find("#bp-problems[data-code=VALIDATION]").await;
    browser.wait_js("line 5 is marked", &marked(5)).await;

    // The checker's problems: each listed with its path, message and line,
    // and each line marked in the gutter with the message as its title.
    browser.set_value("#bp-source", MISTAKE).await;
    browser.click("#bp-save").await;
    let missing = "#bp-problems li[data-path='resources.web.depends_on[0]']";
    let text = browser.wait_text(missing, "`dbx` is not a resource").await;
    assert!(text.contains("resources.web.depends_on[0]"), "{text}");
    assert!(text.contains("line 11"), "{text}");
    browser.wait_attr(missing, "data-line", "11").await;
    let outputs = "#bp-problems li[data-path='resources.web.config.env.DB_PID']";
    let text = browser.wait_text(outputs, "does not depend on").await;
    assert!(text.contains("line 15"), "{text}");
    assert_eq!(browser.all("#bp-problems li").await.len(), 2);
    browser.wait_js("line 11 is marked", &marked(11)).await;
    browser.wait_js("line 15 is marked", &marked(15)).await;
    browser
        .wait_js("line 5 is no longer marked", &format!("!{}", marked(5)))
        .await;
    browser
        .wait_js("line 10 is not marked", &format!("!{}", marked(10)))
        .await;
    let title = browser
        .attr(".bp-numbers [data-line='11']", "title")
        .await
        .unwrap_or_default();
    assert!(title.contains("resources.web.depends_on[0]"), "{title}");
    // "line 11" selects that line in the editor.
    browser.click(&format!("{missing} button.bp-goto")).await;
    browser
        .wait_js(
            "line 11 is selected",
            "document.activeElement.id === 'bp-source' && document.activeElement.value.slice(document.activeElement.selectionStart, document.activeElement.selectionEnd) === '    depends_on: [dbx]'",
        )
        .await;
    browser
        .js("document.querySelector('#bp-problems').scrollIntoView({ block: 'end' }); return true;")
        .await;
    browser.screenshot("blueprint-editor").await;
    assert_eq!(browser.path().await, "/blueprints/new");
    assert_eq!(blueprint_count(&app).await, 0, "nothing was saved");

    // Fixed; Tab inserts two spaces; Ctrl+S saves.
    browser.set_value("#bp-source", GOOD).await;
    browser
        .js("const a = document.querySelector('#bp-source'); a.focus(); a.setSelectionRange(a.value.length, a.value.length); return true;")
        .await;
    let source = browser.find("#bp-source").await;
    source
        .send_keys(&format!("{TAB}# saved with Ctrl+S"))
        .await
        .unwrap();
    let want = format!("{GOOD}{TYPED}");
    let now = browser
        .js("return document.querySelector('#bp-source').value;")
        .await;
    assert_eq!(now, json!(want), "Tab inserts two spaces");
    source.send_keys(CTRL_S).await.unwrap();

    browser
        .wait_js(
            "the URL names the saved blueprint",
            "/^\\/blueprints\\/[0-9a-f-]{36}$/.test(location.pathname)",
        )
        .await;
    let path = browser.path().await;
    let id = id_in(&path);
    browser.wait_text("#bp-saved", "Saved “web-and-db”").await;
    browser.wait_text("h1", "web-and-db").await;
    assert!(browser.all("#bp-problems").await.is_empty());
    browser
        .wait_js(
            "no line is marked",
            "!document.querySelector('.bp-numbers .bad')",
        )
        .await;
    shows_saved_good(&browser).await;
    let deploy = browser.attr("#bp-deploy", "href").await;
    assert_eq!(
        deploy.as_deref(),
        Some(format!("/deployments/new?blueprint={id}").as_str())
    );
    let stored = app
        .gql(
            "query($id: ID!) { blueprint(id: $id) { name description source } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(
        data(&stored)["blueprint"],
        json!({ "name": "web-and-db", "description": "A web process and its db", "source": want })
    );
    browser
        .js("document.querySelector('#bp-parsed').scrollIntoView(); return true;")
        .await;
    browser.screenshot("blueprint-saved").await;

    // The new page was replaced by the blueprint's: back goes to the list.
    browser.client.back().await.unwrap();
    browser
        .wait_text(&format!("#blueprints tr[data-id='{id}']"), "web-and-db")
        .await;
    assert_eq!(browser.path().await, "/blueprints");
    browser.client.forward().await.unwrap();
    shows_saved_good(&browser).await;

    // A reload shows the same, with the source as saved.
    browser.goto(&path).await;
    shows_saved_good(&browser).await;
    let reloaded = browser
        .js("return document.querySelector('#bp-source').value;")
        .await;
    assert_eq!(reloaded, json!(want));
    assert!(browser.all("#bp-saved").await.is_empty());

    // An edit: unsaved until saved, then the page shows the new version.
    browser.fill("#bp-description", "Web, db and a cache").await;
    browser
        .wait_js(
            "unsaved changes are noted",
            "!document.querySelector('#bp-dirty').hidden",
        )
        .await;
    let one_more = want.replace(
        "  extra: { type: object }\n",
        "  extra: { type: object }\n  tier: { type: string, default: gold }\n",
    );
    browser.set_value("#bp-source", &one_more).await;
    browser.click("#bp-save").await;
    browser.wait_text("#bp-saved", "Saved").await;
    browser
        .wait_text(
            "#bp-variables tr[data-name=tier] [data-field=type]",
            "string",
        )
        .await;
    browser
        .wait_js(
            "saved changes are not noted",
            "document.querySelector('#bp-dirty').hidden",
        )
        .await;
    assert_eq!(browser.path().await, path);

    // The list: name (a link), description, counts, variables with types.
    browser.goto("/blueprints").await;
    let row = format!("#blueprints tr[data-id='{id}']");
    let text = browser.wait_text(&row, "Web, db and a cache").await;
    for want in [
        "web-and-db",
        "replicas: int",
        "extra: object",
        "tier: string",
    ] {
        assert!(text.contains(want), "the row {text:?} lacks {want:?}");
    }
    browser
        .wait_text(&format!("{row} [data-field=resources]"), "3")
        .await;
    browser
        .wait_text(&format!("{row} [data-field=warnings]"), "1")
        .await;
    browser.screenshot("blueprints-list").await;
    browser.click(&format!("{row} a")).await;
    shows_saved_good(&browser).await;
    assert_eq!(browser.path().await, path);

    browser.close().await;
}

#[tokio::test]
async fn deleting_a_blueprint_is_refused_while_a_deployment_uses_it() {
    let (app, _provider, _repo) = with_process_provider(|_| {}).await;
    let id = create_blueprint(&app, "in-use", WEB).await;
    let deployment = deploy(&app, &id, "uses-it", json!({})).await;
    let running = settled(&app, &deployment, &["COMPLETE", "FAILED"]).await;
    assert_eq!(running.state, "COMPLETE", "{:?}", running.error);
    let browser = Browser::sign_in(&app).await;

    browser.goto(&format!("/blueprints/{id}")).await;
    browser.wait_text("h1", "in-use").await;
    // The question takes the focus; Escape closes it, and the focus goes
    // back to the button.
    browser.click("#bp-delete").await;
    browser
        .wait_js(
            "the focus in the confirmation",
            "document.activeElement.closest('#bp-delete-confirm') !== null",
        )
        .await;
    browser
        .find(":focus")
        .await
        .send_keys("\u{E00C}")
        .await
        .unwrap();
    browser
        .wait_js(
            "the confirmation closed by Escape",
            "document.querySelector('#bp-delete-confirm').hidden && document.activeElement.id === 'bp-delete'",
        )
        .await;
    // Cancel keeps it.
    browser.click("#bp-delete").await;
    browser.click("#bp-delete-no").await;
    browser
        .wait_js(
            "the confirmation is gone",
            "document.querySelector('#bp-delete-confirm').hidden",
        )
        .await;
    // Refused where it was clicked, with the code.
    browser.click("#bp-delete").await;
    browser
        .wait_text("#bp-delete-confirm", "This cannot be undone")
        .await;
    browser.click("#bp-delete-yes").await;
    browser
        .wait_text(
            "#bp-delete-confirm .error[data-code=CONFLICT]",
            "not destroyed",
        )
        .await;
    browser
        .js("document.querySelector('#bp-delete-confirm').scrollIntoView({ block: 'end' }); return true;")
        .await;
    browser.screenshot("blueprint-delete-refused").await;
    assert_eq!(blueprint_count(&app).await, 1);
    // Asked again, the old refusal is gone.
    browser.click("#bp-delete-no").await;
    browser.click("#bp-delete").await;
    browser
        .wait_js(
            "the old error cleared",
            "!document.querySelector('#bp-delete-confirm').hidden && !document.querySelector('#bp-delete-confirm .error')",
        )
        .await;

    destroy_and_wait(&app, &deployment, &pids(&running)).await;
    browser.click("#bp-delete-yes").await;
    browser
        .wait_text("#bp-deleted", "Deleted blueprint “in-use”")
        .await;
    assert_eq!(browser.path().await, "/blueprints");
    browser
        .wait_text("#blueprint-list .empty", "No blueprints yet")
        .await;
    assert_eq!(blueprint_count(&app).await, 0);

    browser.close().await;
}

/// Chromium's window is at least 500 px wide; a 420 px screen is emulated.
async fn narrow(app: &TestApp, width: u32) -> Browser {
    set_admin_password(app).await;
    let browser = Browser::open_sized(app, width).await;
    browser.sign_in_as("admin", PASSWORD).await;
    let inner = browser.js("return window.innerWidth;").await;
    assert_eq!(inner, json!(width), "the page is {inner} px wide");
    browser
}

#[tokio::test]
async fn the_blueprint_editor_fits_a_420_px_screen() {
    let app = TestApp::spawn().await;
    let browser = narrow(&app, 420).await;
    let fits = "document.documentElement.scrollWidth <= 420";

    browser.goto("/blueprints/new").await;
    browser.find("#bp-source").await;
    browser.wait_js("the new editor fits", fits).await;
    browser
        .fill(
            "#bp-name",
            "a-blueprint-with-a-rather-long-name-for-a-narrow-screen",
        )
        .await;
    let long = MISTAKE.replace(
        "depends_on: [dbx]",
        "depends_on: [a-resource-with-a-very-long-name-that-is-not-in-this-blueprint]",
    );
    browser.set_value("#bp-source", &long).await;
    browser.click("#bp-save").await;
    browser
        .wait_attr(
            "#bp-problems li[data-path='resources.web.depends_on[0]']",
            "data-line",
            "11",
        )
        .await;
    browser.wait_js("line 11 is marked", &marked(11)).await;
    browser
        .js("document.querySelector('#bp-problems').scrollIntoView({ block: 'end' }); return true;")
        .await;
    browser.screenshot("blueprint-editor-narrow").await;
    let width = browser
        .js("return document.documentElement.scrollWidth;")
        .await;
    assert!(
        width.as_i64().unwrap_or(i64::MAX) <= 420,
        "the editor with problems is {width} px wide"
    );

    browser.set_value("#bp-source", GOOD).await;
    browser.click("#bp-save").await;
    browser
        .wait_text(
            "#bp-variables tr[data-name=replicas] [data-field=type]",
            "int",
        )
        .await;
    browser.wait_js("the saved blueprint fits", fits).await;
    browser
        .js("document.querySelector('#bp-parsed').scrollIntoView(); return true;")
        .await;
    browser.screenshot("blueprint-saved-narrow").await;

    browser.goto("/blueprints").await;
    browser.find("#blueprints").await;
    browser.wait_js("the list fits", fits).await;

    browser.close().await;
}
