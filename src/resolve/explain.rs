//! Turns a failed search into a message, the way Cargo does: the chains of
//! requirements from the root that collide, and the installed versions
//! involved.
//!
//! The incompatibility that ended the search was derived from a set of facts
//! (the leaves of its derivation): "X requires R", "V is installed". Those
//! facts alone admit no solution, so they are what the user must change. They
//! are printed as chains from the root, each ending at the requirement where
//! it collides with another chain, is missing, or meets an installed version.

use std::collections::{HashMap, HashSet};

use super::ResolveError;
use super::constraint::Op;
use super::solver::{Cause, IncompatId, Solver};
use super::world::World;

/// Chains beyond this are summarised, so a pathological conflict cannot
/// produce a message of unbounded size.
const MAX_CHAINS: usize = 12;

/// The facts an incompatibility was derived from.
#[derive(Default)]
struct Leaves {
    /// `(candidate, dep)` pairs, grouped by candidate in first-seen order.
    deps: Vec<(u32, Vec<u32>)>,
    installed: HashSet<u32>,
}

fn leaves(solver: &Solver<'_>, terminal: IncompatId) -> Leaves {
    let mut out = Leaves::default();
    let mut by_candidate: HashMap<u32, usize> = HashMap::new();
    let mut seen = HashSet::new();
    let mut stack = vec![terminal];
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        let Some(inc) = solver.incompats.get(id as usize) else {
            continue;
        };
        match &inc.cause {
            Cause::Derived(a, b) => {
                // Push b first so that a (the older side) is read first.
                stack.push(*b);
                stack.push(*a);
            }
            Cause::Dependency { candidate, dep } => {
                let i = *by_candidate.entry(*candidate).or_insert_with(|| {
                    out.deps.push((*candidate, Vec::new()));
                    out.deps.len() - 1
                });
                if let Some((_, list)) = out.deps.get_mut(i) {
                    list.push(*dep);
                    list.sort_unstable();
                }
            }
            Cause::Installed { name } => {
                out.installed.insert(*name);
            }
            Cause::Root | Cause::Cycle => {}
        }
    }
    out
}

fn installed_labels(world: &World, name: u32) -> Vec<String> {
    let Some(entry) = world.names.get(name as usize) else {
        return Vec::new();
    };
    entry
        .installed
        .ones()
        .filter_map(|pos| world.at(name, pos))
        .map(|c| world.label(c))
        .collect()
}

/// Chains longer than this many steps are shortened in the middle.
const MAX_STEPS: usize = 8;

/// `start requires a (a 1.0.0) which requires b ...`, from the last step up.
fn render(start: &str, steps: &[(Option<usize>, String)], last: usize) -> String {
    let mut path: Vec<&str> = Vec::new();
    let mut at = Some(last);
    while let Some(i) = at {
        let Some((parent, text)) = steps.get(i) else {
            break;
        };
        path.push(text);
        at = *parent;
    }
    path.reverse();
    if path.len() > MAX_STEPS {
        let (head, rest) = path.split_at(MAX_STEPS / 2);
        let (middle, tail) = rest.split_at(rest.len() - MAX_STEPS / 2);
        format!(
            "{start} {} which, through {} more requirements, {}",
            head.join(" which "),
            middle.len(),
            tail.join(" which ")
        )
    } else {
        format!("{start} {}", path.join(" which "))
    }
}

/// The error for a search that ended with `terminal`.
pub(super) fn explain(solver: &Solver<'_>, terminal: IncompatId) -> ResolveError {
    let world = solver.world();
    let root = solver.root();
    let leaves = leaves(solver, terminal);
    let mut starts = vec![root];
    starts.extend(leaves.deps.iter().map(|(c, _)| *c));
    let mut chains = Chains {
        world,
        sources: leaves.deps.iter().map(|(c, d)| (*c, d)).collect(),
        installed: &leaves.installed,
        chains: Vec::new(),
        total: 0,
        all_missing: true,
        installed_used: Vec::new(),
        expanded: HashSet::new(),
        steps: Vec::new(),
    };
    for start in starts {
        chains.walk_from(start);
    }
    let mut installed_names: Vec<u32> = leaves.installed.iter().copied().collect();
    installed_names.sort_unstable();
    chains.installed_alone(&installed_names);
    chains.into_error(root, &installed_names)
}

/// The chains of requirements found so far, and what is needed to find the
/// rest.
struct Chains<'a> {
    world: &'a World,
    /// The `Dependency` leaves, by candidate: what is followed from each.
    sources: HashMap<u32, &'a Vec<u32>>,
    /// The names with an `Installed` leaf.
    installed: &'a HashSet<u32>,
    /// The chains, as rendered (at most [`MAX_CHAINS`]).
    chains: Vec<String>,
    /// Every chain found, rendered or not.
    total: usize,
    /// No chain ended at a version that exists (installed or conflicting).
    all_missing: bool,
    /// Installed names that some chain ended at.
    installed_used: Vec<u32>,
    /// Candidates whose requirements are listed already.
    expanded: HashSet<u32>,
    /// Steps of all chains as a tree: (the step before, "requires ..."). A
    /// chain is rendered by walking up from its last step.
    steps: Vec<(Option<usize>, String)>,
}

impl Chains<'_> {
    /// Follows every chain from `start`, depth first.
    fn walk_from(&mut self, start: u32) {
        if self.expanded.contains(&start) || !self.sources.contains_key(&start) {
            return;
        }
        // Explicit stack of (candidate, the step that reached it): no recursion.
        let mut stack: Vec<(u32, Option<usize>)> = vec![(start, None)];
        let start_label = self.world.label(start);
        while let Some((c, reached)) = stack.pop() {
            if !self.expanded.insert(c) {
                if let Some(step) = reached {
                    self.found(|steps| {
                        let text = render(&start_label, steps, step);
                        format!("{text}, whose requirements are listed above")
                    });
                }
                continue;
            }
            let next = self.expand(c, reached, &start_label);
            stack.extend(next.into_iter().rev().map(|(t, step)| (t, Some(step))));
        }
    }

    /// The requirements of `c` (reached by the step `reached`) that the
    /// leaves name: each ends a chain, or leads on to the candidates it
    /// matches, returned with the step to each.
    fn expand(&mut self, c: u32, reached: Option<usize>, start_label: &str) -> Vec<(u32, usize)> {
        let world = self.world;
        let mut next: Vec<(u32, usize)> = Vec::new();
        let (Some(deps), Some(candidate)) = (
            self.sources.get(&c).copied(),
            world.candidates.get(c as usize),
        ) else {
            return next;
        };
        let dep_list = world.deps(c);
        for &k in deps.iter() {
            let Some(dep) = dep_list.get(k as usize) else {
                continue;
            };
            let Some(requirement) = candidate.requirements.get(dep.requirement) else {
                continue;
            };
            let text = format!("requires {requirement}");
            let targets: Vec<u32> = match dep.name {
                Some(n) => dep
                    .matches
                    .ones()
                    .filter_map(|pos| world.at(n, pos))
                    .filter(|t| self.sources.contains_key(t) && *t != c)
                    .collect(),
                None => Vec::new(),
            };
            if targets.is_empty() {
                let end = self.dead_end(dep.name, dep.matches.is_empty(), &requirement.name);
                self.found(|steps| {
                    steps.push((reached, format!("{text}{end}")));
                    render(start_label, steps, steps.len() - 1)
                });
                continue;
            }
            let pinned = targets.len() == 1
                && matches!(requirement.constraints.as_slice(), [only] if only.op == Op::Eq);
            for t in targets {
                let step = if pinned {
                    text.clone()
                } else {
                    format!("{text} ({})", world.label(t))
                };
                self.steps.push((reached, step));
                next.push((t, self.steps.len() - 1));
            }
        }
        next
    }

    /// How a chain ends whose last requirement (on `required`, whose name
    /// `name` is if it exists) leads to no candidate the leaves follow.
    fn dead_end(&mut self, name: Option<u32>, no_match: bool, required: &str) -> String {
        match name {
            None => format!(", but no element named `{required}` exists"),
            Some(_) if no_match => format!(", but no version of {required} matches"),
            Some(n) if self.installed.contains(&n) => {
                self.installed_used.push(n);
                self.all_missing = false;
                format!(
                    ", but {} is installed",
                    installed_labels(self.world, n).join(" and ")
                )
            }
            Some(_) => {
                self.all_missing = false;
                String::new()
            }
        }
    }

    /// Counts a chain, and renders it (given the steps) while there is room.
    fn found(&mut self, rendered: impl FnOnce(&mut Vec<(Option<usize>, String)>) -> String) {
        self.total += 1;
        if self.chains.len() < MAX_CHAINS {
            let chain = rendered(&mut self.steps);
            self.chains.push(chain);
        }
    }

    /// The installed names of `names` no chain ended at: each is a chain of
    /// its own.
    fn installed_alone(&mut self, names: &[u32]) {
        for n in names {
            if !self.installed_used.contains(n) {
                self.all_missing = false;
                let world = self.world;
                self.found(|_| {
                    let labels = installed_labels(world, *n);
                    let verb = if labels.len() == 1 { "is" } else { "are" };
                    format!("{} {verb} installed", labels.join(" and "))
                });
            }
        }
    }

    fn into_error(mut self, root: u32, installed_names: &[u32]) -> ResolveError {
        if self.total > self.chains.len() {
            self.chains.push(format!(
                "and {} more chain(s) of requirements",
                self.total - self.chains.len()
            ));
        }
        let root_label = self.world.label(root);
        if self.all_missing && !self.chains.is_empty() {
            return ResolveError::NotFound {
                root: root_label,
                chains: self.chains,
            };
        }
        let installed = installed_names
            .iter()
            .flat_map(|&n| installed_labels(self.world, n))
            .collect();
        ResolveError::Conflict {
            root: root_label,
            chains: self.chains,
            installed,
        }
    }
}

/// The error for a search whose every solution has `cycle` (candidate indices).
pub(super) fn cycle(world: &World, root: u32, cycle: &[u32]) -> ResolveError {
    let mut names: Vec<String> = cycle.iter().map(|&c| world.label(c)).collect();
    if let Some(first) = names.first().cloned() {
        names.push(first);
    }
    ResolveError::Cycle {
        root: world.label(root),
        cycle: names,
    }
}
