//! The reference Corbel provider: each `process.v1.service` resource is a
//! local process in its own process group, outliving the provider itself.
//!
//! Exactly once: deploy records its intent durably before it spawns, tags the
//! process with its resource id (`CORBEL_RESOURCE_ID`), then records the pid
//! (see [`lifecycle`]). Inspect and destroy find a service by its record (pid
//! plus start time) or, when a provider died before recording the pid, by its
//! tag; a deploy adopts such a process instead of starting a second one. So a
//! restarted provider manages what its predecessor started, or began to. The
//! binary holds a lock on its state directory ([`ProcessProvider::lock_state_dir`])
//! so that it and its predecessor never run at once.
//!
//! Credentials: a service starts from a clean environment
//! ([`lifecycle::service_env`]: a few base variables, the provider's
//! `pass_env` list, its own `env`, `PORT`, its tag), in a session of its own,
//! so it neither inherits the provider's registration variables (which the
//! SDK's `run` has removed from the provider's environment anyway) nor can
//! join the provider's process group, by which Corbel recognises the provider.

pub mod config;
pub mod lifecycle;
pub mod procfs;
pub mod state;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex as SyncMutex, RwLock};
use std::time::Duration;

use corbel_provider_sdk::records::{DEFAULT_STATE_DIR, StateLock};
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::{
    Events, Failure, Provider, ProviderInfo, Status, StepResult, async_trait, proto,
};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::sync::Mutex;

use crate::config::{ProviderConfig, ServiceConfig};
use crate::lifecycle::shell_words;
use crate::procfs::Liveness;
use crate::state::{Phase, Record, StateDir};

pub const RESOURCE_TYPE: &str = "process.v1.service";
/// The quantity each service counts against a project's quotas
/// (`DescribeResources`).
pub const PROCESSES_QUOTA: &str = "processes";
/// Overrides the `state_dir` configuration key.
pub use corbel_provider_sdk::ENV_STATE_DIR;
/// A service still running this long after spawn counts as started.
const STARTUP_CHECK: Duration = Duration::from_millis(200);

pub struct ProcessProvider {
    /// `CORBEL_STATE_DIR`, read once at start; wins over the configuration.
    env_state_dir: Option<PathBuf>,
    config: RwLock<ProviderConfig>,
    /// One lock per resource id, so two calls for one service never interleave.
    locks: SyncMutex<HashMap<String, Arc<Mutex<()>>>>,
}

impl ProcessProvider {
    /// A provider whose state directory is `env_state_dir` if given, else the
    /// configured `state_dir`, else `./state` (the SDK's default).
    pub fn new(env_state_dir: Option<PathBuf>) -> Self {
        ProcessProvider {
            env_state_dir,
            config: RwLock::new(ProviderConfig::default()),
            locks: SyncMutex::new(HashMap::new()),
        }
    }

    fn config(&self) -> ProviderConfig {
        self.config
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Waits until no other process holds `CORBEL_STATE_DIR`, then holds it
    /// for as long as the lock lives, so two instances (an old one finishing
    /// its calls after Corbel went away, and its successor) never act on one
    /// resource at once. `None` when the state directory is not from the
    /// environment (a configured one may change while running).
    pub async fn lock_state_dir(&self) -> std::io::Result<Option<StateLock>> {
        let Some(dir) = self.env_state_dir.clone() else {
            return Ok(None);
        };
        lifecycle::blocking(move || {
            if let Some(lock) = StateLock::try_acquire(&dir)? {
                return Ok(Some(lock));
            }
            // Before `serve`, so no logging yet: Corbel keeps stderr.
            eprintln!(
                "process: another instance holds {}; waiting for it to exit",
                StateLock::path(&dir).display()
            );
            StateLock::acquire(&dir).map(Some)
        })
        .await
    }

    /// Where records and logs are kept now.
    pub fn state(&self) -> StateDir {
        let dir = self
            .env_state_dir
            .clone()
            .or_else(|| self.config().state_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        StateDir::new(dir)
    }

    fn lock_for(&self, resource_id: &str) -> Arc<Mutex<()>> {
        self.locks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(resource_id.to_string())
            .or_default()
            .clone()
    }
}

#[async_trait]
impl Provider for ProcessProvider {
    fn info(&self) -> ProviderInfo {
        ProviderInfo::new("process", env!("CARGO_PKG_VERSION"))
            .features(["deploy", "destroy", "inspect", "nodes"])
            .resource_types([RESOURCE_TYPE])
    }

    async fn configure(&self, config: Value) -> Result<(), Status> {
        let parsed = ProviderConfig::parse(&config).map_err(Status::invalid_argument)?;
        *self
            .config
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = parsed;
        Ok(())
    }

    /// Idempotent per resource id: a running service is returned, a process a
    /// lost deploy started is adopted, and only otherwise is one started.
    async fn deploy_resource(
        &self,
        request: proto::DeployResourceRequest,
        events: Events,
    ) -> StepResult {
        let resource = request.resource.unwrap_or_default();
        let service = ServiceConfig::parse(&resource.config_json).map_err(Failure::new)?;
        let id = resource.resource_id;
        let lock = self.lock_for(&id);
        let _held = lock.lock().await;
        let state = self.state();
        if let Some(record) = read_record(&state, &id)? {
            match &record.phase {
                Phase::Running(running)
                    if procfs::liveness(running.pid, running.start_time) == Liveness::Running =>
                {
                    events
                        .progress(100, format!("already running as pid {}", running.pid))
                        .await;
                    return Ok(running.outputs.clone());
                }
                Phase::Running(running) => {
                    events
                        .log(format!("pid {} has exited; starting it again", running.pid))
                        .await;
                }
                Phase::Intent => {
                    if let Some(found) = lifecycle::find_service(&id).await {
                        events
                            .progress(
                                50,
                                format!("adopting pid {}, started before a restart", found.pid),
                            )
                            .await;
                        let record = lifecycle::record_running(
                            &state,
                            record,
                            found.pid,
                            found.stat.start_time,
                        )
                        .await?;
                        return Ok(outputs_of(&record));
                    }
                    events
                        .log("an interrupted start left no process; starting it")
                        .await;
                }
            }
            // Whatever the last run left tagged (children of an exited
            // service) goes before a new one starts.
            lifecycle::stop(&record, self.config().grace, &events).await?;
        }
        let pass_env = self.config().pass_env;
        Ok(start(&state, &id, &service, &pass_env, &events).await?)
    }

    /// Stops the recorded service and anything tagged with its resource id;
    /// with no record nothing was started (an intent always comes first).
    async fn destroy_resource(
        &self,
        request: proto::DestroyResourceRequest,
        events: Events,
    ) -> StepResult {
        let id = request.resource.unwrap_or_default().resource_id;
        let lock = self.lock_for(&id);
        let _held = lock.lock().await;
        let state = self.state();
        let Some(record) = read_record(&state, &id)? else {
            events
                .log(format!("nothing recorded for {id}; nothing to destroy"))
                .await;
            return Ok(json!({}));
        };
        lifecycle::stop(&record, self.config().grace, &events).await?;
        let removed = state.clone();
        lifecycle::blocking(move || removed.remove(&id))
            .await
            .map_err(|e| Failure::retryable(e.to_string()))?;
        events.progress(100, "destroyed").await;
        Ok(json!({}))
    }

    /// Present if the recorded service runs, or if an intent's tagged process
    /// does (a deploy that was lost after spawning). Changes nothing.
    async fn inspect(
        &self,
        request: proto::InspectRequest,
    ) -> Result<proto::InspectResponse, Status> {
        let id = request.resource.unwrap_or_default().resource_id;
        // Waits for a deploy or destroy of this resource in progress, so the
        // answer is not taken between an intent and its spawn.
        let lock = self.lock_for(&id);
        let _held = lock.lock().await;
        let record = self
            .state()
            .read(&id)
            .map_err(|e| Status::internal(e.to_string()))?;
        let outputs = match record {
            None => None,
            Some(record) => match record.phase {
                Phase::Running(running)
                    if procfs::liveness(running.pid, running.start_time) == Liveness::Running =>
                {
                    Some(running.outputs)
                }
                Phase::Running(_) => None,
                Phase::Intent => lifecycle::find_service(&id)
                    .await
                    .map(|found| lifecycle::outputs(found.pid, record.port)),
            },
        };
        Ok(match outputs {
            Some(outputs) => proto::InspectResponse {
                present: true,
                outputs_json: outputs.to_string(),
            },
            None => proto::InspectResponse::default(),
        })
    }

    /// Each service counts one `processes` against its project's quotas.
    async fn describe_resources(
        &self,
        request: proto::DescribeResourcesRequest,
    ) -> Result<proto::DescribeResourcesResponse, Status> {
        let descriptions = request
            .resources
            .iter()
            .filter(|r| r.r#type == RESOURCE_TYPE)
            .map(|r| proto::ResourceDescription {
                key: r.key.clone(),
                quota: [(PROCESSES_QUOTA.to_string(), 1)].into(),
                ..Default::default()
            })
            .collect();
        Ok(proto::DescribeResourcesResponse { descriptions })
    }

    async fn list_nodes(&self) -> Result<Vec<proto::Node>, Status> {
        Ok(vec![proto::Node {
            name: procfs::hostname(),
            capacity: [(RESOURCE_TYPE.to_string(), self.config().capacity)].into(),
            labels: [("os".to_string(), "linux".to_string())].into(),
        }])
    }
}

fn read_record(state: &StateDir, resource_id: &str) -> Result<Option<Record>, Failure> {
    state
        .read(resource_id)
        .map_err(|e| Failure::retryable(e.to_string()))
}

fn outputs_of(record: &Record) -> Value {
    match &record.phase {
        Phase::Running(running) => running.outputs.clone(),
        Phase::Intent => json!({}),
    }
}

/// Starts a service: intent, spawn, running record, then a check that it
/// survives its first moments (if not, it fails with its output and leaves
/// neither a process nor a record).
async fn start(
    state: &StateDir,
    resource_id: &str,
    service: &ServiceConfig,
    pass_env: &[String],
    events: &Events,
) -> Result<Value, Failure> {
    let shown = shell_words(&service.command, &service.args);
    events.progress(10, format!("starting `{shown}`")).await;
    let intent = lifecycle::record_intent(state, resource_id, service).await?;
    let spawned = match lifecycle::spawn_tagged(&intent, service, pass_env) {
        Ok(spawned) => spawned,
        Err(failure) => {
            forget(state, resource_id).await;
            return Err(failure);
        }
    };
    let (pid, log_offset) = (spawned.pid, spawned.log_offset);
    let record =
        match lifecycle::record_running(state, intent, spawned.pid, spawned.start_time).await {
            Ok(record) => record,
            Err(failure) => {
                // Not reaped yet, so the group is still ours to kill. The
                // intent stays: a later deploy or destroy settles it.
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                return Err(failure);
            }
        };
    if let Some(status) = lifecycle::exited_within(spawned, STARTUP_CHECK).await {
        let tail = lifecycle::log_tail(&record.log, log_offset).await;
        // Anything it started before exiting goes with it.
        lifecycle::kill_tagged(resource_id).await;
        forget(state, resource_id).await;
        return Err(Failure::new(format!(
            "`{shown}` exited at once ({status}); its last output:\n{tail}"
        )));
    }
    events.progress(80, format!("started pid {pid}")).await;
    Ok(outputs_of(&record))
}

/// Removes a record after a start that created nothing lasting. If that
/// fails the record stays, which is safe: it names nothing that runs.
async fn forget(state: &StateDir, resource_id: &str) {
    let (state, id) = (state.clone(), resource_id.to_string());
    if let Err(error) = lifecycle::blocking(move || state.remove(&id)).await {
        tracing::warn!(resource.id = resource_id, %error, "cannot remove the record of a failed start");
    }
}
