//! Blueprints and deployments in the API. Deploys, destroys and redeploys
//! answer at once and run in the background; `deploymentEvents` replays a
//! deployment's history and then follows it live.

use std::collections::HashMap;

use async_graphql::{Context, Enum, ID, InputObject, Json, Object, SimpleObject, Subscription};
use chrono::{DateTime, Utc};
use futures_util::{Stream, StreamExt};

use super::pagination::{Page, page_of, paginate, window};
use super::policy::{access, require};
use super::{ApiError, parse_id, state};
use crate::deploy::blueprint::{self, Replicas};
use crate::deploy::strategy::Strategy;
use crate::deploy::{self as domain, Deployments};
use crate::events::Delivery;

/// How much history `deploymentEvents` replays before following live.
const REPLAY_LIMIT: u64 = 10_000;

macro_rules! mirror_enum {
    ($name:ident, $domain:path { $($variant:ident),+ $(,)? }) => {
        #[derive(Enum, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($variant),+ }

        impl From<$domain> for $name {
            fn from(s: $domain) -> Self {
                use $domain as D;
                match s { $(D::$variant => $name::$variant),+ }
            }
        }

        impl From<$name> for $domain {
            fn from(s: $name) -> Self {
                use $domain as D;
                match s { $($name::$variant => D::$variant),+ }
            }
        }
    };
}

mirror_enum!(
    DeploymentState,
    domain::DeploymentState {
        Pending,
        InProgress,
        Complete,
        Failed,
        Destroying,
        Destroyed,
        Suspended
    }
);
mirror_enum!(
    DeploymentPhase,
    domain::Phase {
        Deploy,
        Rollback,
        Destroy,
        Apply
    }
);
mirror_enum!(
    NodeState,
    domain::NodeState {
        ToDeploy,
        Waiting,
        InProgress,
        Complete,
        Suspended,
        Failed,
        Tainted,
        ToDestroy,
        Destroying,
        Destroyed,
        ToUpdate,
        Updating,
        ToRetire,
        Retiring,
        Retired
    }
);
mirror_enum!(OnFailure, domain::OnFailure { Rollback, Keep });
mirror_enum!(
    PowerAction,
    crate::provider::PowerAction {
        Start,
        Stop,
        Restart,
        Pause,
        Resume
    }
);
mirror_enum!(
    PlacementStrategy,
    Strategy {
        Auto,
        Fill,
        Each,
        Global,
        Drained
    }
);
mirror_enum!(
    DeploymentEventKind,
    domain::EventKind {
        State,
        Node,
        Progress,
        Log
    }
);

#[derive(SimpleObject)]
pub struct BlueprintResource {
    key: String,
    #[graphql(name = "type")]
    resource_type: String,
    /// The provider named in the blueprint, if any (else found by type).
    provider: Option<String>,
    depends_on: Vec<String>,
    /// A number, or the template that gives it at deploy time.
    replicas: String,
    strategy: PlacementStrategy,
    config: Json<serde_json::Value>,
}

#[derive(SimpleObject)]
pub struct BlueprintVariable {
    name: String,
    #[graphql(name = "type")]
    var_type: String,
    default: Option<Json<serde_json::Value>>,
    description: Option<String>,
}

pub struct Blueprint(domain::StoredBlueprint);

#[Object]
impl Blueprint {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn name(&self) -> &str {
        &self.0.name
    }
    /// The project it belongs to.
    async fn project_id(&self) -> Option<ID> {
        self.0.project_id.map(|id| ID(id.to_string()))
    }
    async fn description(&self) -> Option<&str> {
        self.0.description.as_deref()
    }
    /// The YAML as authored.
    async fn source(&self) -> &str {
        &self.0.source
    }
    async fn resources(&self) -> Vec<BlueprintResource> {
        resources_of(&self.0.parsed)
    }
    async fn variables(&self) -> Vec<BlueprintVariable> {
        self.0
            .parsed
            .variables
            .iter()
            .map(|v| BlueprintVariable {
                name: v.name.clone(),
                var_type: v.ty.as_str().to_owned(),
                default: v.default.clone().map(Json),
                description: v.description.clone(),
            })
            .collect()
    }
    /// Resource types no provider serves now: deploying would fail on them.
    async fn warnings(&self, ctx: &Context<'_>) -> Result<Vec<String>, ApiError> {
        Ok(state::<Deployments>(ctx)?
            .blueprints()
            .warnings(&self.0.parsed)
            .await)
    }
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }
    async fn updated_at(&self) -> DateTime<Utc> {
        self.0.updated_at
    }
}

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
            state: e.state.clone(),
            message: e.message.clone(),
        }
    }
}

pub struct Deployment(domain::Deployment);

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
    async fn revisions(
        &self,
        ctx: &Context<'_>,
    ) -> Result<Vec<super::plans::DeploymentRevision>, ApiError> {
        super::plans::revisions_of(ctx, self.0.id).await
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
            blueprint::json_kind(&other)
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

    async fn deployments(
        &self,
        ctx: &Context<'_>,
        #[graphql(default)] filter: DeploymentFilter,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Page<Deployment>, ApiError> {
        let visible = access(ctx).await?.visible();
        let (offset, limit) = window(first, after)?;
        let filter = domain::DeploymentFilter {
            states: filter
                .states
                .unwrap_or_default()
                .into_iter()
                .map(|s| domain::DeploymentState::from(s).as_str().to_owned())
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
        let (found, total) = state::<Deployments>(ctx)?
            .queries()
            .list(&filter, offset, limit)
            .await?;
        Ok(page_of(
            found.into_iter().map(Deployment).collect(),
            offset,
            total,
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

#[derive(Default)]
pub struct DeploySubscription;

#[Subscription]
impl DeploySubscription {
    /// A deployment's history, then every new event as it happens. With
    /// `after` (an event's `id`), only the history past that event: how a
    /// client that lost its socket (a replica failing over) resumes with
    /// nothing missed and nothing twice.
    async fn deployment_events(
        &self,
        ctx: &Context<'_>,
        id: ID,
        after: Option<ID>,
    ) -> Result<impl Stream<Item = DeploymentEvent> + use<>, ApiError> {
        let after = match &after {
            None => 0,
            Some(given) => given
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .ok_or_else(|| {
                    ApiError::validation(format!(
                        "after: `{}` is not a deployment event's id",
                        given.as_str()
                    ))
                })?,
        };
        let followed = deployment_in(ctx, &id, "id").await?;
        let wanted = followed.id;
        let revoked = access_revoked(ctx, followed.project_id)?;
        // Subscribe first, then read the history: an event stored in between
        // is in both, and the id filter drops the second copy.
        let deployments = state::<Deployments>(ctx)?;
        let live = deployments.events().subscribe();
        deployments.queries().get(wanted).await?;
        let history = deployments
            .queries()
            .history_after(wanted, after, REPLAY_LIMIT)
            .await?;
        let last = history.last().map_or(after, |e| e.id);
        let replay: Vec<DeploymentEvent> = history.iter().map(Into::into).collect();
        let deployments = deployments.clone();
        // Events of one deployment are published in id order (the engine
        // stores and publishes each under the deployment's lock), so the
        // stream delivers ids in order: live ones past the history, and after
        // a lag the missed ones read back from the history.
        let live = futures_util::stream::unfold(
            (Box::pin(live), last, std::collections::VecDeque::new()),
            move |(mut live, mut last, mut missed)| {
                let deployments = deployments.clone();
                async move {
                    loop {
                        if let Some(event) = missed.pop_front() {
                            return Some((event, (live, last, missed)));
                        }
                        match live.next().await? {
                            Delivery::Event(e) => {
                                if e.deployment_id == wanted && e.id > last {
                                    last = e.id;
                                    let event = DeploymentEvent::from(e.as_ref());
                                    return Some((event, (live, last, missed)));
                                }
                            }
                            Delivery::Lagged(_) => {
                                match deployments
                                    .queries()
                                    .history_after(wanted, last, REPLAY_LIMIT)
                                    .await
                                {
                                    Ok(found) => {
                                        if let Some(e) = found.last() {
                                            last = e.id;
                                        }
                                        missed.extend(found.iter().map(DeploymentEvent::from));
                                    }
                                    Err(e) => {
                                        tracing::warn!(deployment.id = %wanted, error = %e, "cannot read missed events");
                                    }
                                }
                            }
                        }
                    }
                }
            },
        );
        Ok(futures_util::stream::iter(replay)
            .chain(live)
            .take_until(revoked))
    }
}

/// Resolves when the caller may no longer read `project` (their membership
/// or role changed, they were disabled or deleted), or when the server
/// stops: a subscription that takes it ends then.
fn access_revoked(
    ctx: &Context<'_>,
    project: Option<uuid::Uuid>,
) -> Result<impl std::future::Future<Output = ()> + use<>, ApiError> {
    let auth = state::<crate::auth::Auth>(ctx)?.clone();
    let who = super::principal(ctx)?.user.id;
    let mut changes = Box::pin(auth.events().subscribe());
    Ok(async move {
        loop {
            match changes.next().await {
                None => return,
                Some(Delivery::Event(e)) => match e.as_ref() {
                    crate::auth::AuthEvent::AccessChanged { user_id }
                        if user_id.is_none_or(|u| u == who) => {}
                    _ => continue,
                },
                // Missed events may have been changes: look again.
                Some(Delivery::Lagged(_)) => {}
            }
            let still = match auth.access_of(who).await {
                Ok(Some(access)) => access
                    .require(project, crate::auth::ProjectRole::Viewer, "it")
                    .is_ok(),
                Ok(None) => false,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read a subscriber's access; ending it");
                    false
                }
            };
            if !still {
                return;
            }
        }
    })
}

/// A blueprint's resources as the API shows them.
fn resources_of(parsed: &crate::deploy::blueprint::Blueprint) -> Vec<BlueprintResource> {
    parsed
        .resources
        .iter()
        .map(|r| BlueprintResource {
            key: r.key.clone(),
            resource_type: r.resource_type.clone(),
            provider: r.provider.clone(),
            depends_on: r.depends_on.clone(),
            replicas: match &r.replicas {
                Replicas::Fixed(n) => n.to_string(),
                Replicas::Template(t) => t.clone(),
            },
            strategy: r.strategy.into(),
            config: Json(r.config.clone()),
        })
        .collect()
}

/// The blueprint `id` (the argument `arg`), if the caller may do what the
/// current field does in its project; an outsider is told there is none, in
/// the words a missing one gets.
async fn blueprint_in(
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
