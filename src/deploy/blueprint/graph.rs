//! The dependency graph of a blueprint's resources: problems with
//! `depends_on`, cycles (named), topological order, dependents, and merging
//! dependencies that providers add. Walks are iterative, so a long chain of
//! resources cannot overflow the stack.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use super::{Blueprint, Problem, Problems};

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
                for dep in &r.depends_on {
                    if let Some(&j) = index.get(dep.as_str())
                        && j != i
                        && !out.contains(&j)
                    {
                        out.push(j);
                    }
                }
                out
            })
            .collect();
        Graph { keys, index, edges }
    }

    /// `closure[j]` is true when resource `from` depends on `j`, directly or not.
    pub(super) fn dependencies_of(&self, from: usize) -> Vec<bool> {
        let mut seen = vec![false; self.keys.len()];
        let mut stack = self.edges.get(from).cloned().unwrap_or_default();
        while let Some(j) = stack.pop() {
            if !std::mem::replace(&mut seen[j], true) {
                stack.extend(&self.edges[j]);
            }
        }
        seen
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
    let graph = Graph::new(bp);
    let mut problems = Vec::new();
    for r in &bp.resources {
        for (i, dep) in r.depends_on.iter().enumerate() {
            let path = format!("resources.{}.depends_on[{i}]", r.key);
            if *dep == r.key {
                problems.push(Problem::new(path, format!("`{dep}` depends on itself")));
            } else if !graph.index.contains_key(dep.as_str()) {
                let message = format!("`{dep}` is not a resource in this blueprint");
                problems.push(Problem::new(path, message));
            } else if r.depends_on[..i].contains(dep) {
                problems.push(Problem::new(path, format!("`{dep}` is listed twice")));
            }
        }
    }
    problems.extend(graph.cycles().iter().map(|c| graph.cycle_problem(c)));
    problems
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
    for (key, deps) in extra {
        let path = format!("resources.{key}.depends_on");
        if bp.resource(key).is_none() {
            let message =
                format!("a provider described `{key}`, which is not a resource in this blueprint");
            problems.push(Problem::new(format!("resources.{key}"), message));
            continue;
        }
        for dep in deps {
            if dep == key {
                let message = format!("a provider made `{key}` depend on itself");
                problems.push(Problem::new(&path, message));
            } else if bp.resource(dep).is_none() {
                let message = format!(
                    "a provider added a dependency on `{dep}`, which is not a resource in this blueprint"
                );
                problems.push(Problem::new(&path, message));
            } else if let Some(r) = out.resources.iter_mut().find(|r| r.key == *key)
                && !r.depends_on.contains(dep)
            {
                r.depends_on.push(dep.clone());
            }
        }
    }
    problems.extend(dependency_problems(&out));
    Problems::check(problems, out)
}
