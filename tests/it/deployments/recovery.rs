//! The real binary SIGKILLed mid-deploy: after a restart the deployment
//! completes with no orphan, and the journal drains.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::support::binary::{admin_gql, serve};
use crate::support::deployments::{create_blueprint, pids};
use crate::support::processes::{alive, all_gone};
use crate::support::provider_repos::{ProviderRepo, process_metadata};
use crate::support::providers::{create_provider, wait_status};
use crate::support::settings::quick;
use crate::support::types::Deployment;
use crate::support::{ADMIN_TOKEN, TestApp, TestStore, at_path_as, eventually, journal_len};

/// The real binary is killed (SIGKILL) while a deployment of many resources is
/// under way. After a restart the journal drains, the deployment completes, and
/// the processes the provider runs are exactly those Corbel records.
#[tokio::test]
async fn a_server_killed_mid_deploy_recovers_without_orphans() {
    let store = Arc::new(TestStore::fresh().await);
    let app = TestApp::spawn_with(store.clone(), quick).await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (provider, _) = create_provider(
        &app,
        json!({ "name": "process", "gitUrl": repo.url(), "config": { "capacity": 500 } }),
    )
    .await;
    wait_status(&app, &provider, "CONNECTED").await;
    let mut source = String::from("resources:\n");
    for i in 0..40 {
        source.push_str(&format!(
            "  r{i}:\n    type: process.v1.service\n    config: {{ command: sleep, args: [\"300\"] }}\n"
        ));
    }
    let blueprint = create_blueprint(&app, "many", &source).await;
    let store = app.stop().await;

    let admin = ("CORBEL_ADMIN_TOKEN", ADMIN_TOKEN);
    let slow = ("CORBEL_DEPLOY_CONCURRENCY", "2");
    let mut served = serve(&store, &[admin, slow]);
    let addr = served.addr;
    eventually(Duration::from_secs(60), "the provider", || async {
        let body = admin_gql(
            addr,
            "query($id: ID!) { provider(id: $id) { status } }",
            json!({ "id": provider }),
        )
        .await?;
        (body["data"]["provider"]["status"] == "CONNECTED").then_some(())
    })
    .await;
    let body = admin_gql(
        addr,
        "mutation($input: DeployBlueprintInput!) { deployBlueprint(input: $input) { id } }",
        json!({ "input": { "blueprintId": blueprint, "name": "many" } }),
    )
    .await
    .unwrap();
    let id = body["data"]["deployBlueprint"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    eventually(Duration::from_secs(60), "some resources up", || async {
        let body = admin_gql(
            addr,
            "query($id: ID!) { deployment(id: $id) { nodes { state } } }",
            json!({ "id": id }),
        )
        .await?;
        let complete = body["data"]["deployment"]["nodes"]
            .as_array()?
            .iter()
            .filter(|n| n["state"] == "COMPLETE")
            .count();
        (complete >= 5).then_some(())
    })
    .await;
    served.child.kill().unwrap();
    served.child.wait().unwrap();

    let served = serve(&store, &[admin]);
    let addr = served.addr;
    let done = eventually(Duration::from_secs(120), "the deployment to finish", || async {
        let body = admin_gql(addr, "query($id: ID!) { deployment(id: $id) { state error nodes { id state outputs } } }", json!({ "id": id })).await?;
        let d: Deployment = at_path_as(&body, "deployment").ok()?;
        (d.state == "COMPLETE" || d.state == "FAILED").then_some(d)
    })
    .await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    let nodes = &done.nodes;
    assert_eq!(nodes.len(), 40);
    assert!(nodes.iter().all(|n| n.state == "COMPLETE"), "{done:?}");

    // No orphan: the provider's records are exactly Corbel's nodes, each alive.
    let recorded: BTreeSet<String> = std::fs::read_dir(
        store
            .data_dir()
            .join("providers")
            .join(&provider)
            .join("state")
            .join("resources"),
    )
    .unwrap()
    .map(|e| {
        e.unwrap()
            .path()
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    })
    .collect();
    let ours: BTreeSet<String> = nodes.iter().map(|n| n.id.clone()).collect();
    assert_eq!(recorded, ours);
    let running = pids(&done);
    assert_eq!(running.len(), 40);
    assert!(running.iter().all(|p| alive(*p)));
    let unique: BTreeSet<i32> = running.iter().copied().collect();
    assert_eq!(unique.len(), 40, "no resource was started twice");

    // The journal drained.
    let journal = journal_len(&store).await;
    assert_eq!(journal, 0);

    // Clean up through the API.
    let body = admin_gql(
        addr,
        "mutation($id: ID!) { destroyDeployment(id: $id) { id } }",
        json!({ "id": id }),
    )
    .await
    .unwrap();
    assert!(body.get("errors").is_none(), "{body}");
    eventually(Duration::from_secs(60), "destroyed", || async {
        let body = admin_gql(
            addr,
            "query($id: ID!) { deployment(id: $id) { state } }",
            json!({ "id": id }),
        )
        .await?;
        (body["data"]["deployment"]["state"] == "DESTROYED").then_some(())
    })
    .await;
    all_gone(&running).await;
    let mut served = served;
    served.child.kill().unwrap();
    served.child.wait().unwrap();
}
