//! The dependency graph of a blueprint's resources: problems with
//! `depends_on`, cycles (named), topological order, dependents, and merging
//! dependencies that providers add. Walks are iterative, so a long chain of
//! resources cannot overflow the stack.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use super::parse::Listed;
use super::{Blueprint, Problem, Problems};
use crate::deploy::template::snippet;

/// Resources by declaration index; edges point from a resource to what it
/// depends on, deduplicated, known keys only, self-edges left out.
pub(super) struct Graph<'b> {
    pub(super) keys: Vec<&'b str>,
    pub(super) index: HashMap<&'b str, usize>,
    pub(super) edges: Vec<Vec<usize>>,
}

impl<'b> Graph<'b> {
    pub(super) fn new(bp: &'b Blueprint) -> Graph<'b> {
        let keys: Vec<&str> = bp.resources.iter().map(|r| r.key.as_str()).collect();
        let mut index = HashMap::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            index.entry(*key).or_insert(i);
        }
        let edges = bp
            .resources
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut out: Vec<usize> = Vec::new();
                let mut seen = std::collections::HashSet::new();
                for dep in &r.depends_on {
                    if let Some(&j) = index.get(dep.as_str())
                        && j != i
                        && seen.insert(j)
                    {
                        out.push(j);
                    }
                }
                out
            })
            .collect();
        Graph { keys, index, edges }
    }

    /// Whether `from` depends on `to`, directly or not, for each pair of
    /// `pairs`, in one pass: a row of bits per strongly connected component
    /// (sinks first, each the union of what its edges reach), one column per
    /// distinct `to`. That is edges × targets / 64 words of work, where a
    /// walk per pair would be resources × pairs.
    pub(super) fn depends(&self, pairs: &[(usize, usize)]) -> Vec<bool> {
        let mut column = HashMap::new();
        for &(_, to) in pairs {
            let next = column.len();
            column.entry(to).or_insert(next);
        }
        let words = column.len().div_ceil(64);
        let bit = |row: &mut [u64], v: usize| {
            if let Some(&c) = column.get(&v) {
                row[c / 64] |= 1 << (c % 64);
            }
        };
        let components = components(&self.edges);
        let mut component_of = vec![0; self.keys.len()];
        for (c, members) in components.iter().enumerate() {
            for &v in members {
                component_of[v] = c;
            }
        }
        let mut rows = vec![0u64; components.len() * words];
        for (c, members) in components.iter().enumerate() {
            // Components come sinks first: every row read here is complete.
            let (done, rest) = rows.split_at_mut(c * words);
            let row = &mut rest[..words];
            for &v in members {
                if members.len() > 1 {
                    bit(row, v);
                }
                for &w in &self.edges[v] {
                    bit(row, w);
                    let d = component_of[w];
                    if d != c {
                        for (mine, theirs) in row.iter_mut().zip(&done[d * words..][..words]) {
                            *mine |= theirs;
                        }
                    }
                }
            }
        }
        pairs
            .iter()
            .map(|&(from, to)| {
                let c = column[&to];
                rows[component_of[from] * words + c / 64] & (1 << (c % 64)) != 0
            })
            .collect()
    }

    /// One cycle per strongly connected component of more than one resource,
    /// each starting at its earliest-declared member, shortest first.
    fn cycles(&self) -> Vec<Vec<usize>> {
        let mut cycles: Vec<Vec<usize>> = components(&self.edges)
            .into_iter()
            .filter(|c| c.len() > 1)
            .filter_map(|c| self.shortest_cycle(&c))
            .collect();
        cycles.sort();
        cycles
    }

    /// The shortest cycle through the first of `members` (breadth first),
    /// staying inside the component.
    fn shortest_cycle(&self, members: &[usize]) -> Option<Vec<usize>> {
        let start = *members.iter().min()?;
        let mut inside = vec![false; self.keys.len()];
        for &m in members {
            inside[m] = true;
        }
        let mut parent: Vec<Option<usize>> = vec![None; self.keys.len()];
        let mut queue = VecDeque::from([start]);
        while let Some(v) = queue.pop_front() {
            for &w in &self.edges[v] {
                if w == start {
                    let mut path = vec![start];
                    let mut at = v;
                    while at != start {
                        path.push(at);
                        at = parent[at]?;
                    }
                    path[1..].reverse();
                    path.push(start);
                    return Some(path);
                }
                if inside[w] && parent[w].is_none() {
                    parent[w] = Some(v);
                    queue.push_back(w);
                }
            }
        }
        None
    }

    fn name(&self, cycle: &[usize]) -> String {
        let names: Vec<&str> = cycle.iter().map(|&i| self.keys[i]).collect();
        names.join(" -> ")
    }

    fn cycle_problem(&self, cycle: &[usize]) -> Problem {
        let first = cycle.first().map_or("", |&i| self.keys[i]);
        Problem::new(
            format!("resources.{first}.depends_on"),
            format!("dependency cycle: {}", self.name(cycle)),
        )
    }
}

/// Strongly connected components (Tarjan, with an explicit call stack).
fn components(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    const UNSEEN: usize = usize::MAX;
    let n = edges.len();
    let (mut index, mut low, mut on_stack) = (vec![UNSEEN; n], vec![0; n], vec![false; n]);
    let (mut stack, mut calls, mut out) = (Vec::new(), Vec::<(usize, usize)>::new(), Vec::new());
    let mut next = 0;
    for root in 0..n {
        if index[root] != UNSEEN {
            continue;
        }
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        calls.push((root, 0));
        while let Some(top) = calls.last_mut() {
            let v = top.0;
            if let Some(&w) = edges[v].get(top.1) {
                top.1 += 1;
                if index[w] == UNSEEN {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    calls.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            calls.pop();
            if let Some(&(u, _)) = calls.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                out.push(component);
            }
        }
    }
    out
}

/// Problems with `depends_on`: unknown keys, self, repeats, and cycles.
pub(super) fn dependency_problems(bp: &Blueprint) -> Vec<Problem> {
    let mut listed = Listed::default();
    dependency_problems_into(bp, &mut listed);
    listed.into_vec()
}

/// [`dependency_problems`] into `listed`; a path is built only for a
/// problem that is listed.
pub(super) fn dependency_problems_into(bp: &Blueprint, listed: &mut Listed) {
    let graph = Graph::new(bp);
    for r in &bp.resources {
        let mut seen = std::collections::HashSet::new();
        for (i, dep) in r.depends_on.iter().enumerate() {
            let message = if *dep == r.key {
                format!("`{}` depends on itself", snippet(dep))
            } else if !graph.index.contains_key(dep.as_str()) {
                format!("`{}` is not a resource in this blueprint", snippet(dep))
            } else if !seen.insert(dep.as_str()) {
                format!("`{}` is listed twice", snippet(dep))
            } else {
                continue;
            };
            listed.add(|| {
                Problem::new(
                    format!("resources.{}.depends_on[{i}]", snippet(&r.key)),
                    message,
                )
            });
        }
    }
    for cycle in graph.cycles() {
        listed.add(|| graph.cycle_problem(&cycle));
    }
}

/// Resource keys with every resource after all it depends on; ties go to the
/// earlier-declared resource. Unknown dependencies and cycles are refused.
pub fn order(bp: &Blueprint) -> Result<Vec<String>, Problem> {
    let graph = Graph::new(bp);
    for r in &bp.resources {
        for (i, dep) in r.depends_on.iter().enumerate() {
            let path = format!("resources.{}.depends_on[{i}]", r.key);
            if *dep == r.key {
                return Err(Problem::new(
                    path,
                    format!("dependency cycle: {dep} -> {dep}"),
                ));
            }
            if !graph.index.contains_key(dep.as_str()) {
                let message = format!("`{dep}` is not a resource in this blueprint");
                return Err(Problem::new(path, message));
            }
        }
    }
    let n = graph.keys.len();
    let mut waiting_on: Vec<usize> = graph.edges.iter().map(Vec::len).collect();
    let mut dependents = vec![Vec::new(); n];
    for (i, deps) in graph.edges.iter().enumerate() {
        for &j in deps {
            dependents[j].push(i);
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> = (0..n)
        .filter(|&i| waiting_on[i] == 0)
        .map(Reverse)
        .collect();
    let mut out = Vec::with_capacity(n);
    while let Some(Reverse(i)) = ready.pop() {
        out.push(graph.keys[i].to_owned());
        for &d in &dependents[i] {
            waiting_on[d] -= 1;
            if waiting_on[d] == 0 {
                ready.push(Reverse(d));
            }
        }
    }
    if out.len() < n {
        let cycles = graph.cycles();
        return Err(match cycles.first() {
            Some(cycle) => graph.cycle_problem(cycle),
            None => Problem::new("resources", "dependency cycle"),
        });
    }
    Ok(out)
}

/// Everything that depends on `key`, directly or not, in declaration order
/// (`key` itself left out): what a redeploy of `key` must redeploy too.
pub fn dependents(bp: &Blueprint, key: &str) -> Vec<String> {
    let graph = Graph::new(bp);
    let Some(&start) = graph.index.get(key) else {
        return Vec::new();
    };
    let mut dependents = vec![Vec::new(); graph.keys.len()];
    for (i, deps) in graph.edges.iter().enumerate() {
        for &j in deps {
            dependents[j].push(i);
        }
    }
    let mut seen = vec![false; graph.keys.len()];
    let mut stack = vec![start];
    while let Some(v) = stack.pop() {
        for &d in &dependents[v] {
            if !std::mem::replace(&mut seen[d], true) {
                stack.push(d);
            }
        }
    }
    seen[start] = false;
    (0..graph.keys.len())
        .filter(|&i| seen[i])
        .map(|i| graph.keys[i].to_owned())
        .collect()
}

/// Merges dependencies a provider reports (`DescribeResources`) into a copy of
/// `bp`. Repeats are dropped; a dependency on an unknown resource or on itself
/// is refused, and the merged graph is checked again (a provider can close a
/// cycle). Problems already in `bp`'s `depends_on` are reported too.
pub fn with_extra_dependencies(
    bp: &Blueprint,
    extra: &[(String, Vec<String>)],
) -> Result<Blueprint, Problems> {
    let mut out = bp.clone();
    let mut problems = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(bp.resources.len());
    for (i, r) in bp.resources.iter().enumerate() {
        index.entry(r.key.as_str()).or_insert(i);
    }
    let mut listed: Vec<Option<std::collections::HashSet<String>>> = vec![None; bp.resources.len()];
    for (key, deps) in extra {
        let path = format!("resources.{key}.depends_on");
        let Some(&i) = index.get(key.as_str()) else {
            let message =
                format!("a provider described `{key}`, which is not a resource in this blueprint");
            problems.push(Problem::new(format!("resources.{key}"), message));
            continue;
        };
        for dep in deps {
            if dep == key {
                let message = format!("a provider made `{key}` depend on itself");
                problems.push(Problem::new(&path, message));
            } else if !index.contains_key(dep.as_str()) {
                let message = format!(
                    "a provider added a dependency on `{dep}`, which is not a resource in this blueprint"
                );
                problems.push(Problem::new(&path, message));
            } else {
                let r = &mut out.resources[i];
                let has = listed[i].get_or_insert_with(|| r.depends_on.iter().cloned().collect());
                if has.insert(dep.clone()) {
                    r.depends_on.push(dep.clone());
                }
            }
        }
    }
    problems.extend(dependency_problems(&out));
    Problems::check(problems, out)
}
