//! The command line client (`corbel login`, `deploy`, `get`, `logs`,
//! `events`, `destroy`): the real binary run as a subprocess against a real
//! server, with its own `HOME` and `XDG_CONFIG_HOME`, checking what it
//! prints, what it stores and the exit codes it promises.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

use crate::support::deployments::{deployment, pids, with_process_provider};
use crate::support::processes::all_gone;
use crate::support::{ADMIN_TOKEN, TestApp, corbel_bin, data, error_code};

/// The longest any one command may take (a deploy with `--wait` included).
const DEADLINE: Duration = Duration::from_secs(120);

/// A user's machine: a home of its own, pointed at one server.
struct Cli {
    home: TempDir,
    server: String,
    /// Sent as `CORBEL_TOKEN` when set.
    token: Option<String>,
}

/// What a finished command left.
#[derive(Debug)]
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Ran {
    #[track_caller]
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }
}

impl Cli {
    fn new(server: String) -> Cli {
        Cli {
            home: tempfile::tempdir().unwrap(),
            server,
            token: None,
        }
    }

    /// As the admin, by `CORBEL_TOKEN`.
    fn admin(server: String) -> Cli {
        Cli {
            token: Some(ADMIN_TOKEN.to_owned()),
            ..Cli::new(server)
        }
    }

    fn credentials(&self) -> PathBuf {
        self.home.path().join("config/corbel/credentials.toml")
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.home.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(corbel_bin());
        command
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", self.home.path())
            .env("XDG_CONFIG_HOME", self.home.path().join("config"))
            .env("CORBEL_URL", &self.server)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(token) = &self.token {
            command.env("CORBEL_TOKEN", token);
        }
        command
    }

    async fn run(&self, args: &[&str]) -> Ran {
        self.run_with_stdin(args, "").await
    }

    async fn run_with_stdin(&self, args: &[&str], stdin: &str) -> Ran {
        let mut child = self.command(args).spawn().expect("corbel starts");
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.as_bytes()).await.unwrap();
        drop(input);
        let output = tokio::time::timeout(DEADLINE, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("`corbel {}` ended within {DEADLINE:?}", args.join(" ")))
            .unwrap();
        Ran {
            code: output.status.code().expect("exited, not killed"),
            stdout: String::from_utf8(output.stdout).unwrap(),
            stderr: String::from_utf8(output.stderr).unwrap(),
        }
    }

    /// Runs `args` and expects `code`.
    #[track_caller]
    fn expect<'a>(
        &'a self,
        args: &'a [&'a str],
        code: i32,
    ) -> impl std::future::Future<Output = Ran> + 'a {
        let caller = std::panic::Location::caller();
        async move {
            let ran = self.run(args).await;
            assert_eq!(
                ran.code,
                code,
                "{caller}: `corbel {}` exit code: {ran:?}",
                args.join(" ")
            );
            ran
        }
    }
}

/// A child left running, its stdout gathered line by line.
struct Running {
    child: tokio::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Running {
    fn spawn(cli: &Cli, args: &[&str]) -> Running {
        let mut child = cli.command(args).spawn().expect("corbel starts");
        let stdout = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let kept = lines.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                kept.lock().unwrap().push(line);
            }
        });
        Running { child, lines }
    }

    /// Waits until `count` of the lines printed so far pass `wanted`.
    async fn wait_for_lines(&self, what: &str, count: usize, wanted: impl Fn(&str) -> bool) {
        let deadline = std::time::Instant::now() + DEADLINE;
        loop {
            let lines = self.lines.lock().unwrap().clone();
            if lines.iter().filter(|l| wanted(l)).count() >= count {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}; printed: {lines:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn exit_code(&mut self) -> i32 {
        tokio::time::timeout(DEADLINE, self.child.wait())
            .await
            .expect("the command ends in time")
            .unwrap()
            .code()
            .expect("exited, not killed")
    }
}

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
async fn login_stores_a_private_token_that_later_commands_use_and_logout_revokes() {
    let app = TestApp::spawn().await;
    data(
        &app.gql(
            r#"mutation { setPassword(newPassword: "correct horse battery") }"#,
            json!({}),
        )
        .await,
    );
    let cli = Cli::new(format!("http://{}", app.addr));

    let refused = cli
        .run_with_stdin(
            &["login", "--user", "admin", "--password-stdin"],
            "wrong horse\n",
        )
        .await;
    assert_eq!(refused.code, 3, "{refused:?}");
    assert!(refused.stderr.contains("UNAUTHENTICATED"), "{refused:?}");
    assert!(!cli.credentials().exists());
    cli.expect(&["get", "providers"], 3).await;

    let signed_in = cli
        .run_with_stdin(
            &["login", "--user", "admin", "--password-stdin"],
            "correct horse battery\n",
        )
        .await;
    assert_eq!(signed_in.code, 0, "{signed_in:?}");
    let file = cli.credentials();
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", file.display());
    let dir_mode = std::fs::metadata(file.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700);
    let stored: toml::Table = std::fs::read_to_string(&file).unwrap().parse().unwrap();
    let token = stored["token"].as_str().unwrap().to_owned();
    assert_eq!(stored["server"].as_str(), Some(cli.server.as_str()));
    assert!(
        !signed_in.stdout.contains(&token) && !signed_in.stderr.contains(&token),
        "the token is never printed: {signed_in:?}"
    );
    // An API token of the CLI's own, and the session that made it ended.
    let tokens = app
        .gql_as(
            Some(&token),
            "{ me { apiTokens { nodes { name kind } } } }",
            json!({}),
        )
        .await;
    let tokens = data(&tokens)["me"]["apiTokens"]["nodes"].clone();
    let tokens = tokens.as_array().unwrap();
    assert!(
        tokens
            .iter()
            .any(|t| t["kind"] == "API" && t["name"].as_str().unwrap().starts_with("cli@")),
        "{tokens:?}"
    );
    assert!(
        !tokens.iter().any(|t| t["kind"] == "SESSION"),
        "the login session is ended: {tokens:?}"
    );

    // Later commands sign in with it: no flag, no variable.
    let listed = cli.expect(&["get", "providers"], 0).await;
    assert!(listed.stdout.starts_with("NAME"), "{listed:?}");
    assert_eq!(
        cli.expect(&["-o", "json", "get", "providers"], 0)
            .await
            .json(),
        json!([])
    );
    let unknown = cli.expect(&["get", "providers", "nowhere"], 4).await;
    assert!(unknown.stderr.contains("`nowhere`"), "{unknown:?}");

    // The replicas: this server, alive and leading.
    let replicas = cli.expect(&["get", "replicas"], 0).await;
    let row = replicas
        .stdout
        .lines()
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    assert!(
        replicas.stdout.starts_with("ID") && row.contains("ALIVE") && row.contains("yes"),
        "{replicas:?}"
    );
    let replicas = cli
        .expect(&["-o", "json", "get", "replicas"], 0)
        .await
        .json();
    assert_eq!(replicas.as_array().map(Vec::len), Some(1), "{replicas}");
    assert_eq!(replicas[0]["advertiseUrl"], format!("http://{}", app.addr));

    cli.expect(&["logout"], 0).await;
    assert!(!cli.credentials().exists());
    let after = app
        .gql_as(Some(&token), "{ me { username } }", json!({}))
        .await;
    assert_eq!(
        error_code(&after),
        Some("UNAUTHENTICATED"),
        "revoked: {after}"
    );
    cli.expect(&["get", "providers"], 3).await;

    let bogus = Cli {
        token: Some("cbl_not_a_token".to_owned()),
        ..Cli::new(cli.server.clone())
    };
    let refused = bogus.expect(&["-o", "json", "get", "deployments"], 3).await;
    let error: Value = serde_json::from_str(refused.stderr.trim()).unwrap();
    assert_eq!(error["error"]["code"], "UNAUTHENTICATED", "{refused:?}");
    assert!(refused.stdout.is_empty());
}

#[tokio::test]
async fn an_unreachable_server_exits_6() {
    // A port that was free a moment ago: nothing listens there now.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cli = Cli::admin(format!("http://127.0.0.1:{port}"));
    let ran = cli.expect(&["get", "deployments"], 6).await;
    assert!(ran.stderr.contains("cannot reach"), "{ran:?}");
    let ran = cli
        .expect(&["-o", "json", "events", "deployment", "web"], 6)
        .await;
    assert!(ran.stdout.is_empty(), "{ran:?}");
    let error: Value = serde_json::from_str(ran.stderr.trim()).unwrap();
    assert_eq!(error["error"]["code"], "UNREACHABLE");
    assert_eq!(error["error"]["exitCode"], 6);

    let help = cli.expect(&["--help"], 0).await;
    assert!(
        help.stdout.contains("Exit codes")
            && help.stdout.contains("6  the server cannot be reached"),
        "{help:?}"
    );
    cli.expect(&["get", "everything"], 2).await;
}

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
    assert_eq!(process["resourceTypes"], json!(["process.v1.service"]));

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
    assert!(unknown.stderr.contains("`nothing-here`"), "{unknown:?}");
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
