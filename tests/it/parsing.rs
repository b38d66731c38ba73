//! Parsing costs what it reads (issue 38): the blueprint of 15,000 unknown
//! keys that held `/healthz` for 95 s, sent twice at once, is answered in
//! moments with a capped list of problems while `/healthz` keeps answering
//! and memory stays bounded; a parse past the request's deadline is
//! answered with `TIMEOUT` (and stopped: `crate::cpu`'s own test).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::input::{PEAK_GROWTH_LIMIT, peak_rss};
use crate::support::attacks::unknown_keys;
use crate::support::{ADMIN_TOKEN, TestApp, TestStore, data, error_code};

const CREATE: &str =
    "mutation($input: CreateBlueprintInput!) { createBlueprint(input: $input) { id } }";

/// Runs `work` on a thread of its own with its own runtime and HTTP client,
/// so that what the test does as a client takes nothing from the server's
/// workers and is not slowed by them.
fn on_own_thread<T, F>(work: impl FnOnce(reqwest::Client) -> F + Send + 'static) -> JoinHandle<T>
where
    T: Send + 'static,
    F: Future<Output = T>,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(work(reqwest::Client::new()))
    })
}

// The server on two workers, as a small machine gives it; the clients on
// threads of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifteen_thousand_unknown_keys_twice_at_once_leave_healthz_answering() {
    let app = TestApp::spawn().await;
    let source = unknown_keys();
    let before = peak_rss();
    let attacks: Vec<JoinHandle<Value>> = (0..2)
        .map(|i| {
            let url = app.url("/graphql");
            let input = json!({"input": {"name": format!("keys-{i}"), "source": source}});
            on_own_thread(move |client| async move {
                let body = json!({"query": CREATE, "variables": input});
                let sent = client.post(url).bearer_auth(ADMIN_TOKEN).json(&body).send();
                sent.await.unwrap().json().await.unwrap()
            })
        })
        .collect();
    let done = Arc::new(AtomicBool::new(false));
    let finished = done.clone();
    let healthz = app.url("/healthz");
    let poller = on_own_thread(move |client| async move {
        let started = Instant::now();
        let (mut slowest, mut asked) = (Duration::ZERO, 0);
        while !finished.load(Ordering::Relaxed) || asked == 0 {
            let sent = Instant::now();
            let health = client.get(&healthz).send().await.unwrap();
            assert_eq!(health.status(), 200);
            slowest = slowest.max(sent.elapsed());
            asked += 1;
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "not answered in 30 s"
            );
        }
        (slowest, asked)
    });
    let answers: Vec<Value> = tokio::task::spawn_blocking(move || {
        let answers = attacks.into_iter().map(|a| a.join().unwrap()).collect();
        done.store(true, Ordering::Relaxed);
        answers
    })
    .await
    .unwrap();
    let (slowest_health, asked) = tokio::task::spawn_blocking(move || poller.join().unwrap())
        .await
        .unwrap();
    for body in answers {
        assert_eq!(error_code(&body), Some("VALIDATION"), "{body}");
        let problems = body["errors"][0]["extensions"]["problems"]
            .as_array()
            .expect("a list of problems");
        assert_eq!(problems.len(), 11, "{body}");
        assert_eq!(problems[0]["path"], "k00000");
        assert_eq!(problems[0]["line"], 3);
        assert!(
            problems[10]["message"]
                .as_str()
                .unwrap()
                .starts_with("14990 more unknown keys are not listed"),
            "{body}"
        );
    }
    // Held for 95 s before; bounded here as `limits.rs` bounds it (a debug
    // build on cores shared with the rest of the suite: 960 ms was seen once
    // on PostgreSQL under load). The 100 ms goal is a figure for a bench.
    assert!(
        slowest_health < Duration::from_secs(2),
        "/healthz took {slowest_health:?} ({asked} asked)"
    );
    let growth = peak_rss().saturating_sub(before);
    assert!(
        growth < PEAK_GROWTH_LIMIT,
        "peak RSS grew by {growth} bytes"
    );
    let good = json!({"input": {"name": "fine", "source": "resources: {}\n"}});
    assert!(data(&app.gql(CREATE, good).await)["createBlueprint"]["id"].is_string());
}

#[tokio::test]
async fn a_parse_past_the_request_deadline_is_answered_with_timeout() {
    let store = Arc::new(TestStore::fresh().await);
    let app = TestApp::spawn_with(store, |c| {
        c.graphql.request_timeout = Duration::from_millis(10);
    })
    .await;
    // Near 1 MB of resources: checking it takes well over 10 ms.
    let mut source = String::from("resources:\n");
    while source.len() < 1_000_000 {
        let i = source.len();
        source.push_str(&format!(
            "  r{i}: {{type: process.v1.service, config: {{a: \"{{{{ resources.r{i}.outputs.x }}}}\"}}}}\n"
        ));
    }
    let input = json!({"input": {"name": "big", "source": source}});
    let body = app.gql(CREATE, input).await;
    assert_eq!(error_code(&body), Some("TIMEOUT"), "{body}");
    let message = body["errors"][0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("graphql.request_timeout_ms"), "{body}");
    let health = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
}
