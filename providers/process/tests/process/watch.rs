//! `WatchResources` (protocol version 3): the first report on what Corbel
//! asks about, a service killed behind the provider's back reported DOWN with
//! its signal, a destroyed one not reported, and a restarted provider
//! watching what its predecessor started through a pidfd.

use corbel_provider_process::RESOURCE_TYPE;
use corbel_provider_process::watch::NOT_A_CHILD;
use corbel_provider_sdk::now_ms;
use corbel_provider_sdk::proto::{self, Health};
use corbel_provider_sdk::serde_json::json;
use corbel_provider_sdk::testing::outcome;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::{cleanup, eventually, host_in, pid_of, resource, running};

fn sleeper(key: &str) -> proto::Resource {
    resource(
        RESOURCE_TYPE,
        key,
        json!({ "command": "sleep", "args": ["30"] }),
    )
}

fn assert_healthy(status: &proto::ResourceStatus, resource: &proto::Resource) {
    assert_eq!(status.resource_id, resource.resource_id, "{status:?}");
    assert_eq!(status.health(), Health::Healthy, "{status:?}");
    assert_eq!(status.reason, "");
    assert!(status.changed_at_unix_ms > 0, "{status:?}");
    assert!(!status.synced);
}

#[tokio::test]
async fn a_service_killed_behind_the_providers_back_is_down_with_its_signal() {
    let state = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    let web = sleeper("web");
    let unknown = sleeper("unknown");
    let _cleanup = cleanup(&web);
    let pid = pid_of(&outcome(&host.deploy(web.clone()).await.unwrap()).unwrap());

    let mut watch = host
        .watch(vec![web.clone(), unknown.clone()])
        .await
        .unwrap();
    assert_healthy(&next_status!(watch), &web);
    let missing = next_status!(watch);
    assert_eq!(missing.resource_id, unknown.resource_id);
    assert_eq!(missing.health(), Health::Down);
    assert_eq!(missing.reason, "the provider holds no such resource");
    let synced = next_status!(watch);
    assert!(synced.synced && synced.resource_id.is_empty(), "{synced:?}");

    let killed_at = now_ms();
    killpg(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    let down = next_status!(watch);
    assert_eq!(down.resource_id, web.resource_id);
    assert_eq!(down.health(), Health::Down);
    assert_eq!(down.reason, "killed by SIGKILL (exit status 137)");
    assert_eq!(down.exit_code, Some(137));
    assert!(
        (killed_at..=now_ms()).contains(&down.changed_at_unix_ms),
        "changed at {} (killed at {killed_at})",
        down.changed_at_unix_ms
    );

    // Inspect says the same, and `present` is as before: not there.
    let inspected = host.inspect(web.clone()).await.unwrap();
    assert!(!inspected.present);
    assert_eq!(inspected.health(), Health::Down);
    assert_eq!(inspected.reason, "killed by SIGKILL (exit status 137)");

    // Deployed again: HEALTHY on the open watch.
    let again = pid_of(&outcome(&host.deploy(web.clone()).await.unwrap()).unwrap());
    assert_ne!(again, pid);
    assert_healthy(&next_status!(watch), &web);
    let inspected = host.inspect(web.clone()).await.unwrap();
    assert!(inspected.present);
    assert_eq!(inspected.health(), Health::Healthy);
    outcome(&host.destroy(web, json!({})).await.unwrap()).unwrap();
}

#[tokio::test]
async fn a_clean_exit_is_down_with_status_zero_and_a_destroy_sends_nothing() {
    let state = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    let gone = sleeper("destroyed");
    // Exits when the test says so: a file appears.
    let quits = resource(
        RESOURCE_TYPE,
        "quits",
        json!({
            "command": "sh",
            "args": ["-c", "while [ ! -e quit ]; do sleep 0.02; done; exit 0"],
            "cwd": state.path(),
        }),
    );
    let (_gone, _quits) = (cleanup(&gone), cleanup(&quits));
    let gone_pid = pid_of(&outcome(&host.deploy(gone.clone()).await.unwrap()).unwrap());
    outcome(&host.deploy(quits.clone()).await.unwrap()).unwrap();

    let mut watch = host.watch(vec![gone.clone(), quits.clone()]).await.unwrap();
    assert_healthy(&next_status!(watch), &gone);
    assert_healthy(&next_status!(watch), &quits);
    assert!(next_status!(watch).synced);

    outcome(&host.destroy(gone.clone(), json!({})).await.unwrap()).unwrap();
    assert!(!running(gone_pid));
    std::fs::write(state.path().join("quit"), "").unwrap();
    // The next status is the exit, not the destroyed one's.
    let down = next_status!(watch);
    assert_eq!(down.resource_id, quits.resource_id, "{down:?}");
    assert_eq!(down.health(), Health::Down);
    assert_eq!(down.reason, "exited with status 0");
    assert_eq!(down.exit_code, Some(0));

    // A new watch no longer holds the destroyed one.
    let mut fresh = host.watch(vec![gone.clone()]).await.unwrap();
    let forgotten = next_status!(fresh);
    assert_eq!(forgotten.reason, "the provider holds no such resource");
}

#[tokio::test]
async fn a_restarted_provider_watches_what_its_predecessor_started_through_a_pidfd() {
    let state = tempfile::tempdir().unwrap();
    let kept = sleeper("kept");
    let died = sleeper("died");
    let (_kept, _died) = (cleanup(&kept), cleanup(&died));
    let mut first = host_in(state.path()).await;
    let kept_pid = pid_of(&outcome(&first.deploy(kept.clone()).await.unwrap()).unwrap());
    let died_pid = pid_of(&outcome(&first.deploy(died.clone()).await.unwrap()).unwrap());
    first.stop().await.unwrap();
    drop(first);
    // One dies while no provider runs.
    killpg(Pid::from_raw(died_pid), Signal::SIGKILL).unwrap();
    eventually("the service to die", || !running(died_pid)).await;

    let second = host_in(state.path()).await;
    let mut watch = second
        .watch(vec![kept.clone(), died.clone()])
        .await
        .unwrap();
    assert_healthy(&next_status!(watch), &kept);
    let dead = next_status!(watch);
    assert_eq!(dead.resource_id, died.resource_id);
    assert_eq!(dead.health(), Health::Down);
    assert_eq!(
        dead.reason,
        format!("pid {died_pid} exited while no provider watched it (status unknown)")
    );
    assert_eq!(dead.exit_code, None);
    assert!(next_status!(watch).synced);

    killpg(Pid::from_raw(kept_pid), Signal::SIGKILL).unwrap();
    let down = next_status!(watch);
    assert_eq!(down.resource_id, kept.resource_id);
    assert_eq!(down.health(), Health::Down);
    assert_eq!(down.reason, NOT_A_CHILD);
    assert_eq!(down.exit_code, None, "a pidfd gives no exit status");
    assert!(down.changed_at_unix_ms > 0);

    // A deploy starts it again, as its child this time.
    let again = pid_of(&outcome(&second.deploy(kept.clone()).await.unwrap()).unwrap());
    assert_healthy(&next_status!(watch), &kept);
    killpg(Pid::from_raw(again), Signal::SIGTERM).unwrap();
    let down = next_status!(watch);
    assert_eq!(down.reason, "killed by SIGTERM (exit status 143)");
    assert_eq!(down.exit_code, Some(143));
}
