//! Projects as walls: members see their project's blueprints and
//! deployments while an outsider is told nothing exists, a viewer may look
//! but not touch, a blueprint's name is unique within its project, and a
//! subscription ends when its reader leaves the project.

use serde_json::{Value, json};

use super::{ONE_SERVICE, destroy_all, member, project, svc_blueprint, user};
use crate::support::deployments::{deploy, settled, with_process_provider};
use crate::support::websocket::{connect, next_json, send};
use crate::support::{TestApp, data, error_code};

#[tokio::test]
async fn members_see_their_projects_and_an_outsider_is_told_nothing_exists() {
    let (app, provider, _repo) = with_process_provider(|_| {}).await;
    let owner = user(&app, "owner", "USER").await;
    let viewer = user(&app, "viewer", "USER").await;
    let outsider = user(&app, "outsider", "USER").await;
    let alpha = project(&app, &owner, "alpha").await;
    project(&app, &outsider, "beta").await;
    // Setting a member again changes their role (one row, not two).
    member(&app, &owner, &alpha, "viewer", "DEVELOPER").await;
    member(&app, &owner, &alpha, "viewer", "VIEWER").await;

    let blueprint = svc_blueprint(&app, &owner, &alpha).await;
    let body = app
        .gql_as(
            Some(&owner),
            "mutation($b: ID!) { deployBlueprint(input: { blueprintId: $b, name: \"one\" }) { id } }",
            json!({ "b": blueprint }),
        )
        .await;
    let deployment = data(&body)["deployBlueprint"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let done = settled(&app, &deployment, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE");

    // The viewer sees them; the outsider's lists are empty of them.
    let lists = "{ projects { name } blueprints(first: 50) { nodes { id } } deployments(first: 50) { nodes { id } } }";
    let seen = app.gql_as(Some(&viewer), lists, json!({})).await;
    assert_eq!(data(&seen)["projects"], json!([{ "name": "alpha" }]));
    assert_eq!(
        data(&seen)["blueprints"]["nodes"],
        json!([{ "id": blueprint }])
    );
    assert_eq!(
        data(&seen)["deployments"]["nodes"],
        json!([{ "id": deployment }])
    );
    let unseen = app.gql_as(Some(&outsider), lists, json!({})).await;
    assert_eq!(data(&unseen)["projects"], json!([{ "name": "beta" }]));
    assert_eq!(data(&unseen)["blueprints"]["nodes"], json!([]));
    assert_eq!(data(&unseen)["deployments"]["nodes"], json!([]));
    // The overview's figures count only what the caller may see.
    let figures =
        "{ changesByHour(hours: 2) { deployments resources } resourcesByHealth { count } }";
    let seen = app.gql_as(Some(&viewer), figures, json!({})).await;
    let hours = data(&seen)["changesByHour"].as_array().unwrap();
    assert_eq!(hours.len(), 2, "{seen}");
    assert_eq!(
        hours[1],
        json!({ "deployments": 1, "resources": 1 }),
        "{seen}"
    );
    let deployed: u64 = data(&seen)["resourcesByHealth"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["count"].as_u64().unwrap())
        .sum();
    assert_eq!(deployed, 1, "{seen}");
    let unseen = app.gql_as(Some(&outsider), figures, json!({})).await;
    assert_eq!(
        data(&unseen)["changesByHour"],
        json!([{ "deployments": 0, "resources": 0 }, { "deployments": 0, "resources": 0 }])
    );
    assert_eq!(data(&unseen)["resourcesByHealth"], json!([]));
    let refused = app
        .gql_as(
            Some(&viewer),
            "{ changesByHour(hours: 0) { from } }",
            json!({}),
        )
        .await;
    assert_eq!(error_code(&refused), Some("VALIDATION"), "{refused}");

    // An outsider asking by id gets what a missing id gets, word for word.
    let missing = uuid::Uuid::now_v7().to_string();
    let query = "query($id: ID!) { deployment(id: $id) { name } }";
    let theirs = app
        .gql_as(Some(&outsider), query, json!({ "id": deployment }))
        .await;
    let nothing = app
        .gql_as(Some(&outsider), query, json!({ "id": missing }))
        .await;
    assert_eq!(error_code(&theirs), Some("NOT_FOUND"), "{theirs}");
    assert_eq!(
        theirs["errors"][0]["message"]
            .as_str()
            .unwrap()
            .replace(&deployment, "ID"),
        nothing["errors"][0]["message"]
            .as_str()
            .unwrap()
            .replace(&missing, "ID"),
    );
    // The viewer may look but not touch: FORBIDDEN, naming the role needed.
    let refused = app
        .gql_as(
            Some(&viewer),
            "mutation($id: ID!) { destroyDeployment(id: $id) { state } }",
            json!({ "id": deployment }),
        )
        .await;
    assert_eq!(error_code(&refused), Some("FORBIDDEN"), "{refused}");
    assert!(refused.to_string().contains("DEPLOYER"), "{refused}");
    // A blueprint without a project goes to `default`, where only server
    // admins (and its members) may put one.
    let refused = app
        .gql_as(
            Some(&owner),
            "mutation($s: String!) { createBlueprint(input: { name: \"x\", source: $s }) { id } }",
            json!({ "s": ONE_SERVICE }),
        )
        .await;
    assert_eq!(error_code(&refused), Some("NOT_FOUND"), "{refused}");
    // Providers are anyone's to read, but their log is the server admins'.
    let read = app
        .gql_as(
            Some(&viewer),
            "query($id: ID!) { provider(id: $id) { name config } }",
            json!({ "id": provider }),
        )
        .await;
    assert_eq!(data(&read)["provider"]["name"], "process");
    let log = app
        .gql_as(
            Some(&viewer),
            "query($id: ID!) { provider(id: $id) { logs { line } } }",
            json!({ "id": provider }),
        )
        .await;
    assert_eq!(error_code(&log), Some("FORBIDDEN"), "{log}");
    // A project that holds things is not deleted.
    let refused = app
        .gql_as(
            Some(&owner),
            "mutation($id: ID!) { deleteProject(id: $id) }",
            json!({ "id": alpha }),
        )
        .await;
    assert_eq!(error_code(&refused), Some("CONFLICT"), "{refused}");
    destroy_all(&app, &owner, std::slice::from_ref(&deployment)).await;
}

/// A blueprint's name is unique in its project: another project may use it
/// (and learns nothing of the first), the same project may not.
#[tokio::test]
async fn blueprint_names_are_unique_in_a_project_not_across_the_server() {
    let (app, _provider, _repo) = with_process_provider(|_| {}).await;
    let ann = user(&app, "ann", "USER").await;
    let eve = user(&app, "eve", "USER").await;
    let alpha = project(&app, &ann, "alpha").await;
    let beta = project(&app, &eve, "beta").await;
    let create = "mutation($p: ID!, $s: String!) { createBlueprint(input: { projectId: $p, name: \"web\", source: $s }) { id name } }";
    for (token, project) in [(&ann, &alpha), (&eve, &beta)] {
        let made = app
            .gql_as(
                Some(token),
                create,
                json!({ "p": project, "s": ONE_SERVICE }),
            )
            .await;
        assert_eq!(data(&made)["createBlueprint"]["name"], "web", "{made}");
    }
    let again = app
        .gql_as(Some(&ann), create, json!({ "p": alpha, "s": ONE_SERVICE }))
        .await;
    assert_eq!(error_code(&again), Some("CONFLICT"), "{again}");
    assert!(
        again
            .to_string()
            .contains("a blueprint named `web` exists in this project"),
        "{again}"
    );
}

/// A member following a deployment's events stops receiving them when they
/// leave the project: the subscription ends (`complete`) at once.
#[tokio::test]
async fn a_subscription_ends_when_its_reader_leaves_the_project() {
    let (app, _provider, _repo) = with_process_provider(|_| {}).await;
    let owner = user(&app, "owner", "USER").await;
    let viewer = user(&app, "viewer", "USER").await;
    let alpha = project(&app, &owner, "alpha").await;
    member(&app, &owner, &alpha, "viewer", "VIEWER").await;
    let blueprint = svc_blueprint(&app, &owner, &alpha).await;
    let deployment = deploy(&app, &blueprint, "one", json!({})).await;
    settled(&app, &deployment, &["COMPLETE"]).await;

    let query = "subscription($id: ID!) { deploymentEvents(id: $id) { kind state } }";
    let first = first_message_and_socket(&app, &viewer, query, &json!({ "id": deployment })).await;
    let (mut ws, message) = first;
    assert_eq!(message["type"], "next", "{message}");
    let removed = app
        .gql_as(
            Some(&owner),
            "mutation($p: ID!) { removeProjectMember(projectId: $p, username: \"viewer\") }",
            json!({ "p": alpha }),
        )
        .await;
    data(&removed);
    // The history is replayed first; after it, the end (each read waits
    // at most 10 s, and the history is a few events long).
    let mut ended = None;
    for _ in 0..100 {
        let message = next_json(&mut ws).await.expect("the socket stays open");
        if message["type"] == "complete" {
            ended = Some(message);
            break;
        }
        assert_eq!(message["type"], "next", "{message}");
    }
    assert_eq!(ended.expect("the subscription completes")["id"], "1");
    // Asked again, the deployment is not there for them.
    let again = app
        .gql_as(
            Some(&viewer),
            "query($id: ID!) { deployment(id: $id) { name } }",
            json!({ "id": deployment }),
        )
        .await;
    assert_eq!(error_code(&again), Some("NOT_FOUND"), "{again}");
    destroy_all(&app, &owner, std::slice::from_ref(&deployment)).await;
}

/// Subscribes as `token` and returns the socket with its first answer.
async fn first_message_and_socket(
    app: &TestApp,
    token: &str,
    query: &str,
    vars: &Value,
) -> (crate::support::websocket::Ws, Value) {
    let mut ws = connect(app.addr, "graphql-transport-ws").await;
    send(
        &mut ws,
        json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {token}") } }),
    )
    .await;
    assert_eq!(next_json(&mut ws).await.unwrap()["type"], "connection_ack");
    send(
        &mut ws,
        json!({ "id": "1", "type": "subscribe", "payload": { "query": query, "variables": vars } }),
    )
    .await;
    let message = next_json(&mut ws).await.expect("an answer");
    (ws, message)
}
