//! Plans and applies, revisions and rollback, on the real server with real
//! providers: what a plan says matches what applying it does (counted in the
//! fixture's calls), and a stale plan is refused. Plans that replace real
//! processes are in `replacements`; this module holds the plan helpers they
//! (and `docker`) use.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use crate::providers::protocol::{calls, loaded};
use crate::support::deployments::{create_blueprint, deploy, deployment, settled};
use crate::support::providers::spawn_quick;
use crate::support::{TestApp, data, error_code};

mod replacements;

const PLAN_FIELDS: &str = "id state summary { create update replace destroy keep } \
    changes { key replica action reason rippleFrom: ripplesFrom createBeforeDestroy \
    config { key before after known secret } } notes";

pub(crate) async fn plan(app: &TestApp, deployment: &str, input: Value) -> Value {
    let mut input = input;
    input["deploymentId"] = json!(deployment);
    let body = app
        .gql(
            &format!(
                "mutation($input: PlanDeploymentInput!) {{ planDeployment(input: $input) {{ {PLAN_FIELDS} }} }}"
            ),
            json!({ "input": input }),
        )
        .await;
    data(&body)["planDeployment"].clone()
}

pub(crate) async fn apply(app: &TestApp, plan: &Value) -> Value {
    app.gql(
        "mutation($id: ID!) { applyPlan(id: $id) { id state } }",
        json!({ "id": plan["id"] }),
    )
    .await
}

/// The plan's changes that do something, as the provider calls they mean,
/// counted by `(call, key)`.
fn planned_calls(plan: &Value) -> BTreeMap<(String, String), usize> {
    let mut out = BTreeMap::new();
    for change in plan["changes"].as_array().unwrap() {
        let key = change["key"].as_str().unwrap().to_owned();
        let calls: &[&str] = match change["action"].as_str().unwrap() {
            "CREATE" => &["deploy"],
            "UPDATE" => &["update"],
            "REPLACE" => &["deploy", "destroy"],
            "DESTROY" => &["destroy"],
            _ => &[],
        };
        for call in calls {
            *out.entry((call.to_string(), key.clone())).or_default() += 1;
        }
    }
    out
}

/// The calls the fixture received after the first `from`.
fn calls_since(log: &Path, from: usize) -> BTreeMap<(String, String), usize> {
    let mut out = BTreeMap::new();
    for call in calls(log).into_iter().skip(from) {
        *out.entry(call).or_default() += 1;
    }
    out
}

pub(crate) fn actions(plan: &Value) -> Vec<(String, i64, String)> {
    plan["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["key"].as_str().unwrap().to_owned(),
                c["replica"].as_i64().unwrap(),
                c["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

const FIXTURE: &str = r#"
version: "1"
variables:
  label: { type: string, default: a }
  size: { type: int, default: 1 }
  n: { type: int, default: 1 }
resources:
  base:
    type: fixture.v1.noop
    config: { label: "{{ label }}", size: "{{ size }}" }
  dep:
    type: fixture.v1.noop
    depends_on: [base]
    config: { label: "{{ resources.base.outputs.label }}" }
  many:
    type: fixture.v1.noop
    replicas: "{{ n }}"
    config: {}
"#;

/// Plans `input`, checks the actions (those not kept), applies, waits, and
/// checks the fixture received exactly the calls the plan named.
async fn plan_and_apply(
    app: &TestApp,
    id: &str,
    log: &Path,
    input: Value,
    expected: &[(&str, i64, &str)],
) -> Value {
    let planned = plan(app, id, input).await;
    let doing: Vec<(String, i64, String)> = actions(&planned)
        .into_iter()
        .filter(|(_, _, a)| a != "KEEP")
        .collect();
    let expected: Vec<(String, i64, String)> = expected
        .iter()
        .map(|(k, r, a)| (k.to_string(), *r, a.to_string()))
        .collect();
    assert_eq!(doing, expected, "{planned:#}");
    let before = calls(log).len();
    let body = apply(app, &planned).await;
    data(&body);
    let done = settled(app, id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{:?}", done.error);
    assert_eq!(
        calls_since(log, before),
        planned_calls(&planned),
        "{planned:#}"
    );
    planned
}

#[tokio::test]
async fn each_kind_of_change_is_planned_as_applying_then_does_it() {
    let app = spawn_quick().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls.jsonl");
    let (_provider, _repo) = loaded(&app, "", &log).await;
    let blueprint = create_blueprint(&app, "changes", FIXTURE).await;
    let id = deploy(&app, &blueprint, "changes", json!({})).await;
    assert_eq!(
        settled(&app, &id, &["COMPLETE", "FAILED"]).await.state,
        "COMPLETE"
    );

    // Nothing asked differently: everything kept, nothing called.
    plan_and_apply(&app, &id, &log, json!({}), &[]).await;

    // A key the provider updates in place, rippling through a template to
    // a key it also updates.
    let planned = plan_and_apply(
        &app,
        &id,
        &log,
        json!({ "variables": { "label": "b" } }),
        &[("base", 0, "UPDATE"), ("dep", 0, "UPDATE")],
    )
    .await;
    let dep = &planned["changes"][1];
    assert_eq!(dep["rippleFrom"], json!(["base"]));
    assert_eq!(dep["config"][0]["known"], json!(false));
    let base = &planned["changes"][0];
    assert_eq!(
        base["config"][0],
        json!({"key": "label", "before": "a", "after": "b", "known": true, "secret": false})
    );
    let nodes = deployment(&app, &id).await.nodes;
    let dep_node = nodes.iter().find(|n| n.key == "dep").unwrap();
    assert_eq!(
        dep_node.outputs["label"],
        json!("b"),
        "dep read base's new output"
    );

    // A key it cannot update: replaced (made first, then the old one goes);
    // its dependent reads the replacement's outputs, and is updated.
    let planned = plan_and_apply(
        &app,
        &id,
        &log,
        json!({ "variables": { "label": "b", "size": 2 } }),
        &[("base", 0, "REPLACE"), ("dep", 0, "UPDATE")],
    )
    .await;
    let reason = planned["changes"][0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("`size`") && reason.contains("cannot update"),
        "{reason}"
    );
    assert_eq!(planned["changes"][0]["createBeforeDestroy"], json!(true));

    // Replicas up, then down.
    plan_and_apply(
        &app,
        &id,
        &log,
        json!({ "variables": { "label": "b", "size": 2, "n": 3 } }),
        &[("many", 1, "CREATE"), ("many", 2, "CREATE")],
    )
    .await;
    plan_and_apply(
        &app,
        &id,
        &log,
        json!({ "variables": { "label": "b", "size": 2, "n": 1 } }),
        &[("many", 1, "DESTROY"), ("many", 2, "DESTROY")],
    )
    .await;

    // A resource added and one removed, from a new source.
    let source = FIXTURE.replace(
        "  many:\n    type: fixture.v1.noop\n    replicas: \"{{ n }}\"\n    config: {}\n",
        "  extra:\n    type: fixture.v1.noop\n    config: { label: new }\n",
    );
    plan_and_apply(
        &app,
        &id,
        &log,
        json!({ "blueprintSource": source, "variables": { "label": "b", "size": 2 } }),
        &[("extra", 0, "CREATE"), ("many", 0, "DESTROY")],
    )
    .await;
    let keys: Vec<String> = deployment(&app, &id)
        .await
        .nodes
        .into_iter()
        .map(|n| format!("{}[{}] {}", n.key, n.replica, n.state))
        .collect();
    assert_eq!(
        keys,
        ["base[0] COMPLETE", "dep[0] COMPLETE", "extra[0] COMPLETE"]
    );

    // Every apply made a revision, after the first deploy.
    let body = app
        .gql(
            "query($id: ID!) { deployment(id: $id) { revisions { number kind outcome createdBy } } }",
            json!({ "id": id }),
        )
        .await;
    let revisions = data(&body)["deployment"]["revisions"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(revisions.len(), 7, "{revisions:?}");
    assert_eq!(revisions[0]["kind"], json!("DEPLOY"));
    assert!(
        revisions[1..]
            .iter()
            .all(|r| r["kind"] == "APPLY" && r["outcome"] == "COMPLETE")
    );
    app.stop().await;
}

#[tokio::test]
async fn a_provider_without_updates_gets_replacements() {
    let app = spawn_quick().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls.jsonl");
    let (_provider, _repo) = loaded(&app, "FIXTURE_PROTOCOL=1", &log).await;
    let blueprint = create_blueprint(&app, "old", FIXTURE).await;
    let id = deploy(&app, &blueprint, "old", json!({})).await;
    assert_eq!(
        settled(&app, &id, &["COMPLETE", "FAILED"]).await.state,
        "COMPLETE"
    );
    let planned = plan_and_apply(
        &app,
        &id,
        &log,
        json!({ "variables": { "label": "b" } }),
        &[("base", 0, "REPLACE"), ("dep", 0, "REPLACE")],
    )
    .await;
    let reason = planned["changes"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("protocol version 1"), "{reason}");
    app.stop().await;
}

#[tokio::test]
async fn a_stale_plan_is_refused_and_a_plan_applies_once() {
    let app = spawn_quick().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls.jsonl");
    let (_provider, _repo) = loaded(&app, "", &log).await;
    let blueprint = create_blueprint(&app, "stale", FIXTURE).await;
    let id = deploy(&app, &blueprint, "stale", json!({})).await;
    settled(&app, &id, &["COMPLETE"]).await;

    let first = plan(&app, &id, json!({ "variables": { "n": 2 } })).await;
    let second = plan(&app, &id, json!({ "variables": { "label": "z" } })).await;
    data(&apply(&app, &second).await);
    settled(&app, &id, &["COMPLETE"]).await;
    let before = calls(&log).len();

    let refused = apply(&app, &first).await;
    assert_eq!(error_code(&refused), Some("CONFLICT"), "{refused}");
    let message = refused["errors"][0]["message"].as_str().unwrap();
    assert!(message.contains("moved since"), "{message}");
    assert!(message.contains("variables changed"), "{message}");

    let again = apply(&app, &second).await;
    assert_eq!(error_code(&again), Some("CONFLICT"), "{again}");
    assert!(
        again["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("applied already")
    );
    assert_eq!(calls(&log).len(), before, "a refused plan called nothing");
    assert_eq!(deployment(&app, &id).await.nodes.len(), 3);
    app.stop().await;
}
