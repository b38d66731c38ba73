//! Starting and stopping a service, in steps that each leave the state
//! directory true if the provider dies right after them:
//!
//! 1. [`record_intent`] — the intent (command, port, log) is on disk;
//! 2. [`spawn_tagged`] — the process runs, tagged `CORBEL_RESOURCE_ID=<id>`;
//! 3. [`record_running`] — its pid and start time are on disk.
//!
//! After 1 alone, nothing runs and nothing tagged is found; after 2, the
//! intent plus the tag find the process ([`find_service`]). The steps are
//! public so a test can stop between any two, as a killed provider would.
//! Callers hold the resource's lock.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::{Events, Failure};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::process::{Child, Command};

use crate::config::ServiceConfig;
use crate::procfs::{self, Liveness, Tagged};
use crate::state::{Phase, Record, Running, StateDir};

/// The environment variable every service is started with, naming its
/// resource id; how a service is found when no record names its pid.
pub const TAG: &str = "CORBEL_RESOURCE_ID";
/// The variables of the provider's own environment every service gets, when
/// the provider has them: the rest of a service's environment is its `env`,
/// the provider's `pass_env` list, `PORT` and [`TAG`]. Nothing else is
/// inherited: not the provider's `CORBEL_*` registration variables, nor
/// anything else its host happens to set.
pub const BASE_ENV: [&str; 7] = ["PATH", "HOME", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR"];
/// `PATH` when the provider has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How long a SIGKILLed process may take to disappear before a stop gives up.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How often a stop looks whether its processes are gone.
const EXIT_POLL: Duration = Duration::from_millis(20);
/// Lines of a failed service's output quoted in the failure (and of a job's
/// output in its outputs), and at most this many bytes of them.
const LOG_TAIL_LINES: usize = 20;
const LOG_TAIL_BYTES: usize = 4096;

/// Step 1: chooses the port and the log file and records the intent, durably,
/// before anything is created.
pub async fn record_intent(
    state: &StateDir,
    resource_id: &str,
    service: &ServiceConfig,
) -> Result<Record, Failure> {
    let port = if service.port {
        Some(free_port().map_err(|e| Failure::retryable(format!("cannot pick a free port: {e}")))?)
    } else {
        None
    };
    let log = state
        .log_path(resource_id)
        .map_err(|e| Failure::retryable(e.to_string()))?;
    let intent = Record {
        resource_id: resource_id.to_string(),
        command: service.command.clone(),
        args: service.args.clone(),
        port,
        log,
        job: None,
        phase: Phase::Intent,
    };
    write(state, intent.clone()).await?;
    Ok(intent)
}

/// A process [`spawn_tagged`] started.
#[derive(Debug)]
pub struct Spawned {
    /// Ours to reap; dropping it leaves the process running.
    pub child: Child,
    pub pid: i32,
    pub start_time: u64,
    /// The log's length before the process wrote to it.
    pub log_offset: u64,
}

/// A service's whole environment, lowest precedence first: [`BASE_ENV`] from
/// `provider_env` (`PATH` defaulting to [`DEFAULT_PATH`]), the `pass_env`
/// variables `provider_env` has, the service's own `env`, then `PORT` (when
/// the intent picked one) and the [`TAG`], which nothing overrides.
pub fn service_env(
    intent: &Record,
    service: &ServiceConfig,
    pass_env: &[String],
    provider_env: impl Fn(&str) -> Option<String>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert("PATH".to_string(), DEFAULT_PATH.to_string());
    for name in BASE_ENV
        .iter()
        .copied()
        .chain(pass_env.iter().map(String::as_str))
    {
        if let Some(value) = provider_env(name) {
            env.insert(name.to_string(), value);
        }
    }
    env.extend(service.env.clone());
    if let Some(port) = intent.port {
        env.insert("PORT".to_string(), port.to_string());
    }
    env.insert(TAG.to_string(), intent.resource_id.clone());
    env
}

/// Step 2: spawns the intended service in a session (and so a process group)
/// of its own, tagged with its resource id, with the environment
/// [`service_env`] makes, its output appended to the log: the file is opened
/// `O_APPEND` and given to it, so it writes there itself, with or without a
/// provider (which rotates it, see [`crate::logs`]).
pub fn spawn_tagged(
    intent: &Record,
    service: &ServiceConfig,
    pass_env: &[String],
) -> Result<Spawned, Failure> {
    spawn_tagged_with(intent, service, pass_env, None)
}

/// [`spawn_tagged`], with `fd3` (if given) open as descriptor 3 of the
/// process: how a job's shell reports its exit status (see [`crate::job`]).
// Long: one command built up (log, sandbox, environment, the pre_exec hook); its steps share it.
pub fn spawn_tagged_with(
    intent: &Record,
    service: &ServiceConfig,
    pass_env: &[String],
    fd3: Option<std::fs::File>,
) -> Result<Spawned, Failure> {
    let log = &intent.log;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| Failure::retryable(format!("cannot open {}: {e}", log.display())))?;
    // Only what this run writes is quoted if it fails at once.
    let log_offset = out.metadata().map(|m| m.len()).unwrap_or(0);
    let err = out
        .try_clone()
        .map_err(|e| Failure::retryable(format!("cannot open {}: {e}", log.display())))?;

    let mut confinement =
        crate::sandbox::Confinement::for_service(service).map_err(Failure::new)?;
    let mut command = Command::new(&service.command);
    command.args(&service.args);
    // A clean, explicit environment: the provider's registration is its own,
    // and a workload must not be able to register as the provider or write to
    // its state.
    command
        .env_clear()
        .envs(service_env(intent, service, pass_env, |name| {
            std::env::var(name).ok()
        }))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(false);
    // Its own session, hence its own process group (pgid == pid): signals to
    // the provider's group do not reach it, a stop can signal everything it
    // started, and it cannot join the provider's group (setpgid works only
    // within a session), which Corbel's registry relies on to tell the
    // provider from its workloads.
    // Then its Landlock ruleset (see `sandbox.rs`), made before the fork.
    // SAFETY: setsid is async-signal-safe and touches no memory of the
    // parent; applying the ruleset allocates nothing.
    let fd3_raw = fd3.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
    // SAFETY (dup2, fcntl): async-signal-safe calls on a descriptor the
    // parent keeps open (`fd3` lives until after the spawn).
    unsafe {
        command.pre_exec(move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            if let Some(raw) = fd3_raw {
                // dup2 onto itself would keep close-on-exec: cleared instead.
                let done = if raw == 3 {
                    nix::libc::fcntl(3, nix::libc::F_SETFD, 0)
                } else {
                    nix::libc::dup2(raw, 3)
                };
                if done < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            match &mut confinement {
                Some(confinement) => confinement.apply_in_child(),
                None => Ok(()),
            }
        });
    }
    if let Some(cwd) = &service.cwd {
        command.current_dir(cwd);
    }
    let shown = shell_words(&service.command, &service.args);
    let child = command
        .spawn()
        .map_err(|e| Failure::new(format!("cannot start `{shown}`: {e}")))?;
    drop(fd3);
    let pid = child.id().expect("a just-spawned child has a pid") as i32;
    // Read before anything can reap it, so the record names this very process.
    let start_time = procfs::stat(pid).map(|s| s.start_time).unwrap_or_default();
    Ok(Spawned {
        child,
        pid,
        start_time,
        log_offset,
    })
}

/// Step 3: records the intended service as running as `pid`, durably, and
/// returns the record (its outputs are the deploy's).
pub async fn record_running(
    state: &StateDir,
    intent: Record,
    pid: i32,
    start_time: u64,
) -> Result<Record, Failure> {
    let outputs = outputs(pid, intent.port);
    let record = Record {
        phase: Phase::Running(Running {
            pid,
            pgid: pid,
            start_time,
            outputs,
        }),
        ..intent
    };
    write(state, record.clone()).await?;
    Ok(record)
}

/// What a deploy returns for a service running as `pid`.
pub fn outputs(pid: i32, port: Option<u16>) -> Value {
    let mut outputs = json!({ "pid": pid });
    if let Some(port) = port {
        outputs["port"] = json!(port);
    }
    outputs
}

/// The service started for `resource_id`, found by its tag: the group leader
/// carrying it. Reads `/proc` only.
pub async fn find_service(resource_id: &str) -> Option<Tagged> {
    let id = resource_id.to_string();
    blocking(move || procfs::tagged_leader(TAG, &id)).await
}

/// Waits `limit` for `spawned` to exit: `Some(status)` if it did (reaped).
/// If not, it is left running, and its child is the caller's to wait for
/// ([`crate::watch::Watcher::child`] does).
pub async fn exited_within(spawned: &mut Spawned, limit: Duration) -> Option<String> {
    match tokio::time::timeout(limit, spawned.child.wait()).await {
        Ok(status) => Some(
            status
                .map(|s| s.to_string())
                .unwrap_or_else(|e| format!("unknown status: {e}")),
        ),
        Err(_) => None,
    }
}

/// Something a stop signals and waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    /// A whole process group (a service, or its members left after it).
    Group(i32),
    /// One process outside such a group.
    Process { pid: i32, start_time: u64 },
}

impl Target {
    fn alive(self) -> bool {
        match self {
            Target::Group(pgid) => !procfs::group_members(pgid).is_empty(),
            Target::Process { pid, start_time } => {
                procfs::liveness(pid, start_time) == Liveness::Running
            }
        }
    }

    fn signal(self, signal: Signal) {
        // A target that is gone meanwhile answers ESRCH, which is the goal.
        let _ = match self {
            Target::Group(pgid) => killpg(Pid::from_raw(pgid), signal),
            Target::Process { pid, .. } => kill(Pid::from_raw(pid), signal),
        };
    }
}

/// Stops the service of `record` and every live process tagged with its
/// resource id (children it left, a process a lost deploy started):
/// SIGTERM, `grace`, SIGKILL.
pub async fn stop(record: &Record, grace: Duration, events: &Events) -> Result<(), Failure> {
    let mut targets = BTreeSet::new();
    if let Phase::Running(running) = &record.phase {
        match procfs::liveness(running.pid, running.start_time) {
            Liveness::Running => {
                targets.insert(Target::Group(running.pgid));
            }
            // The leader is gone; members left in its group are still ours (a
            // pid is not reused while its group exists).
            Liveness::Gone if !procfs::group_members(running.pgid).is_empty() => {
                targets.insert(Target::Group(running.pgid));
            }
            Liveness::Gone => {
                events
                    .log(format!("pid {} already gone; nothing to stop", running.pid))
                    .await;
            }
            Liveness::Reused => {
                events
                    .log(format!(
                        "pid {} now belongs to another process; ours is gone",
                        running.pid
                    ))
                    .await;
            }
        }
    }
    let id = record.resource_id.clone();
    let tagged = blocking(move || procfs::tagged(TAG, &id)).await;
    let groups: BTreeSet<i32> = tagged
        .iter()
        .filter(|t| t.leads_its_group())
        .map(|t| t.pid)
        .collect();
    for found in &tagged {
        if groups.contains(&found.stat.pgrp) || targets.contains(&Target::Group(found.stat.pgrp)) {
            targets.insert(Target::Group(found.stat.pgrp));
        } else {
            targets.insert(Target::Process {
                pid: found.pid,
                start_time: found.stat.start_time,
            });
        }
    }
    if targets.is_empty() {
        return Ok(());
    }
    let shown = describe(&targets);
    events
        .progress(20, format!("sending SIGTERM to {shown}"))
        .await;
    for target in &targets {
        target.signal(Signal::SIGTERM);
    }
    if all_gone_within(&targets, grace).await {
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
    for target in &targets {
        target.signal(Signal::SIGKILL);
    }
    if all_gone_within(&targets, KILL_WAIT).await {
        return Ok(());
    }
    Err(Failure::retryable(format!(
        "{shown} still alive after SIGKILL"
    )))
}

/// Kills, without grace, every live process tagged with `resource_id`: what a
/// service that failed to start left behind.
pub async fn kill_tagged(resource_id: &str) {
    let id = resource_id.to_string();
    for found in blocking(move || procfs::tagged(TAG, &id)).await {
        let _ = kill(Pid::from_raw(found.pid), Signal::SIGKILL);
    }
}

fn describe(targets: &BTreeSet<Target>) -> String {
    targets
        .iter()
        .map(|target| match target {
            Target::Group(pgid) => format!("process group {pgid}"),
            Target::Process { pid, .. } => format!("pid {pid}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Polls until none of `targets` is alive, up to `limit`.
async fn all_gone_within(targets: &BTreeSet<Target>, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if !targets.iter().any(|t| t.alive()) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(EXIT_POLL).await;
    }
}

/// Writes `record` off the async threads: it waits for an fsync.
pub(crate) async fn write(state: &StateDir, record: Record) -> Result<(), Failure> {
    let state = state.clone();
    blocking(move || state.write(&record))
        .await
        .map_err(|e| Failure::retryable(e.to_string()))
}

/// Runs file-system work (fsyncs, `/proc` walks) on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|error| std::panic::resume_unwind(error.into_panic()))
}

/// `fd` registered with tokio's reactor, to await its readiness to read.
pub(crate) fn readable_fd(
    fd: std::os::fd::OwnedFd,
) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: an `OwnedFd` is an open descriptor, and the `AsyncFd` owns it
    // (so it stays open, the same descriptor) until the `AsyncFd` is dropped.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|error| error.into_parts().1)
}

fn free_port() -> std::io::Result<u16> {
    // Released at once for the service to bind; another process could take it
    // in between, which a retry fixes.
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port())
}

/// The last lines written to `log` from `offset` on, or `(no output)`.
pub async fn log_tail(log: &Path, offset: u64) -> String {
    let tail = last_lines(log, offset).await;
    if tail.is_empty() {
        "(no output)".to_string()
    } else {
        tail
    }
}

/// The last lines written to `log` from `offset` on (at most 20 lines and
/// 4 KiB), empty if none.
pub async fn last_lines(log: &Path, offset: u64) -> String {
    let mut text = String::new();
    if let Ok(mut file) = tokio::fs::File::open(log).await
        && file.seek(std::io::SeekFrom::Start(offset)).await.is_ok()
    {
        let mut bytes = Vec::new();
        let _ = file.read_to_end(&mut bytes).await;
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    let lines: Vec<&str> = text.lines().collect();
    let mut tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
    if tail.len() > LOG_TAIL_BYTES {
        let mut cut = tail.len() - LOG_TAIL_BYTES;
        while !tail.is_char_boundary(cut) {
            cut += 1;
        }
        tail.drain(..cut);
    }
    tail
}

/// The command line as a person would type it, for messages.
pub fn shell_words(command: &str, args: &[String]) -> String {
    std::iter::once(command)
        .chain(args.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn a_service_environment_is_the_base_the_pass_list_its_env_port_and_tag() {
        let intent = Record {
            resource_id: "r1".into(),
            command: "x".into(),
            args: vec![],
            port: Some(4000),
            log: PathBuf::from("/l"),
            job: None,
            phase: Phase::Intent,
        };
        let service = ServiceConfig {
            command: "x".into(),
            args: vec![],
            env: [("LANG", "C"), ("OWN", "1"), ("PORT", "1"), (TAG, "forged")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
            cwd: None,
            port: true,
            sandbox: Default::default(),
        };
        let provider = |name: &str| match name {
            "HOME" => Some("/home/p".to_string()),
            "LANG" => Some("en_US.UTF-8".to_string()),
            "HTTP_PROXY" => Some("http://proxy:3128".to_string()),
            "CORBEL_PROVIDER_TOKEN" | "SECRET" => Some("leak".to_string()),
            _ => None,
        };
        let env = service_env(&intent, &service, &["HTTP_PROXY".to_string()], provider);
        let expected: BTreeMap<String, String> = [
            ("PATH", DEFAULT_PATH),
            ("HOME", "/home/p"),
            ("LANG", "C"),
            ("HTTP_PROXY", "http://proxy:3128"),
            ("OWN", "1"),
            ("PORT", "4000"),
            (TAG, "r1"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
        assert_eq!(env, expected);
    }
}
