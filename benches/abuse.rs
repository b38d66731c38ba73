//! `/healthz` latency and the server's memory while the abusive requests of
//! issues 11 and 38 run (a benchmark, not a test: it prints each figure beside
//! its goal, it does not assert).
//!
//! Starts the real `corbel serve` binary (as `cargo bench` builds it) on a
//! fresh data dir, measures `/healthz` latency (p50, p99, max) alone, then in
//! phases of about 10 s while, back to back:
//!
//! 1. attackers without a token post the 26-level doubling-fragment query
//!    (1 KB, 2^26 fields once expanded);
//! 2. … one 962 KB batch of 13,000 introspections;
//! 3. … the most the anonymous limits let through: batches of 5
//!    introspections;
//! 4. anonymous websockets (graphql-transport-ws, no token) flood
//!    introspections;
//! 5. one signed-in socket sends 10,000 `subscribe`s (100 are taken,
//!    `ws_max_subscriptions`), round after round;
//! 6. the 15,000-key blueprint (198 KB) is sent by `createBlueprint` twice at
//!    once, round after round;
//! 7. 300 signed-in sockets (60 from each of five loopback addresses, under
//!    `ws_max_sockets_per_address`) ask for large answers and never read them.
//!
//! Each phase reports `/healthz` p50/p99/max (asked one after another from a
//! thread of its own, so the attackers' client work does not delay it), the
//! server's RSS at the end of the phase minus its RSS before (`VmRSS`), its
//! peak in the phase (`VmHWM`, started again before each phase) minus the
//! same, the server's CPU time in the phase, and a verdict against issue 38's
//! goals: `/healthz` max under 100 ms, RSS growth under 100 MiB.
//!
//! `CORBEL_BENCH_PHASES=ws-never-reading,…` runs only the phases named (see
//! `wanted`). Run with `cargo bench --bench abuse` (the `release` build, opt-level 1: a
//! build of minutes on two cores; the figures in docs/security.md were taken
//! so) or `cargo bench --profile dist --bench abuse` (what is published: fat
//! LTO, twice the build). The server inherits the environment, so
//! `CORBEL_GRAPHQL_WS_SEND_QUEUE_BYTES=…` and the like measure other settings. `CORBEL_BIN` names
//! another server binary to measure (e.g. `target/release/corbel` from a
//! debug-built bench: `CORBEL_BIN=target/release/corbel cargo test --bench
//! abuse`).

#[path = "../tests/it/support/attacks.rs"]
mod attacks;
mod common;
#[path = "abuse/sockets.rs"]
mod sockets;
#[path = "../tests/it/support/websocket.rs"]
#[allow(dead_code)] // the bench uses part of the tests' websocket clients
mod websocket;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use attacks::{INTROSPECTION, doubling_fragments, unknown_keys};
use common::Server;

const PHASE: Duration = Duration::from_secs(10);
const ATTACKERS: usize = 4;
/// The server's admin token (`CORBEL_ADMIN_TOKEN`), named so for `websocket`.
const ADMIN_TOKEN: &str = "cbl_bench_admin_token_0123456789abcdef";
/// Issue 38's goals for every phase.
const HEALTHZ_GOAL: Duration = Duration::from_millis(100);
const RSS_GOAL_MIB: f64 = 100.0;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let bin =
        std::env::var("CORBEL_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_corbel").to_owned());
    let server = common::serve(bin, dir.path(), |command| {
        command
            .args(["--log-filter", "warn,corbel=info"])
            .env("CORBEL_ADMIN_TOKEN", ADMIN_TOKEN);
    });
    common::profile::announce("abuse");
    println!(
        "{ATTACKERS} HTTP attackers, {} s a phase; load average {}",
        PHASE.as_secs(),
        common::load()
    );
    runtime.block_on(run(&server));
    println!(
        "server peak RSS (VmHWM) of the last phase: {:>8.1} MiB; load average {}",
        server.status_kib("VmHWM:") as f64 / 1024.0,
        common::load()
    );
    server.stop();
}

async fn run(server: &Server) {
    let base = format!("http://{}", server.addr);
    let client = reqwest::Client::new();
    while client.get(format!("{base}/readyz")).send().await.is_err() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let graphql = format!("{base}/graphql");

    if wanted("idle") {
        let idle = Watch::start(server);
        tokio::time::sleep(PHASE / 2).await;
        idle.finish("healthz, idle", "");
    }

    if wanted("doubling") {
        let doubling = json!({"query": doubling_fragments(26)}).to_string();
        attack(server, &graphql, "doubling fragments x26", doubling).await;
    }

    if wanted("big-batch") {
        let short =
            json!({"query": "{ __schema { types { name fields { name type { name } } } } }"});
        let big_batch = json!(vec![short; 13_000]).to_string();
        println!(
            "  (the batch of 13,000 introspections is {} KB)",
            big_batch.len() / 1000
        );
        attack(server, &graphql, "13,000-introspection batch", big_batch).await;
    }

    if wanted("batches") {
        let allowed = json!(vec![json!({"query": INTROSPECTION}); 5]).to_string();
        attack(server, &graphql, "5-introspection batches", allowed).await;
    }

    if wanted("ws-flood") {
        sockets::anonymous_flood(server).await;
    }
    if wanted("ws-subscriptions") {
        sockets::many_subscriptions(server).await;
    }
    if wanted("blueprints") {
        blueprints(server, &graphql).await;
    }
    // Last: what the sockets leave behind is the next phase's start.
    if wanted("ws-never-reading") {
        sockets::never_reading(server).await;
    }
}

/// Whether `CORBEL_BENCH_PHASES` (a comma-separated list of `idle`,
/// `doubling`, `big-batch`, `batches`, `ws-flood`, `ws-subscriptions`,
/// `blueprints`, `ws-never-reading`) names `phase`; unset, every phase runs.
fn wanted(phase: &str) -> bool {
    std::env::var("CORBEL_BENCH_PHASES")
        .map_or(true, |phases| phases.split(',').any(|p| p.trim() == phase))
}

/// Runs `ATTACKERS` loops posting `body` for a phase.
async fn attack(server: &Server, graphql: &str, name: &str, body: String) {
    let watch = Watch::start(server);
    let answers = Answers::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut attackers = Vec::new();
    for _ in 0..ATTACKERS {
        let (stop, answers) = (stop.clone(), answers.clone());
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
                answers.note(reply).await;
            }
        }));
    }
    tokio::time::sleep(PHASE).await;
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        let _ = a.await;
    }
    watch.finish(name, &answers.summary());
}

/// Two loops posting the 15,000-key blueprint as the admin, for a phase.
async fn blueprints(server: &Server, graphql: &str) {
    let create =
        "mutation($input: CreateBlueprintInput!) { createBlueprint(input: $input) { id } }";
    let source = unknown_keys();
    println!(
        "  (the blueprint of 15,000 unknown keys is {} KB)",
        source.len() / 1000
    );
    sockets::settle().await;
    let watch = Watch::start(server);
    let answers = Answers::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut attackers = Vec::new();
    for i in 0..2 {
        let (stop, answers) = (stop.clone(), answers.clone());
        let graphql = graphql.to_owned();
        let input = json!({"input": {"name": format!("keys-{i}"), "source": source}});
        let body = json!({"query": create, "variables": input});
        attackers.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            while !stop.load(Ordering::Relaxed) {
                let sent = client.post(&graphql).bearer_auth(ADMIN_TOKEN).json(&body);
                answers.note(sent.send().await).await;
            }
        }));
    }
    tokio::time::sleep(PHASE).await;
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        let _ = a.await;
    }
    watch.finish("15,000-key blueprint, twice at once", &answers.summary());
}

/// How the attacks were answered: HTTP status and error code, counted.
#[derive(Clone, Default)]
pub struct Answers(Arc<Mutex<BTreeMap<String, usize>>>);

impl Answers {
    pub fn count(&self, label: impl Into<String>) {
        *self.0.lock().unwrap().entry(label.into()).or_insert(0) += 1;
    }

    async fn note(&self, reply: reqwest::Result<reqwest::Response>) {
        let label = match reply {
            Ok(reply) => {
                let status = reply.status().as_u16();
                let text = reply.text().await.unwrap_or_default();
                format!("{status} {}", code_of(&text))
            }
            Err(_) => "transport error".to_owned(),
        };
        self.count(label);
    }

    pub fn summary(&self) -> String {
        format!("answers: {:?}", self.0.lock().unwrap())
    }
}

/// The first `extensions.code` in a GraphQL answer's text, or `ok`.
pub fn code_of(text: &str) -> &str {
    text.split("\"code\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or("ok")
}

/// What one phase measures of the server: `/healthz` latencies asked one
/// after another (5 ms apart) from a thread and runtime of their own, the
/// RSS before, and the CPU time before.
pub struct Watch<'a> {
    server: &'a Server,
    rss_before: u64,
    cpu_before: f64,
    started: Instant,
    stop: Arc<AtomicBool>,
    probes: std::thread::JoinHandle<Vec<(Duration, Duration)>>,
}

impl<'a> Watch<'a> {
    pub fn start(server: &'a Server) -> Watch<'a> {
        server.reset_peak();
        let rss_before = server.status_kib("VmRSS:");
        let cpu_before = server.cpu_seconds();
        let stop = Arc::new(AtomicBool::new(false));
        let url = format!("http://{}/healthz", server.addr);
        let done = stop.clone();
        let probes = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(probe(&url, &done))
        });
        Watch {
            server,
            rss_before,
            cpu_before,
            started: Instant::now(),
            stop,
            probes,
        }
    }

    /// Stops the probe, prints the phase's figures and its verdict.
    pub fn finish(self, name: &str, what: &str) {
        let rss_after = self.server.status_kib("VmRSS:");
        let peak = self.server.status_kib("VmHWM:");
        let cpu = self.server.cpu_seconds() - self.cpu_before;
        let took = self.started.elapsed();
        self.stop.store(true, Ordering::Relaxed);
        let probes = self.probes.join().expect("the probe");
        // When the slowest was asked, from the phase's start: a burst at the
        // start (sockets opening) or work that lasts.
        let slowest_at = probes
            .iter()
            .max_by_key(|(_, latency)| *latency)
            .map(|(at, _)| *at)
            .unwrap_or_default();
        let mut latencies: Vec<Duration> = probes.into_iter().map(|(_, latency)| latency).collect();
        latencies.sort_unstable();
        let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
        let max = *latencies.last().expect("a probe");
        let mib = |kib: u64| kib as f64 / 1024.0;
        let grown = mib(rss_after) - mib(self.rss_before);
        let peak_grown = mib(peak) - mib(self.rss_before);
        println!(
            "{name:<38} p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms at {:.1} s  ({} probes, {:.1} s)",
            ms(at(0.5)),
            ms(at(0.99)),
            ms(max),
            slowest_at.as_secs_f64(),
            latencies.len(),
            took.as_secs_f64()
        );
        if !what.is_empty() {
            println!("  {what}");
        }
        println!(
            "  RSS {:.1} → {:.1} MiB ({grown:+.1} MiB), peak {:.1} MiB ({peak_grown:+.1} MiB); \
             server CPU {cpu:.2} s ({:.0} % of a core)",
            mib(self.rss_before),
            mib(rss_after),
            mib(peak),
            cpu / took.as_secs_f64() * 100.0
        );
        let mark = |met: bool| if met { "met" } else { "NOT MET" };
        println!(
            "  verdict: /healthz max {:.1} ms < 100 ms {}; RSS growth {grown:+.1} MiB < 100 MiB {}; \
             peak {peak_grown:+.1} MiB < 100 MiB {}",
            ms(max),
            mark(max < HEALTHZ_GOAL),
            mark(grown < RSS_GOAL_MIB),
            mark(peak_grown < RSS_GOAL_MIB)
        );
    }
}

/// `/healthz` latencies and when each was asked, one request after another over one keep-alive
/// connection, until `done`.
async fn probe(url: &str, done: &AtomicBool) -> Vec<(Duration, Duration)> {
    let client = reqwest::Client::new();
    let mut latencies = Vec::new();
    let started = Instant::now();
    while !done.load(Ordering::Relaxed) || latencies.is_empty() {
        let asked = Instant::now();
        let reply = client.get(url).send().await.expect("healthz answers");
        assert!(reply.status().is_success());
        reply.bytes().await.expect("body");
        latencies.push((asked - started, asked.elapsed()));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    latencies
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
