//! What a client of a replica sees across a failover: a deployment's
//! events and `serverEvents` followed on a standby, every event counted;
//! a server's own count of the GraphQL requests it answered.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use corbel::client::Api as ClientApi;
use corbel::client::Subscription;
use serde_json::json;
use tokio::time::Instant;

use super::observe::Api;

/// The ids of the deployment's stored events.
pub(super) async fn stored_events(api: &Api, id: &str) -> Vec<i64> {
    let data = api
        .gql(
            "query($id: ID!) { deployment(id: $id) { events(first: 10000) { id } } }",
            json!({ "id": id }),
        )
        .await
        .expect("the history reads");
    data["deployment"]["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| e["id"].as_str().unwrap().parse().unwrap())
        .collect()
}

/// Follows `id` as a client would across a failover: subscribes, and when
/// the socket ends subscribes again with `after:` the last event seen, until
/// the run's end. Every event id received, in order; `sockets` counts the
/// subscriptions made so far.
pub(super) async fn follow(
    api: ClientApi,
    id: String,
    sockets: Arc<AtomicUsize>,
) -> Result<Vec<i64>, String> {
    const QUERY: &str = "subscription($id: ID!, $after: ID) { \
        deploymentEvents(id: $id, after: $after) { id kind state } }";
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut seen: Vec<i64> = Vec::new();
    while Instant::now() < deadline {
        let after = seen.last().map(|last| last.to_string());
        let mut subscription =
            match Subscription::start(&api, QUERY, json!({ "id": id, "after": after })).await {
                Ok(s) => s,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
        sockets.fetch_add(1, Ordering::SeqCst);
        while let Ok(Some(event)) = subscription.next().await {
            let event = &event["deploymentEvents"];
            seen.push(event["id"].as_str().unwrap_or("0").parse().unwrap_or(0));
            if event["kind"] == "STATE" && event["state"] == "COMPLETE" {
                subscription.close().await;
                return Ok(seen);
            }
        }
    }
    Err(format!(
        "no COMPLETE within 180 s; {} events seen on {} sockets",
        seen.len(),
        sockets.load(Ordering::SeqCst)
    ))
}

/// `seen` (what a follower received, to the run's end) is every `stored`
/// event up to its last, once, in order.
pub(super) fn assert_followed(seen: &[i64], stored: &[i64]) {
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "events in order, none twice: {seen:?}"
    );
    let seen_set: BTreeSet<i64> = seen.iter().copied().collect();
    let last = seen.last().copied().unwrap_or_default();
    let missed: Vec<&i64> = stored
        .iter()
        .filter(|e| **e <= last && !seen_set.contains(e))
        .collect();
    assert!(
        missed.is_empty(),
        "events missed across the failover: {missed:?}"
    );
}

/// GraphQL requests a server has answered, from its `/metrics`.
pub(super) async fn requests(addr: std::net::SocketAddr) -> f64 {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics");
    text.lines()
        .filter(|line| line.starts_with(corbel::telemetry::GRAPHQL_REQUESTS))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `serverEvents` held on a standby through the failover: it must stay
/// open, and tell of the run's end.
pub(super) struct ServerEvents {
    task: tokio::task::JoinHandle<Result<usize, String>>,
}

impl ServerEvents {
    pub(super) async fn follow(api: ClientApi, id: &str) -> ServerEvents {
        const QUERY: &str = "subscription { serverEvents { __typename \
            ... on DeploymentChanged { deploymentId state } } }";
        let mut subscription = Subscription::start(&api, QUERY, json!({}))
            .await
            .expect("serverEvents on a standby");
        let id = id.to_owned();
        let task = tokio::spawn(async move {
            let mut events = 0;
            loop {
                match subscription.next().await {
                    Ok(Some(event)) => {
                        events += 1;
                        let changed = &event["serverEvents"];
                        if changed["deploymentId"] == id.as_str() && changed["state"] == "COMPLETE"
                        {
                            subscription.close().await;
                            return Ok(events);
                        }
                    }
                    ended => {
                        return Err(format!(
                            "serverEvents ended after {events} events: {ended:?}"
                        ));
                    }
                }
            }
        });
        ServerEvents { task }
    }

    pub(super) async fn finish(self) {
        let told = tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("serverEvents told of the run's end")
            .unwrap();
        let events = told.expect("serverEvents stayed open through the failover");
        println!("replicas: serverEvents on a standby: {events} events, one socket");
    }
}
