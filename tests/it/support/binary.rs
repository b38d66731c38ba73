//! The real `corbel` binary as a child process: `corbel serve` on a store.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use super::{TestStore, corbel_bin};

/// A `corbel serve` child and the address it announced.
pub struct Served {
    pub child: Child,
    pub addr: std::net::SocketAddr,
    /// Its log lines (JSON) so far.
    pub log: Arc<Mutex<Vec<String>>>,
}

/// A test that fails before it stops its server must not leave it running.
impl Drop for Served {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `corbel serve` on `store`, listening on `127.0.0.1:0` unless `extra_env` says
/// otherwise, logging JSON, with piped output.
pub fn serve_command(store: &TestStore, extra_env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(corbel_bin());
    command
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CORBEL_LISTEN", "127.0.0.1:0")
        .env("CORBEL_DATA_DIR", store.data_dir())
        .env("CORBEL_LOG_FORMAT", "json")
        .env(
            "CORBEL_PROVIDER_SANDBOX_READ",
            super::joined(&super::sandbox_read()),
        )
        .env(
            "CORBEL_PROVIDER_SANDBOX_WRITE",
            super::joined(&super::sandbox_write()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(url) = &store.database_url {
        command.env("CORBEL_DATABASE_URL", url);
    }
    command.envs(extra_env.iter().copied());
    command
}

pub fn serve(store: &TestStore, extra_env: &[(&str, &str)]) -> Served {
    spawn_served(serve_command(store, extra_env))
}

/// Runs `command` (a `corbel serve` logging JSON, with piped output) until it
/// announces its address.
pub fn spawn_served(mut command: Command) -> Served {
    let mut child = command.spawn().expect("corbel starts");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let log = Arc::new(Mutex::new(Vec::new()));
    let addr = loop {
        let line = lines
            .next()
            .expect("corbel announces its address before exiting")
            .unwrap();
        let parsed: serde_json::Value = serde_json::from_str(&line).expect("json log lines");
        log.lock().unwrap().push(line);
        if let Some(url) = parsed["url"].as_str() {
            break url.trim_start_matches("http://").parse().unwrap();
        }
    };
    // Keep draining stderr so the child never blocks on a full pipe.
    let kept = log.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            kept.lock().unwrap().push(line);
        }
    });
    Served { child, addr, log }
}

pub fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    child.wait().unwrap()
}

/// A GraphQL request to the server at `addr` as the admin: its body, or
/// `None` when no answer came (a server a test kills may be gone).
pub async fn admin_gql(
    addr: std::net::SocketAddr,
    query: &str,
    variables: serde_json::Value,
) -> Option<serde_json::Value> {
    reqwest::Client::new()
        .post(format!("http://{addr}/graphql"))
        .bearer_auth(super::ADMIN_TOKEN)
        .json(&serde_json::json!({ "query": query, "variables": variables }))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()
}
