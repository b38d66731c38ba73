//! The process provider through the SDK's test host: real processes, real
//! sockets, a real state directory.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use corbel_provider_process::config::ServiceConfig;
use corbel_provider_process::lifecycle::{self, TAG};
use corbel_provider_process::procfs::{self, Liveness};
use corbel_provider_process::state::{Phase, StateDir};
use corbel_provider_process::{ProcessProvider, RESOURCE_TYPE};
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::testing::{TestHost, TestRegistry, messages, outcome};
use corbel_provider_sdk::{Code, PROVIDER_ENV, proto};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, getpgid};

async fn host_in(state: &Path) -> TestHost {
    TestHost::start(ProcessProvider::new(Some(state.to_path_buf()))).await
}

/// A resource whose id no other test (or test run) uses: services are found
/// machine-wide by the id in their tag.
fn resource(kind: &str, key: &str, config: Value) -> proto::Resource {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    proto::Resource {
        resource_id: format!("{key}-{}-{nanos}", std::process::id()),
        ..corbel_provider_sdk::testing::resource(kind, key, config)
    }
}

/// Kills whatever carries the tag of `resource_id` when dropped, so a failing
/// test leaves no process behind.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for found in procfs::tagged(TAG, &self.0) {
            let _ = kill(Pid::from_raw(found.pid), Signal::SIGKILL);
        }
    }
}

fn cleanup(resource: &proto::Resource) -> Cleanup {
    Cleanup(resource.resource_id.clone())
}

/// The live processes tagged with `resource`'s id.
fn tagged(resource: &proto::Resource) -> Vec<i32> {
    procfs::tagged(TAG, &resource.resource_id)
        .iter()
        .map(|t| t.pid)
        .collect()
}

fn pid_of(outputs: &Value) -> i32 {
    outputs["pid"].as_i64().expect("a pid output") as i32
}

fn running(pid: i32) -> bool {
    procfs::stat(pid).is_some_and(|s| s.state != 'Z')
}

/// Waits, with a deadline, for `check` to hold.
async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

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

#[tokio::test]
async fn bad_configuration_is_refused_naming_the_field() {
    let state = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    let bad = resource(RESOURCE_TYPE, "bad", json!({ "args": ["x"] }));
    let failure = outcome(&host.deploy(bad).await.unwrap()).unwrap_err();
    assert_eq!(failure.message, "config.command: missing");
    assert!(!failure.retryable);
    let bad = resource(
        RESOURCE_TYPE,
        "bad",
        json!({ "command": "sleep", "port": "yes" }),
    );
    let failure = outcome(&host.deploy(bad).await.unwrap()).unwrap_err();
    assert_eq!(failure.message, "config.port: expected true or false");

    let refused = host
        .configure(json!({ "capacity": "lots" }))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains("capacity"),
        "{}",
        refused.message()
    );
}

#[tokio::test]
async fn one_node_named_after_the_host_with_the_configured_capacity() {
    let state = tempfile::tempdir().unwrap();
    let host = host_in(state.path()).await;
    let nodes = host.list_nodes().await.unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].name, procfs::hostname());
    assert_eq!(nodes[0].capacity[RESOURCE_TYPE], 100);
    assert_eq!(nodes[0].labels["os"], "linux");
    host.configure(json!({ "capacity": 5, "unknown": true }))
        .await
        .unwrap();
    assert_eq!(
        host.list_nodes().await.unwrap()[0].capacity[RESOURCE_TYPE],
        5
    );
    let registration = host.registration();
    assert_eq!(
        registration.features,
        ["deploy", "destroy", "inspect", "nodes"]
    );
    assert_eq!(registration.resource_types, [RESOURCE_TYPE]);
}

#[test]
fn liveness_tells_a_reused_pid_apart() {
    let me = std::process::id() as i32;
    let stat = procfs::stat(me).unwrap();
    assert_eq!(procfs::liveness(me, stat.start_time ^ 1), Liveness::Reused);
}

/// The provider binary, started the way Corbel starts it.
fn binary(registry: &TestRegistry, id: &str, state: &Path) -> tokio::process::Child {
    binary_with_stderr(registry, id, state, std::process::Stdio::inherit())
}

fn binary_with_stderr(
    registry: &TestRegistry,
    id: &str,
    state: &Path,
    stderr: std::process::Stdio,
) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_corbel-provider-process"))
        .envs(registry.env(id))
        .env("CORBEL_STATE_DIR", state)
        .stdin(std::process::Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn sigterm_and_wait(provider: &mut tokio::process::Child) {
    kill(
        Pid::from_raw(provider.id().unwrap() as i32),
        Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(corbel_provider_sdk::testing::DEADLINE, provider.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

/// A restarted Corbel may start a new instance while the old one still
/// finishes a call: the new one waits until the old one is gone.
#[tokio::test]
async fn a_second_binary_on_one_state_dir_waits_for_the_first_to_exit() {
    use corbel_provider_sdk::testing::DEADLINE;
    use tokio::io::{AsyncBufReadExt, BufReader};

    let state = tempfile::tempdir().unwrap();
    let registry = TestRegistry::start().await;
    let mut first = binary(&registry, "process-1", state.path());
    registry
        .wait_for_registrations(1, DEADLINE)
        .await
        .expect("the first registers");

    let mut second = binary_with_stderr(
        &registry,
        "process-2",
        state.path(),
        std::process::Stdio::piped(),
    );
    let mut stderr = BufReader::new(second.stderr.take().unwrap()).lines();
    let waiting = tokio::time::timeout(DEADLINE, async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            if line.contains("waiting for it to exit") {
                return line;
            }
        }
        panic!("the second exited without waiting");
    })
    .await
    .expect("the second says it waits");
    assert!(waiting.contains(".lock"), "{waiting}");
    // It waits before registering.
    assert_eq!(registry.registrations().len(), 1);

    sigterm_and_wait(&mut first).await;
    let registered = registry
        .wait_for_registrations(2, DEADLINE)
        .await
        .expect("the second registers once the first is gone");
    assert_eq!(registered[1].request.id, "process-2");
    sigterm_and_wait(&mut second).await;
}

/// The real binary, started the way Corbel starts it: its services outlive
/// it, and do not inherit its registration.
#[tokio::test]
async fn services_outlive_the_provider_binary_and_do_not_inherit_its_registration() {
    use corbel_provider_sdk::proto::provider_client::ProviderClient;
    use corbel_provider_sdk::testing::DEADLINE;

    let state = tempfile::tempdir().unwrap();
    let registry = TestRegistry::start().await;
    let environment = registry.env("process-1");
    let mut provider = binary(&registry, "process-1", state.path());
    let registered = registry
        .wait_for_registrations(1, DEADLINE)
        .await
        .expect("no registration");
    let channel = corbel_provider_sdk::connect(&registered[0].request.endpoint, DEADLINE)
        .await
        .unwrap();
    let svc = resource(
        RESOURCE_TYPE,
        "svc",
        json!({ "command": "sh", "args": ["-c", "env > seen-env; exec sleep 30"], "cwd": state.path() }),
    );
    let _cleanup = cleanup(&svc);
    let request = corbel_provider_sdk::proto::DeployResourceRequest {
        resource: Some(svc.clone()),
        dependency_outputs_json: Default::default(),
    };
    let mut stream = ProviderClient::new(channel)
        .deploy_resource(request)
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(event) = stream.message().await.unwrap() {
        events.push(event);
    }
    let pid = pid_of(&outcome(&events).unwrap());

    // The provider had the five Corbel sets (not a remote provider's); the
    // service sees none, but its own tag.
    let given: Vec<String> = environment
        .iter()
        .map(|(name, _)| name.to_string())
        .collect();
    let remote_only = [
        "CORBEL_TLS_CERT",
        "CORBEL_TLS_KEY",
        "CORBEL_TLS_CA",
        "CORBEL_PROVIDER_LISTEN",
        "CORBEL_PROVIDER_ENDPOINT",
    ];
    for name in PROVIDER_ENV {
        assert!(
            name == "CORBEL_STATE_DIR"
                || remote_only.contains(&name)
                || given.iter().any(|g| g == name),
            "the test gives the provider {name}"
        );
    }
    let seen = std::fs::read_to_string(state.path().join("seen-env")).unwrap();
    for name in PROVIDER_ENV {
        assert!(
            !seen
                .lines()
                .any(|line| line.starts_with(&format!("{name}="))),
            "{name} reached the service:\n{seen}"
        );
    }
    assert!(
        seen.lines()
            .any(|line| line == format!("{TAG}={}", svc.resource_id)),
        "{seen}"
    );

    sigterm_and_wait(&mut provider).await;
    assert_eq!(registry.unregistrations().len(), 1);
    assert!(running(pid), "the service died with its provider");
    killpg(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
}

/// A provider killed at each point of a start, simulated by running the start's
/// steps up to that point: a fresh provider on the same state directory finds
/// what was started, starts nothing twice, and destroys it all.
mod killed_mid_start {
    use super::*;

    fn sleeper(key: &str) -> (proto::Resource, ServiceConfig) {
        let config = json!({ "command": "sleep", "args": ["30"], "port": true });
        let service = ServiceConfig::parse(&config.to_string()).unwrap();
        (resource(RESOURCE_TYPE, key, config), service)
    }

    fn phase(state: &Path, resource: &proto::Resource) -> Option<Phase> {
        StateDir::new(state)
            .read(&resource.resource_id)
            .unwrap()
            .map(|r| r.phase)
    }

    #[tokio::test]
    async fn after_spawn_the_process_is_found_adopted_and_destroyed() {
        let dir = tempfile::tempdir().unwrap();
        let (svc, service) = sleeper("adopted");
        let _cleanup = cleanup(&svc);
        let state = StateDir::new(dir.path());
        let intent = lifecycle::record_intent(&state, &svc.resource_id, &service)
            .await
            .unwrap();
        let spawned = lifecycle::spawn_tagged(&intent, &service, &[]).unwrap();
        let pid = spawned.pid;
        let port = intent.port.expect("a chosen port");
        // The provider dies here: its running record is never written.
        drop((spawned, intent, state));
        assert_eq!(phase(dir.path(), &svc), Some(Phase::Intent));

        let host = host_in(dir.path()).await;
        let inspected = host.inspect(svc.clone()).await.unwrap();
        assert!(inspected.present);
        let expected = json!({ "pid": pid, "port": port });
        assert_eq!(
            serde_json::from_str::<Value>(&inspected.outputs_json).unwrap(),
            expected
        );
        assert_eq!(
            phase(dir.path(), &svc),
            Some(Phase::Intent),
            "inspect changes nothing"
        );

        let events = host.deploy(svc.clone()).await.unwrap();
        assert_eq!(outcome(&events).unwrap(), expected, "{events:?}");
        assert!(
            messages(&events).iter().any(|m| m.contains("adopting")),
            "{events:?}"
        );
        assert_eq!(tagged(&svc), [pid], "no second process");
        assert!(matches!(
            phase(dir.path(), &svc),
            Some(Phase::Running(running)) if running.pid == pid
        ));
        // And again: the running record answers.
        assert_eq!(
            outcome(&host.deploy(svc.clone()).await.unwrap()).unwrap(),
            expected
        );
        assert_eq!(tagged(&svc), [pid]);

        outcome(&host.destroy(svc.clone(), expected).await.unwrap()).unwrap();
        assert!(!running(pid));
        assert!(tagged(&svc).is_empty());
        assert_eq!(phase(dir.path(), &svc), None);
        assert!(!host.inspect(svc).await.unwrap().present);
    }

    #[tokio::test]
    async fn after_spawn_a_destroy_stops_the_unrecorded_process() {
        let dir = tempfile::tempdir().unwrap();
        let (svc, service) = sleeper("orphan");
        let _cleanup = cleanup(&svc);
        let state = StateDir::new(dir.path());
        let intent = lifecycle::record_intent(&state, &svc.resource_id, &service)
            .await
            .unwrap();
        let pid = lifecycle::spawn_tagged(&intent, &service, &[]).unwrap().pid;

        let host = host_in(dir.path()).await;
        // Corbel never saw outputs: it destroys with none.
        let events = host.destroy(svc.clone(), json!({})).await.unwrap();
        outcome(&events).unwrap();
        assert!(!running(pid), "{events:?}");
        assert!(tagged(&svc).is_empty());
        assert_eq!(phase(dir.path(), &svc), None);
    }

    #[tokio::test]
    async fn after_the_intent_nothing_runs_and_a_deploy_starts_exactly_one() {
        let dir = tempfile::tempdir().unwrap();
        let (svc, service) = sleeper("intended");
        let _cleanup = cleanup(&svc);
        let state = StateDir::new(dir.path());
        lifecycle::record_intent(&state, &svc.resource_id, &service)
            .await
            .unwrap();
        // The provider dies here, before spawning.

        let host = host_in(dir.path()).await;
        assert!(!host.inspect(svc.clone()).await.unwrap().present);
        assert!(tagged(&svc).is_empty());
        let outputs = outcome(&host.deploy(svc.clone()).await.unwrap()).unwrap();
        let pid = pid_of(&outputs);
        assert_eq!(tagged(&svc), [pid], "exactly one process");
        assert!(host.inspect(svc.clone()).await.unwrap().present);

        outcome(&host.destroy(svc.clone(), outputs).await.unwrap()).unwrap();
        assert!(!running(pid));
        assert!(tagged(&svc).is_empty());
        assert_eq!(phase(dir.path(), &svc), None);
    }

    #[tokio::test]
    async fn after_the_intent_a_destroy_removes_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let (svc, service) = sleeper("abandoned");
        let state = StateDir::new(dir.path());
        lifecycle::record_intent(&state, &svc.resource_id, &service)
            .await
            .unwrap();

        let host = host_in(dir.path()).await;
        outcome(&host.destroy(svc.clone(), json!({})).await.unwrap()).unwrap();
        assert_eq!(phase(dir.path(), &svc), None);
        assert!(!host.inspect(svc).await.unwrap().present);
    }
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
