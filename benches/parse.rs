//! Parse time against size, for each kind of document Corbel reads from
//! outside: a blueprint (`createBlueprint`'s parse and check, problems placed
//! on their lines), an element manifest (read, checked, its `resources` read
//! as a blueprint, as an install does), and a repository inventory (read as a
//! stream). Each in its worst shapes, at 10 KB, 100 KB, 1 MB and 4 MB; the
//! last column is the time ratio to the size before over the size ratio, near
//! 1 when the cost is linear (a quadratic path shows as about 10). Anything
//! refused says so (a blueprint is at most 1 MiB, a YAML document 250,000
//! nodes).
//!
//! Run with `cargo bench --profile release --bench parse`. In-process, no
//! server, no child process; it asserts nothing about time.

use std::time::{Duration, Instant};

use corbel::deploy::blueprint;
use corbel::repository::{inventory, manifest};

const SIZES: [usize; 4] = [10_000, 100_000, 1_000_000, 4_000_000];

/// `head`, then `item(i)` for i = 0.. until the text reaches `size`, then `tail`.
fn grow(size: usize, head: &str, tail: &str, item: impl Fn(usize) -> String) -> String {
    let mut text = head.to_owned();
    let mut i = 0;
    while text.len() + tail.len() < size {
        text.push_str(&item(i));
        i += 1;
    }
    text.push_str(tail);
    text
}

/// Best of `runs` runs of `f`, with what the last run answered.
fn best(runs: usize, mut f: impl FnMut() -> String) -> (Duration, String) {
    let mut outcome = String::new();
    let took = (0..runs)
        .map(|_| {
            let started = Instant::now();
            outcome = f();
            started.elapsed()
        })
        .min()
        .unwrap_or_default();
    (took, outcome)
}

fn blueprint_outcome(source: &str) -> String {
    match corbel::deploy::parse_checked(source) {
        Ok(bp) => format!("ok, {} resources", bp.resources.len()),
        Err(e) => {
            let text = e.to_string();
            let cut: String = text.chars().take(60).collect();
            format!("refused: {cut}")
        }
    }
}

fn manifest_outcome(text: &str) -> String {
    let parsed = manifest::parse_yaml(text, 16 << 20, "bench.yaml")
        .map_err(|e| e.to_string())
        .and_then(|m| {
            let resources = &m.document["resources"];
            blueprint::parse_resources(resources)
                .map(|bp| format!("ok, {} resources", bp.resources.len()))
                .map_err(|p| p.to_string())
        });
    parsed.unwrap_or_else(|e| format!("refused: {}", e.chars().take(60).collect::<String>()))
}

fn inventory_outcome(text: &str) -> String {
    let mut bad = 0;
    match inventory::parse(text.as_bytes(), |entry| {
        bad += usize::from(entry.is_err());
        Ok(())
    }) {
        Ok(count) => format!("ok, {count} entries, {bad} invalid"),
        Err(e) => format!("refused: {e}"),
    }
}

type Shape = (&'static str, fn(usize) -> String, fn(&str) -> String);

fn shapes() -> Vec<Shape> {
    vec![
        (
            "blueprint: unknown top-level keys",
            |size| {
                grow(size, "version: \"1\"\nresources: {}\n", "", |i| {
                    format!("k{i:06}: {i}\n")
                })
            },
            blueprint_outcome,
        ),
        (
            "blueprint: a chain, each to the first's outputs",
            |size| {
                grow(size, "resources:\n  r0: {type: t}\n", "", |i| {
                    let i = i + 1;
                    format!(
                        "  r{i}: {{type: t, depends_on: [r{}], config: {{a: \"{{{{ resources.r0.outputs.x }}}}\"}}}}\n",
                        i - 1
                    )
                })
            },
            blueprint_outcome,
        ),
        (
            "blueprint: bad resources (a problem each)",
            |size| {
                grow(size, "resources:\n", "", |i| {
                    format!("  r{i}: {{strategy: NOPE, depends_on: [nowhere]}}\n")
                })
            },
            blueprint_outcome,
        ),
        (
            "blueprint: long keys nested deep, many templates",
            |size| {
                let key = "k".repeat(1000);
                let open: String = (0..40).map(|_| format!("{{{key}: ")).collect();
                let head = format!(
                    "variables: {{v: {{type: string}}}}\nresources:\n  a: {{type: t, config: {open}["
                );
                let tail = format!("\"{{{{ nope }}}}\"]{}}}\n", "}".repeat(40));
                grow(size, &head, &tail, |i| format!("\"{{{{ v }}}}-{i}\", "))
            },
            blueprint_outcome,
        ),
        (
            "blueprint: anchors and aliases",
            |size| {
                grow(
                    size,
                    "variables:\n  v0: &a {type: string, default: x}\nresources: {}\n",
                    "",
                    |i| format!("  v{}: *a\n", i + 1),
                )
                .replacen("resources: {}\n", "", 1)
                    + "resources: {}\n"
            },
            blueprint_outcome,
        ),
        (
            "manifest: resources",
            |size| {
                grow(size, "name: web\nversion: 1.0.0\nresources:\n", "", |i| {
                    format!(
                        "  r{i}:\n    type: process.v1.service\n    depends_on: [r{}]\n    config: {{command: \"/usr/bin/serve --port {} --name resource-{i} --verbose\"}}\n",
                        i.saturating_sub(1),
                        8000 + i % 1000
                    )
                })
            },
            manifest_outcome,
        ),
        (
            "manifest: requirements",
            |size| {
                grow(
                    size,
                    "name: web\nversion: 1.0.0\nresources: {}\nrequirements:\n",
                    "",
                    |i| format!("  dep-{i}: {{from_version: 1.0.0, to_version: 2.0.0}}\n"),
                )
            },
            manifest_outcome,
        ),
        (
            "inventory: elements",
            |size| {
                let digest = "ab".repeat(32);
                grow(size, "{\"elements\": {", "}}", |i| {
                    format!(
                        "{}\"e{i}\": {{\"1.0.{i}\": {{\"name\": \"e{i}\", \"version\": \"1.0.{i}\", \"digest\": \"sha256:{digest}\", \"index\": {{\"manifests\": {{\"m{i}\": \"e{i}.yaml\"}}}}}}}}",
                        if i == 0 { "" } else { ", " }
                    )
                })
            },
            inventory_outcome,
        ),
        (
            "inventory: one element of many versions",
            |size| {
                grow(size, "{\"elements\": {\"e\": {", "}}}", |i| {
                    format!(
                        "{}\"1.0.{i}\": {{\"index\": {{\"images\": {{\"i{i}\": \"disk-{i}.qcow2\"}}}}}}",
                        if i == 0 { "" } else { ", " }
                    )
                })
            },
            inventory_outcome,
        ),
    ]
}

fn main() {
    println!(
        "{:<50} {:>9} {:>12} {:>10} {:>7}  outcome",
        "document", "size", "time", "µs/KB", "ratio"
    );
    for (what, make, outcome) in shapes() {
        let mut previous: Option<(usize, Duration)> = None;
        for size in SIZES {
            let text = make(size);
            let runs = if size >= 1_000_000 { 3 } else { 10 };
            let (took, answer) = best(runs, || outcome(&text));
            let per_kb = took.as_secs_f64() * 1e6 / (text.len() as f64 / 1000.0);
            let ratio = previous.map_or("".to_owned(), |(len, t)| {
                let r = (took.as_secs_f64() / t.as_secs_f64()) / (text.len() as f64 / len as f64);
                format!("{r:.2}")
            });
            println!(
                "{what:<50} {:>9} {:>12} {per_kb:>10.1} {ratio:>7}  {answer}",
                text.len(),
                format!("{took:.2?}")
            );
            previous = Some((text.len(), took));
        }
    }
}
