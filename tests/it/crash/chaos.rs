//! A crash test's run: its knobs and randomness, the deployments it asked
//! for, settling, and the score (the invariants it checks are in
//! `invariants.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::observe::{self, Api, SETTLE_LIMIT, View, Waited, records};
use super::shape::Shape;
use super::world::world;
use crate::support::TestStore;
use crate::support::processes::signal;

/// `CORBEL_CHAOS_SEED`, `CORBEL_CHAOS_KILLS`, `CORBEL_CHAOS_SOAK`.
pub struct Knobs {
    pub seed: u64,
    pub kills: usize,
    /// Count every violation and fail at the end, instead of at the first.
    pub soak: bool,
}

impl Knobs {
    pub fn from_env(default_seed: u64, default_kills: usize) -> Knobs {
        let number = |name: &str| {
            let v = std::env::var(name).ok()?;
            let v = v.trim();
            (!v.is_empty()).then(|| {
                v.parse::<u64>()
                    .unwrap_or_else(|e| panic!("{name}={v}: {e}"))
            })
        };
        Knobs {
            seed: number("CORBEL_CHAOS_SEED").unwrap_or(default_seed),
            kills: number("CORBEL_CHAOS_KILLS").map_or(default_kills, |n| n as usize),
            soak: std::env::var("CORBEL_CHAOS_SOAK").is_ok_and(|v| v.trim() == "1"),
        }
    }
}

/// One way the world and the records disagree. `subject` names what is wrong,
/// so that a problem seen again at a later settle counts once.
pub struct Violation {
    subject: String,
    detail: String,
}

pub fn violation(subject: impl Into<String>, detail: impl Into<String>) -> Violation {
    Violation {
        subject: subject.into(),
        detail: detail.into(),
    }
}

/// A deployment this run made, and where its last request asked it to end.
pub struct Tracked {
    pub id: String,
    pub name: String,
    pub want: Want,
    /// It did not settle once (soak mode): not waited for until it is
    /// terminal again.
    pub wedged: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Want {
    Complete,
    Destroyed,
}

impl Want {
    pub fn state(self) -> &'static str {
        match self {
            Want::Complete => "COMPLETE",
            Want::Destroyed => "DESTROYED",
        }
    }
}

/// A redeploy asked for: what must be replaced, and what ran before.
pub struct Redeploy {
    pub id: String,
    pub name: String,
    pub key: String,
    pub affected: BTreeSet<String>,
    pub before: BTreeMap<String, (i32, u64)>,
}

pub struct Chaos {
    test: &'static str,
    pub knobs: Knobs,
    pub rng: StdRng,
    /// In the environment of every process this run starts (`CHAOS_MARK`).
    pub mark: String,
    pub shape: Shape,
    pub tracked: Vec<Tracked>,
    /// Subjects of the violations counted so far.
    seen: BTreeSet<String>,
    violations: usize,
    /// Faults injected: SIGKILLs of the server, or kills and freezes of the
    /// provider.
    pub kills: usize,
    /// Faults that struck while a request's run was under way: if none did,
    /// the run tested nothing.
    under_way: usize,
    started: Instant,
}

impl Chaos {
    pub fn new(test: &'static str, knobs: Knobs) -> Chaos {
        let mut rng = StdRng::seed_from_u64(knobs.seed);
        let mark = uuid::Uuid::new_v4().to_string();
        let shape = Shape::generate(&mut rng, &mark);
        println!(
            "chaos: {test}: seed={} kills={} soak={} mark={mark}; {}",
            knobs.seed,
            knobs.kills,
            knobs.soak,
            shape.describe()
        );
        Chaos {
            test,
            knobs,
            rng,
            mark,
            shape,
            tracked: Vec::new(),
            seen: BTreeSet::new(),
            violations: 0,
            kills: 0,
            under_way: 0,
            started: Instant::now(),
        }
    }

    /// Deployments asked to be COMPLETE (`all`), or only those still waited for.
    pub fn open(&self, all: bool) -> Vec<usize> {
        (0..self.tracked.len())
            .filter(|i| {
                self.tracked[*i].want == Want::Complete && (all || !self.tracked[*i].wedged)
            })
            .collect()
    }

    /// Counts a fault; `under_way`: it struck while a request's run was.
    pub fn struck(&mut self, under_way: bool) {
        self.kills += 1;
        self.under_way += usize::from(under_way);
    }

    fn summary(&self) -> String {
        format!(
            "chaos: seed={} kills={} violations={} elapsed={:.1}s mid-run={} test={}",
            self.knobs.seed,
            self.kills,
            self.violations,
            self.started.elapsed().as_secs_f64(),
            self.under_way,
            self.test
        )
    }

    /// Counts what is new among `found`. Outside soak mode, anything found
    /// ends the test, with all found at this check.
    pub fn report(&mut self, when: &str, found: Vec<Violation>) {
        let mut new = Vec::new();
        for v in found {
            let line = format!("{}: {}", v.subject, v.detail);
            if self.seen.insert(v.subject) {
                self.violations += 1;
                println!("chaos violation #{} ({when}): {line}", self.violations);
                new.push(line);
            }
        }
        if !new.is_empty() && !self.knobs.soak {
            println!("{}", self.summary());
            panic!(
                "{} violation(s) {when}; CORBEL_CHAOS_SEED={} repeats the choices:\n{}",
                new.len(),
                self.knobs.seed,
                new.join("\n")
            );
        }
    }

    /// Prints the summary line, and fails if anything was found, or if no
    /// fault struck while work was under way.
    pub fn finish(&self) {
        println!("{}", self.summary());
        assert_eq!(self.violations, 0, "{}", self.summary());
        assert!(
            self.knobs.kills == 0 || self.under_way > 0,
            "no fault struck while work was under way: nothing was tested; {}",
            self.summary()
        );
    }

    /// Waits until the world has settled and checks it. Returns the views, or
    /// `None` if it did not settle (a violation).
    pub async fn settle_and_check(
        &mut self,
        api: &Api,
        store: &TestStore,
        provider: &str,
        when: &str,
    ) -> Option<BTreeMap<String, View>> {
        let began = Instant::now();
        let all: Vec<Waited> = self
            .tracked
            .iter()
            .map(|t| Waited {
                id: &t.id,
                name: &t.name,
            })
            .collect();
        let waited: Vec<Waited> = self
            .tracked
            .iter()
            .filter(|t| !t.wedged)
            .map(|t| Waited {
                id: &t.id,
                name: &t.name,
            })
            .collect();
        let settled = observe::settle(api, store, provider, &waited, &all).await;
        let views = match settled {
            Ok(views) => views,
            Err((dump, blocking)) => {
                let mut names = Vec::new();
                for t in self.tracked.iter_mut().filter(|t| blocking.contains(&t.id)) {
                    t.wedged = true;
                    names.push(t.name.clone());
                }
                let subject = if names.is_empty() {
                    format!("settle {when}")
                } else {
                    format!("{} did not settle", names.join(", "))
                };
                let detail = format!("not settled within {}s:\n{dump}", SETTLE_LIMIT.as_secs());
                self.report(when, vec![violation(subject, detail)]);
                return None;
            }
        };
        // Back to terminal: waited for again (a settle with journal entries
        // left would hold it up again, and say so).
        for t in &mut self.tracked {
            t.wedged &= !views.get(&t.id).is_some_and(View::terminal);
        }
        let world = world(&self.mark);
        let mut found = self.check(&views, &world);
        found.extend(leftover_records(store, provider, &views));
        println!(
            "chaos: {when}: settled in {:.1}s; {} marked processes; {} violation(s)",
            began.elapsed().as_secs_f64(),
            world.len(),
            found.len()
        );
        if self.knobs.soak {
            // What runs unrecorded would be found again at every settle.
            let recorded = records(&views);
            for p in world.values().filter(|p| !recorded.contains_key(&p.pid)) {
                signal(p.pid, libc::SIGKILL);
            }
        }
        self.report(when, found);
        Some(views)
    }
}

/// The process provider keeps a record per resource it holds
/// (`<state>/resources/<id>.json`): settled, it holds no more than the
/// nodes Corbel has not destroyed. More is a record a destroy cut short
/// left behind, which would grow with every crash.
fn leftover_records(
    store: &TestStore,
    provider: &str,
    views: &BTreeMap<String, View>,
) -> Vec<Violation> {
    let dir = store
        .data_dir()
        .join("providers")
        .join(provider)
        .join("state")
        .join("resources");
    let records = std::fs::read_dir(&dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
            .count()
    });
    let holding = views
        .values()
        .flat_map(|v| &v.nodes)
        .filter(|n| n.state != "DESTROYED")
        .count();
    match records > holding {
        true => vec![violation(
            format!("the provider keeps {records} records"),
            format!(
                "for {holding} resources Corbel has not destroyed ({})",
                dir.display()
            ),
        )],
        false => Vec::new(),
    }
}
