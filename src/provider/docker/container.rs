//! Running a provider's container: at most one per provider (what an earlier
//! launch left is removed first), its own socket directory and the state
//! directory mounted at the same paths, bound to its pid namespace when this
//! server can see it, and followed until it exits: its output into the log,
//! then how it ended; removed once read, or when its handle goes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType};
use bollard::query_parameters::{
    CreateContainerOptions, LogsOptions, StopContainerOptions, WaitContainerOptions,
};
use futures_util::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::super::binding::{Binding, pid_namespace};
use super::super::logs::{LogSink, LogStream};
use super::super::runtime::{Job, Running, RuntimeError};
use super::super::settings::{MAX_SOCKET_PATH, own_socket_dir};
use super::DockerRuntime;
use super::engine::{Engine, engine_message, status};

/// How long a container's last output may take to arrive after it exited.
const DRAIN: Duration = Duration::from_secs(2);
/// A line longer than this is logged in pieces.
const MAX_PENDING: usize = 16 * 1024;

impl DockerRuntime {
    pub(super) async fn start_container(
        &self,
        job: &Job,
        env: &[(String, String)],
    ) -> Result<Box<dyn Running>, RuntimeError> {
        let engine = &self.engine;
        let client = engine.client()?;
        self.remove_leftovers(job).await?;
        let sockets = self.own_socket_dir().await?;
        let image = self.image();
        let name = format!(
            "corbel-{}-{}",
            self.provider,
            &Uuid::new_v4().simple().to_string()[..8]
        );
        let mut body = self.container_body(&image, &sockets, env);
        // `runAs`: the container's processes take the user's ids, and find
        // their bound directories theirs.
        body.user = job
            .run_as
            .as_ref()
            .map(|user| format!("{}:{}", user.uid, user.gid));
        let options = CreateContainerOptions {
            name: Some(name.clone()),
            ..Default::default()
        };
        let created = engine
            .call(
                "creating the container",
                client.create_container(Some(options), body),
            )
            .await?;
        let id = created.id;
        let started = engine
            .call("starting the container", client.start_container(&id, None))
            .await;
        if let Err(e) = started {
            let _ = engine.remove(&id).await;
            return Err(e.into());
        }
        let binding = match self.bind(&client, &id).await {
            Ok(ns) => {
                job.logs.line(
                    LogStream::Corbel,
                    &format!("started container {name} ({}) from {image}", short_id(&id)),
                );
                Some(Binding::PidNamespace(ns))
            }
            Err(why) => {
                job.logs.line(
                    LogStream::Corbel,
                    &format!(
                        "started container {name} ({}) from {image}; its registration is not bound to it: {why}",
                        short_id(&id)
                    ),
                );
                None
            }
        };
        let (exited, watched) = watch::channel(None);
        let follower = tokio::spawn(follow(
            engine.clone(),
            client,
            id.clone(),
            job.logs.clone(),
            exited,
        ));
        Ok(Box::new(Container {
            engine: engine.clone(),
            id,
            binding,
            exited: watched,
            follower,
        }))
    }

    /// One container per provider: what an earlier launch left goes first.
    async fn remove_leftovers(&self, job: &Job) -> Result<(), RuntimeError> {
        for (id, _) in self.engine.containers(Some(self.provider)).await? {
            job.logs.line(
                LogStream::Corbel,
                &format!(
                    "removing container {} left by an earlier launch",
                    short_id(&id)
                ),
            );
            self.engine.remove(&id).await?;
        }
        Ok(())
    }

    /// The container's own socket directory (`settings::own_socket_dir`),
    /// made with the state directory (a bind of a missing path fails); refused
    /// when its socket's path would be too long for a unix socket.
    async fn own_socket_dir(&self) -> Result<PathBuf, RuntimeError> {
        let sockets = own_socket_dir(&self.socket_dir, self.provider);
        let socket = sockets.join(format!("{}.sock", self.provider));
        let len = socket.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(RuntimeError::Docker(format!(
                "the provider's socket path {} is {len} bytes long; unix sockets allow \
                 {MAX_SOCKET_PATH}: set XDG_RUNTIME_DIR to a shorter directory",
                socket.display()
            )));
        }
        for dir in [&sockets, &self.state_dir] {
            tokio::fs::create_dir_all(dir).await.map_err(|e| {
                RuntimeError::Docker(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        Ok(sockets)
    }

    /// The container: the image, the environment with its own socket
    /// directory, this server's labels, the mounts and the limits.
    fn container_body(
        &self,
        image: &str,
        sockets: &Path,
        env: &[(String, String)],
    ) -> ContainerCreateBody {
        let env = env.iter().map(|(k, v)| match k.as_str() {
            "CORBEL_SOCKET_DIR" => format!("{k}={}", sockets.display()),
            _ => format!("{k}={v}"),
        });
        let mounts = [
            self.registry_socket.as_path(),
            sockets,
            self.state_dir.as_path(),
        ]
        .into_iter()
        .map(|path| Mount {
            target: Some(path.display().to_string()),
            source: Some(path.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(false),
            ..Default::default()
        })
        .collect();
        ContainerCreateBody {
            image: Some(image.to_owned()),
            cmd: self.spec.command.clone(),
            env: Some(env.collect()),
            labels: Some(self.engine.labels(self.provider)),
            host_config: Some(HostConfig {
                mounts: Some(mounts),
                memory: self.spec.memory,
                nano_cpus: self.spec.nano_cpus,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The pid namespace the started container `id` runs in, or why its
    /// launch cannot be bound to it.
    async fn bind(&self, client: &Docker, id: &str) -> Result<u64, String> {
        match self
            .engine
            .call(
                "inspecting the container",
                client.inspect_container(id, None),
            )
            .await
        {
            Ok(inspected) => {
                let pid = inspected.state.and_then(|s| s.pid).unwrap_or(0);
                container_namespace(id, pid)
            }
            Err(e) => Err(RuntimeError::from(e).to_string()),
        }
    }
}

/// The pid namespace of container `id`'s first process `pid`, if this server
/// sees that process as the container's (its cgroup names the container).
fn container_namespace(id: &str, pid: i64) -> Result<u64, String> {
    if pid <= 0 {
        return Err("the engine reports no process for it".to_owned());
    }
    let pid = i32::try_from(pid).map_err(|_| format!("pid {pid} is out of range"))?;
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    if !cgroup.contains(id) {
        return Err(format!(
            "the engine's pid {pid} is not the container's here (a remote engine, or another pid namespace)"
        ));
    }
    let ns = pid_namespace(pid).ok_or_else(|| format!("cannot read pid {pid}'s namespace"))?;
    if pid_namespace(std::process::id() as i32) == Some(ns) {
        return Err("the container shares this server's pid namespace".to_owned());
    }
    Ok(ns)
}

fn short_id(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// A started container, followed in the background until it exits.
struct Container {
    engine: Arc<Engine>,
    id: String,
    binding: Option<Binding>,
    /// Set once the container has exited, its output read and it removed:
    /// how it ended.
    exited: watch::Receiver<Option<String>>,
    follower: JoinHandle<()>,
}

#[async_trait::async_trait]
impl Running for Container {
    fn binding(&self) -> Option<Binding> {
        self.binding
    }

    async fn wait(&mut self) -> String {
        match self.exited.wait_for(Option::is_some).await {
            Ok(ended) => ended.clone().unwrap_or_default(),
            Err(_) => "lost track of the container".to_owned(),
        }
    }

    async fn stop(&mut self, grace: Duration) {
        if self.exited.borrow().is_none() {
            let seconds = grace.as_secs_f64().ceil() as i32;
            let options = StopContainerOptions {
                t: Some(seconds),
                ..Default::default()
            };
            match self.engine.client() {
                Ok(client) => {
                    let stopping = client.stop_container(&self.id, Some(options));
                    let bound = grace + self.engine.call_timeout;
                    match tokio::time::timeout(bound, stopping).await {
                        Ok(Ok(())) => {}
                        // Not running (304) or gone (404): nothing to stop.
                        Ok(Err(e)) if matches!(status(&e), Some(304 | 404)) => {}
                        Ok(Err(e)) => tracing::warn!(
                            container = %self.id,
                            error = %engine_message(&e),
                            "cannot stop the provider's container; removing it by force"
                        ),
                        Err(_) => tracing::warn!(
                            container = %self.id,
                            "the engine did not stop the provider's container in time; removing it by force"
                        ),
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot stop the provider's container"),
            }
            // The follower reads the last output and removes it.
            let _ = tokio::time::timeout(
                self.engine.call_timeout,
                self.exited.wait_for(Option::is_some),
            )
            .await;
        }
        // Removed even if the follower could not.
        if let Err(e) = self.engine.remove(&self.id).await {
            tracing::warn!(container = %self.id, error = %e, "cannot remove the provider's container");
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        // Never leave a container behind when its handle goes (a panic, an
        // aborted task); a server killed outright leaves it to the next
        // start's sweep.
        if self.exited.borrow().is_none() {
            self.follower.abort();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let engine = self.engine.clone();
                let id = self.id.clone();
                runtime.spawn(async move {
                    let _ = engine.remove(&id).await;
                });
            }
        }
    }
}

/// Follows a container: its output into the log until it exits, then how it
/// exited; removes it and reports.
async fn follow(
    engine: Arc<Engine>,
    client: Docker,
    id: String,
    logs: LogSink,
    exited: watch::Sender<Option<String>>,
) {
    let mut pump = tokio::spawn(pump(client.clone(), id.clone(), logs.clone()));
    let ended = wait_exit(&engine, &client, &id).await;
    if tokio::time::timeout(DRAIN, &mut pump).await.is_err() {
        pump.abort();
    }
    if let Err(e) = engine.remove(&id).await {
        logs.line(
            LogStream::Corbel,
            &format!("cannot remove container {}: {e}", short_id(&id)),
        );
    }
    let ended = format!("container {} {ended}", short_id(&id));
    logs.line(LogStream::Corbel, &ended);
    exited.send_replace(Some(ended));
}

/// Waits until the container is not running; how it ended. A lost connection
/// to the engine is retried: the container is still there.
async fn wait_exit(engine: &Engine, client: &Docker, id: &str) -> String {
    loop {
        let options = WaitContainerOptions {
            condition: "not-running".to_owned(),
        };
        let mut waiting = std::pin::pin!(client.wait_container(id, Some(options)));
        let code = match waiting.next().await {
            Some(Ok(answer)) => Some(answer.status_code),
            // bollard reports a non-zero exit as an error with its code.
            Some(Err(DockerError::DockerContainerWaitError { code, .. })) => Some(code),
            Some(Err(e)) if status(&e) == Some(404) => {
                return "is gone (removed outside Corbel)".to_owned();
            }
            Some(Err(e)) => {
                tracing::debug!(container = %id, error = %e, "waiting for the container again");
                None
            }
            None => None,
        };
        match engine
            .call(
                "inspecting the container",
                client.inspect_container(id, None),
            )
            .await
        {
            Ok(inspected) => {
                let state = inspected.state.unwrap_or_default();
                if state.running == Some(true) {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                let code = state.exit_code.or(code).unwrap_or(-1);
                let oom = if state.oom_killed == Some(true) {
                    ", out of memory"
                } else {
                    ""
                };
                return format!("exited with status {code}{oom}");
            }
            Err(e) if e.status() == Some(404) => {
                return "is gone (removed outside Corbel)".to_owned();
            }
            Err(_) if code.is_some() => {
                return format!("exited with status {}", code.unwrap_or(-1));
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// The container's stdout and stderr, line by line, into the log.
async fn pump(client: Docker, id: String, logs: LogSink) {
    let options = LogsOptions {
        follow: true,
        stdout: true,
        stderr: true,
        ..Default::default()
    };
    let mut stream = std::pin::pin!(client.logs(&id, Some(options)));
    let mut out = String::new();
    let mut err = String::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(bollard::container::LogOutput::StdOut { message }) => {
                lines(&mut out, &message, &logs, LogStream::Stdout);
            }
            Ok(bollard::container::LogOutput::StdErr { message }) => {
                lines(&mut err, &message, &logs, LogStream::Stderr);
            }
            Ok(_) => {}
            Err(e) => {
                logs.line(
                    LogStream::Corbel,
                    &format!("container output unreadable: {}", engine_message(&e)),
                );
                break;
            }
        }
    }
    for (rest, stream) in [(out, LogStream::Stdout), (err, LogStream::Stderr)] {
        if !rest.is_empty() {
            logs.line(stream, &rest);
        }
    }
}

/// Adds `bytes` to `pending` and logs each whole line.
fn lines(pending: &mut String, bytes: &[u8], logs: &LogSink, stream: LogStream) {
    pending.push_str(&String::from_utf8_lossy(bytes));
    while let Some(end) = pending.find('\n') {
        let line: String = pending.drain(..=end).collect();
        logs.line(stream, line.trim_end_matches(['\n', '\r']));
    }
    if pending.len() > MAX_PENDING {
        logs.line(stream, pending);
        pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_lines_wait_for_their_end() {
        let bus = crate::events::Bus::new(16, tokio_util::sync::CancellationToken::new());
        let ring = Arc::new(std::sync::Mutex::new(
            super::super::super::logs::LogRing::new(10),
        ));
        let logs = LogSink::new(Uuid::nil(), ring.clone(), bus);
        let mut pending = String::new();
        lines(&mut pending, b"one\ntw", &logs, LogStream::Stdout);
        lines(&mut pending, b"o\r\n", &logs, LogStream::Stdout);
        let got: Vec<String> = ring
            .lock()
            .unwrap()
            .last(10)
            .into_iter()
            .map(|l| l.line)
            .collect();
        assert_eq!(got, ["one", "two"]);
        assert!(pending.is_empty());
    }
}
