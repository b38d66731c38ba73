//! Replica figures (a benchmark, not a test: it prints, it does not assert).
//!
//! Real `corbel serve --cluster` processes on one PostgreSQL (a fresh
//! database on `CORBEL_BENCH_POSTGRES_URL`), with the fast cluster timings
//! the tests use (heartbeat 200 ms, lease 1,500 ms; the defaults, 500 ms and 4 s,
//! with `REPLICAS_BENCH_DEFAULT_TIMINGS=1`), each replica with its
//! own data directory, and `corbel-provider-fixture` (no-op deploys):
//!
//! 1. deploy throughput with 1, 2 and 3 replicas: 4 deployments of 250
//!    independent resources asked at once, the requests spread over the
//!    replicas (standbys forward to the leader), until all are COMPLETE;
//! 2. failover: with 3 replicas, a 1,500-link chain is deployed, and the
//!    leader SIGKILLed once a fifth of it is done; the time until another
//!    replica leads and serves, until the run takes its next step, and until
//!    it is COMPLETE. Five rounds; the killed replica comes back as a
//!    standby each time.
//!
//! 3. reads: queries per second with 1, 2 and 3 replicas, 16 clients
//!    spread over them (each replica answers queries itself);
//! 4. first event: how long after the leader a standby delivers each event
//!    of a run both follow (the standby reads them from the history when
//!    PostgreSQL notifies it of the leader's commit).
//!
//! Run with `CORBEL_BENCH_POSTGRES_URL=postgres://… cargo bench --profile dist --bench
//! replicas`. It builds the server and the fixture in release mode first
//! (`CORBEL_BENCH_BIN` and `CORBEL_BENCH_FIXTURE` name other binaries
//! instead). `REPLICAS_BENCH=throughput`, `failover`, `reads` or `first-event`
//! runs one part.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "common/fixture.rs"]
mod fixture;
#[path = "common/postgres.rs"]
mod postgres;
#[path = "common/profile.rs"]
mod profile;
#[path = "replicas/reads.rs"]
mod reads;

const TOKEN: &str = "bench-admin-token-0123456789abcdef";

struct Replica {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Cluster {
    bin: PathBuf,
    key: PathBuf,
    replicas: Vec<Replica>,
    /// Dropped after the replicas (fields drop in order).
    database: postgres::BenchDatabase,
}

impl Cluster {
    fn start_replica(&mut self) {
        let dir = tempfile::tempdir().unwrap();
        let log = std::fs::File::create(dir.path().join("serve.log")).unwrap();
        let mut command = Command::new(&self.bin);
        command
            .arg("serve")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("CORBEL_CLUSTER", "true")
            .env("CORBEL_LISTEN", "127.0.0.1:0")
            .env("CORBEL_DATA_DIR", dir.path())
            // Replicas share the providers' state (a replica with another is refused).
            .env(
                "CORBEL_PROVIDER_STATE_DIR",
                self.key.with_file_name("provider-state"),
            )
            .env("CORBEL_DATABASE_URL", &self.database.url)
            .env("CORBEL_ADMIN_TOKEN", TOKEN)
            .env("CORBEL_LOG_FORMAT", "json")
            .env("CORBEL_LOG", "warn,corbel::cli=info")
            .stdout(Stdio::null())
            .stderr(log);
        if self.key.exists() {
            command.env("CORBEL_SECRET_KEY_FILE", &self.key);
        }
        if !default_timings() {
            command
                .env("CORBEL_CLUSTER_HEARTBEAT_MS", "200")
                .env("CORBEL_CLUSTER_LEASE_MS", "1500");
        }
        let child = command.spawn().expect("corbel starts");
        let url = wait_for(Duration::from_secs(60), || {
            let text = std::fs::read_to_string(dir.path().join("serve.log")).ok()?;
            text.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find_map(|l| l["url"].as_str().map(str::to_owned))
        })
        .expect("the replica announces its address");
        if !self.key.exists() {
            let made = dir.path().join("secret.key");
            wait_for(Duration::from_secs(30), || made.exists().then_some(()))
                .expect("the first replica makes the key");
            std::fs::copy(&made, &self.key).unwrap();
        }
        self.replicas.push(Replica {
            child,
            url,
            _dir: dir,
        });
    }
}

fn wait_for<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(found) = check() {
            return Some(found);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// The `data` of an answer, or why there is none.
async fn try_gql(
    http: &reqwest::Client,
    url: &str,
    query: &str,
    variables: Value,
) -> Result<Value, String> {
    let answer: Value = http
        .post(format!("{url}/graphql"))
        .bearer_auth(TOKEN)
        .json(&json!({ "query": query, "variables": variables }))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    match answer.get("errors") {
        Some(errors) => Err(errors.to_string()),
        None => Ok(answer["data"].clone()),
    }
}

async fn gql(http: &reqwest::Client, url: &str, query: &str, variables: Value) -> Value {
    try_gql(http, url, query, variables)
        .await
        .unwrap_or_else(|e| panic!("{query}: {e}"))
}

/// The pid of the replica leading now, as `url` says.
async fn leader_pid(http: &reqwest::Client, url: &str) -> Option<u64> {
    let data = try_gql(http, url, "{ replicas { pid state leader } }", json!({}))
        .await
        .ok()?;
    data["replicas"]
        .as_array()?
        .iter()
        .find(|r| r["leader"] == true && r["state"] == "ALIVE")
        .and_then(|r| r["pid"].as_u64())
}

/// A blueprint of `count` no-op resources, each depending on the one before
/// when `chained`.
fn noop_blueprint(count: usize, chained: bool) -> String {
    let mut source = String::from("resources:\n");
    for i in 0..count {
        source.push_str(&format!(
            "  r{i}:\n    type: fixture.v1.noop\n    provider: fixture\n"
        ));
        if chained && i > 0 {
            source.push_str(&format!("    depends_on: [r{}]\n", i - 1));
        }
    }
    source
}

/// A deployment's state, nodes done and last event id; nothing (an empty
/// state) while the replica asked cannot answer (a failover under way).
async fn state_of(http: &reqwest::Client, url: &str, id: &str) -> (String, usize, i64) {
    let Ok(data) = try_gql(
        http,
        url,
        "query($id: ID!) { deployment(id: $id) { state nodes { state } events(first: 10000) { id } } }",
        json!({ "id": id }),
    )
    .await
    else {
        return (String::new(), 0, 0);
    };
    let d = &data["deployment"];
    let done = d["nodes"]
        .as_array()
        .map_or(0, |n| n.iter().filter(|n| n["state"] == "COMPLETE").count());
    let last = d["events"]
        .as_array()
        .and_then(|e| e.last())
        .and_then(|e| e["id"].as_str()?.parse().ok())
        .unwrap_or(0);
    (
        d["state"].as_str().unwrap_or_default().to_owned(),
        done,
        last,
    )
}

async fn blueprint(http: &reqwest::Client, url: &str, name: &str, source: &str) -> String {
    let data = gql(
        http,
        url,
        "mutation($input: CreateBlueprintInput!) { createBlueprint(input: $input) { id } }",
        json!({ "input": { "name": name, "source": source } }),
    )
    .await;
    data["createBlueprint"]["id"].as_str().unwrap().to_owned()
}

async fn deploy(http: &reqwest::Client, url: &str, blueprint: &str, name: &str) -> String {
    let data = gql(
        http,
        url,
        "mutation($input: DeployBlueprintInput!) { deployBlueprint(input: $input) { id } }",
        json!({ "input": { "blueprintId": blueprint, "name": name } }),
    )
    .await;
    data["deployBlueprint"]["id"].as_str().unwrap().to_owned()
}

/// `REPLICAS_BENCH_DEFAULT_TIMINGS=1`: the replicas run with the default
/// heartbeat and lease (500 ms, 4 s) instead of the tests' (200 ms, 1.5 s).
fn default_timings() -> bool {
    std::env::var_os("REPLICAS_BENCH_DEFAULT_TIMINGS").is_some()
}

fn build_server() -> PathBuf {
    if let Ok(bin) = std::env::var("CORBEL_BENCH_BIN") {
        return PathBuf::from(bin);
    }
    profile::build(&["--bin", "corbel"]).join("corbel")
}

async fn cluster_of(n: usize, bin: &Path, server: &str, fixture_url: &str) -> Cluster {
    let mut cluster = Cluster {
        bin: bin.to_owned(),
        key: tempfile::tempdir().unwrap().keep().join("secret.key"),
        replicas: Vec::new(),
        database: postgres::fresh_postgres_database(server).await,
    };
    for _ in 0..n {
        cluster.start_replica();
    }
    let http = reqwest::Client::new();
    let url = cluster.replicas[0].url.clone();
    let data = gql(
        &http,
        &url,
        "mutation($input: CreateProviderInput!) { createProvider(input: $input) { provider { id } } }",
        json!({ "input": { "name": "fixture", "gitUrl": fixture_url, "config": { "capacity": 1000000 } } }),
    )
    .await;
    let provider = data["createProvider"]["provider"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let data = gql(
            &http,
            &url,
            "query($id: ID!) { provider(id: $id) { status } }",
            json!({ "id": provider }),
        )
        .await;
        if data["provider"]["status"] == "CONNECTED" {
            break;
        }
        assert!(Instant::now() < deadline, "the fixture did not connect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster
}

async fn throughput(bin: &Path, server: &str, fixture_url: &str) {
    const DEPLOYMENTS: usize = 4;
    const WIDTH: usize = 250;
    let source = noop_blueprint(WIDTH, false);
    for n in 1..=3 {
        let cluster = cluster_of(n, bin, server, fixture_url).await;
        let http = reqwest::Client::new();
        let urls: Vec<String> = cluster.replicas.iter().map(|r| r.url.clone()).collect();
        let id = blueprint(&http, &urls[0], "wide", &source).await;
        let began = Instant::now();
        let mut ids = Vec::new();
        for d in 0..DEPLOYMENTS {
            ids.push(deploy(&http, &urls[d % n], &id, &format!("wide-{d}")).await);
        }
        for (d, id) in ids.iter().enumerate() {
            loop {
                let (state, _, _) = state_of(&http, &urls[d % n], id).await;
                if state == "COMPLETE" {
                    break;
                }
                assert_ne!(state, "FAILED", "a deployment failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let took = began.elapsed();
        let resources = DEPLOYMENTS * WIDTH;
        println!(
            "throughput: {n} replica(s): {resources} resources in {DEPLOYMENTS} deployments in {:.2} s: {:.0} resources/s",
            took.as_secs_f64(),
            resources as f64 / took.as_secs_f64()
        );
    }
}

async fn failover(bin: &Path, server: &str, fixture_url: &str) {
    const LINKS: usize = 1500;
    const ROUNDS: usize = 5;
    let source = noop_blueprint(LINKS, true);
    let mut cluster = cluster_of(3, bin, server, fixture_url).await;
    let http = reqwest::Client::new();
    let chain = blueprint(&http, &cluster.replicas[0].url, "chain", &source).await;
    let mut figures = Vec::new();
    for round in 0..ROUNDS {
        let leader = leader_pid(&http, &cluster.replicas[0].url)
            .await
            .expect("a leader");
        let index = cluster
            .replicas
            .iter()
            .position(|r| u64::from(r.child.id()) == leader)
            .expect("the leader is ours");
        let standby = cluster.replicas[(index + 1) % cluster.replicas.len()]
            .url
            .clone();
        let id = deploy(&http, &standby, &chain, &format!("chain-{round}")).await;
        let before = loop {
            let (_, done, last) = state_of(&http, &standby, &id).await;
            if done >= LINKS / 5 {
                break last;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let mut killed = cluster.replicas.remove(index);
        let _ = killed.child.kill();
        let at = Instant::now();
        let _ = killed.child.wait();
        drop(killed);
        let serving = loop {
            if let Some(pid) = leader_pid(&http, &standby).await
                && pid != leader
            {
                break at.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let stepped = loop {
            let (_, _, last) = state_of(&http, &standby, &id).await;
            if last > before {
                break at.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let complete = loop {
            let (state, _, _) = state_of(&http, &standby, &id).await;
            if state == "COMPLETE" {
                break at.elapsed();
            }
            assert_ne!(state, "FAILED", "the run failed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        println!(
            "failover round {}: kill -> new leader serving {} ms -> run's next step {} ms -> COMPLETE {} ms",
            round + 1,
            serving.as_millis(),
            stepped.as_millis(),
            complete.as_millis()
        );
        figures.push(stepped);
        cluster.start_replica();
    }
    figures.sort();
    println!(
        "failover: kill -> the run goes on: median {} ms, max {} ms over {ROUNDS} rounds ({}; goal < 5 s with the defaults)",
        figures[ROUNDS / 2].as_millis(),
        figures[ROUNDS - 1].as_millis(),
        if default_timings() {
            "the default lease, 4,000 ms, and heartbeat, 500 ms"
        } else {
            "lease 1,500 ms, heartbeat 200 ms"
        }
    );
}

#[tokio::main]
async fn main() {
    let Ok(server) = std::env::var("CORBEL_BENCH_POSTGRES_URL") else {
        println!("replicas: skipped (replicas need PostgreSQL: set CORBEL_BENCH_POSTGRES_URL)");
        return;
    };
    let bin = build_server();
    let fixture_bin = match std::env::var("CORBEL_BENCH_FIXTURE") {
        Ok(bin) => PathBuf::from(bin),
        Err(_) => fixture::build_fixture(),
    };
    let root = tempfile::tempdir().unwrap();
    let fixture_url = fixture::fixture_repo(root.path(), &fixture_bin);
    let only = std::env::var("REPLICAS_BENCH").ok();
    let runs = |part: &str| only.as_deref().is_none_or(|only| only == part);
    if runs("throughput") {
        throughput(&bin, &server, &fixture_url).await;
    }
    if runs("failover") {
        failover(&bin, &server, &fixture_url).await;
    }
    if runs("reads") {
        reads::queries(&bin, &server, &fixture_url).await;
    }
    if runs("first-event") {
        reads::first_event(&bin, &server, &fixture_url).await;
    }
}
