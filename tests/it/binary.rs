//! The real `corbel` binary: signals, subcommands, configuration.

use std::io::{BufRead, BufReader};
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::support::binary::{serve, terminate};
use crate::support::websocket::{next_json, subscribe_server_events};
use crate::support::{ADMIN_TOKEN, TestStore, corbel_bin, eventually};

#[tokio::test]
async fn sigterm_drains_streams_and_exits_zero() {
    let store = TestStore::fresh().await;
    let mut served = serve(&store, &[("CORBEL_ADMIN_TOKEN", ADMIN_TOKEN)]);
    let client = reqwest::Client::new();
    let url = format!("http://{}/readyz", served.addr);
    eventually(Duration::from_secs(10), "readiness", || async {
        let r = client.get(&url).send().await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    let mut ws = subscribe_server_events(served.addr).await;
    // The subscription is live once an event arrives through it.
    let mut live = false;
    for i in 0..50 {
        client
            .post(format!("http://{}/graphql", served.addr))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"query": format!("mutation {{ createApiToken(name: \"t{i}\") {{ token }} }}")}))
            .send()
            .await
            .unwrap();
        if let Ok(Some(m)) =
            tokio::time::timeout(Duration::from_millis(200), next_json(&mut ws)).await
            && m["type"] == "next"
        {
            live = true;
            break;
        }
    }
    assert!(live, "subscription delivered an event");

    let status = tokio::task::spawn_blocking(move || terminate(&mut served.child))
        .await
        .unwrap();
    let mut completed = false;
    while let Some(message) = next_json(&mut ws).await {
        completed |= message["type"] == "complete";
    }
    assert!(completed, "the open subscription was completed");
    assert!(status.success(), "exit status {status:?}");
}

#[tokio::test]
async fn first_start_prints_a_working_admin_token_once() {
    let store = TestStore::fresh().await;
    let mut served = serve(&store, &[]);
    let mut stdout = BufReader::new(served.child.stdout.take().unwrap());
    let mut printed = String::new();
    let token = loop {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "token printed: {printed}"
        );
        printed.push_str(&line);
        if let Some(token) = line.split_whitespace().find(|w| w.starts_with("cbl_")) {
            break token.to_owned();
        }
    };
    let body: serde_json::Value = reqwest::Client::new()
        .post(format!("http://{}/graphql", served.addr))
        .bearer_auth(&token)
        .json(&json!({"query": "{ me { username } }"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["data"]["me"]["username"], "admin", "{body}");
    assert!(terminate(&mut served.child).success());

    // The second start on the same data makes no new token.
    let mut again = serve(&store, &[]);
    assert!(terminate(&mut again.child).success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut again.child.stdout.take().unwrap(), &mut rest).unwrap();
    assert!(!rest.contains("cbl_"), "no second token: {rest}");
}

#[test]
fn subcommands_version_schema_config_migrate() {
    let version = Command::new(corbel_bin())
        .arg("--version")
        .output()
        .unwrap();
    assert!(version.status.success());
    assert!(String::from_utf8_lossy(&version.stdout).contains(env!("CARGO_PKG_VERSION")));

    let schema = Command::new(corbel_bin()).arg("schema").output().unwrap();
    assert!(schema.status.success());
    assert_eq!(
        String::from_utf8(schema.stdout).unwrap(),
        corbel::api::sdl()
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("corbel.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:9999\"\nlog_format = \"json\"\n",
    )
    .unwrap();
    let config = Command::new(corbel_bin())
        .args(["config", "--config"])
        .arg(&file)
        .env(
            "CORBEL_DATABASE_URL",
            "postgres://corbel:hunter2@127.0.0.1:5432/corbel",
        )
        .env("CORBEL_ADMIN_TOKEN", "tok-very-secret-value")
        .output()
        .unwrap();
    assert!(config.status.success());
    let shown = String::from_utf8(config.stdout).unwrap();
    assert!(shown.contains("127.0.0.1:9999"), "{shown}");
    assert!(shown.contains("json"), "{shown}");
    assert!(
        !shown.contains("hunter2") && !shown.contains("tok-very-secret-value"),
        "{shown}"
    );

    let bad = Command::new(corbel_bin())
        .args(["config", "--database-url", "mysql://x/y"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unsupported scheme"));

    let migrate = Command::new(corbel_bin())
        .args(["migrate", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        migrate.status.success(),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    assert!(dir.path().join("corbel.db").exists());
}
