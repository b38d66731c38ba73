//! The audit page in real Chromium: a seeded log (a project, 55 blueprints
//! made in it, one refused, one edited) is paged by "Show more", filtered
//! (the filters kept in the URL), followed live, and each entry links to what
//! it touched; the project's ADMIN sees the project's own log on its page.

use serde_json::json;

use crate::support::browser::Browser;
use crate::support::deployments::WEB;
use crate::support::{TestApp, data};

const MADE: usize = 55;

const ROWS: &str = "return document.querySelectorAll('#audit-list tbody tr').length";

async fn blueprint(app: &TestApp, project: &str, name: &str) -> serde_json::Value {
    app.gql(
        "mutation($p: ID!, $n: String!, $s: String!) { createBlueprint(input: { projectId: $p, name: $n, source: $s }) { id } }",
        json!({ "p": project, "n": name, "s": WEB }),
    )
    .await
}

#[tokio::test]
async fn the_audit_page_pages_filters_follows_and_links_the_log() {
    let app = TestApp::spawn().await;
    let body = app
        .gql(
            "mutation { createProject(input: { name: \"ops\" }) { id } }",
            json!({}),
        )
        .await;
    let project = data(&body)["createProject"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut last = String::new();
    for i in 0..MADE {
        let body = blueprint(&app, &project, &format!("bp-{i:02}")).await;
        last = data(&body)["createBlueprint"]["id"]
            .as_str()
            .unwrap()
            .to_owned();
    }
    let refused = blueprint(&app, &project, "").await;
    assert!(refused["errors"].is_array(), "{refused}");
    app.gql(
        "mutation($id: ID!) { updateBlueprint(id: $id, input: { description: \"edited\" }) { id } }",
        json!({ "id": last }),
    )
    .await;

    let browser = Browser::sign_in(&app).await;
    browser.click("#top nav a[href='/audit']").await;
    // Newest first, 50 at a time: the rest behind "Show more".
    let count = browser.wait_text("#audit-count", "50 shown").await;
    let total: usize = count.split(' ').next().unwrap().parse().unwrap();
    assert!(total > MADE + 2, "{count}");
    assert_eq!(
        browser
            .attr("#audit-list tbody tr", "data-action")
            .await
            .as_deref(),
        Some("login"),
        "the sign-in is the newest"
    );
    browser.screenshot("audit").await;
    browser.click("#audit-more").await;
    browser
        .wait_text("#audit-count", &format!("{total} shown"))
        .await;
    browser
        .wait_js(
            "the last page hides the button",
            "document.querySelector('#audit-more').hidden",
        )
        .await;

    // Filtered: the refused blueprint alone, with its code and message.
    browser
        .fill("#audit-filters [name=action]", "createBlueprint")
        .await;
    browser
        .select("#audit-filters [name=outcome]", "FAILED")
        .await;
    browser.click("#audit-filters button[type=submit]").await;
    browser.wait_text("#audit-count", "1 entry").await;
    let row = browser.text("#audit-list tbody tr").await;
    assert!(row.contains("VALIDATION"), "{row}");
    assert_eq!(
        browser.path().await,
        "/audit?action=createBlueprint&outcome=FAILED"
    );
    // Live: a new entry the filter keeps comes in at the top, others not.
    blueprint(&app, &project, "").await;
    blueprint(&app, &project, "fine").await;
    browser.wait_text("#audit-count", "2 entries").await;
    assert_eq!(browser.js(ROWS).await, 2);

    // Kept across a reload; each entry links to what it touched.
    browser.goto("/audit?action=updateBlueprint").await;
    browser.wait_text("#audit-count", "1 entry").await;
    assert_eq!(
        browser
            .attr("#audit-filters [name=action]", "value")
            .await
            .as_deref(),
        Some("updateBlueprint")
    );
    browser
        .click("#audit-list tbody tr td[data-label=On] a")
        .await;
    browser
        .wait_text("h1", &format!("bp-{:02}", MADE - 1))
        .await;
    assert_eq!(browser.path().await, format!("/blueprints/{last}"));

    // Nothing matches: said so. Clear shows everything again.
    browser.goto("/audit?user=nobody").await;
    browser
        .wait_text("#audit", "No entry matches these filters")
        .await;
    browser.click("#audit-filters button.secondary").await;
    browser.wait_text("#audit-count", "50 shown").await;
    assert_eq!(browser.path().await, "/audit");

    // The project's own log on its page, without the other projects'.
    browser.goto(&format!("/projects/{project}")).await;
    browser.click("#project-audit-tab summary").await;
    let count = browser.wait_text("#project-audit-count", "50 shown").await;
    let of_project: usize = count.split(' ').next().unwrap().parse().unwrap();
    assert!(of_project >= MADE + 3, "{count}");
    let logins = browser
        .js("return document.querySelectorAll('#project-audit-list tr[data-action=login]').length")
        .await;
    assert_eq!(logins, 0);
    browser.close().await;
}
