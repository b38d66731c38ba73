//! Planning: which provider serves each resource, how many replicas it has, and
//! on which provider node each replica goes. Counts of what is deployed and in
//! flight are read and the new nodes written under one lock, so two deploys
//! never both take the last room on a node; the project's limits
//! ([`quotas`](super::quotas)) are checked under the same lock.
//!
//! Never calls a provider's resources (only asks for its nodes) nor starts a
//! run.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;
use uuid::Uuid;

use super::blueprint::{self, Blueprint, Resource};
use super::changes::{Action, Draft};
use super::describe::Described;
use super::quotas::{self, Quantities};
use super::strategy::{self, NodeInput};
use super::{DeployError, DeploymentState, Deployments, LIVE_NODE_STATES, NodeState};
use crate::provider::{ProviderError, ProviderNode};
use crate::store::deployments as rows;

/// One resource's placement: the node of each replica (`None` when the
/// provider does not report nodes).
pub(super) struct Placed {
    pub provider_id: Uuid,
    pub nodes: Vec<Option<String>>,
}

/// Why a deployment could not be planned, and the provider that was away
/// when that is why.
pub(super) struct PlanFailure {
    pub(super) error: String,
    pub(super) away: Option<Uuid>,
}

impl From<String> for PlanFailure {
    fn from(error: String) -> Self {
        PlanFailure { error, away: None }
    }
}

/// The planning part of [`Deployments`].
#[derive(Clone, Copy)]
pub struct Planner<'a>(pub(super) &'a Deployments);

impl Planner<'_> {
    /// Writes the deployment's nodes and moves it to `IN_PROGRESS`.
    pub(super) async fn plan(
        &self,
        id: Uuid,
        bp: &Blueprint,
        variables: &BTreeMap<String, Value>,
        quantities: &Quantities,
    ) -> Result<(), PlanFailure> {
        let _placing = self.0.inner.placing.lock().await;
        let mut placer = Placer::new(self.0);
        let mut nodes = Vec::new();
        let mut wanted = BTreeMap::<String, i64>::new();
        for resource in &bp.resources {
            let placed = match placer.place(resource, variables, None).await {
                Ok(placed) => placed,
                Err(e) => {
                    // Its provider could not be asked where to place it.
                    let away = match &e {
                        DeployError::Provider(ProviderError::Unavailable(_)) => {
                            placer.provider_for(resource).await.ok()
                        }
                        _ => None,
                    };
                    let error = format!("resources.{}: {e}", resource.key);
                    return Err(PlanFailure { error, away });
                }
            };
            let quota = quantities.get(&resource.key);
            for (replica, node) in placed.nodes.into_iter().enumerate() {
                quotas::add_replica(&mut wanted, quota);
                nodes.push(rows::NewNode {
                    key: resource.key.clone(),
                    replica: i32::try_from(replica).unwrap_or(i32::MAX),
                    resource_type: resource.resource_type.clone(),
                    provider_id: Some(placed.provider_id),
                    node,
                    quota: quota.map(|q| serde_json::to_string(q).unwrap_or_default()),
                });
            }
        }
        let count = nodes.len();
        quotas::nodes_within_quota(&self.0.inner.db, id, count, &wanted).await?;
        rows::insert_nodes(
            &self.0.inner.db,
            id,
            nodes,
            NodeState::ToDeploy,
            DeploymentState::InProgress,
        )
        .await
        .map_err(|e| format!("cannot store the plan: {e}"))?;
        self.0
            .runs()
            .record(
                id,
                super::EventKind::State,
                None,
                Some(DeploymentState::InProgress.into()),
                format!("planned {count} resource node(s)"),
            )
            .await;
        Ok(())
    }

    /// Where a plan's new nodes would go now, without holding room: each
    /// create of a new node, and each replacement made before its old node
    /// goes. A replacement with no room beside its old node is made
    /// destroy-first instead, in the old one's place, and says so.
    pub(super) async fn preview(
        &self,
        bp: &Blueprint,
        draft: &mut Draft,
    ) -> Result<(), DeployError> {
        let _placing = self.0.inner.placing.lock().await;
        let mut placer = Placer::new(self.0);
        let mut keys: Vec<String> = Vec::new();
        for change in &draft.changes {
            if !keys.contains(&change.key) {
                keys.push(change.key.clone());
            }
        }
        for key in keys {
            let Some(resource) = bp.resource(&key) else {
                continue;
            };
            let of = |action: Action, draft: &Draft| -> Vec<usize> {
                draft
                    .changes
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.key == key && c.action() == action)
                    .filter(|(_, c)| match action {
                        Action::Create => c.node_id.is_none(),
                        _ => c.create_before_destroy,
                    })
                    .map(|(i, _)| i)
                    .collect()
            };
            let creates = of(Action::Create, draft);
            let replaces = of(Action::Replace, draft);
            if creates.is_empty() && replaces.is_empty() {
                continue;
            }
            let all: Vec<usize> = creates.iter().chain(&replaces).copied().collect();
            let total = all.len() as i64;
            let placed = match placer.place_count(resource, total, None).await {
                Ok(placed) => Some((placed, all)),
                Err(_) if !replaces.is_empty() => {
                    for &i in &replaces {
                        let change = &mut draft.changes[i];
                        change.create_before_destroy = false;
                        change.placement = change.placement_before.clone();
                        let reason = change.reason.take().unwrap_or_default();
                        change.reason = Some(format!(
                            "{reason}; destroyed before it is made again: no room for both on \
                             its provider's nodes"
                        ));
                    }
                    if creates.is_empty() {
                        None
                    } else {
                        let placed = placer
                            .place_count(resource, creates.len() as i64, None)
                            .await
                            .map_err(|e| DeployError::Invalid(format!("resources.{key}: {e}")))?;
                        Some((placed, creates))
                    }
                }
                Err(e) => return Err(DeployError::Invalid(format!("resources.{key}: {e}"))),
            };
            if let Some((placed, indices)) = placed {
                for (i, node) in indices.into_iter().zip(placed.nodes) {
                    draft.changes[i].placement = node;
                }
            }
        }
        Ok(())
    }

    /// Places an apply's new nodes (`(key, replica)`), with its project's
    /// limits checked; the caller holds the placing lock and writes them
    /// under it.
    pub(super) async fn place_new(
        &self,
        id: Uuid,
        described: &Described,
        wanted: &[(String, i32)],
    ) -> Result<Vec<(String, i32, Uuid, Option<String>)>, String> {
        let mut placer = Placer::new(self.0);
        let mut by_key: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for (key, replica) in wanted {
            by_key.entry(key.as_str()).or_default().push(*replica);
        }
        let mut out = Vec::new();
        let mut quantities = BTreeMap::<String, i64>::new();
        for (key, replicas) in by_key {
            let resource = described
                .blueprint
                .resource(key)
                .ok_or_else(|| format!("`{key}` is not in the plan's blueprint"))?;
            let placed = placer
                .place_count(resource, replicas.len() as i64, None)
                .await
                .map_err(|e| format!("resources.{key}: {e}"))?;
            for (replica, node) in replicas.into_iter().zip(placed.nodes) {
                quotas::add_replica(&mut quantities, described.quantities.get(key));
                out.push((key.to_owned(), replica, placed.provider_id, node));
            }
        }
        quotas::nodes_within_quota(&self.0.inner.db, id, out.len(), &quantities).await?;
        Ok(out)
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
        let stored = self.0.blueprints().get(blueprint_id).await?;
        let resource = stored.parsed.resource(key).ok_or_else(|| {
            DeployError::Invalid(format!(
                "resourceKey: `{key}` is not a resource of the blueprint"
            ))
        })?;
        let variables = blueprint::bind(&stored.parsed, &variables)
            .map_err(|p| DeployError::Invalid(p.to_string()))?;
        let _placing = self.0.inner.placing.lock().await;
        let mut placer = Placer::new(self.0);
        let Some(strategy) = strategy else {
            let provider_id = placer.provider_for(resource).await?;
            let inputs = placer.inputs(provider_id, resource).await?;
            return Ok(strategy::raw_capacity(&inputs));
        };
        let placed = placer.place(resource, &variables, Some(strategy)).await?;
        let mut plan: BTreeMap<String, i64> = BTreeMap::new();
        for node in placed.nodes {
            *plan.entry(node.unwrap_or_default()).or_default() += 1;
        }
        Ok(plan.into_iter().collect())
    }
}

/// Places the resources of one plan. It asks each provider for its nodes and
/// reads its counts once, then keeps the counts up to date as it places, so
/// two resources of one blueprint never both take the last room on a node.
struct Placer<'a> {
    deployments: &'a Deployments,
    by_type: HashMap<(String, Option<String>), Uuid>,
    /// Provider name and whether it reports nodes.
    about: HashMap<Uuid, (String, bool)>,
    nodes: HashMap<Uuid, Vec<ProviderNode>>,
    counts: HashMap<Uuid, HashMap<String, i64>>,
}

impl<'a> Placer<'a> {
    fn new(deployments: &'a Deployments) -> Self {
        Placer {
            deployments,
            by_type: HashMap::new(),
            about: HashMap::new(),
            nodes: HashMap::new(),
            counts: HashMap::new(),
        }
    }

    async fn provider_for(&mut self, resource: &Resource) -> Result<Uuid, DeployError> {
        let key = (resource.resource_type.clone(), resource.provider.clone());
        if let Some(id) = self.by_type.get(&key) {
            return Ok(*id);
        }
        let id = self
            .deployments
            .inner
            .providers
            .for_resource_type(&resource.resource_type, resource.provider.as_deref())
            .await?;
        self.by_type.insert(key, id);
        Ok(id)
    }

    async fn about(&mut self, provider_id: Uuid) -> Result<(String, bool), DeployError> {
        if let Some(about) = self.about.get(&provider_id) {
            return Ok(about.clone());
        }
        let provider = self.deployments.inner.providers.get(provider_id).await?;
        let about = (
            provider.name,
            provider.features.iter().any(|f| f == "nodes"),
        );
        self.about.insert(provider_id, about.clone());
        Ok(about)
    }

    /// Places one resource's replicas; `strategy` overrides the blueprint's.
    async fn place(
        &mut self,
        resource: &Resource,
        variables: &BTreeMap<String, Value>,
        strategy: Option<strategy::Strategy>,
    ) -> Result<Placed, DeployError> {
        let need = blueprint::replicas(resource, variables)
            .map_err(|p| DeployError::Invalid(p.to_string()))?;
        self.place_count(resource, need, strategy).await
    }

    /// Places `need` replicas of one resource.
    async fn place_count(
        &mut self,
        resource: &Resource,
        need: i64,
        strategy: Option<strategy::Strategy>,
    ) -> Result<Placed, DeployError> {
        let provider_id = self.provider_for(resource).await?;
        let (name, has_nodes) = self.about(provider_id).await?;
        if !has_nodes {
            let count = usize::try_from(need).unwrap_or(0);
            return Ok(Placed {
                provider_id,
                nodes: vec![None; count],
            });
        }
        let inputs = self.inputs(provider_id, resource).await?;
        let strategy = strategy.unwrap_or(resource.strategy);
        let plan = strategy::plan(strategy, &inputs, need)
            .map_err(|e| DeployError::Invalid(format!("placement on `{name}`: {e}")))?;
        let counts = self.counts.entry(provider_id).or_default();
        let mut nodes = Vec::new();
        for (node, count) in plan.placements {
            *counts.entry(node.clone()).or_default() += count;
            for _ in 0..count {
                nodes.push(Some(node.clone()));
            }
        }
        Ok(Placed { provider_id, nodes })
    }

    /// Each of the provider's nodes with room for the resource's type: its
    /// remaining capacity and what it holds now (deployed and in flight).
    async fn inputs(
        &mut self,
        provider_id: Uuid,
        resource: &Resource,
    ) -> Result<Vec<NodeInput>, DeployError> {
        if !self.nodes.contains_key(&provider_id) {
            let providers = &self.deployments.inner.providers;
            let nodes = self
                .deployments
                .steps()
                .ask_provider(provider_id, || providers.nodes(provider_id))
                .await?;
            let counts =
                rows::placement_counts(&self.deployments.inner.db, provider_id, &LIVE_NODE_STATES)
                    .await?;
            self.nodes.insert(provider_id, nodes);
            self.counts.insert(provider_id, counts);
        }
        let counts = self.counts.get(&provider_id);
        Ok(self
            .nodes
            .get(&provider_id)
            .into_iter()
            .flatten()
            .filter_map(|node| {
                let capacity = capacity_for(node, &resource.resource_type)?;
                let count = counts.and_then(|c| c.get(&node.name)).copied().unwrap_or(0);
                Some(NodeInput::new(
                    node.name.clone(),
                    (capacity - count).max(0),
                    count,
                ))
            })
            .collect())
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
