//! Planning: which provider serves each resource, how many replicas it has, and
//! on which provider node each replica goes. Counts of what is deployed and in
//! flight are read and the new nodes written under one lock, so two deploys
//! never both take the last room on a node.

use std::collections::BTreeMap;

use serde_json::Value;
use uuid::Uuid;

use super::blueprint::{self, Blueprint, Resource};
use super::strategy::{self, NodeInput};
use super::{DeployError, DeploymentState, Deployments, LIVE_NODE_STATES, NodeState};
use crate::provider::ProviderNode;
use crate::store::deployments as rows;

/// One resource's placement: the node of each replica (`None` when the
/// provider does not report nodes).
pub(super) struct Placed {
    pub provider_id: Uuid,
    pub nodes: Vec<Option<String>>,
}

impl Deployments {
    /// Writes the deployment's nodes and moves it to `IN_PROGRESS`.
    pub(super) async fn plan(
        &self,
        id: Uuid,
        bp: &Blueprint,
        variables: &BTreeMap<String, Value>,
    ) -> Result<(), String> {
        let _placing = self.inner.placing.lock().await;
        let mut nodes = Vec::new();
        for resource in &bp.resources {
            let placed = self
                .place(resource, variables, None)
                .await
                .map_err(|e| format!("resources.{}: {e}", resource.key))?;
            for (replica, node) in placed.nodes.into_iter().enumerate() {
                nodes.push(rows::NewNode {
                    key: resource.key.clone(),
                    replica: i32::try_from(replica).unwrap_or(i32::MAX),
                    resource_type: resource.resource_type.clone(),
                    provider_id: Some(placed.provider_id),
                    node,
                });
            }
        }
        let count = nodes.len();
        rows::insert_nodes(
            &self.inner.db,
            id,
            nodes,
            NodeState::ToDeploy.as_str(),
            DeploymentState::InProgress.as_str(),
        )
        .await
        .map_err(|e| format!("cannot store the plan: {e}"))?;
        self.record(
            id,
            super::EventKind::State,
            None,
            Some(DeploymentState::InProgress.as_str()),
            format!("planned {count} resource node(s)"),
        )
        .await;
        Ok(())
    }

    /// Places one resource's replicas. With `strategy` given it overrides the
    /// blueprint's (for `calculateCapacity`).
    pub(super) async fn place(
        &self,
        resource: &Resource,
        variables: &BTreeMap<String, Value>,
        strategy: Option<strategy::Strategy>,
    ) -> Result<Placed, DeployError> {
        let providers = &self.inner.providers;
        let provider_id = providers
            .for_resource_type(&resource.resource_type, resource.provider.as_deref())
            .await?;
        let need = blueprint::replicas(resource, variables)
            .map_err(|p| DeployError::Invalid(p.to_string()))?;
        let provider = providers.get(provider_id).await?;
        if !provider.features.iter().any(|f| f == "nodes") {
            let count = usize::try_from(need).unwrap_or(0);
            return Ok(Placed {
                provider_id,
                nodes: vec![None; count],
            });
        }
        let inputs = self.node_inputs(provider_id, resource).await?;
        let strategy = strategy.unwrap_or(resource.strategy);
        let plan = strategy::plan(strategy, &inputs, need)
            .map_err(|e| DeployError::Invalid(format!("placement on `{}`: {e}", provider.name)))?;
        let mut nodes = Vec::new();
        for (node, count) in plan.placements {
            for _ in 0..count {
                nodes.push(Some(node.clone()));
            }
        }
        Ok(Placed { provider_id, nodes })
    }

    /// Each of the provider's nodes with room for the resource's type: its
    /// remaining capacity and what it holds now (deployed and in flight).
    pub(super) async fn node_inputs(
        &self,
        provider_id: Uuid,
        resource: &Resource,
    ) -> Result<Vec<NodeInput>, DeployError> {
        let nodes = self.inner.providers.nodes(provider_id).await?;
        let counts = rows::placement_counts(&self.inner.db, provider_id, &LIVE_NODE_STATES).await?;
        Ok(nodes
            .into_iter()
            .filter_map(|node| {
                let capacity = capacity_for(&node, &resource.resource_type)?;
                let count = counts.get(&node.name).copied().unwrap_or(0);
                Some(NodeInput::new(node.name, (capacity - count).max(0), count))
            })
            .collect())
    }

    /// What the placement of one resource of a blueprint would be now, without
    /// allocating; with no strategy, each node's raw capacity.
    pub async fn calculate_capacity(
        &self,
        blueprint_id: Uuid,
        key: &str,
        strategy: Option<strategy::Strategy>,
        variables: serde_json::Map<String, Value>,
    ) -> Result<Vec<(String, i64)>, DeployError> {
        let stored = self.blueprint(blueprint_id).await?;
        let resource = stored.parsed.resource(key).ok_or_else(|| {
            DeployError::Invalid(format!(
                "resourceKey: `{key}` is not a resource of the blueprint"
            ))
        })?;
        let variables = blueprint::bind(&stored.parsed, &variables)
            .map_err(|p| DeployError::Invalid(p.to_string()))?;
        let _placing = self.inner.placing.lock().await;
        let Some(strategy) = strategy else {
            let provider_id = self
                .inner
                .providers
                .for_resource_type(&resource.resource_type, resource.provider.as_deref())
                .await?;
            let inputs = self.node_inputs(provider_id, resource).await?;
            return Ok(strategy::raw_capacity(&inputs));
        };
        let placed = self.place(resource, &variables, Some(strategy)).await?;
        let mut plan: BTreeMap<String, i64> = BTreeMap::new();
        for node in placed.nodes {
            *plan.entry(node.unwrap_or_default()).or_default() += 1;
        }
        Ok(plan.into_iter().collect())
    }
}

/// A node's capacity for a type: its own entry, else `*`; `None` when it
/// holds none of that type.
fn capacity_for(node: &ProviderNode, resource_type: &str) -> Option<i64> {
    let of = |key: &str| {
        node.capacity
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| *v)
    };
    of(resource_type).or_else(|| of("*")).filter(|c| *c > 0)
}
