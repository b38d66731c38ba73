//! Git for the tests: running `git` in a directory, and `git daemon` on a
//! loopback port.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::eventually;
use super::nginx::free_port;

/// Runs `git args` in `dir` (a fixed identity, `main` as the first branch)
/// and returns its trimmed output; a failure fails the test.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(["-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `git daemon` exporting every repository under a directory, on a free
/// loopback port; killed on [`GitDaemon::stop`] or drop.
pub struct GitDaemon {
    pub port: u16,
    child: Child,
}

impl GitDaemon {
    /// Starts it and waits until it accepts connections.
    pub async fn start(base: &Path) -> GitDaemon {
        let port = free_port();
        let child = Command::new("git")
            .args([
                "daemon",
                "--reuseaddr",
                "--export-all",
                &format!("--base-path={}", base.display()),
                &format!("--port={port}"),
                "--listen=127.0.0.1",
            ])
            .arg(base)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("git daemon starts");
        eventually(Duration::from_secs(10), "git daemon", || async {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .ok()
                .map(drop)
        })
        .await;
        GitDaemon { port, child }
    }

    pub fn stop(mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

impl Drop for GitDaemon {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}
