//! Plans, applies and rollback in the API: `planDeployment`
//! computes and stores a plan (nothing runs), `plan(id)` reads one,
//! `applyPlan` runs it in the background (`CONFLICT` when the deployment
//! moved since, naming what moved), `rollbackDeployment` plans and applies
//! back to a revision (`Deployment.revisions` lists them, see `revisions`).

use async_graphql::{Context, ID, InputObject, Json, Object, SimpleObject};
use chrono::{DateTime, Utc};

use super::deploy::blueprint_in;
use super::deployment::{Deployment, deployment_in};
use super::policy::{access, require};
use super::{ApiError, parse_id, state};
use crate::auth::ProjectRole;
use crate::deploy::changes::{self, Action};
use crate::deploy::{self as domain, Deployments};

#[derive(async_graphql::Enum, Clone, Copy, PartialEq, Eq)]
pub enum PlanAction {
    Create,
    Update,
    Replace,
    Destroy,
    Keep,
}

impl From<Action> for PlanAction {
    fn from(a: Action) -> Self {
        match a {
            Action::Create => PlanAction::Create,
            Action::Update => PlanAction::Update,
            Action::Replace => PlanAction::Replace,
            Action::Destroy => PlanAction::Destroy,
            Action::Keep => PlanAction::Keep,
        }
    }
}

/// One top-level config key a change sets, with credentials masked.
#[derive(SimpleObject)]
pub struct ConfigDiff {
    key: String,
    /// Null when it was not set.
    before: Option<Json<serde_json::Value>>,
    /// Null when it is no longer set, or not known before the apply.
    after: Option<Json<serde_json::Value>>,
    /// False when the new value reads outputs that this plan changes.
    known: bool,
    /// The key looks like a credential: its values are never shown.
    secret: bool,
}

/// What a plan does to one replica of one resource.
#[derive(SimpleObject)]
pub struct PlannedChange {
    key: String,
    replica: i32,
    action: PlanAction,
    #[graphql(name = "type")]
    resource_type: String,
    /// The node it acts on; null for a new one.
    node_id: Option<ID>,
    /// Why: for `REPLACE`, which keys changed and that the provider cannot
    /// update them in place.
    reason: Option<String>,
    config: Vec<ConfigDiff>,
    /// Resources whose changing outputs reach this one through templates.
    ripples_from: Vec<String>,
    /// For `REPLACE`: the new one is made before the old one goes (no
    /// moment without one running); false when there is no room for both.
    create_before_destroy: bool,
    /// The provider node it runs on now.
    placement_before: Option<String>,
    /// The provider node a new one goes on, as placement sees it now.
    placement: Option<String>,
}

impl From<changes::Change> for PlannedChange {
    fn from(c: changes::Change) -> Self {
        PlannedChange {
            action: c.action().into(),
            key: c.key,
            replica: c.replica,
            resource_type: c.resource_type,
            node_id: c.node_id.map(|id| ID(id.to_string())),
            reason: c.reason,
            config: c
                .config
                .into_iter()
                .map(|d| ConfigDiff {
                    key: d.key,
                    before: d.before.map(Json),
                    after: d.after.map(Json),
                    known: d.known,
                    secret: d.secret,
                })
                .collect(),
            ripples_from: c.ripples_from,
            create_before_destroy: c.create_before_destroy,
            placement_before: c.placement_before,
            placement: c.placement,
        }
    }
}

/// How many of a plan's changes are of each kind.
#[derive(SimpleObject)]
pub struct PlanSummary {
    create: i32,
    update: i32,
    replace: i32,
    destroy: i32,
    keep: i32,
}

pub struct Plan(domain::StoredPlan);

#[Object]
impl Plan {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn deployment_id(&self) -> ID {
        ID(self.0.deployment_id.to_string())
    }
    /// `PENDING` until applied, then `APPLIED`.
    async fn state(&self) -> &str {
        self.0.state.as_str()
    }
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }
    async fn created_by(&self) -> Option<&str> {
        self.0.created_by.as_deref()
    }
    async fn applied_at(&self) -> Option<DateTime<Utc>> {
        self.0.applied_at
    }
    async fn blueprint_id(&self) -> Option<ID> {
        self.0.blueprint_id.map(|id| ID(id.to_string()))
    }
    /// The blueprint (YAML) the plan moves the deployment to.
    async fn source(&self) -> &str {
        &self.0.source
    }
    /// The variables it moves the deployment to, bound (defaults applied).
    async fn variables(&self) -> Json<serde_json::Value> {
        Json(self.0.variables.clone())
    }
    /// Per resource and replica, dependencies first, then what goes.
    async fn changes(&self) -> Vec<PlannedChange> {
        self.0
            .draft
            .changes
            .iter()
            .cloned()
            .map(Into::into)
            .collect()
    }
    /// What the plan leaves as it is that one may expect it to change (the
    /// placement of running replicas when the strategy changes).
    async fn notes(&self) -> &[String] {
        &self.0.draft.notes
    }
    async fn summary(&self) -> PlanSummary {
        let count = |a: Action| {
            self.0
                .draft
                .changes
                .iter()
                .filter(|c| c.action() == a)
                .count() as i32
        };
        PlanSummary {
            create: count(Action::Create),
            update: count(Action::Update),
            replace: count(Action::Replace),
            destroy: count(Action::Destroy),
            keep: count(Action::Keep),
        }
    }
}

#[derive(InputObject)]
pub struct PlanDeploymentInput {
    deployment_id: ID,
    /// A stored blueprint of the deployment's project to move to.
    blueprint_id: Option<ID>,
    /// Or a blueprint's YAML. With neither, the deployment's blueprint as it
    /// is stored now.
    blueprint_source: Option<String>,
    /// The variables; without them, the deployment's own (those the new
    /// blueprint still declares).
    variables: Option<Json<serde_json::Value>>,
}

/// What `rollbackDeployment` answers: the plan it made and applies.
#[derive(SimpleObject)]
pub struct Rollback {
    plan: Plan,
    deployment: Deployment,
}

#[derive(Default)]
pub struct PlanQuery;

#[Object]
impl PlanQuery {
    /// A stored plan.
    async fn plan(&self, ctx: &Context<'_>, id: ID) -> Result<Plan, ApiError> {
        let plan = plan_in(ctx, &id).await?;
        Ok(Plan(plan))
    }
}

#[derive(Default)]
pub struct PlanMutation;

#[Object]
impl PlanMutation {
    /// Compares what runs with what is asked and stores the plan: per
    /// resource and replica, `CREATE`, `UPDATE` (in place), `REPLACE` (with
    /// why), `DESTROY` or `KEEP`. Nothing runs.
    async fn plan_deployment(
        &self,
        ctx: &Context<'_>,
        input: PlanDeploymentInput,
    ) -> Result<Plan, ApiError> {
        let deployment = deployment_in(ctx, &input.deployment_id, "input.deploymentId").await?;
        if input.blueprint_source.is_some() {
            // YAML of the caller's own changes what the deployment runs, as
            // editing its blueprint would: a developer's call.
            access(ctx).await?.require(
                deployment.project_id,
                ProjectRole::Developer,
                &format!("deployment with id {}", deployment.id),
            )?;
        }
        // A blueprint of a project the caller is not in does not exist for
        // them.
        let blueprint_id = match &input.blueprint_id {
            Some(id) => Some(blueprint_in(ctx, id, "input.blueprintId").await?.id),
            None => None,
        };
        let variables = match input.variables {
            None => None,
            Some(Json(serde_json::Value::Object(map))) => Some(map),
            Some(Json(serde_json::Value::Null)) => None,
            Some(_) => {
                return Err(ApiError::validation(
                    "input.variables: must be an object of variable names to values",
                ));
            }
        };
        let plan = state::<Deployments>(ctx)?
            .plans()
            .plan(
                deployment.id,
                domain::Ask {
                    blueprint_id,
                    source: input.blueprint_source,
                    variables,
                },
                who(ctx),
            )
            .await?;
        Ok(Plan(plan))
    }

    /// Applies a plan in the background; `CONFLICT` when the deployment
    /// moved since it was made (saying what moved), or when it was applied.
    /// Follow it with `deploymentEvents`; it makes a revision.
    async fn apply_plan(&self, ctx: &Context<'_>, id: ID) -> Result<Deployment, ApiError> {
        let plan = plan_in(ctx, &id).await?;
        let deployment = state::<Deployments>(ctx)?
            .plans()
            .apply(plan.id, who(ctx))
            .await?;
        Ok(Deployment::from(deployment))
    }

    /// Plans back to an earlier revision's blueprint and variables, and
    /// applies that plan.
    async fn rollback_deployment(
        &self,
        ctx: &Context<'_>,
        id: ID,
        revision: i32,
    ) -> Result<Rollback, ApiError> {
        let deployment = deployment_in(ctx, &id, "id").await?;
        let (plan, deployment) = state::<Deployments>(ctx)?
            .plans()
            .rollback(deployment.id, revision, who(ctx))
            .await?;
        Ok(Rollback {
            plan: Plan(plan),
            deployment: Deployment::from(deployment),
        })
    }
}

/// The caller's user name, for plans and revisions.
fn who(ctx: &Context<'_>) -> Option<String> {
    super::principal(ctx).ok().map(|p| p.user.username.clone())
}

/// A plan, if the caller may act in its deployment's project.
async fn plan_in(ctx: &Context<'_>, id: &ID) -> Result<domain::StoredPlan, ApiError> {
    let id = parse_id(id, "id")?;
    let deployments = state::<Deployments>(ctx)?;
    let plan = deployments.plans().get(id).await?;
    let deployment = deployments.queries().get(plan.deployment_id).await?;
    require(ctx, deployment.project_id, &format!("plan with id {id}")).await?;
    Ok(plan)
}
