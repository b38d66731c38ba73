//! Bad blueprints and variables refused naming the field, and a resource type
//! nobody serves: a warning, then a failed deploy.

use serde_json::json;

use crate::support::deployments::{WEB, create_blueprint, deploy, settled, with_process_provider};
use crate::support::{data, error_code};

#[tokio::test]
async fn bad_blueprints_and_variables_are_refused_naming_the_field() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    for (source, wants) in [
        ("resources:\n  a: { type: x, colour: red }\n", "colour"),
        (
            "resources:\n  a: { type: x, depends_on: [nope] }\n",
            "resources.a.depends_on[0]",
        ),
        (
            "resources:\n  a: { type: x, depends_on: [b] }\n  b: { type: x, depends_on: [a] }\n",
            "a -> b -> a",
        ),
        (
            "resources:\n  a: { type: x, config: { c: \"{{ missing }}\" } }\n",
            "missing",
        ),
        (
            "resources:\n  a: { type: x }\n  b: { type: x, config: { c: \"{{ resources.a.outputs.pid }}\" } }\n",
            "resources.b",
        ),
        (
            "variables:\n  n: { type: int, default: many }\nresources: {}\n",
            "variables.n",
        ),
        ("resources: [1, 2\n", "not valid YAML"),
    ] {
        let body = app
            .gql(
                "mutation($input: CreateBlueprintInput!) { createBlueprint(input: $input) { id } }",
                json!({ "input": { "name": "bad", "source": source } }),
            )
            .await;
        assert_eq!(error_code(&body), Some("VALIDATION"), "{source}: {body}");
        let message = body["errors"][0]["message"].as_str().unwrap();
        assert!(message.contains(wants), "{source}: {message}");
    }
    // Each problem is also in `extensions.problems`, with the line it points
    // at, for an editor to mark.
    let body = app
        .gql(
            "mutation($input: CreateBlueprintInput!) { createBlueprint(input: $input) { id } }",
            json!({ "input": { "name": "bad", "source": "version: \"1\"\nresources:\n  a:\n    type: x\n    depends_on:\n      - nope\n  b: { type: x, depends_on: [a, zz] }\n" } }),
        )
        .await;
    let problems = &body["errors"][0]["extensions"]["problems"];
    assert_eq!(
        problems,
        &json!([
            { "path": "resources.a.depends_on[0]", "message": problems[0]["message"], "line": 6 },
            { "path": "resources.b.depends_on[1]", "message": problems[1]["message"], "line": 7 },
        ]),
        "{body}"
    );
    assert!(problems[1]["message"].as_str().unwrap().contains("zz"));
    // A document that is not YAML: the line the reader stopped at.
    let body = app
        .gql(
            "mutation($input: CreateBlueprintInput!) { createBlueprint(input: $input) { id } }",
            json!({ "input": { "name": "bad", "source": "version: \"1\"\nresources:\n  a:\n    type: [x\n" } }),
        )
        .await;
    let problems = &body["errors"][0]["extensions"]["problems"];
    assert_eq!(problems[0]["path"], "", "{body}");
    assert!(
        problems[0]["line"]
            .as_u64()
            .is_some_and(|l| (4..=5).contains(&l)),
        "{body}"
    );
    let listed = app.gql("{ blueprints { totalCount } }", json!({})).await;
    assert_eq!(
        data(&listed)["blueprints"]["totalCount"],
        0,
        "nothing stored"
    );

    let blueprint = create_blueprint(&app, "web", WEB).await;
    for (variables, wants) in [
        (json!({ "replicas": "three" }), "variables.replicas"),
        (json!({ "unknown": 1 }), "unknown"),
    ] {
        let body = app
            .gql(
                "mutation($input: DeployBlueprintInput!) { deployBlueprint(input: $input) { id } }",
                json!({ "input": { "blueprintId": blueprint, "name": "x", "variables": variables } }),
            )
            .await;
        assert_eq!(error_code(&body), Some("VALIDATION"), "{body}");
        let message = body["errors"][0]["message"].as_str().unwrap();
        assert!(message.contains(wants), "{message}");
    }
    let listed = app.gql("{ deployments { totalCount } }", json!({})).await;
    assert_eq!(data(&listed)["deployments"]["totalCount"], 0);

    // A resource type nobody serves is a warning, then an error at deploy.
    let orphan = create_blueprint(
        &app,
        "orphan",
        "resources:\n  a: { type: nobody.v1.thing }\n",
    )
    .await;
    let body = app
        .gql(
            "query($id: ID!) { blueprint(id: $id) { warnings } }",
            json!({ "id": orphan }),
        )
        .await;
    let warnings = data(&body)["blueprint"]["warnings"].to_string();
    assert!(warnings.contains("nobody.v1.thing"), "{warnings}");
    let id = deploy(&app, &orphan, "orphan", json!({})).await;
    let failed = settled(&app, &id, &["FAILED"]).await;
    assert!(
        failed.error.as_deref().unwrap().contains("nobody.v1.thing"),
        "{failed:?}"
    );
    app.stop().await;
}
