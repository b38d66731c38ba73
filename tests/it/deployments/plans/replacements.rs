//! Plans that replace real processes: a replacement made before the old one
//! goes leaves no moment without a running process (sampled in `/proc`), a
//! rollback brings back the earlier revision's processes' configuration, and
//! a server killed mid-apply converges after a restart.

use std::time::Duration;

use serde_json::json;

use super::{actions, apply, plan};
use crate::support::deployments::{create_blueprint, deploy, pids, settled, with_process_provider};
use crate::support::processes::all_gone;
use crate::support::{TestApp, data, error_code};

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
