//! Repository sync figures (a benchmark: it prints, it does not assert).
//!
//! A LAZY repository of 100,000 element versions (10,000 names × 10) served by a
//! real nginx, synced by the real `corbel serve` binary on SQLite: time from
//! `createRepository` to ACTIVE and the server's peak RSS; then a refresh where
//! 1% of the entries changed. Needs nginx (`scripts/test.sh` installs it).
//!
//! Run with `cargo bench --bench sync`.

mod common;
#[path = "../tests/it/nginx.rs"]
#[allow(dead_code)]
mod nginx;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

const NAMES: usize = 10_000;
const VERSIONS: usize = 10;
const TOKEN: &str = "cbl_bench_admin_token_0123456789";

fn main() {
    let served = tempfile::tempdir().expect("temp dir");
    let bytes = write_inventory(served.path(), 0);
    let nginx = nginx::Nginx::start(served.path());
    println!(
        "inventory: {} entries, {:.1} MiB",
        NAMES * VERSIONS,
        bytes as f64 / (1024.0 * 1024.0)
    );

    let data = tempfile::tempdir().expect("temp dir");
    let server = common::serve(env!("CARGO_BIN_EXE_corbel"), data.path(), |command| {
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
        NAMES * VERSIONS,
        full.as_secs_f64(),
        first["progress"]["stored"]
    );
    println!(
        "server RSS: before {:.1} MiB, peak {:.1} MiB (VmHWM)",
        rss_before as f64 / 1024.0,
        server.status_kib("VmHWM:") as f64 / 1024.0
    );

    write_inventory(served.path(), 1);
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

/// Writes `inventory.json`; `generation` > 0 changes every 100th entry.
fn write_inventory(root: &std::path::Path, generation: usize) -> u64 {
    use std::io::Write;
    let path = root.join("inventory.json");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    write!(out, "{{\"elements\": {{").unwrap();
    for n in 0..NAMES {
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
