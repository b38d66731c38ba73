//! Plans and applies, revisions and rollback, on the real server with real
//! providers: what a plan says matches what applying it does (counted in the
//! fixture's calls), a replacement made before the old one goes leaves no
//! moment without a running process (sampled in `/proc`), a stale plan is
//! refused, and a rollback brings back the earlier revision's processes'
//! configuration.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::providers::protocol::{calls, loaded};
use crate::support::deployments::{
    create_blueprint, deploy, deployment, pids, settled, with_process_provider,
};
use crate::support::processes::all_gone;
use crate::support::providers::spawn_quick;
use crate::support::{TestApp, data, error_code};

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

/// A process's environment variable.
fn env_of(pid: i64, name: &str) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ
        .split(|b| *b == 0)
        .filter_map(|entry| std::str::from_utf8(entry).ok())
        .find_map(|entry| entry.strip_prefix(&format!("{name}=")).map(str::to_owned))
}

/// Live processes whose environment holds `MARK=mark`.
fn marked(mark: &str) -> usize {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i64>().ok())
        .filter(|pid| env_of(*pid, "MARK").as_deref() == Some(mark))
        .filter(|pid| crate::support::processes::stat(*pid as i32).is_some_and(|(s, _)| s != 'Z'))
        .count()
}

const SERVICE: &str = r#"
version: "1"
variables:
  greeting: { type: string, default: hello }
  mark: { type: string }
resources:
  svc:
    type: process.v1.service
    config:
      command: sleep
      args: ["300"]
      env: { GREETING: "{{ greeting }}", MARK: "{{ mark }}" }
"#;

#[tokio::test]
async fn a_replacement_runs_before_the_old_process_goes() {
    let (app, _provider, _repo) = with_process_provider(|_| {}).await;
    let mark = format!("cbd-{}", uuid::Uuid::new_v4());
    let blueprint = create_blueprint(&app, "svc", SERVICE).await;
    let id = deploy(
        &app,
        &blueprint,
        "svc",
        json!({ "variables": { "mark": mark } }),
    )
    .await;
    let first = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(first.state, "COMPLETE", "{:?}", first.error);
    let old = pids(&first);

    let planned = plan(
        &app,
        &id,
        json!({ "variables": { "mark": mark, "greeting": "hi" } }),
    )
    .await;
    assert_eq!(
        actions(&planned),
        vec![("svc".to_owned(), 0, "REPLACE".to_owned())]
    );
    assert_eq!(planned["changes"][0]["createBeforeDestroy"], json!(true));

    // Sample the processes from before the apply until it settles.
    let sampling = {
        let mark = mark.clone();
        tokio::task::spawn_blocking(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            let mut seen = Vec::new();
            while std::time::Instant::now() < deadline {
                let n = marked(&mark);
                seen.push(n);
                if seen.len() > 5 && n == 1 && seen.contains(&2) {
                    break;
                }
            }
            seen
        })
    };
    data(&apply(&app, &planned).await);
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{:?}", done.error);
    let seen = sampling.await.unwrap();
    assert!(
        seen.iter().all(|n| *n >= 1),
        "a moment without a running replica: {seen:?}"
    );
    assert!(seen.contains(&2), "the two never overlapped: {seen:?}");
    all_gone(&old).await;
    let new = pids(&done);
    assert_eq!(new.len(), 1);
    assert_eq!(env_of(new[0] as i64, "GREETING").as_deref(), Some("hi"));
    crate::support::deployments::destroy_and_wait(&app, &id, &new).await;
    app.stop().await;
}

#[tokio::test]
async fn a_rollback_brings_back_the_earlier_revisions_configuration() {
    let (app, _provider, _repo) = with_process_provider(|_| {}).await;
    let mark = format!("rb-{}", uuid::Uuid::new_v4());
    let blueprint = create_blueprint(&app, "rollback", SERVICE).await;
    let id = deploy(
        &app,
        &blueprint,
        "rollback",
        json!({ "variables": { "mark": mark } }),
    )
    .await;
    settled(&app, &id, &["COMPLETE"]).await;

    let planned = plan(
        &app,
        &id,
        json!({ "variables": { "mark": mark, "greeting": "changed" } }),
    )
    .await;
    data(&apply(&app, &planned).await);
    let changed = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(changed.state, "COMPLETE", "{:?}", changed.error);
    let pid = pids(&changed)[0] as i64;
    assert_eq!(env_of(pid, "GREETING").as_deref(), Some("changed"));

    let body = app
        .gql(
            "mutation($id: ID!) { rollbackDeployment(id: $id, revision: 1) { plan { id summary { replace } } deployment { state } } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(
        data(&body)["rollbackDeployment"]["plan"]["summary"]["replace"],
        json!(1)
    );
    let back = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(back.state, "COMPLETE", "{:?}", back.error);
    let pid = pids(&back)[0] as i64;
    assert_eq!(env_of(pid, "GREETING").as_deref(), Some("hello"));
    assert_eq!(marked(&mark), 1);

    let body = app
        .gql(
            "query($id: ID!) { deployment(id: $id) { variables revisions { number kind outcome } } }",
            json!({ "id": id }),
        )
        .await;
    let found = &data(&body)["deployment"];
    assert_eq!(found["variables"]["greeting"], json!("hello"));
    let kinds: Vec<(i64, String, String)> = found["revisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["number"].as_i64().unwrap(),
                r["kind"].as_str().unwrap().into(),
                r["outcome"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (1, "DEPLOY".into(), "COMPLETE".into()),
            (2, "APPLY".into(), "COMPLETE".into()),
            (3, "ROLLBACK".into(), "COMPLETE".into())
        ]
    );
    let missing = app
        .gql(
            "mutation($id: ID!) { rollbackDeployment(id: $id, revision: 9) { plan { id } } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(error_code(&missing), Some("NOT_FOUND"), "{missing}");
    crate::support::deployments::destroy_and_wait(&app, &id, &pids(&back)).await;
    app.stop().await;
}

/// The real binary is killed (SIGKILL) while it applies a plan replacing 30
/// processes. After a restart the apply finishes: every resource runs once,
/// with the new configuration, the old processes are gone, and the
/// provider's records are exactly Corbel's nodes.
#[tokio::test]
async fn a_server_killed_mid_apply_converges() {
    use crate::support::binary::{admin_gql, serve};
    use crate::support::provider_repos::{ProviderRepo, process_metadata};
    use crate::support::providers::{create_provider, wait_status};
    use crate::support::settings::quick;
    use crate::support::types::Deployment;
    use crate::support::{ADMIN_TOKEN, TestStore, at_path_as, eventually};

    let store = std::sync::Arc::new(TestStore::fresh().await);
    let app = TestApp::spawn_with(store.clone(), quick).await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (provider, _) = create_provider(
        &app,
        json!({ "name": "process", "gitUrl": repo.url(), "config": { "capacity": 500 } }),
    )
    .await;
    wait_status(&app, &provider, "CONNECTED").await;
    let mark = format!("kill-{}", uuid::Uuid::new_v4());
    let mut source = String::from(
        "variables:\n  greeting: { type: string, default: old }\n  mark: { type: string }\nresources:\n",
    );
    // A tree (chains five deep, fan-out) closed by a fan-in: each resource
    // after the first reads its parent's pid, so a replaced parent ripples.
    for i in 0..30 {
        let (depends, parent) = match i {
            0 => (String::new(), "none".to_owned()),
            29 => (
                "    depends_on: [r14, r27, r28]\n".to_owned(),
                "{{ resources.r14.outputs.pid }}".to_owned(),
            ),
            _ => {
                let p = (i - 1) / 2;
                (
                    format!("    depends_on: [r{p}]\n"),
                    format!("{{{{ resources.r{p}.outputs.pid }}}}"),
                )
            }
        };
        source.push_str(&format!(
            "  r{i}:\n    type: process.v1.service\n{depends}    config: {{ command: sleep, args: [\"300\"], \
             env: {{ GREETING: \"{{{{ greeting }}}}\", MARK: \"{{{{ mark }}}}\", PARENT: \"{parent}\" }} }}\n"
        ));
    }
    let blueprint = create_blueprint(&app, "many", &source).await;
    let id = deploy(
        &app,
        &blueprint,
        "many",
        json!({ "variables": { "mark": mark } }),
    )
    .await;
    let first = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(first.state, "COMPLETE", "{:?}", first.error);
    let old = pids(&first);
    assert_eq!(old.len(), 30);
    let planned = plan(
        &app,
        &id,
        json!({ "variables": { "mark": mark, "greeting": "new" } }),
    )
    .await;
    assert_eq!(planned["summary"]["replace"], json!(30));
    let store = app.stop().await;

    let admin = ("CORBEL_ADMIN_TOKEN", ADMIN_TOKEN);
    let slow = ("CORBEL_DEPLOY_CONCURRENCY", "2");
    let mut served = serve(&store, &[admin, slow]);
    let addr = served.addr;
    eventually(Duration::from_secs(60), "the provider", || async {
        let body = admin_gql(
            addr,
            "query($id: ID!) { provider(id: $id) { status } }",
            json!({ "id": provider }),
        )
        .await?;
        (body["data"]["provider"]["status"] == "CONNECTED").then_some(())
    })
    .await;
    let body = admin_gql(
        addr,
        "mutation($id: ID!) { applyPlan(id: $id) { id } }",
        json!({ "id": planned["id"] }),
    )
    .await
    .unwrap();
    data(&body);
    eventually(Duration::from_secs(60), "some replacements up", || async {
        let body = admin_gql(
            addr,
            "query($id: ID!) { deployment(id: $id) { nodes { state } } }",
            json!({ "id": id }),
        )
        .await?;
        let nodes = body["data"]["deployment"]["nodes"].as_array()?;
        let up = nodes.iter().filter(|n| n["state"] == "COMPLETE").count();
        (nodes.len() >= 35 && up >= 5).then_some(())
    })
    .await;
    served.child.kill().unwrap();
    served.child.wait().unwrap();

    let served = serve(&store, &[admin]);
    let addr = served.addr;
    let done = eventually(Duration::from_secs(120), "the apply to finish", || async {
        let body = admin_gql(
            addr,
            "query($id: ID!) { deployment(id: $id) { state error nodes { id key state outputs } } }",
            json!({ "id": id }),
        )
        .await?;
        let d: Deployment = at_path_as(&body, "deployment").ok()?;
        (d.state == "COMPLETE" || d.state == "FAILED").then_some(d)
    })
    .await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    assert_eq!(done.nodes.len(), 30, "{done:?}");
    assert!(done.nodes.iter().all(|n| n.state == "COMPLETE"), "{done:?}");
    all_gone(&old).await;
    let running = pids(&done);
    assert_eq!(running.len(), 30);
    assert!(
        running
            .iter()
            .all(|p| env_of(*p as i64, "GREETING").as_deref() == Some("new")),
        "every process runs the new configuration"
    );
    assert_eq!(
        marked(&mark),
        30,
        "each resource runs once, nothing orphaned"
    );
    // Each process was started with the pid its parent runs as now.
    let pid_of = |key: &str| {
        done.nodes
            .iter()
            .find(|n| n.key == key)
            .and_then(|n| n.pid())
            .unwrap()
    };
    for i in 1..30 {
        let parent = if i == 29 { 14 } else { (i - 1) / 2 };
        let child = pid_of(&format!("r{i}"));
        assert_eq!(
            env_of(child, "PARENT"),
            Some(pid_of(&format!("r{parent}")).to_string()),
            "r{i} reads r{parent}'s pid"
        );
    }
    let recorded: std::collections::BTreeSet<String> = std::fs::read_dir(
        store
            .data_dir()
            .join("providers")
            .join(&provider)
            .join("state")
            .join("resources"),
    )
    .unwrap()
    .map(|e| {
        e.unwrap()
            .path()
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    })
    .collect();
    let ours: std::collections::BTreeSet<String> =
        done.nodes.iter().map(|n| n.id.clone()).collect();
    assert_eq!(recorded, ours);
    let body = admin_gql(
        addr,
        "mutation($id: ID!) { destroyDeployment(id: $id) { id } }",
        json!({ "id": id }),
    )
    .await
    .unwrap();
    data(&body);
    all_gone(&running).await;
    drop(served);
}
