//! Blueprints and deployments: the deployment engine.
//!
//! - `blueprint` and `template` parse and check blueprints (pure);
//! - `strategy` places replicas on provider nodes (pure);
//! - `plan` turns a deployment into resource nodes with providers and placement;
//! - `executor` runs the DAG (deploy, destroy, rollback, redeploy), journaling
//!   every provider call;
//! - `recovery` replays the journal at start, resumes interrupted work, and runs
//!   the lease reaper.
//!
//! The `Deployments` service owns the `blueprints`, `deployments`,
//! `deployment_nodes`, `journal` and `deployment_events` tables (through
//! `store::deployments`) and talks to providers only through `Providers`.

pub mod blueprint;
mod executor;
mod installations;
mod plan;
mod recovery;
pub mod schedule;
mod settings;
mod step;
pub mod strategy;
pub mod template;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::store::{Db, DbErr};
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::events::Bus;
use crate::provider::{ProviderError, Providers};
use crate::store::deployments as rows;
use crate::text::text_enum;

pub use rows::DeploymentFilter;
pub use settings::{DeployFlags, DeploySettings};

#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error("a stored row is not valid: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Db(DbErr),
}

impl From<DbErr> for DeployError {
    /// A unique or foreign key the store refused is a conflict, not a fault.
    fn from(e: DbErr) -> Self {
        if crate::store::is_conflict(&e) {
            Self::Conflict("the change conflicts with stored data".into())
        } else {
            Self::Db(e)
        }
    }
}

impl From<crate::text::UnknownText> for DeployError {
    fn from(e: crate::text::UnknownText) -> Self {
        DeployError::Corrupt(e.to_string())
    }
}

text_enum! {
    pub enum DeploymentState {
        Pending = "PENDING",
        InProgress = "IN_PROGRESS",
        Complete = "COMPLETE",
        Failed = "FAILED",
        Destroying = "DESTROYING",
        Destroyed = "DESTROYED",
        Suspended = "SUSPENDED",
    }
}

text_enum! {
    pub enum NodeState {
        ToDeploy = "TO_DEPLOY",
        Waiting = "WAITING",
        InProgress = "IN_PROGRESS",
        Complete = "COMPLETE",
        Failed = "FAILED",
        Tainted = "TAINTED",
        ToDestroy = "TO_DESTROY",
        Destroying = "DESTROYING",
        Destroyed = "DESTROYED",
    }
}

text_enum! {
    pub enum OnFailure {
        Rollback = "ROLLBACK",
        Keep = "KEEP",
    }
}

text_enum! {
    pub enum Intent {
        Deploy = "DEPLOY",
        Destroy = "DESTROY",
    }
}

// What the operation under way on a deployment is doing; stored, so a run
// a crash cut short resumes as what it was.
text_enum! {
    pub enum Phase {
        Deploy = "DEPLOY",
        Rollback = "ROLLBACK",
        Destroy = "DESTROY",
    }
}

/// Node states that hold (or are about to hold) a resource: they count
/// against a provider node's capacity.
const LIVE_NODE_STATES: [&str; 6] = [
    "TO_DEPLOY",
    "WAITING",
    "IN_PROGRESS",
    "COMPLETE",
    "TO_DESTROY",
    "DESTROYING",
];

/// Node states a redeploy replaces: those that hold, or may hold, a resource.
const REPLACED: [&str; 2] = ["COMPLETE", "FAILED"];

/// Locks that keep each deployment's events in order: an event's row and its
/// publication happen under its deployment's stripe, so ids grow in the order
/// events are published and committed.
const EVENT_ORDER_STRIPES: usize = 64;

/// How long a request on a settled deployment waits for the run that settled
/// it to let go of its lock.
const SETTLED_LOCK_WAIT: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
pub struct StoredBlueprint {
    pub id: Uuid,
    pub name: String,
    pub description: Option<String>,
    pub source: String,
    pub parsed: blueprint::Blueprint,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Clone, Debug)]
pub struct Deployment {
    pub id: Uuid,
    pub name: String,
    pub blueprint_id: Option<Uuid>,
    pub element_id: Option<Uuid>,
    pub variables: serde_json::Value,
    pub state: DeploymentState,
    /// What the operation under way is doing; `None` once settled.
    pub phase: Option<Phase>,
    pub on_failure: OnFailure,
    pub error: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Clone, Debug)]
pub struct ResourceNode {
    pub id: Uuid,
    pub key: String,
    pub replica: i32,
    pub resource_type: String,
    pub provider_id: Option<Uuid>,
    pub node: Option<String>,
    pub state: NodeState,
    pub outputs: Option<serde_json::Value>,
    pub error: Option<String>,
    pub updated_at: DateTime<Utc>,
}

/// One entry of a deployment's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeploymentEvent {
    pub id: i64,
    pub deployment_id: Uuid,
    pub at: DateTime<Utc>,
    pub kind: EventKind,
    pub node_key: Option<String>,
    pub state: Option<String>,
    pub message: String,
}

text_enum! {
    pub enum EventKind {
        State = "STATE",
        Node = "NODE",
        Progress = "PROGRESS",
        Log = "LOG",
    }
}

pub struct NewDeployment {
    pub blueprint_id: Uuid,
    pub name: String,
    pub variables: serde_json::Map<String, serde_json::Value>,
    pub on_failure: OnFailure,
    pub expires_at: Option<DateTime<Utc>>,
}

#[derive(Clone)]
pub struct Deployments {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    providers: Providers,
    bus: Bus<DeploymentEvent>,
    settings: DeploySettings,
    /// Deployments something is working on in this process: the lock.
    busy: Mutex<HashSet<Uuid>>,
    /// Placement reads counts and writes nodes; one at a time, so two deploys
    /// never both take the last room on a node. Single-node: replicas would
    /// need a database lock here.
    placing: tokio::sync::Mutex<()>,
    /// See [`EVENT_ORDER_STRIPES`].
    event_order: Vec<tokio::sync::Mutex<()>>,
    /// Told whenever a deployment's lock is released.
    released: tokio::sync::Notify,
    tasks: TaskTracker,
    stopping: CancellationToken,
}

/// Holds a deployment's lock; dropping it releases the lock.
struct Lock {
    inner: Arc<Inner>,
    id: Uuid,
}

impl Drop for Lock {
    fn drop(&mut self) {
        self.inner
            .busy
            .lock()
            .expect("the lock set is never poisoned")
            .remove(&self.id);
        self.inner.released.notify_waiters();
    }
}

impl Deployments {
    pub fn new(
        db: Db,
        providers: Providers,
        bus: Bus<DeploymentEvent>,
        settings: DeploySettings,
        stopping: CancellationToken,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                db,
                providers,
                bus,
                settings,
                busy: Mutex::default(),
                placing: tokio::sync::Mutex::new(()),
                event_order: (0..EVENT_ORDER_STRIPES)
                    .map(|_| tokio::sync::Mutex::new(()))
                    .collect(),
                released: tokio::sync::Notify::new(),
                tasks: TaskTracker::new(),
                stopping,
            }),
        }
    }

    fn lock(&self, id: Uuid, doing: &str) -> Result<Lock, DeployError> {
        let mut busy = self
            .inner
            .busy
            .lock()
            .expect("the lock set is never poisoned");
        if !busy.insert(id) {
            return Err(DeployError::Conflict(format!(
                "deployment {id} is busy; it cannot start to {doing} now"
            )));
        }
        Ok(Lock {
            inner: self.inner.clone(),
            id,
        })
    }

    /// The lock, for a request on a deployment in `state`. A run stores its
    /// last state a moment before it lets go of the lock: a deployment that
    /// looks settled is waited for (briefly) rather than refused as busy.
    async fn lock_for_request(
        &self,
        id: Uuid,
        state: DeploymentState,
        doing: &str,
    ) -> Result<Lock, DeployError> {
        let settled = matches!(
            state,
            DeploymentState::Complete | DeploymentState::Failed | DeploymentState::Destroyed
        );
        let deadline = tokio::time::Instant::now() + SETTLED_LOCK_WAIT;
        loop {
            let released = self.inner.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            match self.lock(id, doing) {
                Ok(lock) => return Ok(lock),
                Err(busy) if !settled || tokio::time::Instant::now() >= deadline => {
                    return Err(busy);
                }
                Err(_) => {
                    let _ = tokio::time::timeout_at(deadline, released).await;
                }
            }
        }
    }

    // ---- blueprints ----

    pub async fn create_blueprint(
        &self,
        name: String,
        description: Option<String>,
        source: String,
    ) -> Result<StoredBlueprint, DeployError> {
        check_name(&name)?;
        parse_checked(&source)?;
        let row = rows::insert_blueprint(&self.inner.db, name.clone(), description, source)
            .await
            .map_err(|e| conflict_or(e, || format!("a blueprint named `{name}` exists")))?;
        to_blueprint(row)
    }

    pub async fn update_blueprint(
        &self,
        id: Uuid,
        name: Option<String>,
        description: Option<String>,
        source: Option<String>,
    ) -> Result<StoredBlueprint, DeployError> {
        let row = self.blueprint_row(id).await?;
        if let Some(name) = &name {
            check_name(name)?;
        }
        if let Some(source) = &source {
            parse_checked(source)?;
        }
        let change = rows::BlueprintChange {
            name,
            description,
            source,
        };
        let row = rows::update_blueprint(&self.inner.db, row, change)
            .await
            .map_err(|e| conflict_or(e, || "another blueprint has that name".to_owned()))?;
        to_blueprint(row)
    }

    pub async fn delete_blueprint(&self, id: Uuid) -> Result<(), DeployError> {
        let row = self.blueprint_row(id).await?;
        let live =
            rows::count_live_deployments(&self.inner.db, id, DeploymentState::Destroyed.as_str())
                .await?;
        if live > 0 {
            return Err(DeployError::Conflict(format!(
                "blueprint `{}` is used by {live} deployment(s) that are not destroyed",
                row.name
            )));
        }
        rows::delete_blueprint(&self.inner.db, id).await?;
        Ok(())
    }

    pub async fn blueprint(&self, id: Uuid) -> Result<StoredBlueprint, DeployError> {
        to_blueprint(self.blueprint_row(id).await?)
    }

    pub async fn blueprints(&self) -> Result<Vec<StoredBlueprint>, DeployError> {
        rows::list_blueprints(&self.inner.db)
            .await?
            .into_iter()
            .map(to_blueprint)
            .collect()
    }

    /// Resource types of the blueprint that no provider serves: a warning until
    /// deploy, an error then.
    pub async fn warnings(&self, blueprint: &blueprint::Blueprint) -> Vec<String> {
        let mut warnings = Vec::new();
        for resource in &blueprint.resources {
            if let Err(e) = self
                .inner
                .providers
                .for_resource_type(&resource.resource_type, resource.provider.as_deref())
                .await
            {
                warnings.push(format!("resources.{}.type: {e}", resource.key));
            }
        }
        warnings
    }

    async fn blueprint_row(&self, id: Uuid) -> Result<rows::BlueprintRow, DeployError> {
        rows::find_blueprint(&self.inner.db, id)
            .await?
            .ok_or_else(|| DeployError::NotFound(format!("no blueprint with id {id}")))
    }

    // ---- deployments ----

    /// Creates the deployment and starts deploying it in the background.
    pub async fn deploy(&self, new: NewDeployment) -> Result<Deployment, DeployError> {
        check_name(&new.name)?;
        let blueprint = self.blueprint(new.blueprint_id).await?;
        let variables = blueprint::bind(&blueprint.parsed, &new.variables)
            .map_err(|p| DeployError::Invalid(p.to_string()))?;
        let row = rows::insert_deployment(
            &self.inner.db,
            rows::NewDeployment {
                name: new.name,
                blueprint_id: Some(blueprint.id),
                element_id: None,
                source: blueprint.source,
                variables: serde_json::to_string(&variables)
                    .map_err(|e| DeployError::Invalid(format!("variables: {e}")))?,
                on_failure: new.on_failure.as_str().to_owned(),
                expires_at: new.expires_at,
            },
            DeploymentState::Pending.as_str(),
            Phase::Deploy.as_str(),
        )
        .await?;
        let lock = self.lock(row.id, "deploy")?;
        self.spawn_deploy(lock);
        to_deployment(row)
    }

    pub async fn destroy(&self, id: Uuid) -> Result<Deployment, DeployError> {
        let deployment = self.get(id).await?;
        if deployment.state == DeploymentState::Destroyed {
            return Err(DeployError::Conflict(format!(
                "deployment `{}` is already destroyed",
                deployment.name
            )));
        }
        let lock = self
            .lock_for_request(id, deployment.state, "destroy")
            .await?;
        self.change(
            id,
            DeploymentState::Destroying,
            Some(Phase::Destroy),
            None,
            Some(Uuid::now_v7()),
        )
        .await?;
        let this = self.clone();
        self.inner.tasks.spawn(async move {
            this.run_destroy(&lock).await;
        });
        self.get(id).await
    }

    /// Destroys the named resources and everything that depends on them, then
    /// deploys them again.
    pub async fn redeploy(&self, id: Uuid, keys: Vec<String>) -> Result<Deployment, DeployError> {
        let deployment = self.get(id).await?;
        if matches!(
            deployment.state,
            DeploymentState::Destroyed | DeploymentState::Destroying
        ) {
            return Err(DeployError::Conflict(format!(
                "deployment `{}` is {}; deploy the blueprint again instead",
                deployment.name,
                deployment.state.as_str()
            )));
        }
        let parsed = self.parsed(id).await?;
        if keys.is_empty() {
            return Err(DeployError::Invalid(
                "resourceKeys: name at least one".into(),
            ));
        }
        for key in &keys {
            if parsed.resource(key).is_none() {
                return Err(DeployError::Invalid(format!(
                    "resourceKeys: `{key}` is not a resource of this deployment"
                )));
            }
        }
        let lock = self
            .lock_for_request(id, deployment.state, "redeploy")
            .await?;
        // The keys' nodes are marked in the same transaction as the new
        // operation: a crash from here on resumes the redeploy.
        rows::begin_redeploy(
            &self.inner.db,
            id,
            rows::DeploymentChange {
                state: DeploymentState::InProgress.as_str(),
                phase: Some(Phase::Deploy.as_str()),
                error: None,
                operation_id: Some(Uuid::now_v7()),
            },
            &keys,
            &REPLACED,
            NodeState::ToDestroy.as_str(),
        )
        .await?;
        self.record(
            id,
            EventKind::State,
            None,
            Some(DeploymentState::InProgress.as_str()),
            format!("redeploying {}", keys.join(", ")),
        )
        .await;
        self.spawn_deploy(lock);
        self.get(id).await
    }

    pub async fn extend(
        &self,
        id: Uuid,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<Deployment, DeployError> {
        self.get(id).await?;
        rows::set_expiry(&self.inner.db, id, expires_at).await?;
        self.get(id).await
    }

    pub async fn get(&self, id: Uuid) -> Result<Deployment, DeployError> {
        let row = rows::find_deployment(&self.inner.db, id)
            .await?
            .ok_or_else(|| DeployError::NotFound(format!("no deployment with id {id}")))?;
        to_deployment(row)
    }

    pub async fn list(
        &self,
        filter: &DeploymentFilter,
        offset: u64,
        limit: u64,
    ) -> Result<(Vec<Deployment>, u64), DeployError> {
        let (found, total) = rows::list_deployments(&self.inner.db, filter, offset, limit).await?;
        Ok((
            found
                .into_iter()
                .map(to_deployment)
                .collect::<Result<_, _>>()?,
            total,
        ))
    }

    pub async fn nodes(&self, id: Uuid) -> Result<Vec<ResourceNode>, DeployError> {
        rows::nodes_of(&self.inner.db, id)
            .await?
            .into_iter()
            .map(to_node)
            .collect()
    }

    /// The history, oldest first (at most `limit` entries).
    /// Every deployment's events as they are stored.
    pub fn events(&self) -> &Bus<DeploymentEvent> {
        &self.inner.bus
    }

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
        rows::events_of(&self.inner.db, id, after, limit)
            .await?
            .into_iter()
            .map(to_event)
            .collect()
    }

    /// Entries left in the journal: work in flight (or a crash's leftovers).
    pub async fn journal_len(&self) -> Result<u64, DeployError> {
        Ok(rows::journal_len(&self.inner.db).await?)
    }

    /// Waits for background work at shutdown (each run stops at a journal
    /// boundary: no new provider call starts once stopping).
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.tasks.close();
        if tokio::time::timeout(grace, self.inner.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("deployment work still running at shutdown");
        }
    }

    async fn parsed(&self, id: Uuid) -> Result<blueprint::Blueprint, DeployError> {
        let row = rows::find_deployment(&self.inner.db, id)
            .await?
            .ok_or_else(|| DeployError::NotFound(format!("no deployment with id {id}")))?;
        blueprint::parse(&row.source).map_err(|p| DeployError::Corrupt(p.to_string()))
    }

    fn spawn_deploy(&self, lock: Lock) {
        let this = self.clone();
        self.inner.tasks.spawn(async move {
            this.run_deploy(&lock).await;
        });
    }

    /// Records the deployment's state, phase and error (and a new operation),
    /// with an event.
    async fn change(
        &self,
        id: Uuid,
        state: DeploymentState,
        phase: Option<Phase>,
        error: Option<&str>,
        operation_id: Option<Uuid>,
    ) -> Result<(), DeployError> {
        rows::change_deployment(
            &self.inner.db,
            id,
            rows::DeploymentChange {
                state: state.as_str(),
                phase: phase.map(Phase::as_str),
                error,
                operation_id,
            },
        )
        .await?;
        let message = match error {
            Some(e) => format!("deployment {}: {e}", state.as_str()),
            None => format!("deployment {}", state.as_str()),
        };
        self.record(id, EventKind::State, None, Some(state.as_str()), message)
            .await;
        Ok(())
    }

    /// Ends an operation: the deployment settles in `state`.
    async fn settle(
        &self,
        id: Uuid,
        state: DeploymentState,
        error: Option<&str>,
    ) -> Result<(), DeployError> {
        self.change(id, state, None, error, None).await
    }

    /// Holds the stripe that orders `id`'s events while one is stored and
    /// published.
    async fn event_order(&self, id: Uuid) -> tokio::sync::MutexGuard<'_, ()> {
        let stripe = (id.as_u128() % EVENT_ORDER_STRIPES as u128) as usize;
        self.inner.event_order[stripe].lock().await
    }

    /// Stores an event in the history and publishes it. A failure to store is
    /// logged: the work it describes has already happened.
    async fn record(
        &self,
        id: Uuid,
        kind: EventKind,
        node_key: Option<&str>,
        state: Option<&str>,
        message: String,
    ) {
        let event = rows::NewEvent {
            kind: kind.as_str().to_owned(),
            node_key: node_key.map(str::to_owned),
            state: state.map(str::to_owned),
            message,
        };
        let _order = self.event_order(id).await;
        match rows::insert_event(&self.inner.db, id, event).await {
            Ok(row) => self.publish(row),
            Err(e) => {
                tracing::error!(deployment.id = %id, error = %e, "cannot store a deployment event")
            }
        }
    }

    /// Publishes an event already stored.
    fn publish(&self, row: rows::EventRow) {
        let id = row.deployment_id;
        match to_event(row) {
            Ok(event) => self.inner.bus.publish(event),
            Err(e) => tracing::error!(deployment.id = %id, error = %e, "bad event row"),
        }
    }
}

fn check_name(name: &str) -> Result<(), DeployError> {
    if name.trim().is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(DeployError::Invalid(format!(
            "name: `{name}` must be 1 to 128 printable characters"
        )));
    }
    Ok(())
}

/// Parses and checks a blueprint; every problem is named at once.
fn parse_checked(source: &str) -> Result<blueprint::Blueprint, DeployError> {
    let parsed = blueprint::parse(source).map_err(|p| DeployError::Invalid(p.to_string()))?;
    let problems = blueprint::check(&parsed);
    if problems.is_empty() {
        Ok(parsed)
    } else {
        Err(DeployError::Invalid(
            blueprint::Problems(problems).to_string(),
        ))
    }
}

fn to_blueprint(row: rows::BlueprintRow) -> Result<StoredBlueprint, DeployError> {
    let parsed = blueprint::parse(&row.source).map_err(|p| DeployError::Corrupt(p.to_string()))?;
    Ok(StoredBlueprint {
        id: row.id,
        name: row.name,
        description: row.description,
        source: row.source,
        parsed,
        created_at: row.created_at,
        updated_at: row.updated_at,
    })
}

fn to_deployment(row: rows::DeploymentRow) -> Result<Deployment, DeployError> {
    Ok(Deployment {
        id: row.id,
        name: row.name,
        blueprint_id: row.blueprint_id,
        element_id: row.element_id,
        variables: serde_json::from_str(&row.variables)
            .map_err(|e| DeployError::Corrupt(format!("deployment variables: {e}")))?,
        state: row.state.parse()?,
        phase: row.phase.as_deref().map(str::parse).transpose()?,
        on_failure: row.on_failure.parse()?,
        error: row.error,
        expires_at: row.expires_at,
        created_at: row.created_at,
        updated_at: row.updated_at,
    })
}

fn to_node(row: rows::NodeRow) -> Result<ResourceNode, DeployError> {
    Ok(ResourceNode {
        id: row.id,
        key: row.key,
        replica: row.replica,
        resource_type: row.resource_type,
        provider_id: row.provider_id,
        node: row.node,
        state: row.state.parse()?,
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

fn to_event(row: rows::EventRow) -> Result<DeploymentEvent, DeployError> {
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

fn conflict_or(e: DbErr, message: impl FnOnce() -> String) -> DeployError {
    if crate::store::is_conflict(&e) {
        DeployError::Conflict(message())
    } else {
        DeployError::Db(e)
    }
}
