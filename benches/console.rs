//! Console figures (a benchmark, not a test: it prints, it does not assert).
//!
//! 1. Size: the console's own JavaScript and CSS (`web/` without `vendor/`).
//! 2. Time to interactive: the real `corbel serve` binary (release, files
//!    embedded) and real headless Chromium through chromedriver; each load of
//!    a page is timed from navigation start to the `console-ready` mark
//!    `web/js/app.js` sets once the first page is drawn and its controls
//!    work, for the sign-in page (signed out) and the overview (signed in).
//! 3. First draw of a large deployment's page: one resource of 10,000 no-op
//!    replicas of the fixture provider (and one after it), its page timed
//!    the same way; its `console-ready` comes once the page's graph is drawn
//!    (by level past 400 nodes, `web/js/pages/levels.js`). Issue 41's goal:
//!    under 1 s.
//!
//! Run with `cargo bench --profile dist --bench console` (needs chromium and chromedriver,
//! which `scripts/test.sh` installs).

mod common;
#[path = "common/fixture.rs"]
mod fixture;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::profile;
use fantoccini::{ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

const LOADS: usize = 30;
/// A large deployment's page is loaded fewer times: each load also replays
/// its events, three or so a node.
const LARGE_LOADS: usize = 10;
const LARGE: usize = 10_000;
const TOKEN: &str = "cbl_bench_admin_token_0123456789abcdef";
const PASSWORD: &str = "bench-password-1";

fn main() {
    let fixture = fixture::build_fixture();
    profile::announce("console");
    size();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(interactive(&fixture));
}

fn size() {
    let web = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("web");
    let (mut js, mut css) = (0u64, 0u64);
    let mut stack = vec![web.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("web/") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                if path != web.join("vendor") {
                    stack.push(path);
                }
                continue;
            }
            let len = std::fs::metadata(&path).expect("metadata").len();
            match path.extension().and_then(|e| e.to_str()) {
                Some("js") => js += len,
                Some("css") => css += len,
                _ => {}
            }
        }
    }
    println!(
        "own JS + CSS: {:.1} KB ({:.1} KB JS, {:.1} KB CSS; the 155 KB budget counts code without comment lines)",
        (js + css) as f64 / 1024.0,
        js as f64 / 1024.0,
        css as f64 / 1024.0
    );
}

async fn interactive(fixture: &std::path::Path) {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = common::serve(env!("CARGO_BIN_EXE_corbel"), dir.path(), |c| {
        // The fixture is outside the data directory: granted to the sandbox.
        let bins = fixture.parent().expect("the fixture's directory");
        c.env("CORBEL_ADMIN_TOKEN", TOKEN)
            .env("CORBEL_PROVIDER_SANDBOX_READ", bins);
    });
    let base = format!("http://{}", server.addr);
    let http = reqwest::Client::new();
    let set = http
        .post(format!("{base}/graphql"))
        .bearer_auth(TOKEN)
        .json(&json!({ "query": "mutation($p: String!) { setPassword(newPassword: $p) }", "variables": { "p": PASSWORD } }))
        .send()
        .await
        .expect("setPassword");
    assert!(set.status().is_success());

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut driver = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let profile = tempfile::tempdir().expect("profile");
    let caps = json!({ "goog:chromeOptions": { "args": [
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--no-first-run", "--disable-background-networking", "--window-size=1280,900",
        format!("--user-data-dir={}", profile.path().display()),
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
        "--proxy-server=http://127.0.0.1:9",
    ] } });
    let Value::Object(caps) = caps else {
        unreachable!()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let client = loop {
        let mut builder = ClientBuilder::new(HttpConnector::new());
        builder.capabilities(caps.clone());
        match builder.connect(&format!("http://127.0.0.1:{port}")).await {
            Ok(client) => break client,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("chromedriver: {e}"),
        }
    };

    // Warm: the first load of a fresh profile also starts Chromium's caches.
    client
        .goto(&format!("{base}/sign-in"))
        .await
        .expect("sign-in");
    let signed_out = loads(&client, &format!("{base}/sign-in"), LOADS).await;
    client
        .find(Locator::Css("#sign-in [name=username]"))
        .await
        .expect("form")
        .send_keys("admin")
        .await
        .expect("typing");
    client
        .find(Locator::Css("#sign-in [name=password]"))
        .await
        .expect("form")
        .send_keys(PASSWORD)
        .await
        .expect("typing");
    client
        .find(Locator::Css("#sign-in button[type=submit]"))
        .await
        .expect("form")
        .click()
        .await
        .expect("sign in");
    client
        .wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("#signed-in-as"))
        .await
        .expect("signed in");
    let overview = loads(&client, &format!("{base}/"), LOADS).await;
    let large = large_deployment(&server.addr, dir.path(), fixture).await;
    let large = loads(&client, &format!("{base}/deployments/{large}"), LARGE_LOADS).await;
    let rows = client
        .execute(
            "return document.querySelectorAll('#dag .row').length;",
            vec![],
        )
        .await
        .expect("script");
    println!(
        "a 10,000-node deployment's page holds {rows} node rows (drawn by level, only those in view)"
    );
    report("sign-in page, signed out", signed_out, 300);
    report("overview, signed in", overview, 300);
    report("a 10,000-node deployment", large, 1000);
    println!(
        "server RSS after {} page loads: {:.1} MiB",
        2 * LOADS + LARGE_LOADS + 2,
        server.status_kib("VmRSS:") as f64 / 1024.0
    );
    client.close().await.ok();
    driver.kill().ok();
    driver.wait().ok();
    server.stop();
}

/// `LARGE` replicas of the fixture's no-op resource and one resource after
/// them, deployed; the deployment's id.
async fn large_deployment(addr: &str, dir: &std::path::Path, fixture: &std::path::Path) -> String {
    let api = common::api::Api::new(addr, TOKEN).await;
    let repo = fixture::fixture_repo(dir, fixture);
    api.provider("fixture", &repo, json!({ "capacity": 2 * LARGE }))
        .await;
    let source = format!(
        "resources:\n  many:\n    type: fixture.v1.noop\n    replicas: {LARGE}\n    strategy: AUTO\n  \
         last:\n    type: fixture.v1.noop\n    depends_on: [many]\n"
    );
    let id = api.deploy("large", &source).await;
    api.settled(&id, Duration::from_secs(300)).await;
    id
}

/// `count` loads of `url`: ms from navigation start to `console-ready`.
async fn loads(client: &fantoccini::Client, url: &str, count: usize) -> Vec<f64> {
    let mut times = Vec::with_capacity(count);
    for _ in 0..count {
        client.goto(url).await.expect("load");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mark = client
                .execute(
                    "const m = performance.getEntriesByName('console-ready'); return m.length ? m[0].startTime : null;",
                    vec![],
                )
                .await
                .expect("script");
            if let Some(ms) = mark.as_f64() {
                times.push(ms);
                break;
            }
            assert!(Instant::now() < deadline, "{url} never became ready");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    times
}

fn report(what: &str, mut times: Vec<f64>, target_ms: u32) {
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    println!(
        "navigation start to interactive, {what:<26} median {:>6.1} ms  p95 {:>6.1} ms  max {:>6.1} ms  ({} loads; target {target_ms} ms)",
        at(0.5),
        at(0.95),
        times[times.len() - 1],
        times.len()
    );
}
