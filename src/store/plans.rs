//! Queries on plans, for the `deploy` area: storing a plan, and starting
//! one's apply (the deployment's new blueprint and variables, its nodes
//! marked and the new ones inserted, the plan applied and a revision opened,
//! in one transaction). The revisions themselves are `revisions`'.

use chrono::Utc;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait,
    QueryFilter, Set, TransactionTrait,
};
use uuid::Uuid;

use super::deployments::{DeploymentChange, NewNode, change_deployment};
use super::entities::{deployment, deployment_node, deployment_plan};
use super::states::{NodeState, PlanState};

pub use deployment_plan::Model as PlanRow;
// The revisions live in `revisions` (a new deployment opens its first one
// too); the `deploy` area reaches them through here.
pub use super::revisions::{
    NewRevision, RevisionRow, end_revisions, find_revision, insert_revision, revisions_of,
};

pub async fn insert_plan(db: &DatabaseConnection, plan: PlanRow) -> Result<(), DbErr> {
    deployment_plan::ActiveModel::from(plan)
        .insert(db)
        .await
        .map(drop)
}

pub async fn find_plan(db: &DatabaseConnection, id: Uuid) -> Result<Option<PlanRow>, DbErr> {
    deployment_plan::Entity::find_by_id(id).one(db).await
}

/// A node an apply changes: its new state, and its type, provider and
/// placement when it is made again as something else.
pub struct NodeMark {
    pub id: Uuid,
    pub state: NodeState,
    pub resource_type: Option<String>,
    pub provider_id: Option<Uuid>,
    pub node: Option<Option<String>>,
    pub quota: Option<Option<String>>,
}

/// A node an apply adds, in the generation given.
pub struct AddedNode {
    pub node: NewNode,
    pub generation: i32,
}

/// Everything an apply starts with, written at once.
pub struct ApplyStart<'a> {
    pub deployment_id: Uuid,
    pub plan_id: Uuid,
    pub source: String,
    pub variables: String,
    pub blueprint_id: Option<Uuid>,
    pub change: DeploymentChange<'a>,
    pub marks: Vec<NodeMark>,
    pub added: Vec<AddedNode>,
    pub node_state: NodeState,
    pub plan_state: PlanState,
    pub revision: NewRevision,
    /// Rows left by an earlier apply (retired), removed first.
    pub remove_states: &'a [NodeState],
}

/// Starts an apply in one transaction; returns the revision's number.
pub async fn begin_apply(db: &DatabaseConnection, start: ApplyStart<'_>) -> Result<i32, DbErr> {
    let txn = db.begin().await?;
    let now = Utc::now();
    remove_nodes(&txn, start.deployment_id, start.remove_states).await?;
    deployment::Entity::update_many()
        .col_expr(deployment::Column::Source, Expr::value(start.source))
        .col_expr(deployment::Column::Variables, Expr::value(start.variables))
        .col_expr(
            deployment::Column::BlueprintId,
            Expr::value(start.blueprint_id),
        )
        .filter(deployment::Column::Id.eq(start.deployment_id))
        .exec(&txn)
        .await?;
    change_deployment(&txn, start.deployment_id, start.change).await?;
    for mark in start.marks {
        let mut update = deployment_node::Entity::update_many()
            .col_expr(deployment_node::Column::State, Expr::value(mark.state))
            .col_expr(deployment_node::Column::UpdatedAt, Expr::value(now));
        if let Some(ty) = mark.resource_type {
            update = update.col_expr(deployment_node::Column::ResourceType, Expr::value(ty));
        }
        if let Some(provider) = mark.provider_id {
            update = update.col_expr(deployment_node::Column::ProviderId, Expr::value(provider));
        }
        if let Some(node) = mark.node {
            update = update.col_expr(deployment_node::Column::Node, Expr::value(node));
        }
        if let Some(quota) = mark.quota {
            update = update.col_expr(deployment_node::Column::Quota, Expr::value(quota));
        }
        update
            .filter(deployment_node::Column::Id.eq(mark.id))
            .exec(&txn)
            .await?;
    }
    for added in start.added {
        let n = added.node;
        deployment_node::ActiveModel {
            id: Set(Uuid::now_v7()),
            deployment_id: Set(start.deployment_id),
            key: Set(n.key),
            replica: Set(n.replica),
            resource_type: Set(n.resource_type),
            provider_id: Set(n.provider_id),
            node: Set(n.node),
            state: Set(start.node_state),
            config: Set(None),
            outputs: Set(None),
            error: Set(None),
            run_id: Set(None),
            updated_at: Set(now),
            quota: Set(n.quota),
            generation: Set(added.generation),
        }
        .insert(&txn)
        .await?;
    }
    deployment_plan::Entity::update_many()
        .col_expr(
            deployment_plan::Column::State,
            Expr::value(start.plan_state),
        )
        .col_expr(deployment_plan::Column::AppliedAt, Expr::value(now))
        .filter(deployment_plan::Column::Id.eq(start.plan_id))
        .exec(&txn)
        .await?;
    let number = insert_revision(&txn, start.deployment_id, start.revision).await?;
    txn.commit().await?;
    Ok(number)
}

/// Removes the deployment's nodes in `states` (retired ones: their resources
/// are gone).
pub async fn remove_nodes(
    db: &impl ConnectionTrait,
    deployment_id: Uuid,
    states: &[NodeState],
) -> Result<u64, DbErr> {
    if states.is_empty() {
        return Ok(0);
    }
    Ok(deployment_node::Entity::delete_many()
        .filter(deployment_node::Column::DeploymentId.eq(deployment_id))
        .filter(deployment_node::Column::State.is_in(states.iter().copied()))
        .exec(db)
        .await?
        .rows_affected)
}

/// Moves the nodes `ids` to `to` (retiring nodes back to
/// running when their replacement did not come up).
pub async fn move_nodes(db: &DatabaseConnection, ids: &[Uuid], to: NodeState) -> Result<(), DbErr> {
    if ids.is_empty() {
        return Ok(());
    }
    deployment_node::Entity::update_many()
        .col_expr(deployment_node::Column::State, Expr::value(to))
        .col_expr(deployment_node::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(deployment_node::Column::Id.is_in(ids.iter().copied()))
        .exec(db)
        .await
        .map(drop)
}
