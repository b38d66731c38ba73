//! Placement figures (a benchmark, not a test: it prints, and checks only that each plan
//! is the one it should be in size).
//!
//! 10,000 seeded pseudo-random nodes (capacity 0..=50, count 0..=20, usage 0..1, rate
//! 0.001..0.011), 100,000 replicas with each strategy, median of several runs. FILL and
//! EACH take a per-node N, so they run on the nodes that can satisfy it (what a caller
//! that drops unfit nodes would pass) with N picked for a total near 100,000: EACH adds
//! 10 on each node with capacity >= 10, FILL tops up to 25 the nodes with
//! count + capacity >= 25. A last line plans 10^12 replicas on nodes of capacity 10^9,
//! to show the cost does not grow with the replica count.
//!
//! Run with `cargo bench --profile dist --bench placement`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use corbel::deploy::strategy::{NodeInput, Plan, Strategy, plan, raw_capacity};

const NODES: usize = 10_000;
const REPLICAS: i64 = 100_000;
const RUNS: usize = 15;

/// xorshift64*: enough randomness for a fixture, and the same fixture on every run.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn nodes() -> Vec<NodeInput> {
    let mut rng = XorShift(0x5EED_C0DE_1234_5678);
    (0..NODES)
        .map(|i| {
            let capacity = rng.below(51) as i64;
            let count = rng.below(21) as i64;
            let usage = rng.unit();
            let rate = 0.001 + rng.unit() * 0.01;
            NodeInput::new(format!("node-{i:05}"), capacity, count).with_usage(usage, rate)
        })
        .collect()
}

/// Median, min and max wall time of `RUNS` calls, and the last result.
fn time<T>(mut f: impl FnMut() -> T) -> (Duration, Duration, Duration, T) {
    let mut last = f(); // warm-up
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = Instant::now();
        last = black_box(f());
        times.push(start.elapsed());
    }
    times.sort_unstable();
    (times[RUNS / 2], times[0], times[RUNS - 1], last)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn report(label: &str, nodes: &[NodeInput], strategy: Strategy, need: i64, expect: i64) {
    let (median, min, max, result) = time(|| plan(strategy, black_box(nodes), black_box(need)));
    let placed: Plan = match result {
        Ok(p) => p,
        Err(e) => panic!("{label}: {e}"),
    };
    assert_eq!(placed.total, expect, "{label}: wrong total");
    println!(
        "{label:<40} nodes {:>6}  placed {:>13} on {:>6} nodes  median {:>7.3} ms  (min {:.3}, max {:.3})",
        nodes.len(),
        placed.total,
        placed.placements.len(),
        ms(median),
        ms(min),
        ms(max),
    );
}

fn main() {
    let all = nodes();
    let capacity: i64 = all.iter().map(|n| n.capacity).sum();
    println!(
        "corbel placement benchmark: {NODES} nodes, {capacity} spare capacity, median of {RUNS} runs"
    );

    report("AUTO 100000", &all, Strategy::Auto, REPLICAS, REPLICAS);
    report("GLOBAL 100000", &all, Strategy::Global, REPLICAS, REPLICAS);
    report(
        "DRAINED 100000",
        &all,
        Strategy::Drained,
        REPLICAS,
        REPLICAS,
    );

    let each_n = 10;
    let each_nodes: Vec<NodeInput> = all
        .iter()
        .filter(|n| n.capacity >= each_n)
        .cloned()
        .collect();
    let each_total = each_n * each_nodes.len() as i64;
    report(
        "EACH 10 (nodes with capacity >= 10)",
        &each_nodes,
        Strategy::Each,
        each_n,
        each_total,
    );

    let fill_n = 25;
    let fill_nodes: Vec<NodeInput> = all
        .iter()
        .filter(|n| n.count + n.capacity >= fill_n)
        .cloned()
        .collect();
    let fill_total = fill_nodes.iter().map(|n| (fill_n - n.count).max(0)).sum();
    report(
        "FILL 25 (nodes that can reach 25)",
        &fill_nodes,
        Strategy::Fill,
        fill_n,
        fill_total,
    );

    let (median, min, max, caps) = time(|| raw_capacity(black_box(&all)));
    assert_eq!(caps.len(), NODES);
    println!(
        "{:<40} nodes {:>6}  median {:>7.3} ms  (min {:.3}, max {:.3})",
        "raw_capacity",
        all.len(),
        ms(median),
        ms(min),
        ms(max),
    );

    let huge: Vec<NodeInput> = all
        .iter()
        .map(|n| NodeInput {
            capacity: 1_000_000_000,
            ..n.clone()
        })
        .collect();
    for strategy in [Strategy::Auto, Strategy::Global] {
        let label = format!("{strategy} 10^12 (capacity 10^9 each)");
        report(
            &label,
            &huge,
            strategy,
            1_000_000_000_000,
            1_000_000_000_000,
        );
    }
}
