//! `RetrieveData` (the "data" feature): a service's last lines of output,
//! its log files kept under their bound while it chatters, what `/proc` says
//! of it, and NOT_FOUND once it is destroyed.

use std::path::{Path, PathBuf};

use corbel_provider_process::RESOURCE_TYPE;
use corbel_provider_process::state::StateDir;
use corbel_provider_sdk::Code;
use corbel_provider_sdk::proto;
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::testing::outcome;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::{cleanup, data, eventually, host_in, pid_of, resource};

/// The log of `resource` and its rotated files that exist, with their sizes.
fn log_files(state: &Path, resource: &proto::Resource) -> Vec<(PathBuf, u64)> {
    let log = StateDir::new(state)
        .log_path(&resource.resource_id)
        .unwrap();
    let mut files = vec![log.clone()];
    files.extend((1..=3).map(|n| corbel_provider_process::logs::rotated(&log, n)));
    files
        .into_iter()
        .filter_map(|path| Some((path.clone(), std::fs::metadata(&path).ok()?.len())))
        .collect()
}

async fn logs(host: &super::TestHost, resource: &proto::Resource, tail: u64) -> String {
    let answer = data(host, resource, "logs", json!({ "tail": tail }))
        .await
        .unwrap();
    answer["logs"].as_str().expect("logs as text").to_string()
}

#[tokio::test]
async fn logs_return_the_last_lines_of_stdout_and_stderr() {
    let state = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    let talker = resource(
        RESOURCE_TYPE,
        "talker",
        json!({
            "command": "sh",
            "args": ["-c", "seq -f 'line %g' 1 50; echo oops >&2; exec sleep 30"],
        }),
    );
    let _cleanup = cleanup(&talker);
    let outputs = outcome(&host.deploy(talker.clone()).await.unwrap()).unwrap();
    let log = StateDir::new(state.path())
        .log_path(&talker.resource_id)
        .unwrap();
    eventually("the service to write its lines", || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.ends_with("oops\n"))
    })
    .await;

    assert_eq!(logs(&host, &talker, 3).await, "line 49\nline 50\noops");
    assert_eq!(logs(&host, &talker, 0).await, "");
    let all = logs(&host, &talker, 1000).await;
    assert_eq!(all.lines().count(), 51);
    assert!(all.starts_with("line 1\n"), "{all}");

    let refused = data(&host, &talker, "logs", json!({ "tail": "all" }))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("tail"), "{}", refused.message());
    let refused = data(&host, &talker, "metrics", json!({}))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);

    // Destroyed: its files go, and it is not found.
    outcome(&host.destroy(talker.clone(), outputs).await.unwrap()).unwrap();
    assert_eq!(log_files(state.path(), &talker), []);
    for kind in ["logs", "inspect"] {
        let gone = data(&host, &talker, kind, json!({})).await.unwrap_err();
        assert_eq!(gone.code(), Code::NotFound, "{kind}: {gone:?}");
    }
}

#[tokio::test]
async fn a_chatty_services_log_files_stay_under_their_bound() {
    const MAX: u64 = 16 * 1024;
    // What the live file may hold past MAX before the provider reacts (see
    // `logs`): a few of the service's 10 KB bursts on a busy machine.
    const SLACK: u64 = 128 * 1024;
    let state = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    host.configure(json!({ "log_max_bytes": MAX, "log_files": 2 }))
        .await
        .unwrap();
    // 100 bursts of 100 lines of 100 bytes: 1 MB in all, then quiet.
    let script = "i=0; while [ $i -lt 100 ]; do \
                  seq -f 'chatty line %05g ...........................................................................' \
                  $((i*100+1)) $((i*100+100)); i=$((i+1)); sleep 0.005; done; \
                  touch done; exec sleep 30";
    let chatty = resource(
        RESOURCE_TYPE,
        "chatty",
        json!({ "command": "sh", "args": ["-c", script], "cwd": state.path() }),
    );
    let _cleanup = cleanup(&chatty);
    outcome(&host.deploy(chatty.clone()).await.unwrap()).unwrap();

    let done = state.path().join("done");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    // Sampled while it writes, until it is done.
    while !done.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the service never finished"
        );
        for (path, len) in log_files(state.path(), &chatty) {
            let bound = if path.extension() == Some("log".as_ref()) {
                MAX + SLACK
            } else {
                MAX
            };
            assert!(len <= bound, "{} holds {len} bytes", path.display());
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // The log pump may still be writing the last burst: its last line first.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let tail = loop {
        let tail = logs(&host, &chatty, 2).await;
        if tail.contains("chatty line 10000 ") || tokio::time::Instant::now() >= deadline {
            break tail;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    eventually("the last write to be rotated", || {
        log_files(state.path(), &chatty)[0].1 <= MAX
    })
    .await;
    let files = log_files(state.path(), &chatty);
    assert_eq!(files.len(), 3, "the log and two rotated files: {files:?}");
    let total: u64 = files.iter().map(|(_, len)| len).sum();
    assert!(total <= 3 * MAX, "{files:?}");
    // The newest lines are there, the oldest went with the bound.
    assert!(tail.starts_with("chatty line 09999 "), "{tail}");
    assert!(tail.contains("chatty line 10000 "), "{tail}");
    let all = logs(&host, &chatty, 10_000).await;
    assert!(!all.contains("chatty line 00001 "));
    outcome(&host.destroy(chatty.clone(), json!({})).await.unwrap()).unwrap();
    assert_eq!(log_files(state.path(), &chatty), []);
}

#[tokio::test]
async fn inspect_data_has_the_pid_memory_cpu_start_and_health() {
    let state = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    let svc = resource(
        RESOURCE_TYPE,
        "inspected",
        json!({ "command": "sleep", "args": ["30"], "port": true }),
    );
    let _cleanup = cleanup(&svc);
    let outputs = outcome(&host.deploy(svc.clone()).await.unwrap()).unwrap();
    let pid = pid_of(&outputs);

    let seen = data(&host, &svc, "inspect", json!({})).await.unwrap();
    assert_eq!(seen["pid"], pid, "{seen}");
    assert_eq!(seen["port"], outputs["port"]);
    assert_eq!(seen["state"], "running");
    assert_eq!(seen["command"], "sleep 30");
    assert_eq!(seen["health"], "HEALTHY");
    assert!(
        seen["rss_bytes"].as_u64().is_some_and(|rss| rss > 0),
        "{seen}"
    );
    assert!(
        seen["cpu_seconds"].as_f64().is_some_and(|cpu| cpu >= 0.0),
        "{seen}"
    );
    let started = seen["started_at"].as_str().expect("a start time");
    assert!(
        started.len() == 20 && started.ends_with('Z') && started.as_bytes()[10] == b'T',
        "{started}"
    );
    assert!(seen.get("reason").is_none());

    killpg(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    let mut seen = Value::Null;
    for _ in 0..500 {
        seen = data(&host, &svc, "inspect", json!({})).await.unwrap();
        if seen["health"] == "DOWN" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(seen["health"], "DOWN", "{seen}");
    assert_eq!(seen["state"], "exited");
    assert_eq!(seen["reason"], "killed by SIGKILL (exit status 137)");
    assert_eq!(seen["exit_code"], 137);
    assert!(seen.get("rss_bytes").is_none());
}
