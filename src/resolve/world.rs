//! The candidates of every repository, indexed once so that many roots can be
//! resolved against them.

use std::collections::HashMap;
use std::fmt;

use super::constraint::Requirement;
use super::term::Bits;
use super::version::Version;

/// Identifies a candidate; the caller assigns it (e.g. a database row id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CandidateId(pub u64);

impl fmt::Display for CandidateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// One version of one element offered by a repository, or installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: CandidateId,
    pub name: String,
    pub version: Version,
    /// Its repository's priority; higher is preferred.
    pub priority: i32,
    /// Installed versions are fixed: no other version of the name can be chosen.
    pub installed: bool,
    pub requirements: Vec<Requirement>,
}

impl Candidate {
    /// `name version`, as used in messages.
    pub fn label(&self) -> String {
        format!("{} {}", self.name, self.version)
    }
}

/// The chosen install closure of a root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// Every chosen candidate once, dependencies before dependents, root last.
    pub order: Vec<CandidateId>,
    /// The chosen direct edges `(dependent, dependency)`, without duplicates.
    pub edges: Vec<(CandidateId, CandidateId)>,
}

/// A requirement of a candidate, resolved against the world once.
#[derive(Debug, Clone)]
pub(super) struct Dep {
    /// The required name, or `None` when no candidate has that name.
    pub(super) name: Option<u32>,
    /// The matching candidates, as positions in the name's preference order.
    pub(super) matches: Bits,
    /// Index into the candidate's `requirements`.
    pub(super) requirement: usize,
}

#[derive(Debug, Clone)]
pub(super) struct NameEntry {
    /// Where the name's candidate indices, most preferred first, sit in
    /// `World::members`.
    start: u32,
    pub(super) len: u32,
    /// Positions of installed candidates (at most one is expected; if there
    /// are several, all of them stay allowed).
    pub(super) installed: Bits,
}

/// All candidates, indexed by name. Build it once, then call
/// [`World::resolve`](crate::resolve::World::resolve) for each root.
#[derive(Debug, Clone)]
pub struct World {
    pub(super) candidates: Vec<Candidate>,
    pub(super) by_id: HashMap<CandidateId, u32>,
    pub(super) names: Vec<NameEntry>,
    /// Candidate indices grouped by name, each group most preferred first.
    /// Flat (like `deps`) so a resolve touches few cache lines.
    members: Vec<u32>,
    /// Per candidate: its name index and its position in that name's order.
    pub(super) place: Vec<(u32, u32)>,
    /// Requirements of all candidates; candidate `c`'s are
    /// `deps[deps_start[c]..deps_start[c + 1]]`.
    deps: Vec<Dep>,
    deps_start: Vec<u32>,
}

/// Preference among candidates of one name: installed, then higher repository
/// priority, then releases over suffixed builds, then higher version; the id
/// breaks remaining ties so the order is deterministic.
fn preference(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.installed
        .cmp(&a.installed)
        .then(b.priority.cmp(&a.priority))
        .then(b.version.is_release().cmp(&a.version.is_release()))
        .then(b.version.cmp(&a.version))
        .then(a.id.cmp(&b.id))
}

impl World {
    /// Indexes `candidates`. If two share an id, the first is the one
    /// [`World::candidate`] returns and that can be a root.
    pub fn new(candidates: Vec<Candidate>) -> World {
        let mut name_index: HashMap<&str, u32> = HashMap::new();
        let mut members: Vec<Vec<u32>> = Vec::new();
        for (i, c) in candidates.iter().enumerate() {
            let next = members.len() as u32;
            let n = *name_index.entry(c.name.as_str()).or_insert(next);
            if n == next {
                members.push(Vec::new());
            }
            if let Some(list) = members.get_mut(n as usize) {
                list.push(i as u32);
            }
        }
        let mut place = vec![(0u32, 0u32); candidates.len()];
        let mut names = Vec::with_capacity(members.len());
        let mut flat = Vec::with_capacity(candidates.len());
        for (n, mut list) in members.into_iter().enumerate() {
            list.sort_by(|&a, &b| preference(&candidates[a as usize], &candidates[b as usize]));
            let mut installed = Bits::empty();
            for (pos, &c) in list.iter().enumerate() {
                place[c as usize] = (n as u32, pos as u32);
                if candidates[c as usize].installed {
                    installed.insert(pos);
                }
            }
            names.push(NameEntry {
                start: flat.len() as u32,
                len: list.len() as u32,
                installed,
            });
            flat.extend(list);
        }
        let mut deps = Vec::new();
        let mut deps_start = Vec::with_capacity(candidates.len() + 1);
        for c in &candidates {
            deps_start.push(deps.len() as u32);
            for (requirement, r) in c.requirements.iter().enumerate() {
                let name = name_index.get(r.name.as_str()).copied();
                let mut matches = Bits::empty();
                if let Some(entry) = name.and_then(|n| names.get(n as usize)) {
                    let group = flat
                        .get(entry.start as usize..(entry.start + entry.len) as usize)
                        .unwrap_or_default();
                    for (pos, &m) in group.iter().enumerate() {
                        if r.matches(&candidates[m as usize].version) {
                            matches.insert(pos);
                        }
                    }
                }
                deps.push(Dep {
                    name,
                    matches,
                    requirement,
                });
            }
        }
        deps_start.push(deps.len() as u32);
        let mut by_id = HashMap::with_capacity(candidates.len());
        for (i, c) in candidates.iter().enumerate() {
            by_id.entry(c.id).or_insert(i as u32);
        }
        World {
            candidates,
            by_id,
            names,
            members: flat,
            place,
            deps,
            deps_start,
        }
    }

    pub fn candidate(&self, id: CandidateId) -> Option<&Candidate> {
        let i = *self.by_id.get(&id)?;
        self.candidates.get(i as usize)
    }

    pub fn candidates(&self) -> &[Candidate] {
        &self.candidates
    }

    pub fn len(&self) -> usize {
        self.candidates.len()
    }

    pub fn is_empty(&self) -> bool {
        self.candidates.is_empty()
    }

    /// Name `n`'s candidate indices, most preferred first.
    pub(super) fn members(&self, n: u32) -> &[u32] {
        self.names
            .get(n as usize)
            .and_then(|e| {
                self.members
                    .get(e.start as usize..(e.start + e.len) as usize)
            })
            .unwrap_or_default()
    }

    /// The candidate at `position` in name `n`'s preference order.
    pub(super) fn at(&self, n: u32, position: usize) -> Option<u32> {
        self.members(n).get(position).copied()
    }

    /// Candidate `c`'s requirements, resolved against the world.
    pub(super) fn deps(&self, c: u32) -> &[Dep] {
        let range = self
            .deps_start
            .get(c as usize)
            .zip(self.deps_start.get(c as usize + 1));
        range
            .and_then(|(&a, &b)| self.deps.get(a as usize..b as usize))
            .unwrap_or_default()
    }

    pub(super) fn label(&self, c: u32) -> String {
        self.candidates
            .get(c as usize)
            .map(Candidate::label)
            .unwrap_or_default()
    }
}
