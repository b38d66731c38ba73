//! `process.v1.job`: a command run to its end. Its deploy answers when it
//! exits: its outputs on status 0 (`exitStatus`, `durationMs`, `output`: the
//! last lines it wrote), a failure quoting those lines otherwise, once the
//! `retries` are spent. A run past `timeout_seconds` is killed, with all it
//! started (its process group and everything tagged with its resource id).
//!
//! Exactly once. A job starts like a service (intent, spawn, running record:
//! see [`crate::lifecycle`]), in its own session, outliving the provider; its
//! end is recorded (`finished`) and kept until it is destroyed, so a deploy
//! repeated for the same resource id (Corbel replaying its journal after a
//! crash) answers the recorded result and runs nothing. A provider that
//! finds a run started by its predecessor (which went away with the server
//! it served) waits for that run instead of starting another. To learn how
//! such a run ended, which only its parent could, the command runs under a
//! shell that writes its exit status to a file the provider opened for it
//! (as its descriptor 3, closed for the command itself); the file is in the
//! state directory, out of the job's sandbox.
//!
//! Health: a job is HEALTHY while it runs and once it completed (`completed`);
//! it is never watched for its exit as a service is, so a finished job is
//! not a dead service, and a restart policy has nothing to act on.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::{Events, Failure};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::time::Instant;

use crate::config::{JobConfig, Sandbox, ServiceConfig};
use crate::lifecycle::{self, shell_words};
use crate::procfs::{self, Liveness};
use crate::state::{Finished, JobRun, Phase, Record, StateDir};
use crate::watch::{self, Watcher};

pub const JOB_TYPE: &str = "process.v1.job";
/// How often a running job's deploy tells Corbel it still goes.
const KEEP_ALIVE: Duration = Duration::from_secs(2);
/// How often a job a predecessor started is looked at.
const ADOPTED_POLL: Duration = Duration::from_millis(50);
/// The shell around a job's command: runs it without descriptor 3, writes
/// its exit status there, and exits with it (a command killed by a signal
/// reads as the shell's 128 + the signal).
const SCRIPT: &str = r#""$@" 3>&-; s=$?; echo $s >&3; exit $s"#;
/// The shell; `$0` of the script.
const SHELL: &str = "/bin/sh";
const SCRIPT_NAME: &str = "corbel-job";

/// What a job's deploy works with, borrowed from the provider.
pub struct Ctx<'a> {
    pub state: &'a StateDir,
    pub watch: &'a Arc<Watcher>,
    pub pass_env: &'a [String],
}

/// How one run ended.
enum Ended {
    /// Exited (or was killed by a signal): the exit status, and in words.
    Exited(i32, String),
    /// Killed at `timeout_seconds`.
    TimedOut(Duration),
    /// Ended while no provider watched it, telling nothing.
    Unknown(String),
}

/// Runs the job `id` to its end, or answers how it ended if it already did.
/// The caller holds the resource's lock and has stopped nothing.
// Long: what the record says, then one loop over the runs; split, the steps would pass the run, its record and its end back and forth.
pub async fn deploy(
    ctx: &Ctx<'_>,
    id: &str,
    job: &JobConfig,
    existing: Option<Record>,
    events: &Events,
) -> Result<Value, Failure> {
    let mut attempt = 0;
    let mut adopted = None;
    if let Some(record) = existing {
        match (&record.job, &record.phase) {
            (Some(_), Phase::Finished(finished)) => {
                events.progress(100, "it already ran to its end").await;
                return match &finished.failure {
                    None => Ok(finished.outputs.clone()),
                    Some(failure) => Err(Failure::new(failure.clone())),
                };
            }
            (Some(run), Phase::Running(running)) => {
                let run = run.clone();
                let (pid, start_time) = (running.pid, running.start_time);
                events
                    .progress(
                        10,
                        format!("waiting for pid {pid}, started before a restart"),
                    )
                    .await;
                let ended = wait_adopted(&run, pid, start_time, job.timeout, events).await;
                adopted = Some((record, run, ended));
            }
            (Some(run), Phase::Intent) => {
                let run = run.clone();
                match lifecycle::find_service(id).await {
                    Some(found) => {
                        events
                            .progress(
                                10,
                                format!("waiting for pid {}, started before a restart", found.pid),
                            )
                            .await;
                        let (pid, start_time) = (found.pid, found.stat.start_time);
                        let ended = wait_adopted(&run, pid, start_time, job.timeout, events).await;
                        adopted = Some((record, run, ended));
                    }
                    None => attempt = run.attempt,
                }
            }
            // A service's record, or a record without a run: whatever it
            // left goes before the job runs.
            _ => lifecycle::stop(&record, Duration::ZERO, events).await?,
        }
    }
    let shown = shell_words(&job.run.command, &job.run.args);
    loop {
        let (record, run, ended) = match adopted.take() {
            Some(adopted) => adopted,
            None => run_once(ctx, id, job, attempt, events).await?,
        };
        let output = lifecycle::last_lines(&record.log, run.log_offset).await;
        let duration_ms = now_ms().saturating_sub(run.started_unix_ms);
        let (status, why) = match ended {
            Ended::Exited(0, _) => {
                let outputs =
                    json!({ "exitStatus": 0, "durationMs": duration_ms, "output": output });
                finish(ctx, record, outputs.clone(), None).await?;
                ctx.watch.job(id, "completed");
                events
                    .progress(100, format!("`{shown}` completed in {duration_ms} ms"))
                    .await;
                return Ok(outputs);
            }
            Ended::Exited(status, why) => (Some(status), why),
            Ended::TimedOut(after) => (None, format!("timed out after {} s", after.as_secs())),
            Ended::Unknown(why) => (None, why),
        };
        // Whatever it left running goes with it.
        lifecycle::kill_tagged(id).await;
        if run.attempt < job.retries {
            events
                .log(format!(
                    "run {} of `{shown}` {why}; running it again ({} of {} retries left)",
                    run.attempt + 1,
                    job.retries - run.attempt,
                    job.retries
                ))
                .await;
            attempt = run.attempt + 1;
            continue;
        }
        let runs = match run.attempt {
            0 => String::new(),
            n => format!(" (run {} of {})", n + 1, n + 1),
        };
        let shown_output = if output.is_empty() {
            "(no output)"
        } else {
            &output
        };
        let failure = format!("job `{shown}` {why}{runs}; its last output:\n{shown_output}");
        let outputs = json!({ "exitStatus": status, "durationMs": duration_ms, "output": output });
        finish(ctx, record, outputs, Some(failure.clone())).await?;
        ctx.watch.forget(id);
        return Err(Failure::new(failure));
    }
}

/// One run: intent, spawn under the shell, running record, then its end
/// (killed at the timeout).
async fn run_once(
    ctx: &Ctx<'_>,
    id: &str,
    job: &JobConfig,
    attempt: u32,
    events: &Events,
) -> Result<(Record, JobRun, Ended), Failure> {
    let shown = shell_words(&job.run.command, &job.run.args);
    let retry = |e: std::io::Error| Failure::retryable(e.to_string());
    let status_file = ctx.state.status_path(id).map_err(retry)?;
    let log = ctx.state.log_path(id).map_err(retry)?;
    let log_offset = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    // Truncated: what a previous run wrote there is not this one's.
    let status = std::fs::File::create(&status_file)
        .map_err(|e| Failure::retryable(format!("cannot create {}: {e}", status_file.display())))?;
    let run = JobRun {
        attempt,
        started_unix_ms: now_ms(),
        log_offset,
        status_file,
    };
    let intent = Record {
        resource_id: id.to_string(),
        command: job.run.command.clone(),
        args: job.run.args.clone(),
        port: None,
        log,
        job: Some(run.clone()),
        phase: Phase::Intent,
    };
    lifecycle::write(ctx.state, intent.clone()).await?;
    events
        .progress(10, format!("running `{shown}` (run {})", attempt + 1))
        .await;
    let shell = under_shell(&job.run);
    let spawned = lifecycle::spawn_tagged_with(&intent, &shell, ctx.pass_env, Some(status))?;
    let (pid, start_time) = (spawned.pid, spawned.start_time);
    let record = match lifecycle::record_running(ctx.state, intent, pid, start_time).await {
        Ok(record) => record,
        Err(failure) => {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            return Err(failure);
        }
    };
    ctx.watch.job(id, "running");
    let ended = wait_child(spawned.child, pid, id, job.timeout, events).await;
    Ok((record, run, ended))
}

/// `run` as the shell's arguments: `sh -c SCRIPT corbel-job command args…`.
/// The command's own directory stays readable, as it would be without the
/// shell around it.
fn under_shell(run: &ServiceConfig) -> ServiceConfig {
    let mut sandbox = run.sandbox.clone();
    if let Sandbox::Confined { read, .. } = &mut sandbox
        && run.command.contains('/')
        && let Some(dir) = std::path::Path::new(&run.command).parent()
    {
        read.push(dir.to_owned());
    }
    let args = ["-c", SCRIPT, SCRIPT_NAME, &run.command]
        .into_iter()
        .map(str::to_owned)
        .chain(run.args.iter().cloned())
        .collect();
    ServiceConfig {
        command: SHELL.to_string(),
        args,
        sandbox,
        ..run.clone()
    }
}

/// Waits for a run this provider spawned; kills its group at the timeout.
async fn wait_child(
    mut child: Child,
    pid: i32,
    id: &str,
    timeout: Duration,
    events: &Events,
) -> Ended {
    let deadline = Instant::now() + timeout;
    let mut beat = tokio::time::interval(KEEP_ALIVE);
    beat.tick().await;
    loop {
        tokio::select! {
            status = child.wait() => {
                let (code, why) = watch::exit_of(status);
                return match code {
                    Some(code) => Ended::Exited(code, why),
                    None => Ended::Unknown(why),
                };
            }
            () = tokio::time::sleep_until(deadline) => {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                lifecycle::kill_tagged(id).await;
                let _ = child.wait().await;
                return Ended::TimedOut(timeout);
            }
            _ = beat.tick() => events.keep_alive().await,
        }
    }
}

/// Waits for a run a predecessor spawned (not this provider's child), up to
/// what is left of its timeout; how it ended is read from its status file.
async fn wait_adopted(
    run: &JobRun,
    pid: i32,
    start_time: u64,
    timeout: Duration,
    events: &Events,
) -> Ended {
    let ran = Duration::from_millis(now_ms().saturating_sub(run.started_unix_ms));
    let deadline = Instant::now() + timeout.saturating_sub(ran);
    let mut beat = Instant::now() + KEEP_ALIVE;
    while procfs::liveness(pid, start_time) == Liveness::Running {
        if Instant::now() >= deadline {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            return Ended::TimedOut(timeout);
        }
        if Instant::now() >= beat {
            events.keep_alive().await;
            beat += KEEP_ALIVE;
        }
        tokio::time::sleep(ADOPTED_POLL).await;
    }
    let status = tokio::fs::read_to_string(&run.status_file).await;
    match status.ok().and_then(|text| text.trim().parse::<i32>().ok()) {
        Some(code) => Ended::Exited(code, format!("exited with status {code}")),
        None => Ended::Unknown(
            "ended while no provider watched it, without telling its status".to_string(),
        ),
    }
}

/// Records how the job ended, durably, before it is answered.
async fn finish(
    ctx: &Ctx<'_>,
    record: Record,
    outputs: Value,
    failure: Option<String>,
) -> Result<(), Failure> {
    let record = Record {
        phase: Phase::Finished(Finished { outputs, failure }),
        ..record
    };
    lifecycle::write(ctx.state, record).await
}

/// What `Inspect` says of a job's record: present with its outputs once it
/// completed, present while it runs; absent once it failed, or when it ended
/// unwatched (the next deploy settles it).
pub fn inspect(record: &Record) -> Result<Value, String> {
    match &record.phase {
        Phase::Finished(Finished {
            outputs,
            failure: None,
        }) => Ok(outputs.clone()),
        Phase::Finished(Finished {
            failure: Some(failure),
            ..
        }) => Err(failure.clone()),
        Phase::Running(running)
            if procfs::liveness(running.pid, running.start_time) == Liveness::Running =>
        {
            Ok(json!({}))
        }
        Phase::Running(_) | Phase::Intent => {
            Err("its run ended while no provider watched it; a deploy settles it".to_string())
        }
    }
}

/// What the health board says of a job found in the records at start-up.
pub fn observe(watch: &Watcher, record: &Record) {
    let id = &record.resource_id;
    match &record.phase {
        Phase::Finished(Finished { failure: None, .. }) => watch.job(id, "completed"),
        Phase::Running(_) | Phase::Intent => watch.job(id, "running"),
        Phase::Finished(_) => {}
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}
