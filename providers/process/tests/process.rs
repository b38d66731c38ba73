//! The process provider through the SDK's test host: real processes, real
//! sockets, a real state directory.

use std::path::Path;
use std::time::Duration;

use corbel_provider_process::procfs::{self, Liveness};
use corbel_provider_process::{ProcessProvider, RESOURCE_TYPE};
use corbel_provider_sdk::Code;
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::testing::{TestHost, TestRegistry, messages, outcome, resource};
use nix::unistd::{Pid, getpgid};

async fn host_in(state: &Path) -> TestHost {
    TestHost::start(ProcessProvider::new(Some(state.to_path_buf()))).await
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

    let events = host.deploy(web.clone()).await.unwrap();
    let outputs = outcome(&events).unwrap();
    let pid = pid_of(&outputs);
    assert_eq!(outputs, json!({ "pid": pid }));
    assert!(
        messages(&events).contains(&"starting `sleep 30`".to_string()),
        "{events:?}"
    );
    assert!(running(pid));
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
    let outputs = outcome(&host.deploy(stubborn.clone()).await.unwrap()).unwrap();
    let pid = pid_of(&outputs);
    let events = host.destroy(stubborn, outputs).await.unwrap();
    outcome(&events).unwrap();
    assert!(
        messages(&events).iter().any(|m| m.contains("SIGKILL")),
        "{events:?}"
    );
    assert!(
        procfs::group_members(pid).is_empty(),
        "the whole group is gone"
    );
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
    assert!(!host.inspect(broken).await.unwrap().present);

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

#[tokio::test]
async fn services_outlive_the_provider_binary() {
    use corbel_provider_sdk::proto::provider_client::ProviderClient;
    use corbel_provider_sdk::testing::DEADLINE;
    use nix::sys::signal::{Signal, kill, killpg};

    let state = tempfile::tempdir().unwrap();
    let registry = TestRegistry::start().await;
    let mut provider = tokio::process::Command::new(env!("CARGO_BIN_EXE_corbel-provider-process"))
        .envs(registry.env("process-1"))
        .env("CORBEL_STATE_DIR", state.path())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let registered = registry
        .wait_for_registrations(1, DEADLINE)
        .await
        .expect("no registration");
    let channel = corbel_provider_sdk::connect(&registered[0].request.endpoint, DEADLINE)
        .await
        .unwrap();
    let request = corbel_provider_sdk::proto::DeployResourceRequest {
        resource: Some(resource(
            RESOURCE_TYPE,
            "svc",
            json!({ "command": "sleep", "args": ["30"] }),
        )),
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

    kill(
        Pid::from_raw(provider.id().unwrap() as i32),
        Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(DEADLINE, provider.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(registry.unregistrations().len(), 1);
    assert!(running(pid), "the service died with its provider");
    killpg(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
}
