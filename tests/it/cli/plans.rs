//! Changes through the CLI: `plan` as a text diff or JSON, `apply`,
//! `revisions` and `rollback`.

use super::Cli;
use crate::support::deployments::{deployment, pids, with_process_provider};
use crate::support::processes::all_gone;

const GREETER: &str = r#"
variables:
  greeting: { type: string, default: hello }
  replicas: { type: int, default: 1 }
resources:
  greeter:
    type: process.v1.service
    replicas: "{{ replicas }}"
    config: { command: sleep, args: ["300"], env: { GREETING: "{{ greeting }}" } }
"#;

#[tokio::test]
async fn plan_apply_revisions_and_rollback_through_the_cli() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    let cli = Cli::admin(format!("http://{}", app.addr));
    let file = cli.file("greeter.yaml", GREETER);
    let file = file.to_str().unwrap();
    cli.expect(&["deploy", "-f", file, "--wait"], 0).await;

    // A diff in text, nothing run.
    let planned = cli
        .expect(
            &[
                "plan",
                "greeter",
                "--var",
                "greeting=hi",
                "--var",
                "replicas=2",
            ],
            0,
        )
        .await;
    assert!(
        planned.stdout.contains("-/+ greeter[0] replace"),
        "{planned:?}"
    );
    assert!(
        planned.stdout.contains("+ greeter[1] create"),
        "{planned:?}"
    );
    assert!(
        planned
            .stdout
            .contains("1 to create, 0 to update, 1 to replace"),
        "{planned:?}"
    );
    let listed = cli
        .expect(&["-o", "json", "get", "deployments", "greeter"], 0)
        .await
        .json();
    assert_eq!(
        listed["nodes"].as_array().unwrap().len(),
        1,
        "a plan runs nothing"
    );

    // The same plan as JSON, applied with --wait.
    let plan = cli
        .expect(
            &[
                "-o",
                "json",
                "plan",
                "greeter",
                "--var",
                "greeting=hi",
                "--var",
                "replicas=2",
            ],
            0,
        )
        .await
        .json();
    assert_eq!(plan["summary"]["replace"], 1);
    let plan_id = plan["id"].as_str().unwrap();
    let applied = cli.expect(&["apply", plan_id, "--wait"], 0).await;
    assert!(applied.stdout.contains("is COMPLETE"), "{applied:?}");
    let again = cli.expect(&["apply", plan_id], 5).await;
    assert!(again.stderr.contains("applied already"), "{again:?}");

    let revisions = cli
        .expect(&["-o", "json", "revisions", "greeter"], 0)
        .await
        .json();
    let kinds: Vec<&str> = revisions
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["DEPLOY", "APPLY"]);

    let back = cli.expect(&["rollback", "greeter", "1", "--wait"], 0).await;
    assert!(back.stdout.contains("- greeter[1] destroy"), "{back:?}");
    let listed = cli
        .expect(&["-o", "json", "get", "deployments", "greeter"], 0)
        .await
        .json();
    assert_eq!(listed["variables"]["greeting"], "hello");
    assert_eq!(listed["nodes"].as_array().unwrap().len(), 1);
    let table = cli.expect(&["revisions", "greeter"], 0).await;
    assert!(
        table
            .stdout
            .lines()
            .any(|l| l.starts_with("3 ") && l.contains("ROLLBACK") && l.contains("COMPLETE")),
        "{table:?}"
    );
    cli.expect(&["rollback", "greeter", "9"], 4).await;

    let id = listed["id"].as_str().unwrap().to_owned();
    let running = pids(&deployment(&app, &id).await);
    cli.expect(&["destroy", "greeter", "--wait"], 0).await;
    all_gone(&running).await;
    app.stop().await;
}
