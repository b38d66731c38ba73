//! One step: one provider call for one resource node, journaled.
//!
//! [`Steps::journaled_call`] owns both writes around the call: before it,
//! the node's new state, the journal entry and the event, durable before the
//! call is made; after it, the result, the entry's end and the event, returned
//! as a [`Write`] for the caller to queue. The executor queues a deploy's
//! result in one send with the entries of the dependents it lets start
//! ([`Steps::begin_deploy`], handed back as a [`Begun`]), so one commit
//! serves a chain's link; a dependent's call still starts only once its
//! entry is durable, and the result it follows commits with it or before. A call whose outcome is lost
//! (the provider went away or hung past the deadline) is made again once the
//! provider is back: `DeployResource` and `DestroyResource` are idempotent per
//! resource id (the protocol's contract), so a retry settles whatever the lost
//! call did. Retries are bounded and announced in the deployment's events. A
//! call given up on keeps its journal entry, and `recovery` settles it when
//! the provider returns.
//!
//! Never decides what runs next (that is `executor`'s schedule) nor touches
//! a deployment's own state.

use std::fmt;
use std::ops::ControlFlow;

use serde_json::Value;
use uuid::Uuid;

use super::writer::{Committed, Write};
use super::{Deployments, EventKind, Intent, NodeState, node_label};
use crate::provider::{ProviderError, ProviderStatus, ResourceCall, ResourceProgress};
use crate::store::deployments::{self as rows, NodeChange, NodeRow};

/// Tries of a deploy call before it fails: the first and two retries.
const DEPLOY_ATTEMPTS: u32 = 3;
/// Tries of a destroy call: a rollback or destroy aimed at a provider that is
/// restarting or hung keeps trying longer than a deploy.
const DESTROY_ATTEMPTS: u32 = 6;

/// Why a step did not succeed.
#[derive(Debug)]
pub(super) enum StepError {
    /// The provider answered: the work itself failed.
    Failed(String),
    /// The provider could not be reached, or the call's outcome was lost,
    /// every time it was tried; `away` names the provider when, at the last
    /// try, it was not connected (not merely slow to answer).
    Unavailable { error: String, away: Option<Uuid> },
    /// The node cannot be called: no provider, a config that does not render.
    Invalid(String),
    /// Corbel could not store what happened.
    Store(String),
    /// The server is stopping: the call was not made, or its outcome is left
    /// in the journal for the next start.
    Stopping,
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepError::Failed(m)
            | StepError::Unavailable { error: m, .. }
            | StepError::Invalid(m)
            | StepError::Store(m) => f.write_str(m),
            StepError::Stopping => f.write_str("the server is stopping"),
        }
    }
}

/// A provider that is not connected: why, and whether it may come back on
/// its own (loading, restarting) or not (failed, unloaded).
struct NotReady {
    message: String,
    coming: bool,
}

/// The call a step makes.
enum Call {
    Deploy {
        config: Value,
        dependency_outputs: Vec<(String, Value)>,
        operation: Uuid,
    },
    Destroy,
    /// An apply's in-place update to `config` (the node keeps its old one
    /// until the update succeeds).
    Update {
        config: Value,
        dependency_outputs: Vec<(String, Value)>,
        operation: Uuid,
    },
}

impl Call {
    fn intent(&self) -> Intent {
        match self {
            Call::Deploy { .. } => Intent::Deploy,
            Call::Destroy => Intent::Destroy,
            Call::Update { .. } => Intent::Update,
        }
    }
}

/// A call's journal entry, queued by the caller; the step waits for it to
/// be durable before making the call.
pub(super) struct Begun {
    pub(super) entry: Uuid,
    pub(super) committed: Committed,
}

/// The steps part of [`Deployments`].
#[derive(Clone, Copy)]
pub(super) struct Steps<'a>(pub(super) &'a Deployments);

impl Steps<'_> {
    /// Deploys one node; returns its outputs, and the write of its result for
    /// the caller to queue. `begun` is the call's entry when the caller
    /// queued it (see [`Steps::begin_deploy`]); else the step writes it.
    pub(super) async fn deploy_node(
        &self,
        node: NodeRow,
        config: Value,
        dependency_outputs: Vec<(String, Value)>,
        operation: Uuid,
        begun: Option<Begun>,
    ) -> Result<(Value, Write), StepError> {
        let Some(provider) = node.provider_id else {
            let error = "no provider was chosen for it".to_owned();
            self.fail_node(&node, &error).await;
            return Err(StepError::Invalid(error));
        };
        let call = Call::Deploy {
            config,
            dependency_outputs,
            operation,
        };
        self.journaled_call(&node, provider, call, begun).await
    }

    /// Updates one node's resource in place to `config` (an apply's);
    /// returns its new outputs, and the write of its result.
    pub(super) async fn update_node(
        &self,
        node: NodeRow,
        config: Value,
        dependency_outputs: Vec<(String, Value)>,
        operation: Uuid,
    ) -> Result<(Value, Write), StepError> {
        let Some(provider) = node.provider_id else {
            let error = "no provider was chosen for it".to_owned();
            self.fail_node(&node, &error).await;
            return Err(StepError::Invalid(error));
        };
        let call = Call::Update {
            config,
            dependency_outputs,
            operation,
        };
        self.journaled_call(&node, provider, call, None).await
    }

    /// Destroys one node's resource; returns the write of its result for
    /// the caller to queue. `begun` is the call's entry when the caller
    /// queued it (see [`Steps::begin_destroy`]). A node that never reached
    /// its provider is simply marked destroyed (or retired), at once.
    pub(super) async fn destroy_node(
        &self,
        node: NodeRow,
        begun: Option<Begun>,
    ) -> Result<Option<Write>, StepError> {
        match destroy_call(&node) {
            Some(provider) => {
                let (_, finish) = self
                    .journaled_call(&node, provider, Call::Destroy, begun)
                    .await?;
                Ok(Some(finish))
            }
            None => rows::change_node(&self.0.inner.db, node.id, gone(&node).0)
                .await
                .map(|()| None)
                .map_err(|e| StepError::Store(format!("cannot store the node: {e}"))),
        }
    }

    /// The write that journals a destroy call, for the caller to queue with
    /// others: its entry goes to [`Steps::destroy_node`] as a [`Begun`].
    /// `ahead` for a step that will wait for a permit, as for a deploy.
    pub(super) fn begin_destroy(
        &self,
        node: &NodeRow,
        provider: Uuid,
        ahead: bool,
    ) -> (Uuid, Write, Option<Write>) {
        self.begin_split(node, provider, &Call::Destroy, ahead)
    }

    /// Makes one call, journaled, retrying a lost outcome once the provider
    /// is back.
    async fn journaled_call(
        &self,
        node: &NodeRow,
        provider: Uuid,
        call: Call,
        mut begun: Option<Begun>,
    ) -> Result<(Value, Write), StepError> {
        let intent = call.intent();
        let attempts = match intent {
            Intent::Deploy | Intent::Update => DEPLOY_ATTEMPTS,
            Intent::Destroy => DESTROY_ATTEMPTS,
        };
        let mut entry: Option<Uuid> = None;
        let mut attempt = 1;
        loop {
            if self.0.inner.stopping.is_cancelled() {
                return Err(StepError::Stopping);
            }
            let tried = self
                .try_once(node, provider, &call, begun.take(), &mut entry)
                .await?;
            let (error, away) = match tried {
                ControlFlow::Break(done) => return Ok(done),
                ControlFlow::Continue(lost) => lost,
            };
            if attempt >= attempts {
                let away = away.then_some(provider);
                return Err(self.give_up(node, away, entry, error).await);
            }
            if self.0.inner.stopping.is_cancelled() {
                return Err(StepError::Stopping);
            }
            attempt += 1;
            self.0
                .runs()
                .record(
                    node.deployment_id,
                    EventKind::Log,
                    Some(&node_label(node)),
                    None,
                    format!("{error}; trying again (attempt {attempt} of {attempts})"),
                )
                .await;
        }
    }

    /// One try of a call: once its queued entry (`begun`) is durable, or its
    /// provider is ready, journals the call (unless `entry` is written
    /// already) and makes it. Breaks with the call's outputs and the write
    /// of its result; continues with why it may be tried again, and whether
    /// the provider was away (not connected, or its link found dead).
    async fn try_once(
        &self,
        node: &NodeRow,
        provider: Uuid,
        call: &Call,
        begun: Option<Begun>,
        entry: &mut Option<Uuid>,
    ) -> Result<ControlFlow<(Value, Write), (String, bool)>, StepError> {
        let intent = call.intent();
        // An entry the caller queued: the provider was connected then.
        let ready = match begun {
            Some(Begun {
                entry: queued,
                committed,
            }) => {
                committed
                    .wait()
                    .await
                    .map_err(|e| StepError::Store(format!("cannot journal the call: {e}")))?;
                *entry = Some(queued);
                Ok(())
            }
            None => self.provider_ready(provider).await,
        };
        match ready {
            Err(_) if self.0.inner.stopping.is_cancelled() => Err(StepError::Stopping),
            Err(not_ready) if !not_ready.coming => Err(self
                .give_up(node, Some(provider), *entry, not_ready.message)
                .await),
            Err(not_ready) => Ok(ControlFlow::Continue((not_ready.message, true))),
            Ok(()) => {
                let entry = match *entry {
                    Some(entry) => entry,
                    None => *entry.insert(self.begin(node, provider, call).await?),
                };
                match self.call_provider(node, provider, call).await {
                    Ok(outputs) => {
                        let finish = self.finish(node, entry, call, &outputs);
                        crate::telemetry::record_deploy_step(intent.as_str(), "complete");
                        Ok(ControlFlow::Break((outputs, finish)))
                    }
                    Err(ProviderError::Failed { message, .. }) => {
                        self.finish_failed(node, entry, &message).await;
                        crate::telemetry::record_deploy_step(intent.as_str(), "failed");
                        Err(StepError::Failed(message))
                    }
                    Err(lost) => {
                        crate::telemetry::record_deploy_step(intent.as_str(), "lost");
                        // A dead link is dropped now: the next try waits
                        // for the provider's next registration.
                        let providers = &self.0.inner.providers;
                        providers.check_after_loss(provider).await;
                        let away = !providers.is_connected(provider);
                        let error = format!("{} lost: {lost}", call_name(intent));
                        Ok(ControlFlow::Continue((error, away)))
                    }
                }
            }
        }
    }

    /// Gives up on a call: the node says why. An entry left in the journal
    /// (the outcome is unknown) is settled once the provider is back.
    async fn give_up(
        &self,
        node: &NodeRow,
        away: Option<Uuid>,
        entry: Option<Uuid>,
        error: String,
    ) -> StepError {
        self.fail_node(node, &error).await;
        if entry.is_some() {
            self.0.recovery().settle_later(node.deployment_id);
        }
        StepError::Unavailable { error, away }
    }

    /// The transaction before a call.
    async fn begin(&self, node: &NodeRow, provider: Uuid, call: &Call) -> Result<Uuid, StepError> {
        let (entry, write) = self.begin_write(node, provider, call);
        self.0
            .inner
            .writer
            .write(write)
            .await
            .map_err(|e| StepError::Store(format!("cannot journal the call: {e}")))?;
        Ok(entry)
    }

    /// The write that journals a deploy call, for the caller to queue with
    /// others: its entry goes to [`Steps::deploy_node`] as a [`Begun`].
    /// `ahead` for a step that will wait for a permit (see `begin_split`).
    pub(super) fn begin_deploy(
        &self,
        node: &NodeRow,
        provider: Uuid,
        config: Value,
        operation: Uuid,
        ahead: bool,
    ) -> (Uuid, Write, Option<Write>) {
        let call = Call::Deploy {
            config,
            dependency_outputs: Vec::new(),
            operation,
        };
        self.begin_split(node, provider, &call, ahead)
    }

    /// The node's change, the journal entry and the event before a call.
    fn begin_write(&self, node: &NodeRow, provider: Uuid, call: &Call) -> (Uuid, Write) {
        let (entry, write, _) = self.begin_split(node, provider, call, false);
        (entry, write)
    }

    /// The journal entry before a call, with the node's change and its
    /// event; or, `ahead` of the call (the step waits for a permit), the
    /// entry alone and the node's change as a write of its own, queued once
    /// the call starts: until then the node keeps its state (`TO_DEPLOY`,
    /// `COMPLETE` before a destroy), so only the calls in flight show
    /// `IN_PROGRESS` or `DESTROYING`.
    fn begin_split(
        &self,
        node: &NodeRow,
        provider: Uuid,
        call: &Call,
        ahead: bool,
    ) -> (Uuid, Write, Option<Write>) {
        let (change, state, message) = match call {
            Call::Deploy {
                config, operation, ..
            } => (
                NodeChange {
                    config: Some(config.to_string()),
                    error: Some(None),
                    run_id: Some(Some(*operation)),
                    ..NodeChange::to(NodeState::InProgress)
                },
                NodeState::InProgress,
                "deploying",
            ),
            Call::Destroy if is_retiring(node) => (
                NodeChange::to(NodeState::Retiring),
                NodeState::Retiring,
                "retiring",
            ),
            Call::Destroy => (
                NodeChange::to(NodeState::Destroying),
                NodeState::Destroying,
                "destroying",
            ),
            Call::Update { operation, .. } => (
                NodeChange {
                    error: Some(None),
                    run_id: Some(Some(*operation)),
                    ..NodeChange::to(NodeState::Updating)
                },
                NodeState::Updating,
                "updating in place",
            ),
        };
        let event = node_change_event(node, state, message);
        let entry = Uuid::now_v7();
        let mut call = rows::CallStart {
            entry,
            deployment_id: node.deployment_id,
            node_id: node.id,
            provider_id: provider,
            intent: call.intent().as_str().to_owned(),
            change: None,
        };
        if ahead {
            let start = Write::Node {
                deployment: node.deployment_id,
                node: node.id,
                change,
                event,
            };
            (entry, Write::Begin { call, event: None }, Some(start))
        } else {
            call.change = Some(change);
            let write = Write::Begin {
                call,
                event: Some(event),
            };
            (entry, write, None)
        }
    }

    /// The write after a call that succeeded, for the caller to queue.
    fn finish(&self, node: &NodeRow, entry: Uuid, call: &Call, outputs: &Value) -> Write {
        let (change, state, message) = match call {
            Call::Update { config, .. } => (
                NodeChange {
                    config: Some(config.to_string()),
                    outputs: Some(Some(outputs.to_string())),
                    ..NodeChange::to(NodeState::Complete)
                },
                NodeState::Complete,
                "updated in place",
            ),
            Call::Deploy { .. } => (
                NodeChange {
                    outputs: Some(Some(outputs.to_string())),
                    ..NodeChange::to(NodeState::Complete)
                },
                NodeState::Complete,
                "deployed",
            ),
            Call::Destroy => {
                let (change, state) = gone(node);
                let message = if state == NodeState::Retired {
                    "retired"
                } else {
                    "destroyed"
                };
                (change, state, message)
            }
        };
        Write::Finish {
            deployment: node.deployment_id,
            node: node.id,
            entry,
            change,
            event: Some(node_change_event(node, state, message)),
        }
    }

    async fn finish_failed(&self, node: &NodeRow, entry: Uuid, error: &str) {
        let change = NodeChange {
            error: Some(Some(error.to_owned())),
            ..NodeChange::to(NodeState::Failed)
        };
        let event = node_change_event(node, NodeState::Failed, error);
        if let Err(e) = self.finish_call(node, entry, change, Some(event)).await {
            tracing::error!(deployment.id = %node.deployment_id, error = %e, "cannot store a failure");
        }
    }

    /// Stores a call's result, ends its journal entry and publishes the event,
    /// in order with the deployment's other events.
    async fn finish_call(
        &self,
        node: &NodeRow,
        entry: Uuid,
        change: NodeChange,
        event: Option<rows::NewEvent>,
    ) -> Result<(), crate::store::DbErr> {
        self.0
            .inner
            .writer
            .write(Write::Finish {
                deployment: node.deployment_id,
                node: node.id,
                entry,
                change,
                event,
            })
            .await
    }

    /// Makes the call, recording its progress and log events before its
    /// result is recorded.
    async fn call_provider(
        &self,
        node: &NodeRow,
        provider: Uuid,
        call: &Call,
    ) -> Result<Value, ProviderError> {
        // Queued as they come, not awaited: the result, queued after them,
        // commits after them, and the step waits for that.
        let writer = self.0.inner.writer.clone();
        let (deployment, label) = (node.deployment_id, node_label(node));
        let progress = move |p| {
            let (kind, message) = match p {
                ResourceProgress::Progress { percent, message } => {
                    (EventKind::Progress, format!("{percent}% {message}"))
                }
                ResourceProgress::Log(line) => (EventKind::Log, line),
            };
            writer.queue(Write::Event {
                deployment,
                event: rows::NewEvent {
                    kind: kind.as_str().to_owned(),
                    node_key: Some(label.clone()),
                    state: None,
                    message,
                },
            });
        };
        let providers = &self.0.inner.providers;
        match call {
            Call::Deploy {
                config,
                dependency_outputs,
                ..
            } => {
                let resource = ResourceCall {
                    config: config.clone(),
                    dependency_outputs: dependency_outputs.clone(),
                    ..resource_call(node)
                };
                providers.deploy(provider, resource, progress).await
            }
            Call::Update {
                config,
                dependency_outputs,
                ..
            } => {
                let previous = node
                    .config
                    .as_deref()
                    .and_then(|c| serde_json::from_str(c).ok())
                    .unwrap_or_else(|| serde_json::json!({}));
                let outputs: Value = node
                    .outputs
                    .as_deref()
                    .and_then(|o| serde_json::from_str(o).ok())
                    .unwrap_or_else(|| serde_json::json!({}));
                let resource = ResourceCall {
                    config: config.clone(),
                    dependency_outputs: dependency_outputs.clone(),
                    ..resource_call(node)
                };
                providers
                    .update_resource(provider, resource, &previous, &outputs, progress)
                    .await
            }
            Call::Destroy => {
                let outputs: Value = node
                    .outputs
                    .as_deref()
                    .and_then(|o| serde_json::from_str(o).ok())
                    .unwrap_or_else(|| serde_json::json!({}));
                providers
                    .destroy(provider, resource_call(node), &outputs, progress)
                    .await
                    .map(|()| serde_json::json!({}))
            }
        }
    }

    /// Marks a node failed, with an event.
    pub(super) async fn fail_node(&self, node: &NodeRow, error: &str) {
        let change = NodeChange {
            error: Some(Some(error.to_owned())),
            ..NodeChange::to(NodeState::Failed)
        };
        if let Err(e) = rows::change_node(&self.0.inner.db, node.id, change).await {
            tracing::error!(deployment.id = %node.deployment_id, error = %e, "cannot store a failure");
        }
        self.0
            .runs()
            .record(
                node.deployment_id,
                EventKind::Node,
                Some(&node_label(node)),
                Some(NodeState::Failed.into()),
                error.to_owned(),
            )
            .await;
    }

    /// Waits (bounded) for a provider that is not connected now: one that is
    /// restarting, or still loading after a server restart.
    async fn provider_ready(&self, provider: Uuid) -> Result<(), NotReady> {
        let wait = self.0.inner.settings.provider_wait;
        let connected = tokio::select! {
            connected = self.0.inner.providers.wait_connected(provider, wait) => connected,
            // The caller sees the server stopping and ends its step there.
            _ = self.0.inner.stopping.cancelled() => false,
        };
        if connected {
            return Ok(());
        }
        let (name, status) = match self.0.inner.providers.get(provider).await {
            Ok(p) => (format!("`{}`", p.name), Some(p.status)),
            Err(_) => (provider.to_string(), None),
        };
        let coming = status.is_some_and(|s| match s {
            ProviderStatus::Fetching
            | ProviderStatus::Building
            | ProviderStatus::Starting
            | ProviderStatus::Registering
            | ProviderStatus::Disconnected
            | ProviderStatus::Connected => true,
            ProviderStatus::Unloaded | ProviderStatus::Failed | ProviderStatus::Unloading => false,
        });
        Err(NotReady {
            message: format!(
                "provider {name} is not connected ({}; waited {} s)",
                status.map_or("unknown", ProviderStatus::as_str),
                wait.as_secs()
            ),
            coming,
        })
    }

    /// Asks a provider something a run needs before its steps (a
    /// description, its nodes): waits for it as [`Self::await_provider`]
    /// does, and when the call is lost (the link died under it) drops a dead
    /// link at once and asks again once the provider is back, as a step
    /// would, at most [`DEPLOY_ATTEMPTS`] times.
    pub(super) async fn ask_provider<T, F, Fut>(
        &self,
        provider: Uuid,
        ask: F,
    ) -> Result<T, ProviderError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, ProviderError>>,
    {
        let mut attempt = 1;
        loop {
            self.await_provider(provider)
                .await
                .map_err(ProviderError::Unavailable)?;
            match ask().await {
                Err(ProviderError::Unavailable(_))
                    if attempt < DEPLOY_ATTEMPTS && !self.0.inner.stopping.is_cancelled() =>
                {
                    self.0.inner.providers.check_after_loss(provider).await;
                    attempt += 1;
                }
                answer => return answer,
            }
        }
    }

    /// Waits for a provider before a run asks it anything: as long as a step
    /// would, and failing the same way.
    pub(super) async fn await_provider(&self, provider: Uuid) -> Result<(), String> {
        let mut attempt = 1;
        loop {
            match self.provider_ready(provider).await {
                Ok(()) => return Ok(()),
                Err(not_ready) if !not_ready.coming || attempt >= DEPLOY_ATTEMPTS => {
                    return Err(not_ready.message);
                }
                Err(_) if self.0.inner.stopping.is_cancelled() => {
                    return Err("the server is stopping".into());
                }
                Err(_) => attempt += 1,
            }
        }
    }
}

fn call_name(intent: Intent) -> &'static str {
    match intent {
        Intent::Deploy => "DeployResource",
        Intent::Destroy => "DestroyResource",
        Intent::Update => "UpdateResource",
    }
}

/// The provider destroying `node` calls, unless the node never reached it
/// (it is then only marked gone).
pub(super) fn destroy_call(node: &NodeRow) -> Option<Uuid> {
    let never_created = matches!(
        node.state,
        NodeState::ToDeploy | NodeState::Tainted | NodeState::Waiting | NodeState::Destroyed
    ) || node.run_id.is_none();
    node.provider_id.filter(|_| !never_created)
}

/// Whether a node is being retired by an apply (its destroy ends `RETIRED`).
pub(super) fn is_retiring(node: &NodeRow) -> bool {
    node.state == NodeState::ToRetire || node.state == NodeState::Retiring
}

/// The change that records a node's resource as gone: retired when an apply
/// was retiring it, else destroyed.
pub(super) fn gone(node: &NodeRow) -> (NodeChange, NodeState) {
    if is_retiring(node) {
        (
            NodeChange {
                outputs: Some(None),
                ..NodeChange::to(NodeState::Retired)
            },
            NodeState::Retired,
        )
    } else {
        (destroyed(), NodeState::Destroyed)
    }
}

pub(super) fn destroyed() -> NodeChange {
    NodeChange {
        outputs: Some(None),
        ..NodeChange::to(NodeState::Destroyed)
    }
}

/// The call that names a node's resource to its provider.
pub(super) fn resource_call(node: &NodeRow) -> ResourceCall {
    ResourceCall {
        key: node.key.clone(),
        resource_type: node.resource_type.clone(),
        config: node
            .config
            .as_deref()
            .and_then(|c| serde_json::from_str(c).ok())
            .unwrap_or_else(|| serde_json::json!({})),
        resource_id: node.id.to_string(),
        deployment_id: Some(node.deployment_id),
        node: node.node.clone(),
        dependency_outputs: Vec::new(),
    }
}

/// The event recording a node's new state.
pub(super) fn node_change_event(node: &NodeRow, state: NodeState, message: &str) -> rows::NewEvent {
    rows::NewEvent {
        kind: EventKind::Node.as_str().to_owned(),
        node_key: Some(node_label(node)),
        state: Some(state.into()),
        message: message.to_owned(),
    }
}
