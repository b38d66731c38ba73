//! The destroy phase: the nodes of a scope (all of them, those a redeploy
//! marked, those an operation made, those an apply retires) are destroyed,
//! dependents first, as many at once as the concurrency bound allows. A
//! node that fails to go keeps what it depends on in place.
//!
//! As in the deploy phase, a step's result is queued to the writer with the
//! journal entries of the steps it lets start, in one send, and a step
//! waits only for its own entry: a dependency's destroy is called once its
//! entry is durable, and its dependents' results commit with it or before.
//! As many steps again as the bound have their entry committed while they
//! wait for a permit to call ([`super::deploy_phase::LOOKAHEAD`]); their
//! nodes keep their state until they call. All results are durable before
//! the phase ends.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::task::{JoinError, JoinSet};
use uuid::Uuid;

use super::deploy_phase::{LOOKAHEAD, Slot};
use super::phase::{Committing, Graph, RunState};
use super::{Executor, Scope, Stopped};
use crate::deploy::NodeState;
use crate::deploy::blueprint::{self, Blueprint};
use crate::deploy::schedule::{Direction, Schedule};
use crate::deploy::step::{Begun, StepError, destroy_call};
use crate::deploy::writer::{Committed, Write};
use crate::store::deployments::{self as rows, NodeRow};

impl Executor<'_> {
    /// Destroys the nodes of `scope`, dependents first. A node that fails to
    /// go keeps what it depends on in place and fails the phase. `bp` is the
    /// effective blueprint when the caller has it, else the stored one.
    pub(super) async fn destroy_phase(
        &self,
        id: Uuid,
        bp: Option<&Blueprint>,
        scope: Scope,
    ) -> Result<(), Stopped> {
        let bp = match bp {
            Some(bp) => Cow::Borrowed(bp),
            None => Cow::Owned(self.stored_blueprint(id).await?),
        };
        let nodes = rows::nodes_of(&self.0.inner.db, id)
            .await
            .map_err(|e| Stopped::Failed(e.to_string()))?;
        let graph = Graph::new(&bp, &nodes);
        let chosen = graph.group(nodes.into_iter().filter(|n| in_scope(n, scope)));
        let units: Vec<usize> = chosen.iter().map(Vec::len).collect();
        if units.iter().all(|u| *u == 0) {
            return Ok(());
        }
        let mut schedule = Schedule::new(&graph.depends_on, &units, Direction::Destroy);
        let bound = self.0.inner.settings.concurrency.max(1);
        let limit = Arc::new(Semaphore::new(bound));
        let mut running: JoinSet<Destroyed> = JoinSet::new();
        // Keys started, with how many of their nodes are spawned: a node's
        // task is spawned only when there is room for it.
        let mut ready: VecDeque<(usize, usize)> = VecDeque::new();
        let mut run = RunState::default();
        let mut committing = Committing::new(bound);
        let mut results: Vec<Write> = Vec::new();
        loop {
            let stopping = || self.0.inner.stopping.is_cancelled();
            while !stopping()
                && let Some((key, _)) = schedule.start_next()
            {
                ready.push_back((key, 0));
            }
            // The results, then the entries of the steps that can call at
            // once (their provider connected), in one send.
            let finished = results.len();
            let mut writes = std::mem::take(&mut results);
            let mut starts = Vec::new();
            while !stopping() && running.len() + starts.len() < LOOKAHEAD * bound {
                let Some((key, next)) = ready.front_mut() else {
                    break;
                };
                let (key, node) = (*key, chosen[*key][*next].clone());
                *next += 1;
                if *next == chosen[key].len() {
                    ready.pop_front();
                }
                let early = self.begin_early(&node, &limit, &mut writes);
                starts.push((key, node, early));
            }
            let mut queued = self.0.inner.writer.submit_all(writes).into_iter();
            committing.add(queued.by_ref().take(finished), &mut run);
            for start in starts {
                self.spawn_destroy(&mut running, &limit, start, &mut queued);
            }
            let Some(first) = running.join_next().await else {
                break;
            };
            // Every step that has ended: their results share a send.
            take_ended(first, &graph, &mut schedule, &mut run, &mut results);
            while let Some(more) = running.try_join_next() {
                take_ended(more, &graph, &mut schedule, &mut run, &mut results);
            }
        }
        // The last results were sent at the loop's last turn.
        committing.wait(&mut run).await;
        run.end(&schedule, &graph, self.0.inner.stopping.is_cancelled())
    }
}

impl Executor<'_> {
    /// A destroy that can call once it has a permit (its provider
    /// connected): its entry, whose write goes to `writes`, and its permit
    /// if one is free.
    fn begin_early(
        &self,
        node: &NodeRow,
        limit: &Arc<Semaphore>,
        writes: &mut Vec<Write>,
    ) -> Option<(Uuid, Slot)> {
        let provider = destroy_call(node)?;
        if !self.0.inner.providers.is_connected(provider) {
            return None;
        }
        let permit = limit.clone().try_acquire_owned().ok();
        let (entry, write, start) = self
            .0
            .steps()
            .begin_destroy(node, provider, permit.is_none());
        writes.push(write);
        Some((entry, Slot::of(permit, start)))
    }

    /// Starts one node's destroy; an early one's entry is the next of
    /// `queued`.
    fn spawn_destroy(
        &self,
        running: &mut JoinSet<Destroyed>,
        limit: &Arc<Semaphore>,
        (key, node, early): (usize, NodeRow, Option<(Uuid, Slot)>),
        queued: &mut impl Iterator<Item = Committed>,
    ) {
        let early = early.map(|(entry, slot)| {
            let committed = queued.next().expect("one send per entry");
            (Begun { entry, committed }, slot)
        });
        let this = self.0.clone();
        let limit = limit.clone();
        running.spawn(async move {
            let (begun, _permit) = match early {
                Some((begun, slot)) => (
                    Some(begun),
                    Some(slot.ready(limit, &this.inner.writer).await),
                ),
                None => (None, limit.acquire_owned().await.ok()),
            };
            (key, this.steps().destroy_node(node, begun).await)
        });
    }

    /// The deployment's stored blueprint, parsed.
    async fn stored_blueprint(&self, id: Uuid) -> Result<Blueprint, Stopped> {
        let row = self.deployment_row(id).await.map_err(Stopped::Failed)?;
        blueprint::parse(&row.source).map_err(|p| Stopped::Failed(p.to_string()))
    }
}

/// Whether the phase destroys `node`.
fn in_scope(node: &NodeRow, scope: Scope) -> bool {
    let gone = matches!(node.state, NodeState::Destroyed | NodeState::Retired);
    match scope {
        Scope::All => !gone,
        Scope::Marked => matches!(node.state, NodeState::ToDestroy | NodeState::Destroying),
        Scope::Operation(op) => node.run_id == Some(op) && !gone,
        Scope::Retiring => matches!(node.state, NodeState::ToRetire | NodeState::Retiring),
    }
}

/// What a destroy task gives back: its key, and its result's write (none
/// for a node only marked gone) or why it failed.
type Destroyed = (usize, Result<Option<Write>, StepError>);

/// Tells the schedule how a step ended, and keeps its result's write.
fn take_ended(
    joined: Result<Destroyed, JoinError>,
    graph: &Graph,
    schedule: &mut Schedule,
    run: &mut RunState,
    results: &mut Vec<Write>,
) {
    match joined {
        Ok((key, Ok(finish))) => {
            results.extend(finish);
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
