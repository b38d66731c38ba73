//! `/healthz` latency while the abusive requests of issue 11 run (a benchmark,
//! not a test: it prints, it does not assert).
//!
//! Starts the real `corbel serve` binary (release, as `cargo bench` builds it)
//! on a fresh data dir, measures `/healthz` latency (p50, p99, max) alone, then
//! while attackers without a token send, back to back over several
//! connections:
//!
//! 1. the 26-level doubling-fragment query (1 KB, 2^26 fields once expanded);
//! 2. one 988 KB batch of 13,000 introspections;
//! 3. the most the anonymous limits let through: batches of 5 introspections;
//!
//! and reports the server's peak RSS (VmHWM) at the end.
//!
//! Run with `cargo bench --profile dist --bench abuse`. `CORBEL_BIN` names another server
//! binary to measure (e.g. `target/release/corbel` from a debug-built bench:
//! `CORBEL_BIN=target/release/corbel cargo test --bench abuse`).

#[path = "../tests/it/support/attacks.rs"]
mod attacks;
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use attacks::{INTROSPECTION, doubling_fragments};

const PHASE: Duration = Duration::from_secs(10);
const ATTACKERS: usize = 4;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let bin =
        std::env::var("CORBEL_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_corbel").to_owned());
    let server = common::serve(bin, dir.path(), |command| {
        command.args(["--log-filter", "warn,corbel=info"]);
    });
    println!(
        "corbel abuse benchmark ({} cores), {ATTACKERS} attackers, {} s a phase",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        PHASE.as_secs()
    );
    runtime.block_on(run(&format!("http://{}", server.addr)));
    println!(
        "server peak RSS (VmHWM):              {:>8.1} MiB",
        server.status_kib("VmHWM:") as f64 / 1024.0
    );
    server.stop();
}

async fn run(base: &str) {
    let client = reqwest::Client::new();
    while client.get(format!("{base}/readyz")).send().await.is_err() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let health = format!("{base}/healthz");
    let graphql = format!("{base}/graphql");

    let idle = probe(&health, PHASE / 2, Arc::new(AtomicBool::new(false))).await;
    report("healthz, idle", &idle, None);

    let doubling = json!({"query": doubling_fragments(26)}).to_string();
    attack(
        &health,
        &graphql,
        "healthz, doubling fragments x26",
        doubling,
    )
    .await;

    let introspection = json!({"query": INTROSPECTION});
    let short = json!({"query": "{ __schema { types { name fields { name type { name } } } } }"});
    let big_batch = json!(vec![short; 13_000]).to_string();
    println!(
        "  (the batch of 13,000 introspections is {} KB)",
        big_batch.len() / 1000
    );
    attack(
        &health,
        &graphql,
        "healthz, 13,000-introspection batch",
        big_batch,
    )
    .await;

    let allowed = json!(vec![introspection; 5]).to_string();
    attack(
        &health,
        &graphql,
        "healthz, 5-introspection batches",
        allowed,
    )
    .await;
}

/// Runs `ATTACKERS` loops posting `body` while probing `/healthz`.
async fn attack(health: &str, graphql: &str, name: &str, body: String) {
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let statuses = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
    let mut attackers = Vec::new();
    for _ in 0..ATTACKERS {
        let (stop, sent, statuses) = (stop.clone(), sent.clone(), statuses.clone());
        let (graphql, body) = (graphql.to_owned(), body.clone());
        attackers.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            while !stop.load(Ordering::Relaxed) {
                let reply = client
                    .post(&graphql)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await;
                let label = match reply {
                    Ok(reply) => {
                        let status = reply.status().as_u16();
                        let text = reply.text().await.unwrap_or_default();
                        let code = text
                            .split("\"code\":\"")
                            .nth(1)
                            .and_then(|rest| rest.split('"').next())
                            .unwrap_or("ok")
                            .to_owned();
                        format!("{status} {code}")
                    }
                    Err(_) => "transport error".to_owned(),
                };
                *statuses.lock().unwrap().entry(label).or_insert(0usize) += 1;
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let latencies = probe(health, PHASE, stop.clone()).await;
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        let _ = a.await;
    }
    report(name, &latencies, Some(sent.load(Ordering::Relaxed)));
    println!("  answers: {:?}", statuses.lock().unwrap());
}

/// `/healthz` latencies, one request after another over one keep-alive
/// connection, for `how_long`; then sets `done`.
async fn probe(url: &str, how_long: Duration, done: Arc<AtomicBool>) -> Vec<Duration> {
    let client = reqwest::Client::new();
    let mut latencies = Vec::new();
    let until = Instant::now() + how_long;
    while Instant::now() < until {
        let asked = Instant::now();
        let reply = client.get(url).send().await.expect("healthz answers");
        assert!(reply.status().is_success());
        reply.bytes().await.expect("body");
        latencies.push(asked.elapsed());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    done.store(true, Ordering::Relaxed);
    latencies
}

fn report(name: &str, latencies: &[Duration], attacks: Option<usize>) {
    let mut sorted = latencies.to_vec();
    sorted.sort_unstable();
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q) as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<38} p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms  ({} probes{})",
        ms(at(0.5)),
        ms(at(0.99)),
        ms(*sorted.last().unwrap()),
        sorted.len(),
        attacks.map_or(String::new(), |n| format!(", {n} attacks answered"))
    );
}
