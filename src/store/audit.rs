//! Queries on the audit log, for the `audit` area.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait, Func};
use sea_orm::{
    ColumnTrait, Condition, DatabaseConnection, DbErr, EntityTrait, PaginatorTrait, QueryFilter,
    QueryOrder, QuerySelect,
};
use uuid::Uuid;

use super::entities::audit_entry;

pub use audit_entry::Model as AuditRow;

/// Which entries a query wants; every part given must hold.
#[derive(Clone, Debug, Default)]
pub struct AuditQuery {
    pub user_id: Option<Uuid>,
    /// The user's name as recorded (case-insensitive).
    pub username: Option<String>,
    pub project_ids: Option<Vec<Uuid>>,
    pub actions: Option<Vec<String>>,
    /// `OK`, or an error code; `failed` is every outcome but `OK`.
    pub outcome: Option<OutcomeFilter>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug)]
pub enum OutcomeFilter {
    Ok,
    Failed,
    Code(String),
}

fn condition(query: &AuditQuery) -> Condition {
    use audit_entry::Column;
    let mut all = Condition::all();
    if let Some(id) = query.user_id {
        all = all.add(Column::UserId.eq(id));
    }
    if let Some(name) = &query.username {
        all = all.add(Expr::expr(Func::lower(Expr::col(Column::Username))).eq(name.to_lowercase()));
    }
    if let Some(ids) = &query.project_ids {
        all = all.add(Column::ProjectId.is_in(ids.clone()));
    }
    if let Some(actions) = &query.actions {
        all = all.add(Column::Action.is_in(actions.clone()));
    }
    match &query.outcome {
        None => {}
        Some(OutcomeFilter::Ok) => all = all.add(Column::Outcome.eq("OK")),
        Some(OutcomeFilter::Failed) => all = all.add(Column::Outcome.ne("OK")),
        Some(OutcomeFilter::Code(code)) => all = all.add(Column::Outcome.eq(code.clone())),
    }
    if let Some(at) = query.since {
        all = all.add(Column::At.gte(at));
    }
    if let Some(at) = query.until {
        all = all.add(Column::At.lt(at));
    }
    all
}

pub async fn insert(db: &DatabaseConnection, row: AuditRow) -> Result<(), DbErr> {
    audit_entry::Entity::insert(audit_entry::ActiveModel::from(row))
        .exec_without_returning(db)
        .await?;
    Ok(())
}

/// Up to `limit` entries matching `query`, newest first, older than the
/// entry `before` when given (the keyset of the log's pages).
pub async fn list(
    db: &DatabaseConnection,
    query: &AuditQuery,
    before: Option<Uuid>,
    limit: u64,
) -> Result<Vec<AuditRow>, DbErr> {
    let mut select = audit_entry::Entity::find().filter(condition(query));
    if let Some(id) = before {
        select = select.filter(audit_entry::Column::Id.lt(id));
    }
    select
        .order_by_desc(audit_entry::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

pub async fn count(db: &DatabaseConnection, query: &AuditQuery) -> Result<u64, DbErr> {
    audit_entry::Entity::find()
        .filter(condition(query))
        .count(db)
        .await
}

/// Deletes the entries made before `before`; how many.
pub async fn prune(db: &DatabaseConnection, before: DateTime<Utc>) -> Result<u64, DbErr> {
    Ok(audit_entry::Entity::delete_many()
        .filter(audit_entry::Column::At.lt(before))
        .exec(db)
        .await?
        .rows_affected)
}
