//! Bad sources, bad input and silent sources: the repository in error, named.

use std::time::Duration;

use serde_json::json;

use crate::support::nginx::{Nginx, free_port};
use crate::support::repositories::{
    create, create_id, element_ids, invalid_elements, put_element, refresh, settled,
    write_inventory,
};
use crate::support::{TestApp, TestStore, data, error_code};

#[tokio::test]
async fn bad_sources_put_the_repository_in_error_and_keep_elements() {
    let served = tempfile::tempdir().unwrap();
    let root = served.path();
    let a = put_element(root, "a", "1.0.0", json!({}), &[]);
    write_inventory(root, &[a]);
    let nginx = Nginx::start(root);
    let app = TestApp::spawn().await;
    let id = create_id(
        &app,
        json!({"name": "r", "driver": {"http": {"url": nginx.url()}}}),
    )
    .await;
    settled(&app, &id, "ACTIVE").await;

    // An inventory that cannot be read as one is the source's failure.
    let cases: [(&str, &str); 3] = [
        ("{not json", "inventory.json"),
        (r#"{"elements": []}"#, "inventory.json"),
        (r#"{"elements": {"b": {"1.0.0": {}}}"#, "inventory.json"),
    ];
    for (inventory, hint) in cases {
        std::fs::write(root.join("inventory.json"), inventory).unwrap();
        let repo = refresh(&app, &id).await;
        assert_eq!(repo.status, "ERROR", "{inventory}: {repo:?}");
        let message = repo.status_message.as_deref().unwrap();
        assert!(message.contains(hint), "{inventory}: {message}");
        let kept = element_ids(&app, &id).await;
        assert!(
            kept.contains_key("a 1.0.0"),
            "stored elements are kept: {kept:?}"
        );
        // Back to a good state before the next case.
        write_inventory(root, &[put_element(root, "a", "1.0.0", json!({}), &[])]);
        assert_eq!(refresh(&app, &id).await.status, "ACTIVE");
    }

    // A bad entry is one invalid element: the others are stored, the
    // repository stays ACTIVE and says how many are invalid.
    let good = put_element(root, "a", "1.0.0", json!({}), &[]);
    let cases = [
        (
            json!({"1.x.0": {}}),
            "1.x.0",
            "element `b` 1.x.0, field `version`",
        ),
        (
            json!({"1.0.0": {"index": {"images": {"u": "../../etc/passwd"}}}}),
            "1.0.0",
            "field `index.images`",
        ),
        (
            json!({"1.0.0": {"index": {"images": {"u": "/etc/passwd"}}}}),
            "1.0.0",
            "not a plain file name",
        ),
        (
            json!({"1.0.0": {"digest": "sha1:abc"}}),
            "1.0.0",
            "field `digest`",
        ),
    ];
    for (versions, version, hint) in cases {
        let inventory = json!({"elements": {"a": {"1.0.0": good}, "b": versions}});
        std::fs::write(root.join("inventory.json"), inventory.to_string()).unwrap();
        let repo = refresh(&app, &id).await;
        assert_eq!(repo.status, "ACTIVE", "{inventory}: {repo:?}");
        assert_eq!(
            repo.status_message.as_deref(),
            Some("2 elements, 1 invalid"),
            "{repo:?}"
        );
        assert_eq!(repo.invalid_element_count, 1, "{repo:?}");
        let invalid = invalid_elements(&app, &id).await;
        assert_eq!(invalid.len(), 1, "{invalid:?}");
        assert_eq!(invalid[0]["name"], "b");
        assert_eq!(invalid[0]["version"], version);
        assert_eq!(
            invalid[0]["path"],
            format!("inventory.json#/elements/b/{version}")
        );
        assert!(
            invalid[0]["message"].as_str().unwrap().contains(hint),
            "{invalid:?}"
        );
        assert_eq!(invalid[0]["elementId"], json!(null));
        let kept = element_ids(&app, &id).await;
        assert_eq!(kept.keys().collect::<Vec<_>>(), ["a 1.0.0"]);
    }
    // Fixed at the source: the next sync replaces the list.
    write_inventory(root, &[good]);
    let repo = refresh(&app, &id).await;
    assert_eq!(
        (repo.status.as_str(), repo.invalid_element_count),
        ("ACTIVE", 0)
    );
    assert_eq!(repo.status_message, None, "{repo:?}");
    assert!(invalid_elements(&app, &id).await.is_empty());

    // An HTTP error and an unreachable host.
    std::fs::remove_file(root.join("inventory.json")).unwrap();
    data(
        &app.gql(
            "mutation($id: ID!) { refreshRepository(id: $id) { id } }",
            json!({"id": id}),
        )
        .await,
    );
    let repo = settled(&app, &id, "ERROR").await;
    assert!(
        repo.status_message.as_deref().unwrap().contains("404"),
        "{repo:?}"
    );
    let closed = format!("http://127.0.0.1:{}", free_port());
    let unreachable = create_id(
        &app,
        json!({"name": "gone", "driver": {"http": {"url": closed}}}),
    )
    .await;
    let repo = settled(&app, &unreachable, "ERROR").await;
    assert!(
        repo.status_message
            .as_deref()
            .unwrap()
            .contains("cannot connect"),
        "{repo:?}"
    );

    // A too-large inventory, with a small limit.
    let store = std::sync::Arc::new(TestStore::fresh().await);
    let small = TestApp::spawn_with(store, |c| c.repository.max_inventory_bytes = 64).await;
    write_inventory(
        root,
        &[
            put_element(root, "a", "1.0.0", json!({}), &[]),
            put_element(root, "b", "1.0.0", json!({}), &[]),
        ],
    );
    let big = create_id(
        &small,
        json!({"name": "big", "driver": {"http": {"url": nginx.url()}}}),
    )
    .await;
    let repo = settled(&small, &big, "ERROR").await;
    assert!(
        repo.status_message
            .as_deref()
            .unwrap()
            .contains("over the limit of 64 bytes"),
        "{repo:?}"
    );
}

#[tokio::test]
async fn bad_repository_input_is_named() {
    let app = TestApp::spawn().await;
    let cases = [
        (
            json!({"name": "x", "driver": {"http": {"url": "ftp://h/x"}}}),
            "scheme `ftp`",
        ),
        (
            json!({"name": "x", "driver": {"http": {"url": "not a url"}}}),
            "driver.http.url",
        ),
        (
            json!({"name": "x", "driver": {"local": {"path": "relative/dir"}}}),
            "absolute path",
        ),
        (json!({"name": "", "driver": {"migration": {}}}), "name"),
        (
            json!({"name": "x", "driver": {"migration": {}}, "refreshIntervalSeconds": 0}),
            "refreshIntervalSeconds",
        ),
    ];
    for (input, hint) in cases {
        let body = app
            .gql(
                "mutation($i: CreateRepositoryInput!) { createRepository(input: $i) { id } }",
                json!({"i": input}),
            )
            .await;
        assert_eq!(error_code(&body), Some("VALIDATION"), "{body}");
        assert!(
            body["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains(hint),
            "{body}"
        );
    }
    let two_drivers = app
        .gql("mutation { createRepository(input: {name: \"x\", driver: {migration: {}, local: {path: \"/tmp\"}}}) { id } }", json!({}))
        .await;
    assert_eq!(
        error_code(&two_drivers),
        Some("INVALID_QUERY"),
        "{two_drivers}"
    );
    create(&app, json!({"name": "dup", "driver": {"migration": {}}})).await;
    let dup = app
        .gql(
            "mutation { createRepository(input: {name: \"dup\", driver: {migration: {}}}) { id } }",
            json!({}),
        )
        .await;
    assert_eq!(error_code(&dup), Some("CONFLICT"));
    let body = app.gql("{ repositories { totalCount } }", json!({})).await;
    assert_eq!(
        data(&body)["repositories"]["totalCount"],
        1,
        "nothing half-made"
    );
}

#[tokio::test]
async fn a_silent_source_times_out() {
    // Accepts connections and never answers: a fault we can cause for real.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().take(8) {
            held.push(stream);
        }
    });
    let store = std::sync::Arc::new(TestStore::fresh().await);
    let app = TestApp::spawn_with(store, |c| {
        c.repository.http_timeout = Duration::from_secs(1)
    })
    .await;
    let id = create_id(
        &app,
        json!({"name": "silent", "driver": {"http": {"url": format!("http://127.0.0.1:{port}")}}}),
    )
    .await;
    let repo = settled(&app, &id, "ERROR").await;
    assert!(
        repo.status_message
            .as_deref()
            .unwrap()
            .contains("timed out after 1s"),
        "{repo:?}"
    );
}

#[tokio::test]
async fn a_source_that_trickles_fails_at_the_end_of_its_window() {
    // Answers, then sends a byte every 100 ms: never idle long enough for
    // the idle deadline, far under the pace. A fault we can cause for real.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in listener.incoming().take(4) {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request);
                let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n";
                if stream.write_all(head.as_bytes()).is_err() {
                    return;
                }
                for _ in 0..1000 {
                    std::thread::sleep(Duration::from_millis(100));
                    if stream.write_all(b" ").is_err() {
                        return;
                    }
                }
            });
        }
    });
    let store = std::sync::Arc::new(TestStore::fresh().await);
    let app = TestApp::spawn_with(store, |c| {
        c.repository.http_timeout = Duration::from_secs(5);
        c.repository.stall_timeout = Duration::from_secs(1);
    })
    .await;
    let started = std::time::Instant::now();
    let id = create_id(
        &app,
        json!({"name": "trickle", "driver": {"http": {"url": format!("http://127.0.0.1:{port}")}}}),
    )
    .await;
    let repo = settled(&app, &id, "ERROR").await;
    let message = repo.status_message.as_deref().unwrap();
    assert!(
        message.contains("under the 1024 bytes a second it must keep"),
        "{repo:?}"
    );
    // One window (1 s), not the idle deadline (5 s) nor the total one.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// A repository made while its source is down is read as soon as the source
/// is up, with no refresh asked for: a failed sync is tried again a second
/// later, then twice as long each time, and says so. With the default
/// settings (a refresh check every 5 s), ACTIVE within 5 s of the source
/// coming up.
#[tokio::test]
async fn a_source_down_at_first_is_read_once_it_is_up() {
    let app = TestApp::spawn().await;
    let source = tempfile::tempdir().unwrap();
    let root = source.path();
    let nginx = Nginx::start(root);
    let id = create_id(
        &app,
        json!({"name": "later", "driver": {"http": {"url": nginx.url()}}}),
    )
    .await;
    let down = settled(&app, &id, "ERROR").await;
    let said = down.status_message.unwrap_or_default();
    assert!(
        said.contains("404") && said.contains("(retrying in 1s)"),
        "{said}"
    );
    write_inventory(root, &[put_element(root, "a", "1.0.0", json!({}), &[])]);
    let up_at = std::time::Instant::now();
    let up = settled(&app, &id, "ACTIVE").await;
    assert!(
        up_at.elapsed() < Duration::from_secs(5),
        "{:?}",
        up_at.elapsed()
    );
    assert_eq!(up.status_message, None, "{up:?}");
    let ids = element_ids(&app, &id).await;
    assert_eq!(ids.keys().collect::<Vec<_>>(), ["a 1.0.0"]);
}
