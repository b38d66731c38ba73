//! Repositories and elements: nginx-layout trees of elements on disk, and
//! repositories and element mutations through the API.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::types::Repository;
use super::{TestApp, data, eventually};

/// Writes an element into an nginx-layout tree: its manifest, its per-element
/// inventory, and its artifact files.
pub fn put_element(
    root: &Path,
    name: &str,
    version: &str,
    requirements: Value,
    artifacts: &[(&str, &str, &str)],
) -> Value {
    let dir = root.join(name).join(version);
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    let manifest = json!({
        "name": name,
        "version": version,
        "requirements": requirements,
        // Nothing to deploy: these tests are about resolution and records;
        // installations that run resources are in `deployments.rs`.
        "resources": {},
    });
    std::fs::write(
        dir.join("manifests").join(format!("{name}.yaml")),
        serde_json::to_string_pretty(&manifest).unwrap(),
    )
    .unwrap();
    let mut index = serde_json::Map::new();
    for (category, uuid, file) in artifacts {
        std::fs::create_dir_all(dir.join(category)).unwrap();
        std::fs::write(dir.join(category).join(file), format!("contents of {file}")).unwrap();
        index
            .entry(category.to_string())
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .unwrap()
            .insert(uuid.to_string(), json!(file));
    }
    let entry = json!({"name": name, "version": version, "manifests": [format!("{name}.yaml")], "index": index});
    std::fs::write(dir.join("inventory.json"), entry.to_string()).unwrap();
    entry
}

pub fn write_inventory(root: &Path, entries: &[Value]) {
    let mut elements = serde_json::Map::new();
    for entry in entries {
        let name = entry["name"].as_str().unwrap();
        let version = entry["version"].as_str().unwrap();
        elements
            .entry(name.to_owned())
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .unwrap()
            .insert(version.to_owned(), entry.clone());
    }
    std::fs::write(
        root.join("inventory.json"),
        json!({"elements": elements}).to_string(),
    )
    .unwrap();
}

pub const REPO_FIELDS: &str =
    "id status statusMessage progress { seen stored } lastSyncedAt updatedAt invalidElementCount";

pub async fn create(app: &TestApp, input: Value) -> Repository {
    app.query_as(
        &format!("mutation($i: CreateRepositoryInput!) {{ createRepository(input: $i) {{ {REPO_FIELDS} }} }}"),
        json!({"i": input}),
        "createRepository",
    )
    .await
}

/// `"name version"` of each item, reading the element at `path` in each.
pub fn labels(items: &Value, path: &str) -> Vec<String> {
    items
        .as_array()
        .unwrap()
        .iter()
        .map(|item| {
            let element = &item[path];
            format!(
                "{} {}",
                element["name"].as_str().unwrap(),
                element["version"].as_str().unwrap()
            )
        })
        .collect()
}

/// Creates a repository and returns its id.
pub async fn create_id(app: &TestApp, input: Value) -> String {
    create(app, input).await.id
}

/// Polls until the repository's status is `want`. Callers wait for a status
/// other than the one it had before their refresh, so a stale read cannot pass.
pub async fn settled(app: &TestApp, id: &str, want: &str) -> Repository {
    eventually(
        Duration::from_secs(30),
        &format!("repository {want}"),
        || async {
            let repo: Repository = app
                .query_as(
                    &format!("query($id: ID!) {{ repository(id: $id) {{ {REPO_FIELDS} }} }}"),
                    json!({"id": id}),
                    "repository",
                )
                .await;
            (repo.status == want).then_some(repo)
        },
    )
    .await
}

pub async fn element_ids(
    app: &TestApp,
    repository: &str,
) -> std::collections::BTreeMap<String, String> {
    let body = app
        .gql(
            "query($r: ID!) { elements(filter: {repositoryId: $r}, first: 500) { totalCount edges { node { id name version } } } }",
            json!({"r": repository}),
        )
        .await;
    data(&body)["elements"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let n = &e["node"];
            (
                format!(
                    "{} {}",
                    n["name"].as_str().unwrap(),
                    n["version"].as_str().unwrap()
                ),
                n["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

pub async fn mutate(app: &TestApp, field: &str, args: &str, vars: Value) -> Value {
    app.gql(
        &format!("mutation {args} {{ {field} {{ id name version installed status }} }}"),
        vars,
    )
    .await
}

/// Asks for a refresh and waits until that sync has ended (`ACTIVE` or
/// `ERROR`): a sync's end is the only write that leaves a status other than
/// `SYNCING` with a new `updatedAt`.
pub async fn refresh(app: &TestApp, id: &str) -> Repository {
    refresh_with(app, id, false).await
}

/// [`refresh`], with `refetchManifests` as given.
pub async fn refresh_with(app: &TestApp, id: &str, refetch: bool) -> Repository {
    let query = format!("query($id: ID!) {{ repository(id: $id) {{ {REPO_FIELDS} }} }}");
    let before: Repository = app.query_as(&query, json!({"id": id}), "repository").await;
    data(
        &app.gql(
            "mutation($id: ID!, $refetch: Boolean!) { refreshRepository(id: $id, refetchManifests: $refetch) { id } }",
            json!({"id": id, "refetch": refetch}),
        )
        .await,
    );
    eventually(Duration::from_secs(30), "the refresh to end", || async {
        let repo: Repository = app.query_as(&query, json!({"id": id}), "repository").await;
        (repo.status != "SYNCING" && repo.updated_at != before.updated_at).then_some(repo)
    })
    .await
}

/// The repository's invalid elements, by path.
pub async fn invalid_elements(app: &TestApp, id: &str) -> Vec<Value> {
    let body = app
        .gql(
            "query($id: ID!) { repository(id: $id) { invalidElements(first: 500) { totalCount edges { node { name version path message elementId } } } } }",
            json!({"id": id}),
        )
        .await;
    let page = &data(&body)["repository"]["invalidElements"];
    let nodes: Vec<Value> = page["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["node"].clone())
        .collect();
    assert_eq!(page["totalCount"], nodes.len(), "{body}");
    nodes
}

/// The manifest of an element, as the API gives it (LAZY: fetched now).
pub async fn manifest_of(app: &TestApp, element: &str) -> Value {
    let body = app
        .gql(
            "query($id: ID!) { element(id: $id) { manifest } }",
            json!({"id": element}),
        )
        .await;
    data(&body)["element"]["manifest"].clone()
}
