//! A service's life through the test host: deployed (again, idempotently),
//! inspected and destroyed; its port; found by a second provider instance;
//! killed after the grace period; a command that exits at once; a reused
//! pid told apart; and a service that died started again.

use corbel_provider_process::ProcessProvider;
use corbel_provider_process::RESOURCE_TYPE;
use corbel_provider_process::procfs::{self, Liveness};
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::testing::{TestHost, TestRegistry, messages, outcome};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Pid, getpgid};

use super::{cleanup, eventually, host_in, pid_of, resource, running, tagged};

#[tokio::test]
async fn deploy_inspect_destroy_a_sleeping_process() {
    let state = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    let web = resource(
        RESOURCE_TYPE,
        "web",
        json!({ "command": "sleep", "args": ["30"] }),
    );
    let _cleanup = cleanup(&web);

    let events = host.deploy(web.clone()).await.unwrap();
    let outputs = outcome(&events).unwrap();
    let pid = pid_of(&outputs);
    assert_eq!(outputs, json!({ "pid": pid }));
    assert!(
        messages(&events).contains(&"starting `sleep 30`".to_string()),
        "{events:?}"
    );
    assert!(running(pid));
    assert_eq!(tagged(&web), [pid], "tagged with its resource id");
    assert_eq!(
        getpgid(Some(Pid::from_raw(pid))).unwrap().as_raw(),
        pid,
        "its own group"
    );
    assert_ne!(getpgid(None).unwrap().as_raw(), pid);

    // Deploying again returns the running one.
    let again = outcome(&host.deploy(web.clone()).await.unwrap()).unwrap();
    assert_eq!(again, outputs);

    let inspected = host.inspect(web.clone()).await.unwrap();
    assert!(inspected.present);
    assert_eq!(
        serde_json::from_str::<Value>(&inspected.outputs_json).unwrap(),
        outputs
    );

    let events = host.destroy(web.clone(), outputs.clone()).await.unwrap();
    outcome(&events).unwrap();
    assert!(!running(pid), "destroyed process still running");
    assert!(!host.inspect(web.clone()).await.unwrap().present);

    // Destroying again succeeds and says there was nothing.
    let events = host.destroy(web, outputs).await.unwrap();
    outcome(&events).unwrap();
    assert!(
        messages(&events)
            .iter()
            .any(|m| m.contains("nothing to destroy")),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_port_is_free_and_passed_as_the_port_variable() {
    let state = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    let api = resource(
        RESOURCE_TYPE,
        "api",
        json!({
            "command": "sh",
            "args": ["-c", "echo \"$PORT $GREETING\" > seen; exec sleep 30"],
            "env": { "GREETING": "hi" },
            "cwd": state.path(),
            "port": true,
        }),
    );
    let _cleanup = cleanup(&api);
    let outputs = outcome(&host.deploy(api.clone()).await.unwrap()).unwrap();
    let port = outputs["port"].as_u64().expect("a port output") as u16;
    assert_ne!(port, 0);
    // Nothing listens on it: it is free to bind.
    drop(std::net::TcpListener::bind(("127.0.0.1", port)).expect("the port is free"));
    let seen = state.path().join("seen");
    eventually("the service to write its environment", || {
        std::fs::read_to_string(&seen).is_ok_and(|s| s.ends_with('\n'))
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(&seen).unwrap(),
        format!("{port} hi\n")
    );
    outcome(&host.destroy(api, outputs).await.unwrap()).unwrap();
}

#[tokio::test]
async fn a_second_provider_instance_finds_inspects_and_destroys_what_the_first_started() {
    let state = tempfile::tempdir().unwrap();
    let db = resource(
        RESOURCE_TYPE,
        "db",
        json!({ "command": "sleep", "args": ["30"] }),
    );
    let _cleanup = cleanup(&db);

    let mut first = host_in(state.path()).await;
    let outputs = outcome(&first.deploy(db.clone()).await.unwrap()).unwrap();
    let pid = pid_of(&outputs);
    first.stop().await.unwrap();
    drop(first);
    assert!(running(pid), "the service outlives its provider");

    // The state directory comes from the configuration this time.
    let registry = TestRegistry::builder()
        .initial_config(json!({ "state_dir": state.path() }))
        .start()
        .await;
    let second = TestHost::start_with(registry, ProcessProvider::new(None)).await;
    let inspected = second.inspect(db.clone()).await.unwrap();
    assert!(inspected.present);
    assert_eq!(
        serde_json::from_str::<Value>(&inspected.outputs_json).unwrap(),
        outputs
    );
    outcome(&second.destroy(db.clone(), outputs).await.unwrap()).unwrap();
    assert!(!running(pid));
    assert!(!second.inspect(db).await.unwrap().present);
}

#[tokio::test]
async fn a_service_ignoring_sigterm_is_killed_after_the_grace_period() {
    let state = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    host.configure(json!({ "grace_ms": 200 })).await.unwrap();
    let stubborn = resource(
        RESOURCE_TYPE,
        "stubborn",
        json!({ "command": "sh", "args": ["-c", "trap '' TERM; sleep 30 & wait"] }),
    );
    let _cleanup = cleanup(&stubborn);
    let outputs = outcome(&host.deploy(stubborn.clone()).await.unwrap()).unwrap();
    let pid = pid_of(&outputs);
    let events = host.destroy(stubborn.clone(), outputs).await.unwrap();
    outcome(&events).unwrap();
    assert!(
        messages(&events).iter().any(|m| m.contains("SIGKILL")),
        "{events:?}"
    );
    assert!(
        procfs::group_members(pid).is_empty(),
        "the whole group is gone"
    );
    assert!(tagged(&stubborn).is_empty());
}

#[tokio::test]
async fn a_command_that_exits_at_once_fails_with_its_output() {
    let state = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    let broken = resource(
        RESOURCE_TYPE,
        "broken",
        json!({ "command": "sh", "args": ["-c", "echo boom; echo oops >&2; exit 7"] }),
    );
    let failure = outcome(&host.deploy(broken.clone()).await.unwrap()).unwrap_err();
    for expected in ["exit status: 7", "boom", "oops"] {
        assert!(failure.message.contains(expected), "{}", failure.message);
    }
    assert!(!host.inspect(broken.clone()).await.unwrap().present);
    assert!(
        !state
            .path()
            .join("resources")
            .read_dir()
            .unwrap()
            .any(|_| true),
        "no record left"
    );

    // What it started before exiting does not outlive the failure.
    let forked = resource(
        RESOURCE_TYPE,
        "forked",
        json!({ "command": "sh", "args": ["-c", "sleep 30 & echo $! > child; exit 3"], "cwd": state.path() }),
    );
    let _cleanup = cleanup(&forked);
    let failure = outcome(&host.deploy(forked.clone()).await.unwrap()).unwrap_err();
    assert!(
        failure.message.contains("exit status: 3"),
        "{}",
        failure.message
    );
    let child: i32 = std::fs::read_to_string(state.path().join("child"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    eventually("the forked child to be gone", || !running(child)).await;
    assert!(tagged(&forked).is_empty());
    assert!(!host.inspect(forked).await.unwrap().present);

    let missing = resource(
        RESOURCE_TYPE,
        "missing",
        json!({ "command": "/no/such/program" }),
    );
    let failure = outcome(&host.deploy(missing).await.unwrap()).unwrap_err();
    assert!(
        failure.message.contains("/no/such/program"),
        "{}",
        failure.message
    );
}

#[test]
fn liveness_tells_a_reused_pid_apart() {
    let me = std::process::id() as i32;
    let stat = procfs::stat(me).unwrap();
    assert_eq!(procfs::liveness(me, stat.start_time ^ 1), Liveness::Reused);
}

#[tokio::test]
async fn a_service_that_died_is_started_again_by_a_deploy() {
    let state = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    let svc = resource(
        RESOURCE_TYPE,
        "crashy",
        json!({ "command": "sleep", "args": ["30"] }),
    );
    let _cleanup = cleanup(&svc);
    let first = pid_of(&outcome(&host.deploy(svc.clone()).await.unwrap()).unwrap());
    killpg(Pid::from_raw(first), Signal::SIGKILL).unwrap();
    eventually("the service to die", || !running(first)).await;
    assert!(!host.inspect(svc.clone()).await.unwrap().present);

    let events = host.deploy(svc.clone()).await.unwrap();
    let outputs = outcome(&events).unwrap();
    let second = pid_of(&outputs);
    assert_ne!(second, first);
    assert_eq!(tagged(&svc), [second]);
    assert!(
        messages(&events)
            .iter()
            .any(|m| m.contains("starting it again")),
        "{events:?}"
    );
    outcome(&host.destroy(svc.clone(), outputs).await.unwrap()).unwrap();
    assert!(tagged(&svc).is_empty());
}
