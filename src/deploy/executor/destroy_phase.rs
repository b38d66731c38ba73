//! The destroy phase: the nodes of a scope (all of them, those a redeploy
//! marked, those an operation made, those an apply retires) are destroyed,
//! dependents first, as many at once as the concurrency bound allows. A
//! node that fails to go keeps what it depends on in place.

use std::collections::VecDeque;

use tokio::task::JoinSet;
use uuid::Uuid;

use super::phase::{Graph, RunState};
use super::{Executor, Scope, Stopped};
use crate::deploy::NodeState;
use crate::deploy::blueprint::{self, Blueprint};
use crate::deploy::schedule::{Direction, Schedule};
use crate::deploy::step::StepError;
use crate::store::deployments as rows;

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
        let chosen = graph.group(nodes.into_iter().filter(|n| match scope {
            Scope::All => !matches!(n.state, NodeState::Destroyed | NodeState::Retired),
            Scope::Marked => matches!(n.state, NodeState::ToDestroy | NodeState::Destroying),
            Scope::Operation(op) => {
                n.run_id == Some(op)
                    && !matches!(n.state, NodeState::Destroyed | NodeState::Retired)
            }
            Scope::Retiring => matches!(n.state, NodeState::ToRetire | NodeState::Retiring),
        }));
        let units: Vec<usize> = chosen.iter().map(Vec::len).collect();
        if units.iter().all(|u| *u == 0) {
            return Ok(());
        }
        let mut schedule = Schedule::new(&graph.depends_on, &units, Direction::Destroy);
        let bound = self.0.inner.settings.concurrency.max(1);
        let mut running: JoinSet<(usize, Result<(), StepError>)> = JoinSet::new();
        // Keys started, with how many of their nodes are spawned: a node's
        // task is spawned only when there is room under the bound.
        let mut ready: VecDeque<(usize, usize)> = VecDeque::new();
        let mut run = RunState::default();
        loop {
            let stopping = || self.0.inner.stopping.is_cancelled();
            while !stopping()
                && let Some((key, _)) = schedule.start_next()
            {
                ready.push_back((key, 0));
            }
            while !stopping() && running.len() < bound {
                let Some((key, next)) = ready.front_mut() else {
                    break;
                };
                let (key, node) = (*key, chosen[*key][*next].clone());
                *next += 1;
                if *next == chosen[key].len() {
                    ready.pop_front();
                }
                let this = self.0.clone();
                running.spawn(async move { (key, this.steps().destroy_node(node).await) });
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
}
