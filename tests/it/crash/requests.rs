//! The requests a crash test makes: the provider and the blueprint on a fresh
//! server, then deploys, destroys and redeploys, each tracked with where it
//! must end.

use std::time::{Duration, Instant};

use rand::Rng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};

use super::chaos::{Chaos, Redeploy, Tracked, Want, violation};
use super::observe::{Api, identities, view};
use super::shape::Shape;
use super::world::world;
use crate::support::provider_repos::ProviderRepo;
use crate::support::providers::{create_provider, wait_status};
use crate::support::{TestApp, TestStore, data};

const DEPLOY: &str =
    "mutation($input: DeployBlueprintInput!) { deployBlueprint(input: $input) { id } }";
const DESTROY: &str = "mutation($id: ID!) { destroyDeployment(id: $id) { id } }";
const REDEPLOY: &str = "mutation($id: ID!, $keys: [String!]!) { redeployDeployment(id: $id, resourceKeys: $keys) { id } }";

/// Creates the process provider (roomy, quick to destroy: sleep obeys
/// SIGTERM, and the grace is short anyway) and the blueprint; returns their
/// ids once the provider is connected.
pub async fn prepare(app: &TestApp, repo: &ProviderRepo, shape: &Shape) -> (String, String) {
    let (provider, _) = create_provider(
        app,
        json!({ "name": "process", "gitUrl": repo.url(), "config": { "capacity": 100000, "grace_ms": 200 } }),
    )
    .await;
    wait_status(app, &provider, "CONNECTED").await;
    let body = app
        .gql(
            "mutation($input: CreateBlueprintInput!) { createBlueprint(input: $input) { id } }",
            json!({ "input": { "name": "chaos", "source": shape.source } }),
        )
        .await;
    let blueprint = data(&body)["createBlueprint"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    (provider, blueprint)
}

impl Chaos {
    /// Sends a mutation, retrying while the deployment is busy (right after a
    /// settle its lock may still be held for a moment). A refusal is a
    /// violation.
    async fn mutate(
        &mut self,
        api: &Api,
        what: &str,
        query: &str,
        variables: Value,
    ) -> Option<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match api.gql(query, variables.clone()).await {
                Ok(answer) => return Some(answer),
                Err(e) if e.contains("CONFLICT") && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    self.report(what, vec![violation(format!("the request to {what}"), e)]);
                    return None;
                }
            }
        }
    }

    /// Deploys the blueprint as a new deployment; returns its id. Every
    /// other deployment is `onFailure: KEEP` (the rest ROLLBACK): under
    /// either, a fault must leave it COMPLETE.
    pub async fn deploy(&mut self, api: &Api, blueprint: &str) -> Option<String> {
        let name = format!("chaos-{}", self.tracked.len());
        let on_failure = ["ROLLBACK", "KEEP"][self.tracked.len() % 2];
        let input = json!({
            "blueprintId": blueprint,
            "name": name,
            "variables": { "tag": name },
            "onFailure": on_failure,
        });
        let what = format!("deploy {name} ({on_failure})");
        let answer = self
            .mutate(api, &what, DEPLOY, json!({ "input": input }))
            .await?;
        let id = answer["deployBlueprint"]["id"].as_str()?.to_owned();
        self.tracked.push(Tracked {
            id: id.clone(),
            name,
            want: Want::Complete,
            wedged: false,
        });
        Some(id)
    }

    pub async fn destroy(&mut self, api: &Api, index: usize) -> Option<String> {
        let id = self.tracked[index].id.clone();
        let what = format!("destroy {}", self.tracked[index].name);
        self.mutate(api, &what, DESTROY, json!({ "id": id }))
            .await?;
        self.tracked[index].want = Want::Destroyed;
        Some(id)
    }

    /// Redeploys one key of deployment `index`: half the time one something
    /// depends on, else any (mostly leaves). What runs now is the "before".
    pub async fn redeploy(&mut self, api: &Api, index: usize) -> Option<Redeploy> {
        let (id, name) = (
            self.tracked[index].id.clone(),
            self.tracked[index].name.clone(),
        );
        let key = if self.rng.random_bool(0.5) {
            (*self.shape.inner_keys().choose(&mut self.rng)?).clone()
        } else {
            self.shape.keys.choose(&mut self.rng)?.clone()
        };
        let before = match view(api, &id).await {
            Ok(v) => identities(&v, &world(&self.mark)),
            Err(_) => Default::default(),
        };
        let what = format!("redeploy {name} [{key}]");
        self.mutate(api, &what, REDEPLOY, json!({ "id": id, "keys": [key] }))
            .await?;
        self.tracked[index].want = Want::Complete;
        Some(Redeploy {
            affected: self.shape.with_dependents(&key),
            id,
            name,
            key,
            before,
        })
    }

    /// Destroys every deployment not destroyed yet, with no fault, and checks
    /// that no process with the mark is left.
    pub async fn destroy_everything(&mut self, api: &Api, store: &TestStore, provider: &str) {
        for index in 0..self.tracked.len() {
            self.tracked[index].wedged = false;
            let id = self.tracked[index].id.clone();
            if view(api, &id).await.is_ok_and(|v| v.state != "DESTROYED") {
                self.destroy(api, index).await;
            }
        }
        let when = "after destroying everything";
        self.settle_and_check(api, store, provider, when).await;
        let left: Vec<String> = world(&self.mark)
            .values()
            .map(|p| format!("pid {} ({}/{})", p.pid, p.tag, p.key))
            .collect();
        if !left.is_empty() {
            let found = violation(
                when,
                format!("{} marked processes remain: {left:?}", left.len()),
            );
            self.report(when, vec![found]);
        }
    }
}
