//! Resolver examples and properties, checked against brute force on small worlds.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

fn version(s: &str) -> Version {
    match s.parse() {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// `"lib >=1.0.0, <2.0.0"` or `"lib"`.
fn requirement(text: &str) -> Requirement {
    let (name, rest) = text.split_once(' ').unwrap_or((text, ""));
    let pairs: Vec<(&str, &str)> = rest
        .split(", ")
        .filter(|p| !p.is_empty())
        .map(|p| {
            let split = p.find(|c: char| c.is_ascii_digit()).unwrap_or(0);
            (&p[..split], &p[split..])
        })
        .collect();
    match Requirement::from_keys("test", name, pairs) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    }
}

struct Spec {
    id: u64,
    label: &'static str,
    priority: i32,
    installed: bool,
    requires: &'static [&'static str],
}

/// `c(1, "app 1.0.0", &["lib >=1.0.0"])`.
fn c(id: u64, label: &'static str, requires: &'static [&'static str]) -> Spec {
    Spec {
        id,
        label,
        priority: 0,
        installed: false,
        requires,
    }
}

impl Spec {
    fn installed(mut self) -> Self {
        self.installed = true;
        self
    }

    fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }
}

fn world(specs: Vec<Spec>) -> World {
    World::new(
        specs
            .into_iter()
            .map(|s| {
                let (name, v) = s.label.split_once(' ').unwrap_or((s.label, "0.0.0"));
                Candidate {
                    id: CandidateId(s.id),
                    name: name.to_string(),
                    version: version(v),
                    priority: s.priority,
                    installed: s.installed,
                    requirements: s.requires.iter().map(|r| requirement(r)).collect(),
                }
            })
            .collect(),
    )
}

fn ids(world: &World, root: u64) -> Vec<u64> {
    match world.resolve(CandidateId(root)) {
        Ok(r) => r.order.iter().map(|c| c.0).collect(),
        Err(e) => panic!("{e}"),
    }
}

fn error(world: &World, root: u64) -> ResolveError {
    match world.resolve(CandidateId(root)) {
        Ok(r) => panic!("resolved: {r:?}"),
        Err(e) => e,
    }
}

#[test]
fn diamond_shares_one_version() {
    let w = world(vec![
        c(1, "app 1.0.0", &["web", "db"]),
        c(2, "web 1.0.0", &["lib >=1.0.0"]),
        c(3, "db 1.0.0", &["lib <2.0.0"]),
        c(4, "lib 1.0.0", &[]),
        c(5, "lib 1.5.0", &[]),
        c(6, "lib 2.0.0", &[]),
    ]);
    let order = ids(&w, 1);
    assert_eq!(order.len(), 4);
    assert_eq!(order.last(), Some(&1));
    assert!(order.contains(&5));
    let pos = |x: u64| order.iter().position(|&y| y == x);
    assert!(pos(5) < pos(2) && pos(5) < pos(3));
    let Ok(r) = w.resolve(CandidateId(1)) else {
        panic!("no resolution")
    };
    let mut edges: Vec<(u64, u64)> = r.edges.iter().map(|(a, b)| (a.0, b.0)).collect();
    edges.sort();
    assert_eq!(edges, vec![(1, 2), (1, 3), (2, 5), (3, 5)]);
}

#[test]
fn backtracks_from_the_preferred_version() {
    let w = world(vec![
        c(1, "app 1.0.0", &["web", "lib <2.0.0"]),
        c(2, "web 2.0.0", &["lib >=2.0.0"]),
        c(3, "web 1.0.0", &["lib >=1.0.0"]),
        c(4, "lib 1.0.0", &[]),
        c(5, "lib 2.0.0", &[]),
    ]);
    assert_eq!(ids(&w, 1), vec![4, 3, 1]);
}

#[test]
fn backtracks_through_a_deeper_conflict() {
    // The best `a` needs x 2 via b, the best `c` needs x 1; only a 1 works.
    let w = world(vec![
        c(1, "root 1.0.0", &["a", "c"]),
        c(2, "a 2.0.0", &["b ==2.0.0"]),
        c(3, "a 1.0.0", &["b ==1.0.0"]),
        c(4, "b 2.0.0", &["x ==2.0.0"]),
        c(5, "b 1.0.0", &["x ==1.0.0"]),
        c(6, "c 1.0.0", &["x ==1.0.0"]),
        c(7, "x 1.0.0", &[]),
        c(8, "x 2.0.0", &[]),
    ]);
    let mut order = ids(&w, 1);
    order.sort();
    assert_eq!(order, vec![1, 3, 5, 6, 7]);
}

#[test]
fn conflict_names_both_chains() {
    let w = world(vec![
        c(1, "app 1.0.0", &["lib >=2.0.0", "web ==1.0.0"]),
        c(2, "web 1.0.0", &["lib <2.0.0"]),
        c(3, "lib 1.0.0", &[]),
        c(4, "lib 2.0.0", &[]),
    ]);
    let e = error(&w, 1);
    assert_eq!(e.code(), "DEPENDENCY_CONSTRAINT");
    assert_eq!(
        e.to_string(),
        "Cannot install app 1.0.0 because no consistent set of versions exists: \
         app 1.0.0 requires lib >=2.0.0; app 1.0.0 requires web ==1.0.0 which requires lib <2.0.0."
    );
}

#[test]
fn installed_version_is_fixed() {
    let w = world(vec![
        c(1, "app 1.0.0", &["web ==1.0.0"]),
        c(2, "web 1.0.0", &["lib >=2.0.0"]),
        c(3, "lib 1.0.0", &[]).installed(),
        c(4, "lib 2.0.0", &[]),
    ]);
    let e = error(&w, 1);
    assert_eq!(e.code(), "DEPENDENCY_CONSTRAINT");
    assert_eq!(
        e.to_string(),
        "Cannot install app 1.0.0 because no consistent set of versions exists: \
         app 1.0.0 requires web ==1.0.0 which requires lib >=2.0.0, but lib 1.0.0 is installed."
    );
    assert!(matches!(&e, ResolveError::Conflict { installed, .. } if installed == &["lib 1.0.0"]));
}

#[test]
fn installed_version_is_preferred_and_kept() {
    let w = world(vec![
        c(1, "app 1.0.0", &["lib"]),
        c(2, "lib 1.0.0", &[]).installed(),
        c(3, "lib 2.0.0", &[]).priority(5),
    ]);
    assert_eq!(ids(&w, 1), vec![2, 1]);
}

#[test]
fn preference_order_when_free() {
    let w = world(vec![
        c(1, "app 1.0.0", &["a", "b", "c"]),
        // Priority beats version.
        c(2, "a 1.0.0", &[]).priority(2),
        c(3, "a 3.0.0", &[]).priority(1),
        // A release beats a higher suffixed build.
        c(4, "b 1.0.0", &[]),
        c(5, "b 2.0.0-rc.1", &[]),
        // Otherwise the higher version.
        c(6, "c 1.0.0", &[]),
        c(7, "c 1.1.0", &[]),
    ]);
    let mut order = ids(&w, 1);
    order.sort();
    assert_eq!(order, vec![1, 2, 4, 7]);
}

#[test]
fn missing_dependency_is_not_found() {
    let w = world(vec![
        c(1, "app 1.0.0", &["web ==1.0.0"]),
        c(2, "web 1.0.0", &["lib >=3.0.0"]),
        c(3, "lib 1.0.0", &[]),
        c(4, "other 1.0.0", &["ghost"]),
    ]);
    let e = error(&w, 1);
    assert_eq!(e.code(), "DEPENDENCY_NOT_FOUND");
    assert_eq!(
        e.to_string(),
        "Cannot install app 1.0.0 because a required element is missing: \
         app 1.0.0 requires web ==1.0.0 which requires lib >=3.0.0, but no version of lib matches."
    );
    let e = error(&w, 4);
    assert_eq!(
        e.to_string(),
        "Cannot install other 1.0.0 because a required element is missing: \
         other 1.0.0 requires ghost (any version), but no element named `ghost` exists."
    );
    assert_eq!(error(&w, 99).code(), "DEPENDENCY_NOT_FOUND");
}

#[test]
fn missing_version_is_avoided_when_possible() {
    let w = world(vec![
        c(1, "app 1.0.0", &["web"]),
        c(2, "web 2.0.0", &["lib >=3.0.0"]),
        c(3, "web 1.0.0", &["lib"]),
        c(4, "lib 1.0.0", &[]),
    ]);
    assert_eq!(ids(&w, 1), vec![4, 3, 1]);
}

#[test]
fn cycle_is_reported_when_unavoidable() {
    let w = world(vec![
        c(1, "a 1.0.0", &["b"]),
        c(2, "b 1.0.0", &["a"]),
        c(3, "s 1.0.0", &["s"]),
    ]);
    let e = error(&w, 1);
    assert_eq!(e.code(), "DEPENDENCY_CYCLE");
    assert_eq!(
        e.to_string(),
        "Cannot install a 1.0.0 because its dependencies form a cycle, so no install order exists: \
         a 1.0.0 -> b 1.0.0 -> a 1.0.0."
    );
    assert_eq!(error(&w, 3).code(), "DEPENDENCY_CYCLE");
}

#[test]
fn acyclic_solution_is_preferred() {
    let w = world(vec![
        c(1, "a 1.0.0", &["b"]),
        c(2, "b 2.0.0", &["a"]),
        c(3, "b 1.0.0", &[]),
    ]);
    assert_eq!(ids(&w, 1), vec![3, 1]);
}

#[test]
fn ten_thousand_deep_chain() {
    const DEPTH: u64 = 10_000;
    let mut candidates: Vec<Candidate> = (0..DEPTH)
        .map(|i| Candidate {
            id: CandidateId(i),
            name: format!("n{i}"),
            version: Version::new(1, 0, 0),
            priority: 0,
            installed: false,
            requirements: if i + 1 < DEPTH {
                vec![requirement(&format!("n{} >=1.0.0", i + 1))]
            } else {
                Vec::new()
            },
        })
        .collect();
    let w = World::new(candidates.clone());
    let order = ids(&w, 0);
    assert_eq!(order.len(), DEPTH as usize);
    assert_eq!(order.first(), Some(&(DEPTH - 1)));
    // A conflict at the bottom, and a cycle through the whole chain.
    candidates[(DEPTH - 1) as usize].requirements = vec![requirement("n0 >=2.0.0")];
    let mut with_n0_2 = candidates.clone();
    with_n0_2.push(Candidate {
        id: CandidateId(DEPTH),
        version: Version::new(2, 0, 0),
        ..candidates[0].clone()
    });
    let e = error(&World::new(with_n0_2), 0);
    assert_eq!(e.code(), "DEPENDENCY_CONSTRAINT");
    assert_eq!(
        e.to_string(),
        "Cannot install n0 1.0.0 because no consistent set of versions exists: n0 1.0.0 \
         requires n1 >=1.0.0 (n1 1.0.0) which requires n2 >=1.0.0 (n2 1.0.0) which requires \
         n3 >=1.0.0 (n3 1.0.0) which requires n4 >=1.0.0 (n4 1.0.0) which, through 9992 more \
         requirements, requires n9997 >=1.0.0 (n9997 1.0.0) which requires n9998 >=1.0.0 \
         (n9998 1.0.0) which requires n9999 >=1.0.0 (n9999 1.0.0) which requires n0 >=2.0.0."
    );
    // Learning from a cycle costs O(length²) (each resolution step keeps the
    // rest of the cycle), so close a shorter one.
    candidates[999].requirements = vec![requirement("n0")];
    let e = error(&World::new(candidates), 0);
    assert_eq!(e.code(), "DEPENDENCY_CYCLE");
}

#[test]
fn many_roots_one_world() {
    let w = world(vec![
        c(1, "app 1.0.0", &["lib <2.0.0"]),
        c(2, "tool 1.0.0", &["lib >=2.0.0"]),
        c(3, "lib 1.0.0", &[]),
        c(4, "lib 2.0.0", &[]),
    ]);
    assert_eq!(ids(&w, 1), vec![3, 1]);
    assert_eq!(ids(&w, 2), vec![4, 2]);
}

// ---- Properties on small random worlds, checked by brute force ----

const NAMES: usize = 4;
const VERSIONS: [&str; 4] = ["1.0.0", "2.0.0-rc.1", "2.0.0", "3.0.0"];

#[derive(Debug, Clone)]
struct Small {
    candidates: Vec<Candidate>,
    root: usize,
}

fn small_world(constrained: bool, dag: bool) -> impl Strategy<Value = Small> {
    let requirement = (0..NAMES, 0usize..4, 0usize..VERSIONS.len());
    let candidate = (
        0..NAMES,
        0..VERSIONS.len(),
        0i32..2,
        prop::bool::weighted(0.15),
        prop::collection::vec(requirement, 0..3),
    );
    (
        prop::collection::vec(candidate, 1..9),
        any::<prop::sample::Index>(),
    )
        .prop_map(move |(raw, root)| {
            let mut installed_seen = [false; NAMES];
            let candidates: Vec<Candidate> = raw
                .into_iter()
                .enumerate()
                .map(|(i, (n, v, priority, installed, reqs))| {
                    let installed = installed && !std::mem::replace(&mut installed_seen[n], true);
                    let requirements = reqs
                        .into_iter()
                        .filter(|(m, _, _)| !dag || *m > n)
                        .map(|(m, kind, at)| {
                            let key = match kind {
                                0 => ">=",
                                1 => "<",
                                2 => "==",
                                _ => "<=",
                            };
                            let pairs: Vec<(&str, &str)> = if constrained {
                                vec![(key, VERSIONS[at])]
                            } else {
                                Vec::new()
                            };
                            Requirement::from_keys("p", &format!("n{m}"), pairs)
                                .unwrap_or_else(|_| Requirement::any(format!("n{m}")))
                        })
                        .collect();
                    Candidate {
                        id: CandidateId(i as u64),
                        name: format!("n{n}"),
                        version: version(VERSIONS[v]),
                        priority,
                        installed,
                        requirements,
                    }
                })
                .collect();
            let root = root.index(candidates.len());
            Small { candidates, root }
        })
}

/// Whether `chosen` (name -> candidate index) is valid: root chosen, every
/// chosen requirement met, installed versions kept. Returns whether the chosen
/// graph has a cycle too.
fn check(s: &Small, chosen: &HashMap<&str, usize>) -> Option<bool> {
    let root = &s.candidates[s.root];
    if chosen.get(root.name.as_str()) != Some(&s.root) {
        return None;
    }
    for (&name, &i) in chosen {
        let c = &s.candidates[i];
        let installed = s.candidates.iter().any(|o| o.name == name && o.installed);
        if installed && !c.installed {
            return None;
        }
        for r in &c.requirements {
            let d = chosen.get(r.name.as_str())?;
            if !r.matches(&s.candidates[*d].version) {
                return None;
            }
        }
    }
    // Cycle check by repeatedly removing chosen nodes with no chosen dependency left.
    let mut left: Vec<&str> = chosen.keys().copied().collect();
    loop {
        let before = left.len();
        let snapshot = left.clone();
        left.retain(|n| {
            let c = &s.candidates[chosen[n]];
            c.requirements
                .iter()
                .any(|r| snapshot.contains(&r.name.as_str()))
        });
        if left.is_empty() {
            return Some(false);
        }
        if left.len() == before {
            return Some(true);
        }
    }
}

/// (a valid assignment exists, a valid acyclic assignment exists)
fn brute_force(s: &Small) -> (bool, bool) {
    let names: Vec<String> = (0..NAMES).map(|n| format!("n{n}")).collect();
    let options: Vec<Vec<Option<usize>>> = names
        .iter()
        .map(|n| {
            let mut o = vec![None];
            o.extend(
                (0..s.candidates.len())
                    .filter(|&i| &s.candidates[i].name == n)
                    .map(Some),
            );
            o
        })
        .collect();
    let (mut any, mut acyclic) = (false, false);
    let mut idx = [0usize; NAMES];
    loop {
        let chosen: HashMap<&str, usize> = (0..NAMES)
            .filter_map(|k| options[k][idx[k]].map(|i| (names[k].as_str(), i)))
            .collect();
        if let Some(cyclic) = check(s, &chosen) {
            any = true;
            acyclic |= !cyclic;
        }
        let mut k = 0;
        while k < NAMES && idx[k] + 1 == options[k].len() {
            idx[k] = 0;
            k += 1;
        }
        if k == NAMES {
            return (any, acyclic);
        }
        idx[k] += 1;
    }
}

fn rank(c: &Candidate) -> (bool, i32, bool, Version) {
    (
        c.installed,
        c.priority,
        c.version.is_release(),
        c.version.clone(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn agrees_with_brute_force(s in small_world(true, false)) {
        let world = World::new(s.candidates.clone());
        let (any, acyclic) = brute_force(&s);
        match world.resolve(CandidateId(s.root as u64)) {
            Ok(r) => {
                prop_assert!(acyclic);
                let position: HashMap<CandidateId, usize> =
                    r.order.iter().enumerate().map(|(i, c)| (*c, i)).collect();
                prop_assert_eq!(position.len(), r.order.len());
                prop_assert_eq!(r.order.last(), Some(&CandidateId(s.root as u64)));
                let mut chosen: HashMap<&str, usize> = HashMap::new();
                for id in &r.order {
                    let i = id.0 as usize;
                    prop_assert!(chosen.insert(s.candidates[i].name.as_str(), i).is_none());
                }
                prop_assert_eq!(check(&s, &chosen), Some(false));
                for (a, b) in &r.edges {
                    prop_assert!(position[b] < position[a]);
                }
                // Every requirement of every chosen element is an edge.
                for &i in chosen.values() {
                    for req in &s.candidates[i].requirements {
                        let d = chosen[req.name.as_str()];
                        prop_assert!(r.edges.contains(&(CandidateId(i as u64), CandidateId(d as u64))));
                    }
                }
                // Local optimality: swapping in a more preferred candidate breaks it.
                for (&name, &i) in &chosen {
                    for (j, other) in s.candidates.iter().enumerate() {
                        if other.name == name && rank(other) > rank(&s.candidates[i]) {
                            let mut swapped = chosen.clone();
                            swapped.insert(name, j);
                            prop_assert_ne!(check(&s, &swapped), Some(false));
                        }
                    }
                }
            }
            Err(e) => match e.code() {
                "DEPENDENCY_CYCLE" => prop_assert!(any && !acyclic, "{}", e),
                "DEPENDENCY_CONSTRAINT" | "DEPENDENCY_NOT_FOUND" => prop_assert!(!any, "{}", e),
                other => prop_assert!(false, "unexpected {other}: {e}"),
            },
        }
    }

    #[test]
    fn unconstrained_dag_takes_the_top_preference(s in small_world(false, true)) {
        let root_name = &s.candidates[s.root].name;
        let names_exist = s.candidates.iter().flat_map(|c| &c.requirements).all(|r| {
            s.candidates.iter().any(|c| c.name == r.name)
        });
        let root_fixed = s.candidates.iter().any(|c| &c.name == root_name && c.installed)
            && !s.candidates[s.root].installed;
        prop_assume!(names_exist && !root_fixed);
        let world = World::new(s.candidates.clone());
        let r = world.resolve(CandidateId(s.root as u64));
        prop_assert!(r.is_ok(), "{:?}", r);
        for id in r.iter().flat_map(|r| &r.order) {
            let c = &s.candidates[id.0 as usize];
            if &c.name == root_name {
                continue;
            }
            let best = s.candidates.iter().filter(|o| o.name == c.name).map(rank).max();
            prop_assert_eq!(Some(rank(c)), best);
        }
    }
}
