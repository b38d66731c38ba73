//! One task per loaded provider runs its lifecycle:
//! `FETCHING → BUILDING → STARTING → REGISTERING → CONNECTED`, and when a
//! connected provider exits or fails its health checks, `DISCONNECTED` and a
//! restart after an exponential backoff (capped), counted in `restarts`.
//!
//! A provider that exits or stays silent before it registers is `FAILED` with
//! its log tail: that is a broken provider, not a crash worth retrying.
//!
//! A remote provider (`runtime: remote`) is fetched for its metadata, then
//! `REGISTERING` until it registers over TLS, and `DISCONNECTED` while it is
//! waited for again after losing its link: its process is its operator's.
//!
//! The supervisor also watches each registered link's health, and stops every
//! provider at shutdown. It never reads or changes the stored provider beyond
//! its status, source and restart count, and never accepts a registration: it
//! waits for the registry to connect the slot.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::checkout::{describe_progress, missing_metadata, source_root};
use super::docker::{DockerRuntime, Engine};
use super::link::Link;
use super::run_as;
use super::runtime::{Job, Running, Runtime, ShellRuntime};
use super::state::{Command, Slot, Slots};
use super::{
    ProviderError, ProviderMetadata, ProviderSettings, ProviderStatus, catalog, metadata, rows,
    source,
};
use crate::store::Db;

/// The shortest deadline of a health check: a busy machine may take this long
/// to answer one, and a provider must not be restarted for that.
const MIN_PROBE: Duration = Duration::from_millis(500);

/// Lines of output quoted when a provider fails.
const TAIL_LINES: usize = 20;
/// How long a lost link waits for its process's exit status: a process that
/// died broke its link a moment before it is reaped.
const EXIT_SEEN_WITHIN: Duration = Duration::from_millis(250);

/// A provider fetched and ready to run.
enum Prepared {
    /// Built, to be started here.
    Local(Box<dyn Runtime>, Box<Job>),
    /// `runtime: remote`: its operator runs it; it is waited for.
    Remote,
}

/// How a phase ended when it did not simply succeed.
enum Stop {
    /// Told to unload; reply when done.
    Unload(oneshot::Sender<()>),
    Failed(String),
}

/// Runs the loaded providers: one task each, plus a health monitor per link.
pub(super) struct Supervisor {
    db: Db,
    settings: ProviderSettings,
    slots: Arc<Slots>,
    /// Cancelled when the server stops.
    stopping: CancellationToken,
    /// Supervisors and health monitors.
    tasks: TaskTracker,
    /// Bounds how many providers fetch and build at once.
    loading: Semaphore,
    /// The Docker engine, for providers with `runtime: docker`.
    engine: Arc<Engine>,
}

impl Supervisor {
    pub fn new(
        db: Db,
        settings: ProviderSettings,
        slots: Arc<Slots>,
        stopping: CancellationToken,
    ) -> Self {
        let loading = Semaphore::new(settings.load_concurrency.max(1));
        let engine = Arc::new(Engine::new(
            settings.docker_host.clone(),
            settings.instance_id.clone(),
            settings.docker_call_timeout,
        ));
        Self {
            db,
            settings,
            slots,
            stopping,
            tasks: TaskTracker::new(),
            loading,
            engine,
        }
    }

    /// The Docker engine of the docker runtime.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Starts loading a provider in the background.
    pub async fn load(self: &Arc<Self>, row: rows::ProviderRow) -> Result<(), ProviderError> {
        let id = row.id;
        let slot = self.slots.slot(id);
        let (mailbox, commands) = mpsc::channel(4);
        if slot.session().is_some() || !slot.claim(mailbox) {
            return Err(ProviderError::Conflict(format!(
                "provider `{}` is already loaded ({}); unload it first",
                row.name,
                slot.status().as_str()
            )));
        }
        self.slots
            .set_status(&slot, ProviderStatus::Fetching, None)
            .await;
        let this = self.clone();
        let span = tracing::info_span!("provider", provider.id = %id, provider.name = %row.name);
        self.tasks.spawn(tracing::Instrument::instrument(
            async move {
                this.supervise(slot.clone(), row, commands).await;
                slot.release();
            },
            span,
        ));
        Ok(())
    }

    /// Stops a loaded provider and waits until it has stopped.
    pub async fn unload(&self, slot: Arc<Slot>) {
        if let Some(mailbox) = slot.supervisor() {
            let (done, stopped) = oneshot::channel();
            if mailbox.send(Command::Unload(done)).await.is_ok() {
                let bound = self.settings.stop_grace + Duration::from_secs(10);
                let _ = tokio::time::timeout(bound, stopped).await;
            }
        } else if slot.session().is_some() {
            // Registered from outside: forget the link; the process is not ours.
            slot.disconnect(None);
            self.slots.note(&slot, "unloaded: the link is dropped");
            self.slots
                .set_status(&slot, ProviderStatus::Unloaded, None)
                .await;
        }
    }

    /// The token that stops a new link's health monitor (with the server).
    pub fn monitor_stop(&self) -> CancellationToken {
        self.stopping.child_token()
    }

    /// Watches a registered link's health in the background.
    pub fn watch_health(
        self: &Arc<Self>,
        slot: Arc<Slot>,
        link: Link,
        session: String,
        stop: CancellationToken,
    ) {
        self.tasks
            .spawn(self.clone().monitor(slot, link, session, stop));
    }

    /// Health-checks one link until it is replaced, dropped or fails twice in a
    /// row; a failed link is dropped and the provider marked `DISCONNECTED`.
    ///
    /// A check waits half an interval (at least [`MIN_PROBE`]) for its answer,
    /// and a failed check is repeated at once: a provider that freezes is
    /// declared gone about two intervals after its last answer. Between
    /// checks the provider's health `Watch` is followed: when it breaks (the
    /// provider's process died and its connection closed) the link is
    /// checked at once, so a killed provider is `DISCONNECTED` within the
    /// probes, not the interval. A watch that broke while the checks pass is
    /// followed again after the next interval.
    async fn monitor(
        self: Arc<Self>,
        slot: Arc<Slot>,
        link: Link,
        session: String,
        stop: CancellationToken,
    ) {
        let interval = self.settings.health_interval;
        let probe = (interval / 2)
            .max(MIN_PROBE)
            .min(self.settings.call_timeout.max(MIN_PROBE));
        let lost = link.health_lost();
        tokio::pin!(lost);
        let mut watching = true;
        let mut why: Option<String> = None;
        let mut failures = 0;
        loop {
            if failures == 0 {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(interval) => {
                        if !watching {
                            lost.set(link.health_lost());
                            watching = true;
                        }
                    }
                    broke = &mut lost, if watching => {
                        watching = false;
                        why = Some(broke);
                    }
                }
            }
            let checked = tokio::select! {
                _ = stop.cancelled() => return,
                checked = link.check_health(Some(probe)) => checked,
            };
            match checked {
                Ok(()) => {
                    failures = 0;
                    why = None;
                    slot.saw(Utc::now());
                }
                Err(e) => {
                    failures += 1;
                    if failures < 2 {
                        continue;
                    }
                    let message = match why.take() {
                        Some(broke) => format!("{broke}; health check failed: {e}"),
                        None => format!("health check failed: {e}"),
                    };
                    self.slots.drop_failed_link(&slot, &session, message).await;
                    return;
                }
            }
        }
    }

    /// Stops every provider: at server shutdown.
    pub async fn shutdown(&self) {
        let unloads = self.slots.all().into_iter().map(|slot| self.unload(slot));
        futures_util::future::join_all(unloads).await;
        self.tasks.close();
        let bound = self.settings.stop_grace + Duration::from_secs(5);
        if tokio::time::timeout(bound, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("provider tasks still running at shutdown");
        }
    }

    async fn supervise(
        &self,
        slot: Arc<Slot>,
        row: rows::ProviderRow,
        mut commands: mpsc::Receiver<Command>,
    ) {
        let prepared = {
            let prepare = self.prepare(&slot, &row);
            tokio::pin!(prepare);
            tokio::select! {
                result = &mut prepare => result,
                Some(Command::Unload(done)) = commands.recv() => Err(Stop::Unload(done)),
            }
        };
        let (runtime, job) = match prepared {
            Ok(Prepared::Local(runtime, job)) => (runtime, *job),
            Ok(Prepared::Remote) => {
                let done = self.follow_remote(&slot, &mut commands).await;
                self.unloaded(&slot, done).await;
                return;
            }
            Err(Stop::Failed(message)) => {
                self.failed(&slot, message).await;
                return;
            }
            Err(Stop::Unload(done)) => {
                self.unloaded(&slot, done).await;
                return;
            }
        };
        let mut restarts = Restarts {
            count: row.restarts,
            crashes: 0,
        };
        loop {
            match self
                .run_once(&slot, runtime.as_ref(), &job, &mut commands)
                .await
            {
                Ended::Unloaded(done) => {
                    self.unloaded(&slot, done).await;
                    return;
                }
                Ended::Failed(message) => {
                    self.failed(&slot, message).await;
                    return;
                }
                Ended::Lost {
                    reason,
                    connected_for,
                } => {
                    let waited =
                        self.back_off(&slot, &mut restarts, reason, connected_for, &mut commands);
                    if let Some(done) = waited.await {
                        self.unloaded(&slot, done).await;
                        return;
                    }
                }
            }
        }
    }

    async fn unloaded(&self, slot: &Arc<Slot>, done: oneshot::Sender<()>) {
        self.slots
            .set_status(slot, ProviderStatus::Unloaded, None)
            .await;
        let _ = done.send(());
    }

    async fn failed(&self, slot: &Arc<Slot>, message: String) {
        self.slots
            .set_status(slot, ProviderStatus::Failed, Some(message))
            .await;
    }

    /// After a lost provider: counts the restart, says when it comes, and
    /// waits the backoff out; the reply channel if told to unload meanwhile.
    async fn back_off(
        &self,
        slot: &Arc<Slot>,
        restarts: &mut Restarts,
        reason: String,
        connected_for: Duration,
        commands: &mut mpsc::Receiver<Command>,
    ) -> Option<oneshot::Sender<()>> {
        if connected_for > self.settings.backoff_max {
            restarts.crashes = 0;
        }
        let delay = backoff(
            self.settings.backoff_initial,
            self.settings.backoff_max,
            restarts.crashes,
        );
        restarts.crashes = restarts.crashes.saturating_add(1);
        restarts.count += 1;
        let count = restarts.count;
        let message = format!(
            "{reason}; restarting in {} ms (restart {count})",
            delay.as_millis()
        );
        self.slots.note(slot, &message);
        // The status first: nobody should see the new count on the
        // old connection.
        self.slots
            .set_status(slot, ProviderStatus::Disconnected, Some(message))
            .await;
        slot.set_restarts(count);
        if let Err(e) = rows::set_restarts(&self.db, slot.id, count).await {
            tracing::error!(error = %e, "cannot store the restart count");
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => None,
            Some(Command::Unload(done)) = commands.recv() => Some(done),
        }
    }

    /// Fetch, read the metadata, build: under the loading bound. A remote
    /// provider is not built, and has no state directory here.
    async fn prepare(&self, slot: &Arc<Slot>, row: &rows::ProviderRow) -> Result<Prepared, Stop> {
        let _permit = self.loading.acquire().await;
        let settings = &self.settings;
        let dir = settings.provider_dir(slot.id);
        let (commit, root, meta) = self.fetch(slot, row, &dir.join("src")).await?;
        // Where `CORBEL_STATE_DIR` points: under `[provider] state_dir` when
        // set (a Docker provider mounts it), else in the provider's directory.
        let state_dir = settings.provider_state_dir(slot.id);
        let runtime: Box<dyn Runtime> = match meta.runtime {
            metadata::Runtime::Shell { build, run } => Box::new(ShellRuntime { build, run }),
            metadata::Runtime::Docker(spec) => Box::new(DockerRuntime {
                engine: self.engine.clone(),
                spec,
                provider: slot.id,
                commit: commit.clone(),
                path: row.source_path.clone(),
                registry_socket: settings.registry_socket(),
                socket_dir: settings.socket_dir(),
                state_dir: state_dir.clone(),
            }),
            metadata::Runtime::Remote => return Ok(Prepared::Remote),
        };
        tokio::fs::create_dir_all(&state_dir)
            .await
            .map_err(|e| Stop::Failed(format!("cannot create {}: {e}", state_dir.display())))?;
        let run_as = run_as::prepare(&self.settings, slot.id, &row.run_as)
            .await
            .map_err(Stop::Failed)?;
        let build_dir = dir.join("builds").join(&commit);
        let sandbox = settings.sandbox_paths(slot.id, &root, Some(&build_dir));
        let build_sandbox = settings.build_sandbox_paths(&dir.join("src"), &build_dir);
        let job = Job {
            source_dir: root,
            logs: self.slots.sink(slot),
            build_timeout: settings.build_timeout,
            progress: {
                let slots = self.slots.clone();
                let slot = slot.clone();
                Arc::new(move |message: &str| slots.set_message(&slot, message.to_owned()))
            },
            sandbox,
            build_sandbox,
            build_dir: Some(build_dir),
            run_as,
        };
        self.slots
            .set_status(slot, ProviderStatus::Building, None)
            .await;
        runtime
            .build(&job)
            .await
            .map_err(|e| Stop::Failed(e.to_string()))?;
        Ok(Prepared::Local(runtime, Box::new(job)))
    }

    /// Fetches the source into `src` and reads its metadata, stored with the
    /// commit: the commit, the provider's directory in the checkout, and the
    /// metadata.
    async fn fetch(
        &self,
        slot: &Arc<Slot>,
        row: &rows::ProviderRow,
        src: &Path,
    ) -> Result<(String, PathBuf, metadata::Metadata), Stop> {
        let progress = {
            let slots = self.slots.clone();
            let slot = slot.clone();
            move |p: source::Progress| slots.set_message(&slot, describe_progress(&p))
        };
        self.slots.note(
            slot,
            &format!(
                "fetching {} {}",
                source::display_url(&row.git_url),
                shown_ref(&row.git_ref)
            ),
        );
        let fetched = source::fetch(
            &row.git_url,
            &row.git_ref,
            src,
            &self.settings.source(),
            progress,
        )
        .await
        .map_err(|e| Stop::Failed(format!("fetch failed: {e}")))?;
        self.slots
            .note(slot, &format!("checked out {}", fetched.commit));
        let root = source_root(src, &row.source_path).map_err(Stop::Failed)?;
        let meta = metadata::load(&root).map_err(|e| match e {
            metadata::MetadataError::Missing { .. } => Stop::Failed(missing_metadata(
                src,
                &row.source_path,
                &source::display_url(&row.git_url),
                &fetched.commit,
            )),
            e => Stop::Failed(e.to_string()),
        })?;
        let shown = ProviderMetadata::from(&meta);
        let stored = serde_json::to_string(&shown).ok();
        if let Err(e) = rows::set_source(&self.db, slot.id, &fetched.commit, stored).await {
            tracing::error!(error = %e, "cannot store the fetched commit");
        }
        Ok((fetched.commit, root, meta))
    }

    /// Starts the provider once and follows it until it stops for any reason.
    async fn run_once(
        &self,
        slot: &Arc<Slot>,
        runtime: &dyn Runtime,
        job: &Job,
        commands: &mut mpsc::Receiver<Command>,
    ) -> Ended {
        let (mut running, mut watch) = match self.launch(slot, runtime, job).await {
            Ok(launched) => launched,
            Err(ended) => return ended,
        };
        let registered = self
            .until_registered(slot, running.as_mut(), &mut watch, job, commands)
            .await;
        if let Some(ended) = registered {
            return ended;
        }
        self.while_connected(slot, running.as_mut(), &mut watch, commands)
            .await
    }

    /// Starts the provider with a fresh token, and a watch on its slot taken
    /// before it can register.
    async fn launch(
        &self,
        slot: &Arc<Slot>,
        runtime: &dyn Runtime,
        job: &Job,
    ) -> Result<(Box<dyn Running>, watch::Receiver<u64>), Ended> {
        self.slots
            .set_status(slot, ProviderStatus::Starting, None)
            .await;
        // A fresh token per launch, accepted once, from this launch only.
        let token = catalog::new_token();
        slot.begin_launch(token.clone());
        let mut env = self.environment(slot.id, token);
        if let Some(user) = &job.run_as {
            // Its own socket directory: the shared one is the server's.
            for (key, value) in &mut env {
                if key == "CORBEL_SOCKET_DIR" {
                    *value = own_socket_dir(&self.settings, slot.id)
                        .display()
                        .to_string();
                }
            }
            env.extend(user.environment());
        }
        let mut watch = slot.watch();
        watch.borrow_and_update();
        let running = match runtime.start(job, &env).await {
            Ok(running) => running,
            Err(e) => {
                slot.end_launch();
                return Err(Ended::Failed(e.to_string()));
            }
        };
        slot.bind_launch(running.binding());
        self.slots
            .set_status(slot, ProviderStatus::Registering, None)
            .await;
        Ok((running, watch))
    }

    /// Waits for the launched provider to register: `None` once it has, or
    /// how the launch ended first.
    async fn until_registered(
        &self,
        slot: &Arc<Slot>,
        running: &mut dyn Running,
        watch: &mut watch::Receiver<u64>,
        job: &Job,
        commands: &mut mpsc::Receiver<Command>,
    ) -> Option<Ended> {
        let settings = &self.settings;
        let deadline = tokio::time::sleep(settings.start_timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                changed = watch.changed() => {
                    if changed.is_ok() && slot.session().is_some() {
                        return None;
                    }
                }
                status = running.wait() => {
                    slot.end_launch();
                    return Some(Ended::Failed(format!(
                        "the provider exited before registering ({status}); last output:\n{}",
                        job.logs.tail(TAIL_LINES)
                    )));
                }
                _ = &mut deadline => {
                    self.stop(slot, running, false).await;
                    return Some(Ended::Failed(format!(
                        "the provider did not register within {}s; last output:\n{}",
                        settings.start_timeout.as_secs(),
                        job.logs.tail(TAIL_LINES)
                    )));
                }
                Some(Command::Unload(done)) = commands.recv() => {
                    self.stop(slot, running, true).await;
                    return Some(Ended::Unloaded(done));
                }
            }
        }
    }

    /// Follows the connected provider (the registry set the status) until
    /// its link is lost, it exits, or it is unloaded.
    async fn while_connected(
        &self,
        slot: &Arc<Slot>,
        running: &mut dyn Running,
        watch: &mut watch::Receiver<u64>,
        commands: &mut mpsc::Receiver<Command>,
    ) -> Ended {
        let since = Instant::now();
        loop {
            tokio::select! {
                changed = watch.changed() => {
                    if changed.is_ok() && slot.session().is_none() {
                        // Health checks failed or it unregistered on its own;
                        // a process that died broke its link first, and its
                        // exit status, a moment behind, says more.
                        if let Ok(status) = tokio::time::timeout(EXIT_SEEN_WITHIN, running.wait()).await {
                            slot.end_launch();
                            return Ended::Lost {
                                reason: format!("the provider exited ({status})"),
                                connected_for: since.elapsed(),
                            };
                        }
                        let reason = match slot.status() {
                            ProviderStatus::Disconnected => "the provider stopped answering".to_owned(),
                            other => format!("the link was lost ({})", other.as_str()),
                        };
                        self.stop(slot, running, false).await;
                        return Ended::Lost { reason, connected_for: since.elapsed() };
                    }
                }
                status = running.wait() => {
                    slot.disconnect(None);
                    slot.end_launch();
                    return Ended::Lost {
                        reason: format!("the provider exited ({status})"),
                        connected_for: since.elapsed(),
                    };
                }
                Some(Command::Unload(done)) = commands.recv() => {
                    self.stop(slot, running, true).await;
                    return Ended::Unloaded(done);
                }
            }
        }
    }

    /// A remote provider: wait for it to register over TLS, follow its link,
    /// and wait again when the link is lost, until told to unload (its
    /// process is its operator's: it is neither started nor stopped here).
    async fn follow_remote(
        &self,
        slot: &Arc<Slot>,
        commands: &mut mpsc::Receiver<Command>,
    ) -> oneshot::Sender<()> {
        slot.set_remote(true);
        let mut watch = slot.watch();
        watch.borrow_and_update();
        let place = match self.settings.listen {
            Some(addr) => format!("at {addr}, over mutual TLS"),
            None => "but this server has no --provider-listen: it cannot".to_owned(),
        };
        self.slots
            .set_status(
                slot,
                ProviderStatus::Registering,
                Some(format!(
                    "waiting for the remote provider to register {place}"
                )),
            )
            .await;
        loop {
            let connected = slot.session().is_some();
            tokio::select! {
                changed = watch.changed() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                    if connected && slot.session().is_none() {
                        let message = format!(
                            "the remote provider's link was lost; waiting for it to register again {place}"
                        );
                        self.slots.note(slot, &message);
                        self.slots
                            .set_status(slot, ProviderStatus::Disconnected, Some(message))
                            .await;
                    }
                }
                Some(Command::Unload(done)) = commands.recv() => {
                    self.slots
                        .set_status(slot, ProviderStatus::Unloading, None)
                        .await;
                    slot.set_remote(false);
                    slot.disconnect(None);
                    return done;
                }
            }
        }
    }

    /// SIGTERM (the SDK unregisters), then SIGKILL after the grace period.
    async fn stop(&self, slot: &Arc<Slot>, running: &mut dyn Running, unloading: bool) {
        if unloading {
            self.slots
                .set_status(slot, ProviderStatus::Unloading, None)
                .await;
        }
        running.stop(self.settings.stop_grace).await;
        slot.disconnect(None);
        slot.end_launch();
    }

    fn environment(&self, id: Uuid, token: String) -> Vec<(String, String)> {
        let settings = &self.settings;
        vec![
            (
                "CORBEL_REGISTRY".into(),
                format!("unix://{}", settings.registry_socket().display()),
            ),
            ("CORBEL_PROVIDER_ID".into(), id.to_string()),
            ("CORBEL_PROVIDER_TOKEN".into(), token),
            (
                "CORBEL_SOCKET_DIR".into(),
                settings.socket_dir().display().to_string(),
            ),
            (
                "CORBEL_STATE_DIR".into(),
                settings.provider_state_dir(id).display().to_string(),
            ),
        ]
    }
}

/// The socket directory of provider `id` alone (see
/// [`settings::own_socket_dir`](super::settings::own_socket_dir)).
pub(super) fn own_socket_dir(settings: &ProviderSettings, id: Uuid) -> PathBuf {
    super::settings::own_socket_dir(&settings.socket_dir(), id)
}

/// A provider's restarts: the stored count, and the crashes in a row that
/// set the next backoff (a run connected longer than the longest backoff
/// starts the row again).
struct Restarts {
    count: i32,
    crashes: u32,
}

enum Ended {
    Unloaded(oneshot::Sender<()>),
    Failed(String),
    Lost {
        reason: String,
        connected_for: Duration,
    },
}

fn shown_ref(reference: &str) -> String {
    if reference.is_empty() {
        "(default branch)".to_owned()
    } else {
        format!("at `{reference}`")
    }
}

/// `initial × 2^n`, capped at `max`.
fn backoff(initial: Duration, max: Duration, n: u32) -> Duration {
    initial
        .checked_mul(1u32.checked_shl(n.min(20)).unwrap_or(u32::MAX))
        .unwrap_or(max)
        .min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let initial = Duration::from_millis(500);
        let max = Duration::from_secs(30);
        assert_eq!(backoff(initial, max, 0), Duration::from_millis(500));
        assert_eq!(backoff(initial, max, 1), Duration::from_millis(1000));
        assert_eq!(backoff(initial, max, 3), Duration::from_millis(4000));
        assert_eq!(backoff(initial, max, 10), max);
        assert_eq!(backoff(initial, max, u32::MAX), max);
    }
}
