//! Dependency errors carry their codes; editElement keeps name and version.

use serde_json::json;

use crate::support::repositories::{create_id, mutate, settled};
use crate::support::{TestApp, data, error_code};

#[tokio::test]
async fn dependency_errors_carry_their_codes() {
    let app = TestApp::spawn().await;
    let id = create_id(&app, json!({"name": "m", "driver": {"migration": {}}})).await;
    settled(&app, &id, "ACTIVE").await;
    let upload = |yaml: String| {
        let app = &app;
        let id = id.clone();
        async move {
            let body = app
                .gql("mutation($r: ID!, $m: String!) { uploadElement(repositoryId: $r, manifest: $m) { id } }", json!({"r": id, "m": yaml}))
                .await;
            data(&body)["uploadElement"]["id"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let element = |name: &str, requirements: &str| {
        format!("name: {name}\nversion: 1.0.0\nresources: {{}}\nrequirements: {requirements}\n")
    };
    let lonely = upload(element("lonely", "{missing: {}}")).await;
    let cyc_a = upload(element("cyc-a", "{cyc-b: {}}")).await;
    upload(element("cyc-b", "{cyc-a: {}}")).await;
    // A malformed constraint is refused before anything is stored.
    let odd = app
        .gql("mutation($r: ID!, $m: String!) { uploadElement(repositoryId: $r, manifest: $m) { id } }",
            json!({"r": id, "m": element("odd", "{lonely: {about: 1.0.0}}")}))
        .await;
    assert_eq!(
        error_code(&odd),
        Some("DEPENDENCY_CONSTRAINT_FORMAT"),
        "{odd}"
    );
    assert!(
        odd["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("`about`")
    );
    let picky = upload(element("picky", "{cyc-b: {from_version: 9.0.0}}")).await;
    for (element, code) in [
        (&lonely, "DEPENDENCY_NOT_FOUND"),
        (&cyc_a, "DEPENDENCY_CYCLE"),
        (&picky, "DEPENDENCY_NOT_FOUND"),
    ] {
        let body = mutate(
            &app,
            "installElement(id: $id)",
            "($id: ID!)",
            json!({"id": element}),
        )
        .await;
        assert_eq!(error_code(&body), Some(code), "{body}");
        let state = app
            .gql(
                "query($id: ID!) { element(id: $id) { installed status } }",
                json!({"id": element}),
            )
            .await;
        assert_eq!(
            data(&state)["element"],
            json!({"installed": false, "status": "NEW"}),
            "nothing changed"
        );
    }
    let cycle = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": cyc_a}),
    )
    .await;
    let message = cycle["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("cyc-a 1.0.0") && message.contains("cyc-b 1.0.0"),
        "{message}"
    );

    // editElement keeps name and version.
    let renamed = app
        .gql(
            "mutation($id: ID!, $m: JSON!) { editElement(id: $id, manifest: $m) { id } }",
            json!({"id": lonely, "m": {"name": "other", "version": "1.0.0", "resources": {}}}),
        )
        .await;
    assert_eq!(error_code(&renamed), Some("VALIDATION"), "{renamed}");
    let fixed = app
        .gql("mutation($id: ID!, $m: JSON!) { editElement(id: $id, manifest: $m) { manifest } }",
            json!({"id": lonely, "m": {"name": "lonely", "version": "1.0.0", "resources": {"r": {"type": "x"}}}}))
        .await;
    assert_eq!(
        data(&fixed)["editElement"]["manifest"]["resources"]["r"]["type"],
        "x"
    );
    // Its blueprint now has a resource nobody serves: the installation fails
    // and the element stays uninstalled.
    let refused = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": lonely}),
    )
    .await;
    assert_eq!(error_code(&refused), Some("DEPLOYMENT_FAILED"), "{refused}");
    let message = refused["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("lonely 1.0.0") && message.contains("`x`"),
        "{message}"
    );
    let emptied = app
        .gql("mutation($id: ID!, $m: JSON!) { editElement(id: $id, manifest: $m) { installed status } }",
            json!({"id": lonely, "m": {"name": "lonely", "version": "1.0.0", "resources": {}}}))
        .await;
    assert_eq!(data(&emptied)["editElement"]["installed"], false);
    assert_eq!(data(&emptied)["editElement"]["status"], "ERROR");
    let installed = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": lonely}),
    )
    .await;
    assert_eq!(data(&installed)["installElement"]["installed"], true);
}
