//! Containers as resources (issue 14): the docker provider (`providers/docker`)
//! loaded from git, deploying networks, volumes and containers on the real
//! Docker engine. What runs is read with the docker CLI, a client other than
//! the provider's. The image is Debian's static busybox on nothing (there is
//! no registry to pull from).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::plans::{actions, apply, plan};
use crate::health::support::{fast_health, health_events, node, until};
use crate::support::binary::{admin_gql, serve};
use crate::support::deployments::{
    create_blueprint, deploy, deployment, destroy, docker_provider_config, settled,
    with_docker_provider, with_process_provider,
};
use crate::support::docker::{
    DeploymentCleanup, LABEL_DEPLOYMENT, busybox_image, container_state, containers, networks,
    volumes,
};
use crate::support::provider_repos::{ProviderRepo, docker_resources_metadata};
use crate::support::providers::{create_provider, wait_status};
use crate::support::settings::quick;
use crate::support::types::Deployment;
use crate::support::{ADMIN_TOKEN, TestApp, TestStore, at_path_as, data, error_code, eventually};

/// A network, a volume, `web` serving a file it wrote into the volume, and
/// `probe` fetching it from `web` by name over the network.
const PAIR: &str = r#"
resources:
  net:
    type: docker.v1.network
  files:
    type: docker.v1.volume
  web:
    type: docker.v1.container
    depends_on: [net, files]
    config:
      image: IMAGE
      network: "{{ resources.net.outputs.name }}"
      mounts: [{ volume: "{{ resources.files.outputs.name }}", target: /www }]
      command: "echo hello-from-web > /www/index.html && exec httpd -f -p 8080 -h /www"
  probe:
    type: docker.v1.container
    depends_on: [web]
    config:
      image: IMAGE
      network: "{{ resources.net.outputs.name }}"
      command: "until wget -qO- http://web:8080/; do sleep 0.2; done; exec sleep 3600"
"#;

async fn power(app: &TestApp, deployment: &str, key: &str, action: &str) -> Value {
    app.gql(
        "mutation($id: ID!, $key: String!, $action: PowerAction!) {
           powerResource(deploymentId: $id, key: $key, action: $action) { key state } }",
        json!({ "id": deployment, "key": key, "action": action }),
    )
    .await
}

async fn powered(app: &TestApp, deployment: &str, key: &str, action: &str) -> String {
    let body = power(app, deployment, key, action).await;
    data(&body)["powerResource"]["state"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn logs(app: &TestApp, node: &str) -> Value {
    app.gql(
        "query($id: ID!) { resourceNode(id: $id) { logs(tail: 50) } }",
        json!({ "id": node }),
    )
    .await
}

/// Polls until the engine says the container is in `state`.
async fn engine_says(container: &str, state: &str) {
    eventually(
        Duration::from_secs(30),
        &format!("container {container} {state}"),
        || async { (container_state(container) == state).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn containers_on_a_network_and_a_volume_talk_power_off_and_on_and_leave_nothing() {
    let image = busybox_image();
    let (app, _provider, _repo) = with_docker_provider(Arc::new(TestStore::fresh().await)).await;
    let blueprint = create_blueprint(&app, "pair", &PAIR.replace("IMAGE", image)).await;
    let id = deploy(&app, &blueprint, "pair", json!({})).await;
    let _cleanup = DeploymentCleanup(id.clone());
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");

    // What the engine runs is what Corbel records, labelled with the deployment.
    let label = format!("{LABEL_DEPLOYMENT}={id}");
    let running: BTreeSet<String> = containers(&label).into_iter().collect();
    let recorded: BTreeSet<String> = ["web", "probe"]
        .iter()
        .map(|k| done.node(k).outputs["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(running, recorded, "{done:?}");
    assert_eq!(networks(&label).len(), 1);
    assert_eq!(
        volumes(&label),
        vec![
            done.node("files").outputs["name"]
                .as_str()
                .unwrap()
                .to_owned()
        ]
    );

    // The probe reached web by its name, and read what web wrote to the volume.
    let probe = done.node("probe").id.clone();
    eventually(Duration::from_secs(30), "the probe's logs", || async {
        let body = logs(&app, &probe).await;
        let text = data(&body)["resourceNode"]["logs"].as_str()?.to_owned();
        text.contains("hello-from-web").then_some(())
    })
    .await;

    // Power: off and on, paused and resumed; the node and the deployment
    // move through SUSPENDED and back, and the engine agrees.
    let web = done.node("web").outputs["id"].as_str().unwrap().to_owned();
    assert_eq!(powered(&app, &id, "web", "STOP").await, "SUSPENDED");
    engine_says(&web, "exited").await;
    assert_eq!(deployment(&app, &id).await.state, "SUSPENDED");
    assert_eq!(
        powered(&app, &id, "web", "STOP").await,
        "SUSPENDED",
        "stopping a stopped resource is no error"
    );
    assert_eq!(powered(&app, &id, "web", "START").await, "COMPLETE");
    engine_says(&web, "running").await;
    assert_eq!(deployment(&app, &id).await.state, "COMPLETE");
    assert_eq!(powered(&app, &id, "web", "PAUSE").await, "SUSPENDED");
    engine_says(&web, "paused").await;
    assert_eq!(deployment(&app, &id).await.state, "SUSPENDED");
    assert_eq!(powered(&app, &id, "web", "RESUME").await, "COMPLETE");
    engine_says(&web, "running").await;
    assert_eq!(deployment(&app, &id).await.state, "COMPLETE");
    let history = app
        .gql(
            "query($id: ID!) { deployment(id: $id) { events { kind nodeKey state message } } }",
            json!({ "id": id }),
        )
        .await;
    let suspended = data(&history)["deployment"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["nodeKey"] == "web[0]" && e["state"] == "SUSPENDED")
        .count();
    assert_eq!(suspended, 3, "{history}");

    // A network has no power: the provider says so, and nothing changes.
    let refused = power(&app, &id, "net", "STOP").await;
    assert_eq!(error_code(&refused), Some("VALIDATION"), "{refused}");
    assert!(refused.to_string().contains("no power"), "{refused}");
    let missing = power(&app, &id, "nothing", "STOP").await;
    assert_eq!(error_code(&missing), Some("NOT_FOUND"), "{missing}");
    assert_eq!(deployment(&app, &id).await.node("net").state, "COMPLETE");

    // Destroy a suspended deployment: nothing with its label is left.
    assert_eq!(powered(&app, &id, "probe", "STOP").await, "SUSPENDED");
    destroy(&app, &id).await;
    let gone = settled(&app, &id, &["DESTROYED", "FAILED"]).await;
    assert_eq!(gone.state, "DESTROYED", "{gone:?}");
    assert_eq!(containers(&label), Vec::<String>::new());
    assert_eq!(networks(&label), Vec::<String>::new());
    assert_eq!(volumes(&label), Vec::<String>::new());
}

/// The real binary SIGKILLed while a chain of containers deploys: after a
/// restart the deployment completes and the containers the engine runs for it
/// are exactly those Corbel records, each once; destroy leaves none.
#[tokio::test]
async fn the_server_killed_mid_deploy_leaves_exactly_the_recorded_containers() {
    const CHAIN: usize = 8;
    let image = busybox_image();
    let store = Arc::new(TestStore::fresh().await);
    let (app, provider, _repo) = with_docker_provider(store).await;
    let mut source = String::from("resources:\n");
    for i in 0..CHAIN {
        source.push_str(&format!(
            "  c{i}:\n    type: docker.v1.container\n    config: {{ image: {image}, command: \"exec sleep 3600\" }}\n"
        ));
        if i > 0 {
            source.push_str(&format!("    depends_on: [c{}]\n", i - 1));
        }
    }
    let blueprint = create_blueprint(&app, "chain", &source).await;
    let store = app.stop().await;

    let admin = ("CORBEL_ADMIN_TOKEN", ADMIN_TOKEN);
    let mut served = serve(&store, &[admin]);
    let addr = served.addr;
    eventually(Duration::from_secs(60), "the provider", || async {
        let body = admin_gql(
            addr,
            "query($id: ID!) { provider(id: $id) { status } }",
            json!({ "id": provider }),
        )
        .await?;
        (body["data"]["provider"]["status"] == "CONNECTED").then_some(())
    })
    .await;
    let body = admin_gql(
        addr,
        "mutation($input: DeployBlueprintInput!) { deployBlueprint(input: $input) { id } }",
        json!({ "input": { "blueprintId": blueprint, "name": "chain" } }),
    )
    .await
    .unwrap();
    let id = body["data"]["deployBlueprint"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let _cleanup = DeploymentCleanup(id.clone());
    let label = format!("{LABEL_DEPLOYMENT}={id}");
    eventually(Duration::from_secs(60), "some containers up", || async {
        let body = admin_gql(
            addr,
            "query($id: ID!) { deployment(id: $id) { nodes { state } } }",
            json!({ "id": id }),
        )
        .await?;
        let complete = body["data"]["deployment"]["nodes"]
            .as_array()?
            .iter()
            .filter(|n| n["state"] == "COMPLETE")
            .count();
        (complete >= 3).then_some(())
    })
    .await;
    served.child.kill().unwrap();
    served.child.wait().unwrap();
    let at_kill = containers(&label).len();
    assert!(
        (3..CHAIN).contains(&at_kill),
        "killed mid-deploy: {at_kill} of {CHAIN} containers"
    );

    let served = serve(&store, &[admin]);
    let addr = served.addr;
    let done = eventually(Duration::from_secs(120), "the deployment to finish", || async {
        let body = admin_gql(
            addr,
            "query($id: ID!) { deployment(id: $id) { state error nodes { id key state outputs } } }",
            json!({ "id": id }),
        )
        .await?;
        let d: Deployment = at_path_as(&body, "deployment").ok()?;
        (d.state == "COMPLETE" || d.state == "FAILED").then_some(d)
    })
    .await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    assert_eq!(done.nodes.len(), CHAIN);
    let recorded: BTreeSet<String> = done
        .nodes
        .iter()
        .map(|n| n.outputs["id"].as_str().unwrap().to_owned())
        .collect();
    let running = containers(&label);
    assert_eq!(running.len(), CHAIN, "one container per node: {running:?}");
    assert_eq!(
        running.iter().cloned().collect::<BTreeSet<_>>(),
        recorded,
        "the engine runs exactly what Corbel records"
    );
    for container in &running {
        assert_eq!(container_state(container), "running", "{container}");
    }

    let body = admin_gql(
        addr,
        "mutation($id: ID!) { destroyDeployment(id: $id) { id } }",
        json!({ "id": id }),
    )
    .await
    .unwrap();
    assert!(body.get("errors").is_none(), "{body}");
    eventually(
        Duration::from_secs(120),
        "the deployment destroyed",
        || async {
            let body = admin_gql(
                addr,
                "query($id: ID!) { deployment(id: $id) { state } }",
                json!({ "id": id }),
            )
            .await?;
            (body["data"]["deployment"]["state"] == "DESTROYED").then_some(())
        },
    )
    .await;
    assert_eq!(containers(&label), Vec::<String>::new());
}

/// Power needs the provider's `power` feature: a provider without it is
/// refused by name, and the resource stays as it was; logs read through its
/// `data` feature.
#[tokio::test]
async fn power_and_logs_need_the_providers_features() {
    let (app, _provider, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(
        &app,
        "one",
        "resources:\n  svc:\n    type: process.v1.service\n    config: { command: sleep, args: [\"300\"] }\n",
    )
    .await;
    let id = deploy(&app, &blueprint, "one", json!({})).await;
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");

    let refused = power(&app, &id, "svc", "STOP").await;
    assert_eq!(error_code(&refused), Some("VALIDATION"), "{refused}");
    assert!(refused.to_string().contains("`power` feature"), "{refused}");
    // The process provider has the `data` feature (issue 37): its logs read.
    let node = done.node("svc").id.clone();
    let read = logs(&app, &node).await;
    assert_eq!(error_code(&read), None, "{read}");
    let bad_tail = app
        .gql(
            "query($id: ID!) { resourceNode(id: $id) { logs(tail: 0) } }",
            json!({ "id": node }),
        )
        .await;
    assert_eq!(error_code(&bad_tail), Some("VALIDATION"), "{bad_tail}");
    assert!(bad_tail.to_string().contains("tail"), "{bad_tail}");
    let after = deployment(&app, &id).await;
    assert_eq!(after.state, "COMPLETE");
    assert_eq!(after.node("svc").state, "COMPLETE");

    // A deployment that is not settled is no place for power.
    destroy(&app, &id).await;
    settled(&app, &id, &["DESTROYED"]).await;
    let refused = power(&app, &id, "svc", "START").await;
    assert_eq!(error_code(&refused), Some("CONFLICT"), "{refused}");
}

/// `web` sized and restarted by variables; its greeting is in its environment.
const SIZED: &str = r#"
variables:
  memory: { type: string, default: "64m" }
  restart: { type: string, default: "on-failure:2" }
  greeting: { type: string, default: hi }
resources:
  web:
    type: docker.v1.container
    config:
      image: IMAGE
      command: "exec sleep 3600"
      name: NAME
      env: { GREETING: "{{ greeting }}" }
      limits: { memory: "{{ memory }}" }
      restart: "{{ restart }}"
"#;

/// What the engine says of a container, through the CLI.
fn inspected(container: &str, format: &str) -> String {
    crate::support::docker::docker(&["inspect", "--format", format, container])
}

/// Issue 17 with the docker provider: a change of limits or restart policy is
/// planned as UPDATE and made in place (the same container, its process never
/// restarted); a change of anything else is a REPLACE, after which the engine
/// runs only the new container. The container has a name of its own, which
/// two cannot hold at once, so the provider asks for the old one to go first.
#[tokio::test]
async fn limits_change_in_place_and_other_changes_replace_the_container() {
    let image = busybox_image();
    let (app, _provider, _repo) = with_docker_provider(Arc::new(TestStore::fresh().await)).await;
    let name = format!(
        "corbel-test-sized-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let source = SIZED.replace("IMAGE", image).replace("NAME", &name);
    let blueprint = create_blueprint(&app, "sized", &source).await;
    let id = deploy(&app, &blueprint, "sized", json!({})).await;
    let _cleanup = DeploymentCleanup(id.clone());
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    let label = format!("{LABEL_DEPLOYMENT}={id}");
    let first = done.node("web").outputs["id"].as_str().unwrap().to_owned();
    let limits = "{{.HostConfig.Memory}} {{.HostConfig.RestartPolicy.Name}}";
    assert_eq!(inspected(&first, limits), "67108864 on-failure");
    let process = inspected(&first, "{{.State.Pid}} {{.State.StartedAt}}");

    let vars = |memory: &str, restart: &str, greeting: &str| json!({ "variables": { "memory": memory, "restart": restart, "greeting": greeting } });
    let planned = plan(&app, &id, vars("128m", "always", "hi")).await;
    assert_eq!(
        actions(&planned),
        [("web".to_owned(), 0, "UPDATE".to_owned())],
        "{planned:#}"
    );
    let changed: Vec<&str> = planned["changes"][0]["config"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["key"].as_str().unwrap())
        .collect();
    assert_eq!(changed, ["limits", "restart"], "{planned:#}");
    data(&apply(&app, &planned).await);
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    assert_eq!(done.node("web").outputs["id"], first.as_str());
    assert_eq!(containers(&label), std::slice::from_ref(&first));
    assert_eq!(inspected(&first, limits), "134217728 always");
    assert_eq!(
        inspected(&first, "{{.State.Pid}} {{.State.StartedAt}}"),
        process,
        "updated in place: the same process runs"
    );

    // The environment cannot change in place: a replacement.
    let planned = plan(&app, &id, vars("128m", "always", "hello")).await;
    assert_eq!(
        actions(&planned),
        [("web".to_owned(), 0, "REPLACE".to_owned())],
        "{planned:#}"
    );
    let reason = planned["changes"][0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("env") && reason.contains("cannot exist at once"),
        "{reason}"
    );
    assert_eq!(planned["changes"][0]["createBeforeDestroy"], false);
    data(&apply(&app, &planned).await);
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    let second = done.node("web").outputs["id"].as_str().unwrap().to_owned();
    assert_ne!(second, first);
    assert_eq!(containers(&label), std::slice::from_ref(&second));
    assert!(
        inspected(&second, "{{json .Config.Env}}").contains("GREETING=hello"),
        "the new container has the new environment"
    );
    assert_eq!(inspected(&second, limits), "134217728 always");
    assert_eq!(inspected(&second, "{{.Name}}"), format!("/{name}"));
}

/// A container that heals itself: any death brings it back.
const HEALING: &str = r#"
resources:
  box:
    type: docker.v1.container
    restart: { policy: always, delay: 100ms }
    config:
      image: IMAGE
      command: "exec sleep 3600"
"#;

/// Ids of the running containers carrying `label` (`key=value`).
fn running(label: &str) -> Vec<String> {
    let listed = crate::support::docker::docker(&[
        "ps",
        "-q",
        "--no-trunc",
        "--filter",
        &format!("label={label}"),
        "--filter",
        "status=running",
    ]);
    listed.lines().map(str::to_owned).collect()
}

/// Issue 37 with the docker provider (its watch follows the engine's
/// events): a container killed behind Corbel's back (`docker kill`) is DOWN,
/// saying how it died, and `restart: always` brings it back as a new
/// container, HEALTHY, the only one carrying its labels.
#[tokio::test]
async fn a_killed_container_is_down_and_restarted_as_a_new_one() {
    let image = busybox_image();
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |config| {
        quick(config);
        fast_health(config);
    })
    .await;
    let repo = ProviderRepo::new(&docker_resources_metadata(), &[]);
    let (provider, _) = create_provider(
        &app,
        json!({ "name": "docker", "gitUrl": repo.url(), "config": docker_provider_config() }),
    )
    .await;
    wait_status(&app, &provider, "CONNECTED").await;
    let blueprint = create_blueprint(&app, "healing", &HEALING.replace("IMAGE", image)).await;
    let id = deploy(&app, &blueprint, "healing", json!({})).await;
    let _cleanup = DeploymentCleanup(id.clone());
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    let before = until(&app, &id, "the box HEALTHY", |d| {
        node(d, "box")["health"] == "HEALTHY"
    })
    .await;
    let first = node(&before, "box")["outputs"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The docker provider labels each container with its node's id.
    let mine = format!(
        "io.corbel.resource={}",
        node(&before, "box")["id"].as_str().unwrap()
    );
    let theirs = format!("{LABEL_DEPLOYMENT}={id}");
    assert_eq!(running(&mine), std::slice::from_ref(&first));

    crate::support::docker::docker(&["kill", &first]);
    let healed = until(&app, &id, "the box restarted and HEALTHY", |d| {
        let b = node(d, "box");
        d["state"] == "COMPLETE"
            && b["restarts"] == 1
            && b["health"] == "HEALTHY"
            && b["outputs"]["id"].as_str().is_some_and(|c| c != first)
    })
    .await;
    let second = node(&healed, "box")["outputs"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let events = health_events(&app, &id).await;
    let died = events
        .iter()
        .find(|(key, state, _)| key.as_deref() == Some("box[0]") && state == "DOWN")
        .unwrap_or_else(|| panic!("no DOWN event for the box: {events:?}"));
    assert!(
        died.2.contains("137") && died.2.contains("SIGKILL"),
        "the reason names the status and the signal: {died:?}"
    );
    assert_eq!(running(&mine), std::slice::from_ref(&second));
    assert_eq!(
        containers(&theirs),
        std::slice::from_ref(&second),
        "the killed container is gone: only the new one is left"
    );
}
