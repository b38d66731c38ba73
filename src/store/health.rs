//! Live health (`resource_health`, `deployments.health`): what was last
//! learned of each deployed resource, its restart book, and each
//! deployment's roll-up. Only the health part of the engine writes here.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder};
use uuid::Uuid;

use crate::store::entities::{deployment, deployment_node, resource_health};
use crate::store::states::NodeState;

pub use resource_health::Model as HealthRow;

/// One observation of a node's health.
pub struct Observed<'a> {
    pub node_id: Uuid,
    pub deployment_id: Uuid,
    pub health: &'a str,
    pub reason: Option<&'a str>,
    pub at: DateTime<Utc>,
    /// The node's `updated_at` as the observer read it.
    pub node_updated_at: DateTime<Utc>,
    /// When the observer compared configs: the drifted keys with the values
    /// seen, a JSON object as text, or none when nothing drifted.
    pub drift: Option<Option<String>>,
}

/// The row to store for an observation when it says something new
/// (another health or reason, a node written since, other drift) than
/// `old`, the node's row as the caller read it; `None` when it says nothing
/// new, or when it is older than what `old` says of the same deployed node
/// (a look that read the provider before a watch reported a change, applied
/// after it). An UNKNOWN row is the server's own word (its provider away):
/// what the provider says when it is back replaces it, however old. The
/// restart book stays as it is (a new row's is empty).
pub fn observed_row(o: Observed<'_>, old: Option<&HealthRow>) -> Option<HealthRow> {
    if let Some(old) = old {
        let older = old.node_updated_at == o.node_updated_at
            && o.at < old.changed_at
            && old.health != "UNKNOWN";
        if older {
            return None;
        }
        let drift_same = o.drift.as_ref().is_none_or(|d| *d == old.drift);
        if old.health == o.health
            && old.reason.as_deref() == o.reason
            && old.node_updated_at == o.node_updated_at
            && drift_same
        {
            return None;
        }
    }
    let book = old.map(RestartBook::of).unwrap_or_default();
    Some(HealthRow {
        node_id: o.node_id,
        deployment_id: o.deployment_id,
        health: o.health.to_owned(),
        reason: o.reason.map(str::to_owned),
        changed_at: o.at,
        node_updated_at: o.node_updated_at,
        restarts: book.restarts,
        window_from: book.window_from,
        window_restarts: book.window_restarts,
        next_restart_at: book.next_restart_at,
        gave_up: book.gave_up,
        drift: o.drift.unwrap_or_else(|| old.and_then(|r| r.drift.clone())),
    })
}

/// Rows one insert of [`put_observed`] takes (12 parameters each, under
/// SQLite's 32,766 a statement).
const ROWS_PER_INSERT: usize = 500;

/// Stores rows made by [`observed_row`] in one transaction: each node's
/// health, reason, time and drift; a restart book already stored stays.
pub async fn put_observed(db: &DatabaseConnection, rows: Vec<HealthRow>) -> Result<(), DbErr> {
    use sea_orm::{IntoActiveModel, TransactionTrait};
    if rows.is_empty() {
        return Ok(());
    }
    let txn = db.begin().await?;
    let mut rows = rows.into_iter().peekable();
    while rows.peek().is_some() {
        let chunk: Vec<_> = rows
            .by_ref()
            .take(ROWS_PER_INSERT)
            .map(IntoActiveModel::into_active_model)
            .collect();
        resource_health::Entity::insert_many(chunk)
            .on_conflict(
                OnConflict::column(resource_health::Column::NodeId)
                    .update_columns([
                        resource_health::Column::Health,
                        resource_health::Column::Reason,
                        resource_health::Column::ChangedAt,
                        resource_health::Column::NodeUpdatedAt,
                        resource_health::Column::Drift,
                    ])
                    .to_owned(),
            )
            .exec_without_returning(&txn)
            .await?;
    }
    txn.commit().await
}

/// A node's restart book, as the healer keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestartBook {
    pub restarts: i32,
    pub window_from: Option<DateTime<Utc>>,
    pub window_restarts: i32,
    pub next_restart_at: Option<DateTime<Utc>>,
    pub gave_up: bool,
}

impl RestartBook {
    pub fn of(row: &HealthRow) -> Self {
        RestartBook {
            restarts: row.restarts,
            window_from: row.window_from,
            window_restarts: row.window_restarts,
            next_restart_at: row.next_restart_at,
            gave_up: row.gave_up,
        }
    }
}

/// Writes a node's restart book (its health row must exist).
pub async fn set_restart_book(
    db: &impl sea_orm::ConnectionTrait,
    node_id: Uuid,
    book: &RestartBook,
) -> Result<(), DbErr> {
    resource_health::Entity::update_many()
        .col_expr(
            resource_health::Column::Restarts,
            Expr::value(book.restarts),
        )
        .col_expr(
            resource_health::Column::WindowFrom,
            Expr::value(book.window_from),
        )
        .col_expr(
            resource_health::Column::WindowRestarts,
            Expr::value(book.window_restarts),
        )
        .col_expr(
            resource_health::Column::NextRestartAt,
            Expr::value(book.next_restart_at),
        )
        .col_expr(resource_health::Column::GaveUp, Expr::value(book.gave_up))
        .filter(resource_health::Column::NodeId.eq(node_id))
        .exec(db)
        .await?;
    Ok(())
}

/// Clears the node's next look, unless its row says DOWN for the node as
/// written at `node_updated_at`: a DOWN recorded after the caller read the
/// row (which a booking that read it before could have missed), so the look
/// stays due. Answers whether it was cleared.
pub async fn clear_look_unless_down(
    db: &DatabaseConnection,
    node_id: Uuid,
    node_updated_at: DateTime<Utc>,
) -> Result<bool, DbErr> {
    use sea_orm::sea_query::Condition;
    let down_now = Condition::all()
        .add(resource_health::Column::Health.eq("DOWN"))
        .add(resource_health::Column::NodeUpdatedAt.gte(node_updated_at));
    let done = resource_health::Entity::update_many()
        .col_expr(
            resource_health::Column::NextRestartAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .filter(resource_health::Column::NodeId.eq(node_id))
        .filter(down_now.not())
        .exec(db)
        .await?;
    Ok(done.rows_affected > 0)
}

/// The health rows of a deployment's nodes.
pub async fn health_of(
    db: &DatabaseConnection,
    deployment_id: Uuid,
) -> Result<Vec<HealthRow>, DbErr> {
    resource_health::Entity::find()
        .filter(resource_health::Column::DeploymentId.eq(deployment_id))
        .all(db)
        .await
}

/// One node's health row.
pub async fn health_of_node(
    db: &DatabaseConnection,
    node_id: Uuid,
) -> Result<Option<HealthRow>, DbErr> {
    resource_health::Entity::find_by_id(node_id).one(db).await
}

/// The health rows of these nodes (those that have one).
pub async fn health_of_nodes(
    db: &DatabaseConnection,
    ids: &[Uuid],
) -> Result<Vec<HealthRow>, DbErr> {
    super::find_in::<resource_health::Entity, _>(db, resource_health::Column::NodeId, ids).await
}

/// What the health monitor's scan needs of a deployed node.
#[derive(Clone, Debug)]
pub struct DeployedNode {
    pub id: Uuid,
    pub deployment_id: Uuid,
    pub provider_id: Option<Uuid>,
    pub updated_at: DateTime<Utc>,
}

/// Every node in `state` (a deployed resource's), only what the scan needs:
/// no config or outputs are read.
pub async fn nodes_in(
    db: &DatabaseConnection,
    state: NodeState,
) -> Result<Vec<DeployedNode>, DbErr> {
    use sea_orm::QuerySelect;
    let rows: Vec<(Uuid, Uuid, Option<Uuid>, DateTime<Utc>)> = deployment_node::Entity::find()
        .select_only()
        .columns([
            deployment_node::Column::Id,
            deployment_node::Column::DeploymentId,
            deployment_node::Column::ProviderId,
            deployment_node::Column::UpdatedAt,
        ])
        .filter(deployment_node::Column::State.eq(state))
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .map(
            |(id, deployment_id, provider_id, updated_at)| DeployedNode {
                id,
                deployment_id,
                provider_id,
                updated_at,
            },
        )
        .collect())
}

/// Each node's stored health, and the node's `updated_at` it was seen at.
pub async fn healths(db: &DatabaseConnection) -> Result<Vec<(Uuid, String, DateTime<Utc>)>, DbErr> {
    use sea_orm::QuerySelect;
    resource_health::Entity::find()
        .select_only()
        .columns([
            resource_health::Column::NodeId,
            resource_health::Column::Health,
            resource_health::Column::NodeUpdatedAt,
        ])
        .into_tuple()
        .all(db)
        .await
}

/// When the next restart look is due, if one is booked (healing not given
/// up).
pub async fn next_restart(db: &DatabaseConnection) -> Result<Option<DateTime<Utc>>, DbErr> {
    Ok(resource_health::Entity::find()
        .filter(resource_health::Column::NextRestartAt.is_not_null())
        .filter(resource_health::Column::GaveUp.eq(false))
        .order_by_asc(resource_health::Column::NextRestartAt)
        .one(db)
        .await?
        .and_then(|r| r.next_restart_at))
}

/// Health rows with a restart due by `now` and healing not given up.
pub async fn restarts_due(
    db: &DatabaseConnection,
    now: DateTime<Utc>,
) -> Result<Vec<HealthRow>, DbErr> {
    resource_health::Entity::find()
        .filter(resource_health::Column::NextRestartAt.lte(now))
        .filter(resource_health::Column::GaveUp.eq(false))
        .order_by_asc(resource_health::Column::NextRestartAt)
        .all(db)
        .await
}

/// Sets a deployment's rolled-up health; true when it changed.
pub async fn set_deployment_health(
    db: &DatabaseConnection,
    id: Uuid,
    health: &str,
    at: DateTime<Utc>,
) -> Result<bool, DbErr> {
    let done = deployment::Entity::update_many()
        .col_expr(deployment::Column::Health, Expr::value(health))
        .col_expr(deployment::Column::HealthChangedAt, Expr::value(at))
        .filter(deployment::Column::Id.eq(id))
        .filter(deployment::Column::Health.ne(health))
        .exec(db)
        .await?;
    Ok(done.rows_affected > 0)
}

/// A restart to begin: the deployment's new operation (a `RESTART`), the
/// nodes to restart and the dependents' keys to mark `to_destroy` (from the
/// `holding` states), and the restarted node's new restart book.
pub struct RestartStart<'a> {
    pub deployment: crate::store::deployments::DeploymentChange<'a>,
    pub restarted: &'a [Uuid],
    pub dependents: &'a [String],
    pub holding: &'a [NodeState],
    pub to_destroy: NodeState,
    pub book: (Uuid, &'a RestartBook),
}

/// Begins a restart in one transaction: a crash from here on resumes it,
/// once.
pub async fn begin_restart(
    db: &DatabaseConnection,
    id: Uuid,
    start: RestartStart<'_>,
) -> Result<(), DbErr> {
    use sea_orm::TransactionTrait;
    let txn = db.begin().await?;
    crate::store::deployments::change_deployment(&txn, id, start.deployment).await?;
    deployment_node::Entity::update_many()
        .col_expr(
            deployment_node::Column::State,
            Expr::value(start.to_destroy),
        )
        .col_expr(deployment_node::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(deployment_node::Column::Id.is_in(start.restarted.iter().copied()))
        .filter(deployment_node::Column::State.is_in(start.holding.iter().copied()))
        .exec(&txn)
        .await?;
    if !start.dependents.is_empty() {
        crate::store::deployments::mark_nodes(
            &txn,
            id,
            start.dependents,
            start.holding,
            start.to_destroy,
        )
        .await?;
    }
    let (node, book) = start.book;
    set_restart_book(&txn, node, book).await?;
    txn.commit().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(health: &str, at: DateTime<Utc>, node_updated_at: DateTime<Utc>) -> Observed<'_> {
        Observed {
            node_id: Uuid::nil(),
            deployment_id: Uuid::nil(),
            health,
            reason: None,
            at,
            node_updated_at,
            drift: None,
        }
    }

    /// A report older than the stored one of the same deployed node is not
    /// stored over it; a newer one is, and so is any report over UNKNOWN or
    /// over the row of a node deployed again since.
    #[test]
    fn an_older_report_does_not_replace_a_newer_one() {
        let deployed = Utc::now();
        let t = |s: i64| deployed + chrono::Duration::seconds(s);
        let down = observed_row(observed("DOWN", t(5), deployed), None).unwrap();
        assert!(observed_row(observed("HEALTHY", t(2), deployed), Some(&down)).is_none());
        let back = observed_row(observed("HEALTHY", t(6), deployed), Some(&down)).unwrap();
        assert_eq!(back.health, "HEALTHY");
        let redeployed = observed_row(observed("HEALTHY", t(2), t(3)), Some(&down)).unwrap();
        assert_eq!(redeployed.node_updated_at, t(3));
        let unknown = observed_row(observed("UNKNOWN", t(9), deployed), Some(&down)).unwrap();
        let known = observed_row(observed("HEALTHY", t(1), deployed), Some(&unknown)).unwrap();
        assert_eq!(known.health, "HEALTHY");
    }
}
