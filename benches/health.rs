//! Live health figures (issue 37; a benchmark, not a test: it prints each
//! figure beside its goal, it does not assert).
//!
//! The real `corbel serve` binary, with the process and fixture providers
//! built in the bench's profile and loaded from git. Every HEALTH event is
//! read as it arrives from `deploymentEvents` over the websocket.
//!
//! 1. Detection latency, from the SIGKILL of a workload to its `HEALTH`
//!    `DOWN` event:
//!    - watched: 50 replicas of `sleep` on the process provider (its `watch`),
//!      each killed in turn (goal p95 < 1 s);
//!    - polled: the fixture provider offering protocol version 1 only
//!      (`FIXTURE_PROTOCOL=1`: no watch, so `Inspect` every
//!      `[deploy] health_poll_interval_ms`, 1,000 here). Its resources live
//!      in its memory, so its "workload" is the fixture itself: killed, started
//!      again by the supervisor, its resource found missing at the next poll
//!      and brought back by `restart: always` before the next kill (goal p95 <
//!      1.5 × the interval; the time the fixture took to connect again is shown
//!      beside).
//! 2. 10,000 watched resources (`sleep 3600` × 10,000 on one process
//!    provider, deployed, then the server restarted on the same data with the
//!    default health settings, so its watch opens on all 10,000 at once): the
//!    server's CPU over 30 s while nothing changes (goal < 2 % of one core,
//!    `/proc/<pid>/stat`) and its RSS growth from the provider's connection
//!    through those 30 s (goal < 30 MiB).
//! 3. 1,000 more resources killed at once: the time until every one is DOWN
//!    (goal < 2 s), and `/healthz` latency meanwhile (goal < 100 ms).
//!
//! Run with `cargo bench --profile dist --bench health` (10,000 `sleep`
//! processes: mind `ulimit -u` and `kernel.pid_max`).

mod common;
#[path = "common/events.rs"]
mod events;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use common::api::Api;
use common::{cpu_seconds, load, profile};
use events::follow;

const TOKEN: &str = "cbl_bench_admin_token_0123456789abcdef";
const KILLS: usize = 50;
const POLL_MS: u64 = 1_000;
const MANY: usize = 10_000;
const AT_ONCE: usize = 1_000;
const IDLE: Duration = Duration::from_secs(30);

fn main() {
    let bins = profile::build(&[
        "-p",
        "corbel-provider-process",
        "-p",
        "corbel-provider-fixture",
    ]);
    profile::announce("health");
    println!("load average: {}", load());
    let mark = uuid::Uuid::new_v4().to_string();
    let _leftovers = Leftovers(mark.clone());
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run(&bins, &mark));
}

async fn run(bins: &Path, mark: &str) {
    let root = tempfile::tempdir().expect("temp dir");
    let process = provider_repo(
        root.path(),
        "process",
        &format!("exec {}", bins.join("corbel-provider-process").display()),
        "process.v1.service",
    );
    // The fixture says its pid in a directory granted to providers: their
    // sandbox keeps them from writing into their own checkout.
    let pids = root.path().join("pids");
    std::fs::create_dir_all(&pids).expect("the pids directory");
    let pid_file = pids.join("fixture.pid");
    let fixture = provider_repo(
        root.path(),
        "fixture",
        &format!(
            "echo $$ > {}; FIXTURE_PROTOCOL=1 FIXTURE_MODE=normal exec {}",
            pid_file.display(),
            bins.join("corbel-provider-fixture").display()
        ),
        "fixture.v1.noop",
    );

    // 1. Detection latency, watched and polled.
    let data = root.path().join("one");
    let poll = POLL_MS.to_string();
    let server = start(
        &data,
        &[
            ("CORBEL_DEPLOY_HEALTH_POLL_INTERVAL_MS", poll.as_str()),
            ("CORBEL_PROVIDER_BACKOFF_INITIAL_MS", "50"),
            ("CORBEL_PROVIDER_BACKOFF_MAX_MS", "1000"),
            ("CORBEL_PROVIDER_SANDBOX_WRITE", &pids.display().to_string()),
        ],
    );
    let api = Api::new(&server.addr, TOKEN).await;
    api.provider(
        "process",
        &process,
        json!({ "capacity": 20_000, "grace_ms": 1000 }),
    )
    .await;
    watched(&api, mark).await;
    let fixture_id = api
        .provider(
            "fixture",
            &fixture,
            json!({ "capacity": 10, "grace_ms": 1000 }),
        )
        .await;
    polled(&api, &fixture_id, &pid_file).await;
    server.stop();

    // 2. 10,000 watched resources, then 3. 1,000 dying at once.
    let data = root.path().join("two");
    let server = start(&data, &[]);
    let api = Api::new(&server.addr, TOKEN).await;
    let provider = api
        .provider(
            "process",
            &process,
            json!({ "capacity": 20_000, "grace_ms": 1000 }),
        )
        .await;
    let started = Instant::now();
    let many = api.deploy("many", &sleepers(mark, "s", MANY)).await;
    api.settled(&many, Duration::from_secs(900)).await;
    println!(
        "deployed {MANY} sleep processes in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    server.stop();
    let server = start(&data, &[]);
    let api = Api::new(&server.addr, TOKEN).await;
    api.connected(&provider).await;
    idle(&server, &api, &many).await;
    at_once(&server, &api, mark).await;
    server.stop();
    println!("load average: {}", load());
}

/// 50 replicas, each killed in turn; the time to its DOWN event.
async fn watched(api: &Api, mark: &str) {
    let id = api.deploy("watched", &sleepers(mark, "w", KILLS)).await;
    api.settled(&id, Duration::from_secs(300)).await;
    let nodes = api.nodes(&id).await;
    let mut events = follow(&api.addr, TOKEN, &id).await;
    let mut latencies = Vec::new();
    for (label, pid) in nodes {
        let killed = Instant::now();
        kill(pid);
        let seen = events.down(&label, killed).await;
        latencies.push(seen - killed);
    }
    let (p50, p95) = (
        quantile(&mut latencies, 0.5),
        quantile(&mut latencies, 0.95),
    );
    println!(
        "detection, watched ({KILLS} kills):      p50 {:>7.1} ms  p95 {:>7.1} ms   goal p95 < 1000 ms",
        ms(p50),
        ms(p95)
    );
}

/// The fixture killed `KILLS` times; its resource is seen DOWN at a poll.
async fn polled(api: &Api, provider: &str, pid_file: &Path) {
    let blueprint = "resources:\n  n:\n    type: fixture.v1.noop\n    restart: { policy: always, attempts: 1000, window: 1h, delay: 100ms, max_delay: 100ms }\n";
    let id = api.deploy("polled", blueprint).await;
    api.settled(&id, Duration::from_secs(60)).await;
    let mut events = follow(&api.addr, TOKEN, &id).await;
    let (mut latencies, mut reconnects) = (Vec::new(), Vec::new());
    let mut last = 0;
    for round in 1..=KILLS {
        let waiting = Instant::now();
        let pid = loop {
            let pid = std::fs::read_to_string(pid_file)
                .ok()
                .and_then(|t| t.trim().parse::<i32>().ok());
            match pid {
                Some(pid) if pid != last => break pid,
                _ if waiting.elapsed() > Duration::from_secs(60) => {
                    let provider = api
                        .gql(
                            "query($p: ID!) { provider(id: $p) { status statusMessage restarts } }",
                            json!({ "p": provider }),
                        )
                        .await;
                    panic!(
                        "round {round}: the fixture wrote no new pid within 60 s (last {last}, file {:?}): {provider:#}",
                        std::fs::read_to_string(pid_file).ok()
                    );
                }
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        last = pid;
        let killed = Instant::now();
        kill(pid);
        let back = tokio::spawn(api.clone().reconnected(provider.to_owned(), killed));
        let Ok(seen) =
            tokio::time::timeout(Duration::from_secs(30), events.down("n[0]", killed)).await
        else {
            let d = api
                .gql(
                    "query($id: ID!, $p: ID!) { provider(id: $p) { status statusMessage } deployment(id: $id) { state health nodes { health healthReason restarts } events(first: 10000) { kind nodeKey state message } } }",
                    json!({ "id": id, "p": provider }),
                )
                .await;
            panic!("round {round}: no DOWN within 30 s of killing the fixture ({pid}): {d:#}");
        };
        latencies.push(seen - killed);
        if let Ok(Some(at)) = back.await {
            reconnects.push(at - killed);
        }
        // Healed (the RESTART run's end, which follows the DOWN event)
        // before the next kill.
        events.complete(round, killed).await;
    }
    let (p50, p95) = (
        quantile(&mut latencies, 0.5),
        quantile(&mut latencies, 0.95),
    );
    let limit = 1.5 * POLL_MS as f64;
    println!(
        "detection, polled every {POLL_MS} ms ({KILLS} kills): p50 {:>7.1} ms  p95 {:>7.1} ms   goal p95 < {limit:.0} ms",
        ms(p50),
        ms(p95)
    );
    if !reconnects.is_empty() {
        let (r50, r95) = (
            quantile(&mut reconnects, 0.5),
            quantile(&mut reconnects, 0.95),
        );
        println!(
            "  (of which the fixture connecting again: p50 {:.1} ms, p95 {:.1} ms)",
            ms(r50),
            ms(r95)
        );
    }
}

/// The server with 10,000 watched resources, after a restart: its CPU and
/// RSS while nothing changes.
async fn idle(server: &common::Server, api: &Api, many: &str) {
    let pid = server.child.id() as i32;
    let at_connect = server.status_kib("VmRSS:");
    // The watch opens on all 10,000 and their first report is applied: wait
    // until a second passes with under 5 % of a core.
    let started = Instant::now();
    loop {
        let before = cpu_seconds(pid);
        tokio::time::sleep(Duration::from_secs(1)).await;
        if cpu_seconds(pid) - before < 0.05 || started.elapsed() > Duration::from_secs(120) {
            break;
        }
    }
    let calm = started.elapsed();
    let settled_rss = server.status_kib("VmRSS:");
    let before = cpu_seconds(pid);
    let t = Instant::now();
    tokio::time::sleep(IDLE).await;
    let cpu = (cpu_seconds(pid) - before) / t.elapsed().as_secs_f64() * 100.0;
    let after = server.status_kib("VmRSS:");
    let health = api
        .gql(
            "query($id: ID!) { deployment(id: $id) { health } }",
            json!({ "id": many }),
        )
        .await;
    println!(
        "{MANY} watched resources ({}), quiet {:.1} s after the provider connected",
        health["deployment"]["health"].as_str().unwrap_or("?"),
        calm.as_secs_f64()
    );
    println!(
        "  server CPU over {} s, nothing changing:  {cpu:>7.2} % of a core       goal < 2 %",
        IDLE.as_secs()
    );
    println!(
        "  server RSS growth since the provider connected: {:>6.1} MiB ({:.1} → {:.1} → {:.1} MiB; over the quiet {} s: {:+.1} MiB)   goal < 30 MiB",
        (after as f64 - at_connect as f64) / 1024.0,
        at_connect as f64 / 1024.0,
        settled_rss as f64 / 1024.0,
        after as f64 / 1024.0,
        IDLE.as_secs(),
        (after as f64 - settled_rss as f64) / 1024.0
    );
}

/// 1,000 resources killed at once: every DOWN event, and `/healthz` meanwhile.
async fn at_once(server: &common::Server, api: &Api, mark: &str) {
    let id = api.deploy("at-once", &sleepers(mark, "d", AT_ONCE)).await;
    api.settled(&id, Duration::from_secs(300)).await;
    let nodes = api.nodes(&id).await;
    let mut events = follow(&api.addr, TOKEN, &id).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let probe = tokio::spawn(probe_healthz(
        format!("http://{}/healthz", server.addr),
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let killed = Instant::now();
    for (_, pid) in &nodes {
        kill(*pid);
    }
    let labels: BTreeSet<String> = nodes.into_iter().map(|(label, _)| label).collect();
    let all_down = events.all_down(labels, killed).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies = probe.await.expect("the probe");
    let max = latencies.iter().max().copied().unwrap_or_default();
    println!(
        "{AT_ONCE} killed at once: every one DOWN after {:>7.1} ms                goal < 2000 ms",
        ms(all_down)
    );
    println!(
        "  /healthz meanwhile ({} probes): p50 {:.2} ms  p99 {:.2} ms  max {:>6.2} ms   goal < 100 ms",
        latencies.len(),
        ms(quantile(&mut latencies, 0.5)),
        ms(quantile(&mut latencies, 0.99)),
        ms(max)
    );
}

/// `/healthz` one request after another (5 ms apart) until `stop`.
async fn probe_healthz(url: String, stop: Arc<AtomicBool>) -> Vec<Duration> {
    let client = reqwest::Client::new();
    let mut latencies = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let asked = Instant::now();
        let reply = client.get(&url).send().await.expect("healthz answers");
        assert!(reply.status().is_success());
        reply.bytes().await.expect("body");
        latencies.push(asked.elapsed());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    latencies
}

/// `replicas` of `sleep 3600` as resource `key`, marked for the clean-up.
fn sleepers(mark: &str, key: &str, replicas: usize) -> String {
    format!(
        "resources:\n  {key}:\n    type: process.v1.service\n    replicas: {replicas}\n    config: {{ command: sleep, args: [\"3600\"], env: {{ HEALTH_BENCH: \"{mark}\" }} }}\n"
    )
}

fn start(data: &Path, env: &[(&str, &str)]) -> common::Server {
    common::serve(env!("CARGO_BIN_EXE_corbel"), data, |command| {
        command
            .args(["--log-filter", "warn,corbel::cli=info"])
            .env("CORBEL_ADMIN_TOKEN", TOKEN)
            .envs(env.iter().copied());
    })
}

/// What the health bench asks beyond [`common::api::Api`].
trait HealthApi {
    async fn reconnected(self, provider: String, since: Instant) -> Option<Instant>;
    async fn nodes(&self, id: &str) -> Vec<(String, i32)>;
}

impl HealthApi for Api {
    /// When the provider was CONNECTED again after `since` (polled, a side
    /// figure only).
    async fn reconnected(self, provider: String, since: Instant) -> Option<Instant> {
        let mut away = false;
        while since.elapsed() < Duration::from_secs(30) {
            let d = self
                .gql(
                    "query($id: ID!) { provider(id: $id) { status } }",
                    json!({ "id": provider }),
                )
                .await;
            let connected = d["provider"]["status"] == "CONNECTED";
            if connected && away {
                return Some(Instant::now());
            }
            away |= !connected;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        None
    }

    /// Each node's `key[replica]` and pid.
    async fn nodes(&self, id: &str) -> Vec<(String, i32)> {
        let d = self
            .gql(
                "query($id: ID!) { deployment(id: $id) { nodes { key replica outputs } } }",
                json!({ "id": id }),
            )
            .await;
        d["deployment"]["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .map(|n| {
                let label = format!("{}[{}]", n["key"].as_str().unwrap(), n["replica"]);
                (label, n["outputs"]["pid"].as_i64().expect("a pid") as i32)
            })
            .collect()
    }
}

/// A bare repository whose metadata runs `run`; its URL.
fn provider_repo(root: &Path, name: &str, run: &str, types: &str) -> String {
    let work = root.join(format!("{name}-work"));
    std::fs::create_dir_all(&work).expect("work dir");
    std::fs::write(
        work.join("corbel-provider.yaml"),
        format!("name: {name}\nversion: 0.1.0\nruntime: shell\nshell:\n  run: {run}\nresource_types: [{types}]\n"),
    )
    .expect("metadata");
    for args in [
        &["init", "-q"][..],
        &["add", "-A"],
        &["commit", "-q", "-m", "provider"],
    ] {
        let status = Command::new("git")
            .args(["-c", "user.name=b", "-c", "user.email=b@example.com"])
            .args(["-c", "init.defaultBranch=main"])
            .args(args)
            .current_dir(&work)
            .status()
            .expect("git runs");
        assert!(status.success(), "git {args:?}");
    }
    format!("file://{}", work.display())
}

fn kill(pid: i32) {
    // SAFETY: a signal to a workload this bench deployed.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort_unstable();
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Every process left with the bench's mark is killed at the end, whatever
/// happened.
struct Leftovers(String);

impl Drop for Leftovers {
    fn drop(&mut self) {
        let wanted = format!("HEALTH_BENCH={}", self.0);
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        let mut killed = 0;
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let marked = std::fs::read(entry.path().join("environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == wanted.as_bytes()));
            if marked {
                kill(pid);
                killed += 1;
            }
        }
        println!("(killed the {killed} processes left)");
    }
}
