//! Blueprints and deployments through the API: a server with the process
//! provider loaded, creating and deploying blueprints, reading deployments,
//! waiting for them to settle and destroying them.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::processes::all_gone;
use super::provider_repos::{ProviderRepo, docker_resources_metadata, process_metadata};
use super::providers::{create_provider, wait_status};
use super::settings::{fast_reaper, quick};
use super::types::Deployment;
use super::{TestApp, TestStore, data, eventually};

pub const DEPLOYMENT_FIELDS: &str = "id name state phase error variables expiresAt nodes { id key replica node state outputs error providerId provider { name } }";

/// `db`, and `web` (2 replicas by default) reading db's pid and a greeting.
pub const WEB: &str = r#"
version: "1"
variables:
  replicas: { type: int, default: 2 }
  greeting: { type: string, default: "a <b> & 'c'" }
resources:
  db:
    type: process.v1.service
    config: { command: sleep, args: ["300"] }
  web:
    type: process.v1.service
    depends_on: [db]
    replicas: "{{ replicas }}"
    strategy: AUTO
    config:
      command: sleep
      args: ["300"]
      env: { DB_PID: "{{ resources.db.outputs.pid }}", GREETING: "{{ greeting }}" }
"#;

/// A server with the process provider loaded and connected; returns its id.
pub async fn with_process_provider(
    adjust: impl FnOnce(&mut corbel::config::Config),
) -> (TestApp, String, ProviderRepo) {
    with_process_provider_config(adjust, json!({ "capacity": 50, "grace_ms": 2000 })).await
}

/// [`with_process_provider`] with the provider's `config` given.
pub async fn with_process_provider_config(
    adjust: impl FnOnce(&mut corbel::config::Config),
    provider_config: Value,
) -> (TestApp, String, ProviderRepo) {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |config| {
        quick(config);
        fast_reaper(config);
        adjust(config);
    })
    .await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, _) = create_provider(
        &app,
        json!({ "name": "process", "gitUrl": repo.url(), "config": provider_config }),
    )
    .await;
    wait_status(&app, &id, "CONNECTED").await;
    (app, id, repo)
}

/// The docker provider's configuration in tests: busybox's `sleep` and
/// `httpd` as pid 1 ignore SIGTERM, so a stop waits only a second for them.
pub fn docker_provider_config() -> Value {
    json!({ "capacity": 50, "stop_timeout_s": 1 })
}

/// A server on `store` with the docker provider (`providers/docker`) loaded
/// from git and connected; returns its id.
pub async fn with_docker_provider(store: Arc<TestStore>) -> (TestApp, String, ProviderRepo) {
    let app = TestApp::spawn_with(store, |config| {
        quick(config);
        fast_reaper(config);
    })
    .await;
    let repo = ProviderRepo::new(&docker_resources_metadata(), &[]);
    let (id, _) = create_provider(
        &app,
        json!({ "name": "docker", "gitUrl": repo.url(), "config": docker_provider_config() }),
    )
    .await;
    wait_status(&app, &id, "CONNECTED").await;
    (app, id, repo)
}

pub async fn create_blueprint(app: &TestApp, name: &str, source: &str) -> String {
    let body = app
        .gql(
            "mutation($input: CreateBlueprintInput!) { createBlueprint(input: $input) { id } }",
            json!({ "input": { "name": name, "source": source } }),
        )
        .await;
    data(&body)["createBlueprint"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

pub async fn deploy(app: &TestApp, blueprint: &str, name: &str, extra: Value) -> String {
    let mut input = json!({ "blueprintId": blueprint, "name": name });
    input
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap_or_default());
    let body = app
        .gql(
            "mutation($input: DeployBlueprintInput!) { deployBlueprint(input: $input) { id state } }",
            json!({ "input": input }),
        )
        .await;
    data(&body)["deployBlueprint"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

pub async fn deployment(app: &TestApp, id: &str) -> Deployment {
    app.query_as(
        &format!("query($id: ID!) {{ deployment(id: $id) {{ {DEPLOYMENT_FIELDS} }} }}"),
        json!({ "id": id }),
        "deployment",
    )
    .await
}

/// Asks for a deployment's destroy (`destroyDeployment`), without waiting.
pub async fn destroy(app: &TestApp, id: &str) {
    let body = app
        .gql(
            "mutation($id: ID!) { destroyDeployment(id: $id) { id } }",
            json!({ "id": id }),
        )
        .await;
    data(&body);
}

/// Destroys a deployment, waits until it is `DESTROYED` and its processes
/// are gone.
pub async fn destroy_and_wait(app: &TestApp, id: &str, pids: &[i32]) {
    destroy(app, id).await;
    settled(app, id, &["DESTROYED"]).await;
    all_gone(pids).await;
}

/// The ids of the deployment's stored events, oldest first.
pub async fn stored_event_ids(app: &TestApp, id: &str) -> Vec<i64> {
    let body = app
        .gql(
            "query($id: ID!) { deployment(id: $id) { events(first: 10000) { id } } }",
            json!({ "id": id }),
        )
        .await;
    data(&body)["deployment"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().parse().unwrap())
        .collect()
}

/// Waits until the deployment reaches one of `states`.
pub async fn settled(app: &TestApp, id: &str, states: &[&str]) -> Deployment {
    eventually(
        Duration::from_secs(60),
        &format!("deployment {states:?}"),
        || async {
            let d = deployment(app, id).await;
            states.iter().any(|s| d.state == *s).then_some(d)
        },
    )
    .await
}

/// The pids of the deployment's nodes that have one.
pub fn pids(deployment: &Deployment) -> Vec<i32> {
    deployment
        .nodes
        .iter()
        .filter_map(|n| n.pid())
        .map(|p| p as i32)
        .collect()
}
