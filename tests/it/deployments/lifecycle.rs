//! A blueprint deployed, shown, kept from changing under its deployment,
//! destroyed (in reverse order, counted in `/metrics`), and a lease that expires.

use serde_json::{Value, json};

use crate::support::deployments::{
    WEB, create_blueprint, deploy, deployment, pids, settled, with_process_provider,
};
use crate::support::processes::{alive, all_gone};
use crate::support::providers::wait_status;
use crate::support::types::Event;
use crate::support::{data, error_code};

#[tokio::test]
async fn a_blueprint_deploys_through_the_process_provider_and_is_destroyed() {
    let (app, provider, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(&app, "web", WEB).await;
    let body = app
        .gql(
            "query($id: ID!) { blueprint(id: $id) { name resources { key type dependsOn replicas strategy } variables { name type default } warnings } }",
            json!({ "id": blueprint }),
        )
        .await;
    let shown = &data(&body)["blueprint"];
    assert_eq!(shown["resources"][1]["dependsOn"], json!(["db"]));
    assert_eq!(shown["resources"][1]["replicas"], "{{ replicas }}");
    assert_eq!(shown["variables"][0]["default"], 2);
    assert_eq!(shown["warnings"], json!([]));

    let id = deploy(
        &app,
        &blueprint,
        "web-1",
        json!({ "variables": { "replicas": 3 } }),
    )
    .await;
    // Changing the blueprint later does not change what this deployment runs.
    let body = app
        .gql(
            "mutation($id: ID!, $source: String!) { updateBlueprint(id: $id, input: {description: \"v2\", source: $source}) { description resources { key } } }",
            json!({ "id": blueprint, "source": WEB.replace("  web:", "  www:") }),
        )
        .await;
    let updated = &data(&body)["updateBlueprint"];
    assert_eq!(updated["description"], "v2");
    assert_eq!(updated["resources"][1]["key"], "www");
    let refused = app
        .gql(
            "mutation($id: ID!) { updateBlueprint(id: $id, input: {source: \"resources: {a: {type: x, depends_on: [zz]}}\"}) { id } }",
            json!({ "id": blueprint }),
        )
        .await;
    assert_eq!(error_code(&refused), Some("VALIDATION"), "{refused}");
    let runs = app
        .gql(
            "query($id: ID!) { deployment(id: $id) { resources { key dependsOn replicas } } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(
        data(&runs)["deployment"]["resources"],
        json!([
            { "key": "db", "dependsOn": [], "replicas": "1" },
            { "key": "web", "dependsOn": ["db"], "replicas": "{{ replicas }}" },
        ]),
        "the deployment's own copy, with its edges"
    );
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    let nodes = &done.nodes;
    assert_eq!(nodes.len(), 4, "db and three web replicas: {done:?}");
    assert!(nodes.iter().all(|n| n.state == "COMPLETE"));
    assert!(
        nodes
            .iter()
            .all(|n| n.provider_id.as_deref() == Some(provider.as_str()))
    );
    assert!(
        nodes
            .iter()
            .all(|n| n.provider.as_ref().is_some_and(|p| p.name == "process"))
    );
    assert!(nodes.iter().all(|n| n.node.is_some()), "placed on the host");
    let running = pids(&done);
    assert_eq!(running.len(), 4);
    assert!(running.iter().all(|p| alive(*p)));

    // The web replicas got db's pid and the greeting, unescaped.
    let db_pid = done.node("db").pid().unwrap();
    let web_pid = done.node("web").pid().unwrap();
    let environ = std::fs::read(format!("/proc/{web_pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(environ.contains(&format!("DB_PID={db_pid}")), "{environ}");
    assert!(environ.contains("GREETING=a <b> & 'c'"), "{environ}");

    // Deleting the blueprint is refused while the deployment lives.
    let refused = app
        .gql(
            "mutation($id: ID!) { deleteBlueprint(id: $id) }",
            json!({ "id": blueprint }),
        )
        .await;
    assert_eq!(error_code(&refused), Some("CONFLICT"), "{refused}");

    // The provider cannot go while it runs resources (unloaded or not).
    data(
        &app.gql(
            "mutation($id: ID!) { unloadProvider(id: $id) { status } }",
            json!({ "id": provider }),
        )
        .await,
    );
    let refused = app
        .gql(
            "mutation($id: ID!) { deleteProvider(id: $id) }",
            json!({ "id": provider }),
        )
        .await;
    assert_eq!(error_code(&refused), Some("CONFLICT"), "{refused}");
    let message = refused["errors"][0]["message"].as_str().unwrap();
    // It names the deployments holding them, by name and id.
    assert!(
        message.contains("holds 4 resource(s) of 1 deployment(s)")
            && message.contains(&format!("`web-1` ({id}, 4 resource(s))")),
        "{message}"
    );
    data(
        &app.gql(
            "mutation($id: ID!) { loadProvider(id: $id) { status } }",
            json!({ "id": provider }),
        )
        .await,
    );
    wait_status(&app, &provider, "CONNECTED").await;

    let body = app
        .gql(
            "mutation($id: ID!) { destroyDeployment(id: $id) { state } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&body)["destroyDeployment"]["state"], "DESTROYING");
    let gone = settled(&app, &id, &["DESTROYED", "FAILED"]).await;
    assert_eq!(gone.state, "DESTROYED", "{gone:?}");
    all_gone(&running).await;

    let events: Vec<Event> = app
        .query_as(
            "query($id: ID!) { deployment(id: $id) { events { kind nodeKey state message } } }",
            json!({ "id": id }),
            "deployment.events",
        )
        .await;
    let states: Vec<&str> = events
        .iter()
        .filter(|e| e.kind == "STATE")
        .filter_map(|e| e.state.as_deref())
        .collect();
    assert_eq!(states.first(), Some(&"IN_PROGRESS"));
    assert!(
        states.contains(&"COMPLETE") && states.last() == Some(&"DESTROYED"),
        "{states:?}"
    );
    // db completed before any web replica started.
    let position = |key: &str, state: &str| {
        events
            .iter()
            .position(|e| e.is(key, state))
            .unwrap_or_else(|| panic!("no {key} {state} in {events:?}"))
    };
    assert!(position("db[0]", "COMPLETE") < position("web[0]", "IN_PROGRESS"));
    // Destroy went the other way.
    assert!(position("web[0]", "DESTROYED") < position("db[0]", "DESTROYING"));

    // The steps and the provider calls are counted in /metrics.
    let metrics = app.metrics().await;
    for line in [
        r#"corbel_deploy_steps_total{intent="DEPLOY",outcome="complete"} 4"#,
        r#"corbel_deploy_steps_total{intent="DESTROY",outcome="complete"} 4"#,
        r#"corbel_provider_calls_total{call="ListNodes",outcome="ok"}"#,
        r#"corbel_provider_calls_total{call="DeployResource",outcome="ok"} 4"#,
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }

    let deleted = app
        .gql(
            "mutation($id: ID!) { deleteBlueprint(id: $id) }",
            json!({ "id": blueprint }),
        )
        .await;
    assert_eq!(data(&deleted)["deleteBlueprint"], true);
    app.stop().await;
}

#[tokio::test]
async fn a_lease_in_the_past_is_refused_and_an_expired_one_is_reaped_saying_why() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(&app, "web", WEB).await;
    let past = (chrono::Utc::now() - chrono::Duration::seconds(1)).to_rfc3339();
    let refused = app
        .gql(
            "mutation($input: DeployBlueprintInput!) { deployBlueprint(input: $input) { id } }",
            json!({ "input": { "blueprintId": blueprint, "name": "late", "expiresAt": past } }),
        )
        .await;
    assert_eq!(error_code(&refused), Some("VALIDATION"), "{refused}");
    let message = refused["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("`expiresAt`") && message.contains("the server's time is"),
        "names the field and the server's time: {message}"
    );
    let listed = app.gql("{ deployments { totalCount } }", json!({})).await;
    assert_eq!(
        data(&listed)["deployments"]["totalCount"],
        0,
        "nothing made"
    );

    let far = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let id = deploy(
        &app,
        &blueprint,
        "leased",
        json!({ "variables": { "replicas": 1 }, "expiresAt": far }),
    )
    .await;
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    let extend = "mutation($id: ID!, $at: DateTime) { extendDeployment(id: $id, expiresAt: $at) { expiresAt } }";
    let refused = app.gql(extend, json!({ "id": id, "at": past })).await;
    assert_eq!(error_code(&refused), Some("VALIDATION"), "{refused}");
    assert_eq!(deployment(&app, &id).await.state, "COMPLETE", "left alone");

    let soon = chrono::Utc::now() + chrono::Duration::milliseconds(500);
    data(
        &app.gql(extend, json!({ "id": id, "at": soon.to_rfc3339() }))
            .await,
    );
    settled(&app, &id, &["DESTROYED"]).await;
    all_gone(&pids(&done)).await;
    // Why it went is in its history, not only in the server's log.
    let events = app
        .gql(
            "query($id: ID!) { deployment(id: $id) { events { message } } }",
            json!({ "id": id }),
        )
        .await;
    let expected = format!(
        "lease expired at {}",
        soon.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    let messages: Vec<&str> = data(&events)["deployment"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    assert!(
        messages.iter().any(|m| m.contains(&expected)),
        "{expected} in {events}"
    );
    // So is the lease being moved (a refused move is not).
    let moved: Vec<_> = messages
        .iter()
        .filter(|m| m.starts_with("lease moved"))
        .collect();
    assert_eq!(moved.len(), 1, "{events}");
    assert!(moved[0].contains(&soon.to_rfc3339()), "{events}");
    app.stop().await;
}

/// The list pages newest first; `hasNextPage` is known without a count, and
/// `totalCount` (counted only when asked) counts what the filter takes.
#[tokio::test]
async fn deployments_page_newest_first_and_count_what_the_filter_takes() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(&app, "web", WEB).await;
    let none = json!({ "variables": { "replicas": 0 } });
    for name in ["page-a", "page-b", "other-c"] {
        let id = deploy(&app, &blueprint, name, none.clone()).await;
        settled(&app, &id, &["COMPLETE"]).await;
    }
    let list = "query($f: DeploymentFilter!, $first: Int, $after: String) {
        deployments(filter: $f, first: $first, after: $after) {
          totalCount pageInfo { hasNextPage endCursor } nodes { name } } }";
    let page = |filter: Value, first: i32, after: Value| {
        let app = &app;
        async move {
            let body = app
                .gql(list, json!({ "f": filter, "first": first, "after": after }))
                .await;
            let page = data(&body)["deployments"].clone();
            let names: Vec<String> = page["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n["name"].as_str().unwrap().to_owned())
                .collect();
            (names, page)
        }
    };
    let (names, first) = page(json!({}), 2, Value::Null).await;
    assert_eq!(names, ["other-c", "page-b"], "newest first");
    assert_eq!(first["totalCount"], 3);
    assert_eq!(first["pageInfo"]["hasNextPage"], true);
    let (names, rest) = page(json!({}), 2, first["pageInfo"]["endCursor"].clone()).await;
    assert_eq!(names, ["page-a"]);
    assert_eq!(rest["pageInfo"]["hasNextPage"], false);
    let (names, searched) = page(json!({ "search": "page" }), 1, Value::Null).await;
    assert_eq!(names, ["page-b"]);
    assert_eq!(searched["totalCount"], 2);
    assert_eq!(searched["pageInfo"]["hasNextPage"], true);
    let (names, all) = page(json!({ "search": "page" }), 5, Value::Null).await;
    assert_eq!(names, ["page-b", "page-a"]);
    assert_eq!(all["pageInfo"]["hasNextPage"], false);
    let (names, empty) = page(json!({ "states": ["FAILED"] }), 5, Value::Null).await;
    assert!(names.is_empty());
    assert_eq!(empty["totalCount"], 0);
    assert_eq!(empty["pageInfo"]["hasNextPage"], false);
}
