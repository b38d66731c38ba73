//! One-shot jobs (issue 39): `process.v1.job` between two services — the
//! dependent starts after it and reads its output, the finished job is
//! HEALTHY, not a dead service; a redeploy runs it again —, a failing job
//! failing the deployment with its last lines, and `docker.v1.job` on the
//! real engine. The crash case is `crash::job`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::health::support::{fast_health, health_events, node, until};
use crate::support::deployments::{
    create_blueprint, deploy, destroy, settled, with_docker_provider, with_process_provider,
};
use crate::support::docker::{DeploymentCleanup, LABEL_DEPLOYMENT, busybox_image, containers};
use crate::support::{TestStore, data, eventually};

/// The README's job example (`docs/jobs/blueprint.yaml`): `db`, then
/// `migrate` (a job reading db's pid), then `api`, started with what migrate
/// printed. Here each run of migrate also appends to `runs` in `dir`.
const EXAMPLE: &str = include_str!("../../../docs/jobs/blueprint.yaml");

fn dag(dir: &std::path::Path) -> String {
    let readme = include_str!("../../../README.md");
    assert!(
        readme.contains(EXAMPLE),
        "the README shows docs/jobs/blueprint.yaml"
    );
    let counted = EXAMPLE
        .replace("\"echo migrating;", "\"echo run >> runs; echo migrating;")
        .replace(
            "      timeout_seconds: 60",
            &format!("      timeout_seconds: 60\n      cwd: {}", dir.display()),
        );
    assert!(
        counted.contains("runs") && counted.contains("cwd"),
        "{counted}"
    );
    counted
}

/// The environment variable `name` of process `pid`.
fn env_of(pid: i64, name: &str) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")).map(str::to_owned))
}

fn runs(dir: &std::path::Path) -> usize {
    std::fs::read_to_string(dir.join("runs"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_job_between_two_services_runs_first_then_again_on_redeploy() {
    let work = tempfile::tempdir().unwrap();
    let (app, _provider, _repo) = with_process_provider(fast_health).await;
    let blueprint = create_blueprint(&app, "migrations", &dag(work.path())).await;
    let id = deploy(&app, &blueprint, "migrations", json!({})).await;
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");

    let migrate = done.node("migrate");
    let db_pid = done.node("db").pid().unwrap();
    assert_eq!(migrate.outputs["exitStatus"], 0, "{migrate:?}");
    assert_eq!(
        migrate.outputs["output"],
        format!("migrating\nmigrated db {db_pid}")
    );
    assert!(migrate.outputs["durationMs"].is_u64(), "{migrate:?}");
    // api started after the job, with its output.
    let api = done.node("api").pid().unwrap();
    assert_eq!(
        env_of(api, "MIGRATED").as_deref(),
        Some(format!("migrating\nmigrated db {db_pid}").as_str())
    );
    assert_eq!(runs(work.path()), 1);

    // A finished job is done, not down.
    let healthy = until(&app, &id, "every node HEALTHY", |d| {
        d["health"] == "HEALTHY"
            && ["db", "migrate", "api"]
                .iter()
                .all(|k| node(d, k)["health"] == "HEALTHY")
    })
    .await;
    // Its reason is the provider's "completed" once the watch has said it
    // (a busy server may show the node HEALTHY from its deploy first).
    let reason = &node(&healthy, "migrate")["healthReason"];
    assert!(reason.is_null() || reason == "completed", "{healthy}");
    let downs: Vec<_> = health_events(&app, &id)
        .await
        .into_iter()
        .filter(|(_, state, _)| state == "DOWN")
        .collect();
    assert!(downs.is_empty(), "{downs:?}");

    // A redeploy of the job runs it again (and api, which reads it).
    let body = app
        .gql(
            "mutation($id: ID!, $keys: [String!]!) { redeployDeployment(id: $id, resourceKeys: $keys) { id } }",
            json!({ "id": id, "keys": ["migrate"] }),
        )
        .await;
    data(&body);
    eventually(Duration::from_secs(60), "the redeploy", || async {
        let d = crate::support::deployments::deployment(&app, &id).await;
        let redeployed = d.state == "COMPLETE" && d.node("api").pid() != done.node("api").pid();
        redeployed.then_some(())
    })
    .await;
    assert_eq!(runs(work.path()), 2, "run again, once");
    crate::support::deployments::destroy_and_wait(
        &app,
        &id,
        &crate::support::deployments::pids(&done),
    )
    .await;
    assert_eq!(runs(work.path()), 2, "destroy runs nothing");
}

#[tokio::test]
async fn a_failing_job_fails_the_deployment_with_its_last_lines() {
    let (app, _provider, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(
        &app,
        "fails",
        r#"
resources:
  seed:
    type: process.v1.job
    config:
      command: sh
      args: ["-c", "echo seeding; echo 'no such table: users' >&2; exit 3"]
  api:
    type: process.v1.service
    depends_on: [seed]
    config: { command: sleep, args: ["300"] }
"#,
    )
    .await;
    let id = deploy(&app, &blueprint, "fails", json!({})).await;
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "FAILED", "{done:?}");
    let error = done.node("seed").error.clone().unwrap_or_default();
    assert!(
        error.contains("exited with status 3") && error.ends_with("seeding\nno such table: users"),
        "{error}"
    );
    let deployment_error = done.error.clone().unwrap_or_default();
    assert!(
        deployment_error.contains("no such table: users"),
        "{deployment_error}"
    );
    assert_eq!(done.node("api").pid(), None, "api never started: {done:?}");
}

#[tokio::test]
async fn a_docker_job_completes_or_fails_with_its_output_and_destroy_removes_it() {
    let image = busybox_image();
    let (app, _provider, _repo) = with_docker_provider(Arc::new(TestStore::fresh().await)).await;
    let source = r#"
resources:
  ok:
    type: docker.v1.job
    config: { image: IMAGE, command: "echo one; echo two", timeout_seconds: 60 }
  bad:
    type: docker.v1.job
    depends_on: [ok]
    config: { image: IMAGE, command: "echo tried; exit 4", retries: 1, timeout_seconds: 60 }
"#;
    let blueprint = create_blueprint(&app, "jobs", &source.replace("IMAGE", image)).await;
    let id = deploy(&app, &blueprint, "jobs", json!({ "onFailure": "KEEP" })).await;
    let _cleanup = DeploymentCleanup(id.clone());
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "FAILED", "{done:?}");
    let ok = done.node("ok");
    assert_eq!(ok.state, "COMPLETE", "{done:?}");
    assert_eq!(
        (&ok.outputs["exitStatus"], &ok.outputs["output"]),
        (&json!(0), &json!("one\ntwo"))
    );
    let error = done.node("bad").error.clone().unwrap_or_default();
    assert!(
        error.contains("exited with status 4 (run 2 of 2)") && error.ends_with("tried"),
        "{error}"
    );
    let label = format!("{LABEL_DEPLOYMENT}={id}");
    assert_eq!(
        containers(&label).len(),
        2,
        "the exited containers stay until destroyed"
    );

    destroy(&app, &id).await;
    settled(&app, &id, &["DESTROYED"]).await;
    assert!(
        containers(&label).is_empty(),
        "destroy removes the containers"
    );
}
