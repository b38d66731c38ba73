//! Versions, constraints and dependency resolution: pure code, no IO.
//!
//! This module owns the rules for choosing what an install brings in:
//!
//! - [`Version`]: `MAJOR.MINOR.PATCH[-suffix][+build]`, ordered by SemVer precedence;
//! - [`Requirement`]: a manifest's constraints on one dependency;
//! - [`World`]: every candidate of every repository, indexed once;
//!   [`World::resolve`] picks one version per name for a root's install closure
//!   and returns it in install order, or says why that is impossible.
//!
//! Architecture invariants: no IO, no serde (callers convert manifests by hand),
//! no recursion whose depth follows the input (dependency chains may be
//! thousands deep), no panics on any input.
//!
//! Error policy: every failure is a [`ResolveError`] whose [`ResolveError::code`]
//! is stable for API clients and whose message is a complete sentence that
//! names what to change.

mod constraint;
mod explain;
mod solver;
mod term;
mod version;
mod world;

#[cfg(test)]
mod tests;

pub use constraint::{Constraint, Op, Requirement};
pub use version::Version;
pub use world::{Candidate, CandidateId, Resolution, World};

use solver::{Found, Solver};

/// Why a version, a requirement or a resolution was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// A version string is malformed.
    #[error("Version `{input}` is invalid: {problem}.")]
    Version { input: String, problem: String },

    /// A manifest's requirement carries a malformed version.
    #[error(
        "Element `{element}` requires `{dependency}` with {key} `{input}`, which is not a valid version: {problem}."
    )]
    RequirementVersion {
        element: String,
        dependency: String,
        key: String,
        input: String,
        problem: String,
    },

    /// A manifest's requirement uses a key that is not a constraint.
    #[error(
        "Element `{element}` declares an unknown key `{key}` in its requirement on `{dependency}`; the accepted keys are from_version, to_version, version, >, >=, <, <= and ==."
    )]
    ConstraintFormat {
        element: String,
        dependency: String,
        key: String,
    },

    /// The root given to [`World::resolve`] is not one of the world's candidates.
    #[error("Cannot resolve candidate {id}: it is not among the known candidates.")]
    UnknownRoot { id: CandidateId },

    /// Some requirement has no matching candidate at all, on every way out.
    #[error("Cannot install {root} because a required element is missing: {}.", .chains.join("; "))]
    NotFound { root: String, chains: Vec<String> },

    /// Each requirement alone can be met, but not all together (possibly
    /// because of installed versions, which cannot be swapped here).
    #[error("Cannot install {root} because no consistent set of versions exists: {}.", .chains.join("; "))]
    Conflict {
        root: String,
        /// Chains of requirements from the root, each ending where it collides.
        chains: Vec<String>,
        /// The installed versions involved, as `name version`.
        installed: Vec<String>,
    },

    /// Every consistent choice has a dependency cycle, so no install order exists.
    #[error(
        "Cannot install {root} because its dependencies form a cycle, so no install order exists: {}.", .cycle.join(" -> ")
    )]
    Cycle {
        root: String,
        /// `name version` of each element on the cycle, the first repeated at the end.
        cycle: Vec<String>,
    },
}

impl ResolveError {
    /// The stable error code for API clients.
    pub fn code(&self) -> &'static str {
        match self {
            ResolveError::Version { .. } | ResolveError::RequirementVersion { .. } => "VERSION",
            ResolveError::ConstraintFormat { .. } => "DEPENDENCY_CONSTRAINT_FORMAT",
            ResolveError::UnknownRoot { .. } | ResolveError::NotFound { .. } => {
                "DEPENDENCY_NOT_FOUND"
            }
            ResolveError::Conflict { .. } => "DEPENDENCY_CONSTRAINT",
            ResolveError::Cycle { .. } => "DEPENDENCY_CYCLE",
        }
    }
}

impl World {
    /// Chooses one candidate per name for the install closure of `root`.
    ///
    /// The root's name is bound to the root. Installed versions are fixed.
    /// When free to choose, a name gets its most preferred candidate
    /// (installed, higher repository priority, release, higher version); the
    /// search backtracks when a choice leads to a conflict and prefers an
    /// acyclic solution, so it fails only when no consistent (acyclic) set
    /// exists.
    pub fn resolve(&self, root: CandidateId) -> Result<Resolution, ResolveError> {
        let Some(&r) = self.by_id.get(&root) else {
            return Err(ResolveError::UnknownRoot { id: root });
        };
        let mut solver = Solver::new(self, r, true);
        let terminal = match solver.solve() {
            Ok(found) => return self.finish(r, found),
            Err(terminal) => terminal,
        };
        if !solver.saw_cycle {
            return Err(explain::explain(&solver, terminal));
        }
        // Ruling out cycles left nothing: is there a solution with a cycle?
        let mut cyclic = Solver::new(self, r, false);
        match cyclic.solve() {
            Ok(found) => self.finish(r, found),
            Err(terminal) => Err(explain::explain(&cyclic, terminal)),
        }
    }

    fn finish(&self, root: u32, found: Found) -> Result<Resolution, ResolveError> {
        let id = |c: u32| self.candidates.get(c as usize).map(|c| c.id);
        match found {
            Found::Acyclic { order, edges } => Ok(Resolution {
                order: order.into_iter().filter_map(id).collect(),
                edges: edges
                    .into_iter()
                    .filter_map(|(a, b)| Some((id(a)?, id(b)?)))
                    .collect(),
            }),
            Found::Cycle(cycle) => Err(explain::cycle(self, root, &cycle)),
        }
    }
}
