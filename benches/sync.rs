//! Repository sync figures (a benchmark: it prints, it does not assert).
//!
//! A LAZY repository of element versions (names × 10 versions) served by a real
//! nginx, synced by the real `corbel serve` binary on SQLite: time from
//! `createRepository` to ACTIVE and the server's peak RSS; then a refresh where
//! 1% of the entries changed. Each size runs on a server and data directory of
//! its own, so each peak RSS is that size's. Needs nginx (`scripts/test.sh`
//! installs it).
//!
//! Run with `cargo bench --profile dist --bench sync`: 100,000 versions, then 1,000,000.
//! `SYNC_BENCH_VERSIONS=100000` (a comma-separated list) runs other sizes;
//! `SYNC_BENCH_BIN=path/to/corbel` measures another build (an older one, say).

mod common;
#[path = "../tests/it/nginx.rs"]
#[allow(dead_code)]
mod nginx;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

const VERSIONS: usize = 10;
const TOKEN: &str = "cbl_bench_admin_token_0123456789";

fn main() {
    let sizes: Vec<usize> = std::env::var("SYNC_BENCH_VERSIONS")
        .unwrap_or_else(|_| "100000,1000000".to_owned())
        .split(',')
        .map(|n| n.trim().parse().expect("SYNC_BENCH_VERSIONS: numbers"))
        .collect();
    for versions in sizes {
        run(versions.div_ceil(VERSIONS).max(1));
    }
}

/// One size: a fresh server syncs `names` × 10 versions, then refreshes.
fn run(names: usize) {
    let served = tempfile::tempdir().expect("temp dir");
    let bytes = write_inventory(served.path(), names, 0);
    let nginx = nginx::Nginx::start(served.path());
    println!(
        "inventory: {} entries, {:.1} MiB",
        names * VERSIONS,
        bytes as f64 / (1024.0 * 1024.0)
    );

    let data = tempfile::tempdir().expect("temp dir");
    let bin = std::env::var_os("SYNC_BENCH_BIN").unwrap_or(env!("CARGO_BIN_EXE_corbel").into());
    let server = common::serve(bin, data.path(), |command| {
        command
            .args(["--log-filter", "warn,corbel=info"])
            .env("CORBEL_ADMIN_TOKEN", TOKEN)
            .env("CORBEL_REPO_REFRESH_CHECK_MS", "100000");
    });
    let addr = &server.addr;
    let client = reqwest::blocking::Client::new();
    let gql = |query: &str, variables: Value| -> Value {
        client
            .post(format!("http://{addr}/graphql"))
            .bearer_auth(TOKEN)
            .json(&json!({"query": query, "variables": variables}))
            .send()
            .expect("request")
            .json()
            .expect("json")
    };
    let rss_before = server.status_kib("VmRSS:");

    let cpu = server.cpu_seconds();
    let started = Instant::now();
    let created = gql(
        "mutation($u: String!) { createRepository(input: {name: \"big\", driver: {http: {url: $u}}, syncMode: LAZY}) { id } }",
        json!({"u": nginx.url()}),
    );
    let id = created["data"]["createRepository"]["id"]
        .as_str()
        .expect("created")
        .to_owned();
    let first = wait_active(&gql, &id, None);
    let full = started.elapsed();
    println!(
        "LAZY sync of {} versions:       {:>7.2} s   (stored {})",
        names * VERSIONS,
        full.as_secs_f64(),
        first["progress"]["stored"]
    );
    let cpu_full = server.cpu_seconds() - cpu;
    println!(
        "  server CPU time:               {cpu_full:>7.2} s   (user + system: what other load on the machine does not inflate)"
    );
    println!(
        "server RSS: before {:.1} MiB, peak {:.1} MiB (VmHWM)",
        rss_before as f64 / 1024.0,
        server.status_kib("VmHWM:") as f64 / 1024.0
    );

    write_inventory(served.path(), names, 1);
    let cpu = server.cpu_seconds();
    let started = Instant::now();
    gql(
        "mutation($id: ID!) { refreshRepository(id: $id) { id } }",
        json!({"id": id}),
    );
    wait_active(&gql, &id, first["lastSyncedAt"].as_str());
    println!(
        "refresh with 1% changed:         {:>7.2} s",
        started.elapsed().as_secs_f64()
    );
    println!(
        "  server CPU time:               {:>7.2} s",
        server.cpu_seconds() - cpu
    );
    println!(
        "server peak RSS after refresh: {:.1} MiB",
        server.status_kib("VmHWM:") as f64 / 1024.0
    );

    server.stop();
}

/// Polls until the repository is ACTIVE with a `lastSyncedAt` other than `before`.
fn wait_active(gql: &dyn Fn(&str, Value) -> Value, id: &str, before: Option<&str>) -> Value {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let body = gql(
            "query($id: ID!) { repository(id: $id) { status statusMessage lastSyncedAt progress { seen stored } } }",
            json!({"id": id}),
        );
        let repo = body["data"]["repository"].clone();
        assert_ne!(repo["status"], "ERROR", "sync failed: {repo}");
        if repo["status"] == "ACTIVE" && repo["lastSyncedAt"].as_str() != before {
            return repo;
        }
        assert!(Instant::now() < deadline, "sync took over 10 minutes");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes `inventory.json` of `names` × 10 versions; `generation` > 0 changes
/// every 100th entry.
fn write_inventory(root: &std::path::Path, names: usize, generation: usize) -> u64 {
    use std::io::Write;
    let path = root.join("inventory.json");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    write!(out, "{{\"elements\": {{").unwrap();
    for n in 0..names {
        if n > 0 {
            write!(out, ",").unwrap();
        }
        write!(out, "\"element-{n:05}\": {{").unwrap();
        for v in 0..VERSIONS {
            if v > 0 {
                write!(out, ",").unwrap();
            }
            let changed = generation > 0 && (n * VERSIONS + v).is_multiple_of(100);
            let image = if changed {
                "disk-v2.qcow2"
            } else {
                "disk.qcow2"
            };
            write!(
                out,
                "\"1.{v}.0\": {{\"name\": \"element-{n:05}\", \"version\": \"1.{v}.0\", \"images\": [\"{image}\"], \
                 \"index\": {{\"images\": {{\"{n:05}-{v}\": \"{image}\"}}, \"manifests\": {{\"m{n:05}-{v}\": \"element-{n:05}.yaml\"}}}}}}"
            )
            .unwrap();
        }
        write!(out, "}}").unwrap();
    }
    write!(out, "}}}}").unwrap();
    out.flush().unwrap();
    std::fs::metadata(&path).unwrap().len()
}
