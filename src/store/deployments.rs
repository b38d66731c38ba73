//! Queries on blueprints, deployments, their nodes, the journal and the event
//! history, for the `deploy` area.
//!
//! A journal entry and the node state announcing a provider call are written in
//! one transaction; the call's result and the entry's deletion in another (the
//! engine's writer groups them: [`commit_group`]).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{CaseStatement, Expr};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, Condition, ConnectionTrait, DatabaseConnection, DbErr,
    EntityTrait, FromQueryResult, IntoActiveModel, PaginatorTrait, QueryFilter, QueryOrder,
    QuerySelect, QueryTrait, Set, TransactionTrait,
};
use uuid::Uuid;

use super::entities::{blueprint, deployment, deployment_event, deployment_node, journal};

pub use blueprint::Model as BlueprintRow;
pub use deployment::Model as DeploymentRow;
pub use deployment_event::Model as EventRow;
pub use deployment_node::Model as NodeRow;
pub use journal::Model as JournalRow;

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
    destroyed: &str,
) -> Result<u64, DbErr> {
    deployment::Entity::find()
        .filter(deployment::Column::BlueprintId.eq(blueprint_id))
        .filter(deployment::Column::State.ne(destroyed))
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
    state: &str,
    phase: &str,
) -> Result<DeploymentRow, DbErr> {
    let now = Utc::now();
    let operation = Uuid::now_v7();
    let revision = super::plans::NewRevision {
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
        state: Set(state.to_owned()),
        on_failure: Set(new.on_failure),
        error: Set(None),
        expires_at: Set(new.expires_at),
        created_at: Set(now),
        updated_at: Set(now),
        operation_id: Set(Some(operation)),
        phase: Set(Some(phase.to_owned())),
        project_id: Set(Some(new.project_id)),
    }
    .insert(&txn)
    .await?;
    super::plans::insert_revision(&txn, row.id, revision).await?;
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
    pub states: Vec<String>,
    pub blueprint_id: Option<Uuid>,
    pub element_id: Option<Uuid>,
    /// Part of the name.
    pub search: Option<String>,
    pub project_id: Option<Uuid>,
    /// The projects the caller may see (`None`: every project).
    pub visible: Option<Vec<Uuid>>,
}

pub async fn list_deployments(
    db: &DatabaseConnection,
    filter: &DeploymentFilter,
    offset: u64,
    limit: u64,
) -> Result<(Vec<DeploymentRow>, u64), DbErr> {
    let mut query = deployment::Entity::find();
    if !filter.states.is_empty() {
        query = query.filter(deployment::Column::State.is_in(filter.states.clone()));
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
    let total = query.clone().count(db).await?;
    let rows = query
        .order_by_desc(deployment::Column::CreatedAt)
        .order_by_asc(deployment::Column::Id)
        .offset(offset)
        .limit(limit)
        .all(db)
        .await?;
    Ok((rows, total))
}

/// A deployment's new state, with its phase and error (both replaced), and
/// a new operation id when one starts.
pub struct DeploymentChange<'a> {
    pub state: &'a str,
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
    holding: &[&str],
    to_destroy: &str,
) -> Result<(), DbErr> {
    let txn = db.begin().await?;
    change_deployment(&txn, id, deployment).await?;
    mark_nodes(&txn, id, keys, holding, to_destroy).await?;
    txn.commit().await
}

/// Moves the nodes of `keys` that are in one of `from` states to `to`.
pub async fn mark_nodes(
    db: &impl ConnectionTrait,
    deployment_id: Uuid,
    keys: &[String],
    from: &[&str],
    to: &str,
) -> Result<u64, DbErr> {
    Ok(deployment_node::Entity::update_many()
        .col_expr(deployment_node::Column::State, Expr::value(to))
        .col_expr(deployment_node::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(deployment_node::Column::DeploymentId.eq(deployment_id))
        .filter(deployment_node::Column::Key.is_in(keys.iter().cloned()))
        .filter(deployment_node::Column::State.is_in(from.iter().copied()))
        .exec(db)
        .await?
        .rows_affected)
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
    states: &[&str],
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
    live: &[&str],
) -> Result<Vec<DeploymentRow>, DbErr> {
    deployment::Entity::find()
        .filter(deployment::Column::ExpiresAt.lte(now))
        .filter(deployment::Column::State.is_in(live.iter().copied()))
        .all(db)
        .await
}

// ---- nodes ----

pub struct NewNode {
    pub key: String,
    pub replica: i32,
    pub resource_type: String,
    pub provider_id: Option<Uuid>,
    pub node: Option<String>,
    /// What it counts against named quotas, a JSON object as text.
    pub quota: Option<String>,
}

/// Writes the planned nodes and the deployment's state in one transaction.
pub async fn insert_nodes(
    db: &DatabaseConnection,
    deployment_id: Uuid,
    nodes: Vec<NewNode>,
    node_state: &str,
    deployment_state: &str,
) -> Result<(), DbErr> {
    let txn = db.begin().await?;
    let now = Utc::now();
    for chunk in nodes.chunks(500) {
        let models = chunk.iter().map(|n| deployment_node::ActiveModel {
            id: Set(Uuid::now_v7()),
            deployment_id: Set(deployment_id),
            key: Set(n.key.clone()),
            replica: Set(n.replica),
            resource_type: Set(n.resource_type.clone()),
            provider_id: Set(n.provider_id),
            node: Set(n.node.clone()),
            state: Set(node_state.to_owned()),
            config: Set(None),
            outputs: Set(None),
            error: Set(None),
            run_id: Set(None),
            updated_at: Set(now),
            quota: Set(n.quota.clone()),
            generation: Set(0),
        });
        deployment_node::Entity::insert_many(models)
            .exec_without_returning(&txn)
            .await?;
    }
    deployment::Entity::update_many()
        .col_expr(deployment::Column::State, Expr::value(deployment_state))
        .col_expr(deployment::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(deployment::Column::Id.eq(deployment_id))
        .exec(&txn)
        .await?;
    txn.commit().await
}

pub async fn nodes_of(db: &DatabaseConnection, deployment_id: Uuid) -> Result<Vec<NodeRow>, DbErr> {
    deployment_node::Entity::find()
        .filter(deployment_node::Column::DeploymentId.eq(deployment_id))
        .order_by_asc(deployment_node::Column::Key)
        .order_by_asc(deployment_node::Column::Replica)
        .all(db)
        .await
}

pub async fn find_node(db: &DatabaseConnection, id: Uuid) -> Result<Option<NodeRow>, DbErr> {
    deployment_node::Entity::find_by_id(id).one(db).await
}

/// What is deployed or in flight on each node of a provider, for placement.
pub async fn placement_counts(
    db: &DatabaseConnection,
    provider_id: Uuid,
    live_states: &[&str],
) -> Result<HashMap<String, i64>, DbErr> {
    let rows: Vec<(Option<String>, i64)> = deployment_node::Entity::find()
        .select_only()
        .column(deployment_node::Column::Node)
        .column_as(deployment_node::Column::Id.count(), "count")
        .filter(deployment_node::Column::ProviderId.eq(provider_id))
        .filter(deployment_node::Column::State.is_in(live_states.iter().copied()))
        .group_by(deployment_node::Column::Node)
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(node, count)| node.map(|n| (n, count)))
        .collect())
}

/// How many nodes of the project's deployments are in `live_states`: what
/// counts against its `maxResources`.
pub async fn project_node_count(
    db: &DatabaseConnection,
    project_id: Uuid,
    live_states: &[&str],
) -> Result<u64, DbErr> {
    let of_project = sea_orm::sea_query::Query::select()
        .column(deployment::Column::Id)
        .from(deployment::Entity)
        .and_where(deployment::Column::ProjectId.eq(project_id))
        .to_owned();
    deployment_node::Entity::find()
        .filter(deployment_node::Column::DeploymentId.in_subquery(of_project))
        .filter(deployment_node::Column::State.is_in(live_states.iter().copied()))
        .count(db)
        .await
}

/// The named quantities (`deployment_nodes.quota`) of the project's nodes in
/// `live_states`, one JSON object per node that has any.
pub async fn project_node_quotas(
    db: &DatabaseConnection,
    project_id: Uuid,
    live_states: &[&str],
) -> Result<Vec<String>, DbErr> {
    let of_project = sea_orm::sea_query::Query::select()
        .column(deployment::Column::Id)
        .from(deployment::Entity)
        .and_where(deployment::Column::ProjectId.eq(project_id))
        .to_owned();
    deployment_node::Entity::find()
        .select_only()
        .column(deployment_node::Column::Quota)
        .filter(deployment_node::Column::DeploymentId.in_subquery(of_project))
        .filter(deployment_node::Column::State.is_in(live_states.iter().copied()))
        .filter(deployment_node::Column::Quota.is_not_null())
        .into_tuple::<String>()
        .all(db)
        .await
}

/// Node states that hold, or may hold, a resource on their provider: a
/// provider with such nodes cannot be deleted.
pub const HOLDING_STATES: [&str; 8] = [
    "TO_DEPLOY",
    "WAITING",
    "IN_PROGRESS",
    "COMPLETE",
    "SUSPENDED",
    "FAILED",
    "TO_DESTROY",
    "DESTROYING",
];

/// A deployment holding resources on one provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub deployment_id: Uuid,
    pub deployment_name: String,
    /// How many of its nodes hold (or may hold) a resource there.
    pub nodes: u64,
}

/// The deployments whose nodes in `holding` states are on `provider_id`, by
/// name.
pub async fn provider_holders(
    db: &impl ConnectionTrait,
    provider_id: Uuid,
    holding: &[&str],
) -> Result<Vec<Holder>, DbErr> {
    let counts: Vec<(Uuid, i64)> = deployment_node::Entity::find()
        .select_only()
        .column(deployment_node::Column::DeploymentId)
        .column_as(deployment_node::Column::Id.count(), "nodes")
        .filter(deployment_node::Column::ProviderId.eq(provider_id))
        .filter(deployment_node::Column::State.is_in(holding.iter().copied()))
        .group_by(deployment_node::Column::DeploymentId)
        .into_tuple()
        .all(db)
        .await?;
    if counts.is_empty() {
        return Ok(Vec::new());
    }
    let names: HashMap<Uuid, String> = deployment::Entity::find()
        .select_only()
        .column(deployment::Column::Id)
        .column(deployment::Column::Name)
        .filter(deployment::Column::Id.is_in(counts.iter().map(|(id, _)| *id)))
        .into_tuple::<(Uuid, String)>()
        .all(db)
        .await?
        .into_iter()
        .collect();
    let mut holders: Vec<Holder> = counts
        .into_iter()
        .map(|(id, nodes)| Holder {
            deployment_id: id,
            deployment_name: names.get(&id).cloned().unwrap_or_default(),
            nodes: nodes.max(0) as u64,
        })
        .collect();
    holders.sort_by(|a, b| {
        (&a.deployment_name, a.deployment_id).cmp(&(&b.deployment_name, b.deployment_id))
    });
    Ok(holders)
}

/// A node's new state, with what else changes with it.
#[derive(Clone, Debug, Default)]
pub struct NodeChange {
    pub state: String,
    pub config: Option<String>,
    pub outputs: Option<Option<String>>,
    pub error: Option<Option<String>>,
    pub run_id: Option<Option<Uuid>>,
}

fn apply(change: NodeChange) -> sea_orm::UpdateMany<deployment_node::Entity> {
    let mut update = deployment_node::Entity::update_many()
        .col_expr(deployment_node::Column::State, Expr::value(change.state))
        .col_expr(deployment_node::Column::UpdatedAt, Expr::value(Utc::now()));
    if let Some(config) = change.config {
        update = update.col_expr(deployment_node::Column::Config, Expr::value(config));
    }
    if let Some(outputs) = change.outputs {
        update = update.col_expr(deployment_node::Column::Outputs, Expr::value(outputs));
    }
    if let Some(error) = change.error {
        update = update.col_expr(deployment_node::Column::Error, Expr::value(error));
    }
    if let Some(run) = change.run_id {
        update = update.col_expr(deployment_node::Column::RunId, Expr::value(run));
    }
    update
}

pub async fn change_node(
    db: &impl ConnectionTrait,
    node_id: Uuid,
    change: NodeChange,
) -> Result<(), DbErr> {
    apply(change)
        .filter(deployment_node::Column::Id.eq(node_id))
        .exec(db)
        .await
        .map(drop)
}

impl NodeChange {
    /// This change, then `later`: what applying both in order leaves.
    fn then(&mut self, later: NodeChange) {
        self.state = later.state;
        if later.config.is_some() {
            self.config = later.config;
        }
        if later.outputs.is_some() {
            self.outputs = later.outputs;
        }
        if later.error.is_some() {
            self.error = later.error;
        }
        if later.run_id.is_some() {
            self.run_id = later.run_id;
        }
    }
}

/// One update making each node's change: a column takes, per node, the value
/// its change sets (`CASE id WHEN …`), or keeps its own.
fn apply_all(changes: &[(Uuid, NodeChange)]) -> sea_orm::UpdateMany<deployment_node::Entity> {
    use deployment_node::Column;
    fn set(
        case: &mut Option<CaseStatement>,
        node: Uuid,
        value: impl Into<sea_orm::sea_query::Value>,
    ) {
        let when = Column::Id.eq(node);
        let value = Expr::value(value);
        *case = Some(match case.take() {
            Some(case) => case.case(when, value),
            None => CaseStatement::new().case(when, value),
        });
    }
    let (mut state, mut config, mut outputs, mut error, mut run) = (None, None, None, None, None);
    for (node, change) in changes {
        set(&mut state, *node, change.state.clone());
        if let Some(v) = &change.config {
            set(&mut config, *node, v.clone());
        }
        if let Some(v) = &change.outputs {
            set(&mut outputs, *node, v.clone());
        }
        if let Some(v) = &change.error {
            set(&mut error, *node, v.clone());
        }
        if let Some(v) = change.run_id {
            set(&mut run, *node, v);
        }
    }
    let mut update = deployment_node::Entity::update_many()
        .col_expr(Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(Column::Id.is_in(changes.iter().map(|(node, _)| *node)));
    for (column, case) in [
        (Column::State, state),
        (Column::Config, config),
        (Column::Outputs, outputs),
        (Column::Error, error),
        (Column::RunId, run),
    ] {
        if let Some(case) = case {
            update = update.col_expr(column, case.finally(Expr::col(column)).into());
        }
    }
    update
}

// ---- the journal ----

/// An event to store with a state change, in the same transaction.
#[derive(Clone, Debug)]
pub struct NewEvent {
    pub kind: String,
    pub node_key: Option<String>,
    pub state: Option<String>,
    pub message: String,
}

/// One of the engine's hot writes (see `deploy::writer`).
#[derive(Clone, Debug)]
pub enum GroupWrite {
    /// A deployment event on its own.
    Event { deployment: Uuid, event: NewEvent },
    /// The node's state and the journal entry for the call about to be made,
    /// with its event. Older entries of the node go: the new call supersedes
    /// them (calls are idempotent per resource, and the new one settles
    /// whatever they left).
    Begin { call: CallStart, event: NewEvent },
    /// A call's result and the end of its entry, with its event.
    Finish {
        deployment: Uuid,
        node: Uuid,
        entry: Uuid,
        change: NodeChange,
        event: Option<NewEvent>,
    },
}

/// Rows one statement of [`commit_group`] takes: SQLite takes at most 32,766
/// parameters a statement, and an event has six.
const ROWS_PER_STATEMENT: usize = 1_000;

/// Nodes one update of [`commit_group`] changes (up to 12 parameters each).
const NODES_PER_STATEMENT: usize = 500;

/// Commits `writes` in one transaction, as if one after the other; the event
/// each stored, in order.
///
/// Up to 500 writes cost four statements whatever their number: one update
/// for the nodes (each node's changes merged in order), one delete for the
/// journal entries that end or are superseded, one insert for the new
/// entries, one for the events. Per write it used to cost three or four, and
/// each statement is a round trip (to sqlx's SQLite thread, or to PostgreSQL).
/// On SQLite the engine's writer runs the same statements on a connection of
/// its own instead ([`super::direct::Direct::commit_group`]).
pub async fn commit_group(
    db: &DatabaseConnection,
    writes: &[&GroupWrite],
    fence: Option<&super::cluster::Fence>,
) -> Result<Vec<Option<EventRow>>, DbErr> {
    let group = Group::of(writes);
    let backend = db.get_database_backend();
    let txn = db.begin().await?;
    if let Some(fence) = fence
        && !super::cluster::check_fence(&txn, fence).await?
    {
        return Err(super::cluster::fenced_out(fence));
    }
    for change in &group.changes {
        txn.execute_raw(change.build(backend)).await?;
    }
    let mut stored = Vec::with_capacity(group.owners.len());
    for statement in &group.events {
        for row in txn.query_all_raw(backend.build(statement)).await? {
            stored.push(EventRow::from_query_result(&row, "")?);
        }
    }
    txn.commit().await?;
    group.answers(stored)
}

/// What [`commit_group`] writes, as statements: the changes (node updates,
/// journal deletes and inserts, in that order), then the event inserts, which
/// return the stored rows.
pub(super) struct Group {
    pub(super) changes: Vec<Change>,
    pub(super) events: Vec<sea_orm::sea_query::InsertStatement>,
    /// Which write each event belongs to, in the events' order.
    owners: Vec<usize>,
    writes: usize,
}

/// One of a group's statements that change rows.
pub(super) enum Change {
    Update(sea_orm::sea_query::UpdateStatement),
    Delete(sea_orm::sea_query::DeleteStatement),
    Insert(sea_orm::sea_query::InsertStatement),
}

impl Change {
    pub(super) fn build(&self, backend: sea_orm::DbBackend) -> sea_orm::Statement {
        match self {
            Change::Update(statement) => backend.build(statement),
            Change::Delete(statement) => backend.build(statement),
            Change::Insert(statement) => backend.build(statement),
        }
    }
}

impl Group {
    pub(super) fn of(writes: &[&GroupWrite]) -> Group {
        // Each node's changes merged, in the order its first change came.
        let mut changes: Vec<(Uuid, NodeChange)> = Vec::new();
        let mut changed: HashMap<Uuid, usize> = HashMap::new();
        let mut merge = |node: Uuid, change: &NodeChange| match changed.get(&node) {
            Some(&at) => changes[at].1.then(change.clone()),
            None => {
                changed.insert(node, changes.len());
                changes.push((node, change.clone()));
            }
        };
        let mut ended = Vec::new();
        let mut superseded = Vec::new();
        // The new entries by node: the last one begun (an earlier one in the
        // group is superseded too), unless the group also ends it.
        let mut entries: HashMap<Uuid, journal::ActiveModel> = HashMap::new();
        let mut events = Vec::new();
        let mut owners = Vec::new();
        for (index, write) in writes.iter().enumerate() {
            let (deployment, event) = match write {
                GroupWrite::Event { deployment, event } => (*deployment, Some(event)),
                GroupWrite::Begin { call, event } => {
                    merge(call.node_id, &call.change);
                    superseded.push(call.node_id);
                    let entry = journal::ActiveModel {
                        id: Set(call.entry),
                        deployment_id: Set(call.deployment_id),
                        node_id: Set(call.node_id),
                        provider_id: Set(call.provider_id),
                        intent: Set(call.intent.clone()),
                        created_at: Set(Utc::now()),
                    };
                    entries.insert(call.node_id, entry);
                    (call.deployment_id, Some(event))
                }
                GroupWrite::Finish {
                    deployment,
                    node,
                    entry,
                    change,
                    event,
                } => {
                    merge(*node, change);
                    // An entry this group began ends before it is written.
                    if entries
                        .get(node)
                        .is_some_and(|begun| begun.id.try_as_ref() == Some(entry))
                    {
                        entries.remove(node);
                    }
                    ended.push(*entry);
                    (*deployment, event.as_ref())
                }
            };
            if let Some(event) = event {
                events.push(new_event(deployment, event.clone()));
                owners.push(index);
            }
        }
        let mut statements = Vec::new();
        for chunk in changes.chunks(NODES_PER_STATEMENT) {
            statements.push(Change::Update(apply_all(chunk).into_query()));
        }
        let (mut ended, mut superseded) = (
            ended.chunks(ROWS_PER_STATEMENT),
            superseded.chunks(ROWS_PER_STATEMENT),
        );
        loop {
            let (ids, nodes) = (ended.next(), superseded.next());
            if ids.is_none() && nodes.is_none() {
                break;
            }
            let mut gone = Condition::any();
            if let Some(ids) = ids {
                gone = gone.add(journal::Column::Id.is_in(ids.iter().copied()));
            }
            if let Some(nodes) = nodes {
                gone = gone.add(journal::Column::NodeId.is_in(nodes.iter().copied()));
            }
            statements.push(Change::Delete(
                journal::Entity::delete_many().filter(gone).into_query(),
            ));
        }
        let entries: Vec<journal::ActiveModel> = entries.into_values().collect();
        for chunk in entries.chunks(ROWS_PER_STATEMENT) {
            statements.push(Change::Insert(
                journal::Entity::insert_many(chunk.iter().cloned()).into_query(),
            ));
        }
        let events = events
            .chunks(ROWS_PER_STATEMENT)
            .map(|chunk| {
                let mut insert =
                    deployment_event::Entity::insert_many(chunk.iter().cloned()).into_query();
                insert.returning_all();
                insert
            })
            .collect();
        Group {
            changes: statements,
            events,
            owners,
            writes: writes.len(),
        }
    }

    /// The event each write stored, from the rows the inserts returned.
    pub(super) fn answers(self, mut stored: Vec<EventRow>) -> Result<Vec<Option<EventRow>>, DbErr> {
        // One statement numbers its rows in the order of its values; RETURNING
        // may list them in any order.
        stored.sort_unstable_by_key(|row| row.id);
        if stored.len() != self.owners.len() {
            return Err(DbErr::Custom(format!(
                "{} events stored of {}",
                stored.len(),
                self.owners.len()
            )));
        }
        let mut out = vec![None; self.writes];
        for (index, row) in self.owners.into_iter().zip(stored) {
            out[index] = Some(row);
        }
        Ok(out)
    }
}

fn new_event(deployment_id: Uuid, event: NewEvent) -> deployment_event::ActiveModel {
    deployment_event::ActiveModel {
        id: sea_orm::NotSet,
        deployment_id: Set(deployment_id),
        at: Set(Utc::now()),
        kind: Set(event.kind),
        node_key: Set(event.node_key),
        state: Set(event.state),
        message: Set(event.message),
    }
}

/// A call about to be made: its journal entry (`entry`) and the node's change.
#[derive(Clone, Debug)]
pub struct CallStart {
    pub entry: Uuid,
    pub deployment_id: Uuid,
    pub node_id: Uuid,
    pub provider_id: Uuid,
    pub intent: String,
    pub change: NodeChange,
}

/// Deletes a journal entry whose call needs no change to its node.
pub async fn drop_entry(db: &DatabaseConnection, entry: Uuid) -> Result<(), DbErr> {
    journal::Entity::delete_by_id(entry)
        .exec(db)
        .await
        .map(drop)
}

pub async fn journal(db: &DatabaseConnection) -> Result<Vec<JournalRow>, DbErr> {
    journal::Entity::find()
        .order_by_asc(journal::Column::CreatedAt)
        .all(db)
        .await
}

/// The entries of one deployment, oldest first.
pub async fn journal_of(
    db: &DatabaseConnection,
    deployment_id: Uuid,
) -> Result<Vec<JournalRow>, DbErr> {
    journal::Entity::find()
        .filter(journal::Column::DeploymentId.eq(deployment_id))
        .order_by_asc(journal::Column::CreatedAt)
        .all(db)
        .await
}

pub async fn journal_len(db: &DatabaseConnection) -> Result<u64, DbErr> {
    journal::Entity::find().count(db).await
}

// ---- events ----

pub async fn insert_event(
    db: &DatabaseConnection,
    deployment_id: Uuid,
    event: NewEvent,
) -> Result<EventRow, DbErr> {
    new_event(deployment_id, event).insert(db).await
}

/// Events of a deployment after `after` (an event id; 0 for all), oldest
/// first.
pub async fn events_of(
    db: &DatabaseConnection,
    deployment_id: Uuid,
    after: i64,
    limit: u64,
) -> Result<Vec<EventRow>, DbErr> {
    deployment_event::Entity::find()
        .filter(deployment_event::Column::DeploymentId.eq(deployment_id))
        .filter(deployment_event::Column::Id.gt(after))
        .order_by_asc(deployment_event::Column::Id)
        .limit(limit)
        .all(db)
        .await
}
