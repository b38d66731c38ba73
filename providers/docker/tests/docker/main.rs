//! The docker provider through the SDK's test host against the real engine
//! (`/var/run/docker.sock` or `DOCKER_HOST`). Checks go through the docker
//! CLI, a client other than the one under test.
//!
//! Every test uses resource ids of its own and a guard that removes whatever
//! carries them when dropped, so a failing test leaves nothing behind.
//!
//! One test binary (`docker`); this file holds what its tests share: the
//! test image, the docker CLI, resources, the guard, and the provider calls.

use std::process::Command;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use corbel_provider_docker::{CONTAINER, DockerProvider};
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::testing::{TestHost, outcome};
use corbel_provider_sdk::{Status, proto};

mod binary;
mod configuration;
mod containers;
mod data;
mod networks_and_volumes;
mod power;
mod updates;
mod watch;

const IMAGE: &str = "corbel-test-busybox:1";

/// `docker <args>`: whether it succeeded, and its stdout (trimmed).
fn docker(args: &[&str]) -> (bool, String) {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("the docker CLI runs");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return (false, format!("{text}{err}"));
    }
    (true, text)
}

/// Builds the test image once per test binary: a static busybox `FROM scratch`.
fn test_image() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy("/bin/busybox", dir.path().join("busybox")).unwrap();
        std::fs::write(
            dir.path().join("Dockerfile"),
            "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n",
        )
        .unwrap();
        let (ok, out) = docker(&[
            "build",
            "-q",
            "-t",
            IMAGE,
            "--label",
            "io.corbel.test=corbel-provider-docker",
            dir.path().to_str().unwrap(),
        ]);
        assert!(ok, "building {IMAGE}: {out}");
    });
}

async fn host() -> TestHost {
    test_image();
    TestHost::start(DockerProvider::new()).await
}

/// A resource id no other test (or run) uses.
fn unique_id(key: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{:08x}{:06x}-{key}",
        (nanos / 100) as u32,
        std::process::id()
    )
}

fn resource(kind: &str, key: &str, config: Value) -> proto::Resource {
    proto::Resource {
        key: key.to_string(),
        r#type: kind.to_string(),
        config_json: config.to_string(),
        resource_id: unique_id(key),
        node: String::new(),
        deployment_id: "test-deployment".to_string(),
    }
}

/// Removes the containers, networks and volumes labelled with its resource
/// ids (and images it was told of) when dropped.
#[derive(Default)]
struct Cleanup {
    ids: Vec<String>,
    images: Vec<String>,
}

impl Cleanup {
    fn of(resources: &[&proto::Resource]) -> Self {
        Cleanup {
            ids: resources.iter().map(|r| r.resource_id.clone()).collect(),
            images: Vec::new(),
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for id in &self.ids {
            let filter = format!("label=io.corbel.resource={id}");
            let (_, containers) = docker(&["ps", "-aq", "--filter", &filter]);
            for c in containers.split_whitespace() {
                docker(&["rm", "-f", c]);
            }
            let (_, networks) = docker(&["network", "ls", "-q", "--filter", &filter]);
            for n in networks.split_whitespace() {
                docker(&["network", "rm", n]);
            }
            let (_, volumes) = docker(&["volume", "ls", "-q", "--filter", &filter]);
            for v in volumes.split_whitespace() {
                docker(&["volume", "rm", "-f", v]);
            }
        }
        for image in &self.images {
            docker(&["rmi", "-f", image]);
        }
    }
}

/// Container ids carrying `resource`'s label, running or not.
fn containers_of(resource: &proto::Resource) -> Vec<String> {
    let filter = format!("label=io.corbel.resource={}", resource.resource_id);
    let (ok, out) = docker(&["ps", "-aq", "--no-trunc", "--filter", &filter]);
    assert!(ok, "{out}");
    out.split_whitespace().map(str::to_owned).collect()
}

fn inspect_format(kind: &str, what: &str, format: &str) -> Option<String> {
    let (ok, out) = docker(&[kind, "inspect", "--format", format, what]);
    ok.then_some(out)
}

fn container_status(id: &str) -> String {
    inspect_format("container", id, "{{.State.Status}}").unwrap_or_else(|| "gone".into())
}

async fn deploy(host: &TestHost, resource: &proto::Resource) -> Result<Value, proto::Failure> {
    let events = host
        .deploy(resource.clone())
        .await
        .expect("the deploy call");
    outcome(&events)
}

async fn destroy(host: &TestHost, resource: &proto::Resource) -> Result<Value, proto::Failure> {
    let events = host
        .destroy(resource.clone(), json!({}))
        .await
        .expect("the destroy call");
    outcome(&events)
}

async fn retrieve(
    host: &TestHost,
    kind: &str,
    config: Value,
    resource: Option<&proto::Resource>,
) -> Result<Value, Status> {
    let answer = host
        .client()
        .retrieve_data(proto::RetrieveDataRequest {
            r#type: kind.to_string(),
            config_json: config.to_string(),
            resource: resource.cloned(),
        })
        .await?
        .into_inner();
    Ok(serde_json::from_str(&answer.data_json).unwrap())
}

fn sleeper(key: &str) -> proto::Resource {
    resource(
        CONTAINER,
        key,
        json!({ "image": IMAGE, "command": ["sleep", "300"] }),
    )
}
