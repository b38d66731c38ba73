//! Blueprints and deployments: the deployment engine. This file is the map:
//! the shared types, and the [`Deployments`] handle that gives each part.
//!
//! - [`blueprints`] — `Blueprints`: create, update, delete, read blueprints;
//! - [`queries`] — `Queries`: reads of deployments, nodes, history, journal;
//! - [`runs`] — `Runs`: starts runs (deploy, destroy, redeploy), takes the
//!   run lock, a deployment's state changes and its events;
//! - [`lock`] — `Lock`: the per-deployment run lock;
//! - [`executor`] — `Executor`: runs a run's DAG to its end (phases, rollback);
//! - [`step`] — `Steps`: one journaled provider call for one node;
//! - [`describe`] — a blueprint as its providers describe it;
//! - [`plan`] — `Planner`: providers and placement of a deployment's nodes;
//! - [`quotas`] — what a project may use: `maxResources`, named quotas,
//!   `maxLeaseSeconds`;
//! - [`plans`] — `Plans`: plan a change, apply it, revisions and rollback
//!   (what a plan does is computed by the pure [`changes`]);
//! - [`recovery`] — `Recovery`: journal settling, resuming after a restart,
//!   the lease (extend, the reaper);
//! - [`installations`] — the repository area's `Installations` port;
//! - `blueprint`, `template`, `schedule`, `strategy` — pure: parse and check
//!   blueprints, render configs, order the DAG, place replicas.
//!
//! The engine owns the `blueprints`, `deployments`, `deployment_nodes`,
//! `journal` and `deployment_events` tables (through `store::deployments`) and
//! talks to providers only through `Providers`.

pub mod blueprint;
mod blueprints;
pub mod changes;
mod describe;
mod executor;
mod health;
mod installations;
mod lock;
mod plan;
mod plans;
mod power;
mod queries;
mod quotas;
mod recovery;
mod runs;
pub mod schedule;
mod settings;
mod step;
pub mod strategy;
pub mod template;
mod writer;

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

pub use blueprints::{Blueprints, parse_checked, parse_checked_until};
pub use health::{Health, NodeHealth, ResourceHealth, node_health};
pub use plan::Planner;
pub use plans::{Ask, PlanState, Plans, Revision, StoredPlan};
pub use power::{MAX_LOG_LINES, Power};
pub use queries::{Queries, events_between, last_event_id};
pub use recovery::Recovery;
pub use rows::DeploymentFilter;
pub use runs::Runs;
pub use settings::{DeployFlags, DeploySettings};

/// A blueprint problem and the 1-based line of the source it points at
/// (`None` for the document as a whole, or where the source ends first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocatedProblem {
    pub problem: blueprint::Problem,
    pub line: Option<usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error("{0}")]
    Invalid(String),
    /// A blueprint that does not parse or check: every problem, each with the
    /// line of the source it points at.
    #[error("{}", blueprint::Problems(.0.iter().map(|p| p.problem.clone()).collect()))]
    Blueprint(Vec<LocatedProblem>),
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

/// The deployment and node states, as their columns hold them: the store
/// owns them (see `store::states`).
pub use crate::store::states::{DeploymentState, EventState, NodeState};

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
        Update = "UPDATE",
    }
}

// What the operation under way on a deployment is doing; stored, so a run
// a crash cut short resumes as what it was.
text_enum! {
    pub enum Phase {
        Deploy = "DEPLOY",
        Rollback = "ROLLBACK",
        Destroy = "DESTROY",
        /// Applying a plan (`applyPlan`): the operation's id is the plan's.
        Apply = "APPLY",
        /// Restarting resources (healing, or `restartResource`): the nodes
        /// marked, destroyed and deployed again; never rolled back.
        Restart = "RESTART",
    }
}

/// Node states that hold (or are about to hold) a resource: they count
/// against a provider node's capacity.
const LIVE_NODE_STATES: [NodeState; 11] = [
    NodeState::ToDeploy,
    NodeState::Waiting,
    NodeState::InProgress,
    NodeState::Complete,
    NodeState::Suspended,
    NodeState::ToDestroy,
    NodeState::Destroying,
    NodeState::ToUpdate,
    NodeState::Updating,
    NodeState::ToRetire,
    NodeState::Retiring,
];

/// Node states of a resource an apply is retiring, or has retired: no deploy
/// takes them up again.
const RETIRING: [NodeState; 3] = [NodeState::ToRetire, NodeState::Retiring, NodeState::Retired];

const REPLACED: [NodeState; 3] = [NodeState::Complete, NodeState::Suspended, NodeState::Failed];

/// Node states of a deployed resource: a deploy leaves them as they are.
const DEPLOYED: [NodeState; 2] = [NodeState::Complete, NodeState::Suspended];

#[derive(Clone, Debug)]
pub struct StoredBlueprint {
    pub id: Uuid,
    pub name: String,
    pub description: Option<String>,
    pub source: String,
    pub parsed: blueprint::Blueprint,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The project it belongs to.
    pub project_id: Option<Uuid>,
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
    /// The project it belongs to (its blueprint's; `platform` for an
    /// element's installation).
    pub project_id: Option<Uuid>,
    /// Its deployed nodes' health, worst first.
    pub health: ResourceHealth,
    pub health_changed_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug)]
pub struct ResourceNode {
    pub id: Uuid,
    pub deployment_id: Uuid,
    pub key: String,
    pub replica: i32,
    pub resource_type: String,
    pub provider_id: Option<Uuid>,
    pub node: Option<String>,
    pub state: NodeState,
    pub outputs: Option<serde_json::Value>,
    pub error: Option<String>,
    pub updated_at: DateTime<Utc>,
    pub health: NodeHealth,
}

/// One entry of a deployment's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeploymentEvent {
    pub id: i64,
    pub deployment_id: Uuid,
    pub at: DateTime<Utc>,
    pub kind: EventKind,
    pub node_key: Option<String>,
    /// A deployment's state (a `STATE` event) or a node's (`NODE`).
    pub state: Option<EventState>,
    pub message: String,
}

text_enum! {
    pub enum EventKind {
        State = "STATE",
        Node = "NODE",
        Progress = "PROGRESS",
        Log = "LOG",
        /// A node's health changed (with its key), or the deployment's
        /// roll-up (without).
        Health = "HEALTH",
    }
}

pub struct NewDeployment {
    pub blueprint_id: Uuid,
    pub name: String,
    pub variables: serde_json::Map<String, serde_json::Value>,
    pub on_failure: OnFailure,
    pub expires_at: Option<DateTime<Utc>>,
}

/// How a node is named in events and messages: `web[0]`.
pub(crate) fn node_label(node: &rows::NodeRow) -> String {
    format!("{}[{}]", node.key, node.replica)
}

/// The engine: cheap to clone (one `Arc`); each part is a borrowed view of it.
#[derive(Clone)]
pub struct Deployments {
    inner: Arc<Inner>,
}

/// What the parts share.
struct Inner {
    db: Db,
    providers: Providers,
    bus: Bus<DeploymentEvent>,
    settings: DeploySettings,
    /// Deployments something is working on in this process: the run lock
    /// (see [`lock`]).
    busy: Mutex<HashSet<Uuid>>,
    /// Placement reads counts and writes nodes; one at a time, so two deploys
    /// never both take the last room on a node. Replicas place only on the
    /// leader (standbys forward), and a leader's writes are fenced by its
    /// lease, so this process-wide lock is the whole of it.
    placing: tokio::sync::Mutex<()>,
    /// The journal's and the events' writes, committed in groups.
    writer: writer::Writer,
    /// Told whenever a deployment's lock is released.
    released: tokio::sync::Notify,
    /// The blueprint copies read last, parsed (see [`queries`]).
    parsed: queries::ParsedCopies,
    /// The health part's gauges and pending roll-ups.
    health: health::HealthState,
    tasks: TaskTracker,
    stopping: CancellationToken,
}

impl Deployments {
    pub fn new(
        db: Db,
        providers: Providers,
        bus: Bus<DeploymentEvent>,
        settings: DeploySettings,
        stopping: CancellationToken,
    ) -> Self {
        Self::fenced(db, providers, bus, settings, stopping, None)
    }

    /// As [`Self::new`], for a replica leading under `fence`: the engine's
    /// writes are refused once the lease is not held any more.
    pub fn fenced(
        db: Db,
        providers: Providers,
        bus: Bus<DeploymentEvent>,
        settings: DeploySettings,
        stopping: CancellationToken,
        fence: Option<crate::store::cluster::Fence>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                writer: writer::Writer::spawn(db.clone(), bus.clone(), fence),
                db,
                providers,
                bus,
                settings,
                busy: Mutex::default(),
                placing: tokio::sync::Mutex::new(()),
                released: tokio::sync::Notify::new(),
                parsed: queries::ParsedCopies::default(),
                health: health::HealthState::default(),
                tasks: TaskTracker::new(),
                stopping,
            }),
        }
    }

    /// Blueprints: create, update, delete, read.
    pub fn blueprints(&self) -> Blueprints<'_> {
        Blueprints(self)
    }

    /// Reads of deployments, their nodes and history.
    pub fn queries(&self) -> Queries<'_> {
        Queries(self)
    }

    /// Starting runs: deploy, destroy, redeploy.
    pub fn runs(&self) -> Runs<'_> {
        Runs(self)
    }

    /// Plans, applies, revisions and rollback.
    pub fn plans(&self) -> Plans<'_> {
        Plans(self)
    }

    /// Planning and placement.
    pub fn planner(&self) -> Planner<'_> {
        Planner(self)
    }

    /// Power actions on deployed resources, and their logs.
    pub fn power(&self) -> Power<'_> {
        Power(self)
    }

    /// Recovery at start and the lease.
    pub fn recovery(&self) -> Recovery<'_> {
        Recovery(self)
    }

    /// Live health: observed, rolled up, healed.
    pub fn health(&self) -> Health<'_> {
        Health(self)
    }

    fn healer(&self) -> health::Healer<'_> {
        health::Healer(self)
    }

    fn executor(&self) -> executor::Executor<'_> {
        executor::Executor(self)
    }

    fn steps(&self) -> step::Steps<'_> {
        step::Steps(self)
    }

    /// Every deployment's events as they are stored.
    pub fn events(&self) -> &Bus<DeploymentEvent> {
        &self.inner.bus
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
}
