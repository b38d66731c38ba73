//! Protocol version 2 and the providers that predate it: the fixture registers
//! with version 3 (the SDK's newest), or with version 1 when it offers only that
//! (`FIXTURE_PROTOCOL=1`), and a version 1 provider still deploys and destroys.

use std::path::Path;

use serde_json::{Value, json};

use crate::support::deployments::{create_blueprint, deploy, settled};
use crate::support::provider_repos::{ProviderRepo, workspace_bin};
use crate::support::providers::{create_provider, logs, spawn_quick, wait_status};
use crate::support::{TestApp, data};

/// The fixture's `corbel-provider.yaml`, its run line with `env` set and its
/// calls noted in `call_log`.
pub(crate) fn fixture_metadata(env: &str, call_log: &Path) -> String {
    format!(
        "name: fixture\nversion: 0.1.0\ndescription: test provider\nruntime: shell\nshell:\n  \
         build: echo prebuilt\n  run: echo $$ > provider.pid; {env} FIXTURE_CALL_LOG={} exec {}\n\
         features: [deploy, destroy, inspect, nodes]\nresource_types: [fixture.v1.noop]\n",
        call_log.display(),
        workspace_bin("corbel-provider-fixture").display()
    )
}

/// A fixture loaded with `env`; its id once it is connected.
pub(crate) async fn loaded(app: &TestApp, env: &str, call_log: &Path) -> (String, ProviderRepo) {
    let repo = ProviderRepo::new(&fixture_metadata(env, call_log), &[]);
    let (id, _) = create_provider(app, json!({ "name": "fixture", "gitUrl": repo.url() })).await;
    wait_status(app, &id, "CONNECTED").await;
    (id, repo)
}

/// The calls the fixture noted, as `(call, key)`.
pub(crate) fn calls(call_log: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(call_log)
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let line: Value = serde_json::from_str(line).unwrap();
            (
                line["call"].as_str().unwrap().to_owned(),
                line["key"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

const LABELLED: &str = r#"
version: "1"
resources:
  thing:
    type: fixture.v1.noop
    config: { label: first, size: 1 }
"#;

#[tokio::test]
async fn the_fixture_registers_with_version_3() {
    let app = spawn_quick().await;
    let dir = tempfile::tempdir().unwrap();
    let call_log = dir.path().join("calls.jsonl");
    let (id, _repo) = loaded(&app, "", &call_log).await;
    let log = logs(&app, &id).await;
    assert!(log.contains("(protocol 3)"), "{log}");
    app.stop().await;
}

#[tokio::test]
async fn a_provider_offering_only_version_1_registers_with_1_and_still_deploys() {
    let app = spawn_quick().await;
    let dir = tempfile::tempdir().unwrap();
    let call_log = dir.path().join("calls.jsonl");
    let (id, _repo) = loaded(&app, "FIXTURE_PROTOCOL=1", &call_log).await;
    let log = logs(&app, &id).await;
    assert!(log.contains("(protocol 1)"), "{log}");

    let blueprint = create_blueprint(&app, "labelled", LABELLED).await;
    let deployment = deploy(&app, &blueprint, "old", json!({})).await;
    let done = settled(&app, &deployment, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{:?}", done.error);
    assert_eq!(done.node("thing").outputs, json!({"label": "first"}));
    assert_eq!(
        calls(&call_log),
        [("deploy".to_owned(), "thing".to_owned())]
    );

    let body = app
        .gql(
            "mutation($id: ID!) { destroyDeployment(id: $id) { id } }",
            json!({ "id": deployment }),
        )
        .await;
    data(&body);
    settled(&app, &deployment, &["DESTROYED"]).await;
    let noted = calls(&call_log);
    assert_eq!(noted.last().unwrap().0, "destroy", "{noted:?}");
    assert!(noted.iter().all(|(call, _)| call != "update"), "{noted:?}");
    app.stop().await;
}
