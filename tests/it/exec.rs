//! Exec (issue 39): a command run in a deployed service's context through
//! the process provider, over GraphQL (`execResource`), the `/exec`
//! websocket and `corbel exec`: its output and exit status, stdin, a
//! terminal's size, a timeout that kills it with its children, who may, and
//! the audit log.

mod docker;
mod files;
mod socket;

use serde_json::{Value, json};

use crate::health::support::tagged;
use crate::support::deployments::{create_blueprint, deploy, settled, with_process_provider};
use crate::support::{TestApp, data};

/// One service with an environment and a working directory of its own.
const SHELL: &str = r#"
version: "1"
resources:
  app:
    type: process.v1.service
    config:
      command: sleep
      args: ["300"]
      env: { GREETING: "hello from app" }
      cwd: "{{ cwd }}"
variables:
  cwd: { type: string }
"#;

/// A deployed `app` service (in `cwd`): the app, the node's id, the
/// service's pid.
pub(crate) async fn deployed_app(cwd: &std::path::Path) -> (TestApp, String, i32) {
    deployed_app_with(cwd, |_| {}).await
}

/// [`deployed_app`] with the server's configuration adjusted.
pub(crate) async fn deployed_app_with(
    cwd: &std::path::Path,
    adjust: impl FnOnce(&mut corbel::config::Config),
) -> (TestApp, String, i32) {
    let (app, _, _repo) = with_process_provider(adjust).await;
    std::mem::forget(_repo); // the provider's checkout lives as long as the test
    let blueprint = create_blueprint(&app, "shell", SHELL).await;
    let id = deploy(
        &app,
        &blueprint,
        "shell-1",
        json!({ "variables": { "cwd": cwd.display().to_string() } }),
    )
    .await;
    let deployment = settled(&app, &id, &["COMPLETE"]).await;
    let node = deployment.node("app");
    let pid = node.outputs["pid"].as_i64().unwrap() as i32;
    (app, node.id.clone(), pid)
}

async fn exec(app: &TestApp, node: &str, command: &[&str], more: Value) -> Value {
    let mut variables = json!({ "node": node, "command": command });
    variables
        .as_object_mut()
        .unwrap()
        .extend(more.as_object().cloned().unwrap_or_default());
    app.gql(
        "mutation($node: ID!, $command: [String!]!, $stdin: String, $timeout: Int) {
           execResource(nodeId: $node, command: $command, stdin: $stdin, timeoutSeconds: $timeout) {
             stdout stderr exitCode signal timedOut stdoutTruncated stderrTruncated } }",
        variables,
    )
    .await
}

#[tokio::test]
async fn a_command_runs_in_the_services_context_and_answers_its_output_and_status() {
    let cwd = tempfile::tempdir().unwrap();
    let (app, node, pid) = deployed_app(cwd.path()).await;

    let body = exec(
        &app,
        &node,
        &["sh", "-c", "echo \"$GREETING\"; pwd; echo oops >&2"],
        json!({}),
    )
    .await;
    let ran = &data(&body)["execResource"];
    let pwd = cwd.path().canonicalize().unwrap();
    assert_eq!(
        ran["stdout"],
        format!("hello from app\n{}\n", pwd.display()),
        "{body}"
    );
    assert_eq!(ran["stderr"], "oops\n");
    assert_eq!(ran["exitCode"], 0);
    assert_eq!(ran["timedOut"], false);

    let body = exec(&app, &node, &["sh", "-c", "exit 7"], json!({})).await;
    assert_eq!(data(&body)["execResource"]["exitCode"], 7, "{body}");

    let body = exec(&app, &node, &["cat"], json!({ "stdin": "round\ntrip" })).await;
    assert_eq!(
        data(&body)["execResource"]["stdout"],
        "round\ntrip",
        "{body}"
    );

    // Outliving its timeout: killed with the child it started in the
    // background; only the service is left with the resource's tag.
    let body = exec(
        &app,
        &node,
        &["sh", "-c", "sleep 120 & echo started; sleep 120"],
        json!({ "timeout": 1 }),
    )
    .await;
    let ran = &data(&body)["execResource"];
    assert_eq!(ran["timedOut"], true, "{body}");
    assert_eq!(ran["signal"], "SIGKILL");
    assert_eq!(ran["stdout"], "started\n");
    crate::support::eventually(
        std::time::Duration::from_secs(10),
        "only the service left",
        || async { (tagged(&node) == [pid]).then_some(()) },
    )
    .await;

    // Contained like the service: the provider's state is not its to read.
    let body = exec(
        &app,
        &node,
        &["sh", "-c", "echo x > /etc/corbel-exec-probe"],
        json!({}),
    )
    .await;
    let ran = &data(&body)["execResource"];
    assert_ne!(ran["exitCode"], 0, "{body}");
    assert!(!std::path::Path::new("/etc/corbel-exec-probe").exists());

    // Refused with a clear error: no command; a node that is not there.
    let body = exec(&app, &node, &[], json!({})).await;
    assert!(body.to_string().contains("command"), "{body}");
    let body = exec(
        &app,
        &uuid::Uuid::now_v7().to_string(),
        &["true"],
        json!({}),
    )
    .await;
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "NOT_FOUND",
        "{body}"
    );

    // The audit log has the command and its status, not its stdin.
    let body = app
        .gql(
            "{ auditLog(filter: { actions: [\"execResource\"] }) { edges { node { arguments outcome } } } }",
            json!({}),
        )
        .await;
    let entries = data(&body)["auditLog"]["edges"].as_array().unwrap().clone();
    let with_stdin = entries
        .iter()
        .find(|e| e["node"]["arguments"]["command"] == json!(["cat"]))
        .unwrap_or_else(|| panic!("an entry for `cat`: {body}"));
    assert_eq!(with_stdin["node"]["arguments"]["stdin"], "***", "{body}");
    assert_eq!(with_stdin["node"]["arguments"]["exitCode"], 0, "{body}");
    assert!(
        entries
            .iter()
            .any(|e| e["node"]["arguments"]["exitCode"] == 7),
        "{body}"
    );
}
