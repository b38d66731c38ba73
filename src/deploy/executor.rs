//! Runs: a deploy (the nodes a redeploy marked are destroyed first, then
//! every node not complete is deployed; on failure with `ROLLBACK`, what the
//! operation created is destroyed) and a destroy. Each phase (`deploy_phase`,
//! `destroy_phase`) is a loop over the pure
//! [`Schedule`](super::schedule::Schedule): start what may start, one
//! [`step`](super::step) per node under the concurrency bound, tell the
//! schedule how each ended.
//!
//! The operation under way is stored on the deployment (`phase`,
//! `operation_id`), so a run cut short by a crash resumes as what it was: a
//! deploy as a deploy, a rollback as a rollback — one that destroys what the
//! operation created before the crash too.
//!
//! Owns running a started run to its end; never takes the run lock (the
//! caller in `runs` or `recovery` holds it) nor calls a provider itself (each
//! node's call is a `step`).

mod deploy_phase;
mod destroy_phase;
mod phase;

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use uuid::Uuid;

use super::blueprint::{self, Blueprint};
use super::describe::{describe, providers_away};
use super::lock::Lock;
use super::quotas::Quantities;
use super::schedule;
use super::{
    DEPLOYED, DeploymentState, Deployments, EventKind, NodeState, OnFailure, Phase, REPLACED,
};
use crate::store::deployments::{self as rows, NodeRow};
use phase::{Graph, node_states};

/// Why a run ended without finishing.
pub(super) enum Stopped {
    /// A resource failed: the first error.
    Failed(String),
    /// Resources failed only because their providers were away: the first
    /// error, and those providers.
    Away {
        error: String,
        providers: BTreeSet<Uuid>,
    },
    /// The server is stopping: the run ends at a journal boundary and resumes
    /// at the next start.
    Interrupted,
}

/// Which nodes a destroy phase takes.
#[derive(Clone, Copy)]
enum Scope {
    /// Every node not destroyed (a destroy).
    All,
    /// Nodes a redeploy marked `TO_DESTROY`.
    Marked,
    /// Nodes the operation deployed (a rollback).
    Operation(Uuid),
    /// Nodes an apply retires: replaced ones, and those no longer asked for.
    Retiring,
}

/// The executor part of [`Deployments`].
#[derive(Clone, Copy)]
pub(super) struct Executor<'a>(pub(super) &'a Deployments);

impl Executor<'_> {
    /// Runs a deploy (or redeploy) to its end: complete, failed (rolled back
    /// if asked), or interrupted by shutdown.
    pub(super) async fn run_deploy(&self, lock: &Lock) {
        let id = lock.id;
        let result = match self.deploy_operation(id).await {
            Ok(()) => match self.0.power().resting_state(id).await {
                Ok(state) => self.0.runs().settle(id, state, None).await,
                Err(e) => Err(e),
            },
            Err(Stopped::Interrupted) => {
                tracing::info!(deployment.id = %id, "deploy interrupted by shutdown; it resumes at the next start");
                Ok(())
            }
            Err(Stopped::Failed(error)) => self.fail_or_roll_back(id, error).await,
            Err(Stopped::Away { error, providers }) => {
                let failed = self.fail_or_roll_back(id, error).await;
                self.0.recovery().resume_when_back(id, providers);
                failed
            }
        };
        self.ran(id, result);
    }

    pub(super) async fn run_destroy(&self, lock: &Lock) {
        let id = lock.id;
        let result = match self.destroy_phase(id, None, Scope::All).await {
            Ok(()) => {
                self.0
                    .runs()
                    .settle(id, DeploymentState::Destroyed, None)
                    .await
            }
            Err(Stopped::Interrupted) => Ok(()),
            Err(Stopped::Failed(error) | Stopped::Away { error, .. }) => {
                self.0
                    .runs()
                    .settle(id, DeploymentState::Failed, Some(&error))
                    .await
            }
        };
        self.ran(id, result);
    }

    /// Resumes a rollback a crash interrupted.
    pub(super) async fn run_rollback(&self, lock: &Lock, error: String) {
        let id = lock.id;
        let result = self.roll_back(id, error).await;
        self.ran(id, result);
    }

    /// Runs an apply (`applyPlan`, a rollback to a revision) to its end:
    /// the replacements that cannot overlap are destroyed first, then
    /// creates and updates run in dependency order, then what the plan
    /// retires goes, dependents first. On failure, what was to be retired
    /// and still has no running replacement stays, running; the deployment
    /// ends `FAILED` and its revision with it.
    pub(super) async fn run_apply(&self, lock: &Lock) {
        let id = lock.id;
        let result = match self.apply_operation(id).await {
            Ok(()) => match self.0.power().resting_state(id).await {
                Ok(state) => self.0.runs().settle(id, state, None).await,
                Err(e) => Err(e),
            },
            Err(Stopped::Interrupted) => {
                tracing::info!(deployment.id = %id, "apply interrupted by shutdown; it resumes at the next start");
                Ok(())
            }
            Err(Stopped::Failed(error) | Stopped::Away { error, .. }) => {
                self.apply_failed(id, error).await
            }
        };
        self.ran(id, result);
    }

    async fn apply_operation(&self, id: Uuid) -> Result<(), Stopped> {
        let row = self.deployment_row(id).await.map_err(Stopped::Failed)?;
        let operation = row
            .operation_id
            .ok_or_else(|| Stopped::Failed("the apply has no operation".into()))?;
        let (bp, variables, _) = self.effective(id).await?;
        // The blueprint that ran before: its order retires what goes.
        let before = match crate::store::plans::find_plan(&self.0.inner.db, operation).await {
            Ok(Some(plan)) => blueprint::parse(&plan.base_source).ok(),
            Ok(None) => None,
            Err(e) => return Err(Stopped::Failed(e.to_string())),
        };
        self.destroy_phase(id, Some(&bp), Scope::Marked).await?;
        self.deploy_phase(id, &bp, &variables, operation).await?;
        self.destroy_phase(id, Some(before.as_ref().unwrap_or(&bp)), Scope::Retiring)
            .await?;
        crate::store::plans::remove_nodes(&self.0.inner.db, id, &[NodeState::Retired])
            .await
            .map_err(|e| Stopped::Failed(e.to_string()))?;
        Ok(())
    }

    /// An apply failed: what it was retiring, with no running replacement,
    /// keeps running; the deployment ends `FAILED`.
    async fn apply_failed(&self, id: Uuid, error: String) -> Result<(), super::DeployError> {
        let nodes = rows::nodes_of(&self.0.inner.db, id).await?;
        let running: BTreeSet<(&str, i32)> = nodes
            .iter()
            .filter(|n| DEPLOYED.contains(&n.state))
            .map(|n| (n.key.as_str(), n.replica))
            .collect();
        let restore: Vec<Uuid> = nodes
            .iter()
            .filter(|n| n.state == NodeState::ToRetire)
            .filter(|n| !running.contains(&(n.key.as_str(), n.replica)))
            .map(|n| n.id)
            .collect();
        crate::store::plans::move_nodes(&self.0.inner.db, &restore, NodeState::Complete).await?;
        crate::store::plans::remove_nodes(&self.0.inner.db, id, &[NodeState::Retired]).await?;
        self.0
            .runs()
            .settle(id, DeploymentState::Failed, Some(&error))
            .await
    }

    fn ran(&self, id: Uuid, result: Result<(), super::DeployError>) {
        if let Err(e) = result {
            tracing::error!(deployment.id = %id, error = %e, "cannot store the deployment's state");
        }
        // A call given up on left its entry; it is settled once its provider
        // is back.
        self.0.recovery().settle_later(id);
    }

    async fn fail_or_roll_back(&self, id: Uuid, error: String) -> Result<(), super::DeployError> {
        let row = rows::find_deployment(&self.0.inner.db, id)
            .await?
            .ok_or_else(|| super::DeployError::NotFound(format!("deployment {id} is gone")))?;
        // A restart (healing, or by hand) never rolls the deployment back:
        // what failed to come back stays FAILED, and the healer tries again.
        let restarting = row.phase.as_deref() == Some(Phase::Restart.as_str());
        match row.on_failure.parse::<OnFailure>()? {
            OnFailure::Rollback if !restarting => self.roll_back(id, error).await,
            OnFailure::Rollback => {
                self.0
                    .runs()
                    .settle(id, DeploymentState::Failed, Some(&error))
                    .await
            }
            OnFailure::Keep => {
                self.0
                    .runs()
                    .settle(id, DeploymentState::Failed, Some(&error))
                    .await
            }
        }
    }

    /// Destroys what the failed operation created; the deployment ends
    /// `FAILED` with the first error. The phase is stored first, so a crash
    /// resumes the rollback.
    async fn roll_back(&self, id: Uuid, error: String) -> Result<(), super::DeployError> {
        self.0
            .runs()
            .change(
                id,
                DeploymentState::InProgress,
                Some(Phase::Rollback),
                Some(&error),
                None,
            )
            .await?;
        self.0
            .runs()
            .record(
                id,
                EventKind::State,
                None,
                None,
                format!("rolling back: {error}"),
            )
            .await;
        let operation = rows::find_deployment(&self.0.inner.db, id)
            .await?
            .and_then(|row| row.operation_id);
        let Some(operation) = operation else {
            return self
                .0
                .runs()
                .settle(id, DeploymentState::Failed, Some(&error))
                .await;
        };
        match self
            .destroy_phase(id, None, Scope::Operation(operation))
            .await
        {
            Ok(()) => {
                self.0
                    .runs()
                    .settle(id, DeploymentState::Failed, Some(&error))
                    .await
            }
            Err(Stopped::Interrupted) => Ok(()),
            Err(
                Stopped::Failed(rollback)
                | Stopped::Away {
                    error: rollback, ..
                },
            ) => {
                let error = format!("{error}; the rollback failed too: {rollback}");
                self.0
                    .runs()
                    .settle(id, DeploymentState::Failed, Some(&error))
                    .await
            }
        }
    }

    async fn deploy_operation(&self, id: Uuid) -> Result<(), Stopped> {
        let row = self.deployment_row(id).await.map_err(Stopped::Failed)?;
        let state = row.state;
        let operation = match row.operation_id {
            Some(operation) => operation,
            // Stored before operations were: this run becomes one.
            None => {
                let operation = Uuid::now_v7();
                self.0
                    .runs()
                    .change(id, state, Some(Phase::Deploy), None, Some(operation))
                    .await
                    .map_err(|e| Stopped::Failed(e.to_string()))?;
                operation
            }
        };
        let (bp, variables, quantities) = self.effective(id).await?;
        let nodes = rows::nodes_of(&self.0.inner.db, id)
            .await
            .map_err(|e| Stopped::Failed(e.to_string()))?;
        if nodes.is_empty() {
            self.0
                .planner()
                .plan(id, &bp, &variables, &quantities)
                .await
                .map_err(|failure| match failure.away {
                    Some(provider) => Stopped::Away {
                        error: failure.error,
                        providers: BTreeSet::from([provider]),
                    },
                    None => Stopped::Failed(failure.error),
                })?;
        } else if state != DeploymentState::InProgress {
            self.0
                .runs()
                .change(
                    id,
                    DeploymentState::InProgress,
                    Some(Phase::Deploy),
                    None,
                    None,
                )
                .await
                .map_err(|e| Stopped::Failed(e.to_string()))?;
        }
        // A restart marked exactly what goes (the node, and the dependents
        // that read its outputs); a redeploy marked keys, whose dependents go
        // with them.
        if row.phase.as_deref() != Some(Phase::Restart.as_str()) {
            self.mark_dependents(id, &bp, &nodes).await?;
        }
        // Each phase reads the nodes as they are then.
        drop(nodes);
        self.destroy_phase(id, Some(&bp), Scope::Marked).await?;
        self.deploy_phase(id, &bp, &variables, operation).await
    }

    /// A redeploy marks the nodes asked for; their dependents (with the
    /// dependencies providers add) are replaced with them.
    async fn mark_dependents(
        &self,
        id: Uuid,
        bp: &Blueprint,
        nodes: &[NodeRow],
    ) -> Result<(), Stopped> {
        let graph = Graph::new(bp, nodes);
        let states = node_states(nodes);
        let marked: Vec<usize> = nodes
            .iter()
            .zip(&states)
            .filter(|(_, state)| **state == NodeState::ToDestroy)
            .filter_map(|(n, _)| graph.index.get(n.key.as_str()).copied())
            .collect();
        if marked.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = schedule::redeploy_scope(&graph.depends_on, &marked)
            .into_iter()
            .map(|k| graph.keys[k].clone())
            .collect();
        rows::mark_nodes(&self.0.inner.db, id, &keys, &REPLACED, NodeState::ToDestroy)
            .await
            .map_err(|e| Stopped::Failed(e.to_string()))?;
        Ok(())
    }

    async fn deployment_row(&self, id: Uuid) -> Result<rows::DeploymentRow, String> {
        rows::find_deployment(&self.0.inner.db, id)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("deployment {id} is gone"))
    }

    /// The blueprint of a deployment with the dependencies its providers add
    /// (`DescribeResources`), its bound variables, and what each resource
    /// counts against named quotas (by key, per replica). Waits for providers
    /// that are still loading or restarting.
    async fn effective(
        &self,
        id: Uuid,
    ) -> Result<(Blueprint, BTreeMap<String, Value>, Quantities), Stopped> {
        let row = self.deployment_row(id).await.map_err(Stopped::Failed)?;
        let bp = blueprint::parse(&row.source).map_err(|p| Stopped::Failed(p.to_string()))?;
        let variables: BTreeMap<String, Value> = serde_json::from_str(&row.variables)
            .map_err(|e| Stopped::Failed(format!("variables: {e}")))?;
        let described = match describe(self.0, &bp).await {
            Ok(described) => described,
            Err(_) if self.0.inner.stopping.is_cancelled() => return Err(Stopped::Interrupted),
            Err(error) => {
                // Failed while providers it needs are away: for want of them.
                let providers = providers_away(self.0, &bp).await;
                if providers.is_empty() {
                    return Err(Stopped::Failed(error));
                }
                return Err(Stopped::Away { error, providers });
            }
        };
        Ok((described.blueprint, variables, described.quantities))
    }
}
