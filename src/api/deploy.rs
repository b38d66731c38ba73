//! The queries and mutations on blueprints and deployments. Deploys, destroys
//! and redeploys answer at once and run in the background: a client follows
//! them with `deploymentEvents` (`deployment_events`). The objects they answer
//! are in `blueprint` and `deployment`.

use std::sync::Arc;

use async_graphql::{Context, ID, InputObject, Json, Object, SimpleObject};
use chrono::{DateTime, Utc};

use super::blueprint::Blueprint;
use super::deploy_enums::{
    DeploymentState, OnFailure, PlacementStrategy, PowerAction, ResourceHealth,
};
use super::deployment::{Deployment, ResourceNode, deployment_in};
use super::pagination::{Count, Page, page_counted_later, paginate, window};
use super::policy::{access, require};
use super::{ApiError, parse_id, state};
use crate::deploy::blueprint::json_kind;
use crate::deploy::{self as domain, Deployments};

#[derive(InputObject)]
pub struct CreateBlueprintInput {
    /// The project it goes in (`default` when left out).
    project_id: Option<ID>,
    name: String,
    description: Option<String>,
    /// The blueprint's YAML.
    source: String,
}

#[derive(InputObject)]
pub struct UpdateBlueprintInput {
    name: Option<String>,
    description: Option<String>,
    source: Option<String>,
}

#[derive(InputObject)]
pub struct DeployBlueprintInput {
    blueprint_id: ID,
    name: String,
    /// Values of the blueprint's variables (a JSON object); defaults fill in.
    #[graphql(default_with = "Json(serde_json::json!({}))")]
    variables: Json<serde_json::Value>,
    /// What a failed deploy does with what it created.
    #[graphql(default_with = "OnFailure::Rollback")]
    on_failure: OnFailure,
    /// The lease: past it, the deployment is destroyed. Must be in the
    /// future (`VALIDATION` otherwise).
    expires_at: Option<DateTime<Utc>>,
}

#[derive(InputObject, Default)]
pub struct DeploymentFilter {
    states: Option<Vec<DeploymentState>>,
    blueprint_id: Option<ID>,
    element_id: Option<ID>,
    /// Part of the name.
    search: Option<String>,
    project_id: Option<ID>,
}

#[derive(SimpleObject)]
pub struct NodeCapacity {
    node: String,
    /// With a strategy: replicas the plan puts there; without: the node's room.
    count: i64,
}

fn variables_object(
    value: serde_json::Value,
) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    match value {
        serde_json::Value::Object(map) => Ok(map),
        serde_json::Value::Null => Ok(serde_json::Map::new()),
        other => Err(ApiError::validation(format!(
            "variables: must be a JSON object, not {}",
            json_kind(&other)
        ))),
    }
}

#[derive(Default)]
pub struct DeployQuery;

#[Object]
impl DeployQuery {
    async fn blueprints(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Page<Blueprint>, ApiError> {
        let visible = access(ctx).await?.visible();
        let all = state::<Deployments>(ctx)?
            .blueprints()
            .list(visible.as_deref())
            .await?;
        paginate(all.into_iter().map(Blueprint).collect(), first, after)
    }

    async fn blueprint(&self, ctx: &Context<'_>, id: ID) -> Result<Blueprint, ApiError> {
        Ok(Blueprint(blueprint_in(ctx, &id, "id").await?))
    }

    /// Deployments, newest first; `health` keeps those whose rolled-up
    /// health is one of its values (`deployments(health: DOWN)`).
    async fn deployments(
        &self,
        ctx: &Context<'_>,
        #[graphql(default)] filter: DeploymentFilter,
        health: Option<Vec<ResourceHealth>>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Page<Deployment>, ApiError> {
        let visible = access(ctx).await?.visible();
        let (offset, limit) = window(first, after)?;
        let filter = domain::DeploymentFilter {
            healths: health
                .unwrap_or_default()
                .into_iter()
                .map(|h| domain::ResourceHealth::from(h).as_str().to_owned())
                .collect(),
            states: filter
                .states
                .unwrap_or_default()
                .into_iter()
                .map(domain::DeploymentState::from)
                .collect(),
            blueprint_id: filter
                .blueprint_id
                .map(|id| parse_id(&id, "filter.blueprintId"))
                .transpose()?,
            element_id: filter
                .element_id
                .map(|id| parse_id(&id, "filter.elementId"))
                .transpose()?,
            search: filter.search,
            project_id: filter
                .project_id
                .map(|id| parse_id(&id, "filter.projectId"))
                .transpose()?,
            visible,
        };
        let deployments = state::<Deployments>(ctx)?.clone();
        // One more than the page: whether there is a next one.
        let found = deployments
            .queries()
            .list(&filter, offset, limit.saturating_add(1))
            .await?;
        let count: Count = Arc::new(move || {
            let (deployments, filter) = (deployments.clone(), filter.clone());
            Box::pin(async move { Ok(deployments.queries().count(&filter).await?) })
        });
        Ok(page_counted_later(
            found.into_iter().map(Deployment).collect(),
            offset,
            limit,
            count,
        ))
    }

    async fn deployment(&self, ctx: &Context<'_>, id: ID) -> Result<Deployment, ApiError> {
        Ok(Deployment(deployment_in(ctx, &id, "id").await?))
    }

    /// One resource of a deployment, by its id (`ResourceNode.id`).
    async fn resource_node(&self, ctx: &Context<'_>, id: ID) -> Result<ResourceNode, ApiError> {
        let id = parse_id(&id, "id")?;
        let queries = state::<Deployments>(ctx)?.queries();
        let node = queries.node(id).await?;
        let project = queries.get(node.deployment_id).await?.project_id;
        require(ctx, project, &format!("resource node {id}")).await?;
        Ok(node.into())
    }

    /// The placement a deploy would make for one resource now, without
    /// allocating; with no strategy, each node's raw capacity.
    async fn calculate_capacity(
        &self,
        ctx: &Context<'_>,
        blueprint_id: ID,
        resource_key: String,
        strategy: Option<PlacementStrategy>,
        #[graphql(default_with = "Json(serde_json::json!({}))")] variables: Json<serde_json::Value>,
    ) -> Result<Vec<NodeCapacity>, ApiError> {
        let blueprint = blueprint_in(ctx, &blueprint_id, "blueprintId").await?;
        let plan = state::<Deployments>(ctx)?
            .planner()
            .calculate_capacity(
                blueprint.id,
                &resource_key,
                strategy.map(Into::into),
                variables_object(variables.0)?,
            )
            .await?;
        Ok(plan
            .into_iter()
            .map(|(node, count)| NodeCapacity { node, count })
            .collect())
    }
}

#[derive(Default)]
pub struct DeployMutation;

#[Object]
impl DeployMutation {
    /// Stores a blueprint after parsing and checking it; every problem is
    /// named (resource key and field).
    async fn create_blueprint(
        &self,
        ctx: &Context<'_>,
        input: CreateBlueprintInput,
    ) -> Result<Blueprint, ApiError> {
        let project = match &input.project_id {
            Some(id) => parse_id(id, "input.projectId")?,
            None => {
                state::<Deployments>(ctx)?
                    .blueprints()
                    .default_project()
                    .await?
            }
        };
        require(ctx, Some(project), &format!("project {project}")).await?;
        Ok(Blueprint(
            state::<Deployments>(ctx)?
                .blueprints()
                .create(project, input.name, input.description, input.source)
                .await?,
        ))
    }

    /// Changes a blueprint; deployments keep the version they were made from.
    async fn update_blueprint(
        &self,
        ctx: &Context<'_>,
        id: ID,
        input: UpdateBlueprintInput,
    ) -> Result<Blueprint, ApiError> {
        let blueprint = blueprint_in(ctx, &id, "id").await?;
        Ok(Blueprint(
            state::<Deployments>(ctx)?
                .blueprints()
                .update(blueprint.id, input.name, input.description, input.source)
                .await?,
        ))
    }

    /// Deletes a blueprint; refused (`CONFLICT`) while deployments that are not
    /// destroyed use it.
    async fn delete_blueprint(&self, ctx: &Context<'_>, id: ID) -> Result<bool, ApiError> {
        let blueprint = blueprint_in(ctx, &id, "id").await?;
        state::<Deployments>(ctx)?
            .blueprints()
            .delete(blueprint.id)
            .await?;
        Ok(true)
    }

    /// Creates a deployment and deploys it in the background; follow it with
    /// `deploymentEvents` or its `state`.
    async fn deploy_blueprint(
        &self,
        ctx: &Context<'_>,
        input: DeployBlueprintInput,
    ) -> Result<Deployment, ApiError> {
        let blueprint = blueprint_in(ctx, &input.blueprint_id, "input.blueprintId").await?;
        let deployment = state::<Deployments>(ctx)?
            .runs()
            .deploy_as(
                domain::NewDeployment {
                    blueprint_id: blueprint.id,
                    name: input.name,
                    variables: variables_object(input.variables.0)?,
                    on_failure: input.on_failure.into(),
                    expires_at: input.expires_at,
                },
                super::principal(ctx).ok().map(|p| p.user.username.clone()),
            )
            .await?;
        Ok(Deployment(deployment))
    }

    /// Destroys every resource, dependents first; `CONFLICT` while the
    /// deployment is busy.
    async fn destroy_deployment(&self, ctx: &Context<'_>, id: ID) -> Result<Deployment, ApiError> {
        let deployment = deployment_in(ctx, &id, "id").await?;
        Ok(Deployment(
            state::<Deployments>(ctx)?
                .runs()
                .destroy(deployment.id)
                .await?,
        ))
    }

    /// Destroys and deploys again the named resources and their dependents.
    async fn redeploy_deployment(
        &self,
        ctx: &Context<'_>,
        id: ID,
        resource_keys: Vec<String>,
    ) -> Result<Deployment, ApiError> {
        let deployment = deployment_in(ctx, &id, "id").await?;
        Ok(Deployment(
            state::<Deployments>(ctx)?
                .runs()
                .redeploy(deployment.id, resource_keys)
                .await?,
        ))
    }

    /// Starts, stops, restarts, pauses or resumes one resource (`key`, and
    /// `replica` for a replicated one) of a `COMPLETE` or `SUSPENDED`
    /// deployment, through its provider (which needs the `power` feature).
    /// A stopped or paused resource is `SUSPENDED`, and so is its deployment
    /// while any of its resources is. Answers the resource in its new state.
    async fn power_resource(
        &self,
        ctx: &Context<'_>,
        deployment_id: ID,
        key: String,
        #[graphql(default = 0)] replica: i32,
        action: PowerAction,
    ) -> Result<ResourceNode, ApiError> {
        let deployment = deployment_in(ctx, &deployment_id, "deploymentId").await?;
        Ok(state::<Deployments>(ctx)?
            .power()
            .power(deployment.id, &key, replica, action.into())
            .await?
            .into())
    }

    /// Restarts one resource (`key`, and `replica` for a replicated one) of
    /// a deployment now, whatever its health: it is destroyed and deployed
    /// again through the journal, with the resources whose config reads its
    /// outputs. Counts in its `restarts`. Answers the deployment, its
    /// restart under way (`CONFLICT` while another run is).
    async fn restart_resource(
        &self,
        ctx: &Context<'_>,
        deployment_id: ID,
        key: String,
        #[graphql(default = 0)] replica: i32,
    ) -> Result<Deployment, ApiError> {
        let deployment = deployment_in(ctx, &deployment_id, "deploymentId").await?;
        let by = super::principal(ctx).ok().map(|p| p.user.username.clone());
        Ok(Deployment(
            state::<Deployments>(ctx)?
                .health()
                .restart(deployment.id, &key, replica, by.as_deref())
                .await?,
        ))
    }

    /// Moves the lease (a time in the future); `null` removes it.
    async fn extend_deployment(
        &self,
        ctx: &Context<'_>,
        id: ID,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<Deployment, ApiError> {
        let deployment = deployment_in(ctx, &id, "id").await?;
        Ok(Deployment(
            state::<Deployments>(ctx)?
                .recovery()
                .extend(deployment.id, expires_at)
                .await?,
        ))
    }
}

/// The blueprint `id` (the argument `arg`), if the caller may do what the
/// current field does in its project; an outsider is told there is none, in
/// the words a missing one gets.
pub(super) async fn blueprint_in(
    ctx: &Context<'_>,
    id: &ID,
    arg: &str,
) -> Result<domain::StoredBlueprint, ApiError> {
    let id = parse_id(id, arg)?;
    let blueprint = state::<Deployments>(ctx)?.blueprints().get(id).await?;
    require(
        ctx,
        blueprint.project_id,
        &format!("blueprint with id {id}"),
    )
    .await?;
    Ok(blueprint)
}
