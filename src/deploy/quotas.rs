//! What a project may use: its `maxResources` (live resource nodes), its
//! named quotas (the quantities providers say each resource counts, per
//! replica, from `DescribeResources`), and `maxLeaseSeconds` (the longest
//! lease of one of its deployments). Each check says which limit a request
//! would pass and by how much.
//!
//! The node checks run under the placing lock, with the nodes written under
//! it (see `plan`), so two plans never both take the last room. Only reads
//! of what is used; never writes.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::{DeployError, LIVE_NODE_STATES};
use crate::store::deployments as rows;
use crate::store::{Db, DbErr};

/// What each resource (by key) counts against its project's named quotas,
/// per replica, as its provider described it (`DescribeResources`).
pub(super) type Quantities = BTreeMap<String, BTreeMap<String, i64>>;

/// Adds one replica's quantities to `total`; a negative amount counts as 0.
pub(super) fn add_replica(
    total: &mut BTreeMap<String, i64>,
    quota: Option<&BTreeMap<String, i64>>,
) {
    for (name, amount) in quota.into_iter().flatten() {
        let sum = total.entry(name.clone()).or_default();
        *sum = sum.saturating_add((*amount).max(0));
    }
}

/// Refuses a plan of `count` nodes, counting `wanted` of named quantities,
/// that would take deployment `id`'s project past its `maxResources` or one
/// of its named quotas, saying which and by how much. Called under the
/// placing lock, with the nodes written under it: two plans never both take
/// the last room.
pub(super) async fn nodes_within_quota(
    db: &Db,
    id: Uuid,
    count: usize,
    wanted: &BTreeMap<String, i64>,
) -> Result<(), String> {
    let Some(project) = rows::find_deployment(db, id)
        .await
        .map_err(|e| e.to_string())?
        .and_then(|d| d.project_id)
    else {
        return Ok(());
    };
    let Some(row) = crate::store::projects::find_project(db, project)
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(());
    };
    let live = LIVE_NODE_STATES;
    if let Some(max) = row.max_resources {
        let used = rows::project_node_count(db, project, &live)
            .await
            .map_err(|e| e.to_string())?;
        over(&row.name, "maxResources", max, used as i64, count as i64)?;
    }
    let limits: serde_json::Map<String, Value> =
        serde_json::from_str(&row.quotas).unwrap_or_default();
    let limited: Vec<(&String, i64)> = limits
        .iter()
        .filter_map(|(name, limit)| Some((name, limit.as_i64()?)))
        .filter(|(name, _)| wanted.get(*name).is_some_and(|n| *n > 0))
        .collect();
    if limited.is_empty() {
        return Ok(());
    }
    let used = project_quantities(db, project)
        .await
        .map_err(|e| e.to_string())?;
    for (name, limit) in limited {
        let in_use = used.get(name).copied().unwrap_or(0);
        over(&row.name, name, limit, in_use, wanted[name])?;
    }
    Ok(())
}

/// The error for a plan that needs `needs` of the quota `name` of `project`
/// (`limit` allowed, `used` in use), if that is too much.
fn over(project: &str, name: &str, limit: i64, used: i64, needs: i64) -> Result<(), String> {
    let limit = limit.max(0);
    let total = used.saturating_add(needs);
    if total > limit {
        return Err(format!(
            "quota {name} of project `{project}`: {limit} allowed, {used} in use, this \
             deployment needs {needs}: {} over",
            total - limit
        ));
    }
    Ok(())
}

/// What the project's live nodes count of each named quantity.
pub(super) async fn project_quantities(
    db: &Db,
    project: Uuid,
) -> Result<BTreeMap<String, i64>, DbErr> {
    let rows = rows::project_node_quotas(db, project, &LIVE_NODE_STATES).await?;
    let mut used = BTreeMap::<String, i64>::new();
    for text in rows {
        let Ok(quota) = serde_json::from_str::<BTreeMap<String, i64>>(&text) else {
            continue;
        };
        for (name, amount) in quota {
            let total = used.entry(name).or_default();
            *total = total.saturating_add(amount.max(0));
        }
    }
    Ok(used)
}

/// The lease a deployment of `project` may have: `asked`, when within the
/// project's `maxLeaseSeconds`; that longest lease when none is asked;
/// refused, saying by how much, when longer. `field` is the argument's name,
/// as the caller wrote it.
pub(super) async fn lease_within_quota(
    db: &Db,
    field: &str,
    project: Option<Uuid>,
    asked: Option<DateTime<Utc>>,
) -> Result<Option<DateTime<Utc>>, DeployError> {
    let Some(project) = project else {
        return Ok(asked);
    };
    let Some(row) = crate::store::projects::find_project(db, project).await? else {
        return Ok(asked);
    };
    let Some(max) = row.max_lease_seconds else {
        return Ok(asked);
    };
    let now = Utc::now();
    let longest = now + chrono::TimeDelta::seconds(max);
    match asked {
        None => Ok(Some(longest)),
        Some(at) if at <= longest => Ok(Some(at)),
        Some(at) => Err(DeployError::Invalid(format!(
            "`{field}`: quota maxLeaseSeconds of project `{}` allows leases of at most \
             {max} s; this one is {} s: {} s over",
            row.name,
            (at - now).num_seconds(),
            (at - longest).num_seconds()
        ))),
    }
}
