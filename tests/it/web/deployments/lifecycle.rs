//! A deployment's life in the browser, with the process provider loaded
//! from git: the empty list, the deploy form generated from a blueprint's
//! variables (its error beside it, the capacity preview as bars), the detail
//! page drawing the DAG and following it live from `deploymentEvents` (a
//! deployment that waits for its provider, then every node reaching
//! COMPLETE without a reload), a node's panel by keyboard, the lease, a
//! redeploy of one resource (and a destroy refused meanwhile), the destroy
//! with its confirmation, and the list's filters in the URL. The processes
//! are checked too, not only the page. The detail page fits 420 px.

use serde_json::json;

use super::{MARK, MARKED, node};
use crate::support::browser::{Browser, PASSWORD};
use crate::support::data;
use crate::support::deployments::{
    create_blueprint, deploy, deployment, destroy_and_wait, pids, with_process_provider_config,
};
use crate::support::processes::{alive, all_gone, parent, provider_pid};
use crate::support::providers::wait_status;

/// `db` and `cache`, then `web` (2 replicas) depending on both. On SIGTERM,
/// `web` and `cache` wait for their gate file (`{gate}/web`, `{gate}/cache`)
/// before they exit, or for the gate directory to be gone (a failed test).
/// The provider's grace outlasts any wait of the test, so each of their
/// destroys stays open until the test opens the gate. That is how the page
/// is seen DESTROYING, refused a destroy meanwhile, and seen with `web` and
/// `db` DESTROYED while the deployment is still DESTROYING (which only the
/// node events can show), however slow the browser is.
const BLUEPRINT: &str = r#"
version: "1"
variables:
  replicas: { type: int, default: 1, description: "How many web servers" }
  greeting: { type: string, description: "What web says" }
  verbose: { type: bool, default: false }
resources:
  db:
    type: process.v1.service
    config: { command: sleep, args: ["300"] }
  cache:
    type: process.v1.service
    config: { command: sh, args: ["-c", "trap 'until [ -e {gate}/cache ] || [ ! -d {gate} ]; do sleep 0.1; done; exit 0' TERM; while :; do sleep 1; done"] }
  web:
    type: process.v1.service
    depends_on: [db, cache]
    replicas: "{{ replicas }}"
    strategy: AUTO
    config:
      command: sh
      args: ["-c", "trap 'until [ -e {gate}/web ] || [ ! -d {gate} ]; do sleep 0.1; done; exit 0' TERM; while :; do sleep 1; done"]
      env: { DB_PID: "{{ resources.db.outputs.pid }}", GREETING: "{{ greeting }}", VERBOSE: "{{ verbose }}" }
"#;

const NODES: [&str; 4] = ["db[0]", "cache[0]", "web[0]", "web[1]"];

/// A `datetime-local` value `ms` from now, in the browser's time zone.
fn local_time_in(ms: i64) -> String {
    format!(
        "const t = new Date(Date.now() + ({ms})); \
         t.setMinutes(t.getMinutes() - t.getTimezoneOffset()); \
         return t.toISOString().slice(0, 16);"
    )
}

/// Processes whose parent is `pid`.
fn children(pid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| parent(*p) == Some(pid) && alive(*p))
        .collect()
}

async fn provider_call(app: &crate::support::TestApp, mutation: &str, id: &str) {
    let body = app
        .gql(
            &format!("mutation($id: ID!) {{ {mutation}(id: $id) {{ status }} }}"),
            json!({ "id": id }),
        )
        .await;
    data(&body);
}

#[tokio::test]
async fn a_deployment_is_made_followed_live_redeployed_and_destroyed_in_the_browser() {
    // The grace outlasts every wait of the test: the gates end the destroys.
    let (app, provider, _repo) =
        with_process_provider_config(|_| {}, json!({ "capacity": 50, "grace_ms": 600_000 })).await;
    let gate = tempfile::tempdir().unwrap();
    let open_gate = |name: &str| std::fs::write(gate.path().join(name), b"").unwrap();
    let source = BLUEPRINT.replace("{gate}", gate.path().to_str().unwrap());
    let blueprint = create_blueprint(&app, "web-and-db", &source).await;
    let browser = Browser::sign_in(&app).await;

    // Nothing deployed yet: the list says how to deploy.
    browser.goto("/deployments").await;
    browser
        .wait_text("#deployments .empty", "No deployments yet")
        .await;
    browser
        .find("#deployments .empty a[href='/blueprints']")
        .await;

    // The form is generated from the blueprint's variables.
    browser
        .goto(&format!("/deployments/new?blueprint={blueprint}"))
        .await;
    let replicas = browser.find("#variables input[data-var=replicas]").await;
    assert_eq!(
        replicas.attr("type").await.unwrap().as_deref(),
        Some("number")
    );
    assert_eq!(replicas.prop("value").await.unwrap().as_deref(), Some("1"));
    let greeting = browser.find("#variables input[data-var=greeting]").await;
    assert!(
        greeting.attr("required").await.unwrap().is_some(),
        "no default: required"
    );
    let verbose = browser.find("#variables input[data-var=verbose]").await;
    assert_eq!(
        verbose.attr("type").await.unwrap().as_deref(),
        Some("checkbox")
    );
    browser
        .wait_text("#variables", "How many web servers")
        .await;
    assert_eq!(
        browser
            .find("#deploy-form select[name=blueprint]")
            .await
            .prop("value")
            .await
            .unwrap()
            .as_deref(),
        Some(blueprint.as_str())
    );

    browser.fill("#variables [data-var=replicas]", "2").await;
    browser
        .fill("#variables [data-var=greeting]", "hello <world>")
        .await;
    browser.click("#variables [data-var=verbose]").await;
    browser.fill("#deploy-form [name=name]", "shop").await;

    // Capacity preview: one bar per provider node, with the count; the
    // variables of the form go with it (replicas: 2, then 3).
    browser
        .select("#capacity select[name=resource]", "web")
        .await;
    browser
        .select("#capacity select[name=strategy]", "AUTO")
        .await;
    browser
        .wait_attr("#capacity-bars li[data-node=vm]", "data-count", "2")
        .await;
    browser.fill("#variables [data-var=replicas]", "3").await;
    browser.click("#capacity-calc").await;
    browser
        .wait_attr("#capacity-bars li[data-node=vm]", "data-count", "3")
        .await;
    browser.fill("#variables [data-var=replicas]", "2").await;
    browser.click("#capacity-calc").await;
    browser
        .wait_attr("#capacity-bars li[data-node=vm]", "data-count", "2")
        .await;
    assert_eq!(browser.all("#capacity-bars li .bar > span").await.len(), 1);

    browser.screenshot("deployment-form").await;

    // A lease in the past is refused beside the form, with its code.
    browser
        .set_value("#deploy-form [name=expiresAt]", "2020-01-01T00:00")
        .await;
    browser.click("#deploy-form button[type=submit]").await;
    browser
        .wait_attr("#deploy-form .error", "data-code", "VALIDATION")
        .await;
    browser.set_value("#deploy-form [name=expiresAt]", "").await;

    // The provider is away while the deploy starts: the deployment waits,
    // and the page must follow it live once the provider is back.
    provider_call(&app, "unloadProvider", &provider).await;
    browser.click("#deploy-form button[type=submit]").await;
    browser.find("#deployment-state").await;
    let path = browser.path().await;
    let id = path
        .strip_prefix("/deployments/")
        .unwrap_or_else(|| panic!("on the detail page, not {path}"))
        .to_owned();
    assert_eq!(browser.text("h1").await, "shop");
    browser.js(MARK).await;
    // The graph is drawn before any node exists: the resources, no states yet.
    browser
        .wait_attr("#deployment-state", "data-state", "PENDING")
        .await;
    assert!(browser.all("#dag [data-key]").await.is_empty());
    browser
        .find(r#"#dag path.edge[data-from="db"][data-to="web"]"#)
        .await;
    browser
        .find(r#"#dag path.edge[data-from="cache"][data-to="web"]"#)
        .await;

    provider_call(&app, "loadProvider", &provider).await;
    wait_status(&app, &provider, "CONNECTED").await;
    for key in NODES {
        browser
            .wait_attr(&node(key), "data-state", "COMPLETE")
            .await;
    }
    browser
        .wait_attr("#deployment-state", "data-state", "COMPLETE")
        .await;
    browser.wait_js("the page never reloaded", MARKED).await;
    // The state is written in each box, not only coloured.
    assert!(browser.text(&node("web[1]")).await.contains("COMPLETE"));
    // The log has every node's way there, newest at the bottom (HEALTH
    // events, which follow a node's deploy, aside).
    browser
        .wait_js(
            "the log shows web[1] deploying then complete",
            r#"(() => { const rows = [...document.querySelectorAll('#event-log tbody tr')];
                const i = rows.findIndex(r => r.dataset.node === 'web[1]' && r.dataset.state === 'IN_PROGRESS');
                const j = rows.findIndex(r => r.dataset.node === 'web[1]' && r.dataset.state === 'COMPLETE');
                const runs = rows.filter(r => r.dataset.kind !== 'HEALTH');
                return i >= 0 && j > i && runs.at(-1).dataset.state === 'COMPLETE'; })()"#,
        )
        .await;
    let deployed = deployment(&app, &id).await;
    assert_eq!(deployed.state, "COMPLETE");
    assert_eq!(deployed.nodes.len(), 4);
    // The form's values reached the processes.
    assert_eq!(
        deployed.variables,
        json!({ "replicas": 2, "greeting": "hello <world>", "verbose": true })
    );
    let web_pid = deployed.node("web").pid().unwrap();
    let environ = std::fs::read(format!("/proc/{web_pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    let env: Vec<&str> = environ.split('\0').collect();
    assert!(env.contains(&"GREETING=hello <world>"), "{env:?}");
    assert!(env.contains(&"VERBOSE=true"), "{env:?}");

    // A node's panel, by keyboard: Enter on the focused box.
    browser
        .js(r#"document.querySelector('#dag [data-key="db[0]"]').focus(); return true;"#)
        .await;
    browser
        .client
        .active_element()
        .await
        .unwrap()
        .send_keys(&fantoccini::key::Key::Enter.to_string())
        .await
        .unwrap();
    browser.wait_text("#node-panel h2", "db[0]").await;
    let db_pid = deployed.node("db").pid().unwrap();
    browser
        .wait_text("#node-panel pre.json", &format!("\"pid\": {db_pid}"))
        .await;
    // It has `data` (its logs: `health.rs` reads them), not power.
    browser.find("#node-panel .logs").await;
    assert!(
        browser.all("#node-panel .power").await.is_empty(),
        "the process provider has no power: no buttons for it"
    );
    browser
        .wait_text("#node-panel [data-field=node]", "vm")
        .await;
    browser.click(&node("web[0]")).await;
    browser.wait_text("#node-panel h2", "web[0]").await;
    assert_eq!(
        browser
            .attr(&node("web[0]"), "aria-pressed")
            .await
            .as_deref(),
        Some("true")
    );
    browser.screenshot("deployment-dag").await;
    // The provider's node counts what the deployment holds: 4 (of 50).
    let answer = crate::support::providers::nodes(&app, &provider).await;
    let used = &crate::support::data(&answer)["provider"]["nodes"][0]["used"];
    assert_eq!(used["process.v1.service"], 4, "{answer}");
    assert_eq!(used["*"], 4, "{answer}");

    // The lease: extended (stored), a past time refused beside it, removed.
    let later = browser.js(&local_time_in(2 * 86_400_000)).await;
    browser
        .set_value("#lease-input", later.as_str().unwrap())
        .await;
    browser.click("#extend").await;
    browser
        .wait_js(
            "the lease is shown",
            "document.querySelector('#lease-now time')",
        )
        .await;
    assert!(deployment(&app, &id).await.expires_at.is_some());
    let earlier = browser.js(&local_time_in(-86_400_000)).await;
    browser
        .set_value("#lease-input", earlier.as_str().unwrap())
        .await;
    browser.click("#extend").await;
    browser
        .wait_attr(".lease .error", "data-code", "VALIDATION")
        .await;
    browser.click("#remove-lease").await;
    browser.wait_text("#lease-now", "none").await;
    assert!(deployment(&app, &id).await.expires_at.is_none());

    // Redeploy `web`: its nodes go through DESTROYING and back to COMPLETE,
    // live; a destroy asked meanwhile is refused with CONFLICT beside it.
    let old_web: Vec<i32> = deployed
        .nodes
        .iter()
        .filter(|n| n.key == "web")
        .map(|n| n.pid().unwrap() as i32)
        .collect();
    browser.click(".picks input[value=web]").await;
    browser.click("#redeploy").await;
    browser
        .wait_attr(&node("web[0]"), "data-state", "DESTROYING")
        .await;
    browser.click("#destroy").await;
    browser.fill("#destroy-name", "shop").await;
    browser.click("#destroy-confirm").await;
    browser
        .wait_attr("#destroy-form .error", "data-code", "CONFLICT")
        .await;
    assert_eq!(
        browser.attr(&node("web[0]"), "data-state").await.as_deref(),
        Some("DESTROYING"),
        "the redeploy waits for the gate"
    );
    open_gate("web");
    for key in ["web[0]", "web[1]"] {
        browser
            .wait_attr(&node(key), "data-state", "COMPLETE")
            .await;
    }
    browser
        .wait_attr("#deployment-state", "data-state", "COMPLETE")
        .await;
    browser
        .wait_js(
            "the log shows web[0] destroyed and deployed again",
            r#"(() => { const rows = [...document.querySelectorAll('#event-log tbody tr[data-node="web[0]"]')].map(r => r.dataset.state).filter(Boolean);
                return rows.join(' ').endsWith('DESTROYING DESTROYED IN_PROGRESS COMPLETE'); })()"#,
        )
        .await;
    assert!(browser.text(&node("db[0]")).await.contains("COMPLETE"));
    let redeployed = deployment(&app, &id).await;
    assert_eq!(redeployed.state, "COMPLETE");
    assert_eq!(
        redeployed.node("db").pid(),
        Some(db_pid),
        "db was left alone"
    );
    all_gone(&old_web).await;
    for n in redeployed.nodes.iter().filter(|n| n.key == "web") {
        let pid = n.pid().unwrap() as i32;
        assert!(
            !old_web.contains(&pid) && alive(pid),
            "web runs anew: {n:?}"
        );
    }

    // Destroy, confirmed by typing the name (the form is still open from the
    // refusal): the provider's children go away, the page follows live.
    let running = pids(&redeployed);
    let provider_process = provider_pid(&app.store, &provider);
    let mut before = children(provider_process);
    before.sort();
    let mut expected = running.clone();
    expected.sort();
    assert_eq!(
        before, expected,
        "the provider runs the deployment's 4 processes"
    );
    // `web` waits for its gate again, so that DESTROYING is seen.
    std::fs::remove_file(gate.path().join("web")).unwrap();
    browser.click("#destroy-confirm").await;
    browser
        .wait_attr(&node("web[0]"), "data-state", "DESTROYING")
        .await;
    open_gate("web");
    // Dependents first: `web`, then `db` and `cache` (which waits for its gate).
    // Meanwhile the deployment is DESTROYING: only node events repaint these.
    browser
        .wait_attr(&node("web[1]"), "data-state", "DESTROYED")
        .await;
    browser
        .wait_attr(&node("db[0]"), "data-state", "DESTROYED")
        .await;
    let now = browser
        .js(
            r##"return [document.querySelector('#deployment-state').dataset.state,
                        document.querySelector('#dag [data-key="cache[0]"]').dataset.state];"##,
        )
        .await;
    assert_eq!(now, json!(["DESTROYING", "DESTROYING"]));
    open_gate("cache");
    for key in NODES {
        browser
            .wait_attr(&node(key), "data-state", "DESTROYED")
            .await;
    }
    browser
        .wait_attr("#deployment-state", "data-state", "DESTROYED")
        .await;
    all_gone(&running).await;
    assert!(children(provider_process).is_empty(), "no process is left");
    assert_eq!(deployment(&app, &id).await.state, "DESTROYED");
    browser.wait_js("the page never reloaded", MARKED).await;

    // The list: filters in the URL, reload and back keep them.
    browser.click("header a[href='/deployments']").await;
    browser.wait_text("#deployment-list", "shop").await;
    browser
        .click("#deployment-filters input[value=FAILED]")
        .await;
    browser
        .wait_text("#deployments .empty", "No deployment matches")
        .await;
    assert_eq!(browser.path().await, "/deployments?state=FAILED");
    browser.client.back().await.unwrap();
    browser.wait_text("#deployment-list", "shop").await;
    // Live: a deployment made elsewhere appears, and reaches COMPLETE in its
    // row, without a reload (serverEvents' DeploymentChanged).
    browser.js(MARK).await;
    let other = deploy(
        &app,
        &blueprint,
        "other-shop",
        json!({ "variables": { "greeting": "hi" } }),
    )
    .await;
    browser
        .wait_text(
            &format!("#deployment-list tr[data-id='{other}']"),
            "COMPLETE",
        )
        .await;
    browser.wait_js("the list was not reloaded", MARKED).await;
    let other_pids = pids(&deployment(&app, &other).await);
    destroy_and_wait(&app, &other, &other_pids).await;
    browser
        .wait_text(
            &format!("#deployment-list tr[data-id='{other}']"),
            "DESTROYED",
        )
        .await;
    browser
        .goto(&format!(
            "/deployments?state=DESTROYED&blueprint={blueprint}&search=sho"
        ))
        .await;
    browser
        .wait_text(&format!("#deployment-list tr[data-id='{id}']"), "DESTROYED")
        .await;
    let checked = browser
        .js("return [...document.querySelectorAll('#deployment-filters [name=state]:checked')].map(i => i.value).join();")
        .await;
    assert_eq!(checked, json!("DESTROYED"));
    browser
        .fill("#deployment-filters [name=search]", "nothing-like-it")
        .await;
    browser
        .wait_text("#deployments .empty", "No deployment matches")
        .await;
    browser
        .wait_js(
            "the search is in the URL",
            "location.search.includes('search=nothing-like-it')",
        )
        .await;
    browser.close().await;

    // 420 px wide: the document does not scroll sideways (the DAG may, in its box).
    let narrow = Browser::open_sized(&app, 420).await;
    // Chromium's window is 500 px at least; the viewport can be narrower.
    narrow.client.set_window_size(420, 900).await.unwrap();
    narrow.sign_in_as("admin", PASSWORD).await;
    narrow.goto(&format!("/deployments/{id}")).await;
    narrow
        .wait_attr(&node("web[1]"), "data-state", "DESTROYED")
        .await;
    assert_eq!(narrow.js("return window.innerWidth;").await, json!(420));
    narrow
        .wait_js(
            "no horizontal scroll at 420 px",
            "document.documentElement.scrollWidth <= document.documentElement.clientWidth",
        )
        .await;
    // The graph (460 px drawn) is shrunk to fit its box.
    narrow
        .wait_js(
            "the DAG inside its box",
            "((box, drawn) => drawn.left >= box.left - 1 && drawn.right <= box.right + 1 \
             && drawn.width < 460)(document.querySelector('#dag').getBoundingClientRect(), \
             document.querySelector('#dag svg').getBoundingClientRect())",
        )
        .await;
    // Zoomed in, it is drawn larger and its box scrolls; 0 on the box fits it again.
    narrow.click("#dag-zoom-in").await;
    narrow.click("#dag-zoom-in").await;
    narrow
        .wait_js(
            "the DAG zoomed past its box",
            "((box) => box.scrollWidth > box.clientWidth && \
             box.querySelector('svg').getBoundingClientRect().width > 460)(document.querySelector('#dag'))",
        )
        .await;
    narrow.find("#dag").await.send_keys("0").await.unwrap();
    narrow
        .wait_js(
            "the DAG fitted again",
            "document.querySelector('#dag svg').dataset.scale === 'fit' && \
             document.querySelector('#dag svg').getBoundingClientRect().width < 460",
        )
        .await;
    narrow.screenshot("deployment-narrow").await;
    narrow.close().await;
}
