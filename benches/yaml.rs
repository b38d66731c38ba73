//! The bounded YAML read (`corbel::yaml`): how long refusing each hostile
//! document takes, what the check costs on an ordinary manifest, and, as a
//! yardstick, what serde_yaml_ng alone spends on nested brackets.
//!
//! Run with `cargo bench --profile dist --bench yaml`. It prints figures and asserts nothing
//! about time.

use std::time::{Duration, Instant};

use corbel::yaml;

/// Best of `runs` runs of `f`.
fn best(runs: usize, mut f: impl FnMut()) -> Duration {
    (0..runs)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn main() {
    let big = "x".repeat(100 * 1024);
    let bomb = format!(
        "name: bomb\nversion: 1.0.0\nresources: {{}}\npadding: &big \"{big}\"\nbomb: [{}]\n",
        vec!["*big"; 3000].join(", ")
    );
    let nested = "[".repeat(200_000);
    let mut manifest = String::from(
        "name: web\nversion: 1.2.3\nrequirements:\n  core: {from_version: 1.0.0, to_version: 2.0.0}\nresources:\n",
    );
    for i in 0u32..50 {
        manifest.push_str(&format!(
            "  r{i}:\n    type: process.v1.service\n    depends_on: [r{}]\n    config:\n      command: [\"/bin/run\", \"--port\", \"{}\"]\n      env: {{A: \"1\", B: two}}\n",
            i.saturating_sub(1),
            8000 + i
        ));
    }

    for (what, text) in [
        ("alias bomb (300 KB, 300 MB expanded)", &bomb),
        ("200 KB of nested `[`", &nested),
    ] {
        let took = best(20, || {
            assert!(yaml::check(text, "bench", &yaml::LIMITS).is_err());
        });
        println!("refused {what}: {took:?}");
    }
    let took = best(50, || {
        yaml::check(&manifest, "bench", &yaml::LIMITS).unwrap()
    });
    println!(
        "check of a {} byte manifest (50 resources): {took:?}",
        manifest.len()
    );
    let took = best(50, || {
        let _: serde_json::Value = serde_yaml_ng::from_str(&manifest).unwrap();
    });
    println!("serde_yaml_ng alone on it: {took:?}");
    for depth in [5_000, 20_000] {
        let text = "[".repeat(depth);
        let took = best(1, || {
            assert!(serde_yaml_ng::from_str::<serde_json::Value>(&text).is_err());
        });
        println!("serde_yaml_ng alone on {depth} nested `[` (unchecked): {took:?}");
    }
}
