//! A Corbel provider for a Docker engine: containers, networks and volumes
//! (`docker.v1.container`, `docker.v1.network`, `docker.v1.volume`), and
//! containers run to their end (`docker.v1.job`, see [`job`]).
//!
//! Exactly once, with no local state: everything the provider creates carries
//! the label `io.corbel.resource=<resource id>` (and its deployment, key and
//! `io.corbel.managed-by`), set in the very call that creates it. Deploy first
//! looks for a thing with that label and adopts it; it creates a container or
//! network under a deterministic name, so a second call that raced past the
//! lookup meets the engine's name conflict and adopts the first one's (if it
//! carries the label) instead of making another. Inspect and destroy find by
//! label too, so a restarted provider manages what its predecessor made. One
//! lock per resource id keeps two calls for a resource from interleaving.

pub mod config;
pub mod container;
pub mod engine;
pub mod exec;
pub mod files;
pub mod health;
pub mod image;
pub mod job;
pub mod objects;
pub mod watch;

use std::collections::HashMap;
use std::sync::{Arc, Mutex as SyncMutex, RwLock};

use bollard::Docker;
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::{
    Events, ExecInputs, ExecOutputs, FilesArchive, FilesSink, Provider, ProviderInfo, Status,
    StatusSink, StepError, StepResult, async_trait, proto,
};
use tokio::sync::Mutex;

use crate::config::{ContainerConfig, NetworkConfig, ProviderConfig, VolumeConfig};
use crate::engine::{Kind, Problem, call, status};
use crate::health::Observed;
use crate::watch::Watcher;

pub const CONTAINER: &str = "docker.v1.container";
pub const NETWORK: &str = "docker.v1.network";
pub const VOLUME: &str = "docker.v1.volume";
pub const IMAGE_LOOKUP: &str = "docker.v1.image_lookup";
/// `retrieve_data` "logs": lines by default, and at most.
pub const DEFAULT_TAIL: u64 = 200;
pub const MAX_TAIL: u64 = 10_000;

pub struct DockerProvider {
    config: RwLock<ProviderConfig>,
    /// The client, for the `docker_host` it was made for.
    client: Mutex<Option<(Option<String>, Docker)>>,
    /// One lock per resource id, so two calls for one resource never interleave.
    locks: SyncMutex<HashMap<String, Arc<Mutex<()>>>>,
    /// The health board and the task keeping it current ("watch").
    watcher: Arc<Watcher>,
}

impl Drop for DockerProvider {
    fn drop(&mut self) {
        self.watcher.stop();
    }
}

impl Default for DockerProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl DockerProvider {
    pub fn new() -> Self {
        DockerProvider {
            config: RwLock::new(ProviderConfig::default()),
            client: Mutex::new(None),
            locks: SyncMutex::new(HashMap::new()),
            watcher: Arc::default(),
        }
    }

    fn config(&self) -> ProviderConfig {
        self.config
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The client for the configured engine, made (and its API version
    /// agreed) at first use and again when `docker_host` changes.
    pub async fn client(&self) -> Result<Docker, Problem> {
        let host = self.config().docker_host;
        let mut cached = self.client.lock().await;
        if let Some((for_host, client)) = cached.as_ref()
            && *for_host == host
        {
            return Ok(client.clone());
        }
        let client = engine::connect(host.as_deref()).await?;
        *cached = Some((host, client.clone()));
        Ok(client)
    }

    fn lock_for(&self, resource_id: &str) -> Arc<Mutex<()>> {
        self.locks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(resource_id.to_string())
            .or_default()
            .clone()
    }

    /// Drops the lock entry of `resource_id` if no call holds or waits for it.
    fn release(&self, resource_id: &str, lock: Arc<Mutex<()>>) {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        // Ours and the map's: nobody else has a clone.
        if Arc::strong_count(&lock) == 2 {
            locks.remove(resource_id);
        }
    }

    async fn deploy(&self, resource: &proto::Resource, events: &Events) -> Result<Value, Problem> {
        // Bad config fails before the engine is touched.
        enum Parsed {
            Container(Box<ContainerConfig>),
            Network(NetworkConfig),
            Volume(VolumeConfig),
            Job(Box<job::JobConfig>),
        }
        let parsed = match resource.r#type.as_str() {
            CONTAINER => Parsed::Container(Box::new(
                ContainerConfig::parse(&resource.config_json).map_err(Problem::invalid)?,
            )),
            NETWORK => Parsed::Network(
                NetworkConfig::parse(&resource.config_json).map_err(Problem::invalid)?,
            ),
            VOLUME => Parsed::Volume(
                VolumeConfig::parse(&resource.config_json).map_err(Problem::invalid)?,
            ),
            job::JOB => Parsed::Job(Box::new(
                job::JobConfig::parse(&resource.config_json).map_err(Problem::invalid)?,
            )),
            other => return Err(unknown_type(other)),
        };
        require_id(resource)?;
        let client = self.client().await?;
        match parsed {
            Parsed::Job(config) => job::deploy(&client, resource, &config, events).await,
            Parsed::Container(config) => {
                container::deploy(&client, resource, &config, events).await
            }
            Parsed::Network(config) => {
                objects::deploy_network(&client, resource, &config, events).await
            }
            Parsed::Volume(config) => {
                objects::deploy_volume(&client, resource, &config, events).await
            }
        }
    }

    /// A container's limits and restart policy, changed in place; networks and
    /// volumes declare nothing updatable, so Corbel replaces them instead.
    /// The resource's health read onto the board, when the engine answers.
    async fn refresh(&self, resource: &proto::Resource) {
        if let Ok(client) = self.client().await {
            self.watcher.refresh(&client, resource).await;
        }
    }

    async fn update(
        &self,
        request: &proto::UpdateResourceRequest,
        events: &Events,
    ) -> Result<Value, Problem> {
        let resource = request.resource.clone().unwrap_or_default();
        let config = match resource.r#type.as_str() {
            CONTAINER => ContainerConfig::parse(&resource.config_json).map_err(Problem::invalid)?,
            NETWORK | VOLUME | job::JOB => {
                return Err(Problem::precondition(format!(
                    "a {} does not change in place: it must be replaced",
                    resource.r#type
                )));
            }
            other => return Err(unknown_type(other)),
        };
        require_id(&resource)?;
        let client = self.client().await?;
        container::update(
            &client,
            &resource,
            &request.previous_config_json,
            &config,
            events,
        )
        .await
    }

    async fn destroy(&self, resource: &proto::Resource, events: &Events) -> Result<Value, Problem> {
        require_id(resource)?;
        let client = self.client().await?;
        match resource.r#type.as_str() {
            CONTAINER | job::JOB => {
                container::destroy(&client, resource, self.config().stop_timeout_s, events).await
            }
            NETWORK => objects::destroy_network(&client, resource, events).await,
            VOLUME => objects::destroy_volume(&client, resource, events).await,
            other => Err(unknown_type(other)),
        }
    }

    /// The resource's outputs and health, when its thing is there.
    async fn find_outputs(
        &self,
        resource: &proto::Resource,
    ) -> Result<Option<(Value, Observed)>, Problem> {
        require_id(resource)?;
        let client = self.client().await?;
        let present = |outputs: Option<Value>| outputs.map(|o| (o, Observed::healthy()));
        match resource.r#type.as_str() {
            CONTAINER | job::JOB => Ok(container::find(&client, resource)
                .await?
                .map(|found| (container::outputs(&found), health::of_container(&found)))),
            NETWORK => Ok(present(
                objects::inspect_network(&client, &resource.resource_id).await?,
            )),
            VOLUME => Ok(present(
                objects::inspect_volume(&client, &resource.resource_id).await?,
            )),
            other => Err(unknown_type(other)),
        }
    }

    /// `retrieve_data` with a resource: "logs" or "inspect".
    async fn read_resource(
        &self,
        kind: &str,
        config: &serde_json::Map<String, Value>,
        resource: &proto::Resource,
    ) -> Result<Value, Problem> {
        require_id(resource)?;
        let client = self.client().await?;
        let gone = || {
            Problem::not_found(format!(
                "no {} of resource {}",
                resource.r#type, resource.resource_id
            ))
        };
        match (kind, resource.r#type.as_str()) {
            ("logs", CONTAINER | job::JOB) => {
                let tail = match config.get("tail").filter(|v| !v.is_null()) {
                    None => DEFAULT_TAIL,
                    Some(v) => v
                        .as_u64()
                        .filter(|n| (1..=MAX_TAIL).contains(n))
                        .ok_or_else(|| {
                            Problem::invalid(format!("tail: expected a number 1–{MAX_TAIL}"))
                        })?,
                };
                let found = container::find(&client, resource).await?.ok_or_else(gone)?;
                let logs =
                    container::logs(&client, found.id.as_deref().unwrap_or_default(), tail).await?;
                Ok(json!({ "logs": logs }))
            }
            ("logs", other) => Err(Problem::invalid(format!("a {other} has no logs"))),
            ("inspect", CONTAINER | job::JOB) => {
                let found = container::find(&client, resource).await?.ok_or_else(gone)?;
                Ok(container::inspect_json(&found))
            }
            ("inspect", NETWORK) => {
                let (id, _) = engine::networks_of(&client, &resource.resource_id)
                    .await?
                    .into_iter()
                    .next()
                    .ok_or_else(gone)?;
                let found =
                    call("inspecting the network", client.inspect_network(&id, None)).await?;
                Ok(serde_json::to_value(found).unwrap_or(Value::Null))
            }
            ("inspect", VOLUME) => {
                let (name, _) = engine::volumes_of(&client, &resource.resource_id)
                    .await?
                    .into_iter()
                    .next()
                    .ok_or_else(gone)?;
                let found = call("inspecting the volume", client.inspect_volume(&name)).await?;
                Ok(serde_json::to_value(found).unwrap_or(Value::Null))
            }
            ("inspect", other) => Err(unknown_type(other)),
            (other, _) => Err(Problem::invalid(format!(
                "this provider reads \"logs\" or \"inspect\" of a resource, not {other:?}"
            ))),
        }
    }

    async fn image_lookup(
        &self,
        config: &serde_json::Map<String, Value>,
    ) -> Result<Value, Problem> {
        let name = config
            .get("name")
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| Problem::invalid("name: expected an image reference"))?;
        let client = self.client().await?;
        match client.inspect_image(name).await {
            Ok(found) => Ok(json!({
                "id": found.id.unwrap_or_default(),
                "tags": found.repo_tags.unwrap_or_default(),
                "size": found.size.unwrap_or_default(),
            })),
            Err(e) if status(&e) == Some(404) => {
                Err(Problem::not_found(format!("no image {name} on the engine")))
            }
            Err(e) => Err(Problem::engine("inspecting the image", &e)),
        }
    }
}

fn unknown_type(kind: &str) -> Problem {
    Problem::invalid(format!(
        "unknown resource type {kind:?}: this provider handles {CONTAINER}, {NETWORK}, {VOLUME} and {}",
        job::JOB
    ))
}

fn require_id(resource: &proto::Resource) -> Result<(), Problem> {
    if resource.resource_id.trim().is_empty() {
        return Err(Problem::invalid("resource_id: missing"));
    }
    Ok(())
}

#[async_trait]
impl Provider for DockerProvider {
    fn info(&self) -> ProviderInfo {
        ProviderInfo::new("docker", env!("CARGO_PKG_VERSION"))
            .features([
                "deploy", "destroy", "inspect", "nodes", "data", "power", "watch", "exec", "files",
            ])
            .resource_types([CONTAINER, NETWORK, VOLUME, job::JOB])
    }

    async fn configure(&self, config: Value) -> Result<(), Status> {
        let parsed = ProviderConfig::parse(&config).map_err(Status::invalid_argument)?;
        // Watching starts with the first configuration, and follows a new engine.
        self.watcher.follow(parsed.docker_host.clone());
        *self
            .config
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = parsed;
        Ok(())
    }

    async fn describe_resources(
        &self,
        request: proto::DescribeResourcesRequest,
    ) -> Result<proto::DescribeResourcesResponse, Status> {
        // A container on a network named like a blueprint network depends on it.
        let mut networks: HashMap<String, String> = HashMap::new();
        for resource in &request.resources {
            if resource.r#type == NETWORK
                && let Ok(config) = NetworkConfig::parse(&resource.config_json)
                && let Some(name) = config.name
            {
                networks.insert(name, resource.key.clone());
            }
        }
        let descriptions = request
            .resources
            .iter()
            .filter(|r| r.r#type == CONTAINER)
            .map(|r| {
                let network = config::object(&r.config_json)
                    .ok()
                    .and_then(|c| Some(c.get("network")?.as_str()?.to_owned()))
                    .and_then(|name| networks.get(&name))
                    .filter(|key| *key != &r.key);
                proto::ResourceDescription {
                    key: r.key.clone(),
                    depends_on: network.into_iter().cloned().collect(),
                    quota: quota_of(&r.config_json),
                    updatable_keys: container::UPDATABLE_KEYS.map(str::to_owned).to_vec(),
                    replace_destroys_first: container::holds_fixed_names(&r.config_json),
                    ..Default::default()
                }
            })
            .collect();
        Ok(proto::DescribeResourcesResponse { descriptions })
    }

    async fn deploy_resource(
        &self,
        request: proto::DeployResourceRequest,
        events: Events,
    ) -> StepResult {
        let resource = request.resource.unwrap_or_default();
        let lock = self.lock_for(&resource.resource_id);
        let result = {
            let _held = lock.lock().await;
            self.watcher.deploying(&resource.resource_id);
            let result = self.deploy(&resource, &events).await;
            if result.is_ok() {
                self.refresh(&resource).await;
            }
            result
        };
        self.release(&resource.resource_id, lock);
        Ok(result?)
    }

    async fn update_resource(
        &self,
        request: proto::UpdateResourceRequest,
        events: Events,
    ) -> StepResult {
        let resource_id = request
            .resource
            .as_ref()
            .map(|r| r.resource_id.clone())
            .unwrap_or_default();
        let lock = self.lock_for(&resource_id);
        let result = {
            let _held = lock.lock().await;
            self.update(&request, &events).await
        };
        self.release(&resource_id, lock);
        match result {
            // The protocol's answer for a resource that is gone.
            Err(problem) if problem.kind == Kind::NotFound => Err(StepError::Rpc(problem.into())),
            other => Ok(other?),
        }
    }

    async fn destroy_resource(
        &self,
        request: proto::DestroyResourceRequest,
        events: Events,
    ) -> StepResult {
        let resource = request.resource.unwrap_or_default();
        let lock = self.lock_for(&resource.resource_id);
        let result = {
            let _held = lock.lock().await;
            // Destroyed on purpose: forgotten, no DOWN for it.
            self.watcher.destroying(&resource.resource_id);
            let result = self.destroy(&resource, &events).await;
            self.watcher
                .destroyed(&resource.resource_id, result.is_ok());
            if result.is_err() {
                self.refresh(&resource).await;
            }
            result
        };
        self.release(&resource.resource_id, lock);
        Ok(result?)
    }

    async fn inspect(
        &self,
        request: proto::InspectRequest,
    ) -> Result<proto::InspectResponse, Status> {
        let resource = request.resource.unwrap_or_default();
        Ok(match self.find_outputs(&resource).await? {
            Some((outputs, observed)) => proto::InspectResponse {
                present: true,
                outputs_json: outputs.to_string(),
                health: observed.health as i32,
                reason: observed.reason,
                observed_config_json: String::new(),
            },
            None => proto::InspectResponse {
                health: proto::Health::Down as i32,
                reason: "not found on the engine".to_owned(),
                ..Default::default()
            },
        })
    }

    async fn list_nodes(&self) -> Result<Vec<proto::Node>, Status> {
        let client = self.client().await?;
        let info = call("reading the engine's info", client.info()).await?;
        let capacity = self.config().capacity;
        let mut labels = HashMap::new();
        if let Some(n) = info.ncpu {
            labels.insert("cpus".to_string(), n.to_string());
        }
        if let Some(n) = info.mem_total {
            labels.insert("memory_bytes".to_string(), n.to_string());
        }
        for (key, value) in [
            ("engine_version", info.server_version),
            ("os", info.os_type),
            ("arch", info.architecture),
        ] {
            if let Some(value) = value {
                labels.insert(key.to_string(), value);
            }
        }
        Ok(vec![proto::Node {
            name: info.name.unwrap_or_else(|| "docker".to_string()),
            capacity: HashMap::from([("*".to_string(), capacity)]),
            labels,
        }])
    }

    async fn retrieve_data(
        &self,
        request: proto::RetrieveDataRequest,
    ) -> Result<proto::RetrieveDataResponse, Status> {
        let config = config::object(&request.config_json).map_err(Status::invalid_argument)?;
        let data = match request.resource.filter(|r| !r.resource_id.is_empty()) {
            Some(resource) => {
                self.read_resource(&request.r#type, &config, &resource)
                    .await?
            }
            None if request.r#type == IMAGE_LOOKUP => self.image_lookup(&config).await?,
            None => {
                return Err(Status::invalid_argument(format!(
                    "unknown data type {:?}: this provider serves {IMAGE_LOOKUP}, and \"logs\" or \
                     \"inspect\" of a resource",
                    request.r#type
                )));
            }
        };
        Ok(proto::RetrieveDataResponse {
            data_json: data.to_string(),
        })
    }

    async fn watch_resources(
        &self,
        request: proto::WatchResourcesRequest,
        sink: StatusSink,
    ) -> Result<(), Status> {
        self.watcher.follow(self.config().docker_host);
        self.watcher.serve(request, sink).await
    }

    /// A command in the resource's running container (see [`exec`]).
    async fn exec(
        &self,
        start: proto::ExecStart,
        inputs: ExecInputs,
        outputs: ExecOutputs,
    ) -> Result<proto::ExecExit, Status> {
        let resource = start.resource.clone().unwrap_or_default();
        if resource.r#type != CONTAINER {
            return Err(Status::failed_precondition(format!(
                "a {} runs no commands: only a {CONTAINER} does",
                resource.r#type
            )));
        }
        require_id(&resource)?;
        let client = self.client().await?;
        exec::exec(&client, start, inputs, outputs).await
    }

    /// An archive extracted into the resource's container (see [`files`]).
    async fn put_files(
        &self,
        target: proto::FilesTarget,
        archive: FilesArchive,
    ) -> Result<proto::PutFilesResponse, Status> {
        let client = self.client().await?;
        files::put(&client, target, archive).await
    }

    /// A file or directory of the resource's container as an archive.
    async fn get_files(
        &self,
        request: proto::GetFilesRequest,
        sink: FilesSink,
    ) -> Result<(), Status> {
        let client = self.client().await?;
        files::get(&client, request, sink).await
    }

    async fn power(&self, request: proto::PowerRequest) -> Result<proto::PowerResponse, Status> {
        let resource = request.resource.unwrap_or_default();
        let action = proto::PowerAction::try_from(request.action).map_err(|_| {
            Status::invalid_argument(format!("unknown power action {}", request.action))
        })?;
        match resource.r#type.as_str() {
            CONTAINER => {}
            NETWORK | VOLUME | job::JOB => {
                return Err(Status::failed_precondition(format!(
                    "a {} has no power",
                    resource.r#type
                )));
            }
            other => return Err(unknown_type(other).into()),
        }
        require_id(&resource)?;
        let lock = self.lock_for(&resource.resource_id);
        let result = {
            let _held = lock.lock().await;
            let client = self.client().await?;
            container::power(&client, &resource, action, self.config().stop_timeout_s).await
        };
        self.release(&resource.resource_id, lock);
        result?;
        Ok(proto::PowerResponse {})
    }
}

/// What a container counts against its project's quotas: one of
/// `containers`, and its limits when it has them (`cpu_millis`, thousandths
/// of a CPU; `memory_mib`). A config that does not parse yet (templates
/// still in it) counts the container alone.
fn quota_of(config_json: &str) -> HashMap<String, i64> {
    let mut quota = HashMap::from([("containers".to_owned(), 1)]);
    if let Ok(config) = ContainerConfig::parse(config_json) {
        if let Some(nano) = config.nano_cpus {
            quota.insert("cpu_millis".to_owned(), (nano + 999_999) / 1_000_000);
        }
        if let Some(bytes) = config.memory {
            quota.insert("memory_mib".to_owned(), (bytes + (1 << 20) - 1) >> 20);
        }
    }
    quota
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_with_a_name_or_a_fixed_host_port_is_replaced_destroy_first() {
        for (config, first) in [
            (r#"{"image": "x"}"#, false),
            (r#"{"image": "x", "name": "web"}"#, true),
            (r#"{"image": "x", "name": "{{ var.n }}"}"#, true),
            (r#"{"image": "x", "ports": [{"container": 80}]}"#, false),
            (
                r#"{"image": "x", "ports": [{"container": 80, "host": 0}]}"#,
                false,
            ),
            (
                r#"{"image": "x", "ports": [{"container": 80, "host": 8080}]}"#,
                true,
            ),
            (
                r#"{"image": "x", "ports": [{"container": 80, "host": "{{ var.p }}"}]}"#,
                true,
            ),
        ] {
            assert_eq!(container::holds_fixed_names(config), first, "{config}");
        }
    }

    #[test]
    fn a_container_counts_itself_and_its_limits() {
        let limited = quota_of(r#"{"image": "x", "limits": {"memory": "64m", "cpus": 0.5}}"#);
        assert_eq!(limited["containers"], 1);
        assert_eq!(limited["cpu_millis"], 500);
        assert_eq!(limited["memory_mib"], 64);
        let templated = quota_of(r#"{"image": "x", "limits": {"memory": "{{ var.m }}"}}"#);
        assert_eq!(templated, HashMap::from([("containers".to_owned(), 1)]));
    }
}
