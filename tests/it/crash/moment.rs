//! The moment to strike: how far a deployment has got in the request under
//! way, polled until a chosen number of steps.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::observe::{Api, View, view};

/// How far a deployment has got in the request under way, in steps.
#[derive(Clone)]
pub enum Progress {
    /// One step per node started or done.
    Deploy,
    /// One step per node destroying or gone.
    Destroy,
    /// Per node to replace, one step once it is touched, two once it runs
    /// again as a new process.
    Redeploy {
        affected: BTreeSet<String>,
        before: BTreeMap<String, (i32, u64)>,
    },
}

impl Progress {
    pub fn steps(&self, nodes: usize) -> usize {
        match self {
            Progress::Deploy | Progress::Destroy => nodes,
            Progress::Redeploy { affected, .. } => 2 * affected.len(),
        }
    }

    fn score(&self, v: &View) -> usize {
        let count = |states: &[&str]| {
            v.nodes
                .iter()
                .filter(|n| states.contains(&n.state.as_str()))
                .count()
        };
        match self {
            Progress::Deploy => count(&["IN_PROGRESS", "COMPLETE", "FAILED"]),
            Progress::Destroy => count(&["DESTROYING", "DESTROYED"]),
            Progress::Redeploy { affected, before } => v
                .nodes
                .iter()
                .filter(|n| affected.contains(&n.key))
                .map(|n| {
                    let old = before.get(&n.key).map(|(pid, _)| *pid);
                    match (n.state.as_str(), n.pid) {
                        ("COMPLETE", pid) if pid == old => 0,
                        ("COMPLETE", _) => 2,
                        _ => 1,
                    }
                })
                .sum(),
        }
    }

    fn over(&self, state: &str) -> bool {
        match self {
            Progress::Deploy | Progress::Redeploy { .. } => matches!(state, "COMPLETE" | "FAILED"),
            Progress::Destroy => matches!(state, "DESTROYED" | "FAILED"),
        }
    }
}

/// Polls deployment `id` until it has made `target` steps of `progress` (or
/// its run is over, or a minute passes), then waits `jitter`: the moment to
/// strike. Returns what it saw, and whether the run was still under way.
pub async fn moment(
    api: &Api,
    id: &str,
    progress: &Progress,
    target: usize,
    jitter: Duration,
) -> (String, bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let seen = loop {
        if let Ok(v) = view(api, id).await {
            let score = progress.score(&v);
            let over = progress.over(&v.state);
            if score >= target || over {
                break (format!("{score} steps made, {}", v.state), !over);
            }
        }
        if Instant::now() > deadline {
            break ("not reached in 60 s".to_owned(), true);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    tokio::time::sleep(jitter).await;
    seen
}
