//! What the console's overview draws of the deployments: how many
//! deployments and resource nodes changed in each recent hour (from the event
//! history) and the deployed resources by health.

use std::collections::HashSet;

use chrono::{DateTime, Duration, Utc};
use sea_orm::sea_query::{Query, SelectStatement};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
    QuerySelect, QueryTrait,
};
use uuid::Uuid;

use super::journal::first_event_since;
use crate::store::entities::{deployment, deployment_event, deployment_node, resource_health};
use crate::store::states::NodeState;

/// Events read at a time while counting.
const BATCH: u64 = 5_000;

/// One hour of the history: the deployments with any change of state (theirs
/// or a node's) in it, and the resource nodes (`key[replica]` of a
/// deployment) whose state changed in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HourOfChanges {
    pub from: DateTime<Utc>,
    pub deployments: u64,
    pub resources: u64,
}

/// What changed in one hour: deployments, and nodes of a deployment by key.
type Changed = (HashSet<Uuid>, HashSet<(Uuid, String)>);

/// The changes of each hour from `from` on (`hours` of them, oldest first),
/// of the deployments in `projects` (every one for `None`).
pub async fn changes_by_hour(
    db: &DatabaseConnection,
    from: DateTime<Utc>,
    hours: u32,
    projects: Option<&[Uuid]>,
) -> Result<Vec<HourOfChanges>, DbErr> {
    let mut buckets: Vec<Changed> = vec![Default::default(); hours as usize];
    let mut after = match first_event_since(db, from).await? {
        Some(first) => first - 1,
        None => i64::MAX,
    };
    loop {
        let mut query = deployment_event::Entity::find()
            .select_only()
            .columns([
                deployment_event::Column::Id,
                deployment_event::Column::DeploymentId,
                deployment_event::Column::At,
                deployment_event::Column::NodeKey,
            ])
            .filter(deployment_event::Column::Id.gt(after))
            .filter(deployment_event::Column::Kind.is_in(["STATE", "NODE"]))
            .order_by_asc(deployment_event::Column::Id)
            .limit(BATCH);
        if let Some(projects) = projects {
            query = query.filter(deployment_event::Column::DeploymentId.in_subquery(of(projects)));
        }
        let rows: Vec<(i64, Uuid, DateTime<Utc>, Option<String>)> =
            query.into_tuple().all(db).await?;
        let Some(last) = rows.last() else {
            break;
        };
        after = last.0;
        let full = rows.len() as u64 == BATCH;
        for (_, deployment_id, at, node_key) in rows {
            // (Before `from`: an event written out of time order.)
            let hour = usize::try_from((at - from).num_hours()).unwrap_or(usize::MAX);
            let Some((deployments, nodes)) = buckets.get_mut(hour).filter(|_| at >= from) else {
                continue;
            };
            deployments.insert(deployment_id);
            if let Some(key) = node_key {
                nodes.insert((deployment_id, key));
            }
        }
        if !full {
            break;
        }
    }
    Ok(buckets
        .into_iter()
        .enumerate()
        .map(|(i, (deployments, nodes))| HourOfChanges {
            from: from + Duration::hours(i as i64),
            deployments: deployments.len() as u64,
            resources: nodes.len() as u64,
        })
        .collect())
}

/// The deployed resource nodes (`COMPLETE`) of the deployments in
/// `projects` (every one for `None`), by stored health: `(health, count)`,
/// those not judged yet as `UNKNOWN`.
pub async fn nodes_by_health(
    db: &DatabaseConnection,
    projects: Option<&[Uuid]>,
) -> Result<Vec<(String, u64)>, DbErr> {
    let mut deployed = deployment_node::Entity::find()
        .filter(deployment_node::Column::State.eq(NodeState::Complete));
    if let Some(projects) = projects {
        deployed = deployed.filter(deployment_node::Column::DeploymentId.in_subquery(of(projects)));
    }
    let total = deployed.clone().count(db).await?;
    let ids = deployed
        .select_only()
        .column(deployment_node::Column::Id)
        .into_query();
    let judged: Vec<(String, i64)> = resource_health::Entity::find()
        .select_only()
        .column(resource_health::Column::Health)
        .column_as(resource_health::Column::NodeId.count(), "count")
        .filter(resource_health::Column::NodeId.in_subquery(ids))
        .group_by(resource_health::Column::Health)
        .into_tuple()
        .all(db)
        .await?;
    let mut counts: Vec<(String, u64)> = Vec::new();
    let mut counted = 0;
    for (health, count) in judged {
        let count = count.max(0) as u64;
        counted += count;
        counts.push((health, count));
    }
    let unjudged = total.saturating_sub(counted);
    match counts.iter_mut().find(|(health, _)| health == "UNKNOWN") {
        Some((_, count)) => *count += unjudged,
        None if unjudged > 0 => counts.push(("UNKNOWN".to_owned(), unjudged)),
        None => {}
    }
    Ok(counts)
}

/// The ids of the deployments in `projects`, as a subquery.
fn of(projects: &[Uuid]) -> SelectStatement {
    Query::select()
        .column(deployment::Column::Id)
        .from(deployment::Entity)
        .and_where(deployment::Column::ProjectId.is_in(projects.iter().copied()))
        .to_owned()
}
