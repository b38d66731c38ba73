//! The standbys' own work: queries answered with 1, 2 and 3 replicas, and
//! how long after the leader a standby delivers a deployment's events.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use corbel::client::{Api, Subscription};
use serde_json::{Value, json};

use super::{TOKEN, blueprint, cluster_of, deploy, gql, leader_pid, noop_blueprint};

/// Clients sending queries at once, spread over the replicas.
const CLIENTS: usize = 16;
const READING: Duration = Duration::from_secs(5);

/// Queries per second over `READING`, with 1, 2 and 3 replicas, each query
/// a page of deployments with their nodes (20 deployments of 10 stored).
pub async fn queries(bin: &std::path::Path, server: &str, fixture_url: &str) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut one = None;
    for n in 1..=3 {
        let cluster = cluster_of(n, bin, server, fixture_url).await;
        let http = reqwest::Client::new();
        let urls: Vec<String> = cluster.replicas.iter().map(|r| r.url.clone()).collect();
        let id = blueprint(&http, &urls[0], "ten", &noop_blueprint(10, false)).await;
        for d in 0..20 {
            deploy(&http, &urls[0], &id, &format!("ten-{d}")).await;
        }
        let answered = Arc::new(AtomicU64::new(0));
        let began = Instant::now();
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (http, url, answered) = (http.clone(), urls[c % n].clone(), answered.clone());
                tokio::spawn(async move {
                    while began.elapsed() < READING {
                        gql(
                            &http,
                            &url,
                            "{ deployments(first: 20) { nodes { id state nodes { key state } } } }",
                            json!({}),
                        )
                        .await;
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for client in clients {
            client.await.unwrap();
        }
        let qps = answered.load(Ordering::Relaxed) as f64 / began.elapsed().as_secs_f64();
        let ratio = one.map_or(String::new(), |one: f64| format!(", {:.2}× one", qps / one));
        one.get_or_insert(qps);
        println!(
            "reads: {n} replica(s), {CLIENTS} clients: {qps:.0} queries/s{ratio} \
             (goal with ≥ 8 cores: 3 replicas ≥ 2.5× one; this machine has {cores})"
        );
    }
}

/// Each event's delay on a standby after the leader delivered it: both
/// follow one 300-link chain's `deploymentEvents` live; p50, p95, max.
pub async fn first_event(bin: &std::path::Path, server: &str, fixture_url: &str) {
    let cluster = cluster_of(2, bin, server, fixture_url).await;
    let http = reqwest::Client::new();
    let urls: Vec<String> = cluster.replicas.iter().map(|r| r.url.clone()).collect();
    let leader = leader_pid(&http, &urls[0]).await.expect("a leader");
    let leading = cluster
        .replicas
        .iter()
        .position(|r| u64::from(r.child.id()) == leader)
        .expect("the leader is ours");
    let (leader_url, standby_url) = (urls[leading].clone(), urls[1 - leading].clone());
    let chain = blueprint(&http, &leader_url, "chain", &noop_blueprint(300, true)).await;
    let id = deploy(&http, &leader_url, &chain, "chain-1").await;
    let on_leader = tokio::spawn(arrivals(leader_url, id.clone()));
    let on_standby = tokio::spawn(arrivals(standby_url, id));
    let (leader, standby) = (on_leader.await.unwrap(), on_standby.await.unwrap());
    // Only what both followed live: past everything either had when both
    // had their first event.
    let both_from = leader[0].1.max(standby[0].1);
    let replayed = leader
        .iter()
        .chain(&standby)
        .filter(|(_, at)| *at <= both_from)
        .map(|(id, _)| *id)
        .max()
        .unwrap_or(0);
    let mut delays: Vec<Duration> = standby
        .iter()
        .filter(|(id, _)| *id > replayed)
        .filter_map(|(id, at)| {
            let first = leader.iter().find(|(seen, _)| seen == id)?.1;
            Some(at.saturating_duration_since(first))
        })
        .collect();
    delays.sort();
    let at = |q: f64| delays[((delays.len() - 1) as f64 * q) as usize].as_secs_f64() * 1000.0;
    println!(
        "first event on a standby after the leader: {} events followed live, p50 {:.1} ms, \
         p95 {:.1} ms (goal < 50), max {:.1} ms",
        delays.len(),
        at(0.5),
        at(0.95),
        at(1.0)
    );
}

/// Every event id of `id`'s history and live events, with when it arrived,
/// until the deployment is COMPLETE.
async fn arrivals(url: String, id: String) -> Vec<(i64, Instant)> {
    let api = Api::new(&url, Some(TOKEN.to_owned())).unwrap();
    let mut events = Subscription::start(
        &api,
        "subscription($id: ID!) { deploymentEvents(id: $id) { id kind state } }",
        json!({ "id": id }),
    )
    .await
    .expect("deploymentEvents");
    let mut seen = Vec::new();
    while let Ok(Some(event)) = events.next().await {
        let event: &Value = &event["deploymentEvents"];
        let at = Instant::now();
        seen.push((event["id"].as_str().unwrap().parse().unwrap(), at));
        if event["kind"] == "STATE" && event["state"] == "COMPLETE" {
            break;
        }
    }
    events.close().await;
    seen
}
