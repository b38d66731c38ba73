//! Placement and capacity, as the provider's nodes report them.

use serde_json::json;

use crate::support::data;
use crate::support::deployments::{
    WEB, create_blueprint, deploy, destroy_and_wait, pids, settled, with_process_provider,
};

#[tokio::test]
async fn placement_and_capacity_follow_the_provider_nodes() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(&app, "web", WEB).await;
    let body = app
        .gql(
            "query($id: ID!) { raw: calculateCapacity(blueprintId: $id, resourceKey: \"web\") { node count } auto: calculateCapacity(blueprintId: $id, resourceKey: \"web\", strategy: AUTO, variables: {replicas: 5}) { node count } }",
            json!({ "id": blueprint }),
        )
        .await;
    let answer = data(&body);
    assert_eq!(answer["raw"][0]["count"], 50, "{answer}");
    assert_eq!(answer["auto"][0]["count"], 5, "{answer}");

    // What is deployed counts: after 4 nodes, 46 are left.
    let id = deploy(
        &app,
        &blueprint,
        "web",
        json!({ "variables": { "replicas": 3 } }),
    )
    .await;
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    let body = app
        .gql(
            "query($id: ID!) { calculateCapacity(blueprintId: $id, resourceKey: \"web\") { node count } }",
            json!({ "id": blueprint }),
        )
        .await;
    assert_eq!(data(&body)["calculateCapacity"][0]["count"], 46);

    // Two resources of one blueprint share the room: 30 + 30 do not fit in
    // the 46 left, so the plan fails before anything starts.
    let pair = create_blueprint(
        &app,
        "pair",
        "resources:\n  a: { type: process.v1.service, replicas: 30, config: { command: sleep, args: [\"300\"] } }\n  b: { type: process.v1.service, replicas: 30, config: { command: sleep, args: [\"300\"] } }\n",
    )
    .await;
    let too_many = deploy(&app, &pair, "pair", json!({})).await;
    let failed = settled(&app, &too_many, &["FAILED", "COMPLETE"]).await;
    assert_eq!(failed.state, "FAILED", "{failed:?}");
    let error = failed.error.as_deref().unwrap();
    assert!(error.contains("resources.b"), "{error}");
    assert!(failed.nodes.is_empty(), "nothing was planned");

    // More replicas than room: the deploy fails naming the placement.
    let id2 = deploy(
        &app,
        &blueprint,
        "too-big",
        json!({ "variables": { "replicas": 100 } }),
    )
    .await;
    let failed = settled(&app, &id2, &["FAILED", "COMPLETE"]).await;
    assert_eq!(failed.state, "FAILED");
    assert!(
        failed.error.as_deref().unwrap().contains("resources.web"),
        "{failed:?}"
    );

    destroy_and_wait(&app, &id, &pids(&done)).await;
    app.stop().await;
}
