//! What Corbel says: deployments read through the API (from a server that
//! may be killed at any moment), the journal read from the database, and the
//! poll built on them: "settled" (the moment to strike is in `moment.rs`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::world::Proc;
use crate::support::processes::{parent, provider_process};
use crate::support::{ADMIN_TOKEN, TestStore, journal_deployments};

/// How long a settle may take before it counts as stuck. Generous: a correct
/// engine settles in seconds, but CI machines are slow and shared.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(120);

/// A server's API.
#[derive(Clone)]
pub struct Api {
    client: reqwest::Client,
    url: String,
    /// The server's process: the provider it runs is its child. (A killed
    /// server's provider may linger, and its status row may still say
    /// CONNECTED, until the new server loads it again.)
    server: u32,
}

impl Api {
    pub fn at(addr: std::net::SocketAddr, server: u32) -> Api {
        Api {
            client: reqwest::Client::new(),
            url: format!("http://{addr}/graphql"),
            server,
        }
    }

    /// The `data` of an answer; a transport failure or any error is `Err`.
    pub async fn gql(&self, query: &str, variables: Value) -> Result<Value, String> {
        let response = self
            .client
            .post(&self.url)
            .bearer_auth(ADMIN_TOKEN)
            .timeout(Duration::from_secs(30))
            .json(&json!({ "query": query, "variables": variables }))
            .send()
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        let body: Value = response
            .json()
            .await
            .map_err(|e| format!("not JSON: {e}"))?;
        match body.get("errors") {
            Some(errors) => Err(errors.to_string()),
            None => Ok(body["data"].clone()),
        }
    }
}

/// A deployment as the API shows it.
pub struct View {
    pub name: String,
    pub state: String,
    pub error: Option<String>,
    pub nodes: Vec<NodeView>,
}

pub struct NodeView {
    pub key: String,
    pub replica: i64,
    pub state: String,
    pub pid: Option<i32>,
    pub error: Option<String>,
}

impl View {
    pub fn terminal(&self) -> bool {
        matches!(self.state.as_str(), "COMPLETE" | "FAILED" | "DESTROYED")
    }

    /// `COMPLETE×97 IN_PROGRESS×3`.
    pub fn histogram(&self) -> String {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for n in &self.nodes {
            *counts.entry(&n.state).or_default() += 1;
        }
        let shown: Vec<String> = counts.iter().map(|(s, n)| format!("{s}×{n}")).collect();
        if shown.is_empty() {
            "none".into()
        } else {
            shown.join(" ")
        }
    }
}

pub async fn view(api: &Api, id: &str) -> Result<View, String> {
    let answer = api
        .gql(
            "query($id: ID!) { deployment(id: $id) { name state error nodes { key replica state outputs error } } }",
            json!({ "id": id }),
        )
        .await?;
    let d = &answer["deployment"];
    let text = |v: &Value| v.as_str().map(str::to_owned);
    Ok(View {
        name: text(&d["name"]).unwrap_or_default(),
        state: text(&d["state"]).unwrap_or_default(),
        error: text(&d["error"]),
        nodes: d["nodes"]
            .as_array()
            .ok_or_else(|| format!("no nodes in {answer}"))?
            .iter()
            .map(|n| NodeView {
                key: text(&n["key"]).unwrap_or_default(),
                replica: n["replica"].as_i64().unwrap_or(-1),
                state: text(&n["state"]).unwrap_or_default(),
                pid: n["outputs"]["pid"].as_i64().map(|p| p as i32),
                error: text(&n["error"]),
            })
            .collect(),
    })
}

/// pid -> (deployment name, key) of each COMPLETE node naming it, across the
/// deployments that are not destroyed: what Corbel says runs.
pub fn records(views: &BTreeMap<String, View>) -> BTreeMap<i32, Vec<(String, String)>> {
    let mut recorded: BTreeMap<i32, Vec<(String, String)>> = BTreeMap::new();
    for v in views.values().filter(|v| v.state != "DESTROYED") {
        for n in v.nodes.iter().filter(|n| n.state == "COMPLETE") {
            if let Some(pid) = n.pid {
                recorded
                    .entry(pid)
                    .or_default()
                    .push((v.name.clone(), n.key.clone()));
            }
        }
    }
    recorded
}

/// key -> (pid, start time) of the process running it (start 0: not running).
pub fn identities(v: &View, world: &BTreeMap<i32, Proc>) -> BTreeMap<String, (i32, u64)> {
    v.nodes
        .iter()
        .filter(|n| n.state == "COMPLETE")
        .filter_map(|n| {
            let pid = n.pid?;
            let start = world.get(&pid).map_or(0, |p| p.start);
            Some((n.key.clone(), (pid, start)))
        })
        .collect()
}

/// The deployments a settle waits for, by id, with their names.
pub struct Waited<'a> {
    pub id: &'a str,
    pub name: &'a str,
}

/// Polls until the provider is CONNECTED with its process running (not
/// frozen), each of `waited` is terminal with no journal entry, and the
/// journal holds nothing of other deployments; then reads `all`. On timeout:
/// a dump of what was not settled, and which of `waited` held it up.
pub async fn settle(
    api: &Api,
    store: &TestStore,
    provider: &str,
    waited: &[Waited<'_>],
    all: &[Waited<'_>],
) -> Result<BTreeMap<String, View>, (String, Vec<String>)> {
    let deadline = Instant::now() + SETTLE_LIMIT;
    let mut last = (String::new(), Vec::new());
    while Instant::now() < deadline {
        match settled_now(api, store, provider, waited, all).await {
            Ok(()) => {
                let mut views = BTreeMap::new();
                for d in all {
                    match view(api, d.id).await {
                        Ok(v) => {
                            views.insert(d.id.to_owned(), v);
                        }
                        Err(e) => last = (format!("cannot read {}: {e}", d.name), Vec::new()),
                    }
                }
                if views.len() == all.len() {
                    return Ok(views);
                }
            }
            Err(why) => last = why,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (why, blocking) = last;
    Err((dump(api, store, provider, all, &why).await, blocking))
}

/// `Ok` when settled; else what is not, and which deployments hold it up.
async fn settled_now(
    api: &Api,
    store: &TestStore,
    provider: &str,
    waited: &[Waited<'_>],
    all: &[Waited<'_>],
) -> Result<(), (String, Vec<String>)> {
    let alone = |why: String| (why, Vec::new());
    let answer = api
        .gql(
            "query($id: ID!) { provider(id: $id) { status statusMessage } deployments(first: 500) { edges { node { id state } } } }",
            json!({ "id": provider }),
        )
        .await
        .map_err(alone)?;
    let status = &answer["provider"]["status"];
    if status != "CONNECTED" {
        return Err(alone(format!(
            "the provider is {status} ({})",
            answer["provider"]["statusMessage"]
        )));
    }
    let (pid, state) = provider_process(store, provider)
        .ok_or_else(|| alone("the provider's process is not running".into()))?;
    if parent(pid) != i32::try_from(api.server).ok() {
        return Err(alone(format!(
            "the provider's process {pid} is not the server's (yet)"
        )));
    }
    if state == 'T' {
        return Err(alone(format!(
            "the provider is CONNECTED, but its process {pid} is stopped"
        )));
    }
    let edges = answer["deployments"]["edges"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if edges.len() != all.len() {
        return Err(alone(format!(
            "{} deployments, {} made by this test",
            edges.len(),
            all.len()
        )));
    }
    let journal: Vec<String> = journal_deployments(store)
        .await
        .map_err(alone)?
        .iter()
        .map(ToString::to_string)
        .collect();
    let mut why = Vec::new();
    let mut blocking = Vec::new();
    for d in waited {
        let state = edges
            .iter()
            .find(|e| e["node"]["id"] == d.id)
            .and_then(|e| e["node"]["state"].as_str())
            .unwrap_or_default();
        let entries = journal.iter().filter(|j| *j == d.id).count();
        if !matches!(state, "COMPLETE" | "FAILED" | "DESTROYED") || entries > 0 {
            why.push(format!(
                "{} is {state} with {entries} journal entries",
                d.name
            ));
            blocking.push(d.id.to_owned());
        }
    }
    let strays = journal
        .iter()
        .filter(|j| !all.iter().any(|d| d.id == j.as_str()))
        .count();
    if strays > 0 {
        why.push(format!("{strays} journal entries of unknown deployments"));
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err((why.join("; "), blocking))
    }
}

/// What a stuck settle looked like: the provider, the journal, and each
/// deployment with its unfinished nodes and last events.
async fn dump(
    api: &Api,
    store: &TestStore,
    provider: &str,
    all: &[Waited<'_>],
    why: &str,
) -> String {
    let mut out = format!("last seen: {why}\n");
    let shown = api
        .gql(
            "query($id: ID!) { provider(id: $id) { status statusMessage restarts } }",
            json!({ "id": provider }),
        )
        .await
        .map(|a| a["provider"].to_string())
        .unwrap_or_else(|e| e);
    out.push_str(&format!("provider: {shown}\n"));
    let journal = journal_deployments(store).await.unwrap_or_default();
    for d in all {
        let entries = journal.iter().filter(|j| j.to_string() == d.id).count();
        let Ok(v) = view(api, d.id).await else {
            out.push_str(&format!("{}: unreadable\n", d.name));
            continue;
        };
        out.push_str(&format!(
            "{} ({}): {}, error {:?}, {entries} journal entries; nodes {}\n",
            d.name,
            d.id,
            v.state,
            v.error,
            v.histogram()
        ));
        if v.terminal() && entries == 0 {
            continue;
        }
        // The unfinished nodes, those that got furthest first.
        let mut unfinished: Vec<_> = v
            .nodes
            .iter()
            .filter(|n| !matches!(n.state.as_str(), "COMPLETE" | "DESTROYED"))
            .collect();
        unfinished.sort_by_key(|n| (n.state == "TO_DEPLOY", n.state.clone()));
        for n in unfinished.into_iter().take(10) {
            out.push_str(&format!(
                "  {}[{}] {} {:?}\n",
                n.key, n.replica, n.state, n.error
            ));
        }
        let events = api
            .gql(
                "query($id: ID!) { deployment(id: $id) { events(first: 10000) { kind nodeKey state message } } }",
                json!({ "id": d.id }),
            )
            .await
            .ok()
            .and_then(|a| a["deployment"]["events"].as_array().cloned())
            .unwrap_or_default();
        for e in &events[events.len().saturating_sub(12)..] {
            out.push_str(&format!(
                "  event {} {} {} {}\n",
                e["kind"], e["nodeKey"], e["state"], e["message"]
            ));
        }
    }
    out
}
