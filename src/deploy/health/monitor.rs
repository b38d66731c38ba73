//! The health monitor, a leader singleton: it keeps one `WatchResources`
//! stream open per connected provider that can watch (opened again after a
//! link drop), asks the others with `Inspect` every
//! `[deploy] health_poll_interval_ms` (bounded in concurrency), and turns
//! the resources of a provider that has not been connected for
//! `[deploy] health_grace_ms` UNKNOWN (the node-status expiry of the deploy
//! core Corbel learns from). The roll-ups and the healer are singletons of
//! their own (`Health::run_rollups`, `Health::run_healer`).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use chrono::Utc;
use futures_util::StreamExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uuid::Uuid;

use super::super::step::resource_call;
use super::super::{DeploymentState, EventKind, NodeState};
use super::{Health, ResourceHealth, Sighting};
use crate::events::Delivery;
use crate::provider::{Observation, ProviderError, Watched};
use crate::store::deployments::{self as rows, NodeRow};
use crate::store::health as stored;

/// How often connections and watches are looked at, at most (more often
/// with a short grace or poll interval).
const TICK: Duration = Duration::from_secs(1);
/// Inspect calls in flight at once, per provider.
const POLL_CONCURRENCY: usize = 16;
/// The longest a look at what a run deployed waits for its answer.
const LOOK_ONCE_LIMIT: Duration = Duration::from_secs(30);
/// Observations of a watch applied together, at most.
const WATCH_BATCH: usize = 1_000;

/// What the monitor keeps between ticks.
#[derive(Default)]
struct Watching {
    /// Deployed nodes' ids by provider, as the last scan found them.
    nodes: HashMap<Uuid, Vec<Uuid>>,
    /// Each provider's watch task: false when it found the provider does
    /// not serve `WatchResources`.
    watchers: HashMap<Uuid, JoinHandle<bool>>,
    /// Providers not connected: since when, and whether their resources
    /// were turned UNKNOWN yet.
    away: HashMap<Uuid, (Instant, chrono::DateTime<Utc>, bool)>,
    last_scan: Option<Instant>,
    last_poll: HashMap<Uuid, Instant>,
    /// Each polled provider's poll under way.
    polls: HashMap<Uuid, JoinHandle<()>>,
    /// A deployment changed state: scan again at the next tick.
    rescan: bool,
    /// Whether each connected provider can watch (asked once per
    /// connection).
    watchable: HashMap<Uuid, bool>,
    /// Each deployment's worst deployed health at the last scan: one that
    /// moved is rolled up again (a safety net under the events).
    worst: HashMap<Uuid, ResourceHealth>,
    /// Deployments whose run ended since the last tick: what they deployed
    /// is looked at once (see [`Health::look_once`]).
    settled: BTreeSet<Uuid>,
    /// Those looks under way.
    looks: Vec<JoinHandle<()>>,
}

/// The monitor's tasks end with it: at shutdown, and when a replica stops
/// leading and its singletons are aborted (dropping this).
impl Drop for Watching {
    fn drop(&mut self) {
        for task in self.polls.values().chain(&self.looks) {
            task.abort();
        }
        for watcher in self.watchers.values() {
            watcher.abort();
        }
    }
}

impl Health<'_> {
    /// Watches and polls until the server stops (or this replica stops
    /// leading, when the task is aborted).
    pub async fn run_monitor(&self) {
        let mut events = Box::pin(self.0.events().subscribe());
        let settings = &self.0.inner.settings;
        // A poll (or scan) is due once the interval has passed since the
        // last, which a tick of the interval itself finds a whole tick late
        // about half the time: ticks of a quarter keep it within a quarter.
        let tick = TICK
            .min(settings.health_grace / 4)
            .min(settings.health_poll_interval / 4)
            .max(Duration::from_millis(20));
        let mut ticks = tokio::time::interval(tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut w = Watching::default();
        loop {
            tokio::select! {
                () = self.0.inner.stopping.cancelled() => break,
                _ = ticks.tick() => self.tick(&mut w).await,
                Some(delivery) = events.next() => self.saw(&mut w, &delivery),
            }
        }
    }

    /// A deployment's state changed: its roll-up and the scan are due.
    fn saw(&self, w: &mut Watching, delivery: &Delivery<super::super::DeploymentEvent>) {
        match delivery {
            Delivery::Event(e) if e.kind == EventKind::State && e.state.is_some() => {
                self.mark_dirty(e.deployment_id);
                w.rescan = true;
                let ended = e.state.and_then(|s| s.deployment_state());
                if matches!(
                    ended,
                    Some(DeploymentState::Complete | DeploymentState::Failed)
                ) {
                    w.settled.insert(e.deployment_id);
                }
            }
            Delivery::Event(_) => {}
            Delivery::Lagged(_) => w.rescan = true,
        }
    }

    async fn tick(&self, w: &mut Watching) {
        let settings = &self.0.inner.settings;
        let scan_due = w
            .last_scan
            .is_none_or(|at| at.elapsed() >= settings.health_poll_interval);
        if w.rescan || scan_due {
            w.rescan = false;
            if let Err(e) = self.scan(w).await {
                tracing::warn!(error = %e, "cannot read the deployed resources for their health");
            }
        }
        let providers: Vec<Uuid> = w.nodes.keys().copied().collect();
        for provider in providers {
            self.look_at(w, provider).await;
        }
        if !w.settled.is_empty() {
            self.look_at_settled(w).await;
        }
    }

    /// The deployed nodes of the deployments that settled, by watchable
    /// provider, each provider's looked at once. (A polled provider's are
    /// asked at its next poll anyway.)
    async fn look_at_settled(&self, w: &mut Watching) {
        w.looks.retain(|task| !task.is_finished());
        let mut by_provider: HashMap<Uuid, Vec<NodeRow>> = HashMap::new();
        for deployment in std::mem::take(&mut w.settled) {
            let nodes = match rows::nodes_of(&self.0.inner.db, deployment).await {
                Ok(nodes) => nodes,
                Err(e) => {
                    tracing::warn!(deployment.id = %deployment, error = %e, "cannot read a settled deployment's nodes for their health");
                    continue;
                }
            };
            for node in nodes.into_iter().filter(|n| n.state == NodeState::Complete) {
                if let Some(provider) = node.provider_id
                    && w.watchable.get(&provider) == Some(&true)
                {
                    by_provider.entry(provider).or_default().push(node);
                }
            }
        }
        for (provider, nodes) in by_provider {
            let this = self.0.clone();
            let task = tokio::spawn(async move { this.health().look_once(provider, nodes).await });
            w.looks.push(task);
        }
    }

    /// Reads every deployed node (only what it needs: ids and times), counts
    /// the gauges.
    async fn scan(&self, w: &mut Watching) -> Result<(), super::DeployError> {
        let db = &self.0.inner.db;
        let nodes = stored::nodes_in(db, NodeState::Complete).await?;
        let health: HashMap<Uuid, (String, chrono::DateTime<Utc>)> = stored::healths(db)
            .await?
            .into_iter()
            .map(|(node, health, seen_at)| (node, (health, seen_at)))
            .collect();
        let mut counts: HashMap<ResourceHealth, usize> = HashMap::new();
        let mut by_provider: HashMap<Uuid, Vec<Uuid>> = HashMap::new();
        let mut worst: HashMap<Uuid, ResourceHealth> = HashMap::new();
        for node in nodes {
            // As `node_health` has it for a deployed node: its row, unless
            // the node was written since (HEALTHY until told otherwise).
            let now = match health.get(&node.id) {
                Some((health, seen_at)) if *seen_at >= node.updated_at => {
                    health.parse().unwrap_or(ResourceHealth::Unknown)
                }
                _ => ResourceHealth::Healthy,
            };
            *counts.entry(now).or_default() += 1;
            let deployment = worst.entry(node.deployment_id).or_insert(now);
            *deployment = ResourceHealth::worst([*deployment, now]);
            if let Some(provider) = node.provider_id {
                by_provider.entry(provider).or_default().push(node.id);
            }
        }
        self.set_gauges(counts);
        for (deployment, now) in &worst {
            if w.worst.get(deployment) != Some(now) {
                self.mark_dirty(*deployment);
            }
        }
        for gone in w.worst.keys().filter(|d| !worst.contains_key(d)) {
            self.mark_dirty(*gone);
        }
        w.worst = worst;
        for gone in w.watchers.keys().copied().collect::<Vec<_>>() {
            if !by_provider.contains_key(&gone)
                && let Some(watcher) = w.watchers.remove(&gone)
            {
                watcher.abort();
            }
        }
        w.nodes = by_provider;
        w.last_scan = Some(Instant::now());
        Ok(())
    }

    /// The deployed nodes of `provider` among `ids`, read afresh.
    async fn deployed(&self, provider: Uuid, ids: &[Uuid]) -> Vec<NodeRow> {
        match rows::find_nodes(&self.0.inner.db, ids).await {
            Ok(nodes) => nodes
                .into_iter()
                .filter(|n| n.provider_id == Some(provider) && n.state == NodeState::Complete)
                .collect(),
            Err(e) => {
                tracing::warn!(provider.id = %provider, error = %e, "cannot read nodes for their health");
                Vec::new()
            }
        }
    }

    /// One provider: its watch kept open, its poll when due, or its grace.
    async fn look_at(&self, w: &mut Watching, provider: Uuid) {
        let providers = &self.0.inner.providers;
        let settings = &self.0.inner.settings;
        if !providers.is_connected(provider) {
            if let Some(watcher) = w.watchers.remove(&provider) {
                watcher.abort();
            }
            w.watchable.remove(&provider);
            let away = w
                .away
                .entry(provider)
                .or_insert_with(|| (Instant::now(), Utc::now(), false));
            if !away.2 && away.0.elapsed() >= settings.health_grace {
                away.2 = true;
                let at = away.1;
                self.unknown(provider, w.nodes.get(&provider), at).await;
            }
            return;
        }
        w.away.remove(&provider);
        let watchable = match w.watchable.get(&provider) {
            Some(known) => *known,
            None => {
                let known = providers.can_watch(provider).await;
                w.watchable.insert(provider, known);
                known
            }
        };
        if watchable {
            let finished = w.watchers.get(&provider).is_some_and(|t| t.is_finished());
            if finished
                && let Some(done) = w.watchers.remove(&provider)
                && !done.await.unwrap_or(true)
            {
                w.watchable.insert(provider, false);
                return;
            }
            if !w.watchers.contains_key(&provider) {
                let nodes = w.nodes.get(&provider).cloned().unwrap_or_default();
                let this = self.0.clone();
                let task = tokio::spawn(async move { this.health().watch(provider, nodes).await });
                w.watchers.insert(provider, task);
            }
            return;
        }
        let due = w
            .last_poll
            .get(&provider)
            .is_none_or(|at| at.elapsed() >= settings.health_poll_interval);
        // One poll at a time per provider, beside the monitor: a provider
        // slow to answer holds up no other.
        let polling = w.polls.get(&provider).is_some_and(|t| !t.is_finished());
        if due && !polling {
            w.last_poll.insert(provider, Instant::now());
            let nodes = w.nodes.get(&provider).cloned().unwrap_or_default();
            let this = self.0.clone();
            let task = tokio::spawn(async move { this.health().poll(provider, nodes).await });
            w.polls.insert(provider, task);
        }
    }

    /// Follows one provider's watch until it ends or breaks; false when the
    /// provider does not serve `WatchResources` after all (it is polled).
    async fn watch(&self, provider: Uuid, ids: Vec<Uuid>) -> bool {
        let nodes = self.deployed(provider, &ids).await;
        drop(ids);
        let calls: Vec<_> = nodes.iter().map(resource_call).collect();
        let watch = match self.0.inner.providers.watch(provider, &calls).await {
            Ok(watch) => watch,
            Err(ProviderError::Invalid(e)) => {
                tracing::warn!(provider.id = %provider, error = %e, "the provider registered `watch` but does not serve it; asking it with Inspect");
                return false;
            }
            Err(e) => {
                tracing::debug!(provider.id = %provider, error = %e, "cannot open the health watch");
                return true;
            }
        };
        tracing::debug!(provider.id = %provider, nodes = nodes.len(), "the health watch is open");
        drop((nodes, calls));
        // What the stream has ready is applied together: a thousand
        // resources dying at once are a few transactions, not a thousand.
        let mut batches = watch.into_stream().ready_chunks(WATCH_BATCH);
        while let Some(items) = batches.next().await {
            let mut seen = Vec::with_capacity(items.len());
            let mut ended = None;
            for item in items {
                match item {
                    Ok(Watched::Status(observation)) => seen.push(observation),
                    Ok(Watched::Synced) => {}
                    Err(e) => {
                        ended = Some(e);
                        break;
                    }
                }
            }
            tracing::debug!(provider.id = %provider, seen = ?seen.iter().map(|o| (&o.resource_id, o.seen, &o.reason)).collect::<Vec<_>>(), "the health watch saw");
            self.apply(provider, &seen).await;
            if let Some(e) = ended {
                tracing::debug!(provider.id = %provider, error = %e, "the health watch ended");
                break;
            }
        }
        true
    }

    /// What the provider knows of `nodes` (as just read) now: a watch opened for them and
    /// closed at its `synced`. A watch reports each change once, and a
    /// change that came while its node was still being deployed (a process
    /// that died before its run marked it deployed) was not recorded then:
    /// so what a run deployed is looked at once when the run ends.
    async fn look_once(&self, provider: Uuid, nodes: Vec<NodeRow>) {
        let calls: Vec<_> = nodes.iter().map(resource_call).collect();
        let watch = match self.0.inner.providers.watch(provider, &calls).await {
            Ok(watch) => watch,
            Err(e) => {
                tracing::debug!(provider.id = %provider, error = %e, "cannot look at what a run deployed");
                return;
            }
        };
        let mut stream = Box::pin(watch.into_stream());
        let mut seen = Vec::with_capacity(calls.len());
        let read = async {
            while let Some(item) = stream.next().await {
                match item {
                    Ok(Watched::Status(observation)) => seen.push(observation),
                    Ok(Watched::Synced) => return true,
                    Err(_) => return false,
                }
            }
            false
        };
        if matches!(tokio::time::timeout(LOOK_ONCE_LIMIT, read).await, Ok(true)) {
            self.apply(provider, &seen).await;
        }
    }

    /// Asks the provider about each node with `Inspect`, a few at a time.
    async fn poll(&self, provider: Uuid, ids: Vec<Uuid>) {
        let nodes = self.deployed(provider, &ids).await;
        let providers = &self.0.inner.providers;
        let answers = futures_util::stream::iter(nodes)
            .map(|node| async move {
                let answer = providers.observe(provider, &resource_call(&node)).await;
                (node, answer)
            })
            .buffer_unordered(POLL_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        let mut seen = Vec::with_capacity(answers.len());
        for (node, answer) in answers {
            match answer {
                Ok(observation) => seen.push(observation),
                Err(e) => {
                    tracing::debug!(node.id = %node.id, error = %e, "cannot inspect a resource");
                }
            }
        }
        self.apply(provider, &seen).await;
    }

    /// Records observations of the nodes they name, in order (each node
    /// read afresh: it may have moved on since the watch opened).
    async fn apply(&self, provider: Uuid, observations: &[Observation]) {
        let ids: Vec<Uuid> = observations
            .iter()
            .filter_map(|o| o.resource_id.parse().ok())
            .collect();
        if ids.is_empty() {
            return;
        }
        let nodes: HashMap<Uuid, NodeRow> = match rows::find_nodes(&self.0.inner.db, &ids).await {
            Ok(nodes) => nodes
                .into_iter()
                .filter(|n| n.provider_id == Some(provider))
                .map(|n| (n.id, n))
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read nodes for their health");
                return;
            }
        };
        let sightings: Vec<Sighting> = observations
            .iter()
            .filter_map(|o| {
                let node = nodes.get(&o.resource_id.parse::<Uuid>().ok()?)?;
                Some(Sighting::of(node, o))
            })
            .collect();
        if let Err(e) = self.record_all(&sightings).await {
            tracing::warn!(provider.id = %provider, error = %e, "cannot record resources' health");
        }
    }

    /// The provider has been away past the grace: its resources are UNKNOWN.
    async fn unknown(
        &self,
        provider: Uuid,
        nodes: Option<&Vec<Uuid>>,
        since: chrono::DateTime<Utc>,
    ) {
        let providers = &self.0.inner.providers;
        let name = match providers.get(provider).await {
            Ok(p) => p.name,
            Err(_) => provider.to_string(),
        };
        let reason = format!(
            "its provider `{name}` is not connected since {} (it was {} then)",
            since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            providers.live_status(provider).as_str(),
        );
        let ids: Vec<Uuid> = nodes.into_iter().flatten().copied().collect();
        // Read afresh: the scan's list may be stale.
        let nodes = self.deployed(provider, &ids).await;
        let now = Utc::now();
        let sightings: Vec<Sighting> = nodes
            .iter()
            .map(|node| Sighting {
                node,
                health: ResourceHealth::Unknown,
                reason: Some(&reason),
                at: now,
                drift: None,
                exit_code: None,
            })
            .collect();
        if let Err(e) = self.record_all(&sightings).await {
            tracing::warn!(provider.id = %provider, error = %e, "cannot record resources' health");
        }
    }
}
