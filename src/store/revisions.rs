//! A deployment's revisions (`deployment_revisions`), for the `deploy` area:
//! opening one (numbered one past the deployment's last, inside the caller's
//! transaction: a new deployment's first, an apply's), ending the open ones,
//! and reading them back.

use chrono::Utc;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait,
    QueryFilter, QueryOrder, QuerySelect, Set,
};
use uuid::Uuid;

use super::entities::deployment_revision;

pub use deployment_revision::Model as RevisionRow;

/// A revision to open: numbered one past the deployment's last.
pub struct NewRevision {
    pub kind: String,
    pub source: String,
    pub variables: String,
    pub blueprint_id: Option<Uuid>,
    pub plan_id: Option<Uuid>,
    pub operation_id: Option<Uuid>,
    pub created_by: Option<String>,
    pub outcome: String,
}

/// Opens a revision of `deployment_id`; returns its number.
pub async fn insert_revision(
    db: &impl ConnectionTrait,
    deployment_id: Uuid,
    new: NewRevision,
) -> Result<i32, DbErr> {
    let last: Option<Option<i32>> = deployment_revision::Entity::find()
        .select_only()
        .column_as(deployment_revision::Column::Number.max(), "max")
        .filter(deployment_revision::Column::DeploymentId.eq(deployment_id))
        .into_tuple()
        .one(db)
        .await?;
    let number = last.flatten().unwrap_or(0) + 1;
    deployment_revision::ActiveModel {
        id: Set(Uuid::now_v7()),
        deployment_id: Set(deployment_id),
        number: Set(number),
        kind: Set(new.kind),
        source: Set(new.source),
        variables: Set(new.variables),
        blueprint_id: Set(new.blueprint_id),
        plan_id: Set(new.plan_id),
        operation_id: Set(new.operation_id),
        created_by: Set(new.created_by),
        created_at: Set(Utc::now()),
        outcome: Set(new.outcome),
        error: Set(None),
    }
    .insert(db)
    .await?;
    Ok(number)
}

pub async fn revisions_of(
    db: &DatabaseConnection,
    deployment_id: Uuid,
) -> Result<Vec<RevisionRow>, DbErr> {
    deployment_revision::Entity::find()
        .filter(deployment_revision::Column::DeploymentId.eq(deployment_id))
        .order_by_asc(deployment_revision::Column::Number)
        .all(db)
        .await
}

pub async fn find_revision(
    db: &DatabaseConnection,
    deployment_id: Uuid,
    number: i32,
) -> Result<Option<RevisionRow>, DbErr> {
    deployment_revision::Entity::find()
        .filter(deployment_revision::Column::DeploymentId.eq(deployment_id))
        .filter(deployment_revision::Column::Number.eq(number))
        .one(db)
        .await
}

/// Ends the deployment's open revisions (`from` outcome) with `outcome`.
pub async fn end_revisions(
    db: &DatabaseConnection,
    deployment_id: Uuid,
    from: &str,
    outcome: &str,
    error: Option<&str>,
) -> Result<(), DbErr> {
    deployment_revision::Entity::update_many()
        .col_expr(deployment_revision::Column::Outcome, Expr::value(outcome))
        .col_expr(
            deployment_revision::Column::Error,
            Expr::value(error.map(str::to_owned)),
        )
        .filter(deployment_revision::Column::DeploymentId.eq(deployment_id))
        .filter(deployment_revision::Column::Outcome.eq(from))
        .exec(db)
        .await
        .map(drop)
}
