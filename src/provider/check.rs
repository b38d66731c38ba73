//! `corbel provider check`: the conformance run a provider's author does before
//! publishing. It loads the provider as the server would (fetch, read
//! `corbel-provider.yaml`, build, run, handshake, register) against a host of
//! its own (`check_host.rs`), then drives the protocol and says, check by
//! check, what passed and what did not.
//!
//! What it asks of a provider is what the server relies on: registration as
//! the environment says, health, `Configure` refusing what it cannot use, nodes
//! and descriptions when offered, for each resource type with a sample in
//! `check.resources` a deploy and destroy whose streams end with exactly one
//! `done` or `error`, `DeployResource` idempotent per `resource_id`, `Inspect`
//! finding what a lost deploy made, `DestroyResource` of something gone
//! succeeding, surviving a call whose deadline passed, and leaving: on SIGTERM
//! (exit 0), and when its host goes away. A provider of protocol version 2
//! that describes updatable keys, given a config to update its sample to
//! (`check.updates`), must update it in place (Inspect agreeing), do nothing
//! new when updated to the same config again, and answer NOT_FOUND for one
//! that is gone. A provider that registers "watch" (protocol version 3) must
//! report a deployed sample HEALTHY in its first `WatchResources` report,
//! then `synced`, and DOWN once the check kills it behind its back.
//!
//! This file loads and starts the provider; `service` checks its own calls,
//! `resources` its resources, `watch` its health watch, `leaving` how it
//! exits; `calls` makes the calls and holds their answers to the protocol,
//! `report` keeps the verdicts.

mod calls;
mod leaving;
mod report;
mod resources;
mod service;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::check_host::CheckHost;
use super::link::Link;
use super::logs::{LogRing, LogSink};
use super::runtime::{Job, Running, Runtime, ShellRuntime};
use super::sandbox::SandboxPaths;
use super::{ProviderEvent, ProviderSettings, checkout, metadata, source};
use crate::events::{Bus, Delivery};
use resources::Update;
use watch::Watch;

pub use report::{Outcome, Report, Row};

/// What to check and how.
pub struct CheckOptions {
    /// A git URL or a local path, as `gitUrl`.
    pub source: String,
    /// A tag, branch or commit; empty is the default branch.
    pub reference: String,
    /// The provider's directory in the repository; empty is the root.
    pub path: String,
    /// Timeouts and URL schemes, as the server's `[provider]` section.
    pub settings: ProviderSettings,
    /// Keep the scratch directory (checkout, build, state) for a look after.
    pub keep: bool,
    /// How long after registering it must still run and answer health
    /// checks ("runs until stopped").
    pub settle: std::time::Duration,
}

/// Runs every check. `say` gets the progress lines (what runs now, the build's
/// and the provider's output); the report holds the verdicts.
pub async fn run(options: CheckOptions, say: impl Fn(&str) + Send + Sync + 'static) -> Report {
    let say: Arc<dyn Fn(&str) + Send + Sync> = Arc::new(say);
    let mut report = Report::default();
    let scratch = match tempfile::Builder::new()
        .prefix("corbel-check-")
        .tempdir_in("/tmp")
    {
        Ok(dir) => dir,
        Err(e) => {
            report.add(
                "scratch directory",
                Outcome::Fail,
                format!("cannot make one in /tmp: {e}"),
            );
            return report;
        }
    };
    let mut check = Check {
        options,
        dir: scratch.path().to_owned(),
        id: Uuid::new_v4(),
        token: crate::secret::new_token("cbl_check_"),
        say,
        report,
    };
    check.all().await;
    let mut report = check.report;
    if check.options.keep {
        report.kept = Some(scratch.keep());
    }
    report
}

struct Check {
    options: CheckOptions,
    dir: PathBuf,
    id: Uuid,
    token: String,
    say: Arc<dyn Fn(&str) + Send + Sync>,
    report: Report,
}

/// A provider process started for the check, with its registration.
struct Started {
    running: Box<dyn Running>,
    session: String,
    endpoint: String,
    /// When its registration was answered.
    registered_at: tokio::time::Instant,
}

impl Check {
    async fn all(&mut self) {
        let Some((meta, runtime, job)) = self.prepare().await else {
            return;
        };
        let config = serde_json::Value::Object(meta.check.config.clone()).to_string();
        let host = match CheckHost::start(
            &self.dir,
            &self.id.to_string(),
            &self.token,
            config.clone(),
            self.options.settings.call_timeout,
        ) {
            Ok(host) => host,
            Err(e) => {
                self.report.add("host", Outcome::Fail, format!("{e:#}"));
                return;
            }
        };
        let Some(mut started) = self.start(&runtime, &job, &host, 1).await else {
            return;
        };
        self.check_registration(&host, &meta);
        let settings = &self.options.settings;
        let dialled = Link::dial(
            &started.endpoint,
            settings.call_timeout,
            settings.resource_timeout,
        )
        .await;
        let link = match dialled {
            Ok(link) => link,
            Err(e) => {
                self.report.add("dial", Outcome::Fail, e.to_string());
                started.running.stop(self.options.settings.stop_grace).await;
                return;
            }
        };
        self.check_health(&link).await;
        self.check_configure(&link, &config).await;
        let node = self.check_nodes(&link, &meta).await;
        let updatable = self.check_describe(&link, &meta).await;
        // The version and features it registered with: what the server goes by.
        let (version, features) = host
            .seen()
            .registrations
            .first()
            .map_or((1, Vec::new()), |(request, _)| {
                (request.protocol_version, request.features.clone())
            });
        for kind in &meta.resource_types {
            match meta.check.resources.get(kind) {
                Some(sample) => {
                    self.check_lifecycle(&link, kind, sample, &node).await;
                    let update = Update {
                        version,
                        updatable: updatable.get(kind).map(Vec::as_slice),
                        to: meta.check.updates.get(kind),
                    };
                    self.check_update(&link, kind, sample, update, &node).await;
                }
                None => self.report.add(
                    format!("deploy {kind}"),
                    Outcome::Skip,
                    "no sample config: add one under `check.resources` in corbel-provider.yaml",
                ),
            }
        }
        let watch = Watch {
            version,
            features: &features,
            dir: &job.source_dir,
            node: &node,
        };
        self.check_watch(&link, &meta, watch).await;
        self.check_expired_deadline(&link).await;
        self.check_leaving(&host, &link, &mut started, &meta).await;
        if let Some(mut again) = self.start(&runtime, &job, &host, 2).await {
            self.check_host_gone(&host, &mut again).await;
        }
    }

    /// Fetch, `corbel-provider.yaml`, build: as the server's supervisor does.
    async fn prepare(&mut self) -> Option<(metadata::Metadata, ShellRuntime, Job)> {
        let checkout = self.dir.join("src");
        let commit = self.fetch(&checkout).await?;
        let root = match checkout::source_root(&checkout, &self.options.path) {
            Ok(root) => root,
            Err(e) => {
                self.report.add(metadata::FILE_NAME, Outcome::Fail, e);
                return None;
            }
        };
        let meta = self.read_metadata(&checkout, &root, &commit)?;
        let runtime = self.shell_runtime(&meta)?;
        let settings = &self.options.settings;
        // As the server would confine it, in this check's own directories.
        let sandbox = settings.sandbox.then(|| SandboxPaths {
            read: [root.clone()]
                .into_iter()
                .chain(std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from))
                .chain(settings.sandbox_read.iter().cloned())
                .collect(),
            write: [self.dir.join("state"), self.dir.join("sockets")]
                .into_iter()
                .chain(settings.sandbox_write.iter().cloned())
                .collect(),
            // A check runs beside no server's data.
            hidden: Vec::new(),
        });
        let job = Job {
            source_dir: root,
            logs: self.log_sink(),
            build_timeout: settings.build_timeout,
            progress: std::sync::Arc::new(|_: &str| {}),
            build_dir: None,
            sandbox,
            // Its author's own directory, built as they would by hand.
            build_sandbox: None,
            run_as: None,
        };
        (self.say)("building");
        match runtime.build(&job).await {
            Ok(()) => self.report.add(
                "build",
                Outcome::Pass,
                runtime
                    .build
                    .clone()
                    .unwrap_or_else(|| "(no build command)".into()),
            ),
            Err(e) => {
                self.report.add("build", Outcome::Fail, e.to_string());
                return None;
            }
        }
        Some((meta, runtime, job))
    }

    /// Fetches the source into `checkout`; the commit checked out.
    async fn fetch(&mut self, checkout: &Path) -> Option<String> {
        let shown = source::display_url(&self.options.source);
        (self.say)(&format!("fetching {shown}"));
        let say = self.say.clone();
        let fetched = source::fetch(
            &self.options.source,
            &self.options.reference,
            checkout,
            &self.options.settings.source(),
            move |p| say(&checkout::describe_progress(&p)),
        )
        .await;
        match fetched {
            Ok(fetched) => {
                self.report.add(
                    "fetch",
                    Outcome::Pass,
                    format!("{shown} at {}", fetched.commit),
                );
                Some(fetched.commit)
            }
            Err(e) => {
                self.report.add("fetch", Outcome::Fail, e.to_string());
                None
            }
        }
    }

    /// `corbel-provider.yaml` at `root` of the checkout.
    fn read_metadata(
        &mut self,
        checkout: &Path,
        root: &Path,
        commit: &str,
    ) -> Option<metadata::Metadata> {
        let meta = match metadata::load(root) {
            Ok(meta) => meta,
            Err(metadata::MetadataError::Missing { .. }) => {
                let shown = source::display_url(&self.options.source);
                let message =
                    checkout::missing_metadata(checkout, &self.options.path, &shown, commit);
                self.report.add(metadata::FILE_NAME, Outcome::Fail, message);
                return None;
            }
            Err(e) => {
                self.report
                    .add(metadata::FILE_NAME, Outcome::Fail, e.to_string());
                return None;
            }
        };
        self.report.add(
            metadata::FILE_NAME,
            Outcome::Pass,
            format!(
                "{} {} ({}; types: {})",
                meta.name,
                meta.version,
                meta.features.join(", "),
                meta.resource_types.join(", ")
            ),
        );
        Some(meta)
    }

    /// The shell runtime: the only one the check runs.
    fn shell_runtime(&mut self, meta: &metadata::Metadata) -> Option<ShellRuntime> {
        match &meta.runtime {
            metadata::Runtime::Shell { build, run } => Some(ShellRuntime {
                build: build.clone(),
                run: run.clone(),
            }),
            metadata::Runtime::Docker(_) => {
                self.report.add(
                    "runtime",
                    Outcome::Fail,
                    "`corbel provider check` does not run the docker runtime yet; load the provider in a server",
                );
                None
            }
            metadata::Runtime::Remote => {
                self.report.add(
                    "runtime",
                    Outcome::Fail,
                    "a remote provider runs elsewhere: `corbel provider check` cannot start it; load it in a server with --provider-listen",
                );
                None
            }
        }
    }

    /// A log sink whose lines are said as they come, like the server's log.
    fn log_sink(&self) -> LogSink {
        let bus: Bus<ProviderEvent> = Bus::new(1024, CancellationToken::new());
        let mut lines = Box::pin(bus.subscribe());
        let say = self.say.clone();
        tokio::spawn(async move {
            while let Some(delivery) = lines.next().await {
                if let Delivery::Event(event) = delivery
                    && let ProviderEvent::Log { line, .. } = event.as_ref()
                {
                    say(&format!("  {:>6} | {}", line.stream.as_str(), line.line));
                }
            }
        });
        LogSink::new(self.id, Arc::new(Mutex::new(LogRing::new(200))), bus)
    }

    /// Starts the provider and waits for its `count`th registration.
    async fn start(
        &mut self,
        runtime: &ShellRuntime,
        job: &Job,
        host: &CheckHost,
        count: usize,
    ) -> Option<Started> {
        let settings = self.options.settings.clone();
        let label = if count == 1 { "start" } else { "restart" };
        let register = if count == 1 {
            "register"
        } else {
            "register again"
        };
        let mut running = self.launch(runtime, job, host, label).await?;
        let registered = tokio::select! {
            biased;
            seen = host.wait_for(settings.start_timeout, |s| {
                s.registrations.len() >= count || s.refusals.len() >= count
            }) => seen,
            exit = running.wait() => {
                if count == 1 {
                    self.check_handshake(host);
                }
                self.report.add(
                    register,
                    Outcome::Fail,
                    format!("the provider exited ({exit}) before registering; last output:\n{}",
                        job.logs.tail(10)),
                );
                return None;
            }
        };
        if count == 1 {
            self.check_handshake(host);
        }
        let Some(seen) = registered else {
            self.report.add(
                register,
                Outcome::Fail,
                format!(
                    "no registration within {}s (start_timeout_seconds); last output:\n{}",
                    settings.start_timeout.as_secs(),
                    job.logs.tail(10)
                ),
            );
            running.stop(settings.stop_grace).await;
            return None;
        };
        if seen.registrations.len() < count {
            let refusal = seen.refusals.last().cloned().unwrap_or_default();
            self.report
                .add(register, Outcome::Fail, format!("refused: {refusal}"));
            running.stop(settings.stop_grace).await;
            return None;
        }
        let (request, session) = seen.registrations[count - 1].clone();
        if count == 1 {
            self.report.add(
                "register",
                Outcome::Pass,
                format!(
                    "{} {} at {} (protocol {})",
                    request.name, request.version, request.endpoint, request.protocol_version
                ),
            );
        }
        Some(Started {
            running,
            session,
            endpoint: request.endpoint,
            registered_at: tokio::time::Instant::now(),
        })
    }

    /// Runs the provider with the environment the server would give it,
    /// registering with `host`.
    async fn launch(
        &mut self,
        runtime: &ShellRuntime,
        job: &Job,
        host: &CheckHost,
        label: &str,
    ) -> Option<Box<dyn Running>> {
        let state_dir = self.dir.join("state");
        let sockets = self.dir.join("sockets");
        for dir in [&state_dir, &sockets] {
            if let Err(e) = std::fs::create_dir_all(dir) {
                self.report.add(
                    "start",
                    Outcome::Fail,
                    format!("cannot make {}: {e}", dir.display()),
                );
                return None;
            }
        }
        let env = [
            ("CORBEL_REGISTRY", host.address()),
            ("CORBEL_PROVIDER_ID", self.id.to_string()),
            ("CORBEL_PROVIDER_TOKEN", self.token.clone()),
            ("CORBEL_SOCKET_DIR", path_text(&sockets)),
            ("CORBEL_STATE_DIR", path_text(&state_dir)),
        ]
        .map(|(k, v)| (k.to_owned(), v));
        (self.say)(&format!("{label}: {}", runtime.run));
        match runtime.start(job, &env).await {
            Ok(running) => Some(running),
            Err(e) => {
                self.report.add(label, Outcome::Fail, e.to_string());
                None
            }
        }
    }
}

fn path_text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}
