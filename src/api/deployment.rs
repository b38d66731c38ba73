//! The `Deployment` object with its resource nodes and history, and
//! [`deployment_in`], how every field that names a deployment finds it and
//! checks the caller's role in its project.

use std::collections::HashMap;

use async_graphql::{Context, ID, Json, Object, SimpleObject};
use chrono::{DateTime, Utc};

use super::blueprint::{BlueprintResource, resources_of};
use super::deploy_enums::{
    DeploymentEventKind, DeploymentPhase, DeploymentState, NodeState, OnFailure, ResourceHealth,
};
use super::policy::require;
use super::revisions::{DeploymentRevision, revisions_of};
use super::{ApiError, parse_id, state};
use crate::deploy::{self as domain, Deployments};

#[derive(SimpleObject)]
#[graphql(complex)]
pub struct ResourceNode {
    id: ID,
    key: String,
    replica: i32,
    #[graphql(name = "type")]
    resource_type: String,
    provider_id: Option<ID>,
    /// The provider node it is placed on.
    node: Option<String>,
    state: NodeState,
    outputs: Option<Json<serde_json::Value>>,
    error: Option<String>,
    updated_at: DateTime<Utc>,
    /// How it runs now, as its provider last said: an axis of its own (a
    /// COMPLETE node can be DOWN). UNKNOWN while it is not deployed, its
    /// provider is not connected, or has not said yet.
    health: ResourceHealth,
    /// Why it is not HEALTHY, e.g. "exited with status 137 (SIGKILL)".
    health_reason: Option<String>,
    /// When its health last changed.
    health_changed_at: DateTime<Utc>,
    /// How often it was restarted (by its restart policy or by hand).
    restarts: i32,
    /// The config keys whose value its provider sees differ from what was
    /// deployed (where the provider reports what it sees).
    drift: Vec<String>,
    /// Its provider, when the list it is in read them all at once.
    #[graphql(skip)]
    provider_read: Option<Option<super::provider::Provider>>,
}

/// The provider `id` names; `None` if it has been deleted.
async fn find_provider(
    providers: &crate::provider::Providers,
    id: &ID,
) -> Result<Option<super::provider::Provider>, ApiError> {
    match providers.get(parse_id(id, "providerId")?).await {
        Ok(provider) => Ok(Some(super::provider::Provider(provider.into()))),
        Err(crate::provider::ProviderError::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[async_graphql::ComplexObject]
impl ResourceNode {
    /// The provider that runs it (`null` if it has been deleted since).
    async fn provider(
        &self,
        ctx: &Context<'_>,
    ) -> Result<Option<super::provider::Provider>, ApiError> {
        if let Some(read) = &self.provider_read {
            return Ok(read.clone());
        }
        let Some(id) = &self.provider_id else {
            return Ok(None);
        };
        find_provider(state::<crate::provider::Providers>(ctx)?, id).await
    }

    /// Its last `tail` lines of log (at most 10,000), read through its
    /// provider (which needs the `data` feature) when asked.
    async fn logs(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 200)] tail: i32,
    ) -> Result<String, ApiError> {
        let tail = u32::try_from(tail)
            .ok()
            .filter(|t| (1..=domain::MAX_LOG_LINES).contains(t))
            .ok_or_else(|| {
                ApiError::validation(format!(
                    "tail: expected 1 to {}, got {tail}",
                    domain::MAX_LOG_LINES
                ))
            })?;
        Ok(state::<Deployments>(ctx)?
            .power()
            .logs(parse_id(&self.id, "id")?, tail)
            .await?)
    }

    /// What its provider knows of it now (e.g. a container's inspect output,
    /// secrets left out), read when asked.
    async fn details(&self, ctx: &Context<'_>) -> Result<Json<serde_json::Value>, ApiError> {
        Ok(Json(
            state::<Deployments>(ctx)?
                .power()
                .inspect(parse_id(&self.id, "id")?)
                .await?,
        ))
    }
}

impl From<domain::ResourceNode> for ResourceNode {
    fn from(n: domain::ResourceNode) -> Self {
        ResourceNode {
            id: ID(n.id.to_string()),
            key: n.key,
            replica: n.replica,
            resource_type: n.resource_type,
            provider_id: n.provider_id.map(|p| ID(p.to_string())),
            node: n.node,
            state: n.state.into(),
            outputs: n.outputs.map(Json),
            error: n.error,
            updated_at: n.updated_at,
            health: n.health.health.into(),
            health_reason: n.health.reason,
            health_changed_at: n.health.changed_at,
            restarts: n.health.restarts,
            drift: n.health.drift,
            provider_read: None,
        }
    }
}

#[derive(SimpleObject, Clone)]
pub struct DeploymentEvent {
    /// Increases along a deployment's history.
    id: ID,
    deployment_id: ID,
    at: DateTime<Utc>,
    kind: DeploymentEventKind,
    /// `key[replica]` for node events.
    node_key: Option<String>,
    state: Option<String>,
    message: String,
}

impl From<&domain::DeploymentEvent> for DeploymentEvent {
    fn from(e: &domain::DeploymentEvent) -> Self {
        DeploymentEvent {
            id: ID(e.id.to_string()),
            deployment_id: ID(e.deployment_id.to_string()),
            at: e.at,
            kind: e.kind.into(),
            node_key: e.node_key.clone(),
            state: e.state.map(|s| s.as_str().to_owned()),
            message: e.message.clone(),
        }
    }
}

pub struct Deployment(pub(super) domain::Deployment);

impl From<domain::Deployment> for Deployment {
    fn from(d: domain::Deployment) -> Self {
        Deployment(d)
    }
}

#[Object]
impl Deployment {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn name(&self) -> &str {
        &self.0.name
    }
    async fn blueprint_id(&self) -> Option<ID> {
        self.0.blueprint_id.map(|id| ID(id.to_string()))
    }
    /// The project it belongs to: its blueprint's, or `platform` for an
    /// element's installation.
    async fn project_id(&self) -> Option<ID> {
        self.0.project_id.map(|id| ID(id.to_string()))
    }
    /// Set when the deployment is an element's installation.
    async fn element_id(&self) -> Option<ID> {
        self.0.element_id.map(|id| ID(id.to_string()))
    }
    async fn state(&self) -> DeploymentState {
        self.0.state.into()
    }
    /// What the operation under way is doing (deploying, rolling back after
    /// a failure, destroying); null once the deployment is settled.
    async fn phase(&self) -> Option<DeploymentPhase> {
        self.0.phase.map(Into::into)
    }
    async fn on_failure(&self) -> OnFailure {
        self.0.on_failure.into()
    }
    /// Its deployed resources' health rolled up, worst first (DOWN, then
    /// DEGRADED, UNKNOWN, HEALTHY); UNKNOWN when none is deployed.
    async fn health(&self) -> ResourceHealth {
        self.0.health.into()
    }
    /// When its rolled-up health last changed.
    async fn health_changed_at(&self) -> Option<DateTime<Utc>> {
        self.0.health_changed_at
    }
    /// The first error of the last run that failed.
    async fn error(&self) -> Option<&str> {
        self.0.error.as_deref()
    }
    /// The bound variables (defaults applied).
    async fn variables(&self) -> Json<serde_json::Value> {
        Json(self.0.variables.clone())
    }
    async fn expires_at(&self) -> Option<DateTime<Utc>> {
        self.0.expires_at
    }
    /// The resources of the blueprint copy this deployment runs (it keeps
    /// the copy it was made from when its blueprint changes): with their
    /// `dependsOn`, the edges of its DAG.
    async fn resources(&self, ctx: &Context<'_>) -> Result<Vec<BlueprintResource>, ApiError> {
        let parsed = state::<Deployments>(ctx)?
            .queries()
            .parsed(self.0.id)
            .await?;
        Ok(resources_of(&parsed))
    }
    async fn nodes(&self, ctx: &Context<'_>) -> Result<Vec<ResourceNode>, ApiError> {
        let nodes = state::<Deployments>(ctx)?
            .queries()
            .nodes(self.0.id)
            .await?;
        let mut nodes: Vec<ResourceNode> = nodes.into_iter().map(Into::into).collect();
        if ctx.look_ahead().field("provider").exists() {
            // Each provider read once, not once per node (a thousand nodes
            // on one provider used to read its row, and open its sealed
            // config, a thousand times).
            let providers = state::<crate::provider::Providers>(ctx)?;
            let mut read: HashMap<String, Option<super::provider::Provider>> = HashMap::new();
            for node in &mut nodes {
                let Some(id) = &node.provider_id else {
                    continue;
                };
                if !read.contains_key(id.as_str()) {
                    let provider = find_provider(providers, id).await?;
                    read.insert(id.to_string(), provider);
                }
                node.provider_read = Some(read[id.as_str()].clone());
            }
        }
        Ok(nodes)
    }
    /// Every deploy and apply made of it, oldest first: what each asked
    /// for, who, when, and how it ended.
    async fn revisions(&self, ctx: &Context<'_>) -> Result<Vec<DeploymentRevision>, ApiError> {
        revisions_of(ctx, self.0.id).await
    }
    /// The history, oldest first.
    async fn events(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 1000, validator(minimum = 0, maximum = 10000))] first: i32,
    ) -> Result<Vec<DeploymentEvent>, ApiError> {
        let events = state::<Deployments>(ctx)?
            .queries()
            .history(self.0.id, first as u64)
            .await?;
        Ok(events.iter().map(Into::into).collect())
    }
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }
    async fn updated_at(&self) -> DateTime<Utc> {
        self.0.updated_at
    }
}

/// The deployment `id`, as [`blueprint_in`] gives a blueprint.
pub(super) async fn deployment_in(
    ctx: &Context<'_>,
    id: &ID,
    arg: &str,
) -> Result<domain::Deployment, ApiError> {
    let id = parse_id(id, arg)?;
    let deployment = state::<Deployments>(ctx)?.queries().get(id).await?;
    require(
        ctx,
        deployment.project_id,
        &format!("deployment with id {id}"),
    )
    .await?;
    Ok(deployment)
}
