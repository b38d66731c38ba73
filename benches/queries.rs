//! API read figures (a benchmark, not a test: it prints, it does not assert).
//!
//! The server in this process on SQLite, the fixture provider loaded from
//! git, a blueprint of 1,000 independent resources deployed through
//! GraphQL; then the web console's queries for that deployment's page, timed
//! end to end over HTTP one after another:
//! - its opening query (the deployment, its 1,000 nodes with their provider,
//!   and the blueprint copy's resources with their edges);
//! - the query it makes again on every change (the same without resources).
//!
//! Run with `cargo bench --profile dist --bench queries`.

mod common;
#[path = "common/fixture.rs"]
mod fixture;

use std::time::{Duration, Instant};

use common::api::Api;
use common::profile;
use corbel::app::App;
use corbel::config::Config;
use serde_json::json;

/// How long a bench step may take before it is called stuck.
const NO_END: Duration = Duration::from_secs(300);

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NODES: usize = 1_000;
const ROUNDS: usize = 50;

/// The console's fields for a deployment (`web/js/pages/deployments.js`).
const FIELDS: &str = "id name projectId blueprintId elementId state phase onFailure error expiresAt createdAt updatedAt
  nodes { id key replica type node state outputs error updatedAt provider { id name features } }";

fn main() {
    let bin = fixture::build_fixture();
    profile::announce("API read");
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run(&bin));
}

async fn run(bin: &std::path::Path) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config::for_data_dir(dir.path().join("data"));
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.log_filter = "warn".into();
    // The fixture is a prebuilt binary outside the bench's own directory:
    // granted to the provider sandbox, as an operator would.
    let bins = bin.parent().expect("the fixture's directory");
    config.provider.sandbox_read.push(bins.to_owned());
    let app = App::build(&config).await.expect("app");
    let addr = app.local_addr().to_string();
    let token = app
        .new_admin_token()
        .expect("a fresh admin token")
        .to_owned();
    tokio::spawn(app.run_until_stopped(std::future::pending()));
    let api = Api::new(&addr, &token).await;

    let created = api
        .gql(
            "mutation P($input: CreateProviderInput!) { createProvider(input: $input) { provider { id } } }",
            json!({ "input": {
                "name": "fixture",
                "gitUrl": fixture::fixture_repo(dir.path(), bin),
                "config": { "capacity": 1_000_000 },
            }}),
        )
        .await;
    let provider = created["createProvider"]["provider"]["id"].clone();
    api.wait(
        "the fixture connecting",
        NO_END,
        "query P($id: ID!) { provider(id: $id) { status statusMessage } }",
        json!({ "id": provider }),
        |d| {
            assert_ne!(d["provider"]["status"], "FAILED", "{d}");
            d["provider"]["status"] == "CONNECTED"
        },
    )
    .await;

    let mut source = String::from("resources:\n");
    for i in 0..NODES {
        source.push_str(&format!("  r{i}: {{ type: fixture.v1.noop }}\n"));
    }
    let blueprint = api
        .gql(
            "mutation B($input: CreateBlueprintInput!) { createBlueprint(input: $input) { id } }",
            json!({ "input": { "name": "wide", "source": source } }),
        )
        .await["createBlueprint"]["id"]
        .clone();
    let id = api
        .gql(
            "mutation D($input: DeployBlueprintInput!) { deployBlueprint(input: $input) { id } }",
            json!({ "input": { "blueprintId": blueprint, "name": "wide" } }),
        )
        .await["deployBlueprint"]["id"]
        .clone();
    api.wait(
        "the deploy",
        NO_END,
        "query D($id: ID!) { deployment(id: $id) { state } }",
        json!({ "id": id }),
        |d| d["deployment"]["state"] == "COMPLETE",
    )
    .await;

    let opening = format!(
        "query D($id: ID!) {{ deployment(id: $id) {{ {FIELDS} resources {{ key type dependsOn }} }} }}"
    );
    let again = format!("query D($id: ID!) {{ deployment(id: $id) {{ {FIELDS} }} }}");
    for (what, query) in [
        ("opening query (nodes, providers, resources)", &opening),
        ("query on every change (nodes, providers)", &again),
    ] {
        let mut times = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let started = Instant::now();
            let data = api.gql(query, json!({ "id": id })).await;
            times.push(started.elapsed());
            assert_eq!(
                data["deployment"]["nodes"].as_array().map(Vec::len),
                Some(NODES)
            );
        }
        times.sort_unstable();
        println!(
            "deployment(id) with {NODES} nodes, {what}: median {:.1} ms, p90 {:.1} ms ({ROUNDS} rounds)",
            ms(times[ROUNDS / 2]),
            ms(times[ROUNDS * 9 / 10]),
        );
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
