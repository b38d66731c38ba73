//! Blueprints and deployments, deployed through the real `corbel-provider-process`
//! (loaded from git like any provider): real processes are started, placed,
//! rolled back, destroyed and recovered after a crash of the real server.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::binary::serve;
use crate::support::deployments::{
    DEPLOYMENT_FIELDS, WEB, create_blueprint, deploy, deployment, destroy_and_wait, pids, settled,
    with_process_provider,
};
use crate::support::processes::{alive, all_gone, provider_pid};
use crate::support::provider_repos::{ProviderRepo, fixture_metadata, process_metadata};
use crate::support::providers::{create_provider, wait_status};
use crate::support::settings::quick;
use crate::support::types::{Deployment, Event};
use crate::support::websocket::{next_json, subscribe};
use crate::support::{
    ADMIN_TOKEN, TestApp, TestStore, at_path_as, data, error_code, eventually, journal_len,
};

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
    assert!(message.contains("holds 4 resource(s)"), "{message}");
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
    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
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

#[tokio::test]
async fn deployment_events_replay_history_then_follow_live() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(&app, "web", WEB).await;
    let id = deploy(
        &app,
        &blueprint,
        "watched",
        json!({ "variables": { "replicas": 1 } }),
    )
    .await;
    settled(&app, &id, &["COMPLETE"]).await;

    let mut ws = subscribe(
        app.addr,
        "subscription($id: ID!) { deploymentEvents(id: $id) { id kind nodeKey state message } }",
        json!({ "id": id }),
    )
    .await;
    let mut seen: Vec<Value> = Vec::new();
    let mut destroying = false;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(60), next_json(&mut ws))
            .await
            .expect("an event in time")
            .expect("the stream stays open");
        let event = message["payload"]["data"]["deploymentEvents"].clone();
        let complete = event["kind"] == "STATE" && event["state"] == "COMPLETE";
        let destroyed = event["kind"] == "STATE" && event["state"] == "DESTROYED";
        seen.push(event);
        if complete && !destroying {
            // The replay reached the end of the history: now act, and the
            // rest must arrive live.
            destroying = true;
            let body = app
                .gql(
                    "mutation($id: ID!) { destroyDeployment(id: $id) { id } }",
                    json!({ "id": id }),
                )
                .await;
            data(&body);
        }
        if destroyed {
            break;
        }
    }
    let ids: Vec<i64> = seen
        .iter()
        .map(|e| e["id"].as_str().unwrap().parse().unwrap())
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(ids, sorted, "in order, each once");
    assert!(
        seen.iter()
            .any(|e| e["nodeKey"] == "db[0]" && e["state"] == "DESTROYED")
    );
    app.stop().await;
}

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

#[tokio::test]
async fn an_expired_lease_is_reaped() {
    let (app, _, _repo) = with_process_provider(|_| {}).await;
    let blueprint = create_blueprint(&app, "web", WEB).await;
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
    let past = (chrono::Utc::now() - chrono::Duration::seconds(1)).to_rfc3339();
    let body = app
        .gql(
            "mutation($id: ID!, $at: DateTime) { extendDeployment(id: $id, expiresAt: $at) { expiresAt } }",
            json!({ "id": id, "at": past }),
        )
        .await;
    data(&body);
    settled(&app, &id, &["DESTROYED"]).await;
    all_gone(&pids(&done)).await;
    app.stop().await;
}

/// Loads a fixture provider in `mode` named `name`, and a blueprint of one
/// no-op resource on it. Returns the provider's and the blueprint's ids (and
/// the repository, which must outlive the test).
async fn fixture_with_blueprint(
    app: &TestApp,
    name: &str,
    mode: &str,
) -> (String, String, ProviderRepo) {
    let repo = ProviderRepo::new(&fixture_metadata(mode), &[]);
    let (provider, _) = create_provider(app, json!({ "name": name, "gitUrl": repo.url() })).await;
    wait_status(app, &provider, "CONNECTED").await;
    let blueprint = create_blueprint(
        app,
        &format!("noop-{name}"),
        &format!("resources:\n  n:\n    type: fixture.v1.noop\n    provider: {name}\n"),
    )
    .await;
    (provider, blueprint, repo)
}

/// Provider faults: a call that never answers, and a provider that is gone when
/// its resources must be destroyed.
#[tokio::test]
async fn provider_faults_fail_the_deployment_with_the_reason() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |config| {
        quick(config);
        config.provider_call_timeout_ms = 3_000;
        config.deploy_provider_wait_ms = 1_000;
    })
    .await;
    let (_, blueprint, _hang) = fixture_with_blueprint(&app, "hang", "hang-deploy").await;
    let id = deploy(&app, &blueprint, "hangs", json!({ "onFailure": "KEEP" })).await;
    let failed = settled(&app, &id, &["FAILED", "COMPLETE"]).await;
    assert_eq!(failed.state, "FAILED");
    let error = failed.error.as_deref().unwrap();
    assert!(
        error.contains("n[0]") && error.contains("did not answer DeployResource within 3000ms"),
        "{error}"
    );
    // The call's outcome was unknown; once settled (the resource is absent)
    // the journal is empty.
    eventually(Duration::from_secs(60), "the journal to drain", || async {
        (journal_len(&app.store).await == 0).then_some(())
    })
    .await;

    // A provider that dies in the middle of a deploy: the call fails at once,
    // and the call's journal entry is settled once the provider is back.
    let (dying_id, blueprint, _dying) = fixture_with_blueprint(&app, "dying", "hang-deploy").await;
    let id = deploy(&app, &blueprint, "dies", json!({ "onFailure": "KEEP" })).await;
    eventually(Duration::from_secs(30), "the deploy call", || async {
        let d = deployment(&app, &id).await;
        (d.nodes.first().is_some_and(|n| n.state == "IN_PROGRESS")).then_some(())
    })
    .await;
    let pid = provider_pid(&app.store, &dying_id);
    // SAFETY: killing the provider process this test started through Corbel.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let failed = settled(&app, &id, &["FAILED", "COMPLETE"]).await;
    assert_eq!(failed.state, "FAILED");
    assert!(
        failed.error.as_deref().unwrap().contains("n[0]"),
        "{failed:?}"
    );
    eventually(Duration::from_secs(60), "the journal to drain", || async {
        (journal_len(&app.store).await == 0).then_some(())
    })
    .await;

    // A provider that is unloaded when its resources must go.
    let (normal_id, blueprint, _normal) = fixture_with_blueprint(&app, "normal", "normal").await;
    let id = deploy(&app, &blueprint, "orphaned", json!({})).await;
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    let body = app
        .gql(
            "mutation($id: ID!) { unloadProvider(id: $id) { status } }",
            json!({ "id": normal_id }),
        )
        .await;
    data(&body);
    let body = app
        .gql(
            "mutation($id: ID!) { destroyDeployment(id: $id) { id } }",
            json!({ "id": id }),
        )
        .await;
    data(&body);
    let failed = settled(&app, &id, &["FAILED", "DESTROYED"]).await;
    assert_eq!(failed.state, "FAILED", "{failed:?}");
    let error = failed.error.as_deref().unwrap();
    assert!(
        error.contains("is not connected (UNLOADED; waited 1 s)"),
        "{error}"
    );
    app.stop().await;
}

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
    let client = reqwest::Client::new();
    let gql = |addr: std::net::SocketAddr, query: &'static str, variables: Value| {
        let client = client.clone();
        async move {
            client
                .post(format!("http://{addr}/graphql"))
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({ "query": query, "variables": variables }))
                .send()
                .await
                .ok()?
                .json::<Value>()
                .await
                .ok()
        }
    };
    let addr = served.addr;
    eventually(Duration::from_secs(60), "the provider", || async {
        let body = gql(
            addr,
            "query($id: ID!) { provider(id: $id) { status } }",
            json!({ "id": provider }),
        )
        .await?;
        (body["data"]["provider"]["status"] == "CONNECTED").then_some(())
    })
    .await;
    let body = gql(
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
        let body = gql(
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
        let body = gql(addr, "query($id: ID!) { deployment(id: $id) { state error nodes { id state outputs } } }", json!({ "id": id })).await?;
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
    let body = gql(
        addr,
        "mutation($id: ID!) { destroyDeployment(id: $id) { id } }",
        json!({ "id": id }),
    )
    .await
    .unwrap();
    assert!(body.get("errors").is_none(), "{body}");
    eventually(Duration::from_secs(60), "destroyed", || async {
        let body = gql(
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
