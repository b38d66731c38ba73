//! Websockets under the same bounds as HTTP (issue 38): anonymous operations
//! take the anonymous gate, size, deadline and response limits; a socket
//! holds at most `ws_max_subscriptions` live operations, an address at most
//! `ws_max_sockets_per_address` sockets; a client that does not read is cut
//! off. `/healthz` keeps answering and the server's memory stays bounded.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::support::attacks::{INTROSPECTION, large_answer};
use crate::support::websocket::{Ws, connect, init, never_reading, next_json, send};
use crate::support::{ADMIN_TOKEN, TestApp, TestStore, error_code, eventually};

/// An anonymous `graphql-transport-ws` socket, acked.
async fn anonymous(app: &TestApp) -> Ws {
    let mut ws = connect(app.addr, "graphql-transport-ws").await;
    init(&mut ws, json!({})).await;
    ws
}

/// A `graphql-transport-ws` socket signed in as the admin, acked.
async fn admin(app: &TestApp) -> Ws {
    let mut ws = connect(app.addr, "graphql-transport-ws").await;
    init(
        &mut ws,
        json!({"Authorization": format!("Bearer {ADMIN_TOKEN}")}),
    )
    .await;
    ws
}

async fn subscribe(ws: &mut Ws, id: &str, query: &str) {
    let message = json!({"id": id, "type": "subscribe", "payload": {"query": query}});
    send(ws, message).await;
}

/// The `next` payload for `id` (skipping its `complete`), or the `error`
/// message's first error.
async fn answer(ws: &mut Ws) -> (String, Value) {
    loop {
        let message = next_json(ws).await.expect("an answer before the close");
        let id = message["id"].as_str().unwrap_or_default().to_owned();
        match message["type"].as_str() {
            Some("next") => return (id, message["payload"].clone()),
            Some("error") => return (id, json!({"errors": message["payload"]})),
            _ => continue,
        }
    }
}

fn limit(body: &Value) -> &str {
    body["errors"][0]["extensions"]["limit"]
        .as_str()
        .unwrap_or_default()
}

/// This process's resident memory (the server runs in it), in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Asks `/healthz` until `work` is done; the slowest answer.
async fn healthz_while<T>(app: &TestApp, work: tokio::task::JoinHandle<T>) -> (T, Duration) {
    let mut slowest = Duration::ZERO;
    while !work.is_finished() {
        let asked = Instant::now();
        let health = app.client.get(app.url("/healthz")).send().await.unwrap();
        assert_eq!(health.status(), 200);
        slowest = slowest.max(asked.elapsed());
    }
    (work.await.unwrap(), slowest)
}

// Two workers, as a small server has: one busy with the flood, one for `/healthz`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_websocket_floods_are_bounded_like_http() {
    let app = Arc::new(TestApp::spawn().await);
    // 1,500 fields: over the anonymous size limit, as over HTTP.
    let wide: String = (0..1500).map(|i| format!("a{i}: __typename ")).collect();
    let wide = format!("{{ {wide} }}");
    let over_http = app.gql_as(None, &wide, json!({})).await;
    assert_eq!(limit(&over_http), "graphql.anonymous_max_query_size");

    let flood = {
        let app = app.clone();
        tokio::spawn(async move {
            let mut answers = Vec::new();
            let mut sockets = Vec::new();
            for _ in 0..4 {
                let mut ws = anonymous(&app).await;
                for i in 0..3 {
                    subscribe(&mut ws, &format!("i{i}"), INTROSPECTION).await;
                }
                subscribe(&mut ws, "wide", &wide).await;
                subscribe(&mut ws, "me", "{ me { username } }").await;
                sockets.push(ws);
            }
            for ws in &mut sockets {
                for _ in 0..5 {
                    answers.push(answer(ws).await);
                }
            }
            answers
        })
    };
    let (answers, slowest) = healthz_while(&app, flood).await;
    for (id, body) in &answers {
        match id.as_str() {
            "wide" => {
                assert_eq!(error_code(body), Some("LIMIT_EXCEEDED"), "{body}");
                assert_eq!(limit(body), "graphql.anonymous_max_query_size");
            }
            "me" => assert_eq!(error_code(body), Some("UNAUTHENTICATED"), "{body}"),
            _ => assert!(body["data"]["__schema"]["types"].is_array(), "{body}"),
        }
    }
    assert_eq!(answers.len(), 20);
    // The issue's figure: /healthz held for 10 s by four such sockets. Its
    // goal, under 100 ms, is what a release build on idle cores shows; a
    // debug build on shared cores gets the bound `limits.rs` uses.
    eprintln!("slowest /healthz during the flood: {slowest:?}");
    assert!(
        slowest < Duration::from_secs(2),
        "/healthz took {slowest:?}"
    );
}

#[tokio::test]
async fn anonymous_websocket_operations_take_the_anonymous_size_and_deadline() {
    let store = Arc::new(TestStore::fresh().await);
    let app = TestApp::spawn_with(store, |c| {
        c.graphql.anonymous_max_response_bytes = 4096;
        c.graphql.anonymous_request_timeout = Duration::from_millis(10);
        c.login.user_burst = 1000;
        c.login.address_burst = 1000;
    })
    .await;
    let mut ws = anonymous(&app).await;
    subscribe(&mut ws, "1", INTROSPECTION).await;
    let (_, body) = answer(&mut ws).await;
    assert_eq!(error_code(&body), Some("LIMIT_EXCEEDED"), "{body}");
    assert_eq!(limit(&body), "graphql.anonymous_max_response_bytes");

    // Failed logins cost an argon2 hash each and pass the anonymous gate one
    // at a time: three at once run past 10 ms.
    let login = "mutation { login(username: \"admin\", password: \"wrong password\") { token } }";
    for id in ["a", "b", "c"] {
        subscribe(&mut ws, id, login).await;
    }
    let mut timeouts = 0;
    for _ in 0..3 {
        let (_, body) = answer(&mut ws).await;
        if error_code(&body) == Some("TIMEOUT") {
            let message = body["errors"][0]["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("graphql.anonymous_request_timeout_ms"),
                "{body}"
            );
            timeouts += 1;
        }
    }
    assert!(timeouts >= 1, "no login ran past the anonymous deadline");

    // Signed in, the limits are the higher ones.
    let mut ws = admin(&app).await;
    subscribe(&mut ws, "1", INTROSPECTION).await;
    let (_, body) = answer(&mut ws).await;
    assert!(body["data"]["__schema"]["types"].is_array(), "{body}");
}

#[tokio::test]
async fn ten_thousand_subscriptions_on_one_socket_stop_at_the_limit() {
    let app = TestApp::spawn().await;
    let mut ws = admin(&app).await;
    let before = rss();
    let events = "subscription { serverEvents { __typename ... on ApiTokenCreated { name } } }";
    let started = Instant::now();
    for i in 0..10_000 {
        let message =
            json!({"id": i.to_string(), "type": "subscribe", "payload": {"query": events}});
        ws.feed(Message::Text(message.to_string().into()))
            .await
            .unwrap();
    }
    ws.flush().await.unwrap();
    let mut refused = 0;
    while refused < 9_900 {
        let message = next_json(&mut ws).await.expect("the socket stays open");
        assert_eq!(message["type"], "error", "{message}");
        let body = json!({"errors": message["payload"]});
        assert_eq!(limit(&body), "graphql.ws_max_subscriptions", "{body}");
        let id: usize = message["id"].as_str().unwrap().parse().unwrap();
        assert!(id >= 100, "subscription {id} was within the limit");
        refused += 1;
    }
    let grown = rss().saturating_sub(before);
    eprintln!(
        "10,000 subscribes answered in {:?}; RSS grew by {} KiB",
        started.elapsed(),
        grown / 1024
    );
    assert!(grown < 100 * 1024 * 1024, "RSS grew by {grown} bytes");

    // The hundred are live: each sees the next event.
    app.gql(
        "mutation { createApiToken(name: \"ws-limit\") { token } }",
        json!({}),
    )
    .await;
    for _ in 0..100 {
        let message = next_json(&mut ws).await.expect("an event");
        assert_eq!(message["type"], "next", "{message}");
        assert_eq!(
            message["payload"]["data"]["serverEvents"]["name"],
            "ws-limit"
        );
    }
    // One ended makes room for another.
    send(&mut ws, json!({"id": "0", "type": "complete"})).await;
    subscribe(&mut ws, "again", "{ me { username } }").await;
    let (id, body) = answer(&mut ws).await;
    assert_eq!(id, "again");
    assert_eq!(body["data"]["me"]["username"], "admin", "{body}");
}

// Two workers, as a small server has: one busy with the socket, one for `/healthz`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_that_never_read_are_cut_off() {
    let store = Arc::new(TestStore::fresh().await);
    // One socket per address: the never-reading one's place is free again
    // once the server has cut it off, which the test watches for.
    let app = TestApp::spawn_with(store, |c| {
        c.graphql.ws_send_queue_bytes = 64 * 1024;
        c.graphql.ws_max_sockets_per_address = 1;
        c.graphql.ws_send_stall = Duration::from_secs(1);
    })
    .await;
    // Each answer describes the mutations, four times over: a small
    // document, a large answer (36 KB); 150 of them (5 MiB) are more than
    // the socket buffers (the kernel would take 4 MiB on loopback, the
    // server bounds it to 128 KiB) and the queue hold.
    let query = large_answer();
    const SENT: usize = 150;
    let before = rss();
    let mut ws = never_reading(app.addr, app.addr.ip()).await;
    for i in 0..SENT {
        let message =
            json!({"id": i.to_string(), "type": "subscribe", "payload": {"query": query}});
        ws.send(Message::Text(message.to_string().into()))
            .await
            .unwrap();
    }
    let mut request = format!("ws://{}/graphql/ws", app.addr)
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    let slowest = Arc::new(std::sync::Mutex::new(Duration::ZERO));
    eventually(Duration::from_secs(60), "the socket to be cut off", || {
        let (app, request, slowest) = (&app, request.clone(), slowest.clone());
        async move {
            let asked = Instant::now();
            let health = app.client.get(app.url("/healthz")).send().await.unwrap();
            assert_eq!(health.status(), 200);
            let took = asked.elapsed();
            {
                let mut slowest = slowest.lock().unwrap();
                *slowest = (*slowest).max(took);
            }
            tokio_tungstenite::connect_async(request).await.ok()
        }
    })
    .await;
    let slowest = *slowest.lock().unwrap();
    // What reached the client before the cut: not everything asked for.
    let mut answers = 0;
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(message)) = ws.next().await {
            match message {
                // Answers; the `subscribe`s past `ws_max_subscriptions` are
                // refused with errors.
                Message::Text(text) if text.starts_with(r#"{"type":"next""#) => answers += 1,
                Message::Close(_) => break,
                _ => {}
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the socket is still open after {answers} answers"
    );
    // Only what the buffers took was computed: the rest waited for the
    // client to read, and was never run (a send buffer left to grow takes
    // about a hundred).
    assert!(
        answers <= 8,
        "{answers} answers were delivered of {SENT} asked"
    );
    let grown = rss().saturating_sub(before);
    assert!(grown < 100 * 1024 * 1024, "RSS grew by {grown} bytes");
    // Under 100 ms in a release build; see the flood's test for the bound.
    eprintln!("slowest /healthz while cut off: {slowest:?}");
    assert!(
        slowest < Duration::from_secs(2),
        "/healthz took {slowest:?}"
    );
}

#[tokio::test]
async fn a_client_that_asks_much_at_once_and_reads_gets_every_answer() {
    let app = TestApp::spawn().await;
    let mut ws = admin(&app).await;
    let query = large_answer();
    const ASKED: usize = 60;
    // 2 MB of answers asked at once: far past what may wait unsent before the
    // next operation starts, so most wait for the client to read.
    for i in 0..ASKED {
        subscribe(&mut ws, &i.to_string(), &query).await;
    }
    let mut answered = std::collections::BTreeSet::new();
    while answered.len() < ASKED {
        let (id, body) = answer(&mut ws).await;
        assert!(body["data"]["a"]["fields"].is_array(), "{body}");
        answered.insert(id.parse::<usize>().unwrap());
    }
    assert_eq!(answered, (0..ASKED).collect());
}

/// Whether a socket from `from` is let in (the address's one place is free).
async fn let_in_from(addr: SocketAddr, from: IpAddr) -> bool {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind((from, 0).into()).unwrap();
    let Ok(stream) = socket.connect(addr).await else {
        return false;
    };
    let mut request = format!("ws://{addr}/graphql/ws")
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    tokio_tungstenite::client_async(request, stream)
        .await
        .is_ok()
}

// Two workers, as a small server has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_reading_sockets_are_cut_off_and_a_reader_is_not() {
    const NEVER: u8 = 6;
    let store = Arc::new(TestStore::fresh().await);
    // Each socket may queue 4 MiB (the default), all together 512 KiB: a
    // socket is cut off once it is behind by its share of the total, or once
    // its operations waited a second for it to read. One socket per address:
    // a place free again says the server cut its socket off.
    let app = Arc::new(
        TestApp::spawn_with(store, |c| {
            c.graphql.ws_send_queue_total_bytes = 512 * 1024;
            c.graphql.ws_max_sockets_per_address = 1;
            c.graphql.ws_send_stall = Duration::from_secs(1);
        })
        .await,
    );
    let query = large_answer();
    let stop = Arc::new(AtomicBool::new(false));
    let from = |i: u8| IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + i));
    let mut never = Vec::new();
    for i in 0..NEVER {
        let (addr, query, stop) = (app.addr, query.clone(), stop.clone());
        never.push(tokio::spawn(async move {
            let mut ws = never_reading(addr, from(i)).await;
            // `ws_max_subscriptions` at once, then one every 20 ms as the
            // server answers, until it cuts the socket off or the test ends.
            let mut pace = tokio::time::interval(Duration::from_millis(20));
            let mut id = 0;
            while !stop.load(Ordering::Relaxed) {
                if id >= 100 {
                    pace.tick().await;
                }
                let payload = json!({"query": query});
                let message =
                    json!({"id": id.to_string(), "type": "subscribe", "payload": payload});
                let sending = ws.send(Message::Text(message.to_string().into()));
                match tokio::time::timeout(Duration::from_secs(1), sending).await {
                    Ok(Ok(())) => id += 1,
                    _ => break,
                }
            }
        }));
    }
    // A client that reads: one large answer after another, all answered.
    let reader = {
        let (app, query) = (app.clone(), query.clone());
        tokio::spawn(async move {
            let mut ws = admin(&app).await;
            for i in 0..5 {
                subscribe(&mut ws, &i.to_string(), &query).await;
                let (id, body) = answer(&mut ws).await;
                assert_eq!(id, i.to_string());
                assert!(body["data"]["a"]["fields"].is_array(), "{body}");
            }
            ws
        })
    };
    let uncut = std::sync::Mutex::new((0..NEVER).map(from).collect::<Vec<_>>());
    let slowest = std::sync::Mutex::new(Duration::ZERO);
    eventually(
        Duration::from_secs(60),
        "every never-reading socket cut off",
        || {
            let (app, uncut, slowest) = (&app, &uncut, &slowest);
            async move {
                let asked = Instant::now();
                let health = app.client.get(app.url("/healthz")).send().await.unwrap();
                assert_eq!(health.status(), 200);
                let took = asked.elapsed();
                {
                    let mut slowest = slowest.lock().unwrap();
                    *slowest = (*slowest).max(took);
                }
                let left = uncut.lock().unwrap().clone();
                let mut still = Vec::new();
                for from in left {
                    if !let_in_from(app.addr, from).await {
                        still.push(from);
                    }
                }
                let done = still.is_empty();
                *uncut.lock().unwrap() = still;
                done.then_some(())
            }
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut ws = reader.await.unwrap();
    for socket in never {
        socket.await.unwrap();
    }
    // The reader was not cut off: it is answered still.
    subscribe(&mut ws, "after", "{ me { username } }").await;
    let (id, body) = answer(&mut ws).await;
    assert_eq!(id, "after");
    assert_eq!(body["data"]["me"]["username"], "admin", "{body}");
    let slowest = *slowest.lock().unwrap();
    eprintln!("slowest /healthz while the sockets were cut off: {slowest:?}");
    assert!(
        slowest < Duration::from_secs(2),
        "/healthz took {slowest:?}"
    );
}

#[tokio::test]
async fn an_address_holds_at_most_its_sockets() {
    let store = Arc::new(TestStore::fresh().await);
    let app = TestApp::spawn_with(store, |c| c.graphql.ws_max_sockets_per_address = 3).await;
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(anonymous(&app).await);
    }
    let mut request = format!("ws://{}/graphql/ws", app.addr)
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    let refused = tokio_tungstenite::connect_async(request.clone()).await;
    let Err(tokio_tungstenite::tungstenite::Error::Http(response)) = refused else {
        panic!("a fourth socket was accepted");
    };
    assert_eq!(response.status(), 429);
    let body: Value = serde_json::from_slice(response.body().as_deref().unwrap()).unwrap();
    assert_eq!(limit(&body), "graphql.ws_max_sockets_per_address", "{body}");
    assert_eq!(error_code(&body), Some("LIMIT_EXCEEDED"));

    // A socket closed gives its place back.
    let mut first = open.remove(0);
    first.close(None).await.unwrap();
    while first.next().await.is_some() {}
    let mut ws = eventually(Duration::from_secs(5), "a place for a socket", || {
        let request = request.clone();
        async move { tokio_tungstenite::connect_async(request).await.ok() }
    })
    .await
    .0;
    init(&mut ws, json!({})).await;
}
