//! The README's tour, run as written: the files under `docs/tour/` are the
//! tour, the README shows each of them verbatim (a `<!-- docs/tour/… -->`
//! line above its block), and this test runs the shell steps in the README's
//! order with bash, curl and jq against the real `corbel serve`, loading the
//! process provider from this very repository as the tour says.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::TestStore;
use crate::support::binary::{serve, terminate};
use crate::support::corbel_bin;

/// The first load builds the process provider in release (the suite's
/// script builds it ahead, so this is the bound for a machine without that).
const TOUR_DEADLINE: Duration = Duration::from_secs(20 * 60);

/// The variables of the test's environment that change what cargo builds.
const BUILD_ENV: &[&str] = &[
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
];

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Each `<!-- docs/tour/… -->` marker of the README with the fenced block
/// under it.
fn readme_blocks() -> Vec<(String, String)> {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        let Some(file) = line
            .strip_prefix("<!-- ")
            .and_then(|rest| rest.strip_suffix(" -->"))
            .filter(|f| f.starts_with("docs/tour/"))
        else {
            continue;
        };
        let fence = lines.next().unwrap_or_default();
        assert!(
            fence.starts_with("```"),
            "{file}: no code block under its marker"
        );
        let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        blocks.push((file.to_owned(), body.join("\n") + "\n"));
    }
    blocks
}

fn tour_files(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            tour_files(&path, out);
        } else {
            let relative = path.strip_prefix(repo_root()).unwrap();
            out.push(relative.to_string_lossy().into_owned());
        }
    }
}

#[test]
fn the_readme_shows_every_tour_file_as_it_is() {
    let blocks = readme_blocks();
    let mut files = Vec::new();
    tour_files(&repo_root().join("docs/tour"), &mut files);
    for file in &files {
        if file.ends_with("gql.sh") {
            continue; // sourced by the reader, not shown
        }
        assert!(
            blocks.iter().any(|(shown, _)| shown == file),
            "README.md does not show {file}"
        );
    }
    for (file, body) in &blocks {
        let text = std::fs::read_to_string(repo_root().join(file))
            .unwrap_or_else(|e| panic!("README.md shows {file}, which cannot be read: {e}"));
        assert_eq!(
            body, &text,
            "README.md's block for {file} differs from the file"
        );
    }
}

#[tokio::test]
async fn the_readme_tour_runs_as_written() {
    let store = TestStore::fresh().await;
    let token = "cbl_tour_token_0123456789abcdef";
    // The provider's build goes where the suite's script built it ahead.
    let target = corbel_bin()
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_owned();
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let mut env = vec![
        ("CORBEL_ADMIN_TOKEN".to_owned(), token.to_owned()),
        ("CARGO_TARGET_DIR".to_owned(), target.display().to_string()),
        ("HOME".to_owned(), home),
        // A debug build hashes passwords slowly on a loaded machine.
        (
            "CORBEL_GRAPHQL_REQUEST_TIMEOUT_MS".to_owned(),
            "120000".to_owned(),
        ),
    ];
    // What decides how cargo compiles, as the user's shell would pass it to
    // the server and so to the provider's build: with the same flags as the
    // suite's script's build ahead, the provider's load compiles only its
    // own crates (CI builds with clippy as the compiler and `-D warnings`).
    for name in BUILD_ENV {
        if let Ok(value) = std::env::var(name) {
            env.push(((*name).to_owned(), value));
        }
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut served = serve(&store, &env);
    let steps: Vec<String> = readme_blocks()
        .into_iter()
        .map(|(file, _)| file)
        .filter(|file| file.ends_with(".sh"))
        .collect();
    assert!(steps.len() >= 5, "{steps:?}");
    let script = std::iter::once("set -euo pipefail; source docs/tour/gql.sh".to_owned())
        .chain(steps.iter().map(|s| format!("echo '### {s}'; source {s}")))
        .collect::<Vec<_>>()
        .join("\n");
    let output = tempfile::tempdir().unwrap();
    let log = output.path().join("tour.log");
    let mut bash = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(repo_root())
        .env("CORBEL", format!("http://{}", served.addr))
        .env("TOKEN", token)
        .env("CORBEL_SRC", repo_root())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::from(
            std::fs::OpenOptions::new().append(true).open(&log).unwrap(),
        ))
        .spawn()
        .expect("bash runs");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = bash.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > TOUR_DEADLINE {
            let _ = bash.kill();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let said = std::fs::read_to_string(&log).unwrap();
    let server_log = served.log.lock().unwrap().join("\n");
    assert!(
        status.is_some_and(|s| s.success()),
        "the tour failed ({status:?}):\n{said}\n--- server log ---\n{server_log}"
    );
    for fact in [
        ".provider.status: CONNECTED",
        ".repository.status: ACTIVE",
        ".element.status: ACTIVE",
        ".deployment.state: COMPLETE",
        ".deployment.health: DOWN",
        "killed by SIGKILL",
        "HEALTHY after 1 restart",
        "\"exitCode\": 3",
        ".deployment.state: DESTROYED",
        "refused, as expected: web depends on core",
        "\"key\": \"web\"",
    ] {
        assert!(
            said.contains(fact),
            "`{fact}` not in the tour's output:\n{said}"
        );
    }
    assert!(terminate(&mut served.child).success());
}
