//! grpc-core clients (Python grpcio) against the real registry, and the Python
//! example provider (`providers/examples/python`) loaded, deploying and
//! destroying through the real server.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use corbel_proto::v1 as proto;
use corbel_proto::v1::provider_client::ProviderClient;
use corbel_proto::v1::resource_event::Event;
use serde_json::json;

use crate::support::deployments::{create_blueprint, deploy, settled};
use crate::support::processes::provider_exits_when_its_server_is_killed;
use crate::support::provider_repos::ProviderRepo;
use crate::support::providers::{create_provider, logs, nodes, provider, wait_status};
use crate::support::settings::quick;
use crate::support::{TestApp, TestStore, data, error_code, eventually};

/// Runs a Python program; fails the test, saying what to install, when
/// grpcio is missing (`scripts/test.sh` installs it).
pub fn python(script: &str, args: &[&str]) -> String {
    let check = Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .status();
    assert!(
        check.is_ok_and(|s| s.success()),
        "these tests need Python 3 with grpcio and grpcio-tools: pip install grpcio grpcio-tools (scripts/test.sh does)"
    );
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "python failed: {text}");
    text
}

/// Raw calls (protobuf bytes built by hand, no stubs, no channel options)
/// on the socket given: what grpc-core sends as `:authority` is its default.
const RAW_CALLS: &str = r#"
import sys, grpc
path, provider_id = sys.argv[1], sys.argv[2]
channel = grpc.insecure_channel("unix://" + path)
def call(method, body):
    try:
        return "ok " + channel.unary_unary(method)(body, timeout=10).hex()
    except grpc.RpcError as e:
        return f"{e.code().name} {e.details()}"
def text(field, value):
    value = value.encode()
    return bytes([field << 3 | 2, len(value)]) + value
print("handshake:", call("/corbel.provider.v1.Registry/Handshake", b"\x0a\x01\x01"))
print("health:", call("/grpc.health.v1.Health/Check", text(1, "corbel.provider.v1.Registry")))
print("unregister:", call("/corbel.provider.v1.Registry/Unregister",
                          text(1, provider_id) + text(2, "no-such-session")))
"#;

fn line<'a>(output: &'a str, name: &str) -> &'a str {
    output
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .unwrap_or_else(|| panic!("no `{name}` in {output}"))
        .trim()
}

#[tokio::test]
async fn a_grpcio_client_calls_the_registry_with_its_default_authority() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), quick).await;
    let socket = corbel::provider::socket_root_for(app.store.data_dir()).join("registry.sock");
    let provider = uuid::Uuid::new_v4().to_string();
    let socket_text = socket.to_str().unwrap().to_owned();
    let out = tokio::task::spawn_blocking(move || python(RAW_CALLS, &[&socket_text, &provider]))
        .await
        .unwrap();
    // HandshakeResponse { chosen_version: 1, server_versions: [1, 2, 3] }: a
    // client offering only version 1 keeps it.
    assert_eq!(line(&out, "handshake:"), "ok 08011203010203", "{out}");
    // HealthCheckResponse { status: SERVING }.
    assert_eq!(line(&out, "health:"), "ok 0801", "{out}");
    // A provider without a registration cannot unregister it.
    assert!(line(&out, "unregister:").starts_with("NOT_FOUND"), "{out}");
}

/// The example as a repository of its own: its files, and the protocol's
/// `.proto` at `proto/` (the example reads it at `../../../proto` when loaded
/// from Corbel's repository). `run` replaces its run command.
fn example_repo(run: Option<&str>, extra: &[(&str, &str)]) -> ProviderRepo {
    example_repo_edited(|metadata| metadata, run, extra)
}

/// [`example_repo`] with its `corbel-provider.yaml` changed by `edit`.
pub(super) fn example_repo_edited(
    edit: impl Fn(String) -> String,
    run: Option<&str>,
    extra: &[(&str, &str)],
) -> ProviderRepo {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = root.join("providers/examples/python");
    let read =
        |p: PathBuf| std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mut metadata =
        edit(read(example.join("corbel-provider.yaml")).replace("../../../proto", "proto"));
    if let Some(run) = run {
        metadata = metadata.replace("run: exec python3 provider.py", &format!("run: {run}"));
    }
    let provider = read(example.join("provider.py"));
    let health = read(example.join("health/v1/health.proto"));
    let proto = read(root.join("proto/corbel/provider/v1/provider.proto"));
    let mut files = vec![
        ("provider.py", provider.as_str()),
        ("health/v1/health.proto", health.as_str()),
        ("proto/corbel/provider/v1/provider.proto", proto.as_str()),
    ];
    files.extend_from_slice(extra);
    ProviderRepo::new(&metadata, &files)
}

const FILES: &str = r#"
version: "1"
resources:
  note:
    type: example.v1.file
    replicas: 2
    config: { content: "hello from a blueprint" }
"#;

/// The deployment's events, as `kind message` lines.
async fn events(app: &TestApp, id: &str) -> Vec<String> {
    let body = app
        .gql(
            "query($id: ID!) { deployment(id: $id) { events { kind nodeKey message } } }",
            json!({ "id": id }),
        )
        .await;
    data(&body)["deployment"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["kind"].as_str().unwrap(),
                e["message"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test]
async fn the_python_example_provider_deploys_and_destroys_files() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), quick).await;
    // Straight from Corbel's own repository, as a provider author would
    // publish it in a monorepo (what is committed is what loads).
    let (id, _) = create_provider(
        &app,
        json!({
            "name": "example-python",
            "gitUrl": env!("CARGO_MANIFEST_DIR"),
            "path": "providers/examples/python",
            "config": { "file_mode": "0600" },
        }),
    )
    .await;
    let connected = wait_status(&app, &id, "CONNECTED").await;
    assert_eq!(connected.resource_types, ["example.v1.file"]);
    let answer = nodes(&app, &id).await;
    assert_eq!(
        data(&answer)["provider"]["nodes"][0]["capacity"]["example.v1.file"],
        1000,
        "{answer}"
    );

    let blueprint = create_blueprint(&app, "files", FILES).await;
    let deployment = deploy(&app, &blueprint, "notes", json!({})).await;
    let done = settled(&app, &deployment, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{:?}", done.error);
    let mut paths = Vec::new();
    for node in &done.nodes {
        let path = node.outputs["path"]
            .as_str()
            .expect("a path output")
            .to_owned();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "hello from a blueprint"
        );
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the configured file_mode applies");
        paths.push(path);
    }
    assert_eq!(paths.len(), 2);
    assert_ne!(paths[0], paths[1], "one file per resource id");
    let seen = events(&app, &deployment).await;
    assert!(
        seen.iter().any(|e| e == "PROGRESS 30% intent recorded"),
        "{seen:?}"
    );

    // Unregister with a session that is not the provider's: NOT_FOUND, and
    // the provider stays connected.
    let socket = corbel::provider::socket_root_for(app.store.data_dir()).join("registry.sock");
    let (socket_text, provider_id) = (socket.to_str().unwrap().to_owned(), id.clone());
    let out = tokio::task::spawn_blocking(move || python(RAW_CALLS, &[&socket_text, &provider_id]))
        .await
        .unwrap();
    assert!(line(&out, "unregister:").starts_with("NOT_FOUND"), "{out}");
    assert_eq!(provider(&app, &id).await.status, "CONNECTED");

    let body = app
        .gql(
            "mutation($id: ID!) { destroyDeployment(id: $id) { id } }",
            json!({ "id": deployment }),
        )
        .await;
    data(&body);
    settled(&app, &deployment, &["DESTROYED"]).await;
    for path in &paths {
        assert!(!Path::new(path).exists(), "{path} is removed");
    }

    // Unloading sends SIGTERM: the provider unregisters and exits 0.
    let body = app
        .gql(
            "mutation($id: ID!) { unloadProvider(id: $id) { status } }",
            json!({ "id": id }),
        )
        .await;
    data(&body);
    wait_status(&app, &id, "UNLOADED").await;
    let log = logs(&app, &id).await;
    assert!(log.contains("unregistered"), "{log}");
    assert!(!log.contains("Traceback"), "{log}");
}

#[tokio::test]
async fn a_configuration_the_provider_refuses_is_a_validation_error_in_its_words() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), quick).await;
    let repo = example_repo(None, &[]);
    let (id, _) = create_provider(
        &app,
        json!({ "name": "example-python", "gitUrl": repo.url() }),
    )
    .await;
    wait_status(&app, &id, "CONNECTED").await;

    let body = app
        .gql(
            "mutation($id: ID!, $config: JSON!) { configureProvider(id: $id, config: $config) { id } }",
            json!({ "id": id, "config": { "colour": "red" } }),
        )
        .await;
    assert_eq!(error_code(&body), Some("VALIDATION"), "{body}");
    let message = body["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("the provider refused the configuration: unknown config key `colour`"),
        "{message}"
    );
    // Not stored: the provider still has its old configuration.
    assert_eq!(provider(&app, &id).await.config, json!({}));

    // A stored configuration the provider refuses at registration: the
    // registration is refused in the provider's words, in its log.
    let repo = example_repo(None, &[]);
    let (id, _) = create_provider(
        &app,
        json!({ "name": "refused", "gitUrl": repo.url(), "config": { "file_mode": "rwx" } }),
    )
    .await;
    let line = eventually(
        Duration::from_secs(60),
        "the refusal in the log",
        || async {
            logs(&app, &id)
                .await
                .lines()
                .find(|l| l.contains("refused its configuration"))
                .map(str::to_owned)
        },
    )
    .await;
    assert!(
        line.contains("file_mode: `rwx` is not an octal mode"),
        "{line}"
    );
    assert_ne!(provider(&app, &id).await.status, "CONNECTED");
}

/// Wraps the example's `DeployResource`: `extra` yields two events after
/// `done`; `slow` yields progress forever, after writing the deadline it was
/// given to `deadline.txt`.
const MISBEHAVE: &str = r#"
import os, sys, time
sys.argv = [sys.argv[0]]
import provider
mode = os.environ.pop("MISBEHAVE")
good = provider.Provider.DeployResource
def deploy(self, request, context):
    if mode == "extra":
        yield from good(self, request, context)
        yield provider.progress(100, "after done")
        yield provider.done({})
        return
    with open("deadline.txt", "w") as f:
        f.write(str(context.time_remaining()))
    while context.is_active():
        yield provider.progress(10, "still going")
        time.sleep(0.2)
provider.Provider.DeployResource = deploy
provider.main()
"#;

#[tokio::test]
async fn events_after_done_are_reported_as_a_protocol_violation_and_ignored() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), quick).await;
    let repo = example_repo(
        Some("MISBEHAVE=extra exec python3 misbehave.py"),
        &[("misbehave.py", MISBEHAVE)],
    );
    let (id, _) = create_provider(
        &app,
        json!({ "name": "example-python", "gitUrl": repo.url() }),
    )
    .await;
    wait_status(&app, &id, "CONNECTED").await;
    let blueprint =
        create_blueprint(&app, "one", &FILES.replace("replicas: 2", "replicas: 1")).await;
    let deployment = deploy(&app, &blueprint, "one", json!({})).await;
    let done = settled(&app, &deployment, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{:?}", done.error);
    let resource_id = eventually(
        Duration::from_secs(30),
        "the violation in the log",
        || async {
            let log = logs(&app, &id).await;
            log.lines()
                .find(|l| {
                    l.contains("protocol violation: DeployResource for resource")
                        && l.contains("after `done`; ignored")
                })
                .map(str::to_owned)
        },
    )
    .await;
    assert!(
        resource_id.contains("(key `note`) sent a progress event"),
        "{resource_id}"
    );
    let log = logs(&app, &id).await;
    assert!(log.contains("sent a second `done` after `done`"), "{log}");
    // Ignored: the outputs are the first `done`'s, and no event came of them.
    assert!(
        done.nodes[0].outputs["path"].is_string(),
        "{:?}",
        done.nodes[0].outputs
    );
    let seen = events(&app, &deployment).await;
    assert!(!seen.iter().any(|e| e.contains("after done")), "{seen:?}");
}

#[tokio::test]
async fn deploy_resource_carries_a_deadline_for_the_whole_call() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |config| {
        quick(config);
        config.provider.resource_timeout = Duration::from_secs(2);
    })
    .await;
    let repo = example_repo(
        Some("MISBEHAVE=slow exec python3 misbehave.py"),
        &[("misbehave.py", MISBEHAVE)],
    );
    let (id, _) = create_provider(
        &app,
        json!({ "name": "example-python", "gitUrl": repo.url() }),
    )
    .await;
    wait_status(&app, &id, "CONNECTED").await;
    let blueprint =
        create_blueprint(&app, "one", &FILES.replace("replicas: 2", "replicas: 1")).await;
    let deployment = deploy(&app, &blueprint, "slow", json!({})).await;
    // Progress every 200 ms never ends the call: the deadline does, and the
    // lost outcome is tried again, then given up on.
    let failed = settled(&app, &deployment, &["FAILED", "COMPLETE"]).await;
    assert_eq!(failed.state, "FAILED");
    let error = failed.error.unwrap_or_default();
    assert!(
        error.contains("did not answer DeployResource within 2000ms"),
        "{error}"
    );
    // The provider was told the deadline (gRPC timeout), not left to guess.
    let checkout = app.store.data_dir().join("providers").join(&id).join("src");
    let told: f64 = std::fs::read_to_string(checkout.join("deadline.txt"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(told > 0.0 && told <= 2.0, "time remaining {told}");
}

/// Watching the registry's health is the provider's duty: killed outright,
/// the server cannot stop it, and the Python provider exits by itself.
#[tokio::test]
async fn the_python_provider_exits_when_its_server_is_killed() {
    let store = Arc::new(TestStore::fresh().await);
    let app = TestApp::spawn_with(store.clone(), quick).await;
    let repo = example_repo(
        Some("echo $$ > provider.pid; exec python3 provider.py"),
        &[],
    );
    let (id, _) = create_provider(
        &app,
        json!({ "name": "example-python", "gitUrl": repo.url() }),
    )
    .await;
    wait_status(&app, &id, "CONNECTED").await;
    let store = app.stop().await;

    provider_exits_when_its_server_is_killed(&store, &id, &[]).await;
}

/// The next status of a watch, within `within`.
async fn next_status(
    stream: &mut tonic::Streaming<proto::ResourceStatus>,
    within: Duration,
) -> proto::ResourceStatus {
    tokio::time::timeout(within, stream.message())
        .await
        .expect("a status in time")
        .expect("the watch goes on")
        .expect("the watch is open")
}

/// Version 3, driven straight on the provider's socket once the server has
/// loaded it: the watch reports a file HEALTHY, then `synced`, then DOWN
/// "file removed" once the test deletes it; Inspect says the same.
#[tokio::test]
async fn the_python_example_watches_its_files() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), quick).await;
    let repo = example_repo(None, &[]);
    let (id, _) = create_provider(
        &app,
        json!({ "name": "example-python", "gitUrl": repo.url() }),
    )
    .await;
    wait_status(&app, &id, "CONNECTED").await;
    let socket = corbel::provider::socket_root_for(app.store.data_dir())
        .join("sockets")
        .join(format!("{id}.sock"));
    let channel = tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ProviderClient::new(channel);
    let file = proto::Resource {
        key: "note".into(),
        r#type: "example.v1.file".into(),
        config_json: json!({ "content": "watched" }).to_string(),
        resource_id: uuid::Uuid::new_v4().to_string(),
        ..Default::default()
    };
    let request = proto::DeployResourceRequest {
        resource: Some(file.clone()),
        ..Default::default()
    };
    let mut events = client.deploy_resource(request).await.unwrap().into_inner();
    let mut outputs = None;
    while let Some(event) = events.message().await.unwrap() {
        if let Some(Event::Done(done)) = event.event {
            outputs = Some(serde_json::from_str::<serde_json::Value>(&done.outputs_json).unwrap());
        }
    }
    let path = outputs.expect("done")["path"].as_str().unwrap().to_owned();

    let request = proto::WatchResourcesRequest {
        resources: vec![file.clone()],
    };
    let mut watch = client.watch_resources(request).await.unwrap().into_inner();
    let within = Duration::from_secs(10);
    let first = next_status(&mut watch, within).await;
    assert_eq!(first.resource_id, file.resource_id, "{first:?}");
    assert_eq!(first.health(), proto::Health::Healthy, "{first:?}");
    assert!(next_status(&mut watch, within).await.synced);

    std::fs::remove_file(&path).unwrap();
    let down = next_status(&mut watch, within).await;
    assert_eq!(
        (
            down.resource_id.as_str(),
            down.health(),
            down.reason.as_str()
        ),
        (
            file.resource_id.as_str(),
            proto::Health::Down,
            "file removed"
        )
    );
    assert_eq!(down.exit_code, None);
    let inspected = client
        .inspect(proto::InspectRequest {
            resource: Some(file.clone()),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!inspected.present);
    assert_eq!(
        (inspected.health(), inspected.reason.as_str()),
        (proto::Health::Down, "file removed")
    );
}
