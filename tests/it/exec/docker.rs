//! Exec and files in a container (the docker provider): output and status,
//! stdin, a timeout that kills the command, a file in and out.

use std::sync::Arc;

use serde_json::json;

use crate::support::deployments::{create_blueprint, deploy, settled, with_docker_provider};
use crate::support::docker::{DeploymentCleanup, busybox_image};
use crate::support::{ADMIN_TOKEN, TestStore, data};

const BOX: &str = r#"
resources:
  box:
    type: docker.v1.container
    config:
      image: IMAGE
      command: "exec sleep 3600"
"#;

#[tokio::test]
async fn a_command_runs_inside_the_container() {
    let (app, _provider, _repo) = with_docker_provider(Arc::new(TestStore::fresh().await)).await;
    let blueprint = create_blueprint(&app, "box", &BOX.replace("IMAGE", busybox_image())).await;
    let id = deploy(&app, &blueprint, "box-1", json!({})).await;
    let _cleanup = DeploymentCleanup(id.clone());
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    let node = done.node("box").id.clone();
    let exec = |command: Vec<&'static str>, more: serde_json::Value| {
        let app = &app;
        let node = node.clone();
        async move {
            let mut variables = json!({ "node": node, "command": command });
            variables
                .as_object_mut()
                .unwrap()
                .extend(more.as_object().cloned().unwrap_or_default());
            let body = app
                .gql(
                    "mutation($node: ID!, $command: [String!]!, $stdin: String, $timeout: Int) {
                       execResource(nodeId: $node, command: $command, stdin: $stdin,
                                    timeoutSeconds: $timeout) {
                         stdout stderr exitCode signal timedOut } }",
                    variables,
                )
                .await;
            data(&body)["execResource"].clone()
        }
    };

    // Inside: the container's hostname is its short id, its pid 1 the sleep.
    let ran = exec(
        vec![
            "sh",
            "-c",
            "cat /proc/1/cmdline | tr '\\0' ' '; echo; echo oops >&2; exit 5",
        ],
        json!({}),
    )
    .await;
    assert_eq!(ran["stdout"], "sleep 3600 \n", "{ran}");
    assert_eq!(ran["stderr"], "oops\n");
    assert_eq!(ran["exitCode"], 5);

    let ran = exec(vec!["cat"], json!({ "stdin": "in a box" })).await;
    assert_eq!(ran["stdout"], "in a box", "{ran}");

    let ran = exec(vec!["sleep", "60"], json!({ "timeout": 1 })).await;
    assert_eq!(ran["timedOut"], true, "{ran}");
    assert_eq!(ran["signal"], "SIGKILL", "{ran}");

    // Files in and out through the engine's archive API.
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(2);
    header.set_mode(0o644);
    builder
        .append_data(&mut header, "hello.txt", &b"hi"[..])
        .unwrap();
    let archive = builder.into_inner().unwrap();
    let url = format!("http://{}/files/{node}", app.addr);
    let put = app
        .client
        .put(&url)
        .query(&[("path", "/")])
        .bearer_auth(ADMIN_TOKEN)
        .body(archive)
        .send()
        .await
        .unwrap();
    assert_eq!(put.status().as_u16(), 200);
    let ran = exec(vec!["cat", "/hello.txt"], json!({})).await;
    assert_eq!(ran["stdout"], "hi", "{ran}");
    let got = app
        .client
        .get(&url)
        .query(&[("path", "/hello.txt")])
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(got.status().as_u16(), 200);
    let bytes = got.bytes().await.unwrap();
    let mut archive = tar::Archive::new(&bytes[..]);
    let mut entry = archive.entries().unwrap().next().unwrap().unwrap();
    assert_eq!(entry.path().unwrap().to_str(), Some("hello.txt"));
    let mut text = String::new();
    std::io::Read::read_to_string(&mut entry, &mut text).unwrap();
    assert_eq!(text, "hi");
}
