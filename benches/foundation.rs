//! Foundation figures (a benchmark, not a test: it prints, it does not assert).
//!
//! 1. Start to ready: the real `corbel serve` binary on a fresh SQLite data dir and
//!    again on the same dir (a restart), timed from spawn to the first 200 from
//!    `/readyz`; then its idle RSS.
//! 2. GraphQL overhead: `serverInfo` through `/graphql` against a plain axum JSON
//!    route serving the same body, in the same process, under the same load.
//!
//! Run with `cargo bench --profile dist --bench foundation`.

mod common;

use std::time::{Duration, Instant};

use axum::Json;
use axum::routing::get;
use corbel::app::App;
use corbel::config::Config;
use serde_json::json;

// The same allocator as the `corbel` binary, so in-process figures match it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const STARTS: usize = 10;
const REQUESTS: usize = 20_000;
const CONCURRENCY: usize = 32;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    common::profile::announce("foundation");
    startup_and_rss();
    runtime.block_on(throughput());
}

fn startup_and_rss() {
    let mut first = Vec::new();
    let mut again = Vec::new();
    let mut rss = Vec::new();
    for _ in 0..STARTS {
        let dir = tempfile::tempdir().expect("temp dir");
        for (round, times) in [&mut first, &mut again].into_iter().enumerate() {
            let started = Instant::now();
            let server = common::serve(env!("CARGO_BIN_EXE_corbel"), dir.path(), |_| {});
            let addr = &server.addr;
            while !ready(addr) {
                std::thread::sleep(Duration::from_millis(1));
            }
            times.push(started.elapsed());
            if round == 1 {
                std::thread::sleep(Duration::from_secs(1));
                rss.push(server.status_kib("VmRSS:"));
            }
            let status = server.stop();
            assert!(status.success(), "corbel exited {status:?}");
        }
    }
    println!(
        "start to ready, fresh store:    median {:>7.1} ms  max {:>7.1} ms  ({STARTS} starts)",
        ms(median(&mut first)),
        ms(*first.iter().max().unwrap())
    );
    println!(
        "start to ready, existing store: median {:>7.1} ms  max {:>7.1} ms  ({STARTS} starts)",
        ms(median(&mut again)),
        ms(*again.iter().max().unwrap())
    );
    rss.sort_unstable();
    println!(
        "idle RSS after ready + 1 s:     median {:>7.1} MiB max {:>7.1} MiB",
        rss[rss.len() / 2] as f64 / 1024.0,
        *rss.last().unwrap() as f64 / 1024.0
    );
}

/// One blocking GET of `/readyz`; true on 200.
fn ready(addr: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let request = format!("GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.starts_with("HTTP/1.1 200")
}

async fn throughput() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config::for_data_dir(dir.path());
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.log_filter = "warn".into();
    let app = App::build(&config).await.expect("app");
    let graphql = format!("http://{}/graphql", app.local_addr());
    let facts = app.facts().clone();
    let app_token = app.new_admin_token().map(str::to_owned);
    tokio::spawn(app.run_until_stopped(std::future::pending()));

    // The plain route answers with the same document serverInfo produces.
    let body = json!({"data": {"serverInfo": {
        "version": corbel::VERSION,
        "instanceId": facts.instance_id,
        "database": facts.database,
        "startedAt": facts.started_at,
    }}});
    let plain = axum::Router::new().route(
        "/plain",
        get(move || {
            let body = body.clone();
            async move { Json(body) }
        })
        .post(|| async { "" }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plain_url = format!("http://{}/plain", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, plain).await });

    let query =
        json!({"query": "{ serverInfo { version instanceId database startedAt } }"}).to_string();
    // Anonymous callers pass a gate one at a time per two cores (the abuse
    // limits); a caller with a token does not. Both are measured.
    let token = app_token.as_deref();
    // Warm up, then measure each twice, alternating, and keep the better run.
    load(&graphql, Some(&query), None, 2_000).await;
    load(&plain_url, None, None, 2_000).await;
    let (mut anonymous, mut signed_in, mut plain_rps) = (0f64, 0f64, 0f64);
    for _ in 0..2 {
        anonymous = anonymous.max(load(&graphql, Some(&query), None, REQUESTS).await);
        signed_in = signed_in.max(load(&graphql, Some(&query), token, REQUESTS).await);
        plain_rps = plain_rps.max(load(&plain_url, None, None, REQUESTS).await);
    }
    println!(
        "GraphQL serverInfo, anonymous:  {anonymous:>9.0} req/s ({REQUESTS} requests, {CONCURRENCY} connections)"
    );
    println!("GraphQL serverInfo, token:      {signed_in:>9.0} req/s");
    println!("plain axum JSON route:          {plain_rps:>9.0} req/s");
    println!(
        "ratio GraphQL / plain:          {:>9.2} anonymous, {:.2} with a token",
        anonymous / plain_rps,
        signed_in / plain_rps
    );
}

/// Sends `total` requests over `CONCURRENCY` keep-alive connections; returns req/s.
async fn load(url: &str, body: Option<&str>, token: Option<&str>, total: usize) -> f64 {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CONCURRENCY)
        .build()
        .unwrap();
    let url = reqwest::Url::parse(url).expect("url");
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..CONCURRENCY {
        let client = client.clone();
        let url = url.clone();
        let body = body.map(str::to_owned);
        let token = token.map(str::to_owned);
        let share = total / CONCURRENCY + usize::from(w < total % CONCURRENCY);
        workers.push(tokio::spawn(async move {
            for _ in 0..share {
                let mut request = match &body {
                    Some(b) => client
                        .post(url.clone())
                        .header("content-type", "application/json")
                        .body(b.clone()),
                    None => client.get(url.clone()),
                };
                if let Some(token) = &token {
                    request = request.bearer_auth(token);
                }
                let response = request.send().await.expect("request");
                assert!(response.status().is_success());
                response.bytes().await.expect("body");
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
