//! A deployment's revisions in the API (`Deployment.revisions`): what each
//! deploy, apply or rollback asked for, who asked, and how it ended.

use async_graphql::{Context, ID, Json, SimpleObject};
use chrono::{DateTime, Utc};

use super::{ApiError, state};
use crate::deploy::{self as domain, Deployments};

/// One revision of a deployment: what a deploy or an apply asked for.
#[derive(SimpleObject)]
pub struct DeploymentRevision {
    number: i32,
    /// `DEPLOY`, `APPLY` or `ROLLBACK`.
    kind: String,
    source: String,
    variables: Json<serde_json::Value>,
    blueprint_id: Option<ID>,
    plan_id: Option<ID>,
    created_by: Option<String>,
    created_at: DateTime<Utc>,
    /// `IN_PROGRESS`, `COMPLETE` or `FAILED`.
    outcome: String,
    error: Option<String>,
}

impl From<domain::Revision> for DeploymentRevision {
    fn from(r: domain::Revision) -> Self {
        DeploymentRevision {
            number: r.number,
            kind: r.kind,
            source: r.source,
            variables: Json(r.variables),
            blueprint_id: r.blueprint_id.map(|id| ID(id.to_string())),
            plan_id: r.plan_id.map(|id| ID(id.to_string())),
            created_by: r.created_by,
            created_at: r.created_at,
            outcome: r.outcome,
            error: r.error,
        }
    }
}

/// `Deployment.revisions`.
pub(super) async fn revisions_of(
    ctx: &Context<'_>,
    id: uuid::Uuid,
) -> Result<Vec<DeploymentRevision>, ApiError> {
    Ok(state::<Deployments>(ctx)?
        .plans()
        .revisions(id)
        .await?
        .into_iter()
        .map(Into::into)
        .collect())
}
