//! The command line client (`corbel login`, `deploy`, `get`, `logs`,
//! `events`, `destroy`, `plan`, `apply`, `revisions`, `rollback`): the real
//! binary run as a subprocess against a real server, with its own `HOME` and
//! `XDG_CONFIG_HOME`, checking what it prints, what it stores and the exit
//! codes it promises. This module holds the harness: a user's machine
//! (`Cli`), what a finished command left (`Ran`) and a command left running
//! (`Running`).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

use crate::support::{ADMIN_TOKEN, corbel_bin};

mod connection;
mod cp;
mod deployments;
mod exec;
mod plans;

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
