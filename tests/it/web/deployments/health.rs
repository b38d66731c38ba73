//! Live health in the browser, with the real process provider and fast
//! health timings: a process SIGKILLed behind Corbel's back turns its node
//! red (and says DOWN, with the reason, in its box, its panel and the
//! deployment's header) with no reload; its logs are read in the panel; the
//! Restart action brings it back; the overview's "Needs attention" lists
//! the next kill live; a viewer is not offered Restart.

use serde_json::json;

use super::{MARK, MARKED, node};
use crate::health::support::{fast_health, node as node_of, until};
use crate::support::browser::Browser;
use crate::support::data;
use crate::support::deployments::{
    create_blueprint, deploy, deployment, destroy_and_wait, pids, settled, with_process_provider,
};
use crate::support::processes::signal;

/// `db` prints a line, then is `sleep` under the same pid (its
/// `outputs.pid`); `web` reads db's pid.
const BLUEPRINT: &str = r#"
resources:
  db:
    type: process.v1.service
    config: { command: sh, args: ["-c", "echo db-is-up; exec sleep 300"] }
  web:
    type: process.v1.service
    depends_on: [db]
    config: { command: sleep, args: ["300"], env: { DB_PID: "{{ resources.db.outputs.pid }}" } }
"#;

const VIEWER_PASSWORD: &str = "viewer-password-42";

/// The pid of `db`, once the whole deployment is HEALTHY.
async fn healthy_db_pid(app: &crate::support::TestApp, id: &str) -> i32 {
    let healthy = until(app, id, "every node HEALTHY", |d| {
        d["health"] == "HEALTHY"
            && d["nodes"]
                .as_array()
                .is_some_and(|n| n.iter().all(|n| n["health"] == "HEALTHY"))
    })
    .await;
    node_of(&healthy, "db")["outputs"]["pid"].as_i64().unwrap() as i32
}

#[tokio::test]
async fn a_killed_process_turns_its_node_red_live_and_the_overview_lists_it() {
    let (app, _provider, _repo) = with_process_provider(fast_health).await;
    let blueprint = create_blueprint(&app, "health", BLUEPRINT).await;
    let id = deploy(&app, &blueprint, "shop", json!({})).await;
    assert_eq!(
        settled(&app, &id, &["COMPLETE", "FAILED"]).await.state,
        "COMPLETE"
    );
    let pid = healthy_db_pid(&app, &id).await;

    let browser = Browser::sign_in(&app).await;
    browser.goto(&format!("/deployments/{id}")).await;
    let db = node("db[0]");
    browser.wait_attr(&db, "data-health", "HEALTHY").await;
    browser.wait_text("#deployment-health", "HEALTHY").await;
    browser.click(&db).await;
    browser
        .wait_text("#node-health [data-field=health]", "HEALTHY")
        .await;
    browser
        .wait_text("#node-health [data-field=restarts]", "0")
        .await;
    // The process provider serves logs (`data`).
    browser.click("#read-logs").await;
    browser.wait_text("#node-logs", "db-is-up").await;
    browser.js(MARK).await;

    // Killed behind Corbel's back: red, and said in words, without a reload.
    signal(pid, libc::SIGKILL);
    browser.wait_attr(&db, "data-health", "DOWN").await;
    browser.wait_text(&format!("{db} .hl"), "DOWN").await;
    let stroke = browser
        .js(&format!(
            "return getComputedStyle(document.querySelector('{db} .frame')).stroke;"
        ))
        .await;
    assert_eq!(stroke, json!("rgb(179, 38, 30)"), "var(--bad)");
    assert_eq!(
        browser
            .attr(&node("web[0]"), "data-health")
            .await
            .as_deref(),
        Some("HEALTHY")
    );
    browser
        .wait_text("#node-health [data-field=health]", "DOWN")
        .await;
    browser
        .wait_text("#node-health [data-field=health]", "SIGKILL")
        .await;
    browser.wait_text("#deployment-health", "DOWN").await;
    browser.wait_js("no reload", MARKED).await;
    browser.screenshot("deployment-health-down").await;

    // Restarted from its panel: deployed again, HEALTHY, counted.
    browser.click("#restart-node").await;
    browser
        .wait_text("#node-health [data-field=restarts]", "1")
        .await;
    browser.wait_attr(&db, "data-health", "HEALTHY").await;
    browser.wait_text("#deployment-health", "HEALTHY").await;
    let again = healthy_db_pid(&app, &id).await;
    assert_ne!(again, pid, "a new process");

    // The overview, reached without a reload, lists the next kill live.
    browser.click("#top nav a[href='/']").await;
    browser
        .wait_text("#overview", "Nothing needs attention")
        .await;
    signal(again, libc::SIGKILL);
    let row = browser.wait_text("#attention", "shop · db[0]").await;
    assert!(row.contains("DOWN") && row.contains("SIGKILL"), "{row}");
    browser.find("#attention [data-state=DOWN]").await;
    browser.wait_js("no reload", MARKED).await;
    browser.screenshot("overview-health").await;
    browser.click("#attention a").await;
    assert_eq!(browser.path().await, format!("/deployments/{id}"));
    browser.wait_attr(&db, "data-health", "DOWN").await;

    // The list shows the deployment's health as a badge.
    browser.goto("/deployments").await;
    browser
        .wait_text("#deployment-list [data-label=Health]", "DOWN")
        .await;

    // A viewer reads the health but is not offered Restart.
    let project = data(
        &app.gql(
            "query($id: ID!) { deployment(id: $id) { projectId } }",
            json!({ "id": id }),
        )
        .await,
    )["deployment"]["projectId"]
        .clone();
    data(
        &app.gql(
            "mutation($p: String!) { createUser(input: { username: \"vic\", password: $p }) { id } }",
            json!({ "p": VIEWER_PASSWORD }),
        )
        .await,
    );
    data(
        &app.gql(
            "mutation($id: ID!) { setProjectMember(projectId: $id, username: \"vic\", role: VIEWER) { role } }",
            json!({ "id": project }),
        )
        .await,
    );
    browser.click("#sign-out").await;
    browser.sign_in_as("vic", VIEWER_PASSWORD).await;
    browser.goto(&format!("/deployments/{id}")).await;
    browser.click(&db).await;
    browser
        .wait_text("#node-health [data-field=health]", "DOWN")
        .await;
    assert!(
        browser.all("#restart-node").await.is_empty(),
        "a viewer is offered Restart"
    );
    browser.close().await;
    destroy_and_wait(&app, &id, &pids(&deployment(&app, &id).await)).await;
}
