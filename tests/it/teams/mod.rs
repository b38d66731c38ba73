//! Teams (issue 15): users made, disabled and deleted by server admins;
//! projects whose members see only their own blueprints and deployments,
//! within their quotas; and the policy matrix. This module holds what the
//! tests share (`audit` uses it too): users signed in, projects and their
//! members, a one-service blueprint, and destroying what a test deployed.

use serde_json::json;

use crate::support::deployments::settled;
use crate::support::{TestApp, data};

mod policy;
mod projects;
mod quotas;
mod upgrade;
mod users;

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
