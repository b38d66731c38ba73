//! The PubGrub algorithm (Natalie Weizenbaum's, as in Dart's pub and the
//! `pubgrub` crate), specialised to bitsets over each name's candidates.
//!
//! Facts are *incompatibilities*: sets of terms that cannot all hold. The
//! solver alternates unit propagation and decisions (the most preferred
//! allowed candidate of the most constrained pending name); on a conflict it
//! derives a new incompatibility by resolution, backjumps, and keeps it, so a
//! failed combination is never tried twice. When nothing is left to decide it
//! checks the chosen graph for a cycle; a cycle becomes one more
//! incompatibility ("not all of these together"), so an acyclic solution is
//! found whenever one exists. Every loop is iterative: no recursion depth
//! grows with the input.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::term::{Bits, Term};
use super::world::World;

pub(super) type SlotId = u32;
pub(super) type IncompatId = u32;

/// Where an incompatibility comes from; the leaves of an explanation.
#[derive(Debug, Clone)]
pub(super) enum Cause {
    /// The root candidate must be chosen.
    Root,
    /// `candidate` requires its `dep`-th requirement.
    Dependency { candidate: u32, dep: u32 },
    /// Name `name` has an installed version; no other can be chosen.
    Installed { name: u32 },
    /// These candidates together form a dependency cycle.
    Cycle,
    /// Derived by resolution from two others.
    Derived(IncompatId, IncompatId),
}

#[derive(Debug, Clone)]
pub(super) struct Incompat {
    pub(super) terms: Vec<(SlotId, Term)>,
    pub(super) cause: Cause,
}

/// Per-solve state of one name that has come up.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) name: u32,
    /// Intersection of all assignments to this name in the trail.
    acc: Term,
    decided: Option<usize>,
    /// Global trail indices of this name's assignments, oldest first.
    trail: Vec<u32>,
    /// Incompatibilities mentioning this name, for unit propagation.
    incompats: Vec<IncompatId>,
    /// Positions whose requirements have been added as incompatibilities.
    deps_added: Bits,
}

#[derive(Debug)]
struct Assignment {
    slot: SlotId,
    term: Term,
    level: u32,
    /// `None` for a decision.
    cause: Option<IncompatId>,
}

enum Relation {
    Satisfied,
    AlmostSatisfied(usize),
    Other,
}

/// What a finished search found: candidate indices in install order and the
/// chosen edges, or a cycle among the chosen candidates.
pub(super) enum Found {
    Acyclic {
        order: Vec<u32>,
        edges: Vec<(u32, u32)>,
    },
    Cycle(Vec<u32>),
}

pub(super) struct Solver<'w> {
    world: &'w World,
    root: u32,
    root_slot: SlotId,
    root_position: usize,
    forbid_cycles: bool,
    pub(super) incompats: Vec<Incompat>,
    pub(super) slots: Vec<Slot>,
    slot_of: Vec<u32>,
    trail: Vec<Assignment>,
    level: u32,
    /// Names to decide, fewest allowed candidates first, as (count, slot).
    /// Entries go stale when a name narrows or is decided; `pick` skips those.
    pending: BinaryHeap<Reverse<(u32, SlotId)>>,
    /// Whether a cycle incompatibility was ever added.
    pub(super) saw_cycle: bool,
}

const NO_SLOT: u32 = u32::MAX;

impl<'w> Solver<'w> {
    pub(super) fn new(world: &'w World, root: u32, forbid_cycles: bool) -> Self {
        let (name, position) = world.place.get(root as usize).copied().unwrap_or((0, 0));
        let mut solver = Solver {
            world,
            root,
            root_slot: 0,
            root_position: position as usize,
            forbid_cycles,
            incompats: Vec::new(),
            slots: Vec::new(),
            slot_of: vec![NO_SLOT; world.names.len()],
            trail: Vec::new(),
            level: 0,
            pending: BinaryHeap::new(),
            saw_cycle: false,
        };
        solver.root_slot = solver.slot(name);
        let root_term = Term::neg(Bits::single(solver.root_position));
        solver.add_incompat(vec![(solver.root_slot, root_term)], Cause::Root);
        solver
    }

    pub(super) fn world(&self) -> &'w World {
        self.world
    }

    pub(super) fn root(&self) -> u32 {
        self.root
    }

    /// Runs the search; `Err` holds the incompatibility proving there is no solution.
    pub(super) fn solve(&mut self) -> Result<Found, IncompatId> {
        let mut next = self.root_slot;
        loop {
            self.propagate(next)?;
            match self.pick() {
                Some(slot) => next = self.decide(slot),
                None => match self.finish() {
                    Found::Cycle(cycle) if self.forbid_cycles => {
                        self.saw_cycle = true;
                        let terms = cycle
                            .iter()
                            .map(|&c| {
                                let (n, pos) = self.world.place[c as usize];
                                (self.slot(n), Term::pos(Bits::single(pos as usize)))
                            })
                            .collect();
                        let id = self.add_incompat(terms, Cause::Cycle);
                        next = self.conflict(id)?;
                    }
                    found => return Ok(found),
                },
            }
        }
    }

    fn slot(&mut self, name: u32) -> SlotId {
        let existing = self.slot_of.get(name as usize).copied().unwrap_or(NO_SLOT);
        if existing != NO_SLOT {
            return existing;
        }
        let id = self.slots.len() as SlotId;
        if let Some(s) = self.slot_of.get_mut(name as usize) {
            *s = id;
        }
        self.slots.push(Slot {
            name,
            acc: Term::any(),
            decided: None,
            trail: Vec::new(),
            incompats: Vec::new(),
            deps_added: Bits::empty(),
        });
        if let Some(entry) = self.world.names.get(name as usize) {
            let others = Bits::full(entry.len as usize).and_not(&entry.installed);
            if !entry.installed.is_empty() && !others.is_empty() {
                self.add_incompat(vec![(id, Term::pos(others))], Cause::Installed { name });
            }
        }
        id
    }

    fn add_incompat(&mut self, terms: Vec<(SlotId, Term)>, cause: Cause) -> IncompatId {
        let id = self.store(terms, cause);
        self.index(id);
        id
    }

    /// Keeps an incompatibility for explanations without using it in propagation.
    fn store(&mut self, terms: Vec<(SlotId, Term)>, cause: Cause) -> IncompatId {
        let id = self.incompats.len() as IncompatId;
        self.incompats.push(Incompat { terms, cause });
        id
    }

    fn index(&mut self, id: IncompatId) {
        let Some(inc) = self.incompats.get(id as usize) else {
            return;
        };
        for (slot, _) in &inc.terms {
            if let Some(s) = self.slots.get_mut(*slot as usize) {
                s.incompats.push(id);
            }
        }
    }

    fn relation(&self, id: IncompatId) -> Relation {
        let mut unsatisfied = None;
        for (k, (slot, term)) in self.incompats[id as usize].terms.iter().enumerate() {
            let acc = &self.slots[*slot as usize].acc;
            if term.satisfied_by(acc) {
                continue;
            }
            if unsatisfied.is_some() || term.contradicted_by(acc) {
                return Relation::Other;
            }
            unsatisfied = Some(k);
        }
        match unsatisfied {
            None => Relation::Satisfied,
            Some(k) => Relation::AlmostSatisfied(k),
        }
    }

    fn propagate(&mut self, start: SlotId) -> Result<(), IncompatId> {
        let mut changed = vec![start];
        while let Some(slot) = changed.pop() {
            let mut i = self.slots[slot as usize].incompats.len();
            while i > 0 {
                i -= 1;
                let id = self.slots[slot as usize].incompats[i];
                match self.relation(id) {
                    Relation::Satisfied => {
                        let next = self.conflict(id)?;
                        changed.clear();
                        changed.push(next);
                        break;
                    }
                    Relation::AlmostSatisfied(k) => {
                        let (target, term) = &self.incompats[id as usize].terms[k];
                        let (target, term) = (*target, term.negate());
                        self.derive(target, term, id);
                        if !changed.contains(&target) {
                            changed.push(target);
                        }
                    }
                    Relation::Other => {}
                }
            }
        }
        Ok(())
    }

    fn derive(&mut self, slot: SlotId, term: Term, cause: IncompatId) {
        let index = self.trail.len() as u32;
        let s = &mut self.slots[slot as usize];
        s.acc = s.acc.intersect(&term);
        s.trail.push(index);
        if s.acc.positive && s.decided.is_none() {
            self.pending.push(Reverse((s.acc.set.count(), slot)));
        }
        self.trail.push(Assignment {
            slot,
            term,
            level: self.level,
            cause: Some(cause),
        });
    }

    /// Handles a satisfied incompatibility: learns, backjumps, and derives the
    /// consequence. Returns the name to propagate from.
    fn conflict(&mut self, id: IncompatId) -> Result<SlotId, IncompatId> {
        let (slot, root_cause) = self.resolve_conflict(id)?;
        let term = self.incompats[root_cause as usize]
            .terms
            .iter()
            .find(|(s, _)| *s == slot)
            .map(|(_, t)| t.negate())
            .unwrap_or_else(Term::any);
        self.derive(slot, term, root_cause);
        Ok(slot)
    }

    fn is_terminal(&self, id: IncompatId) -> bool {
        match self.incompats[id as usize].terms.as_slice() {
            [] => true,
            [(slot, term)] => *slot == self.root_slot && term.contains(self.root_position),
            _ => false,
        }
    }

    /// The first trail index at which the slot's assignments, intersected with
    /// `start`, satisfy `term`, and that assignment's level.
    fn first_satisfying(&self, slot: SlotId, term: &Term, start: Term) -> (u32, u32) {
        let mut acc = start;
        for &index in &self.slots[slot as usize].trail {
            let a = &self.trail[index as usize];
            acc = acc.intersect(&a.term);
            if term.satisfied_by(&acc) {
                return (index, a.level);
            }
        }
        (0, 0)
    }

    fn resolve_conflict(&mut self, id: IncompatId) -> Result<(SlotId, IncompatId), IncompatId> {
        let mut current = id;
        loop {
            if self.is_terminal(current) {
                return Err(current);
            }
            let terms = &self.incompats[current as usize].terms;
            let found: Vec<(u32, u32)> = terms
                .iter()
                .map(|(slot, term)| self.first_satisfying(*slot, term, Term::any()))
                .collect();
            let Some(k) = (0..found.len()).max_by_key(|&k| found[k].0) else {
                return Err(current);
            };
            let (satisfier, satisfier_level) = found[k];
            let (slot, term) = (terms[k].0, terms[k].1.clone());
            let sat = &self.trail[satisfier as usize];
            let (previous, _) = self.first_satisfying(slot, &term, sat.term.clone());
            let sat_cause = sat.cause;
            let mut previous_level = self.trail.get(previous as usize).map_or(0, |a| a.level);
            for (j, &(_, level)) in found.iter().enumerate() {
                if j != k {
                    previous_level = previous_level.max(level);
                }
            }
            match sat_cause {
                Some(cause) if previous_level >= satisfier_level => {
                    let terms = self.prior_cause(current, cause, slot);
                    current = self.store(terms, Cause::Derived(current, cause));
                }
                Some(_) | None => {
                    if current != id {
                        self.index(current);
                    }
                    self.backtrack(previous_level);
                    return Ok((slot, current));
                }
            }
        }
    }

    /// Resolution on `slot`: from {slot: t1, R1} and {slot: t2, R2} follows
    /// {slot: t1 ∪ t2, R1 ∧ R2}.
    fn prior_cause(&self, a: IncompatId, b: IncompatId, slot: SlotId) -> Vec<(SlotId, Term)> {
        let mut on_slot = Term::pos(Bits::empty());
        let mut terms: Vec<(SlotId, Term)> = Vec::new();
        for inc in [a, b] {
            for (s, t) in &self.incompats[inc as usize].terms {
                if *s == slot {
                    on_slot = on_slot.union(t);
                } else if let Some((_, existing)) = terms.iter_mut().find(|(x, _)| x == s) {
                    *existing = existing.intersect(t);
                } else {
                    terms.push((*s, t.clone()));
                }
            }
        }
        if !on_slot.is_any() {
            terms.push((slot, on_slot));
        }
        terms.retain(|(_, t)| !t.is_any());
        terms
    }

    fn backtrack(&mut self, level: u32) {
        let mut dirty = Vec::new();
        while let Some(last) = self.trail.last() {
            if last.level <= level {
                break;
            }
            let slot = last.slot;
            self.trail.pop();
            self.slots[slot as usize].trail.pop();
            dirty.push(slot);
        }
        self.level = level;
        for slot in dirty {
            let s = &self.slots[slot as usize];
            let mut acc = Term::any();
            let mut decided = None;
            for &index in &s.trail {
                let a = &self.trail[index as usize];
                acc = acc.intersect(&a.term);
                if a.cause.is_none() {
                    decided = a.term.set.first();
                }
            }
            let s = &mut self.slots[slot as usize];
            s.acc = acc;
            s.decided = decided;
            if s.acc.positive && s.decided.is_none() {
                self.pending.push(Reverse((s.acc.set.count(), slot)));
            }
        }
    }

    /// The pending name with the fewest allowed candidates, if any.
    fn pick(&mut self) -> Option<SlotId> {
        while let Some(Reverse((count, slot))) = self.pending.pop() {
            let s = &self.slots[slot as usize];
            if s.acc.positive && s.decided.is_none() && s.acc.set.count() == count {
                return Some(slot);
            }
        }
        None
    }

    /// Chooses the best allowed candidate of `slot`, unless its requirements
    /// already conflict (then propagation rules it out). Returns the name to
    /// propagate from.
    fn decide(&mut self, slot: SlotId) -> SlotId {
        let s = &self.slots[slot as usize];
        let name = s.name;
        let Some(position) = s.acc.set.first() else {
            return slot;
        };
        let Some(candidate) = self.world.at(name, position) else {
            return slot;
        };
        let choices = s.acc.set.count();
        if !s.deps_added.contains(position) {
            self.slots[slot as usize].deps_added.insert(position);
            let first_new = self.incompats.len() as IncompatId;
            self.add_dependencies(slot, name, position, candidate);
            let conflicting = (first_new..self.incompats.len() as IncompatId).any(|id| {
                self.incompats[id as usize].terms.iter().all(|(s, t)| {
                    *s == slot && t.contains(position)
                        || t.satisfied_by(&self.slots[*s as usize].acc)
                })
            });
            if conflicting {
                // Not chosen: propagation derives that this candidate is ruled out.
                return slot;
            }
        }
        // With one candidate left the choice is forced: it stays at the level
        // that forced it, so a later conflict jumps straight past it instead
        // of retrying it (a long forced chain would otherwise be re-decided
        // once per conflict, quadratically). It is never a conflict's
        // satisfier, as the derivation before it already implies it.
        if choices > 1 {
            self.level += 1;
        }
        let index = self.trail.len() as u32;
        let term = Term::pos(Bits::single(position));
        let s = &mut self.slots[slot as usize];
        s.acc = s.acc.intersect(&term);
        s.decided = Some(position);
        s.trail.push(index);
        self.trail.push(Assignment {
            slot,
            term,
            level: self.level,
            cause: None,
        });
        slot
    }

    fn add_dependencies(&mut self, slot: SlotId, name: u32, position: usize, candidate: u32) {
        let world = self.world;
        for (k, dep) in world.deps(candidate).iter().enumerate() {
            let me = (slot, Term::pos(Bits::single(position)));
            let terms = match dep.name {
                Some(m) if m == name && dep.matches.contains(position) => continue,
                Some(m) if m != name && !dep.matches.is_empty() => {
                    let target = self.slot(m);
                    vec![me, (target, Term::neg(dep.matches.clone()))]
                }
                // Nothing can satisfy it (or only another version of itself).
                Some(_) | None => vec![me],
            };
            let cause = Cause::Dependency {
                candidate,
                dep: k as u32,
            };
            self.add_incompat(terms, cause);
        }
    }

    /// Walks the chosen graph from the root: dependencies first, root last.
    fn finish(&self) -> Found {
        #[derive(Clone, Copy)]
        enum Visit {
            New,
            Open,
            Done,
        }
        let world = self.world;
        let chosen = |n: u32| -> Option<u32> {
            let slot = *self.slot_of.get(n as usize)?;
            let position = self.slots.get(slot as usize)?.decided?;
            world.at(n, position)
        };
        let mut state = vec![Visit::New; self.slots.len()];
        let state_of = |c: u32| -> usize {
            let (n, _) = world.place[c as usize];
            self.slot_of[n as usize] as usize
        };
        let mut order = Vec::new();
        let mut edges = Vec::new();
        let mut stack: Vec<(u32, usize)> = vec![(self.root, 0)];
        state[state_of(self.root)] = Visit::Open;
        while let Some(&mut (c, ref mut next)) = stack.last_mut() {
            let deps = world.deps(c);
            let Some(dep) = deps.get(*next) else {
                state[state_of(c)] = Visit::Done;
                order.push(c);
                stack.pop();
                continue;
            };
            *next += 1;
            let Some(d) = dep.name.and_then(chosen) else {
                continue;
            };
            // Two requirements on the same name give one edge.
            if !deps[..*next - 1].iter().any(|e| e.name == dep.name) {
                edges.push((c, d));
            }
            match state[state_of(d)] {
                Visit::New => {
                    state[state_of(d)] = Visit::Open;
                    stack.push((d, 0));
                }
                Visit::Open => {
                    let from = stack.iter().position(|(x, _)| *x == d).unwrap_or(0);
                    return Found::Cycle(stack[from..].iter().map(|(x, _)| *x).collect());
                }
                Visit::Done => {}
            }
        }
        Found::Acyclic { order, edges }
    }
}
