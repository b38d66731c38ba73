//! The overview's pictures in real Chromium, from a known history: two
//! deployments of the process provider in a project with limits, one of them
//! moved three hours back in the event history (written to the store: the
//! only way to have a past). The changes chart, resources by health, the
//! provider's node and the project's limits show those numbers, and follow
//! a new deployment live.

use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::json;

use crate::support::browser::Browser;
use crate::support::deployments::{settled, with_process_provider};
use crate::support::{TestApp, data};

const SERVICE: &str = r#"
version: "1"
variables:
  replicas: { type: int, default: 1 }
resources:
  svc:
    type: process.v1.service
    replicas: "{{ replicas }}"
    config: { command: sleep, args: ["300"] }
"#;

async fn deploy_in(app: &TestApp, blueprint: &str, name: &str, replicas: u32) -> String {
    let body = app
        .gql(
            "mutation($b: ID!, $n: String!, $v: JSON!) { deployBlueprint(input: { blueprintId: $b, name: $n, variables: $v }) { id } }",
            json!({ "b": blueprint, "n": name, "v": { "replicas": replicas } }),
        )
        .await;
    let id = data(&body)["deployBlueprint"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    settled(app, &id, &["COMPLETE"]).await;
    id
}

/// The chart's figures: `[deployments, resources]` of each hour, oldest first.
async fn hours(browser: &Browser) -> Vec<[u64; 2]> {
    let value = browser
        .js("return [...document.querySelectorAll('#changes svg g')].map(g => [+g.dataset.deployments, +g.dataset.resources]);")
        .await;
    serde_json::from_value(value).unwrap()
}

#[tokio::test]
async fn the_overview_draws_the_days_changes_health_nodes_and_projects() {
    let (app, _provider, _repo) = with_process_provider(|_| {}).await;
    let body = app
        .gql(
            "mutation { createProject(input: { name: \"busy\", maxResources: 10 }) { id } }",
            json!({}),
        )
        .await;
    let project = data(&body)["createProject"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let body = app
        .gql(
            "mutation($p: ID!, $s: String!) { createBlueprint(input: { projectId: $p, name: \"svc\", source: $s }) { id } }",
            json!({ "p": project, "s": SERVICE }),
        )
        .await;
    let blueprint = data(&body)["createBlueprint"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let past = deploy_in(&app, &blueprint, "past", 1).await;
    deploy_in(&app, &blueprint, "now", 3).await;

    // The first deployment's history, three hours back.
    let db = corbel::store::connect(&app.store.config().database().unwrap())
        .await
        .unwrap();
    use corbel::store::entities::deployment_event;
    let three_hours_ago = chrono::Utc::now() - chrono::TimeDelta::hours(3);
    deployment_event::Entity::update_many()
        .col_expr(deployment_event::Column::At, Expr::value(three_hours_ago))
        .filter(deployment_event::Column::DeploymentId.eq(uuid::Uuid::parse_str(&past).unwrap()))
        .exec(&db)
        .await
        .unwrap();

    let browser = Browser::sign_in(&app).await;
    browser.find("#changes svg").await;
    let seen = hours(&browser).await;
    assert_eq!(seen.len(), 24);
    assert_eq!(
        seen[23],
        [1, 3],
        "this hour: one deployment, three nodes: {seen:?}"
    );
    assert_eq!(seen[20], [1, 1], "three hours ago: {seen:?}");
    let rest: u64 = seen.iter().map(|[d, r]| d + r).sum();
    assert_eq!(rest, 6, "nothing else: {seen:?}");

    // Four services, each healthy once looked at.
    browser
        .wait_attr("#health [data-health=HEALTHY]", "data-count", "4")
        .await;
    // The provider's node holds the four; the project four of its ten.
    browser
        .wait_attr(
            "#nodes li[data-type='process.v1.service']",
            "data-used",
            "4",
        )
        .await;
    browser
        .wait_text(
            "#busiest [data-project=busy] [data-limit=resources]",
            "4 of 10",
        )
        .await;
    browser.screenshot("overview-pictures").await;

    // Live: a new deployment shows in this hour's bars and the counts.
    deploy_in(&app, &blueprint, "later", 2).await;
    browser
        .wait_js(
            "this hour's bars count the new deployment",
            "(g => g.dataset.deployments === '2' && g.dataset.resources === '5')([...document.querySelectorAll('#changes svg g')].at(-1))",
        )
        .await;
    browser
        .wait_text(
            "#busiest [data-project=busy] [data-limit=resources]",
            "6 of 10",
        )
        .await;
    browser.close().await;
}
