//! The real `corbel` binary: signals, subcommands, configuration.

use std::io::{BufRead, BufReader};
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::support::binary::{serve, terminate};
use crate::support::websocket::{next_json, subscribe_server_events};
use crate::support::{ADMIN_TOKEN, TestStore, corbel_bin, eventually};

#[tokio::test]
async fn sigterm_drains_streams_and_exits_zero() {
    let store = TestStore::fresh().await;
    let mut served = serve(&store, &[("CORBEL_ADMIN_TOKEN", ADMIN_TOKEN)]);
    let client = reqwest::Client::new();
    let url = format!("http://{}/readyz", served.addr);
    eventually(Duration::from_secs(10), "readiness", || async {
        let r = client.get(&url).send().await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    let mut ws = subscribe_server_events(served.addr).await;
    // The subscription is live once an event arrives through it.
    let mut live = false;
    for i in 0..50 {
        client
            .post(format!("http://{}/graphql", served.addr))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"query": format!("mutation {{ createApiToken(name: \"t{i}\") {{ token }} }}")}))
            .send()
            .await
            .unwrap();
        if let Ok(Some(m)) =
            tokio::time::timeout(Duration::from_millis(200), next_json(&mut ws)).await
            && m["type"] == "next"
        {
            live = true;
            break;
        }
    }
    assert!(live, "subscription delivered an event");

    let status = tokio::task::spawn_blocking(move || terminate(&mut served.child))
        .await
        .unwrap();
    let mut completed = false;
    while let Some(message) = next_json(&mut ws).await {
        completed |= message["type"] == "complete";
    }
    assert!(completed, "the open subscription was completed");
    assert!(status.success(), "exit status {status:?}");
}

#[tokio::test]
async fn first_start_prints_a_working_admin_token_once() {
    let store = TestStore::fresh().await;
    let mut served = serve(&store, &[]);
    let mut stdout = BufReader::new(served.child.stdout.take().unwrap());
    let mut printed = String::new();
    let token = loop {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "token printed: {printed}"
        );
        printed.push_str(&line);
        if let Some(token) = line.split_whitespace().find(|w| w.starts_with("cbl_")) {
            break token.to_owned();
        }
    };
    let body: serde_json::Value = reqwest::Client::new()
        .post(format!("http://{}/graphql", served.addr))
        .bearer_auth(&token)
        .json(&json!({"query": "{ me { username } }"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["data"]["me"]["username"], "admin", "{body}");
    assert!(terminate(&mut served.child).success());

    // The second start on the same data makes no new token.
    let mut again = serve(&store, &[]);
    assert!(terminate(&mut again.child).success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut again.child.stdout.take().unwrap(), &mut rest).unwrap();
    assert!(!rest.contains("cbl_"), "no second token: {rest}");
}

#[test]
fn subcommands_version_schema_config_migrate() {
    let version = Command::new(corbel_bin())
        .arg("--version")
        .output()
        .unwrap();
    assert!(version.status.success());
    assert!(String::from_utf8_lossy(&version.stdout).contains(env!("CARGO_PKG_VERSION")));

    let schema = Command::new(corbel_bin()).arg("schema").output().unwrap();
    assert!(schema.status.success());
    assert_eq!(
        String::from_utf8(schema.stdout).unwrap(),
        corbel::api::sdl()
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("corbel.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:9999\"\nlog_format = \"json\"\n",
    )
    .unwrap();
    let config = Command::new(corbel_bin())
        .args(["config", "--config"])
        .arg(&file)
        .env(
            "CORBEL_DATABASE_URL",
            "postgres://corbel:hunter2@127.0.0.1:5432/corbel",
        )
        .env("CORBEL_ADMIN_TOKEN", "tok-very-secret-value")
        .output()
        .unwrap();
    assert!(config.status.success());
    let shown = String::from_utf8(config.stdout).unwrap();
    assert!(shown.contains("127.0.0.1:9999"), "{shown}");
    assert!(shown.contains("json"), "{shown}");
    assert!(
        !shown.contains("hunter2") && !shown.contains("tok-very-secret-value"),
        "{shown}"
    );

    let bad = Command::new(corbel_bin())
        .args(["config", "--database-url", "mysql://x/y"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unsupported scheme"));

    let migrate = Command::new(corbel_bin())
        .args(["migrate", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        migrate.status.success(),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    let database = dir.path().join("corbel.db");
    // Readable by its owner only: it holds password and token hashes.
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&database).unwrap().permissions(),
    );
    assert_eq!(mode & 0o077, 0, "corbel.db is {mode:o}");

    // A database a newer server migrated is refused, naming both versions.
    let future = "m20991231_000001_from_the_future";
    rusqlite::Connection::open(&database)
        .unwrap()
        .execute(
            "INSERT INTO seaql_migrations (version, applied_at) VALUES (?1, 0)",
            [future],
        )
        .unwrap();
    let refused = Command::new(corbel_bin())
        .args(["migrate", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    let ours = corbel::store::schema_version();
    assert!(said.contains(future) && said.contains(&ours), "{said}");
}

/// `{ me { apiTokens … } }` as `token`: the names of the admin's tokens, or
/// `None` when the token is refused.
async fn token_names(addr: std::net::SocketAddr, token: &str) -> Option<Vec<String>> {
    let body: serde_json::Value = reqwest::Client::new()
        .post(format!("http://{addr}/graphql"))
        .bearer_auth(token)
        .json(&json!({"query": "{ me { apiTokens { edges { node { name } } } } }"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let edges = body["data"]["me"]["apiTokens"]["edges"].as_array()?;
    Some(
        edges
            .iter()
            .map(|e| e["node"]["name"].as_str().unwrap().to_owned())
            .collect(),
    )
}

#[tokio::test]
async fn a_changed_admin_token_replaces_the_one_given_before_and_says_so() {
    const NEXT: &str = "cbl_the_next_admin_token_0123456789";
    let store = TestStore::fresh().await;
    let mut first = serve(&store, &[("CORBEL_ADMIN_TOKEN", ADMIN_TOKEN)]);
    assert_eq!(
        token_names(first.addr, ADMIN_TOKEN).await,
        Some(vec!["CORBEL_ADMIN_TOKEN".to_owned()])
    );
    assert!(terminate(&mut first.child).success());

    let mut second = serve(&store, &[("CORBEL_ADMIN_TOKEN", NEXT)]);
    assert_eq!(
        token_names(second.addr, NEXT).await,
        Some(vec!["CORBEL_ADMIN_TOKEN".to_owned()]),
        "one token from the environment, not two"
    );
    assert_eq!(
        token_names(second.addr, ADMIN_TOKEN).await,
        None,
        "the token given before no longer works"
    );
    assert!(terminate(&mut second.child).success());
    let said = second.log.lock().unwrap().join("\n");
    assert!(
        said.contains("CORBEL_ADMIN_TOKEN changed"),
        "the replacement is logged: {said}"
    );
    assert!(!said.contains(NEXT), "the token itself is not logged");

    // The same token again changes nothing and says nothing.
    let mut third = serve(&store, &[("CORBEL_ADMIN_TOKEN", NEXT)]);
    assert_eq!(
        token_names(third.addr, NEXT).await,
        Some(vec!["CORBEL_ADMIN_TOKEN".to_owned()])
    );
    assert!(terminate(&mut third.child).success());
    let said = third.log.lock().unwrap().join("\n");
    assert!(!said.contains("CORBEL_ADMIN_TOKEN changed"), "{said}");
}

/// `corbel ARGS` with only `PATH` and `env` in its environment: stdout, or a
/// panic with stderr.
fn corbel_output(args: &[&str], env: &[(&str, &str)]) -> String {
    let output = Command::new(corbel_bin())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "corbel {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn the_printed_config_is_a_config_file_that_reads_back_the_same() {
    let store = tempfile::tempdir().unwrap();
    let data_dir = store.path().to_str().unwrap();
    let file = store.path().join("corbel.toml");
    let file = file.to_str().unwrap();
    // Defaults, then a setting changed in every section.
    for flags in [
        &[][..],
        &[
            "--graphql-max-depth",
            "9",
            "--login-user-burst",
            "3",
            "--login-trusted-proxy",
            "10.0.0.1",
            "--repo-refresh-check-ms",
            "77",
            "--provider-call-timeout-ms",
            "1234",
            "--provider-git-schemes",
            "https,file",
            "--deploy-concurrency",
            "4",
            "--session-ttl-seconds",
            "60",
        ][..],
    ] {
        let mut args = vec!["config", "--data-dir", data_dir];
        args.extend_from_slice(flags);
        let printed = corbel_output(&args, &[("CORBEL_LISTEN", "127.0.0.1:0")]);
        for key in [
            "listen = \"127.0.0.1:0\"",
            "session_ttl_seconds = ",
            "shutdown_grace_seconds = ",
            "[graphql]",
            "max_depth = ",
            "[login]",
            "user_burst = ",
            "[repository]",
            "refresh_check_ms = ",
            "[provider]",
            "call_timeout_ms = ",
            "[deploy]",
            "concurrency = ",
        ] {
            assert!(printed.contains(key), "{key} in:\n{printed}");
        }
        std::fs::write(file, &printed).unwrap();
        let again = corbel_output(&["--config", file, "config"], &[]);
        assert_eq!(again, printed, "read back the same");
    }
    assert!(
        std::fs::read_to_string(file)
            .unwrap()
            .contains("call_timeout_ms = 1234")
    );
}

#[tokio::test]
async fn serve_starts_from_a_printed_config() {
    let store = TestStore::fresh().await;
    let data_dir = store.data_dir();
    let file = data_dir.join("printed.toml");
    let mut env = vec![
        ("CORBEL_LISTEN", "127.0.0.1:0"),
        ("CORBEL_LOG_FORMAT", "json"),
        ("CORBEL_DATA_DIR", data_dir.to_str().unwrap()),
    ];
    // The real password is not in the printed file: it comes with the
    // environment, as the file's comment says.
    if let Some(url) = &store.database_url {
        env.push(("CORBEL_DATABASE_URL", url));
    }
    std::fs::write(&file, corbel_output(&["config"], &env)).unwrap();
    let mut command = Command::new(corbel_bin());
    command
        .arg("serve")
        .arg("--config")
        .arg(&file)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CORBEL_ADMIN_TOKEN", ADMIN_TOKEN)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(url) = &store.database_url {
        command.env("CORBEL_DATABASE_URL", url);
    }
    let mut served = crate::support::binary::spawn_served(command);
    let ready = reqwest::get(format!("http://{}/readyz", served.addr))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    assert!(terminate(&mut served.child).success());
}

#[test]
fn a_missing_config_file_is_named_in_one_line() {
    let output = Command::new(corbel_bin())
        .args(["--config", "/nonexistent/corbel.toml", "config"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(
        stderr,
        "corbel: config file /nonexistent/corbel.toml does not exist (named by --config or \
         CORBEL_CONFIG)\n"
    );
}

#[test]
fn help_shows_each_default_and_environment_variable() {
    let help = corbel_output(&["serve", "--help"], &[]);
    for shown in [
        "[default: 127.0.0.1:8080]",
        "[env: CORBEL_LISTEN=]",
        "[default: corbel-data]",
        "[default: SQLite at <data-dir>/corbel.db]",
        "[env: CORBEL_DATABASE_URL]",
        "[default: 30000]",
        "[env: CORBEL_PROVIDER_CALL_TIMEOUT_MS=]",
        "[default: https,http,git,ssh,file]",
        "[default: 16]",
    ] {
        assert!(help.contains(shown), "{shown} in:\n{help}");
    }
}

/// A client command's help names its own arguments and the client's
/// flags, none of the server's; a server command's shows those.
#[test]
fn client_help_has_no_server_flag() {
    for args in [
        &["get", "--help"][..],
        &["get", "deployments", "-h"],
        &["help", "deploy"],
        &["--server", "http://x", "logs", "provider", "--help"],
    ] {
        let help = corbel_output(args, &[]);
        assert!(help.contains("--server <URL>"), "{args:?}:\n{help}");
        assert!(help.contains("--output"), "{args:?}:\n{help}");
        assert!(help.contains("Exit codes"), "{args:?}:\n{help}");
        for server in [
            "--listen",
            "--data-dir",
            "--database-url",
            "--provider-call-timeout-ms",
            "--cluster",
        ] {
            assert!(!help.contains(server), "{server} in {args:?}:\n{help}");
        }
        assert!(help.lines().count() < 40, "{args:?}:\n{help}");
    }
    for args in [
        &["serve", "--help"][..],
        &["migrate", "--help"],
        &["config", "--help"],
    ] {
        let help = corbel_output(args, &[]);
        assert!(help.contains("--data-dir"), "{args:?}:\n{help}");
    }
}

/// `corbel completion` writes each shell's script; bash loads it and
/// completes the commands and a client command's flags.
#[test]
fn completion_scripts_load_and_complete() {
    for shell in ["bash", "zsh", "fish"] {
        let script = corbel_output(&["completion", shell], &[]);
        assert!(script.contains("corbel"), "{shell}");
        assert!(script.contains("deployments"), "{shell}");
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("corbel.bash");
    std::fs::write(&script, corbel_output(&["completion", "bash"], &[])).unwrap();
    let complete = |line: &str| {
        let words: Vec<&str> = line.split(' ').collect();
        let probe = format!(
            "source {}; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}; _corbel corbel; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display(),
            words
                .iter()
                .map(|w| format!("'{w}'"))
                .collect::<Vec<_>>()
                .join(" "),
            words.len() - 1,
        );
        let out = Command::new("bash").args(["-c", &probe]).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let commands = complete("corbel de");
    assert!(commands.lines().any(|c| c == "deploy"), "{commands}");
    let kinds = complete("corbel get ");
    assert!(kinds.lines().any(|c| c == "deployments"), "{kinds}");
}

#[test]
fn pretty_logs_have_no_colours_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(corbel_bin())
        .args(["migrate", "--log-format", "pretty", "--data-dir"])
        .arg(dir.path())
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    assert!(output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("migrations applied"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "no escape codes: {stderr:?}");
}
