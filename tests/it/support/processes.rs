//! Processes as `/proc` shows them: alive or gone, waiting for them to exit,
//! a provider's pid (from the `provider.pid` its run command writes), a
//! process's state, start time and parent, and signals.

use std::path::PathBuf;
use std::time::Duration;

use super::{TestStore, eventually};

/// Whether `pid` runs; a zombie (exited, not yet reaped) counts as gone.
pub fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let exists = unsafe { libc::kill(pid, 0) } == 0;
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(") ").next().is_some_and(|r| r.starts_with('Z')))
        .unwrap_or(true);
    exists && !zombie
}

/// Waits (20 s at most) until `pid` has exited.
pub async fn gone(pid: i32) {
    eventually(Duration::from_secs(20), "the process to exit", || async {
        (!alive(pid)).then_some(())
    })
    .await;
}

/// Waits (30 s at most) until every one of `pids` has exited.
pub async fn all_gone(pids: &[i32]) {
    eventually(Duration::from_secs(30), "the processes to exit", || async {
        pids.iter().all(|p| !alive(*p)).then_some(())
    })
    .await;
}

/// The file provider `id`'s run command writes its pid to.
fn provider_pid_file(store: &TestStore, id: &str) -> PathBuf {
    store
        .data_dir()
        .join("providers")
        .join(id)
        .join("src")
        .join("provider.pid")
}

/// Provider `id`'s process, from its pid file (a restart writes a new one).
pub fn provider_pid(store: &TestStore, id: &str) -> i32 {
    let file = provider_pid_file(store, id);
    std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
        .trim()
        .parse()
        .unwrap()
}

/// The provider's process and its state letter, if it runs (not a zombie).
pub fn provider_process(store: &TestStore, provider: &str) -> Option<(i32, char)> {
    let file = provider_pid_file(store, provider);
    let pid: i32 = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
    let (state, _) = stat(pid)?;
    (!matches!(state, 'Z' | 'X')).then_some((pid, state))
}

/// A process's state letter and start time, from `/proc/<pid>/stat`.
pub fn stat(pid: i32) -> Option<(char, u64)> {
    let fields = stat_fields(pid)?;
    let state = fields.first()?.chars().next()?;
    // Field 22 of proc_pid_stat(5), the 20th after the name.
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

/// A process's parent.
pub fn parent(pid: i32) -> Option<i32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// The fields of `/proc/<pid>/stat` after the name (which may hold spaces).
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(
        stat.rsplit_once(") ")?
            .1
            .split(' ')
            .map(str::to_owned)
            .collect(),
    )
}

pub fn signal(pid: i32, signal: libc::c_int) {
    // SAFETY: only aimed at processes this test made, found by their mark or
    // checked by start time by the callers.
    unsafe { libc::kill(pid, signal) };
}

/// A provider never outlives its server: `corbel serve` (the real binary, with
/// `extra_env`) on `store` loads provider `id` again, is killed with SIGKILL,
/// and the provider's process exits by itself.
pub async fn provider_exits_when_its_server_is_killed(
    store: &TestStore,
    id: &str,
    extra_env: &[(&str, &str)],
) {
    use serde_json::{Value, json};
    let mut env = vec![("CORBEL_ADMIN_TOKEN", super::ADMIN_TOKEN)];
    env.extend_from_slice(extra_env);
    let mut served = super::binary::serve(store, &env);
    let client = reqwest::Client::new();
    let url = format!("http://{}/graphql", served.addr);
    eventually(Duration::from_secs(60), "the provider to load again", || async {
        let body: Value = client
            .post(&url)
            .bearer_auth(super::ADMIN_TOKEN)
            .json(&json!({"query": "query($id: ID!) { provider(id: $id) { status } }", "variables": {"id": id}}))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (body["data"]["provider"]["status"] == "CONNECTED").then_some(())
    })
    .await;
    let pid = provider_pid(store, id);
    assert!(alive(pid));
    served.child.kill().unwrap();
    served.child.wait().unwrap();
    gone(pid).await;
}
