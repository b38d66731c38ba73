//! The GraphQL API of a bench's server, as its admin: queries, waits, and
//! the providers and deployments a bench makes.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[derive(Clone)]
pub struct Api {
    pub client: reqwest::Client,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    token: String,
}

impl Api {
    /// Once the server at `addr` is ready, signed in with `token`.
    pub async fn new(addr: &str, token: &str) -> Api {
        let api = Api {
            client: reqwest::Client::new(),
            addr: addr.to_owned(),
            token: token.to_owned(),
        };
        let ready = format!("http://{addr}/readyz");
        while !api
            .client
            .get(&ready)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        api
    }

    /// The answer's `data`; an answer with errors panics.
    pub async fn gql(&self, query: &str, variables: Value) -> Value {
        let reply: Value = self
            .client
            .post(format!("http://{}/graphql", self.addr))
            .bearer_auth(&self.token)
            .json(&json!({ "query": query, "variables": variables }))
            .send()
            .await
            .expect("request")
            .json()
            .await
            .expect("json");
        assert!(reply.get("errors").is_none(), "{query}: {reply}");
        reply["data"].clone()
    }

    /// Polls `query` until `done` says so, within `limit`.
    pub async fn wait(
        &self,
        what: &str,
        limit: Duration,
        query: &str,
        vars: Value,
        done: impl Fn(&Value) -> bool,
    ) {
        let started = Instant::now();
        while !done(&self.gql(query, vars.clone()).await) {
            assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Creates a provider from `url` with `config`; its id, once CONNECTED.
    pub async fn provider(&self, name: &str, url: &str, config: Value) -> String {
        let created = self
            .gql(
                "mutation($input: CreateProviderInput!) { createProvider(input: $input) { provider { id } } }",
                json!({ "input": { "name": name, "gitUrl": url, "config": config } }),
            )
            .await;
        let id = created["createProvider"]["provider"]["id"]
            .as_str()
            .expect("an id")
            .to_owned();
        self.connected(&id).await;
        id
    }

    pub async fn connected(&self, provider: &str) {
        self.wait(
            "the provider connecting",
            Duration::from_secs(120),
            "query($id: ID!) { provider(id: $id) { status } }",
            json!({ "id": provider }),
            |d| d["provider"]["status"] == "CONNECTED",
        )
        .await;
    }

    /// A blueprint of `source` named `name`, deployed as `name`; the
    /// deployment's id.
    pub async fn deploy(&self, name: &str, source: &str) -> String {
        let blueprint = self
            .gql(
                "mutation($input: CreateBlueprintInput!) { createBlueprint(input: $input) { id } }",
                json!({ "input": { "name": name, "source": source } }),
            )
            .await["createBlueprint"]["id"]
            .clone();
        self.gql(
            "mutation($input: DeployBlueprintInput!) { deployBlueprint(input: $input) { id } }",
            json!({ "input": { "blueprintId": blueprint, "name": name } }),
        )
        .await["deployBlueprint"]["id"]
            .as_str()
            .expect("an id")
            .to_owned()
    }

    /// Waits for deployment `id` to be COMPLETE; FAILED panics.
    pub async fn settled(&self, id: &str, limit: Duration) {
        self.wait(
            "the deploy",
            limit,
            "query($id: ID!) { deployment(id: $id) { state } }",
            json!({ "id": id }),
            |d| {
                let state = &d["deployment"]["state"];
                assert_ne!(state, "FAILED", "the deploy failed");
                state == "COMPLETE"
            },
        )
        .await;
    }
}
