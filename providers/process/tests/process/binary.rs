//! The real provider binary, started the way Corbel starts it: a second
//! instance on one state directory waits for the first to exit, and its
//! services outlive it without inheriting its registration.

use std::path::Path;

use corbel_provider_process::RESOURCE_TYPE;
use corbel_provider_process::lifecycle::TAG;
use corbel_provider_sdk::PROVIDER_ENV;
use corbel_provider_sdk::serde_json::json;
use corbel_provider_sdk::testing::{TestRegistry, outcome};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use super::{cleanup, pid_of, resource, running};

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
