//! Runtimes: how a fetched provider is built and started. One trait; the shell
//! runtime lives here, the Docker runtime in `docker.rs`.
//!
//! A started provider runs in its own process group so that stopping it reaches
//! everything it spawned: SIGTERM to the group, SIGKILL after a grace period.
//! A runtime never decides when to start, stop or restart: the supervisor does.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use super::binding::Binding;
use super::logs::{LogSink, LogStream};
use super::run_as::RunAs;
use super::sandbox::{Sandbox, SandboxError, SandboxPaths};

/// Lines of output quoted in a failure message.
const TAIL_LINES: usize = 20;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("build command `{command}` failed ({status}); last output:\n{tail}")]
    BuildFailed {
        command: String,
        status: String,
        tail: String,
    },
    #[error("build command `{command}` did not finish within {}s; last output:\n{tail}", after.as_secs())]
    BuildTimedOut {
        command: String,
        after: Duration,
        tail: String,
    },
    #[error("cannot start `{command}`: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("cannot create the build directory {}: {source}", dir.display())]
    BuildDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("docker: {0}")]
    Docker(String),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("building image {image} failed: {message}; last output:\n{tail}")]
    ImageBuildFailed {
        image: String,
        message: String,
        tail: String,
    },
}

/// Says how a build is going (a provider's status message).
pub type Progress = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

/// What a runtime needs to build or start one provider.
pub struct Job {
    pub source_dir: PathBuf,
    pub logs: LogSink,
    pub build_timeout: Duration,
    /// Where a long build reports its steps.
    pub progress: Progress,
    /// Where a shell build goes: a directory of this commit's under the
    /// provider's own (see [`build_env`]); `None` for a check of a local
    /// directory, which builds as its owner would by hand.
    pub build_dir: Option<PathBuf>,
    /// What the started provider may touch (see `sandbox.rs`); `None` runs
    /// it unconfined.
    pub sandbox: Option<SandboxPaths>,
    /// What its shell build may touch (`SandboxPaths::for_build`); `None`
    /// builds unconfined (sandboxing off, or a check of a local directory).
    pub build_sandbox: Option<SandboxPaths>,
    /// The user it runs as (`runAs`); `None`: the server's. Its build runs
    /// as the server's user, confined.
    pub run_as: Option<RunAs>,
}

/// The variable naming a shell provider's build directory.
pub const BUILD_DIR_VAR: &str = "CORBEL_BUILD_DIR";

/// The variables naming a shell provider's build directory `dir`:
/// `CORBEL_BUILD_DIR`, one directory per commit, so that building a new
/// commit never overwrites the binary a running provider was started from,
/// and a restart at the same commit finds its build done. A Cargo build goes
/// there too (`CARGO_TARGET_DIR`), unless the server's own environment names
/// a target directory to share (a clone's, whose compiled crates the build
/// reuses).
fn build_env(dir: &Path) -> Vec<(String, String)> {
    let dir = dir.display().to_string();
    let mut env = vec![(BUILD_DIR_VAR.to_owned(), dir.clone())];
    if std::env::var_os("CARGO_TARGET_DIR").is_none() {
        env.push(("CARGO_TARGET_DIR".to_owned(), dir));
    }
    env
}

/// Marks the build directory `current` as just used, and removes the other
/// commits' beside it but the most recently used one (a step back to the
/// previous commit is quick).
async fn prune_builds(current: &Path) {
    let (Some(builds), Some(name)) = (current.parent(), current.file_name()) else {
        return;
    };
    let touched = {
        let current = current.to_owned();
        tokio::task::spawn_blocking(move || {
            std::fs::File::open(&current)?.set_modified(std::time::SystemTime::now())
        })
        .await
    };
    if let Ok(Err(e)) = touched {
        tracing::warn!(error = %e, "cannot mark the build directory as used");
    }
    let Ok(mut entries) = tokio::fs::read_dir(builds).await else {
        return;
    };
    let mut others = Vec::new();
    while let Ok(Some(entry)) = entries.next_entry().await {
        if entry.file_name() == name {
            continue;
        }
        let used = entry.metadata().await.and_then(|m| m.modified()).ok();
        others.push((used, entry.path()));
    }
    others.sort();
    others.pop(); // the newest of the others stays
    for (_, dir) in others {
        if let Err(e) = tokio::fs::remove_dir_all(&dir).await {
            tracing::warn!(path = %dir.display(), error = %e, "cannot remove an old build");
        }
    }
}

/// How a provider is built and run, from its `corbel-provider.yaml`.
#[async_trait::async_trait]
pub trait Runtime: Send + Sync {
    async fn build(&self, job: &Job) -> Result<(), RuntimeError>;
    /// Starts the provider with `env` added to its environment.
    async fn start(
        &self,
        job: &Job,
        env: &[(String, String)],
    ) -> Result<Box<dyn Running>, RuntimeError>;
}

/// A started provider.
#[async_trait::async_trait]
pub trait Running: Send {
    /// How the registry recognises this process when it registers with its
    /// launch's token (see `binding.rs`); `None` if this runtime cannot tell.
    fn binding(&self) -> Option<Binding>;
    /// Resolves when it exits, saying how. Cancel-safe.
    async fn wait(&mut self) -> String;
    /// Stops it: a polite signal, then a forced one after `grace`.
    async fn stop(&mut self, grace: Duration);
}

/// `shell.build` and `shell.run`, through `sh -c` in the source directory.
pub struct ShellRuntime {
    pub build: Option<String>,
    pub run: String,
}

#[async_trait::async_trait]
impl Runtime for ShellRuntime {
    async fn build(&self, job: &Job) -> Result<(), RuntimeError> {
        if let Some(dir) = &job.build_dir {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|source| RuntimeError::BuildDir {
                    dir: dir.clone(),
                    source,
                })?;
        }
        let Some(command) = self.build.as_deref().filter(|c| !c.trim().is_empty()) else {
            return Ok(());
        };
        job.logs
            .line(LogStream::Corbel, &format!("building: {command}"));
        let mut env = job.build_dir.as_deref().map(build_env).unwrap_or_default();
        let sandbox = match &job.build_sandbox {
            Some(paths) => confined(paths).await?,
            None => None,
        };
        // A confined build's temporary files go to a directory of its own
        // (the system's may hold the data directory, then closed to it).
        let tmp = job
            .build_dir
            .as_deref()
            .filter(|_| sandbox.is_some())
            .map(|dir| dir.join("tmp"));
        if let Some(tmp) = &tmp {
            tokio::fs::create_dir_all(tmp)
                .await
                .map_err(|source| RuntimeError::BuildDir {
                    dir: tmp.clone(),
                    source,
                })?;
            env.push(("TMPDIR".to_owned(), tmp.display().to_string()));
        }
        let mut child = shell(command, &job.source_dir, &env, sandbox, None)
            .spawn()
            .map_err(|source| RuntimeError::Spawn {
                command: command.to_owned(),
                source,
            })?;
        let readers = capture(&mut child, &job.logs, LogStream::Build, LogStream::Build);
        let mut process = Process { child, readers };
        let ended = tokio::time::timeout(job.build_timeout, process.child.wait()).await;
        if let Some(tmp) = &tmp {
            let _ = tokio::fs::remove_dir_all(tmp).await;
        }
        match ended {
            Ok(Ok(status)) => {
                process.drain().await;
                if status.success() {
                    if let Some(dir) = &job.build_dir {
                        prune_builds(dir).await;
                    }
                    Ok(())
                } else {
                    Err(RuntimeError::BuildFailed {
                        command: command.to_owned(),
                        status: describe(status),
                        tail: job.logs.tail(TAIL_LINES),
                    })
                }
            }
            Ok(Err(e)) => Err(RuntimeError::BuildFailed {
                command: command.to_owned(),
                status: format!("cannot wait for it: {e}"),
                tail: job.logs.tail(TAIL_LINES),
            }),
            Err(_) => {
                process.stop(Duration::from_secs(2)).await;
                Err(RuntimeError::BuildTimedOut {
                    command: command.to_owned(),
                    after: job.build_timeout,
                    tail: job.logs.tail(TAIL_LINES),
                })
            }
        }
    }

    async fn start(
        &self,
        job: &Job,
        env: &[(String, String)],
    ) -> Result<Box<dyn Running>, RuntimeError> {
        job.logs
            .line(LogStream::Corbel, &format!("starting: {}", self.run));
        let mut env = env.to_vec();
        env.extend(job.build_dir.as_deref().map(build_env).unwrap_or_default());
        let sandbox = match &job.sandbox {
            Some(paths) => confined(paths).await?,
            None => None,
        };
        let mut child = shell(
            &self.run,
            &job.source_dir,
            &env,
            sandbox,
            job.run_as.as_ref(),
        )
        .spawn()
        .map_err(|source| RuntimeError::Spawn {
            command: self.run.clone(),
            source,
        })?;
        let readers = capture(&mut child, &job.logs, LogStream::Stdout, LogStream::Stderr);
        Ok(Box::new(Process { child, readers }))
    }
}

/// The ruleset for `paths`, made off the async workers (it opens every
/// path, and walks directories for a build's).
async fn confined(paths: &SandboxPaths) -> Result<Option<Sandbox>, RuntimeError> {
    let paths = paths.clone();
    match tokio::task::spawn_blocking(move || Sandbox::new(&paths)).await {
        Ok(made) => Ok(made?),
        Err(e) => Err(RuntimeError::Spawn {
            command: "the sandbox".to_owned(),
            source: std::io::Error::other(e),
        }),
    }
}

/// A child in its own process group, with its output being read.
struct Process {
    child: Child,
    readers: Vec<JoinHandle<()>>,
}

impl Process {
    fn signal_group(&self, signal: Signal) {
        if let Some(pid) = self.child.id() {
            // The group id is the child's pid (setsid). A group that is
            // already gone is fine.
            let _ = killpg(Pid::from_raw(pid as i32), signal);
        }
    }

    /// Waits until both output readers reach end of file, so the last lines are
    /// in the log before anyone quotes it.
    async fn drain(&mut self) {
        for reader in self.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
        }
    }
}

#[async_trait::async_trait]
impl Running for Process {
    fn binding(&self) -> Option<Binding> {
        // It leads its own session and group (setsid): the group id is its pid.
        self.child.id().map(|pid| Binding::ProcessGroup(pid as i32))
    }

    async fn wait(&mut self) -> String {
        let status = self.child.wait().await;
        self.drain().await;
        match status {
            Ok(status) => describe(status),
            Err(e) => format!("lost track of it: {e}"),
        }
    }

    async fn stop(&mut self, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            // The leader is gone, but what it spawned may linger in the group.
            self.signal_group(Signal::SIGKILL);
            return;
        }
        self.signal_group(Signal::SIGTERM);
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                grace_ms = grace.as_millis() as u64,
                "provider ignored SIGTERM; killing its process group"
            );
        }
        self.signal_group(Signal::SIGKILL);
        let _ = self.child.wait().await;
        self.drain().await;
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Never leave a provider behind when its handle goes (a panic, an
        // aborted task): it would hold its socket and keep running unseen.
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal_group(Signal::SIGKILL);
        }
    }
}

/// `sh -c command` in `dir`, in a new session (so a new process group whose id
/// is its pid), with Corbel's own settings (`CORBEL_*`, which may hold secrets)
/// removed from the inherited environment. The session is what binds a
/// registration to this process (see `binding.rs`): only what runs in it can
/// join its group. Under `sandbox`, it starts confined (see `sandbox.rs`);
/// with `user`, as that user, without supplementary groups.
fn shell(
    command: &str,
    dir: &Path,
    env: &[(String, String)],
    mut sandbox: Option<Sandbox>,
    user: Option<&RunAs>,
) -> Command {
    let mut cmd = Command::new("/bin/sh");
    if let Some(user) = user {
        // The standard library drops the supplementary groups with it.
        cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
    }
    cmd.arg("-c")
        .arg(command)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setsid is async-signal-safe and touches no memory of the
    // parent; applying the ruleset made before the fork allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            match &mut sandbox {
                Some(sandbox) => sandbox.apply_in_child(),
                None => Ok(()),
            }
        });
    }
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("CORBEL_") {
            cmd.env_remove(key);
        }
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd
}

fn capture(
    child: &mut Child,
    logs: &LogSink,
    out: LogStream,
    err: LogStream,
) -> Vec<JoinHandle<()>> {
    let mut readers = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        readers.push(tokio::spawn(pump(stdout, logs.clone(), out)));
    }
    if let Some(stderr) = child.stderr.take() {
        readers.push(tokio::spawn(pump(stderr, logs.clone(), err)));
    }
    readers
}

async fn pump(from: impl AsyncRead + Unpin, logs: LogSink, stream: LogStream) {
    let mut lines = BufReader::new(from).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => logs.line(stream, &line),
            Ok(None) => break,
            // Not UTF-8, or the pipe broke: note it and stop reading.
            Err(e) => {
                logs.line(LogStream::Corbel, &format!("output unreadable: {e}"));
                break;
            }
        }
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => match Signal::try_from(signal) {
            Ok(s) => format!("killed by {s}"),
            Err(_) => format!("killed by signal {signal}"),
        },
        (None, None) => status.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    #[tokio::test]
    async fn old_builds_go_but_the_current_and_the_previous_one() {
        let builds = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        for (commit, age) in [("aaa", 300), ("bbb", 200), ("ccc", 100), ("ddd", 400)] {
            let dir = builds.path().join(commit);
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("binary"), commit).unwrap();
            let used = now - Duration::from_secs(age);
            std::fs::File::open(&dir)
                .unwrap()
                .set_modified(used)
                .unwrap();
        }
        prune_builds(&builds.path().join("ddd")).await;
        let mut left: Vec<String> = std::fs::read_dir(builds.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["ccc", "ddd"],
            "the current build and the newest other"
        );
        let dir = builds.path().join("ddd");
        let env = build_env(&dir);
        assert!(env.contains(&(BUILD_DIR_VAR.to_owned(), dir.display().to_string())));
    }
}
