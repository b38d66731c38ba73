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
//! that is gone.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corbel_proto::v1::{self as proto, resource_event::Event};
use futures_util::StreamExt;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::binding::Binding;
use super::check_host::CheckHost;
use super::link::{Link, LinkError};
use super::logs::{LogRing, LogSink};
use super::runtime::{Job, Running, Runtime, ShellRuntime};
use super::{ProviderEvent, ProviderSettings, metadata, source, supervisor};
use crate::events::{Bus, Delivery};

/// The service name a provider's `grpc.health.v1` must report SERVING.
const PROVIDER_SERVICE: &str = "corbel.provider.v1.Provider";
/// How long a provider has to exit once its host is gone.
const HOST_GONE_EXIT: Duration = Duration::from_secs(10);

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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    /// Works with Corbel, but not as the protocol asks.
    Warn,
    /// Not checked (e.g. no sample to deploy).
    Skip,
    Fail,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Warn => "WARN",
            Outcome::Skip => "SKIP",
            Outcome::Fail => "FAIL",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Row {
    pub check: String,
    pub outcome: Outcome,
    pub detail: String,
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub rows: Vec<Row>,
    /// The scratch directory, when kept.
    pub kept: Option<PathBuf>,
}

impl Report {
    pub fn failures(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| r.outcome == Outcome::Fail)
            .count()
    }

    /// The table printed at the end: one line per check, details wrapped
    /// under it when they run long.
    pub fn table(&self) -> String {
        let width = self.rows.iter().map(|r| r.check.len()).max().unwrap_or(5);
        let mut out = format!("{:width$}  RESULT  DETAIL\n", "CHECK");
        for row in &self.rows {
            let mut lines = row.detail.lines();
            let first = lines.next().unwrap_or("");
            let _ = writeln!(
                out,
                "{:width$}  {:6}  {first}",
                row.check,
                row.outcome.as_str()
            );
            for line in lines {
                let _ = writeln!(out, "{:width$}          {line}", "");
            }
        }
        let count = |o| self.rows.iter().filter(|r| r.outcome == o).count();
        let _ = writeln!(
            out,
            "\n{} passed, {} failed, {} warnings, {} skipped",
            count(Outcome::Pass),
            count(Outcome::Fail),
            count(Outcome::Warn),
            count(Outcome::Skip)
        );
        out
    }

    fn add(&mut self, check: impl Into<String>, outcome: Outcome, detail: impl Into<String>) {
        self.rows.push(Row {
            check: check.into(),
            outcome,
            detail: detail.into(),
        });
    }

    fn result(&mut self, check: impl Into<String>, result: Result<String, String>) -> bool {
        match result {
            Ok(detail) => {
                self.add(check, Outcome::Pass, detail);
                true
            }
            Err(detail) => {
                self.add(check, Outcome::Fail, detail);
                false
            }
        }
    }
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
        // The version it registered with: what the server would send it.
        let version = host
            .seen()
            .registrations
            .first()
            .map_or(1, |(request, _)| request.protocol_version);
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
        self.check_expired_deadline(&link).await;
        self.check_sigterm(&host, &mut started).await;
        if let Some(mut again) = self.start(&runtime, &job, &host, 2).await {
            self.check_host_gone(&host, &mut again).await;
        }
    }

    /// Fetch, `corbel-provider.yaml`, build: as the server's supervisor does.
    async fn prepare(&mut self) -> Option<(metadata::Metadata, ShellRuntime, Job)> {
        let settings = &self.options.settings;
        let checkout = self.dir.join("src");
        let shown = source::display_url(&self.options.source);
        (self.say)(&format!("fetching {shown}"));
        let say = self.say.clone();
        let fetched = source::fetch(
            &self.options.source,
            &self.options.reference,
            &checkout,
            &settings.source(),
            move |p| say(&supervisor::describe_progress(&p)),
        )
        .await;
        let commit = match fetched {
            Ok(fetched) => fetched.commit,
            Err(e) => {
                self.report.add("fetch", Outcome::Fail, e.to_string());
                return None;
            }
        };
        self.report
            .add("fetch", Outcome::Pass, format!("{shown} at {commit}"));
        let root = match supervisor::source_root(&checkout, &self.options.path) {
            Ok(root) => root,
            Err(e) => {
                self.report.add(metadata::FILE_NAME, Outcome::Fail, e);
                return None;
            }
        };
        let meta = match metadata::load(&root) {
            Ok(meta) => meta,
            Err(metadata::MetadataError::Missing { .. }) => {
                let message =
                    supervisor::missing_metadata(&checkout, &self.options.path, &shown, &commit);
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
        let runtime = match &meta.runtime {
            metadata::Runtime::Shell { build, run } => ShellRuntime {
                build: build.clone(),
                run: run.clone(),
            },
            metadata::Runtime::Docker(_) => {
                self.report.add(
                    "runtime",
                    Outcome::Fail,
                    "`corbel provider check` does not run the docker runtime yet; load the provider in a server",
                );
                return None;
            }
            metadata::Runtime::Remote => {
                self.report.add(
                    "runtime",
                    Outcome::Fail,
                    "a remote provider runs elsewhere: `corbel provider check` cannot start it; load it in a server with --provider-listen",
                );
                return None;
            }
        };
        let job = Job {
            source_dir: root,
            logs: self.log_sink(),
            build_timeout: settings.build_timeout,
            progress: std::sync::Arc::new(|_: &str| {}),
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
        let label = if count == 1 { "start" } else { "restart" };
        let register = if count == 1 {
            "register"
        } else {
            "register again"
        };
        (self.say)(&format!("{label}: {}", runtime.run));
        let mut running = match runtime.start(job, &env).await {
            Ok(running) => running,
            Err(e) => {
                self.report.add(label, Outcome::Fail, e.to_string());
                return None;
            }
        };
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
        })
    }

    fn check_handshake(&mut self, host: &CheckHost) {
        match host.seen().handshakes.first() {
            Some((theirs, Ok(chosen))) => self.report.add(
                "handshake",
                Outcome::Pass,
                format!("offered {theirs:?}, agreed on {chosen}"),
            ),
            Some((theirs, Err(e))) => self.report.add(
                "handshake",
                Outcome::Fail,
                format!("offered {theirs:?}: {e}"),
            ),
            None => self.report.add(
                "handshake",
                Outcome::Warn,
                "Registry.Handshake was not called",
            ),
        }
    }

    fn check_registration(&mut self, host: &CheckHost, meta: &metadata::Metadata) {
        let seen = host.seen();
        let Some((request, _)) = seen.registrations.first() else {
            return;
        };
        let said: HashSet<&String> = request.resource_types.iter().collect();
        let written: HashSet<&String> = meta.resource_types.iter().collect();
        if said == written {
            self.report.add(
                "resource types",
                Outcome::Pass,
                "as corbel-provider.yaml says",
            );
        } else {
            self.report.add(
                "resource types",
                Outcome::Fail,
                format!(
                    "Register says {:?}, corbel-provider.yaml says {:?}",
                    request.resource_types, meta.resource_types
                ),
            );
        }
        let said: HashSet<&String> = request.features.iter().collect();
        let written: HashSet<&String> = meta.features.iter().collect();
        if said != written {
            self.report.add(
                "features",
                Outcome::Warn,
                format!(
                    "Register says {:?}, corbel-provider.yaml says {:?}",
                    request.features, meta.features
                ),
            );
        }
    }

    async fn check_health(&mut self, link: &Link) {
        for service in ["", PROVIDER_SERVICE] {
            let shown = if service.is_empty() {
                "health (\"\")".to_owned()
            } else {
                format!("health ({service})")
            };
            let result = link
                .check_service_health(service, None)
                .await
                .map(|()| "SERVING".to_owned())
                .map_err(|e| e.to_string());
            self.report.result(shown, result);
        }
    }

    async fn check_configure(&mut self, link: &Link, good: &str) {
        let result = link.configure(good.to_owned()).await;
        self.report.result(
            "Configure",
            result
                .map(|()| format!("accepted {good}"))
                .map_err(|e| e.to_string()),
        );
        let bad = link.configure("{ not json".to_owned()).await;
        let result = match bad {
            Err(LinkError::Refused {
                code: tonic::Code::InvalidArgument,
                message,
                ..
            }) => Ok(format!("INVALID_ARGUMENT: {message}")),
            Err(e) => Err(format!("expected INVALID_ARGUMENT, got: {e}")),
            Ok(()) => Err("accepted a config_json that is not JSON".to_owned()),
        };
        self.report.result("Configure refuses bad JSON", result);
        match link.configure("[1, 2]".to_owned()).await {
            Err(LinkError::Refused {
                code: tonic::Code::InvalidArgument,
                ..
            }) => self.report.add(
                "Configure refuses a non-object",
                Outcome::Pass,
                "INVALID_ARGUMENT",
            ),
            Ok(()) => self.report.add(
                "Configure refuses a non-object",
                Outcome::Warn,
                "accepted `[1, 2]`: config_json is always a JSON object",
            ),
            Err(e) => self.report.add(
                "Configure refuses a non-object",
                Outcome::Fail,
                format!("expected INVALID_ARGUMENT, got: {e}"),
            ),
        }
        let again = link.configure(good.to_owned()).await;
        self.report.result(
            "Configure after a refusal",
            again
                .map(|()| "accepted".to_owned())
                .map_err(|e| e.to_string()),
        );
    }

    /// The first node's name, to place samples on, when it has nodes.
    async fn check_nodes(&mut self, link: &Link, meta: &metadata::Metadata) -> String {
        let offered = meta.features.iter().any(|f| f == "nodes");
        match link.list_nodes().await {
            Ok(nodes) => {
                let mut names = HashSet::new();
                let problem = if offered && nodes.is_empty() {
                    Some("no nodes, though the `nodes` feature is offered".to_owned())
                } else {
                    nodes.iter().find_map(|n| {
                        if n.name.is_empty() {
                            Some("a node without a name".to_owned())
                        } else if !names.insert(n.name.clone()) {
                            Some(format!("node `{}` listed twice", n.name))
                        } else {
                            None
                        }
                    })
                };
                let listed: Vec<String> = nodes
                    .iter()
                    .map(|n| {
                        let mut capacity: Vec<String> =
                            n.capacity.iter().map(|(k, v)| format!("{k}={v}")).collect();
                        capacity.sort();
                        format!("{} ({})", n.name, capacity.join(", "))
                    })
                    .collect();
                self.report.result(
                    "ListNodes",
                    match problem {
                        Some(problem) => Err(problem),
                        None => Ok(format!("{} node(s): {}", nodes.len(), listed.join("; "))),
                    },
                );
                nodes.first().map(|n| n.name.clone()).unwrap_or_default()
            }
            Err(LinkError::Refused {
                code: tonic::Code::Unimplemented,
                ..
            }) if !offered => {
                self.report
                    .add("ListNodes", Outcome::Pass, "not offered (UNIMPLEMENTED)");
                String::new()
            }
            Err(e) => {
                self.report.add("ListNodes", Outcome::Fail, e.to_string());
                String::new()
            }
        }
    }

    /// DescribeResources of the samples; the keys each sample's type says
    /// may change in place.
    async fn check_describe(
        &mut self,
        link: &Link,
        meta: &metadata::Metadata,
    ) -> HashMap<String, Vec<String>> {
        let mut updatable = HashMap::new();
        let resources: Vec<proto::Resource> = meta
            .check
            .resources
            .iter()
            .enumerate()
            .map(|(i, (kind, sample))| resource(&format!("sample-{i}"), kind, sample, "", ""))
            .collect();
        if resources.is_empty() {
            self.report.add(
                "DescribeResources",
                Outcome::Skip,
                "no samples under `check.resources`",
            );
            return updatable;
        }
        let kinds: HashMap<String, String> = resources
            .iter()
            .map(|r| (r.key.clone(), r.r#type.clone()))
            .collect();
        match link.describe_resources(resources).await {
            Ok(descriptions) => {
                let stray = descriptions.iter().find(|d| !kinds.contains_key(&d.key));
                self.report.result(
                    "DescribeResources",
                    match stray {
                        Some(d) => Err(format!("describes `{}`, which was not asked", d.key)),
                        None => Ok(format!("{} description(s)", descriptions.len())),
                    },
                );
                for description in descriptions {
                    if let Some(kind) = kinds.get(&description.key) {
                        updatable.insert(kind.clone(), description.updatable_keys);
                    }
                }
            }
            Err(LinkError::Refused {
                code: tonic::Code::Unimplemented,
                ..
            }) => self.report.add(
                "DescribeResources",
                Outcome::Pass,
                "not offered (UNIMPLEMENTED): nothing is described",
            ),
            Err(e) => self
                .report
                .add("DescribeResources", Outcome::Fail, e.to_string()),
        }
        updatable
    }

    /// Protocol version 2: a sample updated in place to its `check.updates`
    /// config, which Inspect then shows; the same update again changes
    /// nothing; an update of a resource that is gone is NOT_FOUND.
    async fn check_update(
        &mut self,
        link: &Link,
        kind: &str,
        sample: &serde_json::Value,
        update: Update<'_>,
        node: &str,
    ) {
        let row = format!("update {kind} in place");
        if update.version < corbel_proto::UPDATE_VERSION {
            self.report.add(
                row,
                Outcome::Skip,
                format!(
                    "protocol version {}: never sent UpdateResource, a changed {kind} is replaced",
                    update.version
                ),
            );
            return;
        }
        let updatable = update.updatable.unwrap_or_default();
        if updatable.is_empty() {
            self.report.add(
                row,
                Outcome::Skip,
                format!("DescribeResources lists no updatable_keys: a changed {kind} is replaced"),
            );
            return;
        }
        let Some(to) = update.to else {
            self.report.add(
                row,
                Outcome::Skip,
                format!(
                    "{updatable:?} may change in place, but there is no config to update the \
                     sample to: add one under `check.updates` in corbel-provider.yaml"
                ),
            );
            return;
        };
        let changed = changed_keys(sample, to);
        if changed.is_empty() {
            self.report.add(
                row,
                Outcome::Fail,
                format!("check.updates.{kind} is the sample as it is: change an updatable key"),
            );
            return;
        }
        if let Some(key) = changed.iter().find(|k| !updatable.contains(k)) {
            self.report.add(
                row,
                Outcome::Fail,
                format!(
                    "check.updates.{kind} changes `{key}`, which DescribeResources does not list \
                     as updatable ({updatable:?})"
                ),
            );
            return;
        }
        (self.say)(&format!("updating a {kind} in place"));
        let id = Uuid::new_v4().to_string();
        let before = resource("check-update", kind, sample, &id, node);
        let after = resource("check-update", kind, to, &id, node);
        let deployed = match deploy(link, &before).await {
            Ok(outputs) => outputs,
            Err(e) => {
                self.report
                    .add(row, Outcome::Fail, format!("deploying the sample: {e}"));
                return;
            }
        };
        let result = async {
            let outputs = update_call(link, &after, sample, &deployed).await?;
            match inspect(link, &after).await? {
                Some(seen) if seen == outputs => {}
                Some(seen) => {
                    return Err(format!(
                        "Inspect says {seen} after the update, which answered {outputs}"
                    ));
                }
                None => return Err("Inspect says absent after the update".to_owned()),
            }
            Ok(outputs)
        }
        .await;
        let updated = result.is_ok();
        self.report.result(
            row,
            result
                .as_ref()
                .map(|o| format!("{changed:?} changed; outputs {o}"))
                .map_err(Clone::clone),
        );
        let outputs = result.unwrap_or(deployed);
        if updated {
            let again = update_call(link, &after, to, &outputs)
                .await
                .and_then(|second| {
                    if second == outputs {
                        Ok("the same outputs, nothing new".to_owned())
                    } else {
                        Err(format!("outputs differ: first {outputs}, then {second}"))
                    }
                });
            self.report
                .result(format!("update {kind} again (same config)"), again);
        }
        if let Err(e) = destroy(link, &after, &outputs).await {
            self.report.add(
                format!("update {kind} of one gone (NOT_FOUND)"),
                Outcome::Fail,
                format!("destroying the updated sample: {e}"),
            );
            return;
        }
        let gone = update_gone(link, &after, to, &outputs).await;
        let (outcome, detail) = match gone {
            Ok(()) => (
                Outcome::Fail,
                "succeeded, though the resource was destroyed: answer NOT_FOUND".to_owned(),
            ),
            Err((Some(tonic::Code::NotFound), message)) => (Outcome::Pass, message),
            Err((_, message)) => (
                Outcome::Warn,
                format!("{message}; the protocol asks for NOT_FOUND when the resource is gone"),
            ),
        };
        self.report.add(
            format!("update {kind} of one gone (NOT_FOUND)"),
            outcome,
            detail,
        );
    }

    /// Deploy, deploy again, inspect, destroy, inspect, destroy again; then
    /// a deploy whose answer is lost, found by Inspect and finished by a retry.
    async fn check_lifecycle(
        &mut self,
        link: &Link,
        kind: &str,
        sample: &serde_json::Value,
        node: &str,
    ) {
        let id = Uuid::new_v4().to_string();
        let res = resource("check", kind, sample, &id, node);
        (self.say)(&format!("deploying a {kind}"));
        let first = deploy(link, &res).await;
        let Ok(outputs) = first.clone() else {
            self.report
                .result(format!("deploy {kind}"), first.map(|v| v.to_string()));
            return;
        };
        self.report.add(
            format!("deploy {kind}"),
            Outcome::Pass,
            format!("outputs {outputs}"),
        );
        let again = deploy(link, &res).await.and_then(|second| {
            if second == outputs {
                Ok("the same resource's outputs, nothing new".to_owned())
            } else {
                Err(format!("outputs differ: first {outputs}, then {second}"))
            }
        });
        self.report
            .result(format!("deploy {kind} again (same resource_id)"), again);
        let seen = inspect(link, &res).await.and_then(|found| match found {
            Some(found) if found == outputs => Ok("present, same outputs".to_owned()),
            Some(found) => Err(format!(
                "present, but outputs {found} differ from {outputs}"
            )),
            None => Err("says absent after a deploy".to_owned()),
        });
        self.report.result(format!("Inspect {kind}"), seen);
        self.destroy_and_verify(link, kind, &res, &outputs).await;

        // A deploy whose caller hangs up before any answer: the outcome is
        // lost, as when the server is killed mid-call.
        let lost_id = Uuid::new_v4().to_string();
        let lost = resource("check-lost", kind, sample, &lost_id, node);
        let result = async {
            drop(link.deploy_resource(deploy_request(&lost)).await);
            let found = inspect(link, &lost).await?;
            let retried = deploy(link, &lost).await?;
            match inspect(link, &lost).await? {
                Some(now) if now == retried => {}
                Some(now) => return Err(format!("Inspect says {now}, the retry said {retried}")),
                None => return Err("absent after the retried deploy".to_owned()),
            }
            destroy(link, &lost, &retried).await?;
            if inspect(link, &lost).await?.is_some() {
                return Err("still present after destroy".to_owned());
            }
            Ok(format!(
                "Inspect found it {} after the lost call; the retry converged and it was destroyed",
                if found.is_some() { "present" } else { "absent" }
            ))
        }
        .await;
        self.report
            .result(format!("lost deploy of {kind}: Inspect, retry"), result);
    }

    async fn destroy_and_verify(
        &mut self,
        link: &Link,
        kind: &str,
        res: &proto::Resource,
        outputs: &serde_json::Value,
    ) {
        let destroyed = destroy(link, res, outputs).await;
        let ok = destroyed.is_ok();
        self.report.result(format!("destroy {kind}"), destroyed);
        if !ok {
            return;
        }
        let gone = inspect(link, res).await.and_then(|found| match found {
            None => Ok("absent".to_owned()),
            Some(found) => Err(format!("still present: {found}")),
        });
        self.report
            .result(format!("Inspect {kind} after destroy"), gone);
        let twice = destroy(link, res, outputs).await;
        self.report
            .result(format!("destroy {kind} again (already gone)"), twice);
    }

    /// A call whose deadline passes before the provider answers must leave it
    /// serving (the server gives up on calls all the time).
    async fn check_expired_deadline(&mut self, link: &Link) {
        let hurried = link.clone().with_deadline(Duration::from_micros(1));
        let expired = matches!(hurried.list_nodes().await, Err(LinkError::Deadline { .. }));
        let result = link
            .check_health(None)
            .await
            .map(|()| {
                if expired {
                    "still SERVING after a ListNodes whose deadline passed".to_owned()
                } else {
                    "still SERVING (ListNodes beat a 1 µs deadline)".to_owned()
                }
            })
            .map_err(|e| e.to_string());
        self.report.result("survives an expired deadline", result);
    }

    async fn check_sigterm(&mut self, host: &CheckHost, started: &mut Started) {
        let grace = self.options.settings.stop_grace;
        (self.say)("stopping it with SIGTERM");
        signal(started.running.binding(), Signal::SIGTERM);
        let exit = tokio::time::timeout(grace, started.running.wait()).await;
        let result = match exit {
            Ok(exit) if exit == "exit status 0" => Ok(format!("{exit} within {grace:?}")),
            Ok(exit) => Err(format!("{exit}; a provider exits 0 on SIGTERM")),
            Err(_) => {
                started.running.stop(Duration::ZERO).await;
                Err(format!(
                    "still running {grace:?} after SIGTERM (stop_grace_ms); killed"
                ))
            }
        };
        self.report.result("exits 0 on SIGTERM", result);
        let session = started.session.clone();
        let unregistered = host
            .seen()
            .unregistrations
            .iter()
            .any(|u| u.session == session);
        if unregistered {
            self.report
                .add("Unregister on SIGTERM", Outcome::Pass, "with its session");
        } else {
            self.report.add(
                "Unregister on SIGTERM",
                Outcome::Warn,
                "did not call Registry.Unregister with its session before exiting",
            );
        }
    }

    async fn check_host_gone(&mut self, host: &CheckHost, started: &mut Started) {
        (self.say)("stopping the host");
        host.kill();
        let exit = tokio::time::timeout(HOST_GONE_EXIT, started.running.wait()).await;
        let result = match exit {
            Ok(exit) => Ok(format!("{exit} once the registry was gone")),
            Err(_) => {
                started.running.stop(Duration::ZERO).await;
                Err(format!(
                    "still running {HOST_GONE_EXIT:?} after its host went away: watch \
                     grpc.health.v1 Watch(\"corbel.provider.v1.Registry\") and exit when it \
                     is not SERVING or the stream breaks; killed"
                ))
            }
        };
        self.report.result("exits when the host goes away", result);
    }
}

fn path_text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

fn signal(binding: Option<Binding>, signal: Signal) {
    if let Some(Binding::ProcessGroup(group)) = binding {
        let _ = killpg(Pid::from_raw(group), signal);
    }
}

fn resource(
    key: &str,
    kind: &str,
    config: &serde_json::Value,
    id: &str,
    node: &str,
) -> proto::Resource {
    proto::Resource {
        key: key.to_owned(),
        r#type: kind.to_owned(),
        config_json: config.to_string(),
        resource_id: id.to_owned(),
        node: node.to_owned(),
        ..Default::default()
    }
}

fn deploy_request(res: &proto::Resource) -> proto::DeployResourceRequest {
    proto::DeployResourceRequest {
        resource: Some(res.clone()),
        dependency_outputs_json: Default::default(),
    }
}

async fn deploy(link: &Link, res: &proto::Resource) -> Result<serde_json::Value, String> {
    let stream = link
        .deploy_resource(deploy_request(res))
        .await
        .map_err(|e| e.to_string())?;
    follow(link, "DeployResource", stream).await
}

/// What `check_update` goes by.
struct Update<'a> {
    /// The version the provider registered with.
    version: u32,
    /// The keys DescribeResources listed for the type, if it described it.
    updatable: Option<&'a [String]>,
    /// `check.updates` for the type.
    to: Option<&'a serde_json::Value>,
}

/// The top-level keys whose values differ between two configs.
fn changed_keys(before: &serde_json::Value, after: &serde_json::Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let before = before.as_object().unwrap_or(&empty);
    let after = after.as_object().unwrap_or(&empty);
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .cloned()
        .collect()
}

fn update_request(
    res: &proto::Resource,
    previous: &serde_json::Value,
    outputs: &serde_json::Value,
) -> proto::UpdateResourceRequest {
    proto::UpdateResourceRequest {
        resource: Some(res.clone()),
        previous_config_json: previous.to_string(),
        outputs_json: outputs.to_string(),
        dependency_outputs_json: Default::default(),
    }
}

async fn update_call(
    link: &Link,
    res: &proto::Resource,
    previous: &serde_json::Value,
    outputs: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    let stream = link
        .update_resource(update_request(res, previous, outputs))
        .await
        .map_err(|e| e.to_string())?;
    follow(link, "UpdateResource", stream).await
}

/// An update of a resource that is gone: `Ok` if it succeeded, else the
/// status code it was refused with (none for an `error` event) and what was said.
async fn update_gone(
    link: &Link,
    res: &proto::Resource,
    previous: &serde_json::Value,
    outputs: &serde_json::Value,
) -> Result<(), (Option<tonic::Code>, String)> {
    let refused = |e: LinkError| match e {
        LinkError::Refused { code, .. } => (Some(code), e.to_string()),
        other => (None, other.to_string()),
    };
    let mut stream = link
        .update_resource(update_request(res, previous, outputs))
        .await
        .map_err(refused)?;
    while let Some(message) = link
        .next("UpdateResource", &mut stream)
        .await
        .map_err(refused)?
    {
        if let Some(Event::Error(failure)) = message.event {
            return Err((None, format!("an error event: {}", failure.message)));
        }
    }
    Ok(())
}

async fn destroy(
    link: &Link,
    res: &proto::Resource,
    outputs: &serde_json::Value,
) -> Result<String, String> {
    let stream = link
        .destroy_resource(proto::DestroyResourceRequest {
            resource: Some(res.clone()),
            outputs_json: outputs.to_string(),
        })
        .await
        .map_err(|e| e.to_string())?;
    follow(link, "DestroyResource", stream)
        .await
        .map(|_| "done".to_owned())
}

async fn inspect(link: &Link, res: &proto::Resource) -> Result<Option<serde_json::Value>, String> {
    let answer = link.inspect(res.clone()).await.map_err(|e| e.to_string())?;
    if !answer.present {
        return Ok(None);
    }
    parse_outputs("Inspect", &answer.outputs_json).map(Some)
}

/// Reads a deploy or destroy stream to its end, holding it to the rules:
/// progress and log events, then exactly one `done` or `error`, then the end.
async fn follow(
    link: &Link,
    call: &'static str,
    mut stream: tonic::Streaming<proto::ResourceEvent>,
) -> Result<serde_json::Value, String> {
    let mut end: Option<Result<serde_json::Value, String>> = None;
    let mut events = 0;
    loop {
        let next = link
            .next(call, &mut stream)
            .await
            .map_err(|e| format!("{e} (after {events} event(s))"))?;
        let Some(message) = next else {
            break;
        };
        events += 1;
        let event = message.event;
        if end.is_some() {
            return Err(format!(
                "{call} sent an event after its done/error: {event:?}; a stream ends with exactly one done or error"
            ));
        }
        match event {
            Some(Event::Done(done)) => end = Some(parse_outputs(call, &done.outputs_json)),
            Some(Event::Error(failure)) => {
                end = Some(Err(format!(
                    "{call} failed{}: {}",
                    if failure.retryable {
                        " (retryable)"
                    } else {
                        ""
                    },
                    failure.message
                )));
            }
            Some(Event::Progress(p)) if p.percent > 100 => {
                return Err(format!("{call} reported {}% progress", p.percent));
            }
            Some(_) => {}
            None => return Err(format!("{call} sent an empty event")),
        }
    }
    end.unwrap_or_else(|| {
        Err(format!(
            "{call}'s stream ended after {events} event(s) without done or error"
        ))
    })
}

fn parse_outputs(call: &str, text: &str) -> Result<serde_json::Value, String> {
    let text = if text.is_empty() { "{}" } else { text };
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value @ serde_json::Value::Object(_)) => Ok(value),
        Ok(other) => Err(format!(
            "{call}'s outputs_json is not a JSON object: {other}"
        )),
        Err(e) => Err(format!("{call}'s outputs_json is not JSON: {e}")),
    }
}
