//! Recovery and leases.
//!
//! At start every journal entry is settled (waiting for the provider to
//! connect: an entry is delayed, never dropped): a deploy cut short is made
//! again (`DeployResource` is idempotent: the provider adopts and finishes
//! what the lost call began); otherwise the resource is inspected through its
//! provider and destroyed if it exists, per the intent and the node's state. Deployments the previous process left under way are then
//! resumed as what they were doing: deploying, rolling back or destroying.
//! A deployment's entries are settled side by side (as many provider calls at
//! once as a run makes), their writes committed together. The same settling
//! runs, in the background, for a call a run gave up on.
//!
//! The lease: `extend` sets a deployment's `expiresAt` (within its project's
//! `maxLeaseSeconds`, see `quotas`); the reaper destroys deployments whose
//! lease has passed.
//!
//! With replicas, only the leader runs deployments, so the whole journal is
//! the dead leader's: a new leader settles all of it at its start, as a
//! restarted server does (`crash::replicas` SIGKILLs a leader mid-run).
//!
//! Never runs a DAG itself: a resumed deployment is handed to `executor`.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use uuid::Uuid;

use super::lock::Lock;
use super::quotas;
use super::step::{gone, node_change_event, resource_call};
use super::writer::Write;
use super::{DeployError, Deployment, DeploymentState, Deployments, Intent, NodeState, Phase};
use crate::store::deployments::{self as rows, JournalRow, NodeChange, NodeRow};

/// How long one wait for a provider lasts before the stop signal is checked
/// again.
const WAIT_STEP: Duration = Duration::from_secs(5);

/// The recovery part of [`Deployments`].
#[derive(Clone, Copy)]
pub struct Recovery<'a>(pub(super) &'a Deployments);

impl Recovery<'_> {
    /// Sets (or clears) the deployment's lease.
    pub async fn extend(
        &self,
        id: Uuid,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<Deployment, DeployError> {
        check_lease("expiresAt", expires_at, Utc::now())?;
        let deployment = self.0.queries().get(id).await?;
        let expires_at = quotas::lease_within_quota(
            &self.0.inner.db,
            "expiresAt",
            deployment.project_id,
            expires_at,
        )
        .await?;
        rows::set_expiry(&self.0.inner.db, id, expires_at).await?;
        // In the history, so whoever follows the deployment sees it move.
        let message = match expires_at {
            Some(at) => format!("lease moved: destroyed at {}", at.to_rfc3339()),
            None => "lease removed: kept until destroyed".to_owned(),
        };
        self.0
            .runs()
            .record(id, super::EventKind::State, None, None, message)
            .await;
        self.0.queries().get(id).await
    }

    /// Settles the journal and resumes interrupted deployments, in the
    /// background. Returns how many deployments it took up.
    pub async fn recover(&self) -> Result<usize, DeployError> {
        let interrupted = rows::deployments_in(
            &self.0.inner.db,
            &[
                DeploymentState::Pending,
                DeploymentState::InProgress,
                DeploymentState::Destroying,
            ],
        )
        .await?;
        let mut work: BTreeSet<Uuid> = interrupted.iter().map(|d| d.id).collect();
        work.extend(
            rows::journal(&self.0.inner.db)
                .await?
                .into_iter()
                .map(|e| e.deployment_id),
        );
        let count = work.len();
        for id in work {
            let lock = self.0.runs().lock(id, "recover")?;
            let this = self.0.clone();
            self.0
                .inner
                .tasks
                .spawn(async move { this.recovery().resume(lock).await });
        }
        if count > 0 {
            tracing::info!(deployments = count, "recovering interrupted deployments");
        }
        Ok(count)
    }

    /// Settles a deployment's journal, then resumes what it was doing.
    async fn resume(&self, lock: Lock) {
        let id = lock.id;
        if !self.settle_entries(id).await {
            return; // stopping: the rest waits for the next start
        }
        let row = match rows::find_deployment(&self.0.inner.db, id).await {
            Ok(Some(row)) => row,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(deployment.id = %id, error = %e, "cannot resume");
                return;
            }
        };
        let phase = row
            .phase
            .as_deref()
            .map(str::parse::<Phase>)
            .transpose()
            .map_err(DeployError::from);
        match (row.state, phase) {
            (DeploymentState::Pending | DeploymentState::InProgress, Ok(Some(Phase::Rollback))) => {
                self.0
                    .runs()
                    .record(
                        id,
                        super::EventKind::State,
                        None,
                        None,
                        "resuming the rollback after a restart".into(),
                    )
                    .await;
                let error = row.error.unwrap_or_else(|| "the deploy failed".into());
                self.0.executor().run_rollback(&lock, error).await;
            }
            (DeploymentState::Pending | DeploymentState::InProgress, Ok(Some(Phase::Apply))) => {
                self.0
                    .runs()
                    .record(
                        id,
                        super::EventKind::State,
                        None,
                        None,
                        "resuming the apply after a restart".into(),
                    )
                    .await;
                self.0.executor().run_apply(&lock).await;
            }
            (DeploymentState::Pending | DeploymentState::InProgress, Ok(_)) => {
                self.0
                    .runs()
                    .record(
                        id,
                        super::EventKind::State,
                        None,
                        None,
                        "resuming after a restart".into(),
                    )
                    .await;
                self.0.executor().run_deploy(&lock).await;
            }
            (DeploymentState::Destroying, Ok(_)) => self.0.executor().run_destroy(&lock).await,
            (_, Ok(_)) => {}
            (_, Err(e)) => {
                tracing::error!(deployment.id = %id, error = %e, "cannot resume");
            }
        }
    }

    /// Settles every journal entry of a deployment, waiting for providers as
    /// long as it takes. Returns `false` when the server is stopping first.
    async fn settle_entries(&self, id: Uuid) -> bool {
        let mut entries = match rows::journal_of(&self.0.inner.db, id).await {
            Ok(entries) => entries,
            Err(e) => {
                tracing::error!(deployment.id = %id, error = %e, "cannot read the journal");
                return true;
            }
        };
        while !entries.is_empty() {
            if self.0.inner.stopping.is_cancelled() {
                return false;
            }
            entries = self.settle_many(id, entries).await;
            if !entries.is_empty() && !self.pause().await {
                return false;
            }
        }
        true
    }

    /// Settles `entries` (all of deployment `id`) side by side, as many
    /// provider calls at once as a run makes, their writes queued in one
    /// send; returns those not settled yet (their provider not connected
    /// after a wait step, or an error, logged), to try again.
    async fn settle_many(&self, id: Uuid, entries: Vec<JournalRow>) -> Vec<JournalRow> {
        let inner = &self.0.inner;
        let nodes: HashMap<Uuid, NodeRow> = match rows::nodes_of(&inner.db, id).await {
            Ok(nodes) => nodes.into_iter().map(|n| (n.id, n)).collect(),
            Err(e) => {
                tracing::warn!(deployment.id = %id, error = %e, "cannot read the nodes; trying again");
                return entries;
            }
        };
        let mut connected = HashMap::new();
        for provider in entries.iter().map(|e| e.provider_id) {
            if let std::collections::hash_map::Entry::Vacant(slot) = connected.entry(provider) {
                slot.insert(inner.providers.wait_connected(provider, WAIT_STEP).await);
            }
        }
        let (ready, mut left): (Vec<JournalRow>, Vec<JournalRow>) =
            entries.into_iter().partition(|e| connected[&e.provider_id]);
        let settled: Vec<(JournalRow, Result<Option<Write>, String>)> =
            futures_util::stream::iter(ready)
                .map(|entry| async {
                    let outcome = match nodes.get(&entry.node_id) {
                        // The node is gone, and its entry with it.
                        None => Ok(None),
                        Some(node) => self.settle_with(&entry, node).await,
                    };
                    (entry, outcome)
                })
                .buffer_unordered(inner.settings.concurrency.max(1))
                .collect()
                .await;
        let mut writes = Vec::new();
        for (entry, outcome) in settled {
            match outcome {
                Ok(Some(write)) => writes.push((entry, write)),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(deployment.id = %id, error = %e, "cannot settle a journal entry yet; trying again");
                    left.push(entry);
                }
            }
        }
        let (entries, writes): (Vec<JournalRow>, Vec<Write>) = writes.into_iter().unzip();
        for (entry, committed) in entries.into_iter().zip(inner.writer.submit_all(writes)) {
            if let Err(e) = committed.wait().await {
                tracing::warn!(deployment.id = %id, error = %e, "cannot settle a journal entry yet; trying again");
                left.push(entry);
            }
        }
        left
    }

    /// In the background: settles the entries a run left (calls it gave up
    /// on) once their providers are back, under the deployment's lock. Does
    /// nothing when there are none.
    pub(super) fn settle_later(&self, id: Uuid) {
        let this = self.0.clone();
        self.0.inner.tasks.spawn(async move {
            loop {
                let entries = match rows::journal_of(&this.inner.db, id).await {
                    Ok(entries) if entries.is_empty() => return,
                    Ok(entries) => entries,
                    Err(e) => {
                        tracing::warn!(deployment.id = %id, error = %e, "cannot read the journal");
                        Vec::new()
                    }
                };
                // Waits for the providers before taking the lock, so requests
                // on the deployment are not refused while a provider is down.
                let providers: BTreeSet<Uuid> = entries.iter().map(|e| e.provider_id).collect();
                let mut connected = true;
                for provider in providers {
                    connected &= this
                        .inner
                        .providers
                        .wait_connected(provider, WAIT_STEP)
                        .await;
                }
                // A run holding the lock supersedes or settles what it meets.
                if connected
                    && let Ok(_lock) = this.runs().lock(id, "settle")
                    && this.recovery().settle_many(id, entries).await.is_empty()
                {
                    continue;
                }
                if !this.recovery().pause().await {
                    return;
                }
            }
        });
    }

    /// In the background: a deploy that failed only because `providers`
    /// were away is resumed once every one of them is connected again, if
    /// its `onFailure` is `KEEP` (a rolled-back deployment stays as it is)
    /// and nothing ran on it meanwhile (its operation is the same). Waits as
    /// long as this server runs; a deployment failed before a restart is
    /// resumed by hand (deploy it again).
    pub(super) fn resume_when_back(&self, id: Uuid, providers: BTreeSet<Uuid>) {
        let this = self.0.clone();
        self.0.inner.tasks.spawn(async move {
            let db = &this.inner.db;
            let failed = |row: &rows::DeploymentRow| {
                row.state == DeploymentState::Failed
                    && row.on_failure.parse::<super::OnFailure>().ok()
                        == Some(super::OnFailure::Keep)
            };
            let operation = match rows::find_deployment(db, id).await {
                Ok(Some(row)) if failed(&row) => row.operation_id,
                _ => return,
            };
            // Still as the run left it: nobody deployed it again or destroyed
            // it meanwhile (that would stand).
            let unchanged = || async {
                matches!(rows::find_deployment(db, id).await,
                    Ok(Some(row)) if failed(&row) && row.operation_id == operation)
            };
            // A step first: a link that failed but still counts as connected
            // is marked lost by then (`check_after_loss`), so what is waited
            // for is a new session, not the one that failed.
            if !this.recovery().pause().await {
                return;
            }
            loop {
                let mut back = true;
                for provider in &providers {
                    back &= this
                        .inner
                        .providers
                        .wait_connected(*provider, WAIT_STEP)
                        .await;
                }
                if back {
                    break;
                }
                if !unchanged().await || !this.recovery().pause().await {
                    return;
                }
            }
            // A run of someone else's may have it.
            let Ok(lock) = this.runs().lock(id, "resume") else {
                return;
            };
            if !unchanged().await {
                return;
            }
            this.runs()
                .record(
                    id,
                    super::EventKind::State,
                    None,
                    None,
                    "resuming: the providers it failed for are back".into(),
                )
                .await;
            this.executor().run_deploy(&lock).await;
        });
    }

    /// Waits a step; `false` when the server stops first.
    async fn pause(&self) -> bool {
        tokio::select! {
            _ = self.0.inner.stopping.cancelled() => false,
            _ = tokio::time::sleep(WAIT_STEP) => true,
        }
    }

    /// Inspects the entry's resource and makes its node tell the truth:
    /// returns the write that does (the node's change and the entry's end),
    /// for the caller to queue, or `None` when nothing is left to write.
    async fn settle_with(
        &self,
        entry: &JournalRow,
        node: &NodeRow,
    ) -> Result<Option<Write>, String> {
        let intent = entry
            .intent
            .parse::<Intent>()
            .map_err(|e| DeployError::from(e).to_string())?;
        let state = node.state;
        let Some(change) = self.settled_change(entry, node, intent, state).await? else {
            rows::drop_entry(&self.0.inner.db, entry.id)
                .await
                .map_err(|e| e.to_string())?;
            return Ok(None);
        };
        let new_state = change.state;
        let event = (new_state != state)
            .then(|| node_change_event(node, new_state, "settled after a lost call"));
        Ok(Some(Write::Finish {
            deployment: node.deployment_id,
            node: node.id,
            entry: entry.id,
            change,
            event,
        }))
    }

    /// What the node becomes once the lost call of `entry` (`intent`, with
    /// the node in `state`) is settled, finishing a destroy it cut short or
    /// undoing a deploy given up on; `None` when the node stays as it is.
    async fn settled_change(
        &self,
        entry: &JournalRow,
        node: &NodeRow,
        intent: Intent,
        state: NodeState,
    ) -> Result<Option<NodeChange>, String> {
        let providers = &self.0.inner.providers;
        let call = resource_call(node);
        // Interrupted while deploying: deploy again. `DeployResource` is
        // idempotent per resource id, so the provider adopts what the lost
        // call made, and finishes it: a container created but not started
        // yet exists (`Inspect` finds it) but is not deployed. A node still
        // `TO_DEPLOY` or `TAINTED` had its entry written ahead of its call
        // (it waited for a permit), and the call may have started before its
        // change to `IN_PROGRESS` was stored: the same.
        let redeploy = intent == Intent::Deploy && is_deploying(state);
        let present = if redeploy || intent == Intent::Update {
            None
        } else {
            providers
                .inspect(entry.provider_id, &call)
                .await
                .map_err(|e| e.to_string())?
        };
        Ok(match (intent, state, present) {
            (Intent::Deploy, _, _) if redeploy => Some(NodeChange {
                run_id: Some(None),
                ..NodeChange::to(NodeState::ToDeploy)
            }),
            // A deploy given up on (the node already says why): what it may
            // have made must go. The node itself is left as the run left it.
            (Intent::Deploy, _, Some(outputs)) => {
                providers
                    .destroy(entry.provider_id, call, &outputs, |_| {})
                    .await
                    .map_err(|e| e.to_string())?;
                None
            }
            (Intent::Deploy, _, None) => None,
            // Interrupted while updating: update again when the apply
            // resumes (`UpdateResource` to the same config is idempotent);
            // the node still holds the config it had.
            (Intent::Update, NodeState::Updating, _) => Some(NodeChange::to(NodeState::ToUpdate)),
            (Intent::Update, _, _) => None,
            // A destroy that was cut short: finish it. Absent too, the
            // provider is told (a destroy is idempotent): what it still
            // records of the resource (a dead process's record) goes.
            (Intent::Destroy, _, present) => {
                let outputs = present.unwrap_or_else(|| {
                    node.outputs
                        .as_deref()
                        .and_then(|o| serde_json::from_str(o).ok())
                        .unwrap_or_else(|| serde_json::json!({}))
                });
                match providers
                    .destroy(entry.provider_id, call, &outputs, |_| {})
                    .await
                {
                    Ok(()) | Err(crate::provider::ProviderError::NotFound(_)) => {}
                    Err(e) => return Err(e.to_string()),
                }
                Some(gone(node).0)
            }
        })
    }

    /// Deletes the deployment events older than `[deploy]
    /// event_retention_days` (none when 0): at start, then hourly, until the
    /// server stops. The deletes go in batches, so writers barely wait.
    pub async fn run_event_pruning(&self) {
        let days = self.0.inner.settings.event_retention_days;
        if days == 0 {
            return;
        }
        let mut every = tokio::time::interval(std::time::Duration::from_secs(3600));
        loop {
            tokio::select! {
                _ = self.0.inner.stopping.cancelled() => return,
                _ = every.tick() => {}
            }
            let before = Utc::now() - chrono::TimeDelta::days(i64::from(days));
            match rows::prune_events(&self.0.inner.db, before).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(events = n, days, "pruned old deployment events"),
                Err(e) => tracing::warn!(error = %e, "pruning deployment events failed"),
            }
        }
    }

    /// Destroys deployments whose lease has passed, until the server stops.
    pub async fn run_reaper(&self) {
        let mut every = tokio::time::interval(self.0.inner.settings.reaper_interval);
        loop {
            tokio::select! {
                _ = self.0.inner.stopping.cancelled() => return,
                _ = every.tick() => {}
            }
            let expired = match rows::expired(
                &self.0.inner.db,
                Utc::now(),
                &[
                    DeploymentState::Complete,
                    DeploymentState::Suspended,
                    DeploymentState::Failed,
                ],
            )
            .await
            {
                Ok(found) => found,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot look for expired deployments");
                    continue;
                }
            };
            for deployment in expired {
                // Said in the deployment's error and events, not only here.
                let reason = match deployment.expires_at {
                    Some(at) => format!(
                        "lease expired at {}",
                        at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    ),
                    None => "lease expired".to_owned(),
                };
                match self
                    .0
                    .runs()
                    .destroy_because(deployment.id, Some(&reason))
                    .await
                {
                    Ok(_) => {
                        tracing::info!(deployment.id = %deployment.id, "{reason}; destroying")
                    }
                    // Busy: the next round tries again.
                    Err(DeployError::Conflict(_)) => {}
                    Err(e) => {
                        tracing::warn!(deployment.id = %deployment.id, error = %e, "cannot reap")
                    }
                }
            }
        }
    }
}

/// A lease must end in the future: one already past would be accepted only
/// to be destroyed by the next round of the reaper. `field` is the argument's
/// name, as the caller wrote it.
pub(super) fn check_lease(
    field: &str,
    expires_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<(), DeployError> {
    match expires_at {
        Some(at) if at <= now => Err(DeployError::Invalid(format!(
            "`{field}` {} is not in the future (the server's time is {}): give a later \
             time, or none for no lease",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        ))),
        _ => Ok(()),
    }
}

/// Whether a node with a deploy's entry was being deployed when the entry
/// was left: `IN_PROGRESS`, or still as it was before its call (an entry
/// written while the step waited for a permit). A node the run gave up on
/// says `FAILED`.
fn is_deploying(state: NodeState) -> bool {
    matches!(
        state,
        NodeState::InProgress | NodeState::ToDeploy | NodeState::Tainted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_must_end_in_the_future() {
        let now: DateTime<Utc> = "2026-05-01T12:00:00Z".parse().unwrap();
        assert!(check_lease("expiresAt", None, now).is_ok());
        assert!(check_lease("expiresAt", Some(now + chrono::Duration::seconds(1)), now).is_ok());
        for past in [now, now - chrono::Duration::days(1)] {
            let e = check_lease("expiresAt", Some(past), now)
                .unwrap_err()
                .to_string();
            assert!(e.contains("`expiresAt`"), "{e}");
            assert!(
                e.contains("2026-05-01T12:00:00Z"),
                "names the server's time: {e}"
            );
        }
    }
}
