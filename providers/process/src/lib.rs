//! The reference Corbel provider: each `process.v1.service` resource is a
//! local process in its own process group, outliving the provider itself.
//!
//! Deploy spawns and records it in the state directory; inspect and destroy
//! find it again by that record (pid plus start time), so a restarted
//! provider manages what its predecessor started.

pub mod config;
pub mod procfs;
pub mod state;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex as SyncMutex, RwLock};
use std::time::Duration;

use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::{
    Events, Failure, Provider, ProviderInfo, Status, StepResult, async_trait, proto,
};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::process::Command;
use tokio::sync::Mutex;

use crate::config::{ProviderConfig, ServiceConfig};
use crate::procfs::Liveness;
use crate::state::{Record, StateDir};

pub const RESOURCE_TYPE: &str = "process.v1.service";
/// Overrides the `state_dir` configuration key.
pub const ENV_STATE_DIR: &str = "CORBEL_STATE_DIR";
/// A service still running this long after spawn counts as started.
const STARTUP_CHECK: Duration = Duration::from_millis(200);
/// How long a SIGKILLed group may take to disappear before destroy gives up.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How often destroy looks whether the group is gone.
const EXIT_POLL: Duration = Duration::from_millis(20);
/// Lines of a failed service's output quoted in the failure.
const LOG_TAIL_LINES: usize = 20;

pub struct ProcessProvider {
    /// `CORBEL_STATE_DIR`, read once at start; wins over the configuration.
    env_state_dir: Option<PathBuf>,
    config: RwLock<ProviderConfig>,
    /// One lock per resource id, so two calls for one service never interleave.
    locks: SyncMutex<HashMap<String, Arc<Mutex<()>>>>,
}

impl ProcessProvider {
    /// A provider whose state directory is `env_state_dir` if given, else the
    /// configured `state_dir`, else `./state`.
    pub fn new(env_state_dir: Option<PathBuf>) -> Self {
        ProcessProvider {
            env_state_dir,
            config: RwLock::new(ProviderConfig::default()),
            locks: SyncMutex::new(HashMap::new()),
        }
    }

    /// A provider reading `CORBEL_STATE_DIR` from the environment.
    pub fn from_env() -> Self {
        Self::new(
            std::env::var_os(ENV_STATE_DIR)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
        )
    }

    fn config(&self) -> ProviderConfig {
        self.config
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn state(&self) -> StateDir {
        let dir = self
            .env_state_dir
            .clone()
            .or_else(|| self.config().state_dir)
            .unwrap_or_else(|| PathBuf::from("./state"));
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

    async fn deploy_resource(
        &self,
        request: proto::DeployResourceRequest,
        events: Events,
    ) -> StepResult {
        let resource = request.resource.unwrap_or_default();
        let service = ServiceConfig::parse(&resource.config_json).map_err(Failure::new)?;
        let lock = self.lock_for(&resource.resource_id);
        let _held = lock.lock().await;
        let state = self.state();
        if let Some(record) = read_record(&state, &resource.resource_id)?
            && procfs::liveness(record.pid, record.start_time) == Liveness::Running
        {
            events
                .progress(100, format!("already running as pid {}", record.pid))
                .await;
            return Ok(record.outputs);
        }
        Ok(start(&state, &resource.resource_id, service, &events).await?)
    }

    async fn destroy_resource(
        &self,
        request: proto::DestroyResourceRequest,
        events: Events,
    ) -> StepResult {
        let resource = request.resource.unwrap_or_default();
        let lock = self.lock_for(&resource.resource_id);
        let _held = lock.lock().await;
        let state = self.state();
        let Some(record) = read_record(&state, &resource.resource_id)? else {
            events
                .log(format!(
                    "nothing recorded for {}; nothing to destroy",
                    resource.resource_id
                ))
                .await;
            return Ok(json!({}));
        };
        stop(&record, self.config().grace, &events).await?;
        state.remove(&record.resource_id).map_err(|e| {
            Failure::retryable(format!(
                "cannot remove the record of {}: {e}",
                record.resource_id
            ))
        })?;
        events.progress(100, "destroyed").await;
        Ok(json!({}))
    }

    async fn inspect(
        &self,
        request: proto::InspectRequest,
    ) -> Result<proto::InspectResponse, Status> {
        let resource = request.resource.unwrap_or_default();
        let record = self
            .state()
            .read(&resource.resource_id)
            .map_err(|e| Status::internal(format!("cannot read the record: {e}")))?;
        Ok(match record {
            Some(record)
                if procfs::liveness(record.pid, record.start_time) == Liveness::Running =>
            {
                proto::InspectResponse {
                    present: true,
                    outputs_json: record.outputs.to_string(),
                }
            }
            _ => proto::InspectResponse::default(),
        })
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
    state.read(resource_id).map_err(|e| {
        Failure::retryable(format!(
            "cannot read the record of {resource_id} in {}: {e}",
            state.root().display()
        ))
    })
}

/// Spawns the service, checks it survives its first moments, records it.
async fn start(
    state: &StateDir,
    resource_id: &str,
    service: ServiceConfig,
    events: &Events,
) -> Result<Value, Failure> {
    let shown = shell_words(&service.command, &service.args);
    events.progress(10, format!("starting `{shown}`")).await;
    let port = if service.port {
        Some(free_port().map_err(|e| Failure::retryable(format!("cannot pick a free port: {e}")))?)
    } else {
        None
    };
    let log = state
        .log_path(resource_id)
        .map_err(|e| Failure::retryable(format!("cannot create the log directory: {e}")))?;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| Failure::retryable(format!("cannot open {}: {e}", log.display())))?;
    // Only what this run writes is quoted if it fails at once.
    let log_offset = out.metadata().map(|m| m.len()).unwrap_or(0);
    let err = out
        .try_clone()
        .map_err(|e| Failure::retryable(format!("cannot open {}: {e}", log.display())))?;

    let mut command = Command::new(&service.command);
    command
        .args(&service.args)
        .envs(&service.env)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        // Its own group: signals to the provider's group do not reach it, and
        // destroy can signal everything it started.
        .process_group(0)
        .kill_on_drop(false);
    if let Some(port) = port {
        command.env("PORT", port.to_string());
    }
    if let Some(cwd) = &service.cwd {
        command.current_dir(cwd);
    }
    let mut child = command
        .spawn()
        .map_err(|e| Failure::new(format!("cannot start `{shown}`: {e}")))?;
    let pid = child.id().expect("a just-spawned child has a pid") as i32;
    // Read before anything can reap it, so the record names this very process.
    let start_time = procfs::stat(pid).map(|s| s.start_time).unwrap_or_default();

    if let Ok(exited) = tokio::time::timeout(STARTUP_CHECK, child.wait()).await {
        let status = exited
            .map(|s| s.to_string())
            .unwrap_or_else(|e| format!("unknown status: {e}"));
        let tail = log_tail(&log, log_offset).await;
        return Err(Failure::new(format!(
            "`{shown}` exited at once ({status}); its last output:\n{tail}"
        )));
    }
    // Reaped here while the provider lives; adopted by init once it exits.
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    events.progress(80, format!("started pid {pid}")).await;

    let mut outputs = json!({ "pid": pid });
    if let Some(port) = port {
        outputs["port"] = json!(port);
    }
    let record = Record {
        resource_id: resource_id.to_string(),
        pid,
        pgid: pid,
        start_time,
        command: service.command,
        args: service.args,
        port,
        outputs: outputs.clone(),
        log,
    };
    if let Err(error) = state.write(&record) {
        // Unrecorded, it could never be destroyed: do not leave it running.
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        return Err(Failure::retryable(format!(
            "cannot record pid {pid} in {}: {error}",
            state.root().display()
        )));
    }
    Ok(outputs)
}

/// Stops a recorded service's process group: SIGTERM, `grace`, SIGKILL.
async fn stop(record: &Record, grace: Duration, events: &Events) -> Result<(), Failure> {
    let group = Pid::from_raw(record.pgid);
    match procfs::liveness(record.pid, record.start_time) {
        Liveness::Running => {}
        // The leader is gone; members left in its group are still ours (a pid
        // is not reused while its group exists).
        Liveness::Gone if !procfs::group_members(record.pgid).is_empty() => {}
        Liveness::Gone => {
            events
                .log(format!("pid {} already gone; nothing to stop", record.pid))
                .await;
            return Ok(());
        }
        Liveness::Reused => {
            events
                .log(format!(
                    "pid {} now belongs to another process; ours is gone",
                    record.pid
                ))
                .await;
            return Ok(());
        }
    }
    events
        .progress(
            20,
            format!("sending SIGTERM to process group {}", record.pgid),
        )
        .await;
    let _ = killpg(group, Signal::SIGTERM);
    if group_gone_within(record.pgid, grace).await {
        return Ok(());
    }
    events
        .progress(
            60,
            format!(
                "still running after {} ms; sending SIGKILL",
                grace.as_millis()
            ),
        )
        .await;
    let _ = killpg(group, Signal::SIGKILL);
    if group_gone_within(record.pgid, KILL_WAIT).await {
        return Ok(());
    }
    Err(Failure::retryable(format!(
        "process group {} is still alive after SIGKILL",
        record.pgid
    )))
}

/// Polls until no live process is left in group `pgid`, up to `limit`.
async fn group_gone_within(pgid: i32, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if procfs::group_members(pgid).is_empty() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(EXIT_POLL).await;
    }
}

fn free_port() -> std::io::Result<u16> {
    // Released at once for the service to bind; another process could take it
    // in between, which a retry fixes.
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port())
}

/// The last lines written to `log` from `offset` on.
async fn log_tail(log: &std::path::Path, offset: u64) -> String {
    let mut text = String::new();
    if let Ok(mut file) = tokio::fs::File::open(log).await
        && file.seek(std::io::SeekFrom::Start(offset)).await.is_ok()
    {
        let mut bytes = Vec::new();
        let _ = file.read_to_end(&mut bytes).await;
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
    if tail.is_empty() {
        "(no output)".to_string()
    } else {
        tail
    }
}

/// The command line as a person would type it, for messages.
fn shell_words(command: &str, args: &[String]) -> String {
    std::iter::once(command)
        .chain(args.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ")
}
