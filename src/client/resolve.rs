//! Names to the API's objects, through its list queries: what a command is
//! given is a name (or an id), what the API takes is an id. An unknown name
//! is a [`ClientError::NotFound`] naming it.

use serde_json::{Value, json};

use super::api::Api;
use super::error::ClientError;

/// What a command reads of a deployment.
pub const DEPLOYMENT: &str = "id name state health healthChangedAt phase error projectId \
     blueprintId elementId onFailure variables expiresAt createdAt updatedAt \
     nodes { key replica type node state error outputs health healthReason restarts drift }";
/// What a command reads of a provider.
pub const PROVIDER: &str = "id name gitUrl ref path status statusMessage autoLoad \
     resolvedCommit features resourceTypes restarts lastSeenAt createdAt updatedAt";
/// What a command reads of a repository.
pub const REPOSITORY: &str = "id name syncMode priority refreshIntervalSeconds status \
     statusMessage invalidElementCount progress { seen stored } lastSyncedAt nextRefreshAt \
     createdAt updatedAt driver { __typename ... on HttpDriver { kind url } \
     ... on LocalDriver { kind path } ... on MigrationDriver { kind } \
     ... on ProviderDriver { kind providerId } }";

fn is_id(text: &str) -> bool {
    uuid::Uuid::parse_str(text).is_ok()
}

/// The one item of `items` whose name (or id) is `wanted`.
fn by_name(items: Vec<Value>, wanted: &str, what: &str) -> Result<Value, ClientError> {
    items
        .into_iter()
        .find(|item| item["name"] == wanted || item["id"] == wanted)
        .ok_or_else(|| ClientError::NotFound(format!("no {what} named `{wanted}`")))
}

pub async fn provider(api: &Api, name: &str) -> Result<Value, ClientError> {
    by_name(
        api.all("providers", None, PROVIDER).await?,
        name,
        "provider",
    )
}

pub async fn repository(api: &Api, name: &str) -> Result<Value, ClientError> {
    by_name(
        api.all("repositories", None, REPOSITORY).await?,
        name,
        "repository",
    )
}

/// A project's id, by name or id.
pub async fn project(api: &Api, name: &str) -> Result<String, ClientError> {
    let projects: Vec<Value> = api
        .get("{ projects { id name } }", json!({}), "projects")
        .await?;
    let found = by_name(projects, name, "project")?;
    Ok(found["id"].as_str().unwrap_or_default().to_owned())
}

/// Every deployment named exactly `name`, oldest first.
pub async fn deployments_named(api: &Api, name: &str) -> Result<Vec<Value>, ClientError> {
    let mut found: Vec<Value> = api
        .all(
            "deployments",
            Some(("DeploymentFilter!", json!({ "search": name }))),
            DEPLOYMENT,
        )
        .await?
        .into_iter()
        .filter(|d| d["name"] == name)
        .collect();
    found.sort_by(|a, b| cell(&a["createdAt"]).cmp(&cell(&b["createdAt"])));
    Ok(found)
}

/// A deployment by id, or by name: the one of that name, else the one of
/// that name not destroyed, else the newest of that name. Several live ones
/// of one name are a usage error: the id says which.
pub async fn deployment(api: &Api, name_or_id: &str) -> Result<Value, ClientError> {
    if is_id(name_or_id) {
        return api
            .get(
                &format!("query($id: ID!) {{ deployment(id: $id) {{ {DEPLOYMENT} }} }}"),
                json!({ "id": name_or_id }),
                "deployment",
            )
            .await;
    }
    let mut all = deployments_named(api, name_or_id).await?;
    if all.len() <= 1 {
        return all
            .pop()
            .ok_or_else(|| ClientError::NotFound(format!("no deployment named `{name_or_id}`")));
    }
    let mut live: Vec<Value> = all
        .iter()
        .filter(|d| d["state"] != "DESTROYED")
        .cloned()
        .collect();
    match live.len() {
        0 => Ok(all.pop().expect("several")),
        1 => Ok(live.pop().expect("one")),
        n => Err(ClientError::Usage(format!(
            "{n} deployments not destroyed are named `{name_or_id}`: give the id of one ({})",
            live.iter()
                .map(|d| cell(&d["id"]))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

fn cell(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}
