//! Element installs, blue-green upgrades and uninstalls, deploying the
//! elements' blueprints.

use std::time::Duration;

use serde_json::json;

use crate::support::deployments::{DEPLOYMENT_FIELDS, pids, with_process_provider};
use crate::support::processes::{alive, all_gone};
use crate::support::types::Deployment;
use crate::support::{data, eventually};

/// An installed element's blueprint runs as its installation; an upgrade is
/// blue-green (the new installation is complete before the old one goes);
/// uninstalling destroys it.
#[tokio::test]
async fn element_installs_upgrades_and_uninstalls_deploy_their_blueprints() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    let dir = tempfile::tempdir().unwrap();
    for version in ["1.0.0", "1.1.0"] {
        std::fs::write(
            dir.path().join(format!("svc-{version}.yaml")),
            format!(
                "name: svc\nversion: {version}\nresources:\n  main:\n    type: process.v1.service\n    config: {{ command: sleep, args: [\"300\"], env: {{ VERSION: \"{version}\" }} }}\n"
            ),
        )
        .unwrap();
    }
    let body = app
        .gql(
            "mutation($input: CreateRepositoryInput!) { createRepository(input: $input) { id } }",
            json!({ "input": { "name": "local", "driver": { "local": { "path": dir.path() } }, "syncMode": "COPY" } }),
        )
        .await;
    let repository = data(&body)["createRepository"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let versions = eventually(Duration::from_secs(30), "the sync", || async {
        let body = app
            .gql(
                "query($id: ID!) { repository(id: $id) { status } elements(filter: {name: \"svc\"}) { edges { node { id version } } } }",
                json!({ "id": repository }),
            )
            .await;
        let d = data(&body);
        let edges = d["elements"]["edges"].as_array()?.clone();
        (d["repository"]["status"] == "ACTIVE" && edges.len() == 2).then_some(edges)
    })
    .await;
    let id_of = |version: &str| {
        versions
            .iter()
            .find(|e| e["node"]["version"] == version)
            .unwrap()["node"]["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (old, new) = (id_of("1.0.0"), id_of("1.1.0"));

    let installation = |element: String| {
        let app = &app;
        async move {
            app.query_as::<Deployment>(
                &format!("query($id: ID!) {{ deployments(filter: {{elementId: $id}}) {{ edges {{ node {{ {DEPLOYMENT_FIELDS} events {{ state at kind }} }} }} }} }}"),
                json!({ "id": element }),
                "deployments.edges.0.node",
            )
            .await
        }
    };

    let body = app
        .gql(
            "mutation($id: ID!) { installElement(id: $id) { installed status } }",
            json!({ "id": old }),
        )
        .await;
    assert_eq!(data(&body)["installElement"]["installed"], true, "{body}");
    let first = installation(old.clone()).await;
    assert_eq!(first.state, "COMPLETE", "{first:?}");
    let first_pids = pids(&first);
    assert_eq!(first_pids.len(), 1);
    assert!(alive(first_pids[0]));

    let body = app
        .gql(
            "mutation($from: ID!, $to: ID!) { upgradeElement(id: $from, toId: $to) { version installed } }",
            json!({ "from": old, "to": new }),
        )
        .await;
    assert_eq!(data(&body)["upgradeElement"]["version"], "1.1.0", "{body}");
    let second = installation(new.clone()).await;
    assert_eq!(second.state, "COMPLETE", "{second:?}");
    let replaced = installation(old.clone()).await;
    assert_eq!(replaced.state, "DESTROYED", "{replaced:?}");
    all_gone(&first_pids).await;
    let second_pids = pids(&second);
    assert!(alive(second_pids[0]));
    let environ = std::fs::read(format!("/proc/{}/environ", second_pids[0])).unwrap();
    assert!(String::from_utf8_lossy(&environ).contains("VERSION=1.1.0"));
    // Blue-green: the new one was complete before the old one began to go.
    let at = |d: &Deployment, state: &str| {
        d.events
            .iter()
            .find(|e| e.kind == "STATE" && e.state.as_deref() == Some(state))
            .unwrap_or_else(|| panic!("no {state} in {d:?}"))
            .at
            .as_deref()
            .unwrap()
            .parse::<chrono::DateTime<chrono::Utc>>()
            .unwrap()
    };
    assert!(at(&second, "COMPLETE") <= at(&replaced, "DESTROYING"));

    let body = app
        .gql(
            "mutation($id: ID!) { uninstallElement(id: $id) { installed } }",
            json!({ "id": new }),
        )
        .await;
    assert_eq!(
        data(&body)["uninstallElement"]["installed"],
        false,
        "{body}"
    );
    assert_eq!(installation(new).await.state, "DESTROYED");
    all_gone(&second_pids).await;
    app.stop().await;
}
