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
//!
//! Jobs: a `process.v1.job` runs to its end within its deploy (see [`job`]).
//!
//! Health (the "watch" feature, protocol version 3): [`watch`] keeps each
//! service's health on a `HealthBoard` as it changes, filled from the records
//! at start-up, and serves `WatchResources` from it. Output (the "data"
//! feature): each service writes its stdout and stderr to a log file in the
//! state directory, which [`logs`] keeps bounded; [`data`] answers
//! `RetrieveData` "logs" and "inspect".

pub mod config;
pub mod data;
pub mod exec;
pub mod files;
pub mod job;
pub mod lifecycle;
pub mod logs;
pub mod procfs;
pub mod sandbox;
pub mod state;
pub mod watch;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex as SyncMutex, RwLock};
use std::time::Duration;

use corbel_provider_sdk::proto::Health;
use corbel_provider_sdk::records::{DEFAULT_STATE_DIR, StateLock};
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::{
    Events, ExecInputs, ExecOutputs, Failure, FilesArchive, FilesSink, Provider, ProviderInfo,
    Registration, Status, StatusSink, StepResult, async_trait, proto,
};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::sync::Mutex;

use crate::config::{ProviderConfig, ServiceConfig};
use crate::lifecycle::shell_words;
use crate::logs::{LogLimits, Logs};
use crate::procfs::Liveness;
use crate::state::{Phase, Record, StateDir};
use crate::watch::Watcher;

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
    /// Each service's health, and the tasks watching them.
    watch: Arc<Watcher>,
    /// The rotation of the services' logs.
    logs: Arc<Logs>,
    /// The state directory whose records the board was filled from.
    watching: Mutex<Option<PathBuf>>,
}

impl ProcessProvider {
    /// A provider whose state directory is `env_state_dir` if given, else the
    /// configured `state_dir`, else `./state` (the SDK's default).
    pub fn new(env_state_dir: Option<PathBuf>) -> Self {
        let config = ProviderConfig::default();
        ProcessProvider {
            env_state_dir,
            logs: Arc::new(Logs::new(log_limits(&config))),
            config: RwLock::new(config),
            locks: SyncMutex::new(HashMap::new()),
            watch: Watcher::new(),
            watching: Mutex::new(None),
        }
    }

    /// Once per state directory (at registration, and again at the next watch
    /// after a `Configure` changed it): the board filled from its records (a running service
    /// HEALTHY and watched, a dead one DOWN with the reason) and its logs
    /// rotated. What another state directory held is no longer reported.
    pub async fn start_watching(&self) {
        let state = self.state();
        let mut watching = self.watching.lock().await;
        if watching.as_deref() == Some(state.root()) {
            return;
        }
        if watching.is_some() {
            for status in self.watch.board().all() {
                self.watch.forget(&status.resource_id);
            }
        }
        match state.logs_dir() {
            Ok(dir) => self.logs.watch_dir(dir),
            Err(error) => tracing::error!(%error, "services' logs are not rotated"),
        }
        let listed = state.clone();
        let ids = match lifecycle::blocking(move || listed.ids()).await {
            Ok(ids) => ids,
            Err(error) => {
                // Tried again at the next watch.
                tracing::error!(%error, "cannot list the records: health not reported");
                return;
            }
        };
        for id in ids {
            let lock = self.lock_for(&id);
            let _held = lock.lock().await;
            match state.read(&id) {
                Ok(Some(record)) => self.watch.observe(&record).await,
                Ok(None) => {}
                Err(error) => self
                    .watch
                    .down(&id, format!("its record cannot be read: {error}")),
            }
        }
        *watching = Some(state.root().to_path_buf());
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

    /// A `process.v1.job`'s deploy (see [`job`]), under the resource's lock.
    async fn deploy_job(&self, resource: proto::Resource, events: Events) -> StepResult {
        let config = config::JobConfig::parse(&resource.config_json).map_err(Failure::new)?;
        let id = resource.resource_id;
        let lock = self.lock_for(&id);
        let _held = lock.lock().await;
        let state = self.state();
        let existing = read_record(&state, &id)?;
        let pass_env = self.config().pass_env;
        let ctx = job::Ctx {
            state: &state,
            watch: &self.watch,
            pass_env: &pass_env,
        };
        Ok(job::deploy(&ctx, &id, &config, existing, &events).await?)
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
            .features([
                "deploy", "destroy", "inspect", "nodes", "watch", "data", "exec", "files",
            ])
            .resource_types([RESOURCE_TYPE, job::JOB_TYPE])
    }

    async fn configure(&self, config: Value) -> Result<(), Status> {
        let parsed = ProviderConfig::parse(&config).map_err(Status::invalid_argument)?;
        self.logs.set_limits(log_limits(&parsed));
        *self
            .config
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = parsed;
        Ok(())
    }

    /// A command in a running service's context (see [`exec`]).
    async fn exec(
        &self,
        start: proto::ExecStart,
        inputs: ExecInputs,
        outputs: ExecOutputs,
    ) -> Result<proto::ExecExit, Status> {
        let pass_env = self.config().pass_env;
        exec::exec(&self.state(), &pass_env, start, inputs, outputs).await
    }

    /// An archive extracted into a running service (see [`files`]).
    async fn put_files(
        &self,
        target: proto::FilesTarget,
        archive: FilesArchive,
    ) -> Result<proto::PutFilesResponse, Status> {
        files::put(&self.state(), target, archive).await
    }

    /// A running service's file or directory as an archive (see [`files`]).
    async fn get_files(
        &self,
        request: proto::GetFilesRequest,
        sink: FilesSink,
    ) -> Result<(), Status> {
        files::get(&self.state(), request, sink).await
    }

    /// Watching starts as the provider registers: its configuration (and so
    /// its state directory) is known then.
    async fn registered(&self, _registration: &Registration) {
        self.start_watching().await;
    }

    /// Idempotent per resource id: a running service is returned, a process a
    /// lost deploy started is adopted, and only otherwise is one started.
    async fn deploy_resource(
        &self,
        request: proto::DeployResourceRequest,
        events: Events,
    ) -> StepResult {
        let resource = request.resource.unwrap_or_default();
        if resource.r#type == job::JOB_TYPE {
            return self.deploy_job(resource, events).await;
        }
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
                    self.watch.adopt(&id, running.pid, running.start_time);
                    return Ok(running.outputs.clone());
                }
                Phase::Running(running) => {
                    events
                        .log(format!("pid {} has exited; starting it again", running.pid))
                        .await;
                }
                Phase::Finished(_) => {
                    events.log("a job's record; starting the service").await;
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
                        self.watch.adopt(&id, found.pid, found.stat.start_time);
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
        Ok(start(&state, &id, &service, &pass_env, &events, &self.watch).await?)
    }

    /// Stops the recorded service and anything tagged with its resource id,
    /// then removes its record and its logs; with no record nothing was
    /// started (an intent always comes first). Its health is forgotten
    /// before it is stopped: a destroy reports no DOWN.
    async fn destroy_resource(
        &self,
        request: proto::DestroyResourceRequest,
        events: Events,
    ) -> StepResult {
        let id = request.resource.unwrap_or_default().resource_id;
        let lock = self.lock_for(&id);
        let _held = lock.lock().await;
        let state = self.state();
        let record = read_record(&state, &id)?;
        self.watch.forget(&id);
        let Some(record) = record else {
            events
                .log(format!("nothing recorded for {id}; nothing to destroy"))
                .await;
            return Ok(json!({}));
        };
        let removed = match lifecycle::stop(&record, self.config().grace, &events).await {
            Ok(()) => {
                let state = state.clone();
                lifecycle::blocking(move || state.remove(&id))
                    .await
                    .map_err(|e| Failure::retryable(e.to_string()))
            }
            Err(failure) => Err(failure),
        };
        if let Err(failure) = removed {
            // Still held: watched again, as it now is.
            self.watch.observe(&record).await;
            return Err(failure.into());
        }
        let (logs, log) = (self.logs.clone(), record.log.clone());
        if let Err(error) = lifecycle::blocking(move || logs.remove(&log)).await {
            events.log(format!("cannot remove its log: {error}")).await;
        }
        if let Some(run) = &record.job
            && let Err(error) = std::fs::remove_file(&run.status_file)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            events
                .log(format!("cannot remove its status file: {error}"))
                .await;
        }
        events.progress(100, "destroyed").await;
        Ok(json!({}))
    }

    /// Present if the recorded service runs, or if an intent's tagged process
    /// does (a deploy that was lost after spawning). Changes nothing. Under
    /// version 3 also its health: HEALTHY when present, else DOWN with the
    /// reason (the exit the watch saw, when it saw one).
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
            None => Err("the provider holds no such resource".to_string()),
            Some(record) if record.job.is_some() => job::inspect(&record),
            Some(record) => match record.phase {
                Phase::Running(running)
                    if procfs::liveness(running.pid, running.start_time) == Liveness::Running =>
                {
                    Ok(running.outputs)
                }
                Phase::Running(running) => Err(format!("pid {} has exited", running.pid)),
                Phase::Finished(_) => Err("a finished job's record".to_string()),
                Phase::Intent => lifecycle::find_service(&id)
                    .await
                    .map(|found| lifecycle::outputs(found.pid, record.port))
                    .ok_or_else(|| "its start was interrupted before the service ran".into()),
            },
        };
        Ok(match outputs {
            Ok(outputs) => proto::InspectResponse {
                present: true,
                outputs_json: outputs.to_string(),
                health: Health::Healthy.into(),
                ..Default::default()
            },
            Err(found) => {
                // The watch's reason says how it ended, when it saw it end.
                let seen = self.watch.board().get(&id);
                let reason = seen
                    .filter(|s| s.health() == Health::Down)
                    .map_or(found, |s| s.reason);
                proto::InspectResponse {
                    health: Health::Down.into(),
                    reason,
                    ..Default::default()
                }
            }
        })
    }

    /// `logs` (`{"tail": N}`: the last N lines of its output) and `inspect`
    /// (pid, state, start time, memory, CPU, command, health) of a service;
    /// NOT_FOUND when the provider holds no record of it.
    async fn retrieve_data(
        &self,
        request: proto::RetrieveDataRequest,
    ) -> Result<proto::RetrieveDataResponse, Status> {
        let kind = data::Kind::parse(&request)?;
        let id = request.resource.unwrap_or_default().resource_id;
        let record = {
            // Not between an intent and its spawn, nor during a destroy.
            let lock = self.lock_for(&id);
            let _held = lock.lock().await;
            self.state()
                .read(&id)
                .map_err(|e| Status::internal(e.to_string()))?
        };
        let Some(record) = record else {
            return Err(Status::not_found(format!(
                "the provider holds no resource {id}"
            )));
        };
        let answer = match kind {
            data::Kind::Logs { tail } => data::logs(&record, tail).await?,
            data::Kind::Inspect => data::inspect(&record, self.watch.board()).await,
        };
        Ok(proto::RetrieveDataResponse {
            data_json: answer.to_string(),
        })
    }

    /// The health of every service, from the board (see [`watch`]).
    async fn watch_resources(
        &self,
        request: proto::WatchResourcesRequest,
        sink: StatusSink,
    ) -> Result<(), Status> {
        self.start_watching().await;
        self.watch.board().serve(request, sink).await
    }

    /// Each service counts one `processes` against its project's quotas.
    async fn describe_resources(
        &self,
        request: proto::DescribeResourcesRequest,
    ) -> Result<proto::DescribeResourcesResponse, Status> {
        let descriptions = request
            .resources
            .iter()
            .filter(|r| r.r#type == RESOURCE_TYPE || r.r#type == job::JOB_TYPE)
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
            capacity: [RESOURCE_TYPE, job::JOB_TYPE]
                .map(|t| (t.to_string(), self.config().capacity))
                .into(),
            labels: [("os".to_string(), "linux".to_string())].into(),
        }])
    }
}

impl Drop for ProcessProvider {
    /// The tasks watching services and rotating logs end with the provider;
    /// the services do not.
    fn drop(&mut self) {
        self.watch.stop();
        self.logs.stop();
    }
}

fn log_limits(config: &ProviderConfig) -> LogLimits {
    LogLimits {
        max_bytes: config.log_max_bytes,
        files: config.log_files,
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
        Phase::Finished(finished) => finished.outputs.clone(),
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
    watch: &Arc<Watcher>,
) -> Result<Value, Failure> {
    let shown = shell_words(&service.command, &service.args);
    events.progress(10, format!("starting `{shown}`")).await;
    let intent = lifecycle::record_intent(state, resource_id, service).await?;
    let mut spawned = match lifecycle::spawn_tagged(&intent, service, pass_env) {
        Ok(spawned) => spawned,
        Err(failure) => {
            forget(state, resource_id).await;
            return Err(failure);
        }
    };
    let (pid, start_time, log_offset) = (spawned.pid, spawned.start_time, spawned.log_offset);
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
    if let Some(status) = lifecycle::exited_within(&mut spawned, STARTUP_CHECK).await {
        let tail = lifecycle::log_tail(&record.log, log_offset).await;
        // Anything it started before exiting goes with it.
        lifecycle::kill_tagged(resource_id).await;
        forget(state, resource_id).await;
        return Err(Failure::new(format!(
            "`{shown}` exited at once ({status}); its last output:\n{tail}"
        )));
    }
    // HEALTHY from now on, DOWN with its wait status when it exits.
    watch.child(resource_id, pid, start_time, spawned.child);
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
