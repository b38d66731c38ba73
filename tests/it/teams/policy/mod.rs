//! The policy matrix: every root field of the schema, asked by every kind
//! of caller on the real server, answers as `POLICY` says.

use std::collections::BTreeMap;

use corbel::api::policy::{Need, POLICY};
use corbel::auth::ProjectRole;
use serde_json::{Value, json};

use super::{PASSWORD, destroy_all, login, member, project, svc_blueprint, user};
use crate::support::deployments::{deploy, settled, with_process_provider};
use crate::support::websocket::{connect, next_json, send};
use crate::support::{ADMIN_TOKEN, TestApp, data, error_code};

mod operations;

use operations::{Fixture, operations};

/// The kinds of caller the matrix asks as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Caller {
    Anonymous,
    Viewer,
    Deployer,
    Developer,
    ProjectAdmin,
    /// The admin of another project.
    Outsider,
    ServerAdmin,
    /// A developer of the project, disabled.
    Disabled,
}

const CALLERS: [Caller; 8] = [
    Caller::Anonymous,
    Caller::Viewer,
    Caller::Deployer,
    Caller::Developer,
    Caller::ProjectAdmin,
    Caller::Outsider,
    Caller::ServerAdmin,
    Caller::Disabled,
];

impl Caller {
    /// Whether the policy lets this caller use a field that needs `need`.
    fn allowed(self, need: Need) -> bool {
        let role = match self {
            Caller::Viewer => Some(ProjectRole::Viewer),
            Caller::Deployer => Some(ProjectRole::Deployer),
            Caller::Developer => Some(ProjectRole::Developer),
            Caller::ProjectAdmin | Caller::ServerAdmin => Some(ProjectRole::Admin),
            Caller::Anonymous | Caller::Outsider | Caller::Disabled => None,
        };
        match need {
            Need::Public => true,
            Need::SignedIn => !matches!(self, Caller::Anonymous | Caller::Disabled),
            Need::ServerAdmin => self == Caller::ServerAdmin,
            Need::Project(needed) => role.is_some_and(|r| r.allows(needed)),
        }
    }
}

/// A plan of `deployment` that changes nothing, applied (by the admin): an
/// `applyPlan` of it by anyone allowed is a `CONFLICT`, changing nothing.
async fn applied_plan(app: &TestApp, deployment: &str) -> String {
    let body = app
        .gql(
            "mutation($id: ID!) { planDeployment(input: { deploymentId: $id }) { id } }",
            json!({ "id": deployment }),
        )
        .await;
    let plan = data(&body)["planDeployment"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let body = app
        .gql(
            "mutation($id: ID!) { applyPlan(id: $id) { id } }",
            json!({ "id": plan }),
        )
        .await;
    data(&body);
    settled(app, deployment, &["COMPLETE"]).await;
    plan
}

/// Whether an answer is a refusal: not signed in, not allowed, or told that
/// one of the fixture's things does not exist.
fn refused(body: &Value, fixture_ids: &[&str]) -> bool {
    match error_code(body) {
        Some("UNAUTHENTICATED" | "FORBIDDEN") => true,
        Some("NOT_FOUND") => {
            let message = body["errors"][0]["message"].as_str().unwrap_or_default();
            fixture_ids.iter().any(|id| message.contains(id))
        }
        _ => false,
    }
}

/// A subscription's first answer over `graphql-transport-ws`.
async fn first_message(app: &TestApp, token: Option<&str>, query: &str, vars: &Value) -> Value {
    let mut ws = connect(app.addr, "graphql-transport-ws").await;
    let payload = match token {
        Some(t) => json!({ "Authorization": format!("Bearer {t}") }),
        None => json!({}),
    };
    send(
        &mut ws,
        json!({ "type": "connection_init", "payload": payload }),
    )
    .await;
    let ack = next_json(&mut ws).await;
    if ack.as_ref().map(|a| a["type"] == "connection_ack") != Some(true) {
        // A token that does not sign in closes the socket (4403).
        return json!({ "errors": [{ "extensions": { "code": "UNAUTHENTICATED" }, "ack": ack }] });
    }
    send(
        &mut ws,
        json!({ "id": "1", "type": "subscribe", "payload": { "query": query, "variables": vars } }),
    )
    .await;
    let message = next_json(&mut ws).await.expect("an answer");
    match message["type"].as_str() {
        Some("error") => json!({ "errors": message["payload"] }),
        _ => message["payload"].clone(),
    }
}

#[tokio::test]
async fn every_root_field_answers_every_caller_as_the_policy_says() {
    let (app, provider, _repo) = with_process_provider(|_| {}).await;
    // The callers.
    let admin_password = app
        .gql(
            "mutation($p: String!) { setPassword(newPassword: $p) }",
            json!({ "p": PASSWORD }),
        )
        .await;
    data(&admin_password);
    let mut tokens: BTreeMap<Caller, Option<String>> = BTreeMap::new();
    let owner = user(&app, "owner", "USER").await;
    let alpha = project(&app, &owner, "alpha").await;
    for (caller, name, role) in [
        (Caller::Viewer, "viewer", "VIEWER"),
        (Caller::Deployer, "deployer", "DEPLOYER"),
        (Caller::Developer, "developer", "DEVELOPER"),
        (Caller::Disabled, "disabled", "DEVELOPER"),
    ] {
        let token = user(&app, name, "USER").await;
        member(&app, &owner, &alpha, name, role).await;
        tokens.insert(caller, Some(token));
    }
    tokens.insert(Caller::ProjectAdmin, Some(owner.clone()));
    let outsider = user(&app, "outsider", "USER").await;
    let beta = project(&app, &outsider, "beta").await;
    let foreign_blueprint = svc_blueprint(&app, &outsider, &beta).await;
    tokens.insert(Caller::Outsider, Some(outsider));
    tokens.insert(Caller::ServerAdmin, Some(ADMIN_TOKEN.to_owned()));
    tokens.insert(Caller::Anonymous, None);

    // The things the operations name, in project alpha.
    let blueprint = svc_blueprint(&app, &owner, &alpha).await;
    let running = deploy(&app, &blueprint, "running", json!({})).await;
    let done = settled(&app, &running, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    let gone = deploy(&app, &blueprint, "gone", json!({})).await;
    settled(&app, &gone, &["COMPLETE"]).await;
    destroy_all(&app, ADMIN_TOKEN, std::slice::from_ref(&gone)).await;
    let fixture = Fixture {
        project: alpha.clone(),
        blueprint: blueprint.clone(),
        deployment: running.clone(),
        destroyed: gone.clone(),
        node: done.node("svc").id.clone(),
        provider: provider.clone(),
        plan: applied_plan(&app, &running).await,
    };
    let disabled_id = {
        let users = app.gql("{ users { id username } }", json!({})).await;
        data(&users)["users"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["username"] == "disabled")
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let off = app
        .gql(
            "mutation($id: ID!) { setUserDisabled(id: $id, disabled: true) { id } }",
            json!({ "id": disabled_id }),
        )
        .await;
    data(&off);

    let ops = operations(&fixture);
    // Every field of the table is asked, and nothing else.
    let asked: Vec<&str> = ops.iter().map(|(f, _, _)| *f).collect();
    for (field, _) in POLICY {
        assert!(asked.contains(field), "the matrix does not ask `{field}`");
    }
    assert_eq!(asked.len(), POLICY.len(), "a field is asked twice");

    let ids = [
        fixture.project.as_str(),
        fixture.blueprint.as_str(),
        fixture.deployment.as_str(),
        fixture.destroyed.as_str(),
        fixture.node.as_str(),
        fixture.plan.as_str(),
    ];
    let mut wrong = Vec::new();
    for (field, query, vars) in &ops {
        let need = POLICY.iter().find(|(f, _)| f == field).unwrap().1;
        for caller in CALLERS {
            let mut token = tokens[&caller].clone();
            if *field == "logout" && !matches!(caller, Caller::Anonymous | Caller::Disabled) {
                // Logging out ends the token it came with: a session of its own.
                let name = match caller {
                    Caller::ServerAdmin => "admin",
                    Caller::ProjectAdmin => "owner",
                    Caller::Outsider => "outsider",
                    Caller::Viewer => "viewer",
                    Caller::Deployer => "deployer",
                    _ => "developer",
                };
                token = Some(login(&app, name).await);
            }
            let body = if query.starts_with("subscription") && matches!(need, Need::Project(_)) {
                first_message(&app, token.as_deref(), query, vars).await
            } else {
                app.gql_as(token.as_deref(), query, vars.clone()).await
            };
            let is_refused = refused(&body, &ids);
            // A list of a project's things is anyone's to ask: it shows
            // what their projects hold (checked below).
            let list = ["blueprints", "deployments"].contains(field);
            // So are the overview's figures, counted over their projects
            // (teams::projects checks what they count).
            let figures = ["changesByHour", "resourcesByHealth"].contains(field);
            let allowed = if list || figures {
                caller.allowed(Need::SignedIn)
            } else {
                caller.allowed(need)
            };
            if allowed == is_refused {
                wrong.push(format!(
                    "{field} as {caller:?}: expected {}, got {body}",
                    if allowed { "allowed" } else { "refused" }
                ));
            }
            // An id of a project the caller is not in does not exist for
            // them: never FORBIDDEN or VALIDATION naming it.
            if caller == Caller::Outsider
                && matches!(need, Need::Project(_))
                && !list
                && !figures
                && error_code(&body) != Some("NOT_FOUND")
            {
                wrong.push(format!(
                    "{field} as {caller:?}: expected NOT_FOUND, got {body}"
                ));
            }
            // Lists show a caller only their projects' things.
            if list && !is_refused {
                let listed = body.to_string();
                let sees =
                    listed.contains(&fixture.blueprint) || listed.contains(&fixture.deployment);
                let should = caller.allowed(Need::Project(ProjectRole::Viewer));
                if sees != should {
                    wrong.push(format!("{field} as {caller:?} lists {listed}"));
                }
            }
        }
    }
    wrong.extend(foreign_ids_and_sources(&app, &tokens, &fixture, &foreign_blueprint).await);
    assert!(
        wrong.is_empty(),
        "{} answers break the policy:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// The arguments the matrix's one-id-per-field cannot reach: an id of
/// another project beside one of the caller's own (NOT_FOUND, naming it), and
/// a blueprint source of the caller's own, which changes what a deployment
/// runs (DEVELOPER, as editing its blueprint). What breaks the policy.
async fn foreign_ids_and_sources(
    app: &TestApp,
    tokens: &BTreeMap<Caller, Option<String>>,
    fixture: &Fixture,
    foreign_blueprint: &str,
) -> Vec<String> {
    let mut wrong = Vec::new();
    let plan = "mutation($d: ID!, $b: ID, $s: String) {
        planDeployment(input: { deploymentId: $d, blueprintId: $b, blueprintSource: $s }) { id } }";
    let owner = tokens[&Caller::ProjectAdmin].as_deref();
    let body = app
        .gql_as(
            owner,
            plan,
            json!({ "d": fixture.deployment, "b": foreign_blueprint }),
        )
        .await;
    let message = body["errors"][0]["message"].as_str().unwrap_or_default();
    if error_code(&body) != Some("NOT_FOUND") || !message.contains(foreign_blueprint) {
        wrong.push(format!(
            "planDeployment with another project's blueprintId: expected NOT_FOUND naming it, got {body}"
        ));
    }
    let source = json!({ "d": fixture.deployment, "s": super::ONE_SERVICE });
    for caller in [Caller::Deployer, Caller::Developer] {
        let body = app
            .gql_as(tokens[&caller].as_deref(), plan, source.clone())
            .await;
        let allowed = caller.allowed(Need::Project(ProjectRole::Developer));
        let refused = error_code(&body) == Some("FORBIDDEN");
        if allowed == refused {
            wrong.push(format!(
                "planDeployment with blueprintSource as {caller:?}: expected {}, got {body}",
                if allowed { "allowed" } else { "FORBIDDEN" }
            ));
        }
    }
    wrong
}
