//! The executor: an event-driven DAG scheduler. A resource starts when every
//! resource it depends on is complete; independent ones run concurrently under
//! a bound; a failure taints its dependents. Destroy walks the DAG in reverse.
//!
//! Every provider call is journaled: the node's new state and the journal entry
//! are written in one transaction before the call, and the result with the
//! entry's deletion in another after it. A call whose outcome is unknown (the
//! provider went away mid-call) keeps its entry, and `recovery` settles it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use uuid::Uuid;

use super::blueprint::{self, Blueprint};
use super::template;
use super::{DeploymentState, Deployments, EventKind, Intent, Lock, NodeState, OnFailure};
use crate::provider::{ProviderError, ResourceCall, ResourceProgress};
use crate::store::deployments::{self as rows, NodeChange, NodeRow};

/// Why a run ended without finishing.
enum Stopped {
    /// A resource failed: the first error.
    Failed(String),
    /// The server is stopping: the run ends at a journal boundary and resumes
    /// at the next start.
    Interrupted,
}

impl Deployments {
    pub(super) async fn run_deploy(&self, lock: &Lock, redeploy: Vec<String>) {
        let id = lock.id;
        let outcome = self.deploy_steps(id, &redeploy).await;
        let result = match outcome {
            Ok(()) => self.set_state(id, DeploymentState::Complete, None).await,
            Err(Stopped::Interrupted) => {
                tracing::info!(deployment.id = %id, "deploy interrupted by shutdown; it resumes at the next start");
                Ok(())
            }
            Err(Stopped::Failed(error)) => {
                let error = self.roll_back_if_asked(id, error).await;
                self.set_state(id, DeploymentState::Failed, Some(&error))
                    .await
            }
        };
        if let Err(e) = result {
            tracing::error!(deployment.id = %id, error = %e, "cannot store the deployment's state");
        }
    }

    pub(super) async fn run_destroy(&self, lock: &Lock) {
        let id = lock.id;
        let result = match self.destroy_steps(id, None, None).await {
            Ok(()) => self.set_state(id, DeploymentState::Destroyed, None).await,
            Err(Stopped::Interrupted) => Ok(()),
            Err(Stopped::Failed(error)) => {
                self.set_state(id, DeploymentState::Failed, Some(&error))
                    .await
            }
        };
        if let Err(e) = result {
            tracing::error!(deployment.id = %id, error = %e, "cannot store the deployment's state");
        }
    }

    /// With `ROLLBACK`, destroys what the failed run created; returns the error
    /// the deployment ends with.
    async fn roll_back_if_asked(&self, id: Uuid, error: String) -> String {
        let Ok(row) = self.deployment_row(id).await else {
            return error;
        };
        if !matches!(OnFailure::parse(&row.on_failure), Ok(OnFailure::Rollback)) {
            return error;
        }
        let Some(run) = self.last_run(id).await else {
            return error;
        };
        self.record(
            id,
            EventKind::State,
            None,
            None,
            format!("rolling back: {error}"),
        )
        .await;
        match self.destroy_steps(id, None, Some(run)).await {
            Ok(()) | Err(Stopped::Interrupted) => error,
            Err(Stopped::Failed(rollback)) => {
                format!("{error}; the rollback failed too: {rollback}")
            }
        }
    }

    async fn last_run(&self, id: Uuid) -> Option<Uuid> {
        let nodes = rows::nodes_of(&self.inner.db, id).await.ok()?;
        nodes
            .iter()
            .filter_map(|n| n.run_id.map(|r| (n.updated_at, r)))
            .max()
            .map(|(_, r)| r)
    }

    async fn deployment_row(&self, id: Uuid) -> Result<rows::DeploymentRow, String> {
        rows::find_deployment(&self.inner.db, id)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("deployment {id} is gone"))
    }

    /// The blueprint of a deployment with the dependencies its providers add
    /// (`DescribeResources`), and its bound variables.
    async fn effective(&self, id: Uuid) -> Result<(Blueprint, BTreeMap<String, Value>), String> {
        let row = self.deployment_row(id).await?;
        let bp = blueprint::parse(&row.source).map_err(|p| p.to_string())?;
        let variables: BTreeMap<String, Value> =
            serde_json::from_str(&row.variables).map_err(|e| format!("variables: {e}"))?;
        let mut by_provider: HashMap<Uuid, Vec<ResourceCall>> = HashMap::new();
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
                node: None,
                dependency_outputs: Vec::new(),
            });
        }
        let mut extra = Vec::new();
        for (provider, calls) in by_provider {
            let described = self
                .inner
                .providers
                .describe(provider, &calls)
                .await
                .map_err(|e| e.to_string())?;
            let has = self
                .inner
                .providers
                .get(provider)
                .await
                .map_err(|e| e.to_string())?;
            for d in described {
                // A feature the resource needs and its provider lacks fails
                // the deploy before anything is made.
                if let Some(missing) = d.features.iter().find(|f| !has.features.contains(f)) {
                    return Err(format!(
                        "resources.{}: needs the `{missing}` feature, which provider `{}` does not have",
                        d.key, has.name
                    ));
                }
                if !d.depends_on.is_empty() {
                    extra.push((d.key, d.depends_on));
                }
            }
        }
        let bp = if extra.is_empty() {
            bp
        } else {
            blueprint::with_extra_dependencies(&bp, &extra).map_err(|p| p.to_string())?
        };
        Ok((bp, variables))
    }

    async fn deploy_steps(&self, id: Uuid, redeploy: &[String]) -> Result<(), Stopped> {
        let (bp, variables) = self.effective(id).await.map_err(Stopped::Failed)?;
        if !redeploy.is_empty() {
            let mut keys: HashSet<String> = redeploy.iter().cloned().collect();
            for key in redeploy {
                keys.extend(blueprint::dependents(&bp, key));
            }
            self.destroy_steps(id, Some(&keys), None).await?;
            let keys: Vec<String> = keys.into_iter().collect();
            rows::change_nodes(
                &self.inner.db,
                id,
                Some(&keys),
                NodeChange {
                    state: NodeState::ToDeploy.as_str().to_owned(),
                    outputs: Some(None),
                    error: Some(None),
                    run_id: Some(None),
                    ..NodeChange::default()
                },
            )
            .await
            .map_err(|e| Stopped::Failed(e.to_string()))?;
        }
        let existing = rows::nodes_of(&self.inner.db, id)
            .await
            .map_err(|e| Stopped::Failed(e.to_string()))?;
        if existing.is_empty() {
            self.plan(id, &bp, &variables)
                .await
                .map_err(Stopped::Failed)?;
        } else {
            self.set_state(id, DeploymentState::InProgress, None)
                .await
                .map_err(|e| Stopped::Failed(e.to_string()))?;
        }
        self.execute(id, &bp, &variables, Uuid::new_v4()).await
    }

    /// Deploys every node that is not complete, dependencies first.
    async fn execute(
        &self,
        id: Uuid,
        bp: &Blueprint,
        variables: &BTreeMap<String, Value>,
        run: Uuid,
    ) -> Result<(), Stopped> {
        let nodes = rows::nodes_of(&self.inner.db, id)
            .await
            .map_err(|e| Stopped::Failed(e.to_string()))?;
        let graph = Graph::new(bp, nodes);
        let mut outputs: BTreeMap<String, Value> = graph.complete_outputs();
        let mut unmet: HashMap<&str, usize> = HashMap::new();
        let mut left: HashMap<&str, usize> = HashMap::new();
        for resource in &bp.resources {
            let key = resource.key.as_str();
            left.insert(key, graph.pending_nodes(key).len());
            unmet.insert(
                key,
                resource
                    .depends_on
                    .iter()
                    .filter(|d| !graph.is_complete(d))
                    .count(),
            );
        }
        let limit = Arc::new(Semaphore::new(self.inner.settings.concurrency.max(1)));
        let mut running: JoinSet<(String, i32, Result<Value, String>)> = JoinSet::new();
        let mut blocked: HashSet<String> = HashSet::new();
        let mut first_error: Option<String> = None;
        let ready: Vec<&str> = bp
            .resources
            .iter()
            .map(|r| r.key.as_str())
            .filter(|k| unmet[k] == 0 && left[k] > 0)
            .collect();
        for key in ready {
            self.start_key(
                &mut running,
                &graph,
                bp,
                key,
                variables,
                &outputs,
                run,
                &limit,
            );
        }
        // Keys complete from the start (or with no replicas) release their
        // dependents at once.
        let mut released: Vec<String> = bp
            .resources
            .iter()
            .filter(|r| left[r.key.as_str()] == 0)
            .map(|r| r.key.clone())
            .collect();
        loop {
            while let Some(done) = released.pop() {
                for dependent in graph.dependents_of(&done) {
                    let Some(count) = unmet.get_mut(dependent.as_str()) else {
                        continue;
                    };
                    *count = count.saturating_sub(1);
                    if *count == 0
                        && !blocked.contains(dependent)
                        && left[dependent.as_str()] > 0
                        && !self.inner.stopping.is_cancelled()
                    {
                        self.start_key(
                            &mut running,
                            &graph,
                            bp,
                            dependent,
                            variables,
                            &outputs,
                            run,
                            &limit,
                        );
                    }
                }
            }
            let Some(joined) = running.join_next().await else {
                break;
            };
            let (key, replica, result) = match joined {
                Ok(done) => done,
                Err(e) => {
                    first_error.get_or_insert(format!("a resource task failed: {e}"));
                    continue;
                }
            };
            match result {
                Ok(out) => {
                    if replica == 0 {
                        outputs.insert(key.clone(), out);
                    }
                    let remaining = left.get_mut(key.as_str()).expect("every key is counted");
                    *remaining -= 1;
                    if *remaining == 0 {
                        released.push(key);
                    }
                }
                Err(error) => {
                    first_error.get_or_insert(format!("{key}[{replica}]: {error}"));
                    for dependent in blueprint::dependents(bp, &key) {
                        if blocked.insert(dependent.clone()) {
                            self.taint(id, &graph, &dependent, &key).await;
                        }
                    }
                }
            }
        }
        if let Some(error) = first_error {
            return Err(Stopped::Failed(error));
        }
        if left.values().any(|n| *n > 0) {
            // Nothing failed, yet work is left: the server is stopping.
            return Err(Stopped::Interrupted);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn start_key(
        &self,
        running: &mut JoinSet<(String, i32, Result<Value, String>)>,
        graph: &Graph,
        bp: &Blueprint,
        key: &str,
        variables: &BTreeMap<String, Value>,
        outputs: &BTreeMap<String, Value>,
        run: Uuid,
        limit: &Arc<Semaphore>,
    ) {
        let Some(resource) = bp.resource(key) else {
            return;
        };
        let dependency_outputs: Vec<(String, Value)> = resource
            .depends_on
            .iter()
            .filter_map(|d| outputs.get(d).map(|o| (d.clone(), o.clone())))
            .collect();
        let rendered =
            template::render(&resource.config, &template::Context { variables, outputs })
                .map_err(|p| format!("config: {p}"));
        for node in graph.pending_nodes(key) {
            let this = self.clone();
            let node = node.clone();
            let rendered = rendered.clone();
            let limit = limit.clone();
            let dependency_outputs = dependency_outputs.clone();
            let key = key.to_owned();
            running.spawn(async move {
                let replica = node.replica;
                let result = match rendered {
                    Ok(config) => {
                        let _permit = limit.acquire_owned().await;
                        this.deploy_node(node, config, dependency_outputs, run)
                            .await
                    }
                    Err(error) => {
                        this.fail_node(&node, &error).await;
                        Err(error)
                    }
                };
                (key, replica, result)
            });
        }
    }

    /// One provider call, journaled.
    async fn deploy_node(
        &self,
        node: NodeRow,
        config: Value,
        dependency_outputs: Vec<(String, Value)>,
        run: Uuid,
    ) -> Result<Value, String> {
        let Some(provider) = node.provider_id else {
            let error = "no provider was chosen for it".to_owned();
            self.fail_node(&node, &error).await;
            return Err(error);
        };
        if let Err(error) = self.provider_ready(provider).await {
            self.fail_node(&node, &error).await;
            return Err(error);
        }
        let (entry, event) = rows::begin_call(
            &self.inner.db,
            &node,
            provider,
            Intent::Deploy.as_str(),
            NodeChange {
                state: NodeState::InProgress.as_str().to_owned(),
                config: Some(config.to_string()),
                error: Some(None),
                run_id: Some(Some(run)),
                ..NodeChange::default()
            },
            node_change_event(&node, NodeState::InProgress, "deploying"),
        )
        .await
        .map_err(|e| format!("cannot journal the call: {e}"))?;
        self.publish(event);
        let call = ResourceCall {
            key: node.key.clone(),
            resource_type: node.resource_type.clone(),
            config,
            resource_id: node.id.to_string(),
            node: node.node.clone(),
            dependency_outputs,
        };
        let result = self
            .call_with_progress(&node, |providers, progress| async move {
                providers.deploy(provider, call, progress).await
            })
            .await;
        match result {
            Ok(outputs) => {
                let event = rows::finish_call(
                    &self.inner.db,
                    &node,
                    entry,
                    NodeChange {
                        state: NodeState::Complete.as_str().to_owned(),
                        outputs: Some(Some(outputs.to_string())),
                        ..NodeChange::default()
                    },
                    Some(node_change_event(&node, NodeState::Complete, "deployed")),
                )
                .await
                .map_err(|e| format!("cannot store the result: {e}"))?;
                event.into_iter().for_each(|e| self.publish(e));
                crate::telemetry::record_deploy_step("DEPLOY", "complete");
                Ok(outputs)
            }
            Err(ProviderError::Failed { message, .. }) => {
                self.finish_failed(&node, entry, &message).await;
                crate::telemetry::record_deploy_step("DEPLOY", "failed");
                Err(message)
            }
            Err(e) => {
                // The outcome is unknown: the entry stays for recovery to
                // settle once the provider is back.
                crate::telemetry::record_deploy_step("DEPLOY", "lost");
                let error = e.to_string();
                self.fail_node(&node, &error).await;
                self.settle_later(entry);
                Err(error)
            }
        }
    }

    /// Runs a provider call, recording its progress and log events in order
    /// before the call's own result is recorded.
    async fn call_with_progress<T, F, Fut>(
        &self,
        node: &NodeRow,
        call: F,
    ) -> Result<T, ProviderError>
    where
        F: FnOnce(crate::provider::Providers, Box<dyn FnMut(ResourceProgress) + Send>) -> Fut,
        Fut: std::future::Future<Output = Result<T, ProviderError>>,
    {
        let (tx, mut rx) = mpsc::unbounded_channel::<ResourceProgress>();
        let recorder = {
            let this = self.clone();
            let node = node.clone();
            tokio::spawn(async move {
                while let Some(p) = rx.recv().await {
                    let (kind, message) = match p {
                        ResourceProgress::Progress { percent, message } => {
                            (EventKind::Progress, format!("{percent}% {message}"))
                        }
                        ResourceProgress::Log(line) => (EventKind::Log, line),
                    };
                    this.record(
                        node.deployment_id,
                        kind,
                        Some(&node_label(&node)),
                        None,
                        message,
                    )
                    .await;
                }
            })
        };
        let progress: Box<dyn FnMut(ResourceProgress) + Send> = Box::new(move |p| {
            let _ = tx.send(p);
        });
        let result = call(self.inner.providers.clone(), progress).await;
        let _ = recorder.await;
        result
    }

    async fn finish_failed(&self, node: &NodeRow, entry: Uuid, error: &str) {
        match rows::finish_call(
            &self.inner.db,
            node,
            entry,
            NodeChange {
                state: NodeState::Failed.as_str().to_owned(),
                error: Some(Some(error.to_owned())),
                ..NodeChange::default()
            },
            Some(node_change_event(node, NodeState::Failed, error)),
        )
        .await
        {
            Ok(event) => event.into_iter().for_each(|e| self.publish(e)),
            Err(e) => {
                tracing::error!(deployment.id = %node.deployment_id, error = %e, "cannot store a failure")
            }
        }
    }

    async fn fail_node(&self, node: &NodeRow, error: &str) {
        if let Err(e) = rows::change_node(
            &self.inner.db,
            node.id,
            NodeChange {
                state: NodeState::Failed.as_str().to_owned(),
                error: Some(Some(error.to_owned())),
                ..NodeChange::default()
            },
        )
        .await
        {
            tracing::error!(deployment.id = %node.deployment_id, error = %e, "cannot store a failure");
        }
        self.node_event(node, NodeState::Failed, error.to_owned())
            .await;
    }

    async fn taint(&self, id: Uuid, graph: &Graph, key: &str, because: &str) {
        for node in graph.pending_nodes(key) {
            let _ = rows::change_node(
                &self.inner.db,
                node.id,
                NodeChange {
                    state: NodeState::Tainted.as_str().to_owned(),
                    error: Some(Some(format!("`{because}` failed"))),
                    ..NodeChange::default()
                },
            )
            .await;
        }
        self.record(
            id,
            EventKind::Node,
            Some(key),
            Some(NodeState::Tainted.as_str()),
            format!("not deployed: `{because}`, which it depends on, failed"),
        )
        .await;
    }

    pub(super) async fn node_event(&self, node: &NodeRow, state: NodeState, message: String) {
        self.record(
            node.deployment_id,
            EventKind::Node,
            Some(&node_label(node)),
            Some(state.as_str()),
            message,
        )
        .await;
    }

    /// Destroys nodes in reverse dependency order: all of them, those of
    /// `keys`, or those a `run` created. A node that fails to destroy keeps the
    /// resources it depends on in place and fails the whole step.
    async fn destroy_steps(
        &self,
        id: Uuid,
        keys: Option<&HashSet<String>>,
        run: Option<Uuid>,
    ) -> Result<(), Stopped> {
        let row = self.deployment_row(id).await.map_err(Stopped::Failed)?;
        let bp = blueprint::parse(&row.source).map_err(|p| Stopped::Failed(p.to_string()))?;
        let nodes = rows::nodes_of(&self.inner.db, id)
            .await
            .map_err(|e| Stopped::Failed(e.to_string()))?;
        let chosen: Vec<NodeRow> = nodes
            .into_iter()
            .filter(|n| keys.is_none_or(|k| k.contains(&n.key)))
            .filter(|n| run.is_none_or(|r| n.run_id == Some(r)))
            .filter(|n| n.state != NodeState::Destroyed.as_str())
            .collect();
        let graph = Graph::new(&bp, chosen);
        // A key can go once every key that depends on it has gone.
        let mut waiting: HashMap<String, usize> = HashMap::new();
        for resource in &bp.resources {
            waiting.insert(resource.key.clone(), 0);
        }
        for resource in &bp.resources {
            if graph.has_nodes(&resource.key) {
                for dep in &resource.depends_on {
                    *waiting.entry(dep.clone()).or_default() += 1;
                }
            }
        }
        let limit = Arc::new(Semaphore::new(self.inner.settings.concurrency.max(1)));
        let mut running: JoinSet<(String, Result<(), String>)> = JoinSet::new();
        let mut left: HashMap<String, usize> = HashMap::new();
        let mut first_error = None;
        let mut gone: Vec<String> = Vec::new();
        for resource in &bp.resources {
            let count = graph.nodes_of(&resource.key).len();
            left.insert(resource.key.clone(), count);
            if waiting[&resource.key] == 0 {
                if count == 0 {
                    gone.push(resource.key.clone());
                } else {
                    self.start_destroy(&mut running, &graph, &resource.key, &limit);
                }
            }
        }
        loop {
            while let Some(done) = gone.pop() {
                let Some(resource) = bp.resource(&done) else {
                    continue;
                };
                for dep in &resource.depends_on {
                    if !graph.has_nodes(&done) {
                        continue;
                    }
                    let Some(count) = waiting.get_mut(dep) else {
                        continue;
                    };
                    *count = count.saturating_sub(1);
                    if *count == 0 && !self.inner.stopping.is_cancelled() {
                        if left[dep] == 0 {
                            gone.push(dep.clone());
                        } else {
                            self.start_destroy(&mut running, &graph, dep, &limit);
                        }
                    }
                }
            }
            let Some(joined) = running.join_next().await else {
                break;
            };
            match joined {
                Ok((key, Ok(()))) => {
                    let remaining = left.get_mut(&key).expect("every key is counted");
                    *remaining -= 1;
                    if *remaining == 0 {
                        gone.push(key);
                    }
                }
                Ok((key, Err(error))) => {
                    first_error.get_or_insert(format!("destroying {key}: {error}"));
                }
                Err(e) => {
                    first_error.get_or_insert(format!("a destroy task failed: {e}"));
                }
            }
        }
        if let Some(error) = first_error {
            return Err(Stopped::Failed(error));
        }
        if left.values().any(|n| *n > 0) {
            return Err(Stopped::Interrupted);
        }
        Ok(())
    }

    fn start_destroy(
        &self,
        running: &mut JoinSet<(String, Result<(), String>)>,
        graph: &Graph,
        key: &str,
        limit: &Arc<Semaphore>,
    ) {
        for node in graph.nodes_of(key) {
            let this = self.clone();
            let node = node.clone();
            let limit = limit.clone();
            let key = key.to_owned();
            running.spawn(async move {
                let _permit = limit.acquire_owned().await;
                (key, this.destroy_node(node).await)
            });
        }
    }

    /// Destroys one node's resource, journaled. A node that never reached its
    /// provider is simply marked destroyed.
    pub(super) async fn destroy_node(&self, node: NodeRow) -> Result<(), String> {
        let state = NodeState::parse(&node.state).map_err(|e| e.to_string())?;
        let never_created = matches!(
            state,
            NodeState::ToDeploy | NodeState::Tainted | NodeState::Waiting
        ) || node.run_id.is_none();
        let Some(provider) = node.provider_id.filter(|_| !never_created) else {
            rows::change_node(
                &self.inner.db,
                node.id,
                NodeChange {
                    state: NodeState::Destroyed.as_str().to_owned(),
                    ..NodeChange::default()
                },
            )
            .await
            .map_err(|e| e.to_string())?;
            return Ok(());
        };
        if let Err(error) = self.provider_ready(provider).await {
            self.fail_node(&node, &error).await;
            return Err(error);
        }
        let (entry, event) = rows::begin_call(
            &self.inner.db,
            &node,
            provider,
            Intent::Destroy.as_str(),
            NodeChange {
                state: NodeState::Destroying.as_str().to_owned(),
                ..NodeChange::default()
            },
            node_change_event(&node, NodeState::Destroying, "destroying"),
        )
        .await
        .map_err(|e| format!("cannot journal the call: {e}"))?;
        self.publish(event);
        let outputs: Value = node
            .outputs
            .as_deref()
            .and_then(|o| serde_json::from_str(o).ok())
            .unwrap_or_else(|| serde_json::json!({}));
        let call = resource_call(&node);
        let result = self
            .call_with_progress(&node, |providers, progress| async move {
                providers.destroy(provider, call, &outputs, progress).await
            })
            .await;
        match result {
            Ok(()) => {
                let event = rows::finish_call(
                    &self.inner.db,
                    &node,
                    entry,
                    NodeChange {
                        state: NodeState::Destroyed.as_str().to_owned(),
                        outputs: Some(None),
                        ..NodeChange::default()
                    },
                    Some(node_change_event(&node, NodeState::Destroyed, "destroyed")),
                )
                .await
                .map_err(|e| format!("cannot store the result: {e}"))?;
                event.into_iter().for_each(|e| self.publish(e));
                crate::telemetry::record_deploy_step("DESTROY", "complete");
                Ok(())
            }
            Err(ProviderError::Failed { message, .. }) => {
                self.finish_failed(&node, entry, &message).await;
                crate::telemetry::record_deploy_step("DESTROY", "failed");
                Err(message)
            }
            Err(e) => {
                crate::telemetry::record_deploy_step("DESTROY", "lost");
                let error = e.to_string();
                self.fail_node(&node, &error).await;
                self.settle_later(entry);
                Err(error)
            }
        }
    }
}

impl Deployments {
    /// Waits (bounded) for a provider that is not connected now: one that is
    /// restarting, or still loading after a server restart.
    pub(super) async fn provider_ready(&self, provider: Uuid) -> Result<(), String> {
        let wait = self.inner.settings.provider_wait;
        if self.inner.providers.wait_connected(provider, wait).await {
            return Ok(());
        }
        let name = self
            .inner
            .providers
            .get(provider)
            .await
            .map(|p| format!("`{}` ({})", p.name, p.status.as_str()))
            .unwrap_or_else(|_| provider.to_string());
        Err(format!(
            "provider {name} is not connected (waited {} s)",
            wait.as_secs()
        ))
    }
}

/// The call that names a node's resource to its provider.
pub(super) fn resource_call(node: &NodeRow) -> ResourceCall {
    ResourceCall {
        key: node.key.clone(),
        resource_type: node.resource_type.clone(),
        config: node
            .config
            .as_deref()
            .and_then(|c| serde_json::from_str(c).ok())
            .unwrap_or_else(|| serde_json::json!({})),
        resource_id: node.id.to_string(),
        node: node.node.clone(),
        dependency_outputs: Vec::new(),
    }
}

/// The event recording a node's new state.
pub(super) fn node_change_event(node: &NodeRow, state: NodeState, message: &str) -> rows::NewEvent {
    rows::NewEvent {
        kind: EventKind::Node.as_str().to_owned(),
        node_key: Some(node_label(node)),
        state: Some(state.as_str().to_owned()),
        message: message.to_owned(),
    }
}

/// `web[2]`: a node as events name it.
fn node_label(node: &NodeRow) -> String {
    format!("{}[{}]", node.key, node.replica)
}

/// A deployment's nodes grouped by resource key, and the blueprint's edges.
struct Graph {
    nodes: HashMap<String, Vec<NodeRow>>,
    dependents: HashMap<String, Vec<String>>,
}

impl Graph {
    fn new(bp: &Blueprint, nodes: Vec<NodeRow>) -> Self {
        let mut by_key: HashMap<String, Vec<NodeRow>> = HashMap::new();
        for node in nodes {
            by_key.entry(node.key.clone()).or_default().push(node);
        }
        let mut dependents: HashMap<String, Vec<String>> = HashMap::new();
        for resource in &bp.resources {
            for dep in &resource.depends_on {
                dependents
                    .entry(dep.clone())
                    .or_default()
                    .push(resource.key.clone());
            }
        }
        Graph {
            nodes: by_key,
            dependents,
        }
    }

    fn nodes_of(&self, key: &str) -> &[NodeRow] {
        self.nodes.get(key).map_or(&[], Vec::as_slice)
    }

    fn has_nodes(&self, key: &str) -> bool {
        !self.nodes_of(key).is_empty()
    }

    fn pending_nodes(&self, key: &str) -> Vec<&NodeRow> {
        self.nodes_of(key)
            .iter()
            .filter(|n| n.state != NodeState::Complete.as_str())
            .collect()
    }

    fn is_complete(&self, key: &str) -> bool {
        self.pending_nodes(key).is_empty()
    }

    fn dependents_of(&self, key: &str) -> &[String] {
        self.dependents.get(key).map_or(&[], Vec::as_slice)
    }

    /// Outputs of keys already complete (replica 0 speaks for the resource).
    fn complete_outputs(&self) -> BTreeMap<String, Value> {
        self.nodes
            .iter()
            .filter(|(key, _)| self.is_complete(key))
            .filter_map(|(key, nodes)| {
                let first = nodes.iter().find(|n| n.replica == 0)?;
                let outputs = serde_json::from_str(first.outputs.as_deref()?).ok()?;
                Some((key.clone(), outputs))
            })
            .collect()
    }
}
