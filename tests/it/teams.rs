//! Teams (issue 15): users made, disabled and deleted by server admins;
//! projects whose members see only their own blueprints and deployments;
//! and the policy matrix: every root field of the schema, asked by every
//! kind of caller on the real server, answers as `POLICY` says.

use std::collections::BTreeMap;

use corbel::api::policy::{Need, POLICY};
use corbel::auth::ProjectRole;
use serde_json::{Value, json};

use crate::support::deployments::{deploy, settled, with_process_provider};
use crate::support::websocket::{connect, next_json, send};
use crate::support::{ADMIN_TOKEN, TestApp, data, error_code};

pub(crate) const PASSWORD: &str = "a long enough password 42";

/// Makes a user with `role` and signs them in; their session token.
pub(crate) async fn user(app: &TestApp, name: &str, role: &str) -> String {
    let made = app
        .gql(
            "mutation($input: CreateUserInput!) { createUser(input: $input) { id username role } }",
            json!({ "input": { "username": name, "password": PASSWORD, "role": role } }),
        )
        .await;
    assert_eq!(data(&made)["createUser"]["role"], role, "{made}");
    login(app, name).await
}

pub(crate) async fn login(app: &TestApp, name: &str) -> String {
    let body = app
        .gql_as(
            None,
            "mutation($u: String!, $p: String!) { login(username: $u, password: $p) { token } }",
            json!({ "u": name, "p": PASSWORD }),
        )
        .await;
    data(&body)["login"]["token"].as_str().unwrap().to_owned()
}

pub(crate) async fn project(app: &TestApp, token: &str, name: &str) -> String {
    let body = app
        .gql_as(
            Some(token),
            "mutation($name: String!) { createProject(input: { name: $name }) { id myRole } }",
            json!({ "name": name }),
        )
        .await;
    assert_eq!(data(&body)["createProject"]["myRole"], "ADMIN", "{body}");
    data(&body)["createProject"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

pub(crate) async fn member(app: &TestApp, token: &str, project: &str, name: &str, role: &str) {
    let body = app
        .gql_as(
            Some(token),
            "mutation($p: ID!, $u: String!, $r: ProjectRole!) {
               setProjectMember(projectId: $p, username: $u, role: $r) { role } }",
            json!({ "p": project, "u": name, "r": role }),
        )
        .await;
    assert_eq!(data(&body)["setProjectMember"]["role"], role, "{body}");
}

/// Makes the blueprint `svc` (one process service) in `project` as `token`;
/// its id.
pub(crate) async fn svc_blueprint(app: &TestApp, token: &str, project: &str) -> String {
    let made = app
        .gql_as(
            Some(token),
            "mutation($p: ID!, $s: String!) { createBlueprint(input: { projectId: $p, name: \"svc\", source: $s }) { id projectId } }",
            json!({ "p": project, "s": ONE_SERVICE }),
        )
        .await;
    assert_eq!(
        data(&made)["createBlueprint"]["projectId"],
        project,
        "{made}"
    );
    data(&made)["createBlueprint"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

pub(crate) const ONE_SERVICE: &str = "resources:\n  svc:\n    type: process.v1.service\n    config: { command: sleep, args: [\"300\"] }\n";

#[tokio::test]
async fn a_disabled_user_stops_at_once_and_the_last_admin_stays() {
    let app = TestApp::spawn().await;
    let dana = user(&app, "dana", "USER").await;
    let me = app
        .gql_as(Some(&dana), "{ me { username role disabled } }", json!({}))
        .await;
    assert_eq!(
        data(&me)["me"],
        json!({ "username": "dana", "role": "USER", "disabled": false })
    );
    // A second session, and an API token: all stop when dana is disabled.
    let second = login(&app, "dana").await;
    let api = app
        .gql_as(
            Some(&dana),
            "mutation { createApiToken(name: \"ci\") { token } }",
            json!({}),
        )
        .await;
    let api = data(&api)["createApiToken"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let users = app.gql("{ users { id username } }", json!({})).await;
    let id = data(&users)["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["username"] == "dana")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let off = app
        .gql(
            "mutation($id: ID!) { setUserDisabled(id: $id, disabled: true) { disabled } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&off)["setUserDisabled"]["disabled"], true);
    for token in [&dana, &second, &api] {
        let refused = app
            .gql_as(Some(token), "{ me { username } }", json!({}))
            .await;
        assert_eq!(error_code(&refused), Some("UNAUTHENTICATED"), "{refused}");
    }
    let again = app
        .gql_as(
            None,
            "mutation { login(username: \"dana\", password: \"a long enough password 42\") { token } }",
            json!({}),
        )
        .await;
    assert_eq!(error_code(&again), Some("UNAUTHENTICATED"), "{again}");
    // Enabled again: the API token works again; sessions were ended for good.
    let on = app
        .gql(
            "mutation($id: ID!) { setUserDisabled(id: $id, disabled: false) { disabled } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&on)["setUserDisabled"]["disabled"], false);
    let works = app
        .gql_as(Some(&api), "{ me { username } }", json!({}))
        .await;
    assert_eq!(data(&works)["me"]["username"], "dana");
    let ended = app
        .gql_as(Some(&second), "{ me { username } }", json!({}))
        .await;
    assert_eq!(error_code(&ended), Some("UNAUTHENTICATED"), "{ended}");

    // The last server admin can be neither disabled nor deleted, nor demoted.
    let admin_id = data(&users)["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["username"] == "admin")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let ops = user(&app, "ops", "ADMIN").await;
    for mutation in [
        "mutation($id: ID!) { setUserDisabled(id: $id, disabled: true) { id } }",
        "mutation($id: ID!) { setUserRole(id: $id, role: USER) { id } }",
        "mutation($id: ID!) { deleteUser(id: $id) }",
    ] {
        let body = app
            .gql_as(Some(&ops), mutation, json!({ "id": admin_id }))
            .await;
        assert!(body.get("errors").is_none(), "ops may act on admin: {body}");
        if mutation.contains("disabled: true") {
            let back = app
                .gql_as(
                    Some(&ops),
                    "mutation($id: ID!) { setUserDisabled(id: $id, disabled: false) { id } }",
                    json!({ "id": admin_id }),
                )
                .await;
            data(&back);
        }
        if mutation.contains("role: USER") {
            let back = app
                .gql_as(
                    Some(&ops),
                    "mutation($id: ID!) { setUserRole(id: $id, role: ADMIN) { id } }",
                    json!({ "id": admin_id }),
                )
                .await;
            data(&back);
        }
    }
    // admin is deleted now; ops is the last admin and cannot remove itself.
    let ops_id = {
        let me = app.gql_as(Some(&ops), "{ me { id } }", json!({})).await;
        data(&me)["me"]["id"].as_str().unwrap().to_owned()
    };
    let refused = app
        .gql_as(
            Some(&ops),
            "mutation($id: ID!) { setUserDisabled(id: $id, disabled: true) { id } }",
            json!({ "id": ops_id }),
        )
        .await;
    assert_eq!(error_code(&refused), Some("VALIDATION"), "{refused}");
    let dana_made_admin = app
        .gql_as(
            Some(&ops),
            "mutation($id: ID!) { setUserRole(id: $id, role: ADMIN) { role } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&dana_made_admin)["setUserRole"]["role"], "ADMIN");
}

#[tokio::test]
async fn members_see_their_projects_and_an_outsider_is_told_nothing_exists() {
    let (app, provider, _repo) = with_process_provider(|_| {}).await;
    let owner = user(&app, "owner", "USER").await;
    let viewer = user(&app, "viewer", "USER").await;
    let outsider = user(&app, "outsider", "USER").await;
    let alpha = project(&app, &owner, "alpha").await;
    project(&app, &outsider, "beta").await;
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

/// The ids the operations name.
struct Fixture {
    project: String,
    blueprint: String,
    deployment: String,
    destroyed: String,
    node: String,
    provider: String,
    /// A plan of `deployment`, applied already.
    plan: String,
}

/// Each root field, an operation that uses it, and its variables. Each
/// operation is harmless once allowed: it fails on its input after the
/// permission check (a bad name, a past lease, a random id), or it repeats
/// what is already so.
fn operations(f: &Fixture) -> Vec<(&'static str, String, Value)> {
    let random = uuid::Uuid::new_v4().to_string();
    let p = &f.project;
    let b = &f.blueprint;
    let d = &f.deployment;
    let r = &random;
    let ops: Vec<(&'static str, &str, Value)> = vec![
        ("serverInfo", "{ serverInfo { version } }", json!({})),
        ("replicas", "{ replicas { id } }", json!({})),
        ("__typename", "{ __typename }", json!({})),
        ("__schema", "{ __schema { queryType { name } } }", json!({})),
        ("__type", "{ __type(name: \"Query\") { name } }", json!({})),
        ("me", "{ me { username } }", json!({})),
        (
            "login",
            "mutation { login(username: \"viewer\", password: \"a long enough password 42\") { token } }",
            json!({}),
        ),
        ("logout", "mutation { logout }", json!({})),
        (
            "setPassword",
            "mutation { setPassword(newPassword: \"short\") }",
            json!({}),
        ),
        (
            "createApiToken",
            "mutation { createApiToken(name: \"\") { token } }",
            json!({}),
        ),
        (
            "revokeApiToken",
            "mutation($id: ID!) { revokeApiToken(id: $id) }",
            json!({ "id": r }),
        ),
        (
            "serverEvents",
            "subscription { serverEvents { __typename } }",
            json!({}),
        ),
        (
            "auditLog",
            "{ auditLog(first: 1) { totalCount } }",
            json!({}),
        ),
        (
            "auditEvents",
            "subscription { auditEvents { action } }",
            json!({}),
        ),
        ("users", "{ users { username } }", json!({})),
        (
            "user",
            "query($id: ID!) { user(id: $id) { username } }",
            json!({ "id": r }),
        ),
        (
            "createUser",
            "mutation { createUser(input: { username: \"Bad Name\", password: \"a long enough password 42\" }) { id } }",
            json!({}),
        ),
        (
            "setUserDisabled",
            "mutation($id: ID!) { setUserDisabled(id: $id, disabled: true) { id } }",
            json!({ "id": r }),
        ),
        (
            "setUserRole",
            "mutation($id: ID!) { setUserRole(id: $id, role: USER) { id } }",
            json!({ "id": r }),
        ),
        (
            "deleteUser",
            "mutation($id: ID!) { deleteUser(id: $id) }",
            json!({ "id": r }),
        ),
        ("projects", "{ projects { name } }", json!({})),
        (
            "project",
            "query($id: ID!) { project(id: $id) { name } }",
            json!({ "id": p }),
        ),
        (
            "createProject",
            "mutation { createProject(input: { name: \"Bad Name\" }) { id } }",
            json!({}),
        ),
        (
            "updateProject",
            "mutation($id: ID!) { updateProject(id: $id, input: { maxResources: -1 }) { id } }",
            json!({ "id": p }),
        ),
        (
            "deleteProject",
            "mutation($id: ID!) { deleteProject(id: $id) }",
            json!({ "id": p }),
        ),
        (
            "setProjectMember",
            "mutation($id: ID!) { setProjectMember(projectId: $id, username: \"developer\", role: DEVELOPER) { role } }",
            json!({ "id": p }),
        ),
        (
            "removeProjectMember",
            "mutation($id: ID!) { removeProjectMember(projectId: $id, username: \"nobody\") }",
            json!({ "id": p }),
        ),
        (
            "providers",
            "{ providers(first: 5) { totalCount } }",
            json!({}),
        ),
        (
            "provider",
            "query($id: ID!) { provider(id: $id) { name } }",
            json!({ "id": f.provider }),
        ),
        (
            "providerEvents",
            "subscription($id: ID!) { providerEvents(id: $id) { __typename } }",
            json!({ "id": f.provider }),
        ),
        (
            "createProvider",
            "mutation { createProvider(input: { name: \"Bad Name!\", gitUrl: \"\" }) { token } }",
            json!({}),
        ),
        (
            "updateProvider",
            "mutation($id: ID!) { updateProvider(id: $id, input: {}) { id } }",
            json!({ "id": r }),
        ),
        (
            "deleteProvider",
            "mutation($id: ID!) { deleteProvider(id: $id) }",
            json!({ "id": r }),
        ),
        (
            "loadProvider",
            "mutation($id: ID!) { loadProvider(id: $id) { id } }",
            json!({ "id": r }),
        ),
        (
            "unloadProvider",
            "mutation($id: ID!) { unloadProvider(id: $id) { id } }",
            json!({ "id": r }),
        ),
        (
            "configureProvider",
            "mutation($id: ID!) { configureProvider(id: $id, config: {}) { id } }",
            json!({ "id": r }),
        ),
        (
            "rotateProviderToken",
            "mutation($id: ID!) { rotateProviderToken(id: $id) { token } }",
            json!({ "id": r }),
        ),
        (
            "issueProviderCertificate",
            "mutation($id: ID!) { issueProviderCertificate(id: $id) { ca } }",
            json!({ "id": r }),
        ),
        (
            "repositories",
            "{ repositories(first: 5) { totalCount } }",
            json!({}),
        ),
        (
            "repository",
            "query($id: ID!) { repository(id: $id) { name } }",
            json!({ "id": r }),
        ),
        (
            "repositoryEvents",
            "subscription($id: ID!) { repositoryEvents(id: $id) { __typename } }",
            json!({ "id": r }),
        ),
        (
            "elements",
            "{ elements(first: 5) { totalCount } }",
            json!({}),
        ),
        (
            "element",
            "query($id: ID!) { element(id: $id) { name } }",
            json!({ "id": r }),
        ),
        (
            "resolveElement",
            "query($id: ID!) { resolveElement(id: $id) { __typename } }",
            json!({ "id": r }),
        ),
        (
            "createRepository",
            "mutation { createRepository(input: { name: \"\", driver: { local: { path: \"/nonexistent\" } } }) { id } }",
            json!({}),
        ),
        (
            "updateRepository",
            "mutation($id: ID!) { updateRepository(id: $id, input: {}) { id } }",
            json!({ "id": r }),
        ),
        (
            "deleteRepository",
            "mutation($id: ID!) { deleteRepository(id: $id) }",
            json!({ "id": r }),
        ),
        (
            "refreshRepository",
            "mutation($id: ID!) { refreshRepository(id: $id) { id } }",
            json!({ "id": r }),
        ),
        (
            "installElement",
            "mutation($id: ID!) { installElement(id: $id) { id } }",
            json!({ "id": r }),
        ),
        (
            "uninstallElement",
            "mutation($id: ID!) { uninstallElement(id: $id) { id } }",
            json!({ "id": r }),
        ),
        (
            "upgradeElement",
            "mutation($id: ID!) { upgradeElement(id: $id, toId: $id) { id } }",
            json!({ "id": r }),
        ),
        (
            "editElement",
            "mutation($id: ID!) { editElement(id: $id, manifest: {}) { id } }",
            json!({ "id": r }),
        ),
        (
            "uploadElement",
            "mutation($id: ID!) { uploadElement(repositoryId: $id, manifest: \"x\") { id } }",
            json!({ "id": r }),
        ),
        (
            "blueprints",
            "{ blueprints(first: 50) { nodes { id } } }",
            json!({}),
        ),
        (
            "blueprint",
            "query($id: ID!) { blueprint(id: $id) { name } }",
            json!({ "id": b }),
        ),
        (
            "calculateCapacity",
            "query($id: ID!) { calculateCapacity(blueprintId: $id, resourceKey: \"svc\") { node } }",
            json!({ "id": b }),
        ),
        (
            "createBlueprint",
            "mutation($p: ID!) { createBlueprint(input: { projectId: $p, name: \"\", source: \"x\" }) { id } }",
            json!({ "p": p }),
        ),
        (
            "updateBlueprint",
            "mutation($id: ID!) { updateBlueprint(id: $id, input: { source: \"resources: [\" }) { id } }",
            json!({ "id": b }),
        ),
        (
            "deleteBlueprint",
            "mutation($id: ID!) { deleteBlueprint(id: $id) }",
            json!({ "id": b }),
        ),
        (
            "deployments",
            "{ deployments(first: 50) { nodes { id } } }",
            json!({}),
        ),
        (
            "deployment",
            "query($id: ID!) { deployment(id: $id) { name } }",
            json!({ "id": d }),
        ),
        (
            "resourceNode",
            "query($id: ID!) { resourceNode(id: $id) { key } }",
            json!({ "id": f.node }),
        ),
        (
            "deploymentEvents",
            "subscription($id: ID!) { deploymentEvents(id: $id) { kind } }",
            json!({ "id": d }),
        ),
        (
            "deployBlueprint",
            "mutation($b: ID!) { deployBlueprint(input: { blueprintId: $b, name: \"\" }) { id } }",
            json!({ "b": b }),
        ),
        (
            "destroyDeployment",
            "mutation($id: ID!) { destroyDeployment(id: $id) { id } }",
            json!({ "id": f.destroyed }),
        ),
        (
            "redeployDeployment",
            "mutation($id: ID!) { redeployDeployment(id: $id, resourceKeys: []) { id } }",
            json!({ "id": d }),
        ),
        (
            "extendDeployment",
            "mutation($id: ID!) { extendDeployment(id: $id, expiresAt: \"2000-01-01T00:00:00Z\") { id } }",
            json!({ "id": d }),
        ),
        (
            "powerResource",
            "mutation($id: ID!) { powerResource(deploymentId: $id, key: \"svc\", action: STOP) { state } }",
            json!({ "id": d }),
        ),
        (
            "plan",
            "query($id: ID!) { plan(id: $id) { state } }",
            json!({ "id": f.plan }),
        ),
        (
            "planDeployment",
            "mutation($id: ID!) { planDeployment(input: { deploymentId: $id, variables: \"x\" }) { id } }",
            json!({ "id": d }),
        ),
        (
            "applyPlan",
            "mutation($id: ID!) { applyPlan(id: $id) { id } }",
            json!({ "id": f.plan }),
        ),
        (
            "rollbackDeployment",
            "mutation($id: ID!) { rollbackDeployment(id: $id, revision: 0) { plan { id } } }",
            json!({ "id": d }),
        ),
    ];
    ops.into_iter()
        .map(|(field, query, vars)| (field, query.to_owned(), vars))
        .collect()
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
    project(&app, &outsider, "beta").await;
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
            let allowed = if list {
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
    assert!(
        wrong.is_empty(),
        "{} answers break the policy:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// A database of the release before projects (the schema of its seven
/// migrations, with rows as it wrote them) moves into projects at the next
/// start: its blueprint and deployment into `default`, owned by `admin`, its
/// element installation into `platform`; nothing is lost.
#[tokio::test]
async fn a_database_of_the_release_before_projects_moves_into_default() {
    use migration::MigratorTrait;
    use sea_orm::ConnectionTrait;
    use sea_orm::sea_query::{Alias, Query};

    let store = std::sync::Arc::new(crate::support::TestStore::fresh().await);
    let db = corbel::store::connect(&store.config().database().unwrap())
        .await
        .unwrap();
    migration::Migrator::up(&db, Some(7)).await.unwrap();
    let now = chrono::Utc::now();
    let admin = uuid::Uuid::new_v4();
    let blueprint = uuid::Uuid::new_v4();
    let (deployment, installation) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let insert = |table: &str, columns: &[&str], values: Vec<sea_orm::sea_query::SimpleExpr>| {
        Query::insert()
            .into_table(Alias::new(table))
            .columns(columns.iter().map(|c| Alias::new(*c)))
            .values_panic(values)
            .to_owned()
    };
    db.execute(&insert(
        "users",
        &[
            "id",
            "username",
            "role",
            "disabled",
            "created_at",
            "updated_at",
        ],
        vec![
            admin.into(),
            "admin".into(),
            "ADMIN".into(),
            false.into(),
            now.into(),
            now.into(),
        ],
    ))
    .await
    .unwrap();
    db.execute(&insert(
        "blueprints",
        &["id", "name", "source", "created_at", "updated_at"],
        vec![
            blueprint.into(),
            "old".into(),
            ONE_SERVICE.into(),
            now.into(),
            now.into(),
        ],
    ))
    .await
    .unwrap();
    for (id, name, element) in [
        (deployment, "old-1", None),
        (
            installation,
            "installation of x 1.0.0",
            Some(uuid::Uuid::new_v4()),
        ),
    ] {
        db.execute(&insert(
            "deployments",
            &[
                "id",
                "name",
                "blueprint_id",
                "element_id",
                "source",
                "variables",
                "state",
                "on_failure",
                "created_at",
                "updated_at",
            ],
            vec![
                id.into(),
                name.into(),
                element.is_none().then_some(blueprint).into(),
                element.into(),
                ONE_SERVICE.into(),
                "{}".into(),
                "DESTROYED".into(),
                "ROLLBACK".into(),
                now.into(),
                now.into(),
            ],
        ))
        .await
        .unwrap();
    }
    db.close().await.unwrap();

    // The next start migrates it.
    let app = TestApp::spawn_on(store).await;
    let projects = app
        .gql(
            "{ projects { id name members { user { username } role } } }",
            json!({}),
        )
        .await;
    let projects = data(&projects)["projects"].as_array().unwrap().clone();
    let id_of = |name: &str| {
        projects
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no project {name}: {projects:?}"))["id"]
            .clone()
    };
    let default = projects.iter().find(|p| p["name"] == "default").unwrap();
    assert_eq!(
        default["members"],
        json!([{ "user": { "username": "admin" }, "role": "ADMIN" }])
    );
    let body = app
        .gql(
            "query($b: ID!, $d: ID!, $i: ID!) {
               blueprint(id: $b) { name projectId }
               d: deployment(id: $d) { name projectId }
               i: deployment(id: $i) { name projectId } }",
            json!({ "b": blueprint.to_string(), "d": deployment.to_string(), "i": installation.to_string() }),
        )
        .await;
    let body = data(&body);
    assert_eq!(body["blueprint"]["name"], "old");
    assert_eq!(body["blueprint"]["projectId"], id_of("default"));
    assert_eq!(body["d"]["projectId"], id_of("default"));
    assert_eq!(body["i"]["projectId"], id_of("platform"));
}

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

pub(crate) async fn destroy_all(app: &TestApp, token: &str, ids: &[String]) {
    for id in ids {
        let body = app
            .gql_as(
                Some(token),
                "mutation($id: ID!) { destroyDeployment(id: $id) { id } }",
                json!({ "id": id }),
            )
            .await;
        data(&body);
    }
    for id in ids {
        settled(app, id, &["DESTROYED"]).await;
    }
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
