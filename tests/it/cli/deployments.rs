//! Deployments through the CLI: `deploy --wait`, `get`, `events` (followed
//! or not), `destroy`; a failing deploy exits 1 with its error; a
//! provider's `logs`, followed live until Ctrl-C; and health in `get`.

use std::path::Path;

use serde_json::{Value, json};

use super::{Cli, Running};
use crate::support::data;
use crate::support::deployments::{deployment, destroy_and_wait, pids, with_process_provider};
use crate::support::processes::all_gone;

/// A database process that ignores SIGTERM, so each destroy of it waits out
/// the provider's grace (2 s in tests): a destroy runs long enough to follow.
const STUBBORN: &str = r#"
variables:
  replicas: { type: int, default: 1 }
resources:
  db:
    type: process.v1.service
    config: { command: sh, args: ["-c", "trap '' TERM; exec sleep 300"] }
  web:
    type: process.v1.service
    depends_on: [db]
    replicas: "{{ replicas }}"
    config: { command: sleep, args: ["300"] }
"#;

const HALF_BROKEN: &str = r#"
resources:
  good:
    type: process.v1.service
    config: { command: sleep, args: ["300"] }
  bad:
    type: process.v1.service
    depends_on: [good]
    config: { command: sh, args: ["-c", "echo cannot start; exit 7"] }
"#;

#[tokio::test]
async fn deploy_wait_get_events_and_destroy_through_the_cli() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    let cli = Cli::admin(format!("http://{}", app.addr));
    let blueprint = cli.file("web.yaml", STUBBORN);
    let blueprint = blueprint.to_str().unwrap();

    let deployed = cli
        .expect(
            &["deploy", "-f", blueprint, "--var", "replicas=2", "--wait"],
            0,
        )
        .await;
    assert!(deployed.stdout.contains("is COMPLETE"), "{deployed:?}");
    // Not a terminal: one plain line per node state change.
    for line in ["db[0] COMPLETE", "web[0] COMPLETE", "web[1] COMPLETE"] {
        assert!(deployed.stderr.contains(line), "{line}: {deployed:?}");
    }

    let listed = cli
        .expect(&["-o", "json", "get", "deployments"], 0)
        .await
        .json();
    let web = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "web")
        .unwrap_or_else(|| panic!("{listed}"))
        .clone();
    assert_eq!(web["state"], "COMPLETE");
    assert_eq!(web["variables"]["replicas"], 2);
    assert_eq!(web["nodes"].as_array().unwrap().len(), 3);
    let id = web["id"].as_str().unwrap().to_owned();
    let first = deployment(&app, &id).await;
    assert_eq!(first.state, "COMPLETE");
    let first_pids = pids(&first);
    assert_eq!(first_pids.len(), 3);

    let table = cli.expect(&["get", "deployments", "web"], 0).await;
    assert!(
        table
            .stdout
            .lines()
            .any(|l| l.starts_with("web ") && l.contains("COMPLETE") && l.contains("3/3")),
        "{table:?}"
    );
    let providers = cli.expect(&["get", "providers"], 0).await;
    assert!(
        providers
            .stdout
            .lines()
            .any(|l| l.starts_with("process ") && l.contains("CONNECTED")),
        "{providers:?}"
    );
    let process = cli
        .expect(&["-o", "json", "get", "provider", "process"], 0)
        .await
        .json();
    assert_eq!(process["status"], "CONNECTED");
    assert_eq!(
        process["resourceTypes"],
        json!(["process.v1.service", "process.v1.job"])
    );

    let elements = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/tour/elements");
    data(&app.gql(
        "mutation($i: CreateRepositoryInput!) { createRepository(input: $i) { id } }",
        json!({ "i": { "name": "tour", "driver": { "local": { "path": elements } }, "syncMode": "COPY" } }),
    )
    .await);
    let repositories = cli.expect(&["get", "repositories"], 0).await;
    assert!(
        repositories
            .stdout
            .lines()
            .any(|l| l.starts_with("tour ") && l.contains("COPY")),
        "{repositories:?}"
    );
    let tour = cli
        .expect(&["-o", "json", "get", "repositories", "tour"], 0)
        .await
        .json();
    assert_eq!(tour["driver"]["kind"], "local", "{tour}");

    // The history of a settled deployment, and no waiting for more.
    let events = cli
        .expect(&["events", "deployment", "web", "--follow"], 0)
        .await;
    let last = events.stdout.lines().rfind(|l| l.contains(" STATE "));
    assert!(last.is_some_and(|l| l.contains("COMPLETE")), "{events:?}");

    // The name is taken while the deployment lives.
    let taken = cli.expect(&["deploy", "-f", blueprint], 5).await;
    assert!(taken.stderr.contains("`web`"), "{taken:?}");

    // A destroy followed live: the command ends when the run does.
    let destroying = cli.expect(&["destroy", "web"], 0).await;
    assert!(destroying.stdout.contains("destroying"), "{destroying:?}");
    let followed = cli
        .expect(&["-o", "json", "events", "deployment", &id, "--follow"], 0)
        .await;
    let events: Vec<Value> = followed
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = events.last().unwrap();
    assert_eq!(
        (&last["kind"], &last["state"]),
        (&json!("STATE"), &json!("DESTROYED")),
        "{events:?}"
    );
    assert_eq!(deployment(&app, &id).await.state, "DESTROYED");
    all_gone(&first_pids).await;

    // Again under another name, then `destroy --wait`: it must not stop at
    // the earlier COMPLETE in the history.
    cli.expect(&["deploy", "-f", blueprint, "--name", "web-2", "--wait"], 0)
        .await;
    let second = cli
        .expect(&["-o", "json", "get", "deployments", "web-2"], 0)
        .await
        .json();
    let second_id = second["id"].as_str().unwrap().to_owned();
    let second_pids = pids(&deployment(&app, &second_id).await);
    let destroyed = cli.expect(&["destroy", "web-2", "--wait"], 0).await;
    assert!(destroyed.stdout.contains("is DESTROYED"), "{destroyed:?}");
    assert!(
        destroyed.stderr.contains("db[0] DESTROYED"),
        "{destroyed:?}"
    );
    assert_eq!(deployment(&app, &second_id).await.state, "DESTROYED");
    all_gone(&second_pids).await;

    let unknown = cli.expect(&["destroy", "nothing-here"], 4).await;
    assert!(
        unknown.stderr.starts_with("corbel: NOT_FOUND: ")
            && unknown.stderr.contains("`nothing-here`"),
        "the text names the code as JSON does: {unknown:?}"
    );
    cli.expect(&["events", "deployment", "nothing-here"], 4)
        .await;
}

#[tokio::test]
async fn a_failing_deploy_exits_1_and_provider_logs_follow() {
    let (app, provider, _repo) = with_process_provider(|_| {}).await;
    let cli = Cli::admin(format!("http://{}", app.addr));
    let blueprint = cli.file("half.yaml", HALF_BROKEN);
    let blueprint = blueprint.to_str().unwrap();

    let failed = cli.expect(&["deploy", "-f", blueprint, "--wait"], 1).await;
    assert!(failed.stdout.contains("is FAILED"), "{failed:?}");
    assert!(
        failed.stderr.contains("bad[0]") && failed.stderr.contains("cannot start"),
        "the error is printed: {failed:?}"
    );

    let failed = cli
        .expect(
            &[
                "-o", "json", "deploy", "-f", blueprint, "--name", "half-2", "--wait",
            ],
            1,
        )
        .await;
    assert_eq!(failed.json()["state"], "FAILED");
    let error: Value = serde_json::from_str(failed.stderr.trim())
        .unwrap_or_else(|e| panic!("only JSON on stderr ({e}): {failed:?}"));
    assert_eq!(error["error"]["code"], "FAILED");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot start"),
        "{error}"
    );

    let logs = cli.expect(&["logs", "provider", "process"], 0).await;
    assert!(logs.stdout.contains("checked out"), "{logs:?}");
    let lines = cli
        .expect(
            &["-o", "json", "logs", "provider", "process", "--tail", "2"],
            0,
        )
        .await;
    assert_eq!(lines.stdout.lines().count(), 2, "{lines:?}");

    // Followed: lines written after it started arrive (a second load's
    // notes, after the first's from the history); Ctrl-C ends it.
    let checked_out = |l: &str| l.contains("checked out");
    let mut follow = Running::spawn(&cli, &["logs", "provider", "process", "--follow"]);
    follow
        .wait_for_lines("the stored lines", 1, checked_out)
        .await;
    for mutation in ["unloadProvider", "loadProvider"] {
        data(
            &app.gql(
                &format!("mutation($id: ID!) {{ {mutation}(id: $id) {{ status }} }}"),
                json!({ "id": provider }),
            )
            .await,
        );
    }
    follow
        .wait_for_lines("the second load's notes, live", 2, checked_out)
        .await;
    let pid = i32::try_from(follow.child.id().unwrap()).unwrap();
    // SAFETY: a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    assert_eq!(follow.exit_code().await, 0);
}

/// Health through the CLI: a process killed behind Corbel's back makes its
/// deployment DOWN in `get deployments` (a HEALTH column, `health` in JSON),
/// and `get deployment NAME` names the resource, its reason and restarts.
/// `db`, then `app`: two processes that run until killed.
const PAIR: &str = r#"
resources:
  db:
    type: process.v1.service
    config: { command: sleep, args: ["300"] }
  app:
    type: process.v1.service
    depends_on: [db]
    config: { command: sleep, args: ["300"] }
"#;

#[tokio::test]
async fn get_shows_health_and_a_resources_reason() {
    use crate::health::support::{fast_health, node, until};
    let (app, _, _repo) = with_process_provider(fast_health).await;
    let cli = Cli::admin(format!("http://{}", app.addr));
    let blueprint = cli.file("pair.yaml", PAIR);
    cli.expect(
        &[
            "deploy",
            "-f",
            blueprint.to_str().unwrap(),
            "--name",
            "pair",
            "--wait",
        ],
        0,
    )
    .await;
    let listed = cli
        .expect(&["-o", "json", "get", "deployments", "pair"], 0)
        .await
        .json();
    let id = listed["id"].as_str().unwrap().to_owned();
    // The same object as YAML.
    let yaml = cli
        .expect(&["-o", "yaml", "get", "deployments", "pair"], 0)
        .await;
    let as_yaml: serde_json::Value = serde_yaml_ng::from_str(&yaml.stdout).unwrap();
    assert_eq!(as_yaml["id"], listed["id"], "{yaml:?}");
    assert_eq!(as_yaml["nodes"], listed["nodes"], "{yaml:?}");
    let healthy = until(&app, &id, "HEALTHY", |d| d["health"] == "HEALTHY").await;
    let table = cli.expect(&["get", "deployments"], 0).await;
    let mut lines = table.stdout.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&header[..3], ["NAME", "STATE", "HEALTH"], "{table:?}");
    assert!(
        lines.any(|l| l
            .split_whitespace()
            .take(3)
            .eq(["pair", "COMPLETE", "HEALTHY"])),
        "{table:?}"
    );

    // Watched: the table, then the row again when it changes.
    let row = |health: &'static str| {
        move |l: &str| {
            l.split_whitespace()
                .take(3)
                .eq(["pair", "COMPLETE", health])
        }
    };
    let mut watch = Running::spawn(&cli, &["get", "deployments", "-w"]);
    watch.wait_for_lines("the table", 1, row("HEALTHY")).await;

    let pid = node(&healthy, "db")["outputs"]["pid"].as_i64().unwrap() as i32;
    crate::support::processes::signal(pid, libc::SIGKILL);
    until(&app, &id, "DOWN", |d| d["health"] == "DOWN").await;
    watch.wait_for_lines("the row, DOWN", 1, row("DOWN")).await;
    let printed = watch.lines.lock().unwrap().clone();
    assert_eq!(
        printed.iter().filter(|l| l.starts_with("NAME")).count(),
        1,
        "{printed:#?}"
    );
    let watched = i32::try_from(watch.child.id().unwrap()).unwrap();
    // SAFETY: a signal to our own child process.
    assert_eq!(unsafe { libc::kill(watched, libc::SIGINT) }, 0);
    assert_eq!(watch.exit_code().await, 0);
    let listed = cli
        .expect(&["-o", "json", "get", "deployments"], 0)
        .await
        .json();
    let pair = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "pair")
        .unwrap();
    assert_eq!(pair["health"], "DOWN", "{pair}");
    let db = pair["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["key"] == "db")
        .unwrap();
    assert_eq!(
        (&db["health"], &db["restarts"]),
        (&json!("DOWN"), &json!(0)),
        "{db}"
    );
    assert!(
        db["healthReason"].as_str().unwrap().contains("SIGKILL"),
        "{db}"
    );

    let detail = cli.expect(&["get", "deployment", "pair"], 0).await;
    assert!(
        detail
            .stdout
            .lines()
            .any(|l| l.starts_with("pair ") && l.contains("DOWN")),
        "{detail:?}"
    );
    let resources: Vec<&str> = detail
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("RESOURCE"))
        .collect();
    let header: Vec<&str> = resources
        .first()
        .unwrap_or_else(|| panic!("{detail:?}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["RESOURCE", "STATE", "HEALTH", "RESTARTS", "ON", "REASON"]
    );
    let row = resources
        .iter()
        .find(|l| l.starts_with("db[0] "))
        .unwrap_or_else(|| panic!("{detail:?}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[..4], ["db[0]", "COMPLETE", "DOWN", "0"], "{row}");
    assert!(row.contains("SIGKILL"), "{row}");
    assert!(
        resources.iter().any(|l| l
            .split_whitespace()
            .take(3)
            .eq(["app[0]", "COMPLETE", "HEALTHY"])),
        "{detail:?}"
    );
    destroy_and_wait(&app, &id, &pids(&deployment(&app, &id).await)).await;
}
