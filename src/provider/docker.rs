//! The Docker runtime: a provider built as an image from its checkout and run
//! as a container, through bollard, behind the same `Runtime`/`Running` traits
//! as the shell runtime.
//!
//! - **Images** are tagged `corbel-provider-<provider id>:<commit>`, so two
//!   providers (or two commits) never collide, and labelled with a digest of
//!   what else the build read (`dockerfile`, `context`, `build_args`, the
//!   provider's `path`; no label names the commit, since the engine adds each
//!   label as a build step, and one that changed with every commit would make
//!   a rebuild of unchanged files miss its cache). A build whose tag exists
//!   with the same digest is a cache hit: nothing is sent to the engine.
//!   Otherwise the context is sent as a tar (symlinks kept as links, never
//!   followed out of the checkout; `.git` left out) and the engine's output
//!   goes to the provider's log, each step to its status message. A provider
//!   keeps one image: a new build removes its images of other commits, and
//!   deleting the provider removes the last.
//! - **Containers** carry `io.corbel.instance` (this server's `instanceId`),
//!   `io.corbel.provider` (the provider id) and `io.corbel.boot` (this server
//!   process). They mount, at the same paths, the registry socket, a socket
//!   directory of their own (`<socket dir>/<id>`, their `CORBEL_SOCKET_DIR`:
//!   never the other providers' sockets) and the provider's state directory,
//!   so registration is the shell runtime's. No restart policy: the supervisor
//!   restarts with its backoff. A container that exits is removed once its
//!   status and last output are read; stopping is the engine's stop (SIGTERM,
//!   SIGKILL after the grace), then removal.
//! - **No orphans**: a provider has at most one container, so starting one
//!   first removes whatever this instance left of that provider; and at server
//!   start, [`Engine::sweep`] removes this instance's containers of any other
//!   boot (a crashed server's), before any provider loads. This holds with
//!   replicas too: only the leader runs providers, and it starts (and
//!   sweeps) only once it holds the server lock, taken over from a leader
//!   whose lease has run out, which stopped itself before that.
//! - **Binding**: the launch is bound to the container's pid namespace (see
//!   `binding.rs`), when the engine's `State.Pid` is a process this server can
//!   see and its cgroup names the container; otherwise (a remote engine,
//!   Corbel itself in a container) the launch is unbound and the log says so.
//!
//! Every engine call has a deadline (`docker_call_timeout_ms`; the build has
//! `build_timeout_seconds`), except following a container's output and waiting
//! for it to exit, which last as long as the container.

use std::collections::HashMap;
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType};
use bollard::query_parameters::{
    BuildImageOptions, CreateContainerOptions, ListContainersOptions, ListImagesOptions,
    LogsOptions, RemoveContainerOptions, RemoveImageOptions, StopContainerOptions,
    WaitContainerOptions,
};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::binding::{Binding, pid_namespace};
use super::logs::{LogSink, LogStream};
use super::metadata::DockerSpec;
use super::registry::MAX_SOCKET_PATH;
use super::runtime::{Job, Running, Runtime, RuntimeError};

/// This server's `instanceId`, on every container it starts.
pub const LABEL_INSTANCE: &str = "io.corbel.instance";
/// The provider a container or image belongs to.
pub const LABEL_PROVIDER: &str = "io.corbel.provider";
/// The server process that started a container: one of another boot of the
/// same instance is an orphan.
pub const LABEL_BOOT: &str = "io.corbel.boot";
/// The digest of an image's build inputs besides the commit (its tag).
pub const LABEL_BUILD: &str = "io.corbel.build";

/// Lines of output quoted in a failure message.
const TAIL_LINES: usize = 20;
/// How long a container's last output may take to arrive after it exited.
const DRAIN: Duration = Duration::from_secs(2);
/// A line longer than this is logged in pieces.
const MAX_PENDING: usize = 16 * 1024;
/// bollard's own deadline on a request's answer: far off, since every call
/// here has its own (bollard's default, 2 minutes, would cut a build whose
/// context takes longer to send).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// Where a Dockerfile from outside the context goes in the context's tar.
const OUTSIDE_DOCKERFILE: &str = ".corbel.Dockerfile";

/// The Docker engine as this server uses it: one client, made at first use,
/// and this server's labels.
pub struct Engine {
    host: Option<String>,
    client: OnceLock<Result<Docker, String>>,
    instance: String,
    boot: String,
    call_timeout: Duration,
}

impl Engine {
    pub fn new(host: Option<String>, instance: String, call_timeout: Duration) -> Self {
        Self {
            host,
            client: OnceLock::new(),
            instance,
            boot: Uuid::new_v4().simple().to_string(),
            call_timeout,
        }
    }

    /// The client: `docker_host` if set, else bollard's defaults (`DOCKER_HOST`,
    /// `DOCKER_TLS_VERIFY`, `DOCKER_CERT_PATH`, else the local socket).
    fn client(&self) -> Result<Docker, RuntimeError> {
        let made = self.client.get_or_init(|| {
            let client = match &self.host {
                Some(host) => Docker::connect_with_host(host),
                None => Docker::connect_with_defaults(),
            };
            client
                .map(|c| c.with_timeout(CLIENT_TIMEOUT))
                .map_err(|e| format!("cannot reach the Docker engine: {e}"))
        });
        made.clone().map_err(RuntimeError::Docker)
    }

    /// `call` under the engine deadline, its error saying `what` failed.
    async fn call<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, DockerError>>,
    ) -> Result<T, CallError> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(CallError::Engine(what.to_owned(), e)),
            Err(_) => Err(CallError::TimedOut(what.to_owned(), self.call_timeout)),
        }
    }

    fn labels(&self, provider: Uuid) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_INSTANCE.to_owned(), self.instance.clone()),
            (LABEL_PROVIDER.to_owned(), provider.to_string()),
            (LABEL_BOOT.to_owned(), self.boot.clone()),
        ])
    }

    /// Containers of this instance (of `provider` if given), running or not:
    /// their ids and boots.
    async fn containers(
        &self,
        provider: Option<Uuid>,
    ) -> Result<Vec<(String, String)>, RuntimeError> {
        let client = self.client()?;
        let mut labels = vec![format!("{LABEL_INSTANCE}={}", self.instance)];
        if let Some(provider) = provider {
            labels.push(format!("{LABEL_PROVIDER}={provider}"));
        }
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([("label".to_owned(), labels)])),
            ..Default::default()
        };
        let listed = self
            .call("listing containers", client.list_containers(Some(options)))
            .await?;
        Ok(listed
            .into_iter()
            .filter_map(|c| {
                let boot = c.labels.as_ref()?.get(LABEL_BOOT).cloned();
                Some((c.id?, boot.unwrap_or_default()))
            })
            .collect())
    }

    /// Removes this instance's containers that another server process started
    /// (a crashed one's): at start, before any provider loads. How many.
    pub async fn sweep(&self) -> Result<usize, RuntimeError> {
        let mut removed = 0;
        for (id, boot) in self.containers(None).await? {
            if boot != self.boot {
                self.remove(&id).await?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes this instance's images of `provider` but the one tagged `keep`:
    /// a provider keeps the image of the commit it runs (the cache of its next
    /// load), and none once it is deleted. How many tags went. A failure is logged,
    /// not returned: it costs disk, not correctness (an image a container
    /// still uses stays).
    pub async fn prune_images(&self, provider: Uuid, keep: Option<&str>) -> usize {
        let Ok(client) = self.client() else { return 0 };
        let labels = vec![
            format!("{LABEL_INSTANCE}={}", self.instance),
            format!("{LABEL_PROVIDER}={provider}"),
        ];
        let options = ListImagesOptions {
            filters: Some(HashMap::from([("label".to_owned(), labels)])),
            ..Default::default()
        };
        let images = match self
            .call("listing images", client.list_images(Some(options)))
            .await
        {
            Ok(images) => images,
            Err(e) => {
                tracing::warn!(provider.id = %provider, error = %RuntimeError::from(e), "cannot list the provider's images");
                return 0;
            }
        };
        // By tag: an unchanged rebuild is the same image under a new tag, and
        // removing an image's last tag removes the image.
        let mut removed = 0;
        for image in images {
            let mut names: Vec<&str> = image
                .repo_tags
                .iter()
                .map(String::as_str)
                .filter(|t| Some(*t) != keep && *t != "<none>:<none>")
                .collect();
            if image.repo_tags.is_empty() {
                names.push(&image.id);
            }
            for name in names {
                let removing = client.remove_image(name, None::<RemoveImageOptions>, None);
                match self.call("removing an image", removing).await {
                    Ok(_) => removed += 1,
                    Err(e) if e.status() == Some(404) => {}
                    Err(e) => tracing::warn!(
                        provider.id = %provider,
                        error = %RuntimeError::from(e),
                        "cannot remove one of the provider's images"
                    ),
                }
            }
        }
        removed
    }

    /// Removes a container, running or not; one already gone is fine.
    async fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        let client = self.client()?;
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            ..Default::default()
        };
        match self
            .call(
                "removing a container",
                client.remove_container(id, Some(options)),
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if e.status() == Some(404) => Ok(()),
            // Removal already under way (the exit follower's): wait for it.
            Err(e) if e.status() == Some(409) => {
                let deadline = tokio::time::Instant::now() + self.call_timeout;
                loop {
                    match client.inspect_container(id, None).await {
                        Err(e) if status(&e) == Some(404) => return Ok(()),
                        _ if tokio::time::Instant::now() > deadline => {
                            return Err(CallError::TimedOut(
                                "removing a container".into(),
                                self.call_timeout,
                            )
                            .into());
                        }
                        _ => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// An engine call that failed.
#[derive(Debug)]
enum CallError {
    Engine(String, DockerError),
    TimedOut(String, Duration),
}

impl CallError {
    fn status(&self) -> Option<u16> {
        match self {
            CallError::Engine(_, e) => status(e),
            CallError::TimedOut(..) => None,
        }
    }
}

impl From<CallError> for RuntimeError {
    fn from(e: CallError) -> Self {
        RuntimeError::Docker(match e {
            CallError::Engine(what, e) => format!("{what}: {}", engine_message(&e)),
            CallError::TimedOut(what, after) => {
                format!("{what}: no answer within {} ms", after.as_millis())
            }
        })
    }
}

fn status(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// The engine's own message when it gave one.
fn engine_message(e: &DockerError) -> String {
    match e {
        DockerError::DockerResponseServerError { message, .. } => message.trim().to_owned(),
        DockerError::DockerStreamError { error } => error.trim().to_owned(),
        e => e.to_string(),
    }
}

/// A provider's `docker:` section, for one provider at one commit.
pub struct DockerRuntime {
    pub engine: Arc<Engine>,
    pub spec: DockerSpec,
    pub provider: Uuid,
    /// The checkout's commit: the image's tag.
    pub commit: String,
    /// The provider's `path` in its repository (part of the build digest).
    pub path: String,
    /// Mounted at the same path in the container.
    pub registry_socket: PathBuf,
    /// The server's socket directory. The container gets only a directory of
    /// its own in it, `<socket dir>/<provider id>`, as its `CORBEL_SOCKET_DIR`:
    /// never the other providers' sockets, which it could otherwise call.
    pub socket_dir: PathBuf,
    /// The provider's state directory, mounted at the same path.
    pub state_dir: PathBuf,
}

impl DockerRuntime {
    /// `corbel-provider-<provider id>:<commit>`.
    pub fn image(&self) -> String {
        image_tag(self.provider, &self.commit)
    }

    /// What the build read besides the commit, as a short digest: a change of
    /// `path` or of the section (both outside the commit's tree for the
    /// engine) means a different image.
    fn build_digest(&self) -> String {
        let mut hash = Sha256::new();
        for part in [&self.path, &self.spec.dockerfile, &self.spec.context] {
            hash.update(part.as_bytes());
            hash.update([0]);
        }
        for (name, value) in &self.spec.build_args {
            hash.update(name.as_bytes());
            hash.update([1]);
            hash.update(value.as_bytes());
            hash.update([0]);
        }
        hex::encode(&hash.finalize()[..8])
    }
}

pub fn image_tag(provider: Uuid, commit: &str) -> String {
    format!("corbel-provider-{provider}:{commit}")
}

#[async_trait::async_trait]
impl Runtime for DockerRuntime {
    async fn build(&self, job: &Job) -> Result<(), RuntimeError> {
        let client = self.engine.client()?;
        let image = self.image();
        let digest = self.build_digest();
        let short = &self.commit[..self.commit.len().min(12)];
        match self
            .engine
            .call("inspecting the image", client.inspect_image(&image))
            .await
        {
            Ok(found) => {
                let built = found
                    .config
                    .and_then(|c| c.labels)
                    .and_then(|l| l.get(LABEL_BUILD).cloned());
                if built.as_deref() == Some(digest.as_str()) {
                    let note = format!(
                        "image {image} is already built from commit {short}: cache hit, not rebuilt"
                    );
                    job.logs.line(LogStream::Corbel, &note);
                    (job.progress)(&note);
                    return Ok(());
                }
            }
            Err(e) if e.status() == Some(404) => {}
            Err(e) => return Err(e.into()),
        }

        job.logs.line(
            LogStream::Corbel,
            &format!("building image {image} from commit {short}"),
        );
        let context = job.source_dir.clone();
        let spec = self.spec.clone();
        let (tar, dockerfile) = tokio::task::spawn_blocking(move || context_tar(&context, &spec))
            .await
            .map_err(|e| RuntimeError::Docker(format!("packing the build context: {e}")))?
            .map_err(|e| RuntimeError::Docker(format!("packing the build context: {e}")))?;
        let body = bollard::body_try_stream(tokio_util::io::ReaderStream::new(
            tokio::fs::File::from_std(tar),
        ));
        let labels = HashMap::from([
            (LABEL_INSTANCE.to_owned(), self.engine.instance.clone()),
            (LABEL_PROVIDER.to_owned(), self.provider.to_string()),
            (LABEL_BUILD.to_owned(), digest),
        ]);
        let options = BuildImageOptions {
            dockerfile,
            t: Some(image.clone()),
            rm: true,
            forcerm: true,
            buildargs: Some(self.spec.build_args.clone().into_iter().collect()),
            labels: Some(labels),
            ..Default::default()
        };
        let mut cached = 0;
        let mut steps = 0;
        let building = async {
            let mut stream = std::pin::pin!(client.build_image(options, None, Some(body)));
            while let Some(item) = stream.next().await {
                let info = item.map_err(|e| engine_message(&e))?;
                for line in info.stream.iter().flat_map(|s| s.lines()) {
                    let line = line.trim_end();
                    if line.is_empty() {
                        continue;
                    }
                    job.logs.line(LogStream::Build, line);
                    if line.starts_with("Step ") {
                        steps += 1;
                        (job.progress)(&format!("building image: {line}"));
                    } else if line.trim_start().starts_with("---> Using cache") {
                        cached += 1;
                    }
                }
                if let Some(status) = info.status.filter(|s| !s.trim().is_empty()) {
                    job.logs.line(LogStream::Build, status.trim_end());
                }
                if let Some(message) = info.error_detail.and_then(|d| d.message) {
                    return Err(message);
                }
            }
            Ok(())
        };
        match tokio::time::timeout(job.build_timeout, building).await {
            Ok(Ok(())) => {
                let how = if steps > 0 && cached == steps - 1 {
                    "every step from the engine's cache".to_owned()
                } else {
                    format!("{cached} of {steps} steps from the engine's cache")
                };
                job.logs
                    .line(LogStream::Corbel, &format!("built image {image} ({how})"));
                let pruned = self.engine.prune_images(self.provider, Some(&image)).await;
                if pruned > 0 {
                    job.logs.line(
                        LogStream::Corbel,
                        &format!("removed the images of {pruned} earlier commit(s)"),
                    );
                }
                Ok(())
            }
            Ok(Err(message)) => Err(RuntimeError::ImageBuildFailed {
                image,
                message,
                tail: job.logs.tail(TAIL_LINES),
            }),
            Err(_) => Err(RuntimeError::BuildTimedOut {
                command: format!("docker build of {image}"),
                after: job.build_timeout,
                tail: job.logs.tail(TAIL_LINES),
            }),
        }
    }

    async fn start(
        &self,
        job: &Job,
        env: &[(String, String)],
    ) -> Result<Box<dyn Running>, RuntimeError> {
        let engine = &self.engine;
        let client = engine.client()?;
        // One container per provider: what an earlier launch left goes first.
        for (id, _) in engine.containers(Some(self.provider)).await? {
            job.logs.line(
                LogStream::Corbel,
                &format!(
                    "removing container {} left by an earlier launch",
                    short_id(&id)
                ),
            );
            engine.remove(&id).await?;
        }
        let sockets = self.socket_dir.join(self.provider.to_string());
        let socket = sockets.join(format!("{}.sock", self.provider));
        let len = socket.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(RuntimeError::Docker(format!(
                "the provider's socket path {} is {len} bytes long; unix sockets allow \
                 {MAX_SOCKET_PATH}: choose a shorter --data-dir",
                socket.display()
            )));
        }
        for dir in [&sockets, &self.state_dir] {
            // A bind of a missing path fails.
            tokio::fs::create_dir_all(dir).await.map_err(|e| {
                RuntimeError::Docker(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        let env = env.iter().map(|(k, v)| match k.as_str() {
            "CORBEL_SOCKET_DIR" => format!("{k}={}", sockets.display()),
            _ => format!("{k}={v}"),
        });
        let image = self.image();
        let name = format!(
            "corbel-{}-{}",
            self.provider,
            &Uuid::new_v4().simple().to_string()[..8]
        );
        let mounts = [&self.registry_socket, &sockets, &self.state_dir]
            .into_iter()
            .map(|path| Mount {
                target: Some(path.display().to_string()),
                source: Some(path.display().to_string()),
                typ: Some(MountType::BIND),
                read_only: Some(false),
                ..Default::default()
            })
            .collect();
        let body = ContainerCreateBody {
            image: Some(image.clone()),
            cmd: self.spec.command.clone(),
            env: Some(env.collect()),
            labels: Some(engine.labels(self.provider)),
            host_config: Some(HostConfig {
                mounts: Some(mounts),
                memory: self.spec.memory,
                nano_cpus: self.spec.nano_cpus,
                ..Default::default()
            }),
            ..Default::default()
        };
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
        let binding = match engine
            .call(
                "inspecting the container",
                client.inspect_container(&id, None),
            )
            .await
        {
            Ok(inspected) => {
                let pid = inspected.state.and_then(|s| s.pid).unwrap_or(0);
                container_namespace(&id, pid)
            }
            Err(e) => Err(RuntimeError::from(e).to_string()),
        };
        let binding = match binding {
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

/// The build context as a tar in an unnamed temporary file, rewound, and the
/// Dockerfile's path in it. Symlinks go in as links (the engine resolves them
/// inside the context); `.git` at the context's top is left out; the
/// context must be a directory of the checkout (a symlink may not lead out).
fn context_tar(checkout: &Path, spec: &DockerSpec) -> std::io::Result<(std::fs::File, String)> {
    let invalid = |message: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, message);
    let top = checkout.canonicalize()?;
    let context = checkout
        .join(&spec.context)
        .canonicalize()
        .map_err(|e| invalid(format!("docker.context `{}`: {e}", spec.context)))?;
    if !context.starts_with(&top) || !context.is_dir() {
        return Err(invalid(format!(
            "docker.context `{}` is not a directory of the repository",
            spec.context
        )));
    }
    let mut tar = tar::Builder::new(tempfile::tempfile()?);
    tar.follow_symlinks(false);
    for entry in std::fs::read_dir(&context)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == ".git" {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            tar.append_dir_all(&name, &path)?;
        } else {
            tar.append_path_with_name(&path, &name)?;
        }
    }
    // The Dockerfile: its path in the context, or a copy when it is outside.
    let dockerfile = checkout.join(&spec.dockerfile);
    let dockerfile = match dockerfile.strip_prefix(checkout.join(&spec.context)) {
        Ok(inside) if !spec.dockerfile.is_empty() && inside != Path::new("") => {
            inside.to_string_lossy().into_owned()
        }
        _ => {
            let meta = std::fs::symlink_metadata(&dockerfile)
                .map_err(|e| invalid(format!("docker.dockerfile `{}`: {e}", spec.dockerfile)))?;
            if !meta.is_file() {
                return Err(invalid(format!(
                    "docker.dockerfile `{}` is not a regular file",
                    spec.dockerfile
                )));
            }
            tar.append_path_with_name(&dockerfile, OUTSIDE_DOCKERFILE)?;
            OUTSIDE_DOCKERFILE.to_owned()
        }
    };
    let mut file = tar.into_inner()?;
    file.flush()?;
    file.rewind()?;
    Ok((file, dockerfile))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dockerfile: &str, context: &str) -> DockerSpec {
        DockerSpec {
            dockerfile: dockerfile.into(),
            context: context.into(),
            build_args: Default::default(),
            command: None,
            memory: None,
            nano_cpus: None,
        }
    }

    fn names(file: std::fs::File) -> Vec<String> {
        let mut archive = tar::Archive::new(file);
        let mut names: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_context_tar_keeps_links_as_links_and_leaves_git_out() {
        let checkout = tempfile::tempdir().unwrap();
        let root = checkout.path();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::write(root.join(".git/config"), "x").unwrap();
        std::fs::create_dir_all(root.join("app/bin")).unwrap();
        std::fs::write(root.join("app/Dockerfile"), "FROM scratch\n").unwrap();
        std::fs::write(root.join("app/bin/provider"), "binary").unwrap();
        let secret = tempfile::NamedTempFile::new().unwrap();
        std::os::unix::fs::symlink(secret.path(), root.join("app/link")).unwrap();

        let (file, dockerfile) = context_tar(root, &spec("app/Dockerfile", "app")).unwrap();
        assert_eq!(dockerfile, "Dockerfile");
        assert_eq!(names(file), ["Dockerfile", "bin/", "bin/provider", "link"]);
        let (file, _) = context_tar(root, &spec("Dockerfile", ".")).unwrap();
        assert!(!names(file).iter().any(|n| n.starts_with(".git")));

        // A Dockerfile outside the context travels under a name of its own.
        std::fs::write(root.join("Containerfile"), "FROM scratch\n").unwrap();
        let (file, dockerfile) = context_tar(root, &spec("Containerfile", "app")).unwrap();
        assert_eq!(dockerfile, OUTSIDE_DOCKERFILE);
        assert!(names(file).contains(&OUTSIDE_DOCKERFILE.to_owned()));

        // A context that is a symlink out of the checkout is refused.
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
        let refused = context_tar(root, &spec("Dockerfile", "out")).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("not a directory of the repository"),
            "{refused}"
        );
    }

    #[test]
    fn images_are_tagged_by_provider_and_commit() {
        let id = Uuid::nil();
        assert_eq!(
            image_tag(id, "0123abcd"),
            "corbel-provider-00000000-0000-0000-0000-000000000000:0123abcd"
        );
    }

    #[test]
    fn partial_lines_wait_for_their_end() {
        let bus = crate::events::Bus::new(16, tokio_util::sync::CancellationToken::new());
        let ring = Arc::new(std::sync::Mutex::new(super::super::logs::LogRing::new(10)));
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
