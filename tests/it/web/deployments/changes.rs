//! A change planned as a diff, applied and rolled back from a deployment's
//! detail page, with the process provider loaded from git; the processes
//! are checked, not only the page.

use serde_json::json;

use super::{MARK, MARKED};
use crate::support::browser::{Browser, PASSWORD};
use crate::support::deployments::{create_blueprint, deploy, deployment, with_process_provider};
use crate::support::processes::all_gone;

/// One variable, read by the one process: the Change section plans it as a
/// REPLACE (the process provider updates nothing in place) shown as a diff,
/// Apply runs it followed live until revision 2 is COMPLETE, a stale plan is
/// refused with CONFLICT beside its button, and Roll back on revision 1 shows
/// its plan and ends as revision 3. The processes are checked, not only the
/// page; the diff fits 420 px.
#[tokio::test]
async fn a_change_is_planned_applied_and_rolled_back_in_the_browser() {
    const GREETER: &str = r#"
version: "1"
variables:
  greeting: { type: string, default: "hello" }
resources:
  app:
    type: process.v1.service
    config: { command: sleep, args: ["300"], env: { GREETING: "{{ greeting }}" } }
  watcher:
    type: process.v1.service
    depends_on: [app]
    config: { command: sleep, args: ["301"], env: { PARENT: "{{ resources.app.outputs.pid }}" } }
"#;
    let (app, _provider, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(&app, "greeter", GREETER).await;
    let id = deploy(&app, &blueprint, "greeter", json!({})).await;
    let first = crate::support::deployments::settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(first.state, "COMPLETE", "{first:?}");
    let first_pid = first.node("app").pid().unwrap() as i32;
    let running_pid = |d: &crate::support::types::Deployment| {
        d.nodes
            .iter()
            .filter(|n| n.key == "app" && n.state == "COMPLETE")
            .map(|n| n.pid().unwrap() as i32)
            .collect::<Vec<_>>()
    };
    let greeting_of = |pid: i32| {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        String::from_utf8_lossy(&environ)
            .split('\0')
            .find_map(|v| v.strip_prefix("GREETING=").map(str::to_owned))
    };

    let browser = Browser::sign_in(&app).await;
    browser.goto(&format!("/deployments/{id}")).await;
    browser
        .wait_attr("#deployment-state", "data-state", "COMPLETE")
        .await;
    browser
        .wait_attr(
            r#"#revision-list tr[data-revision="1"]"#,
            "data-outcome",
            "COMPLETE",
        )
        .await;
    browser.js(MARK).await;
    // The only revision has nothing earlier to roll back to.
    assert!(
        browser
            .all("#revision-list [data-rollback]")
            .await
            .is_empty()
    );
    // The editor holds the deployment's variables.
    let prefilled = browser
        .find("#change-variables")
        .await
        .prop("value")
        .await
        .unwrap()
        .unwrap_or_default();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&prefilled).unwrap(),
        json!({ "greeting": "hello" })
    );

    // Plan: the diff says what would happen, and nothing runs yet.
    browser
        .set_value("#change-variables", r#"{ "greeting": "bonjour" }"#)
        .await;
    browser.click("#plan").await;
    let replace = r#"#plan-diff .change[data-action="REPLACE"][data-key="app[0]"]"#;
    let row = browser.wait_text(replace, "bonjour").await;
    assert!(row.contains("app[0]") && row.contains("REPLACE"), "{row}");
    assert!(row.contains("env") && row.contains("hello"), "{row}");
    // What reads app's outputs changes with it, and says so.
    let watcher = browser
        .text(r#"#plan-diff .change[data-key="watcher[0]"] .ripple"#)
        .await;
    assert_eq!(watcher, "Follows app");
    assert_eq!(
        browser.text("#plan-diff [data-count=replace] strong").await,
        "2"
    );
    assert_eq!(
        running_pid(&deployment(&app, &id).await),
        [first_pid],
        "a plan runs nothing"
    );
    browser.screenshot("deployment-plan").await;

    // Apply: followed live to revision 2, COMPLETE, with the new process.
    browser.click("#apply-plan").await;
    browser
        .wait_attr(
            r#"#revision-list tr[data-revision="2"]"#,
            "data-kind",
            "APPLY",
        )
        .await;
    browser
        .wait_attr(
            r#"#revision-list tr[data-revision="2"]"#,
            "data-outcome",
            "COMPLETE",
        )
        .await;
    browser
        .wait_attr("#deployment-state", "data-state", "COMPLETE")
        .await;
    browser
        .wait_js(
            "the log shows the apply's run, live",
            r#"document.querySelectorAll('#event-log tbody tr[data-kind="STATE"][data-state="COMPLETE"]').length >= 2"#,
        )
        .await;
    browser.wait_js("the page never reloaded", MARKED).await;
    let applied = deployment(&app, &id).await;
    assert_eq!(applied.state, "COMPLETE");
    assert_eq!(applied.variables, json!({ "greeting": "bonjour" }));
    let second = running_pid(&applied);
    assert_eq!(second.len(), 1, "{applied:?}");
    assert_eq!(greeting_of(second[0]).as_deref(), Some("bonjour"));
    all_gone(&[first_pid]).await;

    // A plan the deployment moves away from is refused where it was applied.
    browser
        .set_value("#change-variables", r#"{ "greeting": "hola" }"#)
        .await;
    browser.click("#plan").await;
    browser.wait_text(replace, "hola").await;
    let stale = browser.find("#apply-plan").await;

    // Roll back to revision 1: its plan shown, revision 3 a ROLLBACK.
    browser
        .click(r#"#revision-list tr[data-revision="1"] [data-rollback]"#)
        .await;
    browser
        .wait_text(
            r#"#rollback-plan .change[data-action="REPLACE"][data-key="app[0]"]"#,
            "hello",
        )
        .await;
    browser
        .wait_attr(
            r#"#revision-list tr[data-revision="3"]"#,
            "data-kind",
            "ROLLBACK",
        )
        .await;
    browser
        .wait_attr(
            r#"#revision-list tr[data-revision="3"]"#,
            "data-outcome",
            "COMPLETE",
        )
        .await;
    browser
        .wait_attr("#deployment-state", "data-state", "COMPLETE")
        .await;
    let rolled_back = deployment(&app, &id).await;
    assert_eq!(rolled_back.variables, json!({ "greeting": "hello" }));
    let third = running_pid(&rolled_back);
    assert_eq!(third.len(), 1, "{rolled_back:?}");
    assert_eq!(greeting_of(third[0]).as_deref(), Some("hello"));

    stale.click().await.unwrap();
    browser
        .wait_attr("#apply-error .error", "data-code", "CONFLICT")
        .await;
    assert_eq!(
        running_pid(&deployment(&app, &id).await),
        third,
        "the stale plan ran nothing"
    );
    browser.wait_js("the page never reloaded", MARKED).await;
    browser.close().await;

    // 420 px wide: a plan's diff and the revisions fit.
    let narrow = Browser::open_sized(&app, 420).await;
    narrow.client.set_window_size(420, 900).await.unwrap();
    narrow.sign_in_as("admin", PASSWORD).await;
    narrow.goto(&format!("/deployments/{id}")).await;
    narrow
        .wait_attr(
            r#"#revision-list tr[data-revision="3"]"#,
            "data-outcome",
            "COMPLETE",
        )
        .await;
    narrow
        .set_value(
            "#change-variables",
            r#"{ "greeting": "a rather longer greeting than before, to wrap" }"#,
        )
        .await;
    narrow.click("#plan").await;
    narrow.find(replace).await;
    narrow
        .wait_js(
            "no horizontal scroll at 420 px",
            "document.documentElement.scrollWidth <= document.documentElement.clientWidth",
        )
        .await;
    narrow.screenshot("deployment-plan-narrow").await;
    narrow.close().await;
}
