//! The scheduler of one run over a blueprint's DAG: which resources may start
//! now, what a failure blocks, and when the run is over. Pure: no IO, no
//! clock. The executor is a loop over it.
//!
//! A run works on *keys* (a blueprint's resources); each key has a number of
//! *units* to do in this run (its replicas not yet deployed, or still to
//! destroy). Deploying, a key waits for the keys it depends on; destroying,
//! for the keys that depend on it. A key with nothing to do in this run is
//! settled from the start, and never released twice: what waits on it counts
//! only the keys still unsettled when the run begins.
//!
//! Invariants (property-tested below): every key with work starts at most
//! once, and exactly once when nothing it waits on fails; never before every
//! key it waits on is done; the run always ends.

use std::collections::{BTreeSet, HashMap};

/// Which way a run walks the DAG.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Dependencies first.
    Deploy,
    /// Dependents first.
    Destroy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyState {
    /// Waits for this many keys to be done.
    Waiting(usize),
    /// May start; in the ready queue.
    Ready,
    /// Started: this many units not finished yet; whether one failed.
    Running {
        left: usize,
        failed: bool,
    },
    Done,
    Failed,
    /// Never starts: a key it waits on (perhaps through others) failed.
    Blocked,
}

/// One run's schedule. Keys are named by their index in the list given to
/// [`Schedule::new`].
#[derive(Debug)]
pub struct Schedule {
    state: Vec<KeyState>,
    /// Units of each key to do in this run.
    units: Vec<usize>,
    /// For each key, the keys that wait on it.
    releases: Vec<Vec<usize>>,
    /// Keys that may start, in the order they became ready.
    ready: std::collections::VecDeque<usize>,
    /// Units started and not finished.
    running: usize,
}

/// What became of a run's keys once it is over.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub failed: Vec<usize>,
    pub blocked: Vec<usize>,
    /// Neither started nor blocked: the run stopped early, or a cycle.
    pub not_started: Vec<usize>,
}

impl Outcome {
    pub fn is_complete(&self) -> bool {
        self.failed.is_empty() && self.blocked.is_empty() && self.not_started.is_empty()
    }
}

impl Schedule {
    /// `depends_on[k]`: the keys key `k` depends on (indices). `units[k]`: what
    /// key `k` has to do in this run (0: settled already).
    pub fn new(depends_on: &[Vec<usize>], units: &[usize], direction: Direction) -> Schedule {
        let n = depends_on.len();
        assert_eq!(units.len(), n, "one unit count per key");
        let mut waits_on: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
        let mut releases: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
        for (key, deps) in depends_on.iter().enumerate() {
            for &dep in deps.iter().filter(|&&d| d < n && d != key) {
                let (waiter, awaited) = match direction {
                    Direction::Deploy => (key, dep),
                    Direction::Destroy => (dep, key),
                };
                waits_on[waiter].insert(awaited);
                releases[awaited].insert(waiter);
            }
        }
        let mut schedule = Schedule {
            state: vec![KeyState::Done; n],
            units: units.to_vec(),
            releases: releases
                .into_iter()
                .map(|r| r.into_iter().collect())
                .collect(),
            ready: Default::default(),
            running: 0,
        };
        for key in 0..n {
            if units[key] == 0 {
                continue;
            }
            let unmet = waits_on[key].iter().filter(|&&k| units[k] > 0).count();
            if unmet == 0 {
                schedule.state[key] = KeyState::Ready;
                schedule.ready.push_back(key);
            } else {
                schedule.state[key] = KeyState::Waiting(unmet);
            }
        }
        schedule
    }

    /// The next key that may start, with its number of units; it counts as
    /// running from now on.
    pub fn start_next(&mut self) -> Option<(usize, usize)> {
        let key = self.ready.pop_front()?;
        let units = self.units[key];
        self.state[key] = KeyState::Running {
            left: units,
            failed: false,
        };
        self.running += units;
        Some((key, units))
    }

    /// One unit of `key` finished. Returns the keys this newly blocks (on the
    /// first failure of a key: everything waiting on it, transitively).
    pub fn finish(&mut self, key: usize, ok: bool) -> Vec<usize> {
        let KeyState::Running { left, failed } = self.state[key] else {
            panic!("key {key} finished a unit while not running");
        };
        assert!(left > 0, "key {key} finished more units than it started");
        self.running -= 1;
        let left = left - 1;
        let mut blocked = Vec::new();
        if !ok && !failed {
            blocked = self.block_waiters_of(key);
        }
        let failed = failed || !ok;
        self.state[key] = match (left, failed) {
            (0, true) => KeyState::Failed,
            (0, false) => {
                self.release(key);
                KeyState::Done
            }
            (left, failed) => KeyState::Running { left, failed },
        };
        blocked
    }

    fn release(&mut self, key: usize) {
        for i in 0..self.releases[key].len() {
            let waiter = self.releases[key][i];
            if let KeyState::Waiting(unmet) = self.state[waiter] {
                if unmet == 1 {
                    self.state[waiter] = KeyState::Ready;
                    self.ready.push_back(waiter);
                } else {
                    self.state[waiter] = KeyState::Waiting(unmet - 1);
                }
            }
        }
    }

    fn block_waiters_of(&mut self, key: usize) -> Vec<usize> {
        let mut blocked = Vec::new();
        let mut stack = vec![key];
        while let Some(k) = stack.pop() {
            for i in 0..self.releases[k].len() {
                let waiter = self.releases[k][i];
                if matches!(self.state[waiter], KeyState::Waiting(_)) {
                    self.state[waiter] = KeyState::Blocked;
                    blocked.push(waiter);
                    stack.push(waiter);
                }
            }
        }
        blocked
    }

    /// Units started and not finished.
    pub fn running(&self) -> usize {
        self.running
    }

    /// Nothing runs and nothing may start: the run is over (or, when the
    /// caller stopped taking `next`, it has drained).
    pub fn is_over(&self) -> bool {
        self.running == 0 && self.ready.is_empty()
    }

    pub fn outcome(&self) -> Outcome {
        let mut outcome = Outcome::default();
        for (key, state) in self.state.iter().enumerate() {
            match state {
                KeyState::Done => {}
                KeyState::Failed => outcome.failed.push(key),
                KeyState::Blocked => outcome.blocked.push(key),
                KeyState::Waiting(_) | KeyState::Ready | KeyState::Running { .. } => {
                    outcome.not_started.push(key)
                }
            }
        }
        outcome
    }
}

/// The keys a redeploy of `keys` replaces: them and everything that depends
/// on them, transitively.
pub fn redeploy_scope(depends_on: &[Vec<usize>], keys: &[usize]) -> BTreeSet<usize> {
    let mut dependents: HashMap<usize, Vec<usize>> = HashMap::new();
    for (key, deps) in depends_on.iter().enumerate() {
        for &dep in deps {
            dependents.entry(dep).or_default().push(key);
        }
    }
    let mut scope: BTreeSet<usize> = BTreeSet::new();
    let mut stack: Vec<usize> = keys.to_vec();
    while let Some(key) = stack.pop() {
        if scope.insert(key) {
            stack.extend(dependents.get(&key).into_iter().flatten().copied());
        }
    }
    scope
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs a schedule to its end, finishing running units in the order
    /// `picks` chooses, failing the units `fails` names. Returns the start
    /// order and checks every invariant on the way.
    fn simulate(
        deps: &[Vec<usize>],
        units: &[usize],
        direction: Direction,
        fails: &BTreeSet<usize>,
        picks: &[usize],
    ) -> (Vec<usize>, Outcome) {
        let n = deps.len();
        let waits_on = |key: usize| -> Vec<usize> {
            match direction {
                Direction::Deploy => deps[key].clone(),
                Direction::Destroy => (0..n).filter(|&k| deps[k].contains(&key)).collect(),
            }
        };
        let mut schedule = Schedule::new(deps, units, direction);
        let mut done: BTreeSet<usize> = (0..n).filter(|&k| units[k] == 0).collect();
        let mut started = Vec::new();
        let mut in_flight: Vec<(usize, bool)> = Vec::new();
        let mut left: Vec<usize> = units.to_vec();
        let mut steps = 0;
        let mut pick = picks.iter().cycle();
        loop {
            while let Some((key, count)) = schedule.start_next() {
                assert!(!started.contains(&key), "key {key} started twice");
                assert_eq!(count, units[key]);
                for awaited in waits_on(key) {
                    assert!(
                        done.contains(&awaited),
                        "{key} started before {awaited} was done"
                    );
                }
                started.push(key);
                for unit in 0..count {
                    // The last unit of a failing key fails.
                    in_flight.push((key, !(fails.contains(&key) && unit + 1 == count)));
                }
            }
            if schedule.is_over() {
                assert!(in_flight.is_empty());
                break;
            }
            assert!(!in_flight.is_empty(), "not over, yet nothing runs");
            let i = pick.next().copied().unwrap_or(0) % in_flight.len();
            let (key, ok) = in_flight.swap_remove(i);
            let blocked = schedule.finish(key, ok);
            for b in blocked {
                assert!(!started.contains(&b), "blocked {b} after it started");
            }
            left[key] -= 1;
            if left[key] == 0 && !fails.contains(&key) {
                done.insert(key);
            }
            steps += 1;
            assert!(steps <= units.iter().sum::<usize>(), "the run does not end");
        }
        (started, schedule.outcome())
    }

    /// A random DAG (edges from higher to lower indices), unit counts, failing
    /// keys and a completion order.
    fn dag() -> impl Strategy<Value = (Vec<Vec<usize>>, Vec<usize>, BTreeSet<usize>, Vec<usize>)> {
        (1usize..14).prop_flat_map(|n| {
            let edges = proptest::collection::vec(proptest::collection::vec(any::<bool>(), n), n);
            let units = proptest::collection::vec(0usize..4, n);
            let fails = proptest::collection::btree_set(0..n, 0..3);
            let picks = proptest::collection::vec(any::<usize>(), 1..64);
            (edges, units, fails, picks).prop_map(move |(edges, units, fails, picks)| {
                let deps = (0..n)
                    .map(|k| (0..k).filter(|&d| edges[k][d]).collect())
                    .collect();
                (deps, units, fails, picks)
            })
        })
    }

    /// Keys with work that wait on a failed key, through keys with work (a
    /// key settled before the run releases what waits on it).
    fn reachable_from_failures(
        deps: &[Vec<usize>],
        units: &[usize],
        direction: Direction,
        failed: &[usize],
    ) -> BTreeSet<usize> {
        let n = deps.len();
        let mut seen = BTreeSet::new();
        let mut stack = failed.to_vec();
        while let Some(key) = stack.pop() {
            let waiters: Vec<usize> = match direction {
                Direction::Deploy => (0..n).filter(|&k| deps[k].contains(&key)).collect(),
                Direction::Destroy => deps[key].clone(),
            };
            for w in waiters.into_iter().filter(|&w| units[w] > 0) {
                if seen.insert(w) {
                    stack.push(w);
                }
            }
        }
        seen
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// With no failure, every key with work starts exactly once, after
        /// what it waits on, and the run ends complete.
        #[test]
        fn every_key_with_work_runs_once((deps, units, _fails, picks) in dag(), destroy in any::<bool>()) {
            let direction = if destroy { Direction::Destroy } else { Direction::Deploy };
            let (started, outcome) = simulate(&deps, &units, direction, &BTreeSet::new(), &picks);
            let with_work: BTreeSet<usize> = (0..deps.len()).filter(|&k| units[k] > 0).collect();
            prop_assert_eq!(started.iter().copied().collect::<BTreeSet<_>>(), with_work);
            prop_assert!(outcome.is_complete());
        }

        /// Failures block exactly what waits on them (transitively) and had
        /// not started; everything else still runs once; the run ends.
        #[test]
        fn failures_block_their_waiters_and_nothing_else((deps, units, fails, picks) in dag(), destroy in any::<bool>()) {
            let direction = if destroy { Direction::Destroy } else { Direction::Deploy };
            let fails: BTreeSet<usize> = fails.into_iter().filter(|&k| units[k] > 0).collect();
            let (started, outcome) = simulate(&deps, &units, direction, &fails, &picks);
            let started: BTreeSet<usize> = started.into_iter().collect();
            let failed: BTreeSet<usize> = outcome.failed.iter().copied().collect();
            prop_assert!(failed.is_subset(&fails));
            let downstream = reachable_from_failures(&deps, &units, direction, &outcome.failed);
            for (key, _) in units.iter().enumerate().filter(|(_, u)| **u > 0) {
                if downstream.contains(&key) {
                    // Waits on a failure: never started.
                    prop_assert!(!started.contains(&key), "{} started downstream of a failure", key);
                    prop_assert!(outcome.blocked.contains(&key) || outcome.not_started.contains(&key));
                } else {
                    prop_assert!(started.contains(&key), "{} never started", key);
                }
            }
            prop_assert!(outcome.not_started.is_empty(), "{:?}", outcome);
        }

        /// A redeploy: the scope's nodes are destroyed dependents first, then
        /// deployed with the rest already complete; each once, in order.
        #[test]
        fn redeploy_replaces_the_scope_once_in_order((deps, units, _fails, picks) in dag(), pick in any::<usize>()) {
            let n = deps.len();
            let asked = vec![pick % n];
            let scope = redeploy_scope(&deps, &asked);
            for &key in &scope {
                for (k, d) in deps.iter().enumerate() {
                    if d.contains(&key) { prop_assert!(scope.contains(&k)); }
                }
            }
            let replicas: Vec<usize> = units.iter().map(|u| u + 1).collect();
            let in_scope: Vec<usize> = (0..n).map(|k| if scope.contains(&k) { replicas[k] } else { 0 }).collect();
            let (destroyed, outcome) = simulate(&deps, &in_scope, Direction::Destroy, &BTreeSet::new(), &picks);
            prop_assert!(outcome.is_complete());
            prop_assert_eq!(destroyed.iter().copied().collect::<BTreeSet<_>>(), scope.clone());
            let (deployed, outcome) = simulate(&deps, &in_scope, Direction::Deploy, &BTreeSet::new(), &picks);
            prop_assert!(outcome.is_complete());
            prop_assert_eq!(deployed.iter().copied().collect::<BTreeSet<_>>(), scope);
        }
    }

    /// `a; b; c needs a,b; d needs a`: the two cases that once went wrong.
    #[test]
    fn redeploying_from_a_partly_finished_dag() {
        let deps = vec![vec![], vec![], vec![0, 1], vec![0]];
        // Redeploy `d`: only d runs, once.
        let scope = redeploy_scope(&deps, &[3]);
        assert_eq!(scope, BTreeSet::from([3]));
        let mut s = Schedule::new(&deps, &[0, 0, 0, 1], Direction::Deploy);
        assert_eq!(s.start_next(), Some((3, 1)));
        assert_eq!(s.start_next(), None);
        s.finish(3, true);
        assert!(s.is_over() && s.outcome().is_complete());

        // Redeploy `b`: b and c; c only after b.
        let scope = redeploy_scope(&deps, &[1]);
        assert_eq!(scope, BTreeSet::from([1, 2]));
        let mut s = Schedule::new(&deps, &[0, 1, 1, 0], Direction::Deploy);
        assert_eq!(s.start_next(), Some((1, 1)));
        assert_eq!(s.start_next(), None, "c waits for b");
        s.finish(1, true);
        assert_eq!(s.start_next(), Some((2, 1)));
        s.finish(2, true);
        assert!(s.is_over() && s.outcome().is_complete());
    }

    #[test]
    fn destroy_waits_for_dependents_and_a_failure_keeps_dependencies() {
        let deps = vec![vec![], vec![0], vec![0]];
        let mut s = Schedule::new(&deps, &[1, 1, 2], Direction::Destroy);
        let mut first: Vec<usize> = std::iter::from_fn(|| s.start_next().map(|(k, _)| k)).collect();
        first.sort();
        assert_eq!(first, [1, 2]);
        s.finish(2, true);
        assert_eq!(s.finish(2, false), [0], "0 stays in place");
        s.finish(1, true);
        assert_eq!(s.start_next(), None, "0 stays: a dependent failed to go");
        assert!(s.is_over());
        assert_eq!(
            s.outcome(),
            Outcome {
                failed: vec![2],
                blocked: vec![0],
                not_started: vec![]
            }
        );
    }

    #[test]
    fn a_failed_dependency_blocks_its_dependents_at_once() {
        let deps = vec![vec![], vec![0], vec![1], vec![]];
        let mut s = Schedule::new(&deps, &[2, 1, 1, 1], Direction::Deploy);
        assert_eq!(s.start_next(), Some((0, 2)));
        assert_eq!(s.start_next(), Some((3, 1)));
        assert_eq!(s.finish(0, false), vec![1, 2]);
        assert!(s.finish(0, true).is_empty());
        s.finish(3, true);
        assert!(s.is_over());
        let outcome = s.outcome();
        assert_eq!(outcome.failed, [0]);
        assert_eq!(outcome.blocked, [1, 2]);
    }
}
