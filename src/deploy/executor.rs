//! Runs: a deploy (the nodes a redeploy marked are destroyed first, then
//! every node not complete is deployed; on failure with `ROLLBACK`, what the
//! operation created is destroyed) and a destroy. Each phase is a loop over
//! the pure [`Schedule`]: start what may start, one [`step`](super::step) per
//! node under the concurrency bound, tell the schedule how each ended.
//!
//! The operation under way is stored on the deployment (`phase`,
//! `operation_id`), so a run cut short by a crash resumes as what it was: a
//! deploy as a deploy, a rollback as a rollback — one that destroys what the
//! operation created before the crash too.
//!
//! Owns running a started run to its end; never takes the run lock (the
//! caller in `runs` or `recovery` holds it) nor calls a provider itself (each
//! node's call is a `step`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use uuid::Uuid;

use super::blueprint::{self, Blueprint};
use super::changes::Capability;
use super::plan::Quantities;
use super::plans::Described;
use super::runs::Lock;
use super::schedule::{self, Direction, Schedule};
use super::step::{Begun, StepError};
use super::template;
use super::writer::Write;
use super::{
    DEPLOYED, DeploymentState, Deployments, EventKind, NodeState, OnFailure, Phase, REPLACED,
    RETIRING,
};
use crate::provider::ResourceCall;
use crate::store::deployments::{self as rows, NodeChange, NodeRow};

/// Why a run ended without finishing.
pub(super) enum Stopped {
    /// A resource failed: the first error.
    Failed(String),
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
            Err(Stopped::Failed(error)) => {
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
            Err(Stopped::Failed(error)) => self.apply_failed(id, error).await,
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
        crate::store::plans::remove_nodes(&self.0.inner.db, id, &[NodeState::Retired.as_str()])
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
            .filter(|n| {
                n.state
                    .parse::<NodeState>()
                    .is_ok_and(|s| DEPLOYED.contains(&s))
            })
            .map(|n| (n.key.as_str(), n.replica))
            .collect();
        let restore: Vec<Uuid> = nodes
            .iter()
            .filter(|n| n.state == NodeState::ToRetire.as_str())
            .filter(|n| !running.contains(&(n.key.as_str(), n.replica)))
            .map(|n| n.id)
            .collect();
        crate::store::plans::move_nodes(&self.0.inner.db, &restore, NodeState::Complete.as_str())
            .await?;
        crate::store::plans::remove_nodes(&self.0.inner.db, id, &[NodeState::Retired.as_str()])
            .await?;
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
        match row.on_failure.parse::<OnFailure>()? {
            OnFailure::Rollback => self.roll_back(id, error).await,
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
            Err(Stopped::Failed(rollback)) => {
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
        let state = row.state.parse::<DeploymentState>().map_err(corrupt)?;
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
                .map_err(Stopped::Failed)?;
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
        self.mark_dependents(id, &bp, &nodes).await?;
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
        let states = node_states(nodes)?;
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
        rows::mark_nodes(
            &self.0.inner.db,
            id,
            &keys,
            &REPLACED.map(NodeState::as_str),
            NodeState::ToDestroy.as_str(),
        )
        .await
        .map_err(|e| Stopped::Failed(e.to_string()))?;
        Ok(())
    }

    /// Deploys every node not complete, dependencies first.
    async fn deploy_phase(
        &self,
        id: Uuid,
        bp: &Blueprint,
        variables: &BTreeMap<String, Value>,
        operation: Uuid,
    ) -> Result<(), Stopped> {
        let nodes = rows::nodes_of(&self.0.inner.db, id)
            .await
            .map_err(|e| Stopped::Failed(e.to_string()))?;
        let graph = Graph::new(bp, &nodes);
        let states = node_states(&nodes)?;
        let pending = graph.group(
            nodes
                .iter()
                .zip(&states)
                .filter(|(_, state)| !DEPLOYED.contains(state) && !RETIRING.contains(state))
                .map(|(n, _)| n),
        );
        // Replica 0 speaks for its resource; a dependent starts only once all
        // of a resource's replicas are complete.
        let mut outputs: BTreeMap<String, Value> = nodes
            .iter()
            .zip(&states)
            .filter(|(n, state)| n.replica == 0 && DEPLOYED.contains(state))
            .filter_map(|(n, _)| {
                Some((
                    n.key.clone(),
                    serde_json::from_str(n.outputs.as_deref()?).ok()?,
                ))
            })
            .collect();
        let units: Vec<usize> = pending.iter().map(Vec::len).collect();
        let mut schedule = Schedule::new(&graph.depends_on, &units, Direction::Deploy);
        let limit = Arc::new(Semaphore::new(self.0.inner.settings.concurrency.max(1)));
        let mut running: JoinSet<(usize, i32, Deployed)> = JoinSet::new();
        let mut run = RunState::default();
        // Results queued to the writer; all durable before the phase ends.
        let mut committing = Vec::new();
        // Results of the steps that ended since the last turn, to queue.
        let mut results: Vec<Write> = Vec::new();
        loop {
            // The results, then the entries of the steps they let start that
            // can call at once (a permit free, the provider connected), in
            // one send: one commit per link of a chain. A step that must wait
            // writes its own entry once it may call.
            let finished = results.len();
            let mut writes = std::mem::take(&mut results);
            let mut starts = Vec::new();
            while !self.0.inner.stopping.is_cancelled()
                && let Some((key, _)) = schedule.start_next()
            {
                let resource = Graph::resource(bp, key);
                let dependency_outputs: Vec<(String, Value)> = resource
                    .into_iter()
                    .flat_map(|r| &r.depends_on)
                    .filter_map(|d| outputs.get(d).map(|o| (d.clone(), o.clone())))
                    .collect();
                let rendered = match resource {
                    Some(r) => template::render(
                        &r.config,
                        &template::Context {
                            variables,
                            outputs: &outputs,
                        },
                    )
                    .map_err(|p| format!("config: {p}")),
                    None => Err("the resource is not in the blueprint".to_owned()),
                };
                for node in &pending[key] {
                    let updating = is_update(node);
                    let early = match (&rendered, node.provider_id) {
                        (Ok(config), Some(provider))
                            if !updating && self.0.inner.providers.is_connected(provider) =>
                        {
                            limit.clone().try_acquire_owned().ok().map(|permit| {
                                let (entry, write) = self.0.steps().begin_deploy(
                                    node,
                                    provider,
                                    config.clone(),
                                    operation,
                                );
                                writes.push(write);
                                (entry, permit)
                            })
                        }
                        _ => None,
                    };
                    starts.push((
                        key,
                        node.clone(),
                        rendered.clone(),
                        dependency_outputs.clone(),
                        early,
                    ));
                }
            }
            let mut queued = self.0.inner.writer.submit_all(writes).into_iter();
            committing.extend(queued.by_ref().take(finished));
            for (key, node, rendered, dependency_outputs, early) in starts {
                let this = self.0.clone();
                let limit = limit.clone();
                let early = early.map(|(entry, permit)| {
                    let committed = queued.next().expect("one send per entry");
                    (Begun { entry, committed }, permit)
                });
                running.spawn(async move {
                    let replica = node.replica;
                    let result = match rendered {
                        Ok(config) => {
                            let (begun, _permit) = match early {
                                Some((begun, permit)) => (Some(begun), Ok(permit)),
                                None => (None, limit.acquire_owned().await),
                            };
                            if is_update(&node) {
                                this.steps()
                                    .update_node(node, config, dependency_outputs, operation)
                                    .await
                            } else {
                                this.steps()
                                    .deploy_node(node, config, dependency_outputs, operation, begun)
                                    .await
                            }
                        }
                        Err(error) => {
                            this.steps().fail_node(&node, &error).await;
                            Err(StepError::Invalid(error))
                        }
                    };
                    (key, replica, result)
                });
            }
            let Some(joined) = running.join_next().await else {
                break;
            };
            // Every step that has ended, so their results share a send.
            let mut ended = vec![joined];
            while let Some(more) = running.try_join_next() {
                ended.push(more);
            }
            for joined in ended {
                let (key, replica, result) = match joined {
                    Ok(done) => done,
                    Err(e) => {
                        run.failed(format!("a resource task failed: {e}"));
                        continue;
                    }
                };
                match result {
                    Ok((out, finish)) => {
                        results.push(finish);
                        if replica == 0 {
                            outputs.insert(graph.keys[key].clone(), out);
                        }
                        schedule.finish(key, true);
                    }
                    Err(StepError::Stopping) => {
                        run.interrupted = true;
                        schedule.finish(key, false);
                    }
                    Err(error) => {
                        run.failed(format!("{}[{replica}]: {error}", graph.keys[key]));
                        for blocked in schedule.finish(key, false) {
                            self.taint(&pending[blocked], &graph.keys[blocked], &graph.keys[key])
                                .await;
                        }
                    }
                }
            }
        }
        for committed in committing {
            if let Err(e) = committed.wait().await {
                run.failed(format!("cannot store a result: {e}"));
            }
        }
        run.end(&schedule, &graph, self.0.inner.stopping.is_cancelled())
    }

    /// Destroys the nodes of `scope`, dependents first. A node that fails to
    /// go keeps what it depends on in place and fails the phase. `bp` is the
    /// effective blueprint when the caller has it, else the stored one.
    async fn destroy_phase(
        &self,
        id: Uuid,
        bp: Option<&Blueprint>,
        scope: Scope,
    ) -> Result<(), Stopped> {
        let stored;
        let bp = match bp {
            Some(bp) => bp,
            None => {
                let row = self.deployment_row(id).await.map_err(Stopped::Failed)?;
                stored =
                    blueprint::parse(&row.source).map_err(|p| Stopped::Failed(p.to_string()))?;
                &stored
            }
        };
        let nodes = rows::nodes_of(&self.0.inner.db, id)
            .await
            .map_err(|e| Stopped::Failed(e.to_string()))?;
        let graph = Graph::new(bp, &nodes);
        let states = node_states(&nodes)?;
        let chosen = graph.group(
            nodes
                .iter()
                .zip(&states)
                .filter(|(n, state)| match scope {
                    Scope::All => !matches!(state, NodeState::Destroyed | NodeState::Retired),
                    Scope::Marked => {
                        matches!(state, NodeState::ToDestroy | NodeState::Destroying)
                    }
                    Scope::Operation(op) => {
                        n.run_id == Some(op)
                            && !matches!(state, NodeState::Destroyed | NodeState::Retired)
                    }
                    Scope::Retiring => matches!(state, NodeState::ToRetire | NodeState::Retiring),
                })
                .map(|(n, _)| n),
        );
        let units: Vec<usize> = chosen.iter().map(Vec::len).collect();
        if units.iter().all(|u| *u == 0) {
            return Ok(());
        }
        let mut schedule = Schedule::new(&graph.depends_on, &units, Direction::Destroy);
        let limit = Arc::new(Semaphore::new(self.0.inner.settings.concurrency.max(1)));
        let mut running: JoinSet<(usize, Result<(), StepError>)> = JoinSet::new();
        let mut run = RunState::default();
        loop {
            while !self.0.inner.stopping.is_cancelled()
                && let Some((key, _)) = schedule.start_next()
            {
                for node in &chosen[key] {
                    let this = self.0.clone();
                    let node = node.clone();
                    let limit = limit.clone();
                    running.spawn(async move {
                        let _permit = limit.acquire_owned().await;
                        (key, this.steps().destroy_node(node).await)
                    });
                }
            }
            let Some(joined) = running.join_next().await else {
                break;
            };
            match joined {
                Ok((key, Ok(()))) => {
                    schedule.finish(key, true);
                }
                Ok((key, Err(StepError::Stopping))) => {
                    run.interrupted = true;
                    schedule.finish(key, false);
                }
                Ok((key, Err(error))) => {
                    run.failed(format!("destroying {}: {error}", graph.keys[key]));
                    schedule.finish(key, false);
                }
                Err(e) => run.failed(format!("a destroy task failed: {e}")),
            }
        }
        run.end(&schedule, &graph, self.0.inner.stopping.is_cancelled())
    }

    async fn taint(&self, nodes: &[NodeRow], key: &str, because: &str) {
        for node in nodes {
            let change = NodeChange {
                state: NodeState::Tainted.as_str().to_owned(),
                error: Some(Some(format!("`{because}` failed"))),
                ..NodeChange::default()
            };
            if let Err(e) = rows::change_node(&self.0.inner.db, node.id, change).await {
                tracing::error!(deployment.id = %node.deployment_id, error = %e, "cannot taint a node");
            }
        }
        // One event per node, named `key[replica]` like every node event.
        for node in nodes {
            self.0
                .runs()
                .record(
                    node.deployment_id,
                    EventKind::Node,
                    Some(&format!("{key}[{}]", node.replica)),
                    Some(NodeState::Tainted.as_str()),
                    format!("not deployed: `{because}`, which it depends on, failed"),
                )
                .await;
        }
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
        let described = self.describe(&bp).await.map_err(|e| {
            if self.0.inner.stopping.is_cancelled() {
                Stopped::Interrupted
            } else {
                Stopped::Failed(e)
            }
        })?;
        Ok((described.blueprint, variables, described.quantities))
    }

    /// A blueprint as its providers describe it: with the dependencies they
    /// add, what each resource counts against named quotas, and each key's
    /// provider with the config keys it can update in place. Waits for
    /// providers that are still loading or restarting.
    pub(super) async fn describe(&self, bp: &Blueprint) -> Result<Described, String> {
        let mut by_provider: BTreeMap<Uuid, Vec<ResourceCall>> = BTreeMap::new();
        let mut known: HashMap<(&str, Option<&str>), Uuid> = HashMap::new();
        for resource in &bp.resources {
            let asked = (
                resource.resource_type.as_str(),
                resource.provider.as_deref(),
            );
            let provider = match known.get(&asked) {
                Some(id) => *id,
                None => {
                    let id = self
                        .0
                        .inner
                        .providers
                        .for_resource_type(asked.0, asked.1)
                        .await
                        .map_err(|e| format!("resources.{}.type: {e}", resource.key))?;
                    known.insert(asked, id);
                    id
                }
            };
            by_provider.entry(provider).or_default().push(ResourceCall {
                key: resource.key.clone(),
                resource_type: resource.resource_type.clone(),
                config: resource.config.clone(),
                resource_id: String::new(),
                deployment_id: None,
                node: None,
                dependency_outputs: Vec::new(),
            });
        }
        let mut extra = Vec::new();
        let mut quantities = Quantities::new();
        let mut capabilities = BTreeMap::new();
        for (provider, calls) in by_provider {
            self.0.steps().await_provider(provider).await?;
            let described = self
                .0
                .inner
                .providers
                .describe(provider, &calls)
                .await
                .map_err(|e| e.to_string())?;
            let has = self
                .0
                .inner
                .providers
                .get(provider)
                .await
                .map_err(|e| e.to_string())?;
            let version = self.0.inner.providers.protocol_version(provider);
            for call in &calls {
                capabilities.insert(
                    call.key.clone(),
                    Capability {
                        provider_id: provider,
                        provider_name: has.name.clone(),
                        updatable: Described::updatable(Vec::new(), version),
                        destroy_first: false,
                    },
                );
            }
            for d in described {
                // A feature the resource needs and its provider lacks fails
                // the deploy before anything is made.
                if let Some(missing) = d.features.iter().find(|f| !has.features.contains(f)) {
                    return Err(format!(
                        "resources.{}: needs the `{missing}` feature, which provider `{}` does not have",
                        d.key, has.name
                    ));
                }
                if let Some(capability) = capabilities.get_mut(&d.key) {
                    capability.updatable = Described::updatable(d.updatable_keys, version);
                    capability.destroy_first = d.replace_destroys_first;
                }
                if !d.quota.is_empty() {
                    quantities.insert(d.key.clone(), d.quota.into_iter().collect());
                }
                if !d.depends_on.is_empty() {
                    extra.push((d.key, d.depends_on));
                }
            }
        }
        let blueprint = if extra.is_empty() {
            bp.clone()
        } else {
            blueprint::with_extra_dependencies(bp, &extra).map_err(|p| p.to_string())?
        };
        Ok(Described {
            blueprint,
            capabilities,
            quantities,
        })
    }
}

/// What a deploy task gives back: its outputs and its result's write, or
/// why it failed.
type Deployed = Result<(Value, Write), StepError>;

/// Whether a pending node is to be updated in place (an apply's).
fn is_update(node: &NodeRow) -> bool {
    node.state == NodeState::ToUpdate.as_str() || node.state == NodeState::Updating.as_str()
}

/// Each node's state, typed: unknown text is a corrupt row.
fn node_states(nodes: &[NodeRow]) -> Result<Vec<NodeState>, Stopped> {
    nodes
        .iter()
        .map(|n| n.state.parse::<NodeState>().map_err(corrupt))
        .collect()
}

/// A stored text no enum knows: the run fails with `DeployError::Corrupt`.
fn corrupt(e: crate::text::UnknownText) -> Stopped {
    Stopped::Failed(super::DeployError::from(e).to_string())
}

/// How a phase is going: its first failure, and whether a step stopped for
/// the shutdown.
#[derive(Default)]
struct RunState {
    first_error: Option<String>,
    interrupted: bool,
}

impl RunState {
    fn failed(&mut self, error: String) {
        self.first_error.get_or_insert(error);
    }

    fn end(self, schedule: &Schedule, graph: &Graph, stopping: bool) -> Result<(), Stopped> {
        if let Some(error) = self.first_error {
            return Err(Stopped::Failed(error));
        }
        let outcome = schedule.outcome();
        if outcome.is_complete() {
            return Ok(());
        }
        if self.interrupted || stopping {
            return Err(Stopped::Interrupted);
        }
        // Nothing failed and nobody stopped us, yet work is left: only a
        // cycle does that (a blueprint check refuses them).
        let left: BTreeSet<&str> = outcome
            .not_started
            .iter()
            .chain(&outcome.blocked)
            .map(|k| graph.keys[*k].as_str())
            .collect();
        Err(Stopped::Failed(format!(
            "never started: {}",
            left.into_iter().collect::<Vec<_>>().join(", ")
        )))
    }
}

/// A deployment's resource keys as the schedule numbers them: the
/// blueprint's, then any key only nodes still name.
struct Graph {
    keys: Vec<String>,
    index: HashMap<String, usize>,
    depends_on: Vec<Vec<usize>>,
}

impl Graph {
    fn new(bp: &Blueprint, nodes: &[NodeRow]) -> Graph {
        let mut keys: Vec<String> = bp.resources.iter().map(|r| r.key.clone()).collect();
        let mut index: HashMap<String, usize> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), i))
            .collect();
        for node in nodes {
            if !index.contains_key(&node.key) {
                index.insert(node.key.clone(), keys.len());
                keys.push(node.key.clone());
            }
        }
        let depends_on = (0..keys.len())
            .map(|key| {
                Graph::resource(bp, key)
                    .into_iter()
                    .flat_map(|r| &r.depends_on)
                    .filter_map(|d| index.get(d).copied())
                    .collect()
            })
            .collect();
        Graph {
            keys,
            index,
            depends_on,
        }
    }

    /// The blueprint's resource at key index `key` (the blueprint's keys come
    /// first, in its order); `None` for a key only nodes name.
    fn resource(bp: &Blueprint, key: usize) -> Option<&blueprint::Resource> {
        bp.resources.get(key)
    }

    /// `nodes` grouped by key index.
    fn group<'a>(&self, nodes: impl Iterator<Item = &'a NodeRow>) -> Vec<Vec<NodeRow>> {
        let mut grouped = vec![Vec::new(); self.keys.len()];
        for node in nodes {
            if let Some(&i) = self.index.get(&node.key) {
                grouped[i].push(node.clone());
            }
        }
        grouped
    }
}
