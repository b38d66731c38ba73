//! Recovery and leases.
//!
//! At start every journal entry is settled: the resource is inspected through
//! its provider (waiting for the provider to connect: an entry is delayed, never
//! dropped), then adopted into its node or destroyed, per the intent and the
//! node's state. Deployments the previous process left deploying or destroying
//! are then resumed. The same settling runs for a call whose outcome was lost
//! while running (the provider went away mid-call).
//!
//! The reaper destroys deployments whose lease (`expiresAt`) has passed.
//!
//! Single-node: a replica would have to take over only the journal of a dead
//! replica, under the leader lease.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use uuid::Uuid;

use super::executor::{node_change_event, resource_call};
use super::{DeployError, DeploymentState, Deployments, Intent, NodeState};
use crate::store::deployments::{self as rows, JournalRow, NodeChange};

fn destroyed() -> NodeChange {
    NodeChange {
        state: NodeState::Destroyed.as_str().to_owned(),
        outputs: Some(None),
        ..NodeChange::default()
    }
}

/// How long one wait for a provider lasts before the stop signal is checked
/// again.
const WAIT_STEP: Duration = Duration::from_secs(5);

impl Deployments {
    /// Settles the journal and resumes interrupted deployments, in the
    /// background. Returns how many deployments it took up.
    pub async fn recover(&self) -> Result<usize, DeployError> {
        let entries = rows::journal(&self.inner.db).await?;
        let interrupted = rows::deployments_in(
            &self.inner.db,
            &[
                DeploymentState::Pending.as_str(),
                DeploymentState::InProgress.as_str(),
                DeploymentState::Destroying.as_str(),
            ],
        )
        .await?;
        let mut work: BTreeMap<Uuid, Vec<JournalRow>> = BTreeMap::new();
        for deployment in &interrupted {
            work.entry(deployment.id).or_default();
        }
        for entry in entries {
            work.entry(entry.deployment_id).or_default().push(entry);
        }
        let count = work.len();
        for (id, entries) in work {
            let lock = self.lock(id, "recover")?;
            let this = self.clone();
            self.inner.tasks.spawn(async move {
                for entry in entries {
                    if !this.settle(entry).await {
                        return; // stopping: the rest waits for the next start
                    }
                }
                match this.get(id).await.map(|d| d.state) {
                    Ok(DeploymentState::Pending | DeploymentState::InProgress) => {
                        this.record(
                            id,
                            super::EventKind::State,
                            None,
                            None,
                            "resuming after a restart".into(),
                        )
                        .await;
                        this.run_deploy(&lock, Vec::new()).await;
                    }
                    Ok(DeploymentState::Destroying) => this.run_destroy(&lock).await,
                    Ok(_) => {}
                    Err(e) => tracing::error!(deployment.id = %id, error = %e, "cannot resume"),
                }
            });
        }
        if count > 0 {
            tracing::info!(deployments = count, "recovering interrupted deployments");
        }
        Ok(count)
    }

    /// Settles an entry whose call's outcome is unknown, in the background.
    pub(super) fn settle_later(&self, entry: Uuid) {
        let this = self.clone();
        self.inner.tasks.spawn(async move {
            let found = rows::journal(&this.inner.db)
                .await
                .ok()
                .and_then(|all| all.into_iter().find(|e| e.id == entry));
            if let Some(entry) = found {
                this.settle(entry).await;
            }
        });
    }

    /// Inspects the entry's resource and makes its node tell the truth.
    /// Returns `false` when the server is stopping first.
    async fn settle(&self, entry: JournalRow) -> bool {
        let providers = &self.inner.providers;
        loop {
            if self.inner.stopping.is_cancelled() {
                return false;
            }
            if !providers.wait_connected(entry.provider_id, WAIT_STEP).await {
                continue;
            }
            match self.settle_once(&entry).await {
                Ok(()) => return true,
                Err(e) => {
                    tracing::warn!(
                        deployment.id = %entry.deployment_id,
                        error = %e,
                        "cannot settle a journal entry yet; trying again"
                    );
                    tokio::select! {
                        _ = self.inner.stopping.cancelled() => return false,
                        _ = tokio::time::sleep(WAIT_STEP) => {}
                    }
                }
            }
        }
    }

    async fn settle_once(&self, entry: &JournalRow) -> Result<(), String> {
        let db = &self.inner.db;
        let Some(node) = rows::find_node(db, entry.node_id)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(()); // the node is gone, and its entry with it
        };
        let call = resource_call(&node);
        let present = self
            .inner
            .providers
            .inspect(entry.provider_id, &call)
            .await
            .map_err(|e| e.to_string())?;
        let intent = Intent::parse(&entry.intent).map_err(|e| e.to_string())?;
        let state = NodeState::parse(&node.state).map_err(|e| e.to_string())?;
        let change = match (intent, state, present) {
            // Interrupted while deploying: adopt what exists, else deploy again.
            (Intent::Deploy, NodeState::InProgress, Some(outputs)) => Some(NodeChange {
                state: NodeState::Complete.as_str().to_owned(),
                outputs: Some(Some(outputs.to_string())),
                error: Some(None),
                ..NodeChange::default()
            }),
            (Intent::Deploy, NodeState::InProgress, None) => Some(NodeChange {
                state: NodeState::ToDeploy.as_str().to_owned(),
                run_id: Some(None),
                ..NodeChange::default()
            }),
            // A deploy given up on (the node already says why): what it may
            // have made must go. The node itself is left as the run left it.
            (Intent::Deploy, _, Some(outputs)) => {
                self.inner
                    .providers
                    .destroy(entry.provider_id, call, &outputs, |_| {})
                    .await
                    .map_err(|e| e.to_string())?;
                None
            }
            (Intent::Deploy, _, None) => None,
            // A destroy that was cut short: finish it.
            (Intent::Destroy, _, Some(outputs)) => {
                self.inner
                    .providers
                    .destroy(entry.provider_id, call, &outputs, |_| {})
                    .await
                    .map_err(|e| e.to_string())?;
                Some(destroyed())
            }
            (Intent::Destroy, _, None) => Some(destroyed()),
        };
        let Some(change) = change else {
            rows::drop_entry(db, entry.id)
                .await
                .map_err(|e| e.to_string())?;
            return Ok(());
        };
        let new_state = NodeState::parse(&change.state).map_err(|e| e.to_string())?;
        let event = (new_state != state)
            .then(|| node_change_event(&node, new_state, "settled after a lost call"));
        let stored = rows::finish_call(db, &node, entry.id, change, event)
            .await
            .map_err(|e| e.to_string())?;
        stored.into_iter().for_each(|e| self.publish(e));
        Ok(())
    }

    /// Destroys deployments whose lease has passed, until the server stops.
    pub async fn run_reaper(self) {
        let mut every = tokio::time::interval(self.inner.settings.reaper_interval);
        loop {
            tokio::select! {
                _ = self.inner.stopping.cancelled() => return,
                _ = every.tick() => {}
            }
            let expired = match rows::expired(
                &self.inner.db,
                Utc::now(),
                &[
                    DeploymentState::Complete.as_str(),
                    DeploymentState::Failed.as_str(),
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
                match self.destroy(deployment.id).await {
                    Ok(_) => {
                        tracing::info!(deployment.id = %deployment.id, "lease expired; destroying")
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
