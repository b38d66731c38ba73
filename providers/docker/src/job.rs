//! `docker.v1.job`: a container run to its end. Its deploy answers when the
//! container exits: its outputs on status 0 (`exitStatus`, `durationMs`,
//! `output`: the last lines of its logs), a failure quoting those lines
//! otherwise, once the `retries` are spent (each retry a new container, the
//! failed one removed). A run past `timeout_seconds` is killed.
//!
//! Exactly once, with no state of its own: the exited container stays until
//! the job is destroyed, labelled with the resource id and its run
//! ([`LABEL_RUN`]), so a repeated deploy finds it and answers how it ended,
//! and one finding it still running waits for it. Health: a job container
//! that exited 0 is HEALTHY (`completed`), not a dead service.

use std::time::Duration;

use bollard::Docker;
use bollard::models::ContainerInspectResponse;
use bollard::query_parameters::{KillContainerOptions, RemoveContainerOptions};
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::{Events, proto};
use serde_json::Map;

use crate::config::{ContainerConfig, object};
use crate::container::{self, short};
use corbel_provider_sdk::config::present;

use crate::engine::{Problem, call, status};
use crate::health;

pub const JOB: &str = "docker.v1.job";
/// On a job's container: which run it is (0 for the first).
pub const LABEL_RUN: &str = "io.corbel.job-run";
/// The longest a job's runs may take together: Corbel's default deadline on
/// a deploy call (`provider.resource_timeout_seconds`).
pub const MAX_JOB_SECONDS: u64 = 1800;
pub const MAX_RETRIES: u64 = 10;
/// How often a running job's container is looked at (and Corbel told the
/// deploy still goes).
const POLL: Duration = Duration::from_millis(100);
const KEEP_ALIVE: Duration = Duration::from_secs(2);
/// Lines (and bytes) of its logs in a job's outputs and failure.
const TAIL_LINES: u64 = 20;
const TAIL_BYTES: usize = 4096;

/// A `docker.v1.job`'s configuration: a container's keys (but `restart` and
/// `ports`), `timeout_seconds` (default 600) and `retries` (default 0).
#[derive(Debug, Clone)]
pub struct JobConfig {
    pub container: ContainerConfig,
    pub timeout: Duration,
    pub retries: u32,
}

impl JobConfig {
    pub fn parse(config_json: &str) -> Result<Self, String> {
        let container = ContainerConfig::parse(config_json)?;
        let map = object(config_json)?;
        for key in ["restart", "ports"] {
            if present(&map, key).is_some() {
                return Err(format!(
                    "config.{key}: a job runs to its end; it has no {key}"
                ));
            }
        }
        let timeout = bounded(&map, "timeout_seconds", 1..=MAX_JOB_SECONDS, 600)?;
        let retries = bounded(&map, "retries", 0..=MAX_RETRIES, 0)?;
        let runs = retries + 1;
        if timeout * runs > MAX_JOB_SECONDS {
            return Err(format!(
                "config.timeout_seconds: {runs} runs of {timeout} s (retries: {retries}) could \
                 take longer than {MAX_JOB_SECONDS} s, Corbel's deadline on a deploy"
            ));
        }
        Ok(JobConfig {
            container,
            timeout: Duration::from_secs(timeout),
            retries: retries as u32,
        })
    }
}

fn bounded(
    map: &Map<String, Value>,
    key: &str,
    range: std::ops::RangeInclusive<u64>,
    default: u64,
) -> Result<u64, String> {
    match present(map, key) {
        None => Ok(default),
        Some(value) => value.as_u64().filter(|n| range.contains(n)).ok_or_else(|| {
            format!(
                "config.{key}: expected an integer from {} to {}",
                range.start(),
                range.end()
            )
        }),
    }
}

/// Runs the job to its end, or answers how its container ended.
pub async fn deploy(
    client: &Docker,
    resource: &proto::Resource,
    job: &JobConfig,
    events: &Events,
) -> Result<Value, Problem> {
    let mut run = 0;
    loop {
        let inspected = match container::find(client, resource).await? {
            Some(found) => {
                run = run_of(&found);
                found
            }
            None => {
                let mut config = job.container.clone();
                config.labels.insert(LABEL_RUN.into(), run.to_string());
                container::deploy(client, resource, &config, events).await?;
                container::find(client, resource)
                    .await?
                    .ok_or_else(|| Problem::unavailable("the job's container went away"))?
            }
        };
        let id = inspected.id.clone().unwrap_or_default();
        let (ended, timed_out) = wait(client, &id, job.timeout, events).await?;
        let state = ended.state.clone().unwrap_or_default();
        let code = state.exit_code.unwrap_or(-1);
        let duration_ms = match (
            state.started_at.as_deref().and_then(health::unix_ms),
            state.finished_at.as_deref().and_then(health::unix_ms),
        ) {
            (Some(started), Some(finished)) => (finished - started).max(0),
            _ => 0,
        };
        let output = tail(client, &id).await;
        let outputs = json!({ "exitStatus": code, "durationMs": duration_ms, "output": output });
        if code == 0 && !timed_out {
            events
                .progress(100, format!("job container {} completed", short(&id)))
                .await;
            return Ok(outputs);
        }
        let why = if timed_out {
            format!("timed out after {} s", job.timeout.as_secs())
        } else {
            health::exit_reason(code)
        };
        if run < job.retries {
            events
                .log(format!(
                    "run {} {why}; running it again ({} of {} retries left)",
                    run + 1,
                    job.retries - run,
                    job.retries
                ))
                .await;
            remove(client, &id).await?;
            run += 1;
            continue;
        }
        let runs = match run {
            0 => String::new(),
            n => format!(" (run {} of {})", n + 1, n + 1),
        };
        let shown = if output.is_empty() {
            "(no output)"
        } else {
            &output
        };
        // Not retryable by Corbel: the job ran and failed.
        return Err(Problem::precondition(format!(
            "job container {} {why}{runs}; its last output:\n{shown}",
            short(&id)
        )));
    }
}

fn run_of(inspected: &ContainerInspectResponse) -> u32 {
    inspected
        .config
        .as_ref()
        .and_then(|c| c.labels.as_ref())
        .and_then(|l| l.get(LABEL_RUN))
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// Whether a container is a job's (its exit is its end, not a death).
pub fn is_job(labels: Option<&std::collections::HashMap<String, String>>) -> bool {
    labels.is_some_and(|l| l.contains_key(LABEL_RUN))
}

/// Waits for the container to exit, killing it once it ran `timeout`; the
/// container as it ended, and whether it was killed for its timeout.
async fn wait(
    client: &Docker,
    id: &str,
    timeout: Duration,
    events: &Events,
) -> Result<(ContainerInspectResponse, bool), Problem> {
    let mut beat = tokio::time::Instant::now() + KEEP_ALIVE;
    let mut killed = false;
    loop {
        let found = call(
            "inspecting the job's container",
            client.inspect_container(id, None),
        )
        .await?;
        let state = found.state.clone().unwrap_or_default();
        if !state.running.unwrap_or(false) && container::state_of(&found) != "created" {
            return Ok((found, killed));
        }
        let started = state.started_at.as_deref().and_then(health::unix_ms);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or_default();
        if !killed && started.is_some_and(|s| now - s > timeout.as_millis() as i64) {
            match client
                .kill_container(id, None::<KillContainerOptions>)
                .await
            {
                Ok(()) => killed = true,
                Err(e) if matches!(status(&e), Some(404 | 409)) => killed = true,
                Err(e) => return Err(Problem::engine("killing the job's container", &e)),
            }
        }
        if tokio::time::Instant::now() >= beat {
            events.keep_alive().await;
            beat += KEEP_ALIVE;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The last lines of the container's logs, at most [`TAIL_BYTES`].
async fn tail(client: &Docker, id: &str) -> String {
    let text = container::logs(client, id, TAIL_LINES)
        .await
        .unwrap_or_default();
    let mut text = text.trim_end().to_string();
    if text.len() > TAIL_BYTES {
        let mut cut = text.len() - TAIL_BYTES;
        while !text.is_char_boundary(cut) {
            cut += 1;
        }
        text.drain(..cut);
    }
    text
}

async fn remove(client: &Docker, id: &str) -> Result<(), Problem> {
    let options = RemoveContainerOptions {
        force: true,
        ..Default::default()
    };
    match client.remove_container(id, Some(options)).await {
        Ok(()) => Ok(()),
        Err(e) if status(&e) == Some(404) => Ok(()),
        Err(e) => Err(Problem::engine("removing the failed run's container", &e)),
    }
}
