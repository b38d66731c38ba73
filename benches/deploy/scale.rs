//! Part 5: one deployment at 1,000, 10,000 and 100,000 resources, in two
//! shapes: one resource of N replicas, and a 100-deep chain of resources of
//! N / 100 replicas each. Each size
//! is deployed and destroyed; the line gives both times and the peak RSS of
//! this process (the engine and its database; the provider is a process of
//! its own) over both, above what it held before, so the curve shows whether
//! time and memory per resource stay flat as N grows.
//!
//! `DEPLOY_BENCH=scale` runs it alone; `DEPLOY_BENCH_SCALE=1000,10000` picks
//! the sizes, `DEPLOY_BENCH_SHAPE=replicas` or `chain` one shape.

use super::Bench;

/// The goals (issue 41): each way, and the peak.
const GOAL_SQLITE_S: f64 = 30.0;
const GOAL_POSTGRES_S: f64 = 60.0;
const GOAL_PEAK_MIB: f64 = 500.0;

/// The sizes asked for, or 1k / 10k / 100k.
fn sizes() -> Vec<usize> {
    std::env::var("DEPLOY_BENCH_SCALE")
        .ok()
        .map(|list| {
            list.split(',')
                .map(|n| {
                    n.trim()
                        .parse()
                        .expect("DEPLOY_BENCH_SCALE: sizes, comma-separated")
                })
                .collect()
        })
        .unwrap_or_else(|| vec![1_000, 10_000, 100_000])
}

/// One resource of `n` replicas.
fn replicas(n: usize) -> String {
    format!("resources:\n  r: {{ type: fixture.v1.noop, replicas: {n} }}\n")
}

/// A 100-deep chain of resources of `n / 100` replicas each: every replica
/// of a link waits for all of the link before. (1,000 chains of 100 distinct
/// keys cannot be written: a blueprint is at most 1 MiB and 250,000 YAML
/// nodes, about 15,000 resources; this is the same number of nodes, edges
/// and depth.)
fn chains(n: usize) -> String {
    let mut source = String::from("resources:\n");
    let each = (n / 100).max(1);
    source.push_str(&format!(
        "  l0: {{ type: fixture.v1.noop, replicas: {each} }}\n"
    ));
    for l in 1..100 {
        source.push_str(&format!(
            "  l{l}: {{ type: fixture.v1.noop, replicas: {each}, depends_on: [l{}] }}\n",
            l - 1
        ));
    }
    source
}

impl Bench {
    pub(super) async fn scale(&self, postgres: bool) {
        let goal_s = if postgres {
            GOAL_POSTGRES_S
        } else {
            GOAL_SQLITE_S
        };
        println!(
            "one deployment of N resources (goal: < {goal_s:.0} s each way at 100,000, peak RSS < {GOAL_PEAK_MIB:.0} MiB):"
        );
        let only = std::env::var("DEPLOY_BENCH_SHAPE").unwrap_or_default();
        for n in sizes() {
            for (name, shape, source) in [
                ("replicas", "one resource of N replicas", replicas(n)),
                (
                    "chain",
                    "a 100-deep chain of N/100 replicas a link",
                    chains(n),
                ),
            ] {
                if only.is_empty() || only == name {
                    self.one_size(n, name, shape, &source).await;
                }
            }
        }
    }

    async fn one_size(&self, n: usize, name: &str, shape: &str, source: &str) {
        let run = self.both_ways(&format!("scale-{n}-{name}"), source).await;
        let (before, peak) = (run.rss_before_kib, run.peak_kib);
        println!(
            "  N = {n:>6}, {shape}: deploy {:>6.2} s ({:>5.0}/s), destroy {:>6.2} s ({:>5.0}/s); peak RSS {:>5.0} MiB, {:>5.0} MiB above the {:.0} MiB before ({:.1} KiB per resource)",
            run.deployed.as_secs_f64(),
            n as f64 / run.deployed.as_secs_f64(),
            run.destroyed.as_secs_f64(),
            n as f64 / run.destroyed.as_secs_f64(),
            peak as f64 / 1024.0,
            peak.saturating_sub(before) as f64 / 1024.0,
            before as f64 / 1024.0,
            peak.saturating_sub(before) as f64 / n as f64,
        );
    }
}
