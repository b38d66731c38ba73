//! A deployment's nodes (`deployment_nodes`): writing the planned ones,
//! reading them, moving them between states (one at a time, or many in one
//! `CASE` update for the engine's group commit), and the counts placement,
//! quotas and a provider's deletion go by.

use std::collections::HashMap;

use chrono::Utc;
use futures_util::TryStreamExt;
use sea_orm::sea_query::{CaseStatement, Expr};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait,
    PaginatorTrait, QueryFilter, QueryOrder, QuerySelect, Set, Statement, TransactionTrait,
};
use uuid::Uuid;

use crate::store::entities::{deployment, deployment_node};
use crate::store::states::{DeploymentState, NodeState};

pub use deployment_node::Model as NodeRow;

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
    node_state: NodeState,
    deployment_state: DeploymentState,
) -> Result<(), DbErr> {
    let inserted = nodes.len();
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
            state: Set(node_state),
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
    txn.commit().await?;
    if inserted >= BULK_NODES && db.get_database_backend() == DbBackend::Postgres {
        tokio::spawn(refresh_statistics(db.clone(), inserted));
    }
    Ok(())
}

/// How many nodes one deployment must add for [`refresh_statistics`].
const BULK_NODES: usize = 1_000;

/// PostgreSQL keeps a prepared statement's generic plan until the table's
/// statistics change, which autovacuum does at most once a minute: the
/// engine's group commit, planned while `deployment_nodes` was small, went on
/// reading and hashing every row of the table for each group once a large
/// deployment had filled it (the deploy bench's 10,000-entry recovery: 14.5
/// million rows read, 5.3–6.2 s to COMPLETE, against 2.2–3.0 s in the runs
/// where autovacuum happened to analyse the table in time). After a bulk
/// insert that grows the table by a tenth or more (autovacuum's own rule),
/// the table is analysed at once, which also makes every connection plan
/// its statements again.
async fn refresh_statistics(db: DatabaseConnection, inserted: usize) {
    let known = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT reltuples::float8 FROM pg_class WHERE oid = 'deployment_nodes'::regclass",
        ))
        .await
        .and_then(|row| row.map(|r| r.try_get_by_index::<f64>(0)).transpose());
    let stale = match known {
        // -1: never analysed.
        Ok(Some(rows)) => rows < 0.0 || inserted as f64 >= rows / 10.0,
        Ok(None) => false,
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the nodes' statistics");
            false
        }
    };
    if !stale {
        return;
    }
    let analysed = db
        .execute_raw(Statement::from_string(
            DbBackend::Postgres,
            "ANALYZE deployment_nodes",
        ))
        .await;
    if let Err(e) = analysed {
        tracing::warn!(error = %e, "cannot analyse the deployment nodes' table");
    }
}

/// A deployment's nodes by key and replica. Read as a stream, each row made
/// a node as it comes: the driver's copy of every row at once (about 1.8 KB
/// a row before it is a node) was most of a 100,000-node run's peak memory.
pub async fn nodes_of(db: &DatabaseConnection, deployment_id: Uuid) -> Result<Vec<NodeRow>, DbErr> {
    deployment_node::Entity::find()
        .filter(deployment_node::Column::DeploymentId.eq(deployment_id))
        .order_by_asc(deployment_node::Column::Key)
        .order_by_asc(deployment_node::Column::Replica)
        .stream(db)
        .await?
        .try_collect()
        .await
}

pub async fn find_node(db: &DatabaseConnection, id: Uuid) -> Result<Option<NodeRow>, DbErr> {
    deployment_node::Entity::find_by_id(id).one(db).await
}

/// The nodes of these ids that exist, in no particular order.
pub async fn find_nodes(db: &DatabaseConnection, ids: &[Uuid]) -> Result<Vec<NodeRow>, DbErr> {
    crate::store::find_in::<deployment_node::Entity, _>(db, deployment_node::Column::Id, ids).await
}

/// What is deployed or in flight on each node of a provider, for placement.
pub async fn placement_counts(
    db: &DatabaseConnection,
    provider_id: Uuid,
    live_states: &[NodeState],
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

/// What each node of a provider holds (resources in `live_states`), by
/// resource type: node → type → count.
pub async fn node_usage(
    db: &DatabaseConnection,
    provider_id: Uuid,
    live_states: &[NodeState],
) -> Result<HashMap<String, HashMap<String, i64>>, DbErr> {
    let rows: Vec<(Option<String>, String, i64)> = deployment_node::Entity::find()
        .select_only()
        .column(deployment_node::Column::Node)
        .column(deployment_node::Column::ResourceType)
        .column_as(deployment_node::Column::Id.count(), "count")
        .filter(deployment_node::Column::ProviderId.eq(provider_id))
        .filter(deployment_node::Column::State.is_in(live_states.iter().copied()))
        .group_by(deployment_node::Column::Node)
        .group_by(deployment_node::Column::ResourceType)
        .into_tuple()
        .all(db)
        .await?;
    let mut usage: HashMap<String, HashMap<String, i64>> = HashMap::new();
    for (node, kind, count) in rows {
        if let Some(node) = node {
            usage.entry(node).or_default().insert(kind, count);
        }
    }
    Ok(usage)
}

/// How many nodes of the project's deployments are in `live_states`: what
/// counts against its `maxResources`.
pub async fn project_node_count(
    db: &DatabaseConnection,
    project_id: Uuid,
    live_states: &[NodeState],
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
    live_states: &[NodeState],
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
pub const HOLDING_STATES: [NodeState; 8] = [
    NodeState::ToDeploy,
    NodeState::Waiting,
    NodeState::InProgress,
    NodeState::Complete,
    NodeState::Suspended,
    NodeState::Failed,
    NodeState::ToDestroy,
    NodeState::Destroying,
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
    holding: &[NodeState],
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
#[derive(Clone, Debug)]
pub struct NodeChange {
    pub state: NodeState,
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
    /// The node moves to `state`; nothing else changes.
    pub fn to(state: NodeState) -> NodeChange {
        NodeChange {
            state,
            config: None,
            outputs: None,
            error: None,
            run_id: None,
        }
    }

    /// This change, then `later`: what applying both in order leaves.
    pub(super) fn then(&mut self, later: NodeChange) {
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
pub(super) fn apply_all(
    changes: &[(Uuid, NodeChange)],
) -> sea_orm::UpdateMany<deployment_node::Entity> {
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
        set(&mut state, *node, change.state);
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

/// Moves the nodes of `keys` that are in one of `from` states to `to`.
pub async fn mark_nodes(
    db: &impl ConnectionTrait,
    deployment_id: Uuid,
    keys: &[String],
    from: &[NodeState],
    to: NodeState,
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
