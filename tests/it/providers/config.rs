//! Provider configuration sent live (secrets hidden), and a repository read
//! through a provider.

use std::time::Duration;

use serde_json::json;

use crate::support::provider_repos::{ProviderRepo, fixture_metadata, process_metadata};
use crate::support::providers::{create_provider, nodes, provider, spawn_quick, wait_status};
use crate::support::{data, error_code, eventually};

#[tokio::test]
async fn configuration_is_sent_live_and_secrets_stay_hidden() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, _) = create_provider(&app, json!({ "name": "conf", "gitUrl": repo.url() })).await;
    wait_status(&app, &id, "CONNECTED").await;
    let answer = app
        .gql(
            "mutation($id: ID!) { configureProvider(id: $id, config: {capacity: 3}, secretConfig: {apiKey: \"s3cr3t-value\"}) { config secretConfigKeys } }",
            json!({ "id": id }),
        )
        .await;
    let configured = &data(&answer)["configureProvider"];
    assert_eq!(configured["config"], json!({"capacity": 3}));
    assert_eq!(configured["secretConfigKeys"], json!(["apiKey"]));
    assert!(!answer.to_string().contains("s3cr3t-value"));
    let answer = nodes(&app, &id).await;
    assert_eq!(
        data(&answer)["provider"]["nodes"][0]["capacity"]["process.v1.service"],
        3
    );

    // A type the provider refuses is a validation error in its words, and
    // is not stored.
    let answer = app
        .gql(
            "mutation($id: ID!) { configureProvider(id: $id, config: {capacity: \"many\"}) { config } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(error_code(&answer), Some("VALIDATION"), "{answer}");
    let message = answer["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.starts_with("the provider refused the configuration: ")
            && message.contains("capacity"),
        "{message}"
    );
    assert_eq!(provider(&app, &id).await.config, json!({"capacity": 3}));

    // A rotated token is shown once and differs.
    let rotated = app
        .gql(
            "mutation($id: ID!) { rotateProviderToken(id: $id) { token provider { id } } }",
            json!({ "id": id }),
        )
        .await;
    let token = data(&rotated)["rotateProviderToken"]["token"]
        .as_str()
        .unwrap();
    assert!(token.starts_with("cbp_"));
    app.stop().await;
}

/// A repository read through a provider with the `repository` feature.
#[tokio::test]
async fn a_repository_reads_through_a_provider() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&fixture_metadata("normal"), &[]);
    let manifest = "name: hello\nversion: 1.0.0\nresources:\n  app:\n    type: fixture.v1.noop\n";
    let (id, _) = create_provider(
        &app,
        json!({
            "name": "repo-provider",
            "gitUrl": repo.url(),
            "config": { "elements": [
                { "name": "hello", "version": "1.0.0", "manifest_yaml": manifest },
                { "name": "hello", "version": "1.1.0", "manifest_yaml": manifest.replace("1.0.0", "1.1.0") },
            ] },
        }),
    )
    .await;
    let connected = wait_status(&app, &id, "CONNECTED").await;
    assert!(
        connected.features.contains(&"repository".to_owned()),
        "{connected:?}"
    );
    let created = app
        .gql(
            "mutation($input: CreateRepositoryInput!) { createRepository(input: $input) { id } }",
            json!({ "input": { "name": "via-provider", "driver": { "provider": { "providerId": id } } } }),
        )
        .await;
    let repository = data(&created)["createRepository"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let synced = eventually(Duration::from_secs(30), "the sync", || async {
        let body = app
            .gql(
                "query($id: ID!) { repository(id: $id) { status statusMessage driver { ... on ProviderDriver { kind providerId } } } }",
                json!({ "id": repository }),
            )
            .await;
        let r = data(&body)["repository"].clone();
        (r["status"] == "ACTIVE" || r["status"] == "ERROR").then_some(r)
    })
    .await;
    assert_eq!(synced["status"], "ACTIVE", "{synced}");
    assert_eq!(synced["driver"]["providerId"], id.as_str());
    let body = app
        .gql(
            "{ elements(filter: {name: \"hello\"}) { totalCount edges { node { version manifest } } } }",
            json!({}),
        )
        .await;
    let elements = &data(&body)["elements"];
    assert_eq!(elements["totalCount"], 2, "{body}");
    let manifest = elements["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|e| e["node"]["manifest"].as_object().cloned())
        .expect("a manifest read through GetElement");
    assert_eq!(manifest["resources"]["app"]["type"], "fixture.v1.noop");
    app.stop().await;
}
