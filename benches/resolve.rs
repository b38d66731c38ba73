//! Resolver benchmark: a seeded synthetic world of 10,000 names × 10 versions
//! whose requirements form a DAG at most 30 deep, resolved from many roots by
//! `corbel::resolve` and, as a yardstick, by the `pubgrub` crate.
//!
//! Run with `cargo bench --profile dist --bench resolve`. It prints figures and asserts
//! nothing about time.

use std::time::{Duration, Instant};

use corbel::resolve::{Candidate, CandidateId, Constraint, Op, Requirement, Version, World};
use pubgrub::{OfflineDependencyProvider, Ranges, SemanticVersion};

const NAMES: usize = 10_000;
const VERSIONS: u64 = 10;
const LAYERS: usize = 30;
/// A name depends only on names of the next layer within this window, so
/// closures stay in the hundreds.
const WINDOW: usize = 12;
const MAX_DEPS: u64 = 3;
const ROOTS: usize = 1_000;
const SEED: u64 = 0x5eed_c0de_2024;

/// xorshift64*: tiny, seeded, deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One requirement: the dependency's name index and `>= 1.lo.0, < 1.hi.0`
/// (either bound may be absent).
struct Dep {
    name: usize,
    lo: Option<u64>,
    hi: Option<u64>,
}

fn layer_start(layer: usize) -> usize {
    layer * NAMES / LAYERS
}

fn generate() -> Vec<Vec<Vec<Dep>>> {
    let mut rng = Rng(SEED);
    (0..NAMES)
        .map(|i| {
            let layer = i * LAYERS / NAMES;
            (0..VERSIONS)
                .map(|_| {
                    if layer + 1 >= LAYERS {
                        return Vec::new();
                    }
                    let (start, end) = (layer_start(layer + 1), layer_start(layer + 2));
                    let offset =
                        (i - layer_start(layer)) * (end - start) / (start - layer_start(layer));
                    let mut deps: Vec<Dep> = Vec::new();
                    for _ in 0..rng.below(MAX_DEPS + 1) {
                        let name =
                            start + (offset + rng.below(WINDOW as u64) as usize) % (end - start);
                        if deps.iter().any(|d| d.name == name) {
                            continue;
                        }
                        // Ranges overlap at 1.4.0..1.6.0, so most problems are
                        // solvable, but the newest versions are often excluded.
                        let (lo, hi) = match rng.below(4) {
                            0 => (None, None),
                            1 => (Some(rng.below(5)), None),
                            2 => (None, Some(6 + rng.below(4))),
                            _ => (Some(rng.below(5)), Some(6 + rng.below(4))),
                        };
                        deps.push(Dep { name, lo, hi });
                    }
                    deps
                })
                .collect()
        })
        .collect()
}

fn ours(spec: &[Vec<Vec<Dep>>]) -> World {
    let mut candidates = Vec::with_capacity(NAMES * VERSIONS as usize);
    for (i, versions) in spec.iter().enumerate() {
        for (k, deps) in versions.iter().enumerate() {
            let requirements = deps
                .iter()
                .map(|d| {
                    let mut constraints = Vec::new();
                    if let Some(lo) = d.lo {
                        constraints.push(Constraint::new(Op::Ge, Version::new(1, lo, 0)));
                    }
                    if let Some(hi) = d.hi {
                        constraints.push(Constraint::new(Op::Lt, Version::new(1, hi, 0)));
                    }
                    Requirement {
                        name: format!("p{}", d.name),
                        constraints,
                    }
                })
                .collect();
            candidates.push(Candidate {
                id: CandidateId((i * VERSIONS as usize + k) as u64),
                name: format!("p{i}"),
                version: Version::new(1, k as u64, 0),
                priority: 0,
                installed: false,
                requirements,
            });
        }
    }
    World::new(candidates)
}

type Provider = OfflineDependencyProvider<u32, Ranges<SemanticVersion>>;

fn theirs(spec: &[Vec<Vec<Dep>>]) -> Provider {
    let mut provider = Provider::new();
    for (i, versions) in spec.iter().enumerate() {
        for (k, deps) in versions.iter().enumerate() {
            let deps = deps.iter().map(|d| {
                let lo = d.lo.map_or_else(Ranges::full, |lo| {
                    Ranges::higher_than(SemanticVersion::new(1, lo as u32, 0))
                });
                let hi = d.hi.map_or_else(Ranges::full, |hi| {
                    Ranges::strictly_lower_than(SemanticVersion::new(1, hi as u32, 0))
                });
                (d.name as u32, lo.intersection(&hi))
            });
            provider.add_dependencies(i as u32, SemanticVersion::new(1, k as u32, 0), deps);
        }
    }
    provider
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let t = Instant::now();
    let spec = generate();
    let world = ours(&spec);
    let provider = theirs(&spec);
    println!(
        "world: {NAMES} names x {VERSIONS} versions, {LAYERS} layers, built in {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );

    // Roots from the first layers, so closures reach deep.
    let mut rng = Rng(SEED ^ 0xabcdef);
    let roots: Vec<(usize, u64)> = (0..ROOTS)
        .map(|_| {
            let name = rng.below(layer_start(3) as u64) as usize;
            (name, rng.below(VERSIONS))
        })
        .collect();

    let mut our_times = Vec::new();
    let mut sizes = Vec::new();
    let mut small_times = Vec::new();
    // (closure size, our time, their time) per solvable root.
    let mut by_size: Vec<(usize, Duration, Duration)> = Vec::new();
    let mut their_times = Vec::new();
    let (mut our_ok, mut their_ok, mut disagree) = (0, 0, 0);
    for &(name, k) in &roots {
        let id = CandidateId(name as u64 * VERSIONS + k);
        let start = Instant::now();
        let result = world.resolve(id);
        let elapsed = start.elapsed();
        our_times.push(elapsed);
        if let Ok(r) = &result {
            our_ok += 1;
            sizes.push(r.order.len());
            if r.order.len() <= 500 {
                small_times.push(elapsed);
            }
        }

        let start = Instant::now();
        let solution =
            pubgrub::resolve(&provider, name as u32, SemanticVersion::new(1, k as u32, 0));
        let their_elapsed = start.elapsed();
        their_times.push(their_elapsed);
        if let Ok(r) = &result {
            by_size.push((r.order.len(), elapsed, their_elapsed));
        }
        if solution.is_ok() {
            their_ok += 1;
        }
        if solution.is_ok() != result.is_ok() {
            disagree += 1;
        }
    }
    our_times.sort();
    their_times.sort();
    small_times.sort();
    sizes.sort();

    let ours_median = percentile(&our_times, 0.5);
    let theirs_median = percentile(&their_times, 0.5);
    println!(
        "roots: {ROOTS}; solvable: corbel {our_ok}, pubgrub {their_ok}; verdicts differ: {disagree}"
    );
    println!(
        "closure size: median {}, max {}",
        sizes.get(sizes.len() / 2).copied().unwrap_or(0),
        sizes.last().copied().unwrap_or(0)
    );
    println!(
        "corbel:  median {:8.1} µs, p95 {:8.1} µs, max {:8.1} µs; closures <= 500: median {:.1} µs",
        micros(ours_median),
        micros(percentile(&our_times, 0.95)),
        micros(percentile(&our_times, 1.0)),
        micros(percentile(&small_times, 0.5)),
    );
    println!(
        "pubgrub: median {:8.1} µs, p95 {:8.1} µs, max {:8.1} µs",
        micros(theirs_median),
        micros(percentile(&their_times, 0.95)),
        micros(percentile(&their_times, 1.0)),
    );
    for (lo, hi) in [
        (0, 100),
        (101, 250),
        (251, 500),
        (501, 1000),
        (1001, usize::MAX),
    ] {
        let mut ours: Vec<Duration> = Vec::new();
        let mut theirs: Vec<Duration> = Vec::new();
        for &(size, a, b) in &by_size {
            if (lo..=hi).contains(&size) {
                ours.push(a);
                theirs.push(b);
            }
        }
        ours.sort();
        theirs.sort();
        println!(
            "  closures {lo:>4}..{:<5}: {:4} roots, corbel median {:8.1} µs, pubgrub median {:8.1} µs",
            if hi == usize::MAX {
                "".to_string()
            } else {
                hi.to_string()
            },
            ours.len(),
            micros(percentile(&ours, 0.5)),
            micros(percentile(&theirs, 0.5)),
        );
    }
    println!(
        "ratio corbel/pubgrub (medians): {:.2}",
        ours_median.as_secs_f64() / theirs_median.as_secs_f64().max(1e-12)
    );
}
