//! The audit trail (issue 15): every mutation, allowed or refused, is an
//! entry naming who, which project, what, how it ended and its arguments with
//! secrets hidden; written before the answer goes out, read with filters and
//! pages by server admins (and a project's own entries by its admins), and
//! followed live over the websocket.

use serde_json::{Value, json};

use crate::support::deployments::{deploy, settled, with_process_provider};
use crate::support::websocket::{connect, next_json, send};
use crate::support::{ADMIN_TOKEN, TestApp, data, error_code};
use crate::teams::{PASSWORD, login, member, project, svc_blueprint, user};

const ENTRY: &str = "id at userId username projectId action arguments outcome error durationMs";

/// Every entry `filter` keeps, newest first, read page by page (`first: 2`):
/// the pages hold each entry once and end where `totalCount` says.
async fn log(app: &TestApp, token: &str, filter: Value) -> Vec<Value> {
    let mut entries: Vec<Value> = Vec::new();
    let mut after: Option<String> = None;
    let mut total = None;
    loop {
        let body = app
            .gql_as(
                Some(token),
                &format!(
                    "query($f: AuditFilter, $after: String) {{ auditLog(filter: $f, first: 2, after: $after) {{
                       totalCount pageInfo {{ hasNextPage endCursor }} nodes {{ {ENTRY} }} }} }}"
                ),
                json!({ "f": filter, "after": after }),
            )
            .await;
        let page = &data(&body)["auditLog"];
        let count = page["totalCount"].as_u64().unwrap();
        assert_eq!(
            *total.get_or_insert(count),
            count,
            "totalCount holds over the pages"
        );
        entries.extend(page["nodes"].as_array().unwrap().iter().cloned());
        if page["pageInfo"]["hasNextPage"] != true {
            break;
        }
        after = page["pageInfo"]["endCursor"].as_str().map(str::to_owned);
    }
    assert_eq!(
        entries.len() as u64,
        total.unwrap(),
        "the pages hold every entry"
    );
    let mut ids: Vec<&str> = entries.iter().map(|e| e["id"].as_str().unwrap()).collect();
    let newest_first = ids.clone();
    ids.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(ids, newest_first, "newest first");
    ids.dedup();
    assert_eq!(ids.len(), entries.len(), "no entry twice");
    entries
}

fn actions(entries: &[Value]) -> Vec<(&str, &str)> {
    entries
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap(),
                e["outcome"].as_str().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn every_mutation_is_recorded_with_who_where_and_how_it_ended() {
    let (app, _provider, _repo) = with_process_provider(|_| {}).await;
    let ann = user(&app, "ann", "USER").await;
    let bob = user(&app, "bob", "USER").await;
    let eve = user(&app, "eve", "USER").await;
    let alpha = project(&app, &ann, "alpha").await;
    member(&app, &ann, &alpha, "bob", "VIEWER").await;
    let blueprint = svc_blueprint(&app, &ann, &alpha).await;
    let running = deploy(&app, &blueprint, "running", json!({})).await;
    settled(&app, &running, &["COMPLETE"]).await;

    // Refusals: a viewer who may not destroy, an outsider told there is no
    // such deployment, a user refused a server admin's mutation before it
    // runs, and a wrong password.
    let destroy = "mutation($id: ID!) { destroyDeployment(id: $id) { id } }";
    let by_bob = app
        .gql_as(Some(&bob), destroy, json!({ "id": running }))
        .await;
    assert_eq!(error_code(&by_bob), Some("FORBIDDEN"), "{by_bob}");
    let by_eve = app
        .gql_as(Some(&eve), destroy, json!({ "id": running }))
        .await;
    assert_eq!(error_code(&by_eve), Some("NOT_FOUND"), "{by_eve}");
    let provider_by_eve = app
        .gql_as(
            Some(&eve),
            "mutation { createProvider(input: { name: \"x\", gitUrl: \"https://eve:hunter2@example.com/x.git\", secretConfig: { password: \"hunter3\" } }) { token } }",
            json!({}),
        )
        .await;
    assert_eq!(
        error_code(&provider_by_eve),
        Some("FORBIDDEN"),
        "{provider_by_eve}"
    );
    let wrong = app
        .gql_as(
            None,
            "mutation { login(username: \"ann\", password: \"not her password at all\") { token } }",
            json!({}),
        )
        .await;
    assert!(error_code(&wrong).is_some(), "{wrong}");

    // Everything that happened, as the admin reads it.
    let all = log(&app, ADMIN_TOKEN, json!({})).await;
    let text = Value::Array(all.clone()).to_string();
    for secret in [
        PASSWORD,
        "hunter2",
        "hunter3",
        "not her password at all",
        ann.as_str(),
    ] {
        assert!(
            !text.contains(secret),
            "`{secret}` is in the audit log: {text}"
        );
    }
    let created_ann = all
        .iter()
        .find(|e| e["action"] == "createUser" && e["arguments"]["input"]["username"] == "ann")
        .expect("createUser of ann");
    assert_eq!(created_ann["arguments"]["input"]["password"], "***");
    assert_eq!(created_ann["username"], "admin");
    assert_eq!(created_ann["outcome"], "OK");

    // Ann's, oldest last: what she did, each in the project it acted in.
    let anns = log(&app, ADMIN_TOKEN, json!({ "username": "ANN" })).await;
    let logins: Vec<&Value> = anns.iter().filter(|e| e["action"] == "login").collect();
    assert_eq!(
        logins.len(),
        2,
        "her sign-in and the wrong password: {anns:?}"
    );
    assert_eq!(logins[0]["outcome"], "UNAUTHENTICATED", "{:?}", logins[0]);
    assert_eq!(
        logins[0]["userId"],
        Value::Null,
        "a failed login signs no one in"
    );
    assert_eq!(logins[1]["outcome"], "OK");
    assert!(logins[1]["userId"].is_string(), "{:?}", logins[1]);
    for action in ["createProject", "setProjectMember", "createBlueprint"] {
        let entry = anns
            .iter()
            .find(|e| e["action"] == action)
            .unwrap_or_else(|| panic!("{action} in {anns:?}"));
        assert_eq!(entry["projectId"], alpha.as_str(), "{entry}");
        assert_eq!(entry["outcome"], "OK", "{entry}");
        assert!(entry["durationMs"].is_number(), "{entry}");
    }

    // The failures, and in one project: the refusals name it.
    let failed = log(&app, ADMIN_TOKEN, json!({ "outcome": "FAILED" })).await;
    assert_eq!(
        actions(&failed),
        [
            ("login", "UNAUTHENTICATED"),
            ("createProvider", "FORBIDDEN"),
            ("destroyDeployment", "NOT_FOUND"),
            ("destroyDeployment", "FORBIDDEN"),
        ]
    );
    assert_eq!(failed[1]["username"], "eve");
    assert_eq!(
        failed[1]["arguments"]["input"]["gitUrl"],
        "https://***@example.com/x.git"
    );
    assert_eq!(failed[2]["username"], "eve");
    assert_eq!(
        failed[2]["projectId"],
        alpha.as_str(),
        "the outsider's probe is traced"
    );
    assert_eq!(failed[3]["username"], "bob");
    assert_eq!(failed[3]["arguments"]["id"], running.as_str());
    let forbidden = log(&app, ADMIN_TOKEN, json!({ "code": "forbidden" })).await;
    assert_eq!(forbidden.len(), 2);
    let destroys = log(
        &app,
        ADMIN_TOKEN,
        json!({ "projectId": alpha, "actions": ["destroyDeployment", "deployBlueprint"] }),
    )
    .await;
    assert_eq!(
        actions(&destroys),
        [
            ("destroyDeployment", "NOT_FOUND"),
            ("destroyDeployment", "FORBIDDEN"),
            ("deployBlueprint", "OK"),
        ]
    );
    let since = destroys[1]["at"].as_str().unwrap();
    let later = log(
        &app,
        ADMIN_TOKEN,
        json!({ "since": since, "projectId": alpha }),
    )
    .await;
    assert_eq!(actions(&later)[..], actions(&destroys)[..2]);
    let bad = app
        .gql(
            "{ auditLog(filter: { projectId: \"nope\" }) { totalCount } }",
            json!({}),
        )
        .await;
    assert_eq!(error_code(&bad), Some("VALIDATION"), "{bad}");
    assert!(bad.to_string().contains("filter.projectId"), "{bad}");

    // A project's admin reads the project's entries, and only those; a
    // viewer may not.
    let own = app
        .gql_as(
            Some(&ann),
            &format!("query($p: ID!) {{ project(id: $p) {{ auditLog(first: 100) {{ totalCount nodes {{ {ENTRY} }} }} }} }}"),
            json!({ "p": alpha }),
        )
        .await;
    let own = &data(&own)["project"]["auditLog"];
    let nodes = own["nodes"].as_array().unwrap();
    assert!(nodes.len() >= 6, "{own}");
    assert!(
        nodes.iter().all(|e| e["projectId"] == alpha.as_str()),
        "{own}"
    );
    let by_viewer = app
        .gql_as(
            Some(&bob),
            "query($p: ID!) { project(id: $p) { auditLog { totalCount } } }",
            json!({ "p": alpha }),
        )
        .await;
    assert_eq!(error_code(&by_viewer), Some("FORBIDDEN"), "{by_viewer}");

    // An entry outlives its user.
    let users = app.gql("{ users { id username } }", json!({})).await;
    let bob_id = data(&users)["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["username"] == "bob")
        .unwrap()["id"]
        .clone();
    let gone = app
        .gql(
            "mutation($id: ID!) { deleteUser(id: $id) }",
            json!({ "id": bob_id }),
        )
        .await;
    data(&gone);
    let bobs = log(&app, ADMIN_TOKEN, json!({ "userId": bob_id })).await;
    assert!(
        bobs.iter()
            .any(|e| e["action"] == "destroyDeployment" && e["username"] == "bob"),
        "{bobs:?}"
    );
}

#[tokio::test]
async fn admins_follow_the_log_live() {
    let (app, _provider, _repo) = with_process_provider(|_| {}).await;
    let ann = user(&app, "ann", "USER").await;
    let alpha = project(&app, &ann, "alpha").await;

    let mut ws = connect(app.addr, "graphql-transport-ws").await;
    send(
        &mut ws,
        json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {ADMIN_TOKEN}") } }),
    )
    .await;
    assert_eq!(next_json(&mut ws).await.unwrap()["type"], "connection_ack");
    send(
        &mut ws,
        json!({ "id": "1", "type": "subscribe", "payload": {
            "query": format!("subscription($f: AuditFilter) {{ auditEvents(filter: $f) {{ {ENTRY} }} }}"),
            "variables": { "f": { "actions": ["updateProject"] } } } }),
    )
    .await;
    // The subscription is live once an entry it keeps arrives; until then,
    // keep making them (a first one may come before it is listening).
    let change = "mutation($p: ID!, $d: String) { updateProject(id: $p, input: { description: $d }) { id } }";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut n = 0;
    let event = loop {
        n += 1;
        let other = app
            .gql_as(
                Some(&ann),
                "mutation($n: String!) { createApiToken(name: $n) { token } }",
                json!({ "n": format!("t{n}") }),
            )
            .await;
        data(&other);
        let changed = app
            .gql_as(
                Some(&ann),
                change,
                json!({ "p": alpha, "d": format!("take {n}") }),
            )
            .await;
        data(&changed);
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(500), next_json(&mut ws)).await;
        if let Ok(Some(message)) = waited {
            assert_eq!(message["type"], "next", "{message}");
            break message["payload"]["data"]["auditEvents"].clone();
        }
        assert!(std::time::Instant::now() < deadline, "no event came");
    };
    assert_eq!(
        event["action"], "updateProject",
        "the filter keeps only these"
    );
    assert_eq!(event["username"], "ann");
    assert_eq!(event["projectId"], alpha.as_str());
    assert_eq!(event["outcome"], "OK");
    assert!(
        event["arguments"]["input"]["description"]
            .as_str()
            .unwrap()
            .starts_with("take ")
    );

    // A non-admin may not follow it.
    let token = login(&app, "ann").await;
    let mut theirs = connect(app.addr, "graphql-transport-ws").await;
    send(
        &mut theirs,
        json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {token}") } }),
    )
    .await;
    assert_eq!(
        next_json(&mut theirs).await.unwrap()["type"],
        "connection_ack"
    );
    send(
        &mut theirs,
        json!({ "id": "1", "type": "subscribe", "payload": { "query": "subscription { auditEvents { id } }" } }),
    )
    .await;
    let refused = next_json(&mut theirs).await.unwrap();
    assert_eq!(
        refused["payload"]["errors"][0]["extensions"]["code"], "FORBIDDEN",
        "{refused}"
    );
    assert_eq!(refused["payload"]["data"], Value::Null, "{refused}");
}
