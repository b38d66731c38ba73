//! The docker provider through the SDK's test host against the real engine
//! (`/var/run/docker.sock` or `DOCKER_HOST`). Checks go through the docker
//! CLI, a client other than the one under test.
//!
//! Every test uses resource ids of its own and a guard that removes whatever
//! carries them when dropped, so a failing test leaves nothing behind.

use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use corbel_provider_docker::{CONTAINER, DockerProvider, IMAGE_LOOKUP, NETWORK, VOLUME};
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::testing::{TestHost, outcome};
use corbel_provider_sdk::{Code, Status, proto};

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

/// Waits, with a deadline, for `check` to hold.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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

async fn power(
    host: &TestHost,
    resource: &proto::Resource,
    action: proto::PowerAction,
) -> Result<(), Status> {
    host.client()
        .power(proto::PowerRequest {
            resource: Some(resource.clone()),
            action: action as i32,
        })
        .await
        .map(|_| ())
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

#[tokio::test]
async fn container_deploy_inspect_destroy() {
    let host = host().await;
    let web = resource(
        CONTAINER,
        "web",
        json!({
            "image": IMAGE,
            "command": "exec sleep 300",
            "env": { "GREETING": "hi" },
            "ports": [{ "container": 80 }],
            "labels": { "team": "test" },
            "restart": "unless-stopped",
            "limits": { "memory": "64m", "cpus": 0.5 },
        }),
    );
    let _cleanup = Cleanup::of(&[&web]);

    let outputs = deploy(&host, &web).await.unwrap();
    let id = outputs["id"].as_str().unwrap().to_string();
    assert_eq!(outputs["state"], "running", "{outputs}");
    assert_eq!(outputs["image"], IMAGE);
    let name = outputs["name"].as_str().unwrap();
    assert!(name.starts_with("corbel-web-"), "{name}");
    assert_eq!(outputs["ports"][0]["container"], 80);
    assert_eq!(outputs["ports"][0]["protocol"], "tcp");
    assert!(
        outputs["ports"][0]["host"].as_u64().unwrap() > 0,
        "{outputs}"
    );

    // The engine, as another client sees it.
    assert_eq!(containers_of(&web), std::slice::from_ref(&id));
    let labels: Value =
        serde_json::from_str(&inspect_format("container", &id, "{{json .Config.Labels}}").unwrap())
            .unwrap();
    assert_eq!(labels["io.corbel.resource"], web.resource_id.as_str());
    assert_eq!(labels["io.corbel.deployment"], "test-deployment");
    assert_eq!(labels["io.corbel.key"], "web");
    assert_eq!(labels["io.corbel.managed-by"], "corbel-provider-docker");
    assert_eq!(labels["team"], "test");
    assert_eq!(
        inspect_format("container", &id, "{{.HostConfig.Memory}}").unwrap(),
        (64 << 20).to_string()
    );

    // Deploy is idempotent.
    let again = deploy(&host, &web).await.unwrap();
    assert_eq!(again["id"], outputs["id"]);
    assert_eq!(containers_of(&web).len(), 1);

    let inspected = host.inspect(web.clone()).await.unwrap();
    assert!(inspected.present);
    let seen: Value = serde_json::from_str(&inspected.outputs_json).unwrap();
    assert_eq!(seen["id"], outputs["id"]);

    destroy(&host, &web).await.unwrap();
    assert!(containers_of(&web).is_empty());
    assert_eq!(container_status(&id), "gone");
    assert!(!host.inspect(web.clone()).await.unwrap().present);
    // Destroying what is gone succeeds.
    destroy(&host, &web).await.unwrap();
}

#[tokio::test]
async fn network_and_volume_deploy_inspect_destroy() {
    let host = host().await;
    let net = resource(NETWORK, "net", json!({ "labels": { "team": "test" } }));
    let data = resource(VOLUME, "data", json!({}));
    let _cleanup = Cleanup::of(&[&net, &data]);

    let net_out = deploy(&host, &net).await.unwrap();
    let net_name = net_out["name"].as_str().unwrap().to_string();
    assert!(net_name.starts_with("corbel-net-"), "{net_out}");
    let labels: Value =
        serde_json::from_str(&inspect_format("network", &net_name, "{{json .Labels}}").unwrap())
            .unwrap();
    assert_eq!(labels["io.corbel.resource"], net.resource_id.as_str());
    assert_eq!(labels["team"], "test");
    assert_eq!(
        inspect_format("network", &net_name, "{{.Id}}").unwrap(),
        net_out["id"].as_str().unwrap()
    );
    assert_eq!(deploy(&host, &net).await.unwrap(), net_out, "idempotent");
    let (_, count) = docker(&[
        "network",
        "ls",
        "-q",
        "--filter",
        &format!("name={net_name}"),
    ]);
    assert_eq!(count.lines().count(), 1);
    let seen = host.inspect(net.clone()).await.unwrap();
    assert!(seen.present);
    assert_eq!(
        serde_json::from_str::<Value>(&seen.outputs_json).unwrap(),
        net_out
    );

    let vol_out = deploy(&host, &data).await.unwrap();
    let vol_name = vol_out["name"].as_str().unwrap().to_string();
    assert!(vol_out["mountpoint"].as_str().unwrap().contains(&vol_name));
    assert_eq!(
        inspect_format(
            "volume",
            &vol_name,
            "{{index .Labels \"io.corbel.resource\"}}"
        )
        .unwrap(),
        data.resource_id
    );
    assert_eq!(deploy(&host, &data).await.unwrap(), vol_out, "idempotent");
    assert!(host.inspect(data.clone()).await.unwrap().present);

    destroy(&host, &net).await.unwrap();
    destroy(&host, &data).await.unwrap();
    assert!(inspect_format("network", &net_name, "{{.Id}}").is_none());
    assert!(inspect_format("volume", &vol_name, "{{.Name}}").is_none());
    assert!(!host.inspect(net.clone()).await.unwrap().present);
    assert!(!host.inspect(data.clone()).await.unwrap().present);
    destroy(&host, &net).await.unwrap();
    destroy(&host, &data).await.unwrap();
}

#[tokio::test]
async fn deploying_one_resource_twice_at_once_makes_one_container() {
    let host = host().await;
    let web = sleeper("twice");
    let _cleanup = Cleanup::of(&[&web]);
    let (a, b) = tokio::join!(deploy(&host, &web), deploy(&host, &web));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a["id"], b["id"]);
    assert_eq!(containers_of(&web).len(), 1);
    // And a second provider (a restarted one) adopts it as well.
    let other = TestHost::start(DockerProvider::new()).await;
    let c = deploy(&other, &web).await.unwrap();
    assert_eq!(c["id"], a["id"]);
    assert_eq!(containers_of(&web).len(), 1);
    destroy(&other, &web).await.unwrap();
    assert!(containers_of(&web).is_empty());
}

#[tokio::test]
async fn a_container_a_lost_call_created_but_never_started_is_adopted_and_started() {
    let host = host().await;
    let web = sleeper("lost");
    let _cleanup = Cleanup::of(&[&web]);
    let name = format!("corbel-lost-{}", web.resource_id.replace('-', ""));
    let (ok, created) = docker(&[
        "create",
        "--name",
        &name,
        "--label",
        &format!("io.corbel.resource={}", web.resource_id),
        "--label",
        "io.corbel.key=lost",
        "--label",
        "io.corbel.managed-by=corbel-provider-docker",
        IMAGE,
        "sleep",
        "300",
    ]);
    assert!(ok, "{created}");
    assert_eq!(container_status(&created), "created");
    // Inspect finds it already.
    assert!(host.inspect(web.clone()).await.unwrap().present);

    let outputs = deploy(&host, &web).await.unwrap();
    assert_eq!(outputs["id"], created.as_str());
    assert_eq!(outputs["name"], name.as_str());
    assert_eq!(outputs["state"], "running");
    assert_eq!(container_status(&created), "running");
    assert_eq!(containers_of(&web), std::slice::from_ref(&created));
    destroy(&host, &web).await.unwrap();
    assert_eq!(container_status(&created), "gone");
}

#[tokio::test]
async fn a_name_held_by_a_foreign_container_fails_clearly() {
    let host = host().await;
    let foreign = sleeper("foreign");
    let name = format!("corbel-foreign-{}", foreign.resource_id);
    let web = resource(
        CONTAINER,
        "web",
        json!({ "image": IMAGE, "command": ["sleep", "300"], "name": name }),
    );
    let _cleanup = Cleanup::of(&[&foreign, &web]);
    // Labelled with another resource's id, so the guard removes it.
    let (ok, held) = docker(&[
        "create",
        "--name",
        &name,
        "--label",
        &format!("io.corbel.resource={}", foreign.resource_id),
        IMAGE,
        "sleep",
        "300",
    ]);
    assert!(ok, "{held}");
    let failure = deploy(&host, &web).await.unwrap_err();
    assert!(
        failure.message.contains(&name) && failure.message.contains(&held[..12]),
        "{failure:?}"
    );
    assert!(!failure.retryable);
    assert!(containers_of(&web).is_empty());
    assert_eq!(
        container_status(&held),
        "created",
        "the foreign one is untouched"
    );
    // Destroy leaves the foreign container alone (it is not this resource's).
    destroy(&host, &web).await.unwrap();
    assert_eq!(container_status(&held), "created");
}

#[tokio::test]
async fn two_containers_talk_over_a_network_and_logs_show_it() {
    let host = host().await;
    let tag = unique_id("net");
    let net_name = format!("corbel-test-{tag}");
    let net = resource(NETWORK, "net", json!({ "name": net_name }));
    let www = resource(VOLUME, "www", json!({}));
    let _early = Cleanup::of(&[&net, &www]);
    deploy(&host, &net).await.unwrap();
    let www_out = deploy(&host, &www).await.unwrap();
    let server = resource(
        CONTAINER,
        "server",
        json!({
            "image": IMAGE,
            "command": "echo served-by-corbel > /www/index.html && exec httpd -f -p 8080 -h /www",
            "network": net_name,
            "aliases": ["web"],
            "mounts": [{ "volume": www_out["name"], "target": "/www" }],
        }),
    );
    let client = resource(
        CONTAINER,
        "client",
        json!({
            "image": IMAGE,
            "command": "while ! wget -qO- http://web:8080/; do sleep 0.2; done; exec sleep 300",
            "network": net_name,
        }),
    );
    let _cleanup = Cleanup::of(&[&server, &client]);

    let server_out = deploy(&host, &server).await.unwrap();
    assert_eq!(server_out["network"], net_name.as_str());
    assert!(
        server_out["ip"].as_str().is_some_and(|ip| !ip.is_empty()),
        "{server_out}"
    );
    deploy(&host, &client).await.unwrap();

    // describe_resources: a container on a blueprint network depends on it.
    let described = host
        .client()
        .describe_resources(proto::DescribeResourcesRequest {
            resources: vec![net.clone(), server.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(described.descriptions.len(), 1);
    assert_eq!(described.descriptions[0].key, "server");
    assert_eq!(described.descriptions[0].depends_on, ["net"]);
    assert_eq!(
        described.descriptions[0].quota.get("containers"),
        Some(&1),
        "each container counts against a project's `containers` quota"
    );

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let logs = retrieve(&host, "logs", json!({ "tail": 50 }), Some(&client))
            .await
            .unwrap();
        if logs["logs"].as_str().unwrap().contains("served-by-corbel") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "client logs: {logs}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A network or volume still in use is not removed: a retryable failure naming it.
    let busy = destroy(&host, &net).await.unwrap_err();
    assert!(
        busy.retryable && busy.message.contains(&net_name),
        "{busy:?}"
    );
    assert!(inspect_format("network", &net_name, "{{.Id}}").is_some());
    let busy = destroy(&host, &www).await.unwrap_err();
    assert!(busy.retryable, "{busy:?}");

    destroy(&host, &client).await.unwrap();
    destroy(&host, &server).await.unwrap();
    destroy(&host, &net).await.unwrap();
    destroy(&host, &www).await.unwrap();
    assert!(inspect_format("network", &net_name, "{{.Id}}").is_none());
}

#[tokio::test]
async fn power_stops_starts_pauses_and_resumes_idempotently() {
    use proto::PowerAction as A;
    let host = host().await;
    host.configure(json!({ "stop_timeout_s": 1 }))
        .await
        .unwrap();
    let web = sleeper("power");
    let net = resource(NETWORK, "pnet", json!({}));
    let _cleanup = Cleanup::of(&[&web, &net]);
    let id = deploy(&host, &web).await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    for (action, want) in [
        (A::Stop, "exited"),
        (A::Stop, "exited"),
        (A::Start, "running"),
        (A::Start, "running"),
        (A::Pause, "paused"),
        (A::Pause, "paused"),
        (A::Resume, "running"),
        (A::Resume, "running"),
        (A::Pause, "paused"),
        (A::Start, "running"),
        (A::Restart, "running"),
        (A::Pause, "paused"),
        (A::Stop, "exited"),
    ] {
        power(&host, &web, action)
            .await
            .unwrap_or_else(|e| panic!("{action:?}: {e}"));
        eventually(&format!("{action:?} → {want}"), || {
            container_status(&id) == want
        })
        .await;
    }
    let outputs: Value =
        serde_json::from_str(&host.inspect(web.clone()).await.unwrap().outputs_json).unwrap();
    assert_eq!(outputs["state"], "exited");
    // Deploying a stopped container adopts it as it is.
    assert_eq!(deploy(&host, &web).await.unwrap()["id"], id.as_str());

    let refused = power(&host, &net, A::Stop).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains("docker.v1.network has no power"),
        "{refused:?}"
    );

    destroy(&host, &web).await.unwrap();
    let gone = power(&host, &web, A::Start).await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
}

#[tokio::test]
async fn retrieve_data_inspect_hides_env_values_and_looks_images_up() {
    let host = host().await;
    let web = resource(
        CONTAINER,
        "secret",
        json!({ "image": IMAGE, "command": ["sleep", "300"], "env": { "API_TOKEN": "hunter2-very-secret" } }),
    );
    let _cleanup = Cleanup::of(&[&web]);
    let outputs = deploy(&host, &web).await.unwrap();

    let inspected = retrieve(&host, "inspect", json!({}), Some(&web))
        .await
        .unwrap();
    assert_eq!(inspected["Id"], outputs["id"]);
    let env = inspected["Config"]["Env"].as_array().unwrap();
    assert!(env.contains(&json!("API_TOKEN")), "{env:?}");
    assert!(
        !inspected.to_string().contains("hunter2"),
        "a secret leaked"
    );

    let image = retrieve(&host, IMAGE_LOOKUP, json!({ "name": IMAGE }), None)
        .await
        .unwrap();
    assert!(
        image["id"].as_str().unwrap().starts_with("sha256:"),
        "{image}"
    );
    assert!(image["tags"].as_array().unwrap().contains(&json!(IMAGE)));
    assert!(image["size"].as_i64().unwrap() > 0);
    let missing = retrieve(
        &host,
        IMAGE_LOOKUP,
        json!({ "name": "corbel-no-such-image:0" }),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    let unknown = retrieve(&host, "docker.v1.nope", json!({}), None)
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::InvalidArgument);
    let bad_tail = retrieve(&host, "logs", json!({ "tail": 0 }), Some(&web))
        .await
        .unwrap_err();
    assert_eq!(bad_tail.code(), Code::InvalidArgument);
    assert!(bad_tail.message().contains("tail"));

    destroy(&host, &web).await.unwrap();
    let gone = retrieve(&host, "logs", json!({}), Some(&web))
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
}

#[tokio::test]
async fn list_nodes_reports_the_engine() {
    let host = host().await;
    host.configure(json!({ "capacity": 7 })).await.unwrap();
    let nodes = host.list_nodes().await.unwrap();
    assert_eq!(nodes.len(), 1);
    let node = &nodes[0];
    assert!(!node.name.is_empty());
    assert_eq!(node.capacity["*"], 7);
    assert!(node.labels["cpus"].parse::<u32>().unwrap() >= 1, "{node:?}");
    assert!(node.labels["memory_bytes"].parse::<u64>().unwrap() > 0);
    assert!(!node.labels["engine_version"].is_empty());
    assert_eq!(node.labels["os"], "linux");
}

#[tokio::test]
async fn bad_config_names_the_key() {
    let host = host().await;
    let web = resource(
        CONTAINER,
        "bad",
        json!({ "image": IMAGE, "ports": [{ "container": 0 }] }),
    );
    let _cleanup = Cleanup::of(&[&web]);
    let failure = deploy(&host, &web).await.unwrap_err();
    assert_eq!(
        failure.message,
        "ports[0].container: expected a number 1–65535"
    );
    assert!(!failure.retryable);
    assert!(containers_of(&web).is_empty());

    let missing = resource(
        CONTAINER,
        "noimage",
        json!({ "image": "corbel-no-such-image:0" }),
    );
    let _cleanup_missing = Cleanup::of(&[&missing]);
    let failure = deploy(&host, &missing).await.unwrap_err();
    assert!(
        failure.message.contains("corbel-no-such-image:0") && failure.message.contains("pull"),
        "{failure:?}"
    );

    let refused = host
        .configure(json!({ "capacity": "lots" }))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("capacity"), "{refused:?}");
    let refused = host
        .configure(json!({ "docker_host": 5 }))
        .await
        .unwrap_err();
    assert!(refused.message().contains("docker_host"), "{refused:?}");
}

#[tokio::test]
async fn a_built_image_is_tagged_by_its_inputs_and_reused() {
    let host = host().await;
    let context = tempfile::tempdir().unwrap();
    let marker = unique_id("built");
    std::fs::write(context.path().join("message.txt"), format!("{marker}\n")).unwrap();
    std::fs::write(
        context.path().join("Dockerfile"),
        format!("FROM {IMAGE}\nARG WHO\nCOPY message.txt /message.txt\nRUN echo \"by $WHO\" >> /message.txt\n"),
    )
    .unwrap();
    let config = json!({
        "build": { "context": context.path(), "args": { "WHO": "corbel" } },
        "command": "cat /message.txt; exec sleep 300",
    });
    let one = resource(CONTAINER, "built", config.clone());
    let two = resource(CONTAINER, "built2", config);
    let mut cleanup = Cleanup::of(&[&one, &two]);

    let first = deploy(&host, &one).await.unwrap();
    let tag = first["image"].as_str().unwrap().to_string();
    cleanup.images.push(tag.clone());
    assert!(tag.starts_with("corbel-resource-"), "{first}");
    let second = deploy(&host, &two).await.unwrap();
    assert_eq!(second["image"], tag.as_str(), "same inputs, same tag");
    assert_ne!(second["id"], first["id"]);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let logs = retrieve(&host, "logs", json!({}), Some(&one))
            .await
            .unwrap();
        let text = logs["logs"].as_str().unwrap();
        if text.contains(&marker) && text.contains("by corbel") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "logs: {logs}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    destroy(&host, &one).await.unwrap();
    destroy(&host, &two).await.unwrap();
}

/// The real binary, started the way Corbel starts it: it registers with what
/// it serves, and a SIGTERM ends it cleanly (it unregisters, exits 0).
#[tokio::test]
async fn the_binary_registers_and_stops_on_sigterm() {
    use corbel_provider_sdk::testing::{DEADLINE, TestRegistry};

    let state = tempfile::tempdir().unwrap();
    let registry = TestRegistry::builder()
        .initial_config(json!({ "capacity": 3 }))
        .start()
        .await;
    let mut provider = tokio::process::Command::new(env!("CARGO_BIN_EXE_corbel-provider-docker"))
        .envs(registry.env("docker-1"))
        .env("CORBEL_STATE_DIR", state.path())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let registered = registry
        .wait_for_registrations(1, DEADLINE)
        .await
        .expect("the binary registers");
    let request = &registered[0].request;
    assert_eq!(request.name, "docker");
    assert_eq!(
        request.resource_types,
        [
            "docker.v1.container",
            "docker.v1.network",
            "docker.v1.volume"
        ]
    );
    for feature in ["deploy", "destroy", "inspect", "nodes", "data", "power"] {
        assert!(request.features.iter().any(|f| f == feature), "{feature}");
    }

    let pid = provider.id().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(DEADLINE, provider.wait())
        .await
        .expect("the binary exits after SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(registry.unregistrations().len(), 1);
}

/// Two providers (an old instance and its successor) deploying one network
/// at once leave one network: the engine allows two of one name, so the
/// provider removes a duplicate it finds after creating.
#[tokio::test]
async fn two_providers_deploying_one_network_at_once_leave_one() {
    let (one, two) = (host().await, host().await);
    let net = resource(NETWORK, "race", json!({}));
    let _cleanup = Cleanup::of(&[&net]);
    let (a, b) = tokio::join!(deploy(&one, &net), deploy(&two, &net));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b);
    let filter = format!("label=io.corbel.resource={}", net.resource_id);
    let (_, listed) = docker(&["network", "ls", "-q", "--filter", &filter]);
    assert_eq!(listed.lines().count(), 1, "{listed}");
    destroy(&one, &net).await.unwrap();
}

#[tokio::test]
async fn network_and_volume_names_held_by_others_fail_clearly() {
    let host = host().await;
    let foreign = resource(NETWORK, "foreign", json!({}));
    let name = format!("corbel-held-{}", foreign.resource_id);
    let net = resource(NETWORK, "net", json!({ "name": name }));
    let vol = resource(VOLUME, "vol", json!({ "name": name }));
    let _cleanup = Cleanup::of(&[&foreign, &net, &vol]);
    let label = format!("io.corbel.resource={}", foreign.resource_id);
    let (ok, out) = docker(&["network", "create", "--label", &label, &name]);
    assert!(ok, "{out}");
    let (ok, out) = docker(&["volume", "create", "--label", &label, &name]);
    assert!(ok, "{out}");

    let failure = deploy(&host, &net).await.unwrap_err();
    assert!(failure.message.contains(&name), "{failure:?}");
    let failure = deploy(&host, &vol).await.unwrap_err();
    assert!(failure.message.contains(&name), "{failure:?}");
    // Nothing of theirs was made, and the others' are untouched.
    assert!(!host.inspect(net.clone()).await.unwrap().present);
    assert!(!host.inspect(vol.clone()).await.unwrap().present);
    destroy(&host, &net).await.unwrap();
    destroy(&host, &vol).await.unwrap();
    assert!(inspect_format("network", &name, "{{.Id}}").is_some());
    assert!(inspect_format("volume", &name, "{{.Name}}").is_some());
}

/// `{{.HostConfig.Memory}} {{.HostConfig.MemorySwap}} {{.HostConfig.NanoCpus}}
/// {{.HostConfig.RestartPolicy.Name}}:{{...MaximumRetryCount}}`, as the
/// engine reports them to the CLI.
fn limits_of(id: &str) -> String {
    inspect_format(
        "container",
        id,
        "{{.HostConfig.Memory}} {{.HostConfig.MemorySwap}} {{.HostConfig.NanoCpus}} \
         {{.HostConfig.RestartPolicy.Name}}:{{.HostConfig.RestartPolicy.MaximumRetryCount}}",
    )
    .unwrap()
}

/// The process the container runs: its pid and when it started.
fn process_of(id: &str) -> String {
    inspect_format("container", id, "{{.State.Pid}} {{.State.StartedAt}}").unwrap()
}

async fn update(
    host: &TestHost,
    resource: &proto::Resource,
    previous: &proto::Resource,
) -> Result<Result<Value, proto::Failure>, Status> {
    let previous: Value = serde_json::from_str(&previous.config_json).unwrap();
    let events = host.update(resource.clone(), previous, json!({})).await?;
    Ok(outcome(&events))
}

#[tokio::test]
async fn limits_and_restart_change_in_place_and_nothing_else_does() {
    let host = host().await;
    let base = json!({ "image": IMAGE, "command": "exec sleep 300" });
    let with = |extra: Value| {
        let mut config = base.clone();
        config
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        config
    };
    let first = resource(
        CONTAINER,
        "sized",
        with(json!({ "limits": { "memory": "64m", "cpus": 0.5 }, "restart": "on-failure:3" })),
    );
    let _cleanup = Cleanup::of(&[&first]);
    let at = |config: Value| proto::Resource {
        config_json: config.to_string(),
        ..first.clone()
    };

    // Describe says which keys change in place: a container's limits and
    // restart policy; nothing of a network.
    let net = resource(NETWORK, "net", json!({}));
    let described = host
        .client()
        .describe_resources(proto::DescribeResourcesRequest {
            resources: vec![first.clone(), net],
        })
        .await
        .unwrap()
        .into_inner()
        .descriptions;
    assert_eq!(described.len(), 1, "{described:?}");
    assert_eq!(described[0].updatable_keys, ["limits", "restart"]);

    let outputs = deploy(&host, &first).await.unwrap();
    let id = outputs["id"].as_str().unwrap().to_owned();
    assert_eq!(limits_of(&id), "67108864 134217728 500000000 on-failure:3");
    let process = process_of(&id);

    // Larger limits and another restart policy: the same container, its
    // process never restarted.
    let bigger = at(with(
        json!({ "limits": { "memory": "128m", "cpus": 1.5 }, "restart": "always" }),
    ));
    let updated = update(&host, &bigger, &first).await.unwrap().unwrap();
    assert_eq!(updated["id"], id.as_str(), "{updated}");
    assert_eq!(updated["state"], "running");
    assert_eq!(limits_of(&id), "134217728 268435456 1500000000 always:0");
    assert_eq!(process_of(&id), process);
    assert_eq!(containers_of(&first), std::slice::from_ref(&id));

    // Idempotent: updating to what it has changes nothing.
    let again = update(&host, &bigger, &bigger).await.unwrap().unwrap();
    assert_eq!(again["id"], id.as_str());
    assert_eq!(limits_of(&id), "134217728 268435456 1500000000 always:0");

    // Smaller again works too (swap follows memory down).
    let smaller = at(with(json!({ "limits": { "memory": "32m" } })));
    update(&host, &smaller, &bigger).await.unwrap().unwrap();
    let seen = limits_of(&id);
    let fields: Vec<&str> = seen.split(' ').collect();
    assert_eq!(fields[..2], ["33554432", "67108864"], "{seen}");
    // The CPU limit left the config: the engine cannot clear it, so it is
    // raised to the host's CPUs; no restart policy is "no".
    let (_, cpus) = docker(&["info", "--format", "{{.NCPU}}"]);
    let cpus: i64 = cpus.parse().unwrap();
    assert_eq!(
        fields[2..],
        [(cpus * 1_000_000_000).to_string(), "no:0".into()]
    );

    // No limits at all: memory is raised to the host's (swap as much again).
    let (_, total) = docker(&["info", "--format", "{{.MemTotal}}"]);
    let total: i64 = total.parse().unwrap();
    update(&host, &at(base.clone()), &smaller)
        .await
        .unwrap()
        .unwrap();
    let seen = limits_of(&id);
    assert!(
        seen.starts_with(&format!("{total} {} ", total * 2)),
        "{seen}"
    );
    assert_eq!(process_of(&id), process);

    // A key the engine cannot change in place is refused, naming it; the
    // container is untouched.
    let other = at(with(json!({ "env": { "A": "b" } })));
    let refused = update(&host, &other, &at(base.clone()))
        .await
        .unwrap()
        .unwrap_err();
    assert!(refused.message.contains("`env` changed"), "{refused:?}");
    assert_eq!(process_of(&id), process);

    // A container that is gone is NOT_FOUND.
    destroy(&host, &first).await.unwrap();
    let gone = update(&host, &bigger, &first).await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
}
