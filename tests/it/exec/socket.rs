//! The `/exec` websocket: a terminal's size and resizes, stdin and the exit
//! status, who may, and an exec ended with its caller's session.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::deployed_app;
use crate::health::support::tagged;
use crate::support::websocket::Ws;
use crate::support::{ADMIN_TOKEN, TestApp, data, eventually};
use crate::teams::{member, user};

/// Opens `/exec` with `token` as a bearer token.
async fn open(app: &TestApp, token: &str) -> Ws {
    let mut request = format!("ws://{}/exec", app.addr)
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("Authorization", format!("Bearer {token}").parse().unwrap());
    tokio_tungstenite::connect_async(request)
        .await
        .expect("/exec upgrades")
        .0
}

async fn start(ws: &mut Ws, start: Value) {
    let mut message = json!({ "type": "start" });
    message
        .as_object_mut()
        .unwrap()
        .extend(start.as_object().cloned().unwrap());
    ws.send(Message::Text(message.to_string().into()))
        .await
        .unwrap();
}

async fn stdin(ws: &mut Ws, bytes: &[u8]) {
    let frame: Vec<u8> = std::iter::once(0).chain(bytes.iter().copied()).collect();
    ws.send(Message::Binary(frame.into())).await.unwrap();
}

/// What the exec said until its end: stdout, stderr, and the last text
/// message (`exit` or `error`).
#[derive(Default, Debug)]
struct Said {
    stdout: String,
    stderr: String,
    end: Value,
}

/// Reads until `until` holds of what was said, or the exec ends.
async fn read(ws: &mut Ws, said: &mut Said, until: impl Fn(&Said) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !until(said) {
        let message = tokio::time::timeout_at(deadline, ws.next())
            .await
            .unwrap_or_else(|_| panic!("the exec said enough within 20 s: {said:?}"));
        match message {
            Some(Ok(Message::Binary(bytes))) => {
                let text = String::from_utf8_lossy(&bytes[1..]).into_owned();
                match bytes[0] {
                    1 => said.stdout.push_str(&text),
                    2 => said.stderr.push_str(&text),
                    other => panic!("stream byte {other}"),
                }
            }
            Some(Ok(Message::Text(text))) => {
                let value: Value = serde_json::from_str(&text).unwrap();
                if value["type"] != "started" {
                    said.end = value;
                }
            }
            Some(Ok(_)) => {}
            None | Some(Err(_)) => return,
        }
    }
}

fn ended(said: &Said) -> bool {
    !said.end.is_null()
}

#[tokio::test]
async fn a_terminal_has_its_size_follows_resizes_and_stdin_reaches_the_command() {
    let cwd = tempfile::tempdir().unwrap();
    let (app, node, _) = deployed_app(cwd.path()).await;

    let mut ws = open(&app, ADMIN_TOKEN).await;
    start(
        &mut ws,
        json!({ "nodeId": node, "tty": true, "rows": 33, "cols": 101, "stdin": true,
                "command": ["sh", "-c", "stty size; read line; stty size; exit 4"] }),
    )
    .await;
    let mut said = Said::default();
    read(&mut ws, &mut said, |s| s.stdout.contains("33 101")).await;
    let resize = json!({ "type": "resize", "rows": 40, "cols": 120 }).to_string();
    ws.send(Message::Text(resize.into())).await.unwrap();
    stdin(&mut ws, b"\r").await;
    read(&mut ws, &mut said, ended).await;
    assert!(said.stdout.contains("40 120"), "{said:?}");
    assert_eq!(said.end["type"], "exit", "{said:?}");
    assert_eq!(said.end["code"], 4, "{said:?}");

    // Without a terminal: stdin to its end, stdout and stderr apart.
    let mut ws = open(&app, ADMIN_TOKEN).await;
    start(
        &mut ws,
        json!({ "nodeId": node, "stdin": true, "command": ["sh", "-c", "cat; echo done >&2"] }),
    )
    .await;
    stdin(&mut ws, b"round ").await;
    stdin(&mut ws, b"trip").await;
    let close = json!({ "type": "close-stdin" }).to_string();
    ws.send(Message::Text(close.into())).await.unwrap();
    let mut said = Said::default();
    read(&mut ws, &mut said, ended).await;
    assert_eq!(said.stdout, "round trip");
    assert_eq!(said.stderr, "done\n");
    assert_eq!(said.end["code"], 0, "{said:?}");

    // No token: refused before the upgrade.
    let request = format!("ws://{}/exec", app.addr)
        .into_client_request()
        .unwrap();
    let refused = tokio_tungstenite::connect_async(request).await;
    assert!(refused.is_err(), "an anonymous /exec is refused");
}

#[tokio::test]
async fn a_viewer_and_an_outsider_are_refused_and_a_session_that_ends_ends_its_exec() {
    let cwd = tempfile::tempdir().unwrap();
    let (app, node, pid) = deployed_app(cwd.path()).await;
    let body = app
        .gql(
            "{ deployments { edges { node { projectId } } } }",
            json!({}),
        )
        .await;
    let project = data(&body)["deployments"]["edges"][0]["node"]["projectId"]
        .as_str()
        .unwrap()
        .to_owned();
    let viewer = user(&app, "viewer", "USER").await;
    member(&app, ADMIN_TOKEN, &project, "viewer", "VIEWER").await;
    let developer = user(&app, "developer", "USER").await;
    member(&app, ADMIN_TOKEN, &project, "developer", "DEVELOPER").await;
    let outsider = user(&app, "outsider", "USER").await;

    for (token, code) in [(&viewer, "FORBIDDEN"), (&outsider, "NOT_FOUND")] {
        let mut ws = open(&app, token).await;
        start(&mut ws, json!({ "nodeId": node, "command": ["true"] })).await;
        let mut said = Said::default();
        read(&mut ws, &mut said, ended).await;
        assert_eq!(said.end["type"], "error", "{said:?}");
        assert_eq!(said.end["code"], code, "{said:?}");
        // The same over GraphQL.
        let body = app
            .gql_as(
                Some(token),
                "mutation($n: ID!) { execResource(nodeId: $n, command: [\"true\"]) { exitCode } }",
                json!({ "n": node }),
            )
            .await;
        assert_eq!(body["errors"][0]["extensions"]["code"], code, "{body}");
    }

    // A developer's shell, ended by their signing out: killed at once.
    let mut ws = open(&app, &developer).await;
    start(
        &mut ws,
        json!({ "nodeId": node, "command": ["sh", "-c", "echo up; sleep 300"] }),
    )
    .await;
    let mut said = Said::default();
    read(&mut ws, &mut said, |s| s.stdout.contains("up")).await;
    assert!(
        tagged(&node).len() >= 2,
        "the service and the shell's sleep"
    );
    let body = app
        .gql_as(Some(&developer), "mutation { logout }", json!({}))
        .await;
    data(&body);
    read(&mut ws, &mut said, ended).await;
    assert_eq!(said.end["code"], "UNAUTHENTICATED", "{said:?}");
    eventually(Duration::from_secs(10), "the shell killed", || async {
        (tagged(&node) == [pid]).then_some(())
    })
    .await;

    // The audit log has each, under `exec`.
    let body = app
        .gql(
            "{ auditLog(filter: { actions: [\"exec\"] }) { edges { node { username outcome arguments } } } }",
            json!({}),
        )
        .await;
    let entries = data(&body)["auditLog"]["edges"].as_array().unwrap().clone();
    let outcomes: Vec<(String, String)> = entries
        .iter()
        .map(|e| {
            (
                e["node"]["username"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                e["node"]["outcome"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    for wanted in [
        ("viewer", "FORBIDDEN"),
        ("outsider", "NOT_FOUND"),
        ("developer", "UNAUTHENTICATED"),
    ] {
        assert!(
            outcomes.contains(&(wanted.0.to_owned(), wanted.1.to_owned())),
            "{wanted:?} in {outcomes:?}"
        );
    }
}

/// This test process's resident memory (the server runs in it), in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[tokio::test]
async fn a_hundred_mib_of_output_streams_through_and_memory_stays_flat() {
    const TOTAL: u64 = 100 << 20;
    let cwd = tempfile::tempdir().unwrap();
    let (app, node, _) = deployed_app(cwd.path()).await;
    let mut ws = open(&app, ADMIN_TOKEN).await;
    let size = TOTAL.to_string();
    let command = ["head", "-c", size.as_str(), "/dev/zero"];
    start(&mut ws, json!({ "nodeId": node, "command": command })).await;
    // The server and this client discard as they go: what either held
    // whole would show here. The baseline is taken once output flows.
    let (mut stdout, mut baseline, mut peak, mut end) = (0u64, None, 0u64, Value::Null);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while end.is_null() {
        let message = tokio::time::timeout_at(deadline, ws.next())
            .await
            .unwrap_or_else(|_| panic!("100 MiB within 120 s; {stdout} bytes so far"));
        match message {
            Some(Ok(Message::Binary(bytes))) => {
                assert_eq!(bytes[0], 1, "stdout only");
                stdout += bytes.len() as u64 - 1;
                if stdout >= 4 << 20 {
                    let now = rss_kib();
                    baseline.get_or_insert(now);
                    peak = peak.max(now);
                }
            }
            Some(Ok(Message::Text(text))) => {
                let value: Value = serde_json::from_str(&text).unwrap();
                if value["type"] != "started" {
                    end = value;
                }
            }
            Some(Ok(_)) => {}
            None | Some(Err(_)) => panic!("the socket closed after {stdout} bytes"),
        }
    }
    assert_eq!(end["type"], "exit", "{end}");
    assert_eq!(end["code"], 0, "{end}");
    assert_eq!(stdout, TOTAL, "every byte");
    let grew = peak - baseline.expect("output flowed");
    assert!(
        grew < 32 << 10,
        "memory grew by {grew} KiB while 100 MiB streamed: something holds it"
    );
}
