//! A project's quotas under a race: 20 deploys at once never pass its room,
//! counted in resources or in a quantity the provider names, and a lease
//! longer than the project allows is refused.

use serde_json::{Value, json};

use super::{destroy_all, project, svc_blueprint, user};
use crate::support::deployments::{settled, with_process_provider};
use crate::support::{TestApp, data, error_code};

/// 20 deploys at once into a project with room for 5 resources: exactly 5
/// complete, each of the others fails saying which quota and by how much,
/// and the usage says 5. A lease longer than the project allows is refused,
/// and a deploy with none gets the longest allowed.
#[tokio::test]
async fn twenty_deploys_racing_for_the_last_room_never_pass_the_quota() {
    let Raced {
        app,
        owner,
        alpha,
        blueprint,
        complete,
        _repo,
    } = race_for_the_last_room(
        json!({ "maxResources": 5, "maxLeaseSeconds": 3600 }),
        "quota maxResources of project `alpha`: 5 allowed, 5 in use, this deployment needs 1: 1 over",
    )
    .await;
    let leased = app
        .gql_as(
            Some(&owner),
            "query($id: ID!) { deployment(id: $id) { expiresAt } }",
            json!({ "id": complete[0] }),
        )
        .await;
    assert!(
        data(&leased)["deployment"]["expiresAt"].is_string(),
        "the longest lease is given: {leased}"
    );
    let usage = app
        .gql_as(
            Some(&owner),
            "query($id: ID!) { project(id: $id) { usage { resources quantities } } }",
            json!({ "id": alpha }),
        )
        .await;
    assert_eq!(
        data(&usage)["project"]["usage"],
        json!({ "resources": 5, "quantities": { "processes": 5 } })
    );

    let too_long = (chrono::Utc::now() + chrono::TimeDelta::hours(2)).to_rfc3339();
    let refused = app
        .gql_as(
            Some(&owner),
            "mutation($b: ID!, $at: DateTime!) { deployBlueprint(input: { blueprintId: $b, name: \"long\", expiresAt: $at }) { id } }",
            json!({ "b": blueprint, "at": too_long }),
        )
        .await;
    assert_eq!(error_code(&refused), Some("VALIDATION"), "{refused}");
    assert!(
        refused.to_string().contains("maxLeaseSeconds") && refused.to_string().contains("s over"),
        "{refused}"
    );

    destroy_all(&app, &owner, &complete).await;
}

/// The same race for a named quantity the provider describes: each process
/// service counts one `processes`.
#[tokio::test]
async fn twenty_deploys_racing_for_a_named_quota_never_pass_it() {
    let Raced {
        app,
        owner,
        alpha,
        complete,
        _repo,
        ..
    } = race_for_the_last_room(
        json!({ "quotas": { "processes": 5, "gpus": 0 } }),
        "quota processes of project `alpha`: 5 allowed, 5 in use, this deployment needs 1: 1 over",
    )
    .await;
    let usage = app
        .gql_as(
            Some(&owner),
            "query($id: ID!) { project(id: $id) { usage { resources quantities } } }",
            json!({ "id": alpha }),
        )
        .await;
    assert_eq!(
        data(&usage)["project"]["usage"],
        json!({ "resources": 5, "quantities": { "processes": 5 } })
    );
    destroy_all(&app, &owner, &complete).await;
    let usage = app
        .gql_as(
            Some(&owner),
            "query($id: ID!) { project(id: $id) { usage { resources quantities } } }",
            json!({ "id": alpha }),
        )
        .await;
    assert_eq!(
        data(&usage)["project"]["usage"],
        json!({ "resources": 0, "quantities": {} }),
        "destroyed resources count no more"
    );
}

/// A project `alpha` of a user `owner` with the limits `input` (an
/// `UpdateProjectInput`) that leave room for five one-service deployments,
/// and 20 deploys of one racing for it: exactly five complete, the others
/// fail planning with `refusal` and hold nothing.
async fn race_for_the_last_room(input: Value, refusal: &str) -> Raced {
    let (app, _provider, repo) = with_process_provider(|_| {}).await;
    let owner = user(&app, "owner", "USER").await;
    let alpha = project(&app, &owner, "alpha").await;
    let limited = app
        .gql_as(
            Some(&owner),
            "mutation($id: ID!, $input: UpdateProjectInput!) { updateProject(id: $id, input: $input) { id } }",
            json!({ "id": alpha, "input": input }),
        )
        .await;
    data(&limited);
    let blueprint = svc_blueprint(&app, &owner, &alpha).await;

    let racing = (0..20).map(|i| {
        let (app, owner, blueprint) = (&app, &owner, &blueprint);
        async move {
            let body = app
                .gql_as(
                    Some(owner),
                    "mutation($b: ID!, $n: String!) { deployBlueprint(input: { blueprintId: $b, name: $n }) { id } }",
                    json!({ "b": blueprint, "n": format!("r{i}") }),
                )
                .await;
            data(&body)["deployBlueprint"]["id"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    });
    let ids = futures_util::future::join_all(racing).await;
    let mut complete = Vec::new();
    for id in &ids {
        let d = settled(&app, id, &["COMPLETE", "FAILED"]).await;
        if d.state == "COMPLETE" {
            complete.push(id.clone());
        } else {
            let error = d.error.unwrap_or_default();
            assert!(error.contains(refusal), "{error}");
            assert!(d.nodes.is_empty(), "a refused plan holds nothing");
        }
    }
    assert_eq!(complete.len(), 5, "exactly the room there was");
    Raced {
        app,
        owner,
        alpha,
        blueprint,
        complete,
        _repo: repo,
    }
}

/// What [`race_for_the_last_room`] leaves: the app, the owner's token, the
/// project, the blueprint and the deployments that completed.
struct Raced {
    app: TestApp,
    owner: String,
    alpha: String,
    blueprint: String,
    complete: Vec<String>,
    _repo: crate::support::provider_repos::ProviderRepo,
}
