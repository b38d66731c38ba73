//! Reads: deployments, their nodes, their history and the journal's length,
//! each row turned into its typed form here (unknown text is `Corrupt`).
//! Never writes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

use super::{
    DeployError, Deployment, DeploymentEvent, DeploymentFilter, Deployments, ResourceNode,
    blueprint,
};
use crate::store::deployments as rows;

/// The reads part of [`Deployments`].
#[derive(Clone, Copy)]
pub struct Queries<'a>(pub(super) &'a Deployments);

impl Queries<'_> {
    pub async fn get(&self, id: Uuid) -> Result<Deployment, DeployError> {
        to_deployment(self.row(id).await?)
    }

    /// The deployments `filter` takes, newest first: `limit` from `offset`.
    pub async fn list(
        &self,
        filter: &DeploymentFilter,
        offset: u64,
        limit: u64,
    ) -> Result<Vec<Deployment>, DeployError> {
        rows::list_deployments(&self.0.inner.db, filter, offset, limit)
            .await?
            .into_iter()
            .map(to_deployment)
            .collect()
    }

    /// How many deployments `filter` takes.
    pub async fn count(&self, filter: &DeploymentFilter) -> Result<u64, DeployError> {
        Ok(rows::count_deployments(&self.0.inner.db, filter).await?)
    }

    pub async fn nodes(&self, id: Uuid) -> Result<Vec<ResourceNode>, DeployError> {
        let nodes = rows::nodes_of(&self.0.inner.db, id).await?;
        let mut health = self.0.health().rows_of(id).await?;
        nodes
            .into_iter()
            .map(|n| {
                let row = health.remove(&n.id);
                to_node(n, row.as_ref())
            })
            .collect()
    }

    /// How many resource nodes a project's deployments hold (or are about
    /// to): what counts against its `maxResources`.
    pub async fn project_usage(
        &self,
        project: Uuid,
    ) -> Result<(u64, std::collections::BTreeMap<String, i64>), DeployError> {
        let resources =
            rows::project_node_count(&self.0.inner.db, project, &super::LIVE_NODE_STATES).await?;
        let quantities = super::quotas::project_quantities(&self.0.inner.db, project).await?;
        Ok((resources, quantities))
    }

    /// What each node of `provider` holds now (deployed or in flight), by
    /// resource type: node name → type → count.
    pub async fn node_usage(
        &self,
        provider: Uuid,
    ) -> Result<
        std::collections::HashMap<String, std::collections::HashMap<String, i64>>,
        DeployError,
    > {
        Ok(rows::node_usage(&self.0.inner.db, provider, &super::LIVE_NODE_STATES).await?)
    }

    /// One resource node of any deployment, by its id.
    pub async fn node(&self, id: Uuid) -> Result<ResourceNode, DeployError> {
        let row = rows::find_node(&self.0.inner.db, id)
            .await?
            .ok_or_else(|| DeployError::NotFound(format!("no resource node {id}")))?;
        let health = crate::store::health::health_of_node(&self.0.inner.db, id).await?;
        to_node(row, health.as_ref())
    }

    /// The history, oldest first (at most `limit` entries).
    pub async fn history(&self, id: Uuid, limit: u64) -> Result<Vec<DeploymentEvent>, DeployError> {
        self.history_after(id, 0, limit).await
    }

    /// The history after event `after`, oldest first (at most `limit`).
    pub async fn history_after(
        &self,
        id: Uuid,
        after: i64,
        limit: u64,
    ) -> Result<Vec<DeploymentEvent>, DeployError> {
        rows::events_of(&self.0.inner.db, id, after, limit)
            .await?
            .into_iter()
            .map(to_event)
            .collect()
    }

    /// Deployments and resource nodes changed in each of the last `hours`
    /// clock hours (the current one last), of the deployments in `projects`
    /// (every one for `None`).
    pub async fn changes_by_hour(
        &self,
        hours: u32,
        projects: Option<&[Uuid]>,
    ) -> Result<Vec<rows::HourOfChanges>, DeployError> {
        use chrono::{DurationRound, TimeDelta, Utc};
        let this_hour = Utc::now()
            .duration_trunc(TimeDelta::hours(1))
            .unwrap_or_else(|_| Utc::now());
        let from = this_hour - TimeDelta::hours(i64::from(hours.max(1)) - 1);
        Ok(rows::changes_by_hour(&self.0.inner.db, from, hours.max(1), projects).await?)
    }

    /// Deployed resources by health, `(health, count)`, of the deployments
    /// in `projects` (every one for `None`).
    pub async fn nodes_by_health(
        &self,
        projects: Option<&[Uuid]>,
    ) -> Result<Vec<(super::ResourceHealth, u64)>, DeployError> {
        rows::nodes_by_health(&self.0.inner.db, projects)
            .await?
            .into_iter()
            .map(|(health, n)| Ok((health.parse()?, n)))
            .collect()
    }

    /// Entries left in the journal: work in flight (or a crash's leftovers).
    pub async fn journal_len(&self) -> Result<u64, DeployError> {
        Ok(rows::journal_len(&self.0.inner.db).await?)
    }

    /// The deployment's own copy of its blueprint, parsed: what it runs.
    pub async fn parsed(&self, id: Uuid) -> Result<Arc<blueprint::Blueprint>, DeployError> {
        let row = self.row(id).await?;
        self.0.inner.parsed.get(id, row.source)
    }

    async fn row(&self, id: Uuid) -> Result<rows::DeploymentRow, DeployError> {
        rows::find_deployment(&self.0.inner.db, id)
            .await?
            .ok_or_else(|| DeployError::NotFound(format!("no deployment with id {id}")))
    }
}

pub(super) fn to_deployment(row: rows::DeploymentRow) -> Result<Deployment, DeployError> {
    Ok(Deployment {
        id: row.id,
        name: row.name,
        blueprint_id: row.blueprint_id,
        element_id: row.element_id,
        variables: serde_json::from_str(&row.variables)
            .map_err(|e| DeployError::Corrupt(format!("deployment variables: {e}")))?,
        state: row.state,
        phase: row.phase.as_deref().map(str::parse).transpose()?,
        on_failure: row.on_failure.parse()?,
        error: row.error,
        expires_at: row.expires_at,
        created_at: row.created_at,
        updated_at: row.updated_at,
        project_id: row.project_id,
        health: row.health.parse()?,
        health_changed_at: row.health_changed_at,
    })
}

fn to_node(
    row: rows::NodeRow,
    health: Option<&crate::store::health::HealthRow>,
) -> Result<ResourceNode, DeployError> {
    let state = row.state;
    Ok(ResourceNode {
        health: super::health::node_health(state, row.updated_at, health),
        id: row.id,
        deployment_id: row.deployment_id,
        key: row.key,
        replica: row.replica,
        resource_type: row.resource_type,
        provider_id: row.provider_id,
        node: row.node,
        state,
        outputs: row
            .outputs
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| DeployError::Corrupt(format!("node outputs: {e}")))?,
        error: row.error,
        updated_at: row.updated_at,
    })
}

pub(super) fn to_event(row: rows::EventRow) -> Result<DeploymentEvent, DeployError> {
    Ok(DeploymentEvent {
        id: row.id,
        deployment_id: row.deployment_id,
        at: row.at,
        kind: row.kind.parse()?,
        node_key: row.node_key,
        state: row.state,
        message: row.message,
    })
}

/// How many parsed copies [`ParsedCopies`] keeps.
const PARSED_COPIES: usize = 32;

/// The blueprint copies of the deployments read last, parsed. A deployment's
/// page asks for its resources each time it opens, and parsing a copy of
/// 1,000 resources costs more than the rest of that query. A copy is taken
/// from here only while its source is the one stored: one that changed is
/// parsed again.
#[derive(Default)]
pub(super) struct ParsedCopies(Mutex<VecDeque<ParsedCopy>>);

/// A deployment's id, its copy's source, and the copy parsed.
type ParsedCopy = (Uuid, String, Arc<blueprint::Blueprint>);

impl ParsedCopies {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<ParsedCopy>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, id: Uuid, source: String) -> Result<Arc<blueprint::Blueprint>, DeployError> {
        {
            let mut copies = self.lock();
            if let Some(at) = copies.iter().position(|(i, s, _)| *i == id && *s == source) {
                let hit = copies.remove(at).expect("found");
                let parsed = hit.2.clone();
                copies.push_front(hit);
                return Ok(parsed);
            }
        }
        let parsed =
            Arc::new(blueprint::parse(&source).map_err(|p| DeployError::Corrupt(p.to_string()))?);
        let mut copies = self.lock();
        copies.retain(|(i, _, _)| *i != id);
        copies.push_front((id, source, parsed.clone()));
        copies.truncate(PARSED_COPIES);
        Ok(parsed)
    }
}

/// Every deployment's events after id `after` up to `upto`, oldest first (at
/// most `limit`): what another replica's leader committed (`app::feed`).
pub async fn events_between(
    db: &crate::store::Db,
    after: i64,
    upto: i64,
    limit: u64,
) -> Result<Vec<DeploymentEvent>, DeployError> {
    rows::events_between(db, after, upto, limit)
        .await?
        .into_iter()
        .map(to_event)
        .collect()
}

/// The id of the last deployment event stored (0 when there is none).
pub async fn last_event_id(db: &crate::store::Db) -> Result<i64, DeployError> {
    Ok(rows::last_event_id(db).await?)
}
