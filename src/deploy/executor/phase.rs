//! What a phase of a run works with: the deployment's resource keys as the
//! schedule numbers them (the [`Graph`]), each node's typed state, and how
//! the phase is going (its first failure, whether it was interrupted).

use std::collections::{BTreeSet, HashMap};

use uuid::Uuid;

use super::Stopped;
use crate::deploy::NodeState;
use crate::deploy::blueprint::{self, Blueprint};
use crate::deploy::schedule::Schedule;
use crate::deploy::writer::Committed;
use crate::store::deployments::NodeRow;

/// Each node's state.
pub(super) fn node_states(nodes: &[NodeRow]) -> Vec<NodeState> {
    nodes.iter().map(|n| n.state).collect()
}

/// How a phase is going: its first failure, and whether a step stopped for
/// the shutdown.
#[derive(Default)]
pub(super) struct RunState {
    first_error: Option<String>,
    pub(super) interrupted: bool,
    /// The providers steps failed for being away (not connected, every try).
    away: BTreeSet<Uuid>,
    /// Whether a step failed for another reason: the provider's answer, a
    /// config, the store.
    failed_otherwise: bool,
}

impl RunState {
    /// A step failed: not for want of its provider.
    pub(super) fn failed(&mut self, error: String) {
        self.failed_otherwise = true;
        self.first_error.get_or_insert(error);
    }

    /// A step failed because `provider` was away every time it was tried.
    pub(super) fn provider_away(&mut self, provider: Uuid, error: String) {
        self.away.insert(provider);
        self.first_error.get_or_insert(error);
    }

    pub(super) fn end(
        self,
        schedule: &Schedule,
        graph: &Graph,
        stopping: bool,
    ) -> Result<(), Stopped> {
        if let Some(error) = self.first_error {
            if self.failed_otherwise || self.away.is_empty() {
                return Err(Stopped::Failed(error));
            }
            return Err(Stopped::Away {
                error,
                providers: self.away,
            });
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

/// A phase's results queued to the writer: all durable before the phase
/// ends. Those already durable are dropped as the phase goes, so what a
/// phase holds does not grow with its number of nodes.
pub(super) struct Committing {
    queued: Vec<Committed>,
    /// How many it holds before it looks for those that ended.
    keep: usize,
}

impl Committing {
    /// For a phase of `bound` steps at once.
    pub(super) fn new(bound: usize) -> Committing {
        Committing {
            queued: Vec::new(),
            keep: 4 * bound.max(256),
        }
    }

    /// Holds `queued`; drops those already durable once many are held (a
    /// failed one counts as the phase's failure).
    pub(super) fn add(&mut self, queued: impl Iterator<Item = Committed>, run: &mut RunState) {
        self.queued.extend(queued);
        if self.queued.len() < self.keep {
            return;
        }
        let mut failures = Vec::new();
        self.queued.retain_mut(|c| match c.ended() {
            None => true,
            Some(Ok(())) => false,
            Some(Err(e)) => {
                failures.push(e);
                false
            }
        });
        for e in failures {
            run.failed(format!("cannot store a result: {e}"));
        }
    }

    /// Waits for every result held to be durable.
    pub(super) async fn wait(self, run: &mut RunState) {
        for committed in self.queued {
            if let Err(e) = committed.wait().await {
                run.failed(format!("cannot store a result: {e}"));
            }
        }
    }
}

/// A deployment's resource keys as the schedule numbers them: the
/// blueprint's, then any key only nodes still name.
pub(super) struct Graph {
    pub(super) keys: Vec<String>,
    pub(super) index: HashMap<String, usize>,
    pub(super) depends_on: Vec<Vec<usize>>,
}

impl Graph {
    pub(super) fn new(bp: &Blueprint, nodes: &[NodeRow]) -> Graph {
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
    pub(super) fn resource(bp: &Blueprint, key: usize) -> Option<&blueprint::Resource> {
        bp.resources.get(key)
    }

    /// `nodes` grouped by key index.
    pub(super) fn group(&self, nodes: impl Iterator<Item = NodeRow>) -> Vec<Vec<NodeRow>> {
        let mut grouped = vec![Vec::new(); self.keys.len()];
        for node in nodes {
            if let Some(&i) = self.index.get(&node.key) {
                grouped[i].push(node);
            }
        }
        grouped
    }
}
