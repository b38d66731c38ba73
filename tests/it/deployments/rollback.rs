//! Failed deploys rolled back or kept, redeploys replacing a resource and its
//! dependents, and concurrent requests on one deployment.

use serde_json::{Value, json};

use crate::support::deployments::{
    WEB, create_blueprint, deploy, destroy_and_wait, pids, settled, with_process_provider,
};
use crate::support::processes::{alive, all_gone};
use crate::support::types::Deployment;
use crate::support::{data, error_code};

const HALF_BROKEN: &str = r#"
resources:
  good:
    type: process.v1.service
    config: { command: sleep, args: ["300"] }
  bad:
    type: process.v1.service
    depends_on: [good]
    config: { command: sh, args: ["-c", "echo cannot start; exit 7"] }
  after:
    type: process.v1.service
    depends_on: [bad]
    config: { command: sleep, args: ["300"] }
"#;

#[tokio::test]
async fn a_failed_deploy_rolls_back_or_keeps_what_it_made() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(&app, "half", HALF_BROKEN).await;

    let id = deploy(
        &app,
        &blueprint,
        "rolled-back",
        json!({ "onFailure": "ROLLBACK" }),
    )
    .await;
    let failed = settled(&app, &id, &["FAILED", "COMPLETE"]).await;
    assert_eq!(failed.state, "FAILED");
    let error = failed.error.as_deref().unwrap();
    assert!(
        error.contains("bad[0]") && error.contains("cannot start"),
        "{error}"
    );
    let state_of = |d: &Deployment, key: &str| d.node(key).state.clone();
    assert_eq!(state_of(&failed, "good"), "DESTROYED", "{failed:?}");
    assert_eq!(
        state_of(&failed, "after"),
        "TAINTED",
        "never made: nothing to destroy"
    );

    let id = deploy(&app, &blueprint, "kept", json!({ "onFailure": "KEEP" })).await;
    let kept = settled(&app, &id, &["FAILED", "COMPLETE"]).await;
    assert_eq!(kept.state, "FAILED");
    assert_eq!(state_of(&kept, "good"), "COMPLETE");
    assert_eq!(state_of(&kept, "bad"), "FAILED");
    assert_eq!(state_of(&kept, "after"), "TAINTED");
    // Its event names the node as every node event does: `key[replica]`.
    let history = app
        .gql(
            "query($id: ID!) { deployment(id: $id) { events { kind nodeKey state } } }",
            json!({ "id": id }),
        )
        .await;
    let tainted: Vec<&Value> = data(&history)["deployment"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["state"] == "TAINTED")
        .collect();
    assert_eq!(
        tainted,
        vec![&json!({ "kind": "NODE", "nodeKey": "after[0]", "state": "TAINTED" })],
        "{history}"
    );
    let good = pids(&kept);
    assert_eq!(good.len(), 1);
    assert!(alive(good[0]));

    // Redeploying the broken part fails the same way, and the good part stays.
    let body = app
        .gql(
            "mutation($id: ID!) { redeployDeployment(id: $id, resourceKeys: [\"bad\"]) { state } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&body)["redeployDeployment"]["state"], "IN_PROGRESS");
    let again = settled(&app, &id, &["FAILED", "COMPLETE"]).await;
    assert_eq!(again.state, "FAILED");
    assert!(alive(good[0]));

    destroy_and_wait(&app, &id, &good).await;
    app.stop().await;
}

#[tokio::test]
async fn redeploy_replaces_a_resource_and_its_dependents() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(&app, "web", WEB).await;
    let id = deploy(
        &app,
        &blueprint,
        "web",
        json!({ "variables": { "replicas": 1 } }),
    )
    .await;
    let first = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(first.state, "COMPLETE", "{first:?}");
    let before = pids(&first);
    let body = app
        .gql(
            "mutation($id: ID!) { redeployDeployment(id: $id, resourceKeys: [\"db\"]) { state } }",
            json!({ "id": id }),
        )
        .await;
    data(&body);
    let second = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(second.state, "COMPLETE", "{second:?}");
    let after = pids(&second);
    assert_eq!(after.len(), 2);
    assert!(
        before.iter().all(|p| !after.contains(p)),
        "db and web were both replaced"
    );
    all_gone(&before).await;
    destroy_and_wait(&app, &id, &after).await;
    app.stop().await;
}

/// A destroy that takes a while (the service ignores SIGTERM, so the provider
/// waits out its grace period) holds the deployment's lock: a second destroy
/// and a redeploy get `CONFLICT`.
#[tokio::test]
async fn concurrent_requests_on_one_deployment_conflict() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(
        &app,
        "stubborn",
        "resources:\n  s:\n    type: process.v1.service\n    config: { command: sh, args: [\"-c\", \"trap '' TERM; sleep 300\"] }\n",
    )
    .await;
    let id = deploy(&app, &blueprint, "stubborn", json!({})).await;
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    let first = app
        .gql(
            "mutation($id: ID!) { destroyDeployment(id: $id) { state } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&first)["destroyDeployment"]["state"], "DESTROYING");
    for mutation in [
        "mutation($id: ID!) { destroyDeployment(id: $id) { state } }",
        "mutation($id: ID!) { redeployDeployment(id: $id, resourceKeys: [\"s\"]) { state } }",
    ] {
        let again = app.gql(mutation, json!({ "id": id })).await;
        assert_eq!(error_code(&again), Some("CONFLICT"), "{again:?}");
    }
    let gone = settled(&app, &id, &["DESTROYED", "FAILED"]).await;
    assert_eq!(gone.state, "DESTROYED", "{gone:?}");
    all_gone(&pids(&done)).await;
    app.stop().await;
}
