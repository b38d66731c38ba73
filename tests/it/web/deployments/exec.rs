//! "Run a command" in a node's panel, on a 420 px screen, with the real
//! process provider: the output streamed over `/exec`, stderr marked, the
//! exit status, Stop, a flood bounded; a VIEWER told why there is no form.

use serde_json::json;

use super::node;
use crate::support::browser::{Browser, PASSWORD, set_admin_password};
use crate::support::data;
use crate::support::deployments::{
    create_blueprint, deploy, deployment, destroy_and_wait, pids, settled, with_process_provider,
};

const BLUEPRINT: &str = r#"
resources:
  app:
    type: process.v1.service
    config: { command: sleep, args: ["300"] }
"#;

const VIEWER_PASSWORD: &str = "viewer-password-42";

#[tokio::test]
async fn a_developer_runs_a_command_in_a_nodes_panel_and_a_viewer_is_told_why_not() {
    let (app, _provider, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(&app, "exec", BLUEPRINT).await;
    let id = deploy(&app, &blueprint, "shell", json!({})).await;
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");

    set_admin_password(&app).await;
    let browser = Browser::open_sized(&app, 420).await;
    browser.sign_in_as("admin", PASSWORD).await;
    browser.goto(&format!("/deployments/{id}")).await;
    browser.click(&node("app[0]")).await;
    browser
        .fill("#exec-command", "echo hello; echo oops >&2; exit 3")
        .await;
    browser.click("#exec-run").await;
    browser.wait_text("#exec-status", "Exit status 3").await;
    assert_eq!(
        browser.attr("#exec-status", "data-exit").await.as_deref(),
        Some("3")
    );
    assert_eq!(
        browser.text("#exec-output [data-stream=stdout]").await,
        "hello"
    );
    assert_eq!(
        browser.text("#exec-output [data-stream=stderr]").await,
        "oops"
    );
    let stderr = browser
        .js("return getComputedStyle(document.querySelector('#exec-output .stderr')).color;")
        .await;
    assert_eq!(stderr, json!("rgb(179, 38, 30)"), "stderr in var(--bad)");
    assert!(
        browser.all("#exec-stop:not([hidden])").await.is_empty(),
        "Stop after the exit"
    );
    browser
        .wait_js(
            "the page fits 420 px",
            "document.documentElement.scrollWidth <= 420",
        )
        .await;
    browser.screenshot("deployment-exec").await;

    // Streamed as it comes, and Stop kills it; a flood keeps its last 1 MiB.
    browser
        .fill("#exec-command", "echo started; exec sleep 30")
        .await;
    browser.click("#exec-run").await;
    browser.wait_text("#exec-output", "started").await;
    browser.click("#exec-stop").await;
    browser.wait_text("#exec-status", "Stopped").await;
    browser
        .fill("#exec-command", "yes $(printf %0199d 0) | head -c 3000000")
        .await;
    browser.click("#exec-run").await;
    browser.wait_text("#exec-status", "Exit status 0").await;
    let kept = browser
        .js("return document.querySelector('#exec-output').textContent.length;")
        .await;
    assert_eq!(kept, json!(1 << 20));
    browser.find("#exec-dropped:not([hidden])").await;

    // A viewer of the project is told what it takes, with no form.
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
    browser.click(&node("app[0]")).await;
    browser
        .wait_text("#exec-refused", "needs the DEVELOPER role")
        .await;
    assert!(
        browser.all("#exec-form").await.is_empty(),
        "a viewer is offered the form"
    );
    browser.close().await;
    destroy_and_wait(&app, &id, &pids(&deployment(&app, &id).await)).await;
}
