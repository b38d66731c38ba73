//! Queries on blueprints, deployments, their nodes, the journal and the event
//! history, for the `deploy` area: blueprints and deployments here, their
//! nodes in `nodes`, the journal and the events (with the engine's group
//! commit) in `journal`; the area reaches all of them through this module.
//!
//! A journal entry and the node state announcing a provider call are written in
//! one transaction; the call's result and the entry's deletion in another (the
//! engine's writer groups them: [`commit_group`]).

mod activity;
mod journal;
mod nodes;
mod postgres_group;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait,
    IntoActiveModel, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect, Set, TransactionTrait,
};
use uuid::Uuid;

use super::entities::{blueprint, deployment};
use super::revisions::{NewRevision, insert_revision};
use super::states::{DeploymentState, NodeState};

pub use activity::{HourOfChanges, changes_by_hour, nodes_by_health};
pub(super) use journal::Group;
pub use journal::{
    CallStart, EventRow, GroupWrite, JournalRow, NewEvent, drop_entry, events_between, events_of,
    insert_event, journal, journal_len, journal_of, last_event_id, prune_events,
};
pub use nodes::{
    HOLDING_STATES, Holder, NewNode, NodeChange, NodeRow, change_node, find_node, find_nodes,
    insert_nodes, mark_nodes, node_usage, nodes_of, placement_counts, project_node_count,
    project_node_quotas, provider_holders,
};

pub use blueprint::Model as BlueprintRow;
pub use deployment::Model as DeploymentRow;

/// Commits `writes` in one transaction, as if one after the other; the event
/// each stored, in order.
///
/// Up to 500 writes cost four statements whatever their number: one update
/// for the nodes (each node's changes merged in order), one delete for the
/// journal entries that end or are superseded, one insert for the new
/// entries, one for the events. Per write it used to cost three or four, and
/// each statement is a round trip (to sqlx's SQLite thread, or to PostgreSQL).
/// On PostgreSQL the four are one statement whose text never changes
/// (`postgres_group`): prepared and planned once per connection, one round
/// trip for the whole group, its own transaction outside a leader's fence.
/// On SQLite the engine's writer runs the same statements on a connection of
/// its own instead ([`crate::store::direct::Direct::commit_group`]).
pub async fn commit_group(
    db: &DatabaseConnection,
    writes: &[&GroupWrite],
    fence: Option<&super::cluster::Fence>,
) -> Result<Vec<Option<EventRow>>, DbErr> {
    if db.get_database_backend() == sea_orm::DbBackend::Postgres {
        postgres_group::commit(db, writes, fence).await
    } else {
        journal::commit_group(db, writes, fence).await
    }
}

// ---- blueprints ----

pub async fn insert_blueprint(
    db: &DatabaseConnection,
    project_id: Uuid,
    name: String,
    description: Option<String>,
    source: String,
) -> Result<BlueprintRow, DbErr> {
    let now = Utc::now();
    blueprint::ActiveModel {
        id: Set(Uuid::new_v4()),
        name: Set(name),
        description: Set(description),
        source: Set(source),
        created_at: Set(now),
        updated_at: Set(now),
        project_id: Set(Some(project_id)),
    }
    .insert(db)
    .await
}

pub async fn find_blueprint(
    db: &DatabaseConnection,
    id: Uuid,
) -> Result<Option<BlueprintRow>, DbErr> {
    blueprint::Entity::find_by_id(id).one(db).await
}

/// Blueprints of the `projects` given (all of them when `None`).
pub async fn list_blueprints(
    db: &DatabaseConnection,
    projects: Option<&[Uuid]>,
) -> Result<Vec<BlueprintRow>, DbErr> {
    let mut query = blueprint::Entity::find();
    if let Some(projects) = projects {
        query = query.filter(blueprint::Column::ProjectId.is_in(projects.iter().copied()));
    }
    query.order_by_asc(blueprint::Column::Name).all(db).await
}

/// Columns of a blueprint to change; `None` leaves one as it is.
#[derive(Default)]
pub struct BlueprintChange {
    pub name: Option<String>,
    pub description: Option<String>,
    pub source: Option<String>,
}

pub async fn update_blueprint(
    db: &DatabaseConnection,
    row: BlueprintRow,
    change: BlueprintChange,
) -> Result<BlueprintRow, DbErr> {
    let mut active = row.into_active_model();
    if let Some(v) = change.name {
        active.name = Set(v);
    }
    if let Some(v) = change.description {
        active.description = Set(Some(v));
    }
    if let Some(v) = change.source {
        active.source = Set(v);
    }
    active.updated_at = Set(Utc::now());
    active.update(db).await
}

pub async fn delete_blueprint(db: &DatabaseConnection, id: Uuid) -> Result<bool, DbErr> {
    Ok(blueprint::Entity::delete_by_id(id)
        .exec(db)
        .await?
        .rows_affected
        > 0)
}

/// Deployments of the blueprint that are not `DESTROYED`.
pub async fn count_live_deployments(
    db: &DatabaseConnection,
    blueprint_id: Uuid,
) -> Result<u64, DbErr> {
    deployment::Entity::find()
        .filter(deployment::Column::BlueprintId.eq(blueprint_id))
        .filter(deployment::Column::State.ne(DeploymentState::Destroyed))
        .count(db)
        .await
}

// ---- deployments ----

pub struct NewDeployment {
    pub project_id: Uuid,
    pub name: String,
    pub blueprint_id: Option<Uuid>,
    pub element_id: Option<Uuid>,
    pub source: String,
    pub variables: String,
    pub on_failure: String,
    pub expires_at: Option<DateTime<Utc>>,
    /// Who asked for it, for its first revision.
    pub created_by: Option<String>,
}

/// Stores a new deployment with its first operation (`phase`) under way,
/// and its first revision (`DEPLOY`, `IN_PROGRESS`).
pub async fn insert_deployment(
    db: &DatabaseConnection,
    new: NewDeployment,
    state: DeploymentState,
    phase: &str,
) -> Result<DeploymentRow, DbErr> {
    let now = Utc::now();
    let operation = Uuid::now_v7();
    let revision = NewRevision {
        kind: "DEPLOY".to_owned(),
        source: new.source.clone(),
        variables: new.variables.clone(),
        blueprint_id: new.blueprint_id,
        plan_id: None,
        operation_id: Some(operation),
        created_by: new.created_by,
        outcome: "IN_PROGRESS".to_owned(),
    };
    let txn = db.begin().await?;
    let row = deployment::ActiveModel {
        id: Set(Uuid::new_v4()),
        name: Set(new.name),
        blueprint_id: Set(new.blueprint_id),
        element_id: Set(new.element_id),
        source: Set(new.source),
        variables: Set(new.variables),
        state: Set(state),
        on_failure: Set(new.on_failure),
        error: Set(None),
        expires_at: Set(new.expires_at),
        created_at: Set(now),
        updated_at: Set(now),
        operation_id: Set(Some(operation)),
        phase: Set(Some(phase.to_owned())),
        project_id: Set(Some(new.project_id)),
        health: Set("UNKNOWN".to_owned()),
        health_changed_at: Set(None),
    }
    .insert(&txn)
    .await?;
    insert_revision(&txn, row.id, revision).await?;
    txn.commit().await?;
    Ok(row)
}

pub async fn find_deployment(
    db: &DatabaseConnection,
    id: Uuid,
) -> Result<Option<DeploymentRow>, DbErr> {
    deployment::Entity::find_by_id(id).one(db).await
}

#[derive(Default, Clone)]
pub struct DeploymentFilter {
    pub states: Vec<DeploymentState>,
    /// Rolled-up healths (`deployments.health`), any of them.
    pub healths: Vec<String>,
    pub blueprint_id: Option<Uuid>,
    pub element_id: Option<Uuid>,
    /// Part of the name.
    pub search: Option<String>,
    pub project_id: Option<Uuid>,
    /// The projects the caller may see (`None`: every project).
    pub visible: Option<Vec<Uuid>>,
}

/// The deployments `filter` takes, newest first, `limit` of them from
/// `offset` (by `idx_deployments_created`).
pub async fn list_deployments(
    db: &DatabaseConnection,
    filter: &DeploymentFilter,
    offset: u64,
    limit: u64,
) -> Result<Vec<DeploymentRow>, DbErr> {
    filtered(filter)
        .order_by_desc(deployment::Column::CreatedAt)
        .order_by_asc(deployment::Column::Id)
        .offset(offset)
        .limit(limit)
        .all(db)
        .await
}

/// How many deployments `filter` takes.
pub async fn count_deployments(
    db: &DatabaseConnection,
    filter: &DeploymentFilter,
) -> Result<u64, DbErr> {
    filtered(filter).count(db).await
}

fn filtered(filter: &DeploymentFilter) -> sea_orm::Select<deployment::Entity> {
    let mut query = deployment::Entity::find();
    if !filter.states.is_empty() {
        query = query.filter(deployment::Column::State.is_in(filter.states.clone()));
    }
    if !filter.healths.is_empty() {
        query = query.filter(deployment::Column::Health.is_in(filter.healths.clone()));
    }
    if let Some(id) = filter.blueprint_id {
        query = query.filter(deployment::Column::BlueprintId.eq(id));
    }
    if let Some(id) = filter.element_id {
        query = query.filter(deployment::Column::ElementId.eq(id));
    }
    if let Some(search) = &filter.search {
        query = query.filter(deployment::Column::Name.contains(search));
    }
    if let Some(id) = filter.project_id {
        query = query.filter(deployment::Column::ProjectId.eq(id));
    }
    if let Some(visible) = &filter.visible {
        query = query.filter(deployment::Column::ProjectId.is_in(visible.iter().copied()));
    }
    query
}

/// A deployment's new state, with its phase and error (both replaced), and
/// a new operation id when one starts.
pub struct DeploymentChange<'a> {
    pub state: DeploymentState,
    /// `None` once settled.
    pub phase: Option<&'a str>,
    pub error: Option<&'a str>,
    /// `Some` starts a new operation; `None` keeps the current one.
    pub operation_id: Option<Uuid>,
}

pub async fn change_deployment(
    db: &impl ConnectionTrait,
    id: Uuid,
    change: DeploymentChange<'_>,
) -> Result<(), DbErr> {
    let mut update = deployment::Entity::update_many()
        .col_expr(deployment::Column::State, Expr::value(change.state))
        .col_expr(
            deployment::Column::Phase,
            Expr::value(change.phase.map(str::to_owned)),
        )
        .col_expr(
            deployment::Column::Error,
            Expr::value(change.error.map(str::to_owned)),
        )
        .col_expr(deployment::Column::UpdatedAt, Expr::value(Utc::now()));
    if let Some(operation) = change.operation_id {
        update = update.col_expr(deployment::Column::OperationId, Expr::value(operation));
    }
    update
        .filter(deployment::Column::Id.eq(id))
        .exec(db)
        .await
        .map(drop)
}

/// Starts a redeploy in one transaction: the deployment's new operation, and
/// the nodes of `keys` holding (or maybe holding) a resource marked
/// `to_destroy`.
pub async fn begin_redeploy(
    db: &DatabaseConnection,
    id: Uuid,
    deployment: DeploymentChange<'_>,
    keys: &[String],
    holding: &[NodeState],
    to_destroy: NodeState,
) -> Result<(), DbErr> {
    let txn = db.begin().await?;
    change_deployment(&txn, id, deployment).await?;
    mark_nodes(&txn, id, keys, holding, to_destroy).await?;
    txn.commit().await
}

pub async fn set_expiry(
    db: &DatabaseConnection,
    id: Uuid,
    expires_at: Option<DateTime<Utc>>,
) -> Result<(), DbErr> {
    deployment::Entity::update_many()
        .col_expr(deployment::Column::ExpiresAt, Expr::value(expires_at))
        .col_expr(deployment::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(deployment::Column::Id.eq(id))
        .exec(db)
        .await
        .map(drop)
}

pub async fn deployments_in(
    db: &DatabaseConnection,
    states: &[DeploymentState],
) -> Result<Vec<DeploymentRow>, DbErr> {
    deployment::Entity::find()
        .filter(deployment::Column::State.is_in(states.iter().copied()))
        .order_by_asc(deployment::Column::CreatedAt)
        .all(db)
        .await
}

/// Deployments whose lease ran out and that are still up.
pub async fn expired(
    db: &DatabaseConnection,
    now: DateTime<Utc>,
    live: &[DeploymentState],
) -> Result<Vec<DeploymentRow>, DbErr> {
    deployment::Entity::find()
        .filter(deployment::Column::ExpiresAt.lte(now))
        .filter(deployment::Column::State.is_in(live.iter().copied()))
        .all(db)
        .await
}
