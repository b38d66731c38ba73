//! The `abuse` bench's websocket phases (issue 38): an anonymous
//! introspection flood, 10,000 subscriptions on one socket, 300 sockets that
//! never read. Each runs for a phase while [`Watch`] measures the server.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::SinkExt;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::attacks::{INTROSPECTION, large_answer};
use crate::common::Server;
use crate::websocket::{connect, init, never_reading as reads_nothing, next_json, send};
use crate::{ADMIN_TOKEN, Answers, PHASE, Watch, code_of};

/// Anonymous sockets in the flood, and the introspections each keeps asked.
const FLOOD_SOCKETS: usize = 8;
const IN_FLIGHT: usize = 3;
const SUBSCRIBES: usize = 10_000;
/// `ws_max_subscriptions`' default: the rest are refused.
const LIVE: usize = 100;
const NEVER_READING: usize = 300;
/// Loopback addresses the never-reading sockets come from: 60 each, under
/// `ws_max_sockets_per_address` (64).
const ADDRESSES: usize = 5;

/// Lets what the previous phase left settle before the next is measured.
pub async fn settle() {
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Anonymous graphql-transport-ws sockets asking introspections back to back.
pub async fn anonymous_flood(server: &Server) {
    settle().await;
    let addr: SocketAddr = server.addr.parse().expect("an address");
    let watch = Watch::start(server);
    let answers = Answers::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut sockets = Vec::new();
    for _ in 0..FLOOD_SOCKETS {
        let (stop, answers) = (stop.clone(), answers.clone());
        sockets.push(tokio::spawn(async move {
            let mut ws = connect(addr, "graphql-transport-ws").await;
            init(&mut ws, json!({})).await;
            let mut id = 0;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..IN_FLIGHT {
                    let payload = json!({"query": INTROSPECTION});
                    let message =
                        json!({"id": id.to_string(), "type": "subscribe", "payload": payload});
                    send(&mut ws, message).await;
                    id += 1;
                }
                let mut answered = 0;
                while answered < IN_FLIGHT {
                    let Some(message) = next_json(&mut ws).await else {
                        answers.count("socket closed");
                        return;
                    };
                    match message["type"].as_str() {
                        Some("next") if message["payload"]["data"]["__schema"].is_object() => {
                            answers.count("ok");
                        }
                        Some("next" | "error") => {
                            answers.count(code_of(&message["payload"].to_string()));
                        }
                        _ => continue,
                    }
                    answered += 1;
                }
            }
        }));
    }
    tokio::time::sleep(PHASE).await;
    stop.store(true, Ordering::Relaxed);
    for socket in sockets {
        if socket.await.is_err() {
            answers.count("client gave up (no answer in 10 s)");
        }
    }
    let what = format!(
        "{FLOOD_SOCKETS} sockets, {IN_FLIGHT} introspections asked at a time each; {}",
        answers.summary()
    );
    watch.finish("ws: anonymous introspection flood", &what);
}

/// One signed-in socket sends 10,000 `subscribe`s to `serverEvents` and reads
/// the 9,900 refusals; again on a new socket until the phase is over.
pub async fn many_subscriptions(server: &Server) {
    settle().await;
    let addr: SocketAddr = server.addr.parse().expect("an address");
    let events = "subscription { serverEvents { __typename ... on ApiTokenCreated { name } } }";
    let watch = Watch::start(server);
    let started = Instant::now();
    let (mut rounds, mut slowest, mut other, mut closed) = (0, Duration::ZERO, 0, 0);
    while started.elapsed() < PHASE {
        let round = Instant::now();
        let mut ws = connect(addr, "graphql-transport-ws").await;
        let token = json!({"Authorization": format!("Bearer {ADMIN_TOKEN}")});
        init(&mut ws, token).await;
        for i in 0..SUBSCRIBES {
            let message =
                json!({"id": i.to_string(), "type": "subscribe", "payload": {"query": events}});
            let message = Message::Text(message.to_string().into());
            ws.feed(message).await.expect("the socket takes it");
        }
        ws.flush().await.expect("the socket takes it");
        let mut refused = 0;
        while refused < SUBSCRIBES - LIVE {
            let Some(message) = next_json(&mut ws).await else {
                closed += 1;
                break;
            };
            if message["type"] == "error" {
                let limit = &message["payload"][0]["extensions"]["limit"];
                if limit == "graphql.ws_max_subscriptions" {
                    refused += 1;
                } else {
                    other += 1;
                }
            }
        }
        let _ = ws.close(None).await;
        rounds += 1;
        slowest = slowest.max(round.elapsed());
    }
    let what = format!(
        "{rounds} rounds of {SUBSCRIBES} subscribes on a new socket, {} refused each \
         (ws_max_subscriptions), slowest round {:.0} ms; other errors: {other}; sockets closed by the server: {closed}",
        SUBSCRIBES - LIVE,
        slowest.as_secs_f64() * 1000.0
    );
    watch.finish("ws: 10,000 subscriptions on one socket", &what);
}

/// 300 signed-in sockets ask for large answers and read nothing: each sends
/// `LIVE` queries at once, then one every 100 ms, until the server cuts it
/// off (a send fails) or the phase is over.
pub async fn never_reading(server: &Server) {
    settle().await;
    let addr: SocketAddr = server.addr.parse().expect("an address");
    let query = large_answer();
    let answer = reqwest::Client::new()
        .post(format!("http://{addr}/graphql"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"query": query}))
        .send()
        .await
        .expect("an answer")
        .bytes()
        .await
        .expect("its body");
    let watch = Watch::start(server);
    let (cut, sent) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let mut sockets = Vec::new();
    for i in 0..NEVER_READING {
        let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (i % ADDRESSES) as u8));
        let (stop, cut, sent) = (stop.clone(), cut.clone(), sent.clone());
        let query = query.clone();
        let subscribe = move |id: usize| {
            let payload = json!({"query": query});
            let message = json!({"id": id.to_string(), "type": "subscribe", "payload": payload});
            Message::Text(message.to_string().into())
        };
        sockets.push(tokio::spawn(async move {
            let mut ws = reads_nothing(addr, from).await;
            let mut id = 0;
            while !stop.load(Ordering::Relaxed) {
                let sending = ws.send(subscribe(id));
                match tokio::time::timeout(Duration::from_secs(1), sending).await {
                    Ok(Ok(())) => {}
                    // Cut off: the server closed the socket.
                    Ok(Err(_)) => {
                        cut.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    // The server does not take more: wait for the phase's end.
                    Err(_) => break,
                }
                sent.fetch_add(1, Ordering::Relaxed);
                id += 1;
                if id >= LIVE {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            ws
        }));
    }
    tokio::time::sleep(PHASE).await;
    stop.store(true, Ordering::Relaxed);
    let mut open = Vec::new();
    for socket in sockets {
        open.push(socket.await.expect("a socket"));
    }
    let what = format!(
        "{NEVER_READING} sockets from {ADDRESSES} addresses, answers of {} KB each: \
         {} queries sent, {} sockets cut off by the phase's end",
        answer.len() / 1000,
        sent.load(Ordering::Relaxed),
        cut.load(Ordering::Relaxed)
    );
    // Measured while the sockets are still open: what they hold is counted.
    watch.finish("ws: 300 sockets that never read", &what);
    drop(open);
}
