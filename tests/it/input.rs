//! Input from outside Corbel on the real server: YAML bombs through
//! `createBlueprint` and through a COPY sync (memory stays bounded, the other
//! elements still sync), a source that trickles bytes (stopped at the sync's
//! deadline, the repository usable after), and credentials in URLs (never in an
//! answer or a log line).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::binary::{serve, terminate};
use crate::support::nginx::Nginx;
use crate::support::repositories::{
    create_id, element_ids, invalid_elements, put_element, settled, write_inventory,
};
use crate::support::{ADMIN_TOKEN, TestApp, TestStore, data, eventually};

/// The process's peak resident memory so far (`VmHWM`), in bytes. The server
/// runs in this process, and nextest gives each test its own process.
pub(crate) fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM in /proc/self/status");
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("a number of kB");
    kb * 1024
}

/// How much the peak may grow while a bomb is refused. Expanded, the bombs
/// below are 300 MB of strings before any copy is made.
pub(crate) const PEAK_GROWTH_LIMIT: u64 = 100 * 1024 * 1024;

/// A 100 KB string anchored once and used 3,000 times: about 300 KB of text,
/// 300 MB expanded.
fn alias_bomb(head: &str) -> String {
    let big = "x".repeat(100 * 1024);
    let uses = vec!["*big"; 3000].join(", ");
    format!("{head}padding: &big \"{big}\"\nbomb: [{uses}]\n")
}

#[tokio::test]
async fn yaml_bombs_through_create_blueprint_are_refused_with_memory_bounded() {
    let app = TestApp::spawn().await;
    let before = peak_rss();
    let mutation =
        "mutation($input: CreateBlueprintInput!) { createBlueprint(input: $input) { id } }";
    let body = app
        .gql(
            mutation,
            json!({"input": {"name": "bomb", "source": alias_bomb("version: \"1\"\n")}}),
        )
        .await;
    let message = body["errors"][0]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("blueprint: YAML too large after alias expansion")
            && message.contains("over the limit of"),
        "{body}"
    );
    let growth = peak_rss().saturating_sub(before);
    assert!(
        growth < PEAK_GROWTH_LIMIT,
        "peak RSS grew by {growth} bytes"
    );

    // 200 KB of nested `[`: refused as too deep (libyaml spends seconds on it).
    let body = app
        .gql(
            mutation,
            json!({"input": {"name": "deep", "source": "[".repeat(200_000)}}),
        )
        .await;
    let message = body["errors"][0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("blueprint: YAML too deep"), "{body}");

    // The server still takes a good blueprint.
    let body = app
        .gql(
            mutation,
            json!({"input": {"name": "fine", "source": "version: \"1\"\nresources: {}\n"}}),
        )
        .await;
    assert!(data(&body)["createBlueprint"]["id"].is_string(), "{body}");
}

#[tokio::test]
async fn an_alias_bomb_manifest_is_refused_in_a_copy_sync_and_the_rest_syncs() {
    let served = tempfile::tempdir().unwrap();
    let root = served.path();
    let a = put_element(root, "alpha", "1.0.0", json!({}), &[]);
    let b = put_element(root, "beta", "1.0.0", json!({}), &[]);
    let bomb = put_element(root, "bomb", "1.0.0", json!({}), &[]);
    std::fs::write(
        root.join("bomb/1.0.0/manifests/bomb.yaml"),
        alias_bomb("name: bomb\nversion: 1.0.0\nresources: {}\n"),
    )
    .unwrap();
    write_inventory(root, &[a, b, bomb]);
    let nginx = Nginx::start(root);
    let app = TestApp::spawn().await;

    let before = peak_rss();
    let id = create_id(
        &app,
        json!({"name": "bombed", "driver": {"http": {"url": nginx.url()}}, "syncMode": "COPY"}),
    )
    .await;
    // The bomb is one invalid element; the repository is not in error.
    let repo = settled(&app, &id, "ACTIVE").await;
    assert_eq!(
        repo.status_message.as_deref(),
        Some("3 elements, 1 invalid"),
        "{repo:?}"
    );
    let invalid = invalid_elements(&app, &id).await;
    assert_eq!(invalid.len(), 1, "{invalid:?}");
    assert_eq!(invalid[0]["path"], "bomb/1.0.0/manifests/bomb.yaml");
    assert!(
        invalid[0]["message"]
            .as_str()
            .unwrap()
            .contains("bomb/1.0.0/manifests/bomb.yaml: YAML too large after alias expansion"),
        "{invalid:?}"
    );
    let growth = peak_rss().saturating_sub(before);
    assert!(
        growth < PEAK_GROWTH_LIMIT,
        "peak RSS grew by {growth} bytes"
    );

    // The other elements' manifests were stored all the same.
    let ids = element_ids(&app, &id).await;
    for key in ["alpha 1.0.0", "beta 1.0.0"] {
        let body = app
            .gql(
                "query($id: ID!) { element(id: $id) { manifest } }",
                json!({"id": ids[key]}),
            )
            .await;
        let manifest = &data(&body)["element"]["manifest"];
        assert_eq!(manifest["name"], key.split(' ').next().unwrap(), "{body}");
    }
}

/// A repository source on a real socket. Slow: answers the inventory with a
/// long body, one byte every 100 ms (each well inside the idle deadline).
/// Otherwise: an empty inventory at once.
async fn trickling_source(slow: Arc<AtomicBool>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let slow = slow.clone();
            tokio::spawn(async move {
                let mut request = vec![0u8; 4096];
                let _ = socket.read(&mut request).await;
                if slow.load(Ordering::SeqCst) {
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{\"elements\": {";
                    if socket.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let mut tick = tokio::time::interval(Duration::from_millis(100));
                    loop {
                        tick.tick().await;
                        if socket.write_all(b" ").await.is_err() {
                            return;
                        }
                    }
                } else {
                    let body = "{\"elements\": {}}";
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn a_trickling_source_is_stopped_at_the_sync_deadline() {
    let slow = Arc::new(AtomicBool::new(true));
    let port = trickling_source(slow.clone()).await;
    let store = Arc::new(TestStore::fresh().await);
    let app = TestApp::spawn_with(store, |c| {
        c.repository.sync_deadline = Duration::from_secs(2);
    })
    .await;
    let id = create_id(
        &app,
        json!({"name": "slow", "driver": {"http": {"url": format!("http://127.0.0.1:{port}")}}}),
    )
    .await;
    let repo = settled(&app, &id, "ERROR").await;
    let message = repo.status_message.clone().unwrap_or_default();
    assert!(
        message.contains("deadline of 2s (sync_deadline_seconds)"),
        "{repo:?}"
    );

    // Usable again: the next sync runs, and succeeds once the source does.
    slow.store(false, Ordering::SeqCst);
    let body = app
        .gql(
            "mutation($id: ID!) { refreshRepository(id: $id) { id } }",
            json!({"id": id}),
        )
        .await;
    assert!(data(&body)["refreshRepository"]["id"].is_string(), "{body}");
    let repo = settled(&app, &id, "ACTIVE").await;
    assert_eq!(repo.status_message, None, "{repo:?}");
}

/// A source that answers every request 500, and counts the requests that
/// carried the repository's token (so it is sent, though never shown).
async fn failing_source(with_token: Arc<std::sync::atomic::AtomicUsize>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let with_token = with_token.clone();
            tokio::spawn(async move {
                let mut request = vec![0u8; 4096];
                let n = socket.read(&mut request).await.unwrap_or(0);
                let text = String::from_utf8_lossy(&request[..n]);
                if text.contains("access_token=t0ken") {
                    with_token.fetch_add(1, Ordering::SeqCst);
                }
                let _ = socket
                    .write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\nconnection: close\r\n\r\noops")
                    .await;
            });
        }
    });
    port
}

#[tokio::test]
async fn credentials_in_urls_reach_no_answer_and_no_log_line() {
    let secrets = ["s3cretpass", "t0ken", "pr0vpass"];
    let with_token = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let port = failing_source(with_token.clone()).await;
    let store = TestStore::fresh().await;
    let mut served = serve(
        &store,
        &[
            ("CORBEL_ADMIN_TOKEN", ADMIN_TOKEN),
            ("CORBEL_LOG", "debug"),
            ("CORBEL_PROVIDER_FETCH_TIMEOUT_SECONDS", "10"),
        ],
    );
    let client = reqwest::Client::new();
    let endpoint = format!("http://{}/graphql", served.addr);
    let gql = |query: &'static str, variables: Value| {
        let client = client.clone();
        let endpoint = endpoint.clone();
        async move {
            let text = client
                .post(&endpoint)
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({"query": query, "variables": variables}))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            for secret in secrets {
                assert!(!text.contains(secret), "{secret} in {text}");
            }
            serde_json::from_str::<Value>(&text).unwrap()
        }
    };

    // A repository whose URL carries a password and a token parameter.
    let url = format!("http://user:s3cretpass@127.0.0.1:{port}/?access_token=t0ken");
    let body = gql(
        "mutation($input: CreateRepositoryInput!) { createRepository(input: $input) { id driver { ... on HttpDriver { url } } } }",
        json!({"input": {"name": "private", "driver": {"http": {"url": url}}}}),
    )
    .await;
    let created = &data(&body)["createRepository"];
    assert_eq!(
        created["driver"]["url"],
        format!("http://***@127.0.0.1:{port}/?access_token=***"),
        "{body}"
    );
    let id = created["id"].as_str().unwrap().to_owned();
    let repo = eventually(Duration::from_secs(30), "sync fails", || {
        let id = id.clone();
        let gql = &gql;
        async move {
            let body = gql(
                "query($id: ID!) { repository(id: $id) { status statusMessage driver { ... on HttpDriver { url } } } }",
                json!({"id": id}),
            )
            .await;
            let repo = data(&body)["repository"].clone();
            (repo["status"] == "ERROR").then_some(repo)
        }
    })
    .await;
    assert!(
        repo["statusMessage"].as_str().unwrap().contains(&format!(
            "GET http://***@127.0.0.1:{port}/inventory.json?access_token=***: HTTP 500"
        )),
        "{repo}"
    );
    assert!(with_token.load(Ordering::SeqCst) > 0, "the token was sent");
    // An update with a bad URL is refused without quoting the secrets.
    let body = gql(
        "mutation($id: ID!, $input: UpdateRepositoryInput!) { updateRepository(id: $id, input: $input) { id } }",
        json!({"id": id, "input": {"driver": {"http": {"url": "ftp://user:s3cretpass@h/?token=t0ken"}}}}),
    )
    .await;
    assert!(body["errors"][0]["message"].is_string(), "{body}");

    // A provider whose git URL is in the scp form with a password.
    let body = gql(
        "mutation($input: CreateProviderInput!) { createProvider(input: $input) { provider { id gitUrl } } }",
        json!({"input": {"name": "scp", "gitUrl": "deploy:pr0vpass@127.0.0.1:/nowhere/repo.git"}}),
    )
    .await;
    let provider = &data(&body)["createProvider"]["provider"];
    assert_eq!(
        provider["gitUrl"], "deploy:***@127.0.0.1:/nowhere/repo.git",
        "{body}"
    );
    // It loads at once (autoLoad), and its fetch fails.
    let provider_id = provider["id"].as_str().unwrap().to_owned();
    let failed = eventually(Duration::from_secs(60), "provider fails", || {
        let provider_id = provider_id.clone();
        let gql = &gql;
        async move {
            let body = gql(
                "query($id: ID!) { provider(id: $id) { status statusMessage gitUrl logs(last: 500) { line } } }",
                json!({"id": provider_id}),
            )
            .await;
            let provider = data(&body)["provider"].clone();
            (provider["status"] == "FAILED").then_some(provider)
        }
    })
    .await;
    assert!(
        failed["statusMessage"]
            .as_str()
            .unwrap_or_default()
            .contains("fetch failed"),
        "{failed}"
    );

    let log = served.log.clone();
    tokio::task::spawn_blocking(move || terminate(&mut served.child))
        .await
        .unwrap();
    let lines = log.lock().unwrap();
    assert!(
        lines.iter().any(|l| l.contains("sync failed")),
        "the failure was logged"
    );
    for line in lines.iter() {
        for secret in secrets {
            assert!(!line.contains(secret), "{secret} in the log: {line}");
        }
    }
}
