//! The matrix's table: for each root field, an operation that uses it and
//! its variables, naming the things of the matrix's fixture.

use serde_json::{Value, json};

/// The ids the operations name.
pub(super) struct Fixture {
    pub(super) project: String,
    pub(super) blueprint: String,
    pub(super) deployment: String,
    pub(super) destroyed: String,
    pub(super) node: String,
    pub(super) provider: String,
    /// A plan of `deployment`, applied already.
    pub(super) plan: String,
}

/// Each root field, an operation that uses it, and its variables. Each
/// operation is harmless once allowed: it fails on its input after the
/// permission check (a bad name, a past lease, a random id), or it repeats
/// what is already so.
pub(super) fn operations(f: &Fixture) -> Vec<(&'static str, String, Value)> {
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
            "changesByHour",
            "{ changesByHour(hours: 1) { deployments } }",
            json!({}),
        ),
        (
            "resourcesByHealth",
            "{ resourcesByHealth { count } }",
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
            "restartResource",
            "mutation($id: ID!) { restartResource(deploymentId: $id, key: \"no-such-resource\") { state } }",
            json!({ "id": d }),
        ),
        (
            "execResource",
            "mutation($id: ID!) { execResource(nodeId: $id, command: [\"true\"]) { exitCode } }",
            json!({ "id": f.node }),
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
