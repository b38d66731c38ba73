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
    let sources: HashMap<u32, &Vec<u32>> = leaves.deps.iter().map(|(c, d)| (*c, d)).collect();

    let mut chains: Vec<String> = Vec::new();
    let mut all_missing = true;
    let mut installed_used: Vec<u32> = Vec::new();
    let mut expanded: HashSet<u32> = HashSet::new();
    let mut starts = vec![root];
    starts.extend(leaves.deps.iter().map(|(c, _)| *c));
    let mut total = 0usize;
    // Steps of all chains as a tree: (the step before, "requires ..."). A
    // chain is rendered by walking up from its last step.
    let mut steps: Vec<(Option<usize>, String)> = Vec::new();
    for start in starts {
        if expanded.contains(&start) || !sources.contains_key(&start) {
            continue;
        }
        // Explicit stack of (candidate, the step that reached it): no recursion.
        let mut stack: Vec<(u32, Option<usize>)> = vec![(start, None)];
        let start_label = world.label(start);
        while let Some((c, reached)) = stack.pop() {
            if !expanded.insert(c) {
                if let Some(step) = reached {
                    total += 1;
                    if chains.len() < MAX_CHAINS {
                        let text = render(&start_label, &steps, step);
                        chains.push(format!("{text}, whose requirements are listed above"));
                    }
                }
                continue;
            }
            let (Some(deps), Some(candidate)) = (sources.get(&c), world.candidates.get(c as usize))
            else {
                continue;
            };
            let dep_list = world.deps(c);
            let mut next: Vec<(u32, usize)> = Vec::new();
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
                        .filter(|t| sources.contains_key(t) && *t != c)
                        .collect(),
                    None => Vec::new(),
                };
                if targets.is_empty() {
                    let end = match dep.name {
                        None => {
                            format!(", but no element named `{}` exists", requirement.name)
                        }
                        Some(_) if dep.matches.is_empty() => {
                            format!(", but no version of {} matches", requirement.name)
                        }
                        Some(n) if leaves.installed.contains(&n) => {
                            installed_used.push(n);
                            all_missing = false;
                            format!(
                                ", but {} is installed",
                                installed_labels(world, n).join(" and ")
                            )
                        }
                        Some(_) => {
                            all_missing = false;
                            String::new()
                        }
                    };
                    total += 1;
                    if chains.len() < MAX_CHAINS {
                        steps.push((reached, format!("{text}{end}")));
                        chains.push(render(&start_label, &steps, steps.len() - 1));
                    }
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
                    steps.push((reached, step));
                    next.push((t, steps.len() - 1));
                }
            }
            stack.extend(next.into_iter().rev().map(|(t, step)| (t, Some(step))));
        }
    }
    let mut installed_names: Vec<u32> = leaves.installed.iter().copied().collect();
    installed_names.sort_unstable();
    for n in &installed_names {
        if !installed_used.contains(n) {
            all_missing = false;
            total += 1;
            if chains.len() < MAX_CHAINS {
                let labels = installed_labels(world, *n);
                let verb = if labels.len() == 1 { "is" } else { "are" };
                chains.push(format!("{} {verb} installed", labels.join(" and ")));
            }
        }
    }
    if total > chains.len() {
        chains.push(format!(
            "and {} more chain(s) of requirements",
            total - chains.len()
        ));
    }
    let root_label = world.label(root);
    if all_missing && !chains.is_empty() {
        return ResolveError::NotFound {
            root: root_label,
            chains,
        };
    }
    let installed = installed_names
        .iter()
        .flat_map(|&n| installed_labels(world, n))
        .collect();
    ResolveError::Conflict {
        root: root_label,
        chains,
        installed,
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
