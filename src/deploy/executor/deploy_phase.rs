//! The deploy phase: every node not complete is deployed (or, an apply's,
//! updated in place), dependencies first, as many at once as the
//! concurrency bound allows. A step's result is queued to the writer with
//! the journal entries of the dependents it lets start, in one send: one
//! commit per link of a chain. All results are durable before the phase
//! ends. A node that fails taints what depends on it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinError, JoinSet};
use uuid::Uuid;

use super::phase::{Committing, Graph, RunState};
use super::{Executor, Stopped};
use crate::deploy::blueprint::Blueprint;
use crate::deploy::schedule::{Direction, Schedule};
use crate::deploy::step::{Begun, StepError};
use crate::deploy::template;
use crate::deploy::writer::{Committed, Write, Writer};
use crate::deploy::{DEPLOYED, Deployments, EventKind, NodeState, RETIRING};
use crate::store::deployments::{self as rows, NodeChange, NodeRow};

/// What a deploy task gives back: its outputs and its result's write, or
/// why it failed.
type Deployed = Result<(Value, Write), StepError>;

impl Executor<'_> {
    /// Deploys every node not complete, dependencies first.
    pub(super) async fn deploy_phase(
        &self,
        id: Uuid,
        bp: &Blueprint,
        variables: &BTreeMap<String, Value>,
        operation: Uuid,
    ) -> Result<(), Stopped> {
        let nodes = rows::nodes_of(&self.0.inner.db, id)
            .await
            .map_err(|e| Stopped::Failed(e.to_string()))?;
        let mut phase = DeployPhase::new(self.0, bp, variables, operation, nodes)?;
        loop {
            // The results, then the entries of the steps they let start whose
            // provider is connected, in one send: one commit per link of a
            // chain. A step whose provider is away writes its own entry once
            // it may call.
            let finished = phase.results.len();
            let mut writes = std::mem::take(&mut phase.results);
            let starts = phase.start_ready(&mut writes);
            let mut queued = self.0.inner.writer.submit_all(writes).into_iter();
            phase
                .committing
                .add(queued.by_ref().take(finished), &mut phase.run);
            for start in starts {
                phase.spawn(start, &mut queued);
            }
            let Some(joined) = phase.running.join_next().await else {
                break;
            };
            phase.take_ended(joined).await;
        }
        phase.end().await
    }
}

/// A deploy phase under way.
struct DeployPhase<'a> {
    deployments: &'a Deployments,
    bp: &'a Blueprint,
    variables: &'a BTreeMap<String, Value>,
    operation: Uuid,
    graph: Graph,
    /// The nodes to deploy, by key index.
    pending: Vec<Vec<NodeRow>>,
    /// Replica 0 speaks for its resource; a dependent starts only once all
    /// of a resource's replicas are complete.
    outputs: BTreeMap<String, Value>,
    schedule: Schedule,
    /// Keys started whose nodes are not all spawned yet, in start order.
    ready: VecDeque<Ready>,
    /// The concurrency bound: the permits, and how many there are.
    limit: Arc<Semaphore>,
    bound: usize,
    running: JoinSet<(usize, i32, Deployed)>,
    run: RunState,
    /// Results queued to the writer; all durable before the phase ends.
    committing: Committing,
    /// Results of the steps that ended since the last turn, to queue.
    results: Vec<Write>,
}

/// A key the schedule let start, whose nodes wait for room under the
/// concurrency bound; `next` indexes its pending nodes.
struct Ready {
    key: usize,
    next: usize,
    rendered: Result<Value, String>,
    dependency_outputs: Vec<(String, Value)>,
}

/// A node that starts now.
struct Start {
    key: usize,
    node: NodeRow,
    /// Its config, rendered; or why it cannot be.
    rendered: Result<Value, String>,
    dependency_outputs: Vec<(String, Value)>,
    /// When its provider is connected: its journal entry, queued with this
    /// turn's writes, and its permit if one was free (else it waits for one
    /// with its entry durable: see [`DeployPhase::start_ready`]).
    early: Option<(Uuid, Slot)>,
}

/// A step's room under the concurrency bound when its entry is queued.
pub(super) enum Slot {
    /// A permit was free.
    Held(OwnedSemaphorePermit),
    /// It waits for one; then the node's change and event for the call
    /// starting (written apart from its entry) are queued.
    Awaited(Option<Box<Write>>),
}

impl Slot {
    /// The permit taken, or else the write to queue once one is had.
    pub(super) fn of(permit: Option<OwnedSemaphorePermit>, start: Option<Write>) -> Slot {
        match permit {
            Some(permit) => Slot::Held(permit),
            None => Slot::Awaited(start.map(Box::new)),
        }
    }

    /// Once the step may call: its permit; the node's change is queued
    /// first for a step that waited.
    pub(super) async fn ready(
        self,
        limit: Arc<Semaphore>,
        writer: &Writer,
    ) -> OwnedSemaphorePermit {
        match self {
            Slot::Held(permit) => permit,
            Slot::Awaited(start) => {
                let permit = limit.acquire_owned().await;
                if let Some(start) = start {
                    writer.queue(*start);
                }
                permit.expect("the bound's semaphore is never closed")
            }
        }
    }
}

impl<'a> DeployPhase<'a> {
    fn new(
        deployments: &'a Deployments,
        bp: &'a Blueprint,
        variables: &'a BTreeMap<String, Value>,
        operation: Uuid,
        nodes: Vec<NodeRow>,
    ) -> Result<Self, Stopped> {
        let graph = Graph::new(bp, &nodes);
        let outputs: BTreeMap<String, Value> = nodes
            .iter()
            .filter(|n| n.replica == 0 && DEPLOYED.contains(&n.state))
            .filter_map(|n| {
                Some((
                    n.key.clone(),
                    serde_json::from_str(n.outputs.as_deref()?).ok()?,
                ))
            })
            .collect();
        let pending = graph.group(
            nodes
                .into_iter()
                .filter(|n| !DEPLOYED.contains(&n.state) && !RETIRING.contains(&n.state)),
        );
        let units: Vec<usize> = pending.iter().map(Vec::len).collect();
        let schedule = Schedule::new(&graph.depends_on, &units, Direction::Deploy);
        let bound = deployments.inner.settings.concurrency.max(1);
        let limit = Arc::new(Semaphore::new(bound));
        Ok(DeployPhase {
            deployments,
            bp,
            variables,
            operation,
            graph,
            pending,
            outputs,
            schedule,
            ready: VecDeque::new(),
            limit,
            bound,
            running: JoinSet::new(),
            run: RunState::default(),
            committing: Committing::new(bound),
            results: Vec::new(),
        })
    }

    /// The nodes that may start now (none once stopping): the keys the
    /// schedule lets start are prepared (config rendered once per key) and
    /// queued, and their nodes are taken from the queue while there is room
    /// for [`LOOKAHEAD`] times the concurrency bound, so a resource of
    /// 100,000 replicas holds that many tasks, not 100,000. The entries of
    /// those whose provider is connected go to `writes`. Calls in flight stay
    /// within the bound (a call waits for its permit), but as many steps
    /// again have their entry committed while they wait, so a permit freed is
    /// used at once instead of after a commit: on PostgreSQL, where a commit
    /// takes a millisecond or two, a step's wait for its entry was most of
    /// its time. Those waiting keep their state (`TO_DEPLOY`) until they
    /// call: their node's change to `IN_PROGRESS` is written apart from
    /// their entry, queued once they have a permit (see [`Slot`]).
    fn start_ready(&mut self, writes: &mut Vec<Write>) -> Vec<Start> {
        let stopping = &self.deployments.inner.stopping;
        while !stopping.is_cancelled()
            && let Some((key, _)) = self.schedule.start_next()
        {
            let prepared = self.prepare(key);
            self.ready.push_back(prepared);
        }
        let mut starts = Vec::new();
        while !stopping.is_cancelled() && self.running.len() + starts.len() < LOOKAHEAD * self.bound
        {
            let Some(ready) = self.ready.front_mut() else {
                break;
            };
            let key = ready.key;
            let node = self.pending[key][ready.next].clone();
            ready.next += 1;
            let rendered = ready.rendered.clone();
            let dependency_outputs = ready.dependency_outputs.clone();
            if ready.next == self.pending[key].len() {
                self.ready.pop_front();
            }
            let early = self.early(&node, &rendered, writes);
            starts.push(Start {
                key,
                node,
                rendered,
                dependency_outputs,
                early,
            });
        }
        starts
    }

    /// What every node of `key` starts with: its config rendered with the
    /// outputs of what it depends on.
    fn prepare(&self, key: usize) -> Ready {
        let resource = Graph::resource(self.bp, key);
        let dependency_outputs: Vec<(String, Value)> = resource
            .into_iter()
            .flat_map(|r| &r.depends_on)
            .filter_map(|d| self.outputs.get(d).map(|o| (d.clone(), o.clone())))
            .collect();
        let rendered = match resource {
            Some(r) => template::render(
                &r.config,
                &template::Context {
                    variables: self.variables,
                    outputs: &self.outputs,
                },
            )
            .map_err(|p| format!("config: {p}")),
            None => Err("the resource is not in the blueprint".to_owned()),
        };
        Ready {
            key,
            next: 0,
            rendered,
            dependency_outputs,
        }
    }

    /// A deploy whose provider is connected: its entry, whose write goes to
    /// `writes`, and a permit if one is free.
    fn early(
        &self,
        node: &NodeRow,
        rendered: &Result<Value, String>,
        writes: &mut Vec<Write>,
    ) -> Option<(Uuid, Slot)> {
        let updating = is_update(node);
        match (rendered, node.provider_id) {
            (Ok(config), Some(provider))
                if !updating && self.deployments.inner.providers.is_connected(provider) =>
            {
                let permit = self.limit.clone().try_acquire_owned().ok();
                let (entry, write, start) = self.deployments.steps().begin_deploy(
                    node,
                    provider,
                    config.clone(),
                    self.operation,
                    permit.is_none(),
                );
                writes.push(write);
                Some((entry, Slot::of(permit, start)))
            }
            _ => None,
        }
    }

    /// Starts one node's step; an early one's entry is the next of `queued`.
    fn spawn(&mut self, start: Start, queued: &mut impl Iterator<Item = Committed>) {
        let this = self.deployments.clone();
        let limit = self.limit.clone();
        let operation = self.operation;
        let Start {
            key,
            node,
            rendered,
            dependency_outputs,
            early,
        } = start;
        let early = early.map(|(entry, slot)| {
            let committed = queued.next().expect("one send per entry");
            (Begun { entry, committed }, slot)
        });
        self.running.spawn(async move {
            let replica = node.replica;
            let result = match rendered {
                Ok(config) => {
                    let (begun, _permit) = match early {
                        Some((begun, slot)) => (
                            Some(begun),
                            Some(slot.ready(limit, &this.inner.writer).await),
                        ),
                        None => (None, limit.acquire_owned().await.ok()),
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

    /// Takes in `first` and every other step that has ended, so their
    /// results share a send.
    async fn take_ended(&mut self, first: Result<(usize, i32, Deployed), JoinError>) {
        let mut ended = vec![first];
        while let Some(more) = self.running.try_join_next() {
            ended.push(more);
        }
        for joined in ended {
            match joined {
                Ok((key, replica, result)) => self.finished(key, replica, result).await,
                Err(e) => self.run.failed(format!("a resource task failed: {e}")),
            }
        }
    }

    /// Tells the schedule how a step ended; a failure taints what it blocks.
    async fn finished(&mut self, key: usize, replica: i32, result: Deployed) {
        match result {
            Ok((out, finish)) => {
                self.results.push(finish);
                if replica == 0 {
                    self.outputs.insert(self.graph.keys[key].clone(), out);
                }
                self.schedule.finish(key, true);
            }
            Err(StepError::Stopping) => {
                self.run.interrupted = true;
                self.schedule.finish(key, false);
            }
            Err(error) => {
                let message = format!("{}[{replica}]: {error}", self.graph.keys[key]);
                match error {
                    StepError::Unavailable {
                        away: Some(provider),
                        ..
                    } => self.run.provider_away(provider, message),
                    _ => self.run.failed(message),
                }
                for blocked in self.schedule.finish(key, false) {
                    self.taint(blocked, key).await;
                }
            }
        }
    }

    /// Marks the nodes of key index `blocked` tainted: `because` failed.
    async fn taint(&self, blocked: usize, because: usize) {
        let nodes = &self.pending[blocked];
        let key = &self.graph.keys[blocked];
        let because = &self.graph.keys[because];
        for node in nodes {
            let change = NodeChange {
                error: Some(Some(format!("`{because}` failed"))),
                ..NodeChange::to(NodeState::Tainted)
            };
            if let Err(e) = rows::change_node(&self.deployments.inner.db, node.id, change).await {
                tracing::error!(deployment.id = %node.deployment_id, error = %e, "cannot taint a node");
            }
        }
        // One event per node, named `key[replica]` like every node event.
        for node in nodes {
            self.deployments
                .runs()
                .record(
                    node.deployment_id,
                    EventKind::Node,
                    Some(&format!("{key}[{}]", node.replica)),
                    Some(NodeState::Tainted.into()),
                    format!("not deployed: `{because}`, which it depends on, failed"),
                )
                .await;
        }
    }

    /// Waits for every queued result to be durable, then says how the
    /// phase ended.
    async fn end(mut self) -> Result<(), Stopped> {
        self.committing.wait(&mut self.run).await;
        let stopping = self.deployments.inner.stopping.is_cancelled();
        self.run.end(&self.schedule, &self.graph, stopping)
    }
}

/// How many steps a phase runs for each call the concurrency bound lets be
/// in flight: the others have their journal entry committed while they wait
/// for a permit (see [`DeployPhase::start_ready`]). 1,000 independent no-ops
/// went from 2,750–3,063 to 3,308–4,243 resources/s on PostgreSQL and from
/// 5,311–5,731 to 5,668–6,766 on SQLite (`DEPLOY_BENCH=wide cargo bench
/// --bench deploy`, three runs of each, alternated); 3 and 4 measured no
/// better than 2 within the runs' spread.
pub(super) const LOOKAHEAD: usize = 2;

/// Whether a pending node is to be updated in place (an apply's).
fn is_update(node: &NodeRow) -> bool {
    node.state == NodeState::ToUpdate || node.state == NodeState::Updating
}
