//! Live health: what runs, beside what was made. A node's `health` is an
//! axis of its own (a COMPLETE node can be DOWN), learned from its provider
//! (a `WatchResources` stream, or `Inspect` at an interval: see `monitor`),
//! stored in `resource_health`, told as `HEALTH` events in the deployment's
//! history, rolled up to the deployment (worst wins), counted on `/metrics`,
//! and acted on by `heal` when the resource's blueprint asks for restarts.
//!
//! Healing never calls a provider itself: a restart is a run through the
//! journal (`Runs::restart`), like any redeploy, so a crash in the middle of
//! one resumes it and starts nothing twice.

mod heal;
mod monitor;

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::{DeployError, Deployments, EventKind, EventState, NodeState};
use crate::provider::{Observation, Seen};
use crate::store::deployments::{self as rows, NodeRow};
use crate::store::health::{self as stored, HealthRow, Observed};
use crate::text::text_enum;

pub(super) use heal::Healer;

text_enum! {
    pub enum ResourceHealth {
        /// Runs as it should.
        Healthy = "HEALTHY",
        /// Runs, but its provider says it is unwell.
        Degraded = "DEGRADED",
        /// Not running: exited, killed, or gone.
        Down = "DOWN",
        /// Its provider is not connected, or has not said yet.
        Unknown = "UNKNOWN",
    }
}

/// A `HEALTH` event announces a health (`deployment_events.state`).
impl From<ResourceHealth> for EventState {
    fn from(health: ResourceHealth) -> Self {
        match health {
            ResourceHealth::Healthy => EventState::Healthy,
            ResourceHealth::Degraded => EventState::Degraded,
            ResourceHealth::Down => EventState::Down,
            ResourceHealth::Unknown => EventState::Unknown,
        }
    }
}

impl ResourceHealth {
    /// Worse is higher: HEALTHY, UNKNOWN, DEGRADED, DOWN.
    fn rank(self) -> u8 {
        match self {
            ResourceHealth::Healthy => 0,
            ResourceHealth::Unknown => 1,
            ResourceHealth::Degraded => 2,
            ResourceHealth::Down => 3,
        }
    }

    /// The worst of them; UNKNOWN when there are none.
    pub fn worst(all: impl IntoIterator<Item = ResourceHealth>) -> ResourceHealth {
        all.into_iter()
            .max_by_key(|h| h.rank())
            .unwrap_or(ResourceHealth::Unknown)
    }

    fn of(seen: Seen) -> ResourceHealth {
        match seen {
            Seen::Healthy => ResourceHealth::Healthy,
            Seen::Degraded => ResourceHealth::Degraded,
            Seen::Down => ResourceHealth::Down,
        }
    }
}

/// A node's health as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeHealth {
    pub health: ResourceHealth,
    pub reason: Option<String>,
    pub changed_at: DateTime<Utc>,
    pub restarts: i32,
    /// Config keys whose observed value differs from the deployed one.
    pub drift: Vec<String>,
}

/// A node's health from its state and its stored row. Only a deployed
/// (COMPLETE) node has one of its own; one written since the row was stored
/// (deployed again, updated) is HEALTHY until its provider says otherwise;
/// a powered-off one is UNKNOWN.
pub fn node_health(
    state: NodeState,
    updated_at: DateTime<Utc>,
    row: Option<&HealthRow>,
) -> NodeHealth {
    let restarts = row.map_or(0, |r| r.restarts);
    let drift = row
        .and_then(drift_values)
        .map(|d| d.keys().cloned().collect())
        .unwrap_or_default();
    let unknown = |reason: Option<&str>| NodeHealth {
        health: ResourceHealth::Unknown,
        reason: reason.map(str::to_owned),
        changed_at: updated_at,
        restarts,
        drift: Vec::new(),
    };
    match state {
        NodeState::Complete => match row {
            Some(r) if r.node_updated_at >= updated_at => NodeHealth {
                health: r.health.parse().unwrap_or(ResourceHealth::Unknown),
                reason: r.reason.clone(),
                changed_at: r.changed_at,
                restarts,
                drift,
            },
            _ => NodeHealth {
                health: ResourceHealth::Healthy,
                reason: None,
                changed_at: updated_at,
                restarts,
                drift: Vec::new(),
            },
        },
        NodeState::Suspended => unknown(Some("powered off")),
        _ => unknown(None),
    }
}

/// The observed values of a row's drifted keys, by key.
fn drift_values(row: &HealthRow) -> Option<serde_json::Map<String, Value>> {
    row.drift
        .as_deref()
        .and_then(|d| serde_json::from_str::<Value>(d).ok())
        .and_then(|v| match v {
            Value::Object(map) if !map.is_empty() => Some(map),
            _ => None,
        })
}

/// The health of a stored node row.
pub(super) fn health_of_row(node: &NodeRow, row: Option<&HealthRow>) -> NodeHealth {
    let state = node.state;
    node_health(state, node.updated_at, row)
}

/// What the health part keeps in memory: the gauges' last counts, and the
/// deployments whose roll-up is due.
#[derive(Default)]
pub(super) struct HealthState {
    gauges: Mutex<HashMap<ResourceHealth, usize>>,
    dirty: Mutex<BTreeSet<Uuid>>,
    rollup_due: tokio::sync::Notify,
    /// Told when a restart was scheduled.
    heal_due: tokio::sync::Notify,
    /// Held by [`Health::record_all`] from its read of the stored rows to
    /// its write: a watch and a look at the same provider apply one after
    /// the other, so an older report read first cannot be stored over a
    /// newer one.
    recording: tokio::sync::Mutex<()>,
}

/// One thing learned of a node, for [`Health::record_all`].
pub(super) struct Sighting<'a> {
    pub(super) node: &'a NodeRow,
    pub(super) health: ResourceHealth,
    pub(super) reason: Option<&'a str>,
    pub(super) at: DateTime<Utc>,
    /// When the provider said what config it sees: the keys seen otherwise
    /// than deployed, with their values.
    pub(super) drift: Option<serde_json::Map<String, Value>>,
    pub(super) exit_code: Option<i32>,
}

impl<'a> Sighting<'a> {
    /// What a provider said of `node`.
    pub(super) fn of(node: &'a NodeRow, observation: &'a Observation) -> Self {
        Sighting {
            node,
            health: ResourceHealth::of(observation.seen),
            reason: (!observation.reason.is_empty()).then_some(observation.reason.as_str()),
            at: observation.at.unwrap_or_else(Utc::now),
            drift: observation
                .observed
                .as_ref()
                .map(|seen| drifted(node.config.as_deref(), seen)),
            exit_code: observation.exit_code,
        }
    }
}

/// The health part of [`Deployments`].
#[derive(Clone, Copy)]
pub struct Health<'a>(pub(super) &'a Deployments);

impl Health<'_> {
    /// The health rows of a deployment's nodes, by node id.
    pub(super) async fn rows_of(
        &self,
        deployment: Uuid,
    ) -> Result<HashMap<Uuid, HealthRow>, DeployError> {
        Ok(stored::health_of(&self.0.inner.db, deployment)
            .await?
            .into_iter()
            .map(|r| (r.node_id, r))
            .collect())
    }

    /// Records what was learned of nodes, in order: what is new stored in
    /// one transaction, each change of health or reason told as a `HEALTH`
    /// event (all in one commit), the deployments rolled up, and every DOWN
    /// handed to the healer, changed or not (one stored before its restart
    /// could be booked, by a crash between the two, is booked now). A node
    /// that is not deployed (or moved on) is left alone. Answers how many
    /// moved.
    pub(super) async fn record_all(
        &self,
        sightings: &[Sighting<'_>],
    ) -> Result<usize, DeployError> {
        let db = &self.0.inner.db;
        let deployed: Vec<&Sighting> = sightings
            .iter()
            .filter(|s| s.node.state == NodeState::Complete)
            .collect();
        if deployed.is_empty() {
            return Ok(0);
        }
        let _one_at_a_time = self.0.inner.health.recording.lock().await;
        let ids: Vec<Uuid> = deployed
            .iter()
            .map(|s| s.node.id)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut rows: HashMap<Uuid, HealthRow> = stored::health_of_nodes(db, &ids)
            .await?
            .into_iter()
            .map(|r| (r.node_id, r))
            .collect();
        let mut changed = BTreeSet::new();
        let mut events = Vec::new();
        let mut downs = Vec::new();
        let mut moves = Vec::new();
        for s in deployed {
            let node = s.node;
            let old = rows.get(&node.id);
            let before = health_of_row(node, old);
            let observed = Observed {
                node_id: node.id,
                deployment_id: node.deployment_id,
                health: s.health.as_str(),
                reason: s.reason,
                at: s.at,
                node_updated_at: node.updated_at,
                drift: s
                    .drift
                    .clone()
                    .map(|d| (!d.is_empty()).then(|| Value::Object(d).to_string())),
            };
            if let Some(row) = stored::observed_row(observed, old) {
                rows.insert(node.id, row);
                changed.insert(node.id);
                if before.health != s.health || before.reason.as_deref() != s.reason {
                    let message = match s.reason {
                        Some(reason) => format!("{}: {reason}", s.health.as_str()),
                        None => s.health.as_str().to_owned(),
                    };
                    let event = rows::NewEvent {
                        kind: EventKind::Health.as_str().to_owned(),
                        node_key: Some(super::node_label(node)),
                        state: Some(s.health.into()),
                        message,
                    };
                    events.push((node.deployment_id, event));
                    moves.push((before.health, s.health));
                }
            }
            if s.health == ResourceHealth::Down {
                downs.push((node, s.exit_code));
            }
        }
        let moved = events.len();
        let new_rows = changed.iter().filter_map(|id| rows.remove(id)).collect();
        stored::put_observed(db, new_rows).await?;
        for (from, to) in moves {
            self.count_moved(from, to);
        }
        for (deployment, _) in &events {
            self.mark_dirty(*deployment);
        }
        self.0.runs().record_all(events).await;
        self.0.healer().on_down_all(&downs).await?;
        Ok(moved)
    }

    /// [`record_all`](Self::record_all) of one thing learned of one node.
    pub(super) async fn record(
        &self,
        node: &NodeRow,
        health: ResourceHealth,
        reason: Option<&str>,
        at: DateTime<Utc>,
    ) -> Result<bool, DeployError> {
        let sighting = Sighting {
            node,
            health,
            reason,
            at,
            drift: None,
            exit_code: None,
        };
        Ok(self.record_all(&[sighting]).await? > 0)
    }

    /// Asks for the deployment's roll-up soon (several changes at once are
    /// rolled up once).
    pub(super) fn mark_dirty(&self, deployment: Uuid) {
        let state = &self.0.inner.health;
        state
            .dirty
            .lock()
            .expect("the dirty set is never poisoned")
            .insert(deployment);
        state.rollup_due.notify_one();
    }

    /// The observed values of each drifted key, by node, for the nodes whose
    /// drift is current: what a plan compares instead of the stored config.
    pub(super) async fn drift_of(
        &self,
        deployment: Uuid,
        nodes: &[NodeRow],
    ) -> Result<HashMap<Uuid, serde_json::Map<String, Value>>, DeployError> {
        let rows = self.rows_of(deployment).await?;
        Ok(nodes
            .iter()
            .filter(|n| n.state == NodeState::Complete)
            .filter_map(|n| {
                let row = rows
                    .get(&n.id)
                    .filter(|r| r.node_updated_at >= n.updated_at)?;
                Some((n.id, drift_values(row)?))
            })
            .collect())
    }

    /// Rolls a deployment's nodes up to its own health; a change is a
    /// deployment-level `HEALTH` event (no node), which `serverEvents` shows.
    pub(super) async fn roll_up(&self, deployment: Uuid) -> Result<(), DeployError> {
        let db = &self.0.inner.db;
        let nodes = rows::nodes_of(db, deployment).await?;
        let health_rows = self.rows_of(deployment).await?;
        // Every node that runs or is meant to (a node being deployed or
        // restarted is UNKNOWN until it runs); not those gone, retired or
        // powered off on purpose.
        let live: Vec<NodeHealth> = nodes
            .iter()
            .filter(|n| {
                ![
                    NodeState::Destroyed,
                    NodeState::Retired,
                    NodeState::Suspended,
                ]
                .contains(&n.state)
            })
            .map(|n| health_of_row(n, health_rows.get(&n.id)))
            .collect();
        let worst = ResourceHealth::worst(live.iter().map(|h| h.health));
        if !stored::set_deployment_health(db, deployment, worst.as_str(), Utc::now()).await? {
            return Ok(());
        }
        let down = live.iter().filter(|h| h.health == worst).count();
        let message = if live.is_empty() {
            "deployment UNKNOWN: no resource is deployed".to_owned()
        } else {
            format!(
                "deployment {}: {down} of {} resources {}",
                worst.as_str(),
                live.len(),
                worst.as_str()
            )
        };
        self.0
            .runs()
            .record(
                deployment,
                EventKind::Health,
                None,
                Some(worst.into()),
                message,
            )
            .await;
        Ok(())
    }

    /// Restarts one resource now, whatever its health (`restartResource`).
    pub async fn restart(
        &self,
        deployment: Uuid,
        key: &str,
        replica: i32,
        by: Option<&str>,
    ) -> Result<super::Deployment, DeployError> {
        self.0
            .healer()
            .restart_by_hand(deployment, key, replica, by)
            .await
    }

    /// Restarts what is due, until the server stops (a leader singleton).
    pub async fn run_healer(&self) {
        self.0.healer().run().await
    }

    /// Rolls up the deployments marked dirty, until the server stops (a
    /// leader singleton).
    pub async fn run_rollups(&self) {
        let state = &self.0.inner.health;
        loop {
            tokio::select! {
                () = state.rollup_due.notified() => {}
                () = self.0.inner.stopping.cancelled() => return,
            }
            let due =
                std::mem::take(&mut *state.dirty.lock().expect("the dirty set is never poisoned"));
            for deployment in due {
                if let Err(e) = self.roll_up(deployment).await {
                    tracing::warn!(deployment.id = %deployment, error = %e, "cannot roll up a deployment's health");
                }
            }
        }
    }

    /// Sets the `corbel_resources{health}` gauges from a count of every
    /// deployed resource.
    pub(super) fn set_gauges(&self, counts: HashMap<ResourceHealth, usize>) {
        let mut gauges = self
            .0
            .inner
            .health
            .gauges
            .lock()
            .expect("the gauges are never poisoned");
        for health in ResourceHealth::ALL {
            let n = counts.get(&health).copied().unwrap_or(0);
            metrics::gauge!("corbel_resources", "health" => health.as_str()).set(n as f64);
        }
        *gauges = counts;
    }

    /// One resource moved between healths: the gauges follow at once.
    fn count_moved(&self, from: ResourceHealth, to: ResourceHealth) {
        if from == to {
            return;
        }
        let mut counts = self.counts();
        let left = counts.entry(from).or_default();
        *left = left.saturating_sub(1);
        *counts.entry(to).or_default() += 1;
        self.set_gauges(counts);
    }

    /// The gauges' last counts.
    pub fn counts(&self) -> HashMap<ResourceHealth, usize> {
        self.0
            .inner
            .health
            .gauges
            .lock()
            .expect("the gauges are never poisoned")
            .clone()
    }
}

/// The keys of `seen` whose value differs from the deployed config's, with
/// the value seen.
fn drifted(config: Option<&str>, seen: &Value) -> serde_json::Map<String, Value> {
    let deployed: Value = config
        .and_then(|c| serde_json::from_str(c).ok())
        .unwrap_or(Value::Null);
    let Some(seen) = seen.as_object() else {
        return serde_json::Map::new();
    };
    seen.iter()
        .filter(|(key, value)| deployed.get(key.as_str()) != Some(*value))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn drift_is_the_keys_seen_otherwise_with_what_was_seen() {
        let deployed = r#"{"image": "a:1", "memory": 64, "env": {"X": "1"}}"#;
        let seen = json!({"image": "a:2", "memory": 64});
        assert_eq!(
            drifted(Some(deployed), &seen),
            *json!({"image": "a:2"}).as_object().unwrap()
        );
        assert!(drifted(Some(deployed), &json!({"memory": 64})).is_empty());
        assert!(drifted(None, &json!("not an object")).is_empty());
    }

    #[test]
    fn the_worst_health_wins() {
        use ResourceHealth::*;
        assert_eq!(
            ResourceHealth::worst([Healthy, Unknown, Degraded]),
            Degraded
        );
        assert_eq!(ResourceHealth::worst([Healthy, Down, Degraded]), Down);
        assert_eq!(ResourceHealth::worst([Healthy, Unknown]), Unknown);
        assert_eq!(ResourceHealth::worst([]), Unknown);
    }

    #[test]
    fn a_health_event_holds_the_healths_text() {
        for health in ResourceHealth::ALL {
            assert_eq!(EventState::from(health).as_str(), health.as_str());
        }
    }
}
