//! Typed GraphQL answers for the shapes the tests read most. Every field has a
//! default, so that a query selecting fewer fields still reads; what a query
//! did not select is `None`, empty or null.

use serde::Deserialize;
use serde_json::Value;

/// A deployment (`DEPLOYMENT_FIELDS`, or fewer).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Deployment {
    pub id: String,
    pub name: String,
    pub state: String,
    pub phase: Option<String>,
    pub error: Option<String>,
    pub variables: Value,
    pub expires_at: Option<String>,
    pub nodes: Vec<Node>,
    pub events: Vec<Event>,
}

impl Deployment {
    /// The node (the first replica) of resource `key`.
    #[track_caller]
    pub fn node(&self, key: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.key == key)
            .unwrap_or_else(|| panic!("no node {key} in {self:?}"))
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Node {
    pub id: String,
    pub key: String,
    pub replica: i64,
    /// The provider's node it is placed on.
    pub node: Option<String>,
    pub state: String,
    pub outputs: Value,
    pub error: Option<String>,
    pub provider_id: Option<String>,
    pub provider: Option<Named>,
}

impl Node {
    /// `outputs.pid`, which the process provider sets.
    pub fn pid(&self) -> Option<i64> {
        self.outputs["pid"].as_i64()
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Named {
    pub name: String,
}

/// A deployment's event.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Event {
    pub id: String,
    pub kind: String,
    pub node_key: Option<String>,
    pub state: Option<String>,
    pub message: Option<String>,
    pub at: Option<String>,
}

impl Event {
    /// An event of node `node_key` (`key[replica]`) reaching `state`.
    pub fn is(&self, node_key: &str, state: &str) -> bool {
        self.node_key.as_deref() == Some(node_key) && self.state.as_deref() == Some(state)
    }
}

/// A provider (`PROVIDER_FIELDS`, or fewer).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Provider {
    pub id: String,
    pub name: String,
    pub git_url: String,
    #[serde(rename = "ref")]
    pub reference: Option<String>,
    pub status: String,
    pub status_message: Option<String>,
    pub resolved_commit: Option<String>,
    pub restarts: i64,
    pub last_seen_at: Option<String>,
    pub features: Vec<String>,
    pub resource_types: Vec<String>,
    pub config: Value,
    pub secret_config_keys: Vec<String>,
    pub metadata: Option<ProviderMetadata>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProviderMetadata {
    pub name: String,
    pub version: String,
    pub runtime: String,
    pub features: Vec<String>,
    pub resource_types: Vec<String>,
}

/// A repository (`REPO_FIELDS`, or fewer).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Repository {
    pub id: String,
    pub status: String,
    pub status_message: Option<String>,
    pub progress: Option<SyncProgress>,
    pub last_synced_at: Option<String>,
    pub updated_at: Option<String>,
    pub invalid_element_count: i64,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct SyncProgress {
    pub seen: i64,
    pub stored: i64,
}
