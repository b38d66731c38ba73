//! Runs: starting them (deploy, destroy, redeploy) in the background, taking
//! the per-deployment run lock (see `lock`), a deployment's state changes,
//! and its events (stored and published in order). Never runs a DAG itself
//! (that is `executor`) nor calls a provider.

use std::time::Duration;

use uuid::Uuid;

use super::blueprints::check_name;
use super::lock::Lock;
use super::quotas;
use super::{
    DeployError, Deployment, DeploymentState, Deployments, EventKind, EventState, NewDeployment,
    NodeState, Phase, REPLACED, blueprint,
};
use crate::store::deployments as rows;

/// How long a request on a settled deployment waits for the run that settled
/// it to let go of its lock.
const SETTLED_LOCK_WAIT: Duration = Duration::from_secs(2);

/// The runs part of [`Deployments`].
#[derive(Clone, Copy)]
pub struct Runs<'a>(pub(super) &'a Deployments);

impl<'a> Runs<'a> {
    /// Creates the deployment and starts deploying it in the background.
    pub async fn deploy(&self, new: NewDeployment) -> Result<Deployment, DeployError> {
        self.deploy_as(new, None).await
    }

    /// [`Runs::deploy`], recording who asked (a user's name) on the
    /// deployment's first revision.
    pub async fn deploy_as(
        &self,
        new: NewDeployment,
        by: Option<String>,
    ) -> Result<Deployment, DeployError> {
        check_name(&new.name)?;
        super::recovery::check_lease("expiresAt", new.expires_at, chrono::Utc::now())?;
        let blueprint = self.0.blueprints().get(new.blueprint_id).await?;
        let expires_at = quotas::lease_within_quota(
            &self.0.inner.db,
            "expiresAt",
            blueprint.project_id,
            new.expires_at,
        )
        .await?;
        let variables = blueprint::bind(&blueprint.parsed, &new.variables)
            .map_err(|p| DeployError::Invalid(p.to_string()))?;
        let row = rows::insert_deployment(
            &self.0.inner.db,
            rows::NewDeployment {
                project_id: blueprint.project_id.ok_or_else(|| {
                    DeployError::Corrupt(format!("blueprint {} has no project", blueprint.id))
                })?,
                name: new.name,
                blueprint_id: Some(blueprint.id),
                element_id: None,
                source: blueprint.source,
                variables: serde_json::to_string(&variables)
                    .map_err(|e| DeployError::Invalid(format!("variables: {e}")))?,
                on_failure: new.on_failure.as_str().to_owned(),
                expires_at,
                created_by: by,
            },
            DeploymentState::Pending,
            Phase::Deploy.as_str(),
        )
        .await?;
        let lock = self.lock(row.id, "deploy")?;
        self.spawn_deploy(lock);
        super::queries::to_deployment(row)
    }

    pub async fn destroy(&self, id: Uuid) -> Result<Deployment, DeployError> {
        self.destroy_because(id, None).await
    }

    /// Destroys the deployment; `reason`, when the server decided it (a lease
    /// that expired), is its error while it is destroyed and stays in its
    /// events.
    pub async fn destroy_because(
        &self,
        id: Uuid,
        reason: Option<&str>,
    ) -> Result<Deployment, DeployError> {
        let deployment = self.0.queries().get(id).await?;
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
            reason,
            Some(Uuid::now_v7()),
        )
        .await?;
        let this = self.0.clone();
        self.0.inner.tasks.spawn(async move {
            this.executor().run_destroy(&lock).await;
        });
        self.0.queries().get(id).await
    }

    /// Destroys the named resources and everything that depends on them, then
    /// deploys them again.
    pub async fn redeploy(&self, id: Uuid, keys: Vec<String>) -> Result<Deployment, DeployError> {
        let deployment = self.0.queries().get(id).await?;
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
        let parsed = self.0.queries().parsed(id).await?;
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
            &self.0.inner.db,
            id,
            rows::DeploymentChange {
                state: DeploymentState::InProgress,
                phase: Some(Phase::Deploy.as_str()),
                error: None,
                operation_id: Some(Uuid::now_v7()),
            },
            &keys,
            &REPLACED,
            NodeState::ToDestroy,
        )
        .await?;
        self.record(
            id,
            EventKind::State,
            None,
            Some(DeploymentState::InProgress.into()),
            format!("redeploying {}", keys.join(", ")),
        )
        .await;
        self.spawn_deploy(lock);
        self.0.queries().get(id).await
    }

    /// Takes the deployment's run lock, or refuses: something is working on it.
    pub(super) fn lock(&self, id: Uuid, doing: &str) -> Result<Lock, DeployError> {
        Lock::take(&self.0.inner, id, doing)
    }

    /// The lock, for a request on a deployment in `state`. A run stores its
    /// last state a moment before it lets go of the lock: a deployment that
    /// looks settled is waited for (briefly) rather than refused as busy.
    pub(super) async fn lock_for_request(
        &self,
        id: Uuid,
        state: DeploymentState,
        doing: &str,
    ) -> Result<Lock, DeployError> {
        let settled = matches!(
            state,
            DeploymentState::Complete
                | DeploymentState::Suspended
                | DeploymentState::Failed
                | DeploymentState::Destroyed
        );
        let deadline = tokio::time::Instant::now() + SETTLED_LOCK_WAIT;
        loop {
            let released = self.0.inner.released.notified();
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

    /// Whether something holds the deployment's lock now.
    pub(super) fn is_busy(&self, id: Uuid) -> bool {
        self.0
            .inner
            .busy
            .lock()
            .expect("the lock set is never poisoned")
            .contains(&id)
    }

    /// Runs the deploy the lock was taken for, in the background.
    pub(super) fn spawn_deploy(&self, lock: Lock) {
        let this = self.0.clone();
        self.0.inner.tasks.spawn(async move {
            this.executor().run_deploy(&lock).await;
        });
    }

    /// Records the deployment's state, phase and error (and a new operation),
    /// with an event.
    pub(super) async fn change(
        &self,
        id: Uuid,
        state: DeploymentState,
        phase: Option<Phase>,
        error: Option<&str>,
        operation_id: Option<Uuid>,
    ) -> Result<(), DeployError> {
        rows::change_deployment(
            &self.0.inner.db,
            id,
            rows::DeploymentChange {
                state,
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
        self.record(id, EventKind::State, None, Some(state.into()), message)
            .await;
        Ok(())
    }

    /// Ends an operation: the deployment settles in `state`.
    pub(super) async fn settle(
        &self,
        id: Uuid,
        state: DeploymentState,
        error: Option<&str>,
    ) -> Result<(), DeployError> {
        // The revision the operation opened ends with it, before the state
        // event goes out: whoever reads on that event sees it ended.
        let outcome = match state {
            DeploymentState::Complete | DeploymentState::Suspended => Some("COMPLETE"),
            DeploymentState::Failed => Some("FAILED"),
            _ => None,
        };
        if let Some(outcome) = outcome {
            crate::store::plans::end_revisions(&self.0.inner.db, id, "IN_PROGRESS", outcome, error)
                .await?;
        }
        self.change(id, state, None, error, None).await
    }

    /// Stores an event in the history and publishes it. A failure to store is
    /// logged: the work it describes has already happened.
    pub(super) async fn record(
        &self,
        id: Uuid,
        kind: EventKind,
        node_key: Option<&str>,
        state: Option<EventState>,
        message: String,
    ) {
        let event = rows::NewEvent {
            kind: kind.as_str().to_owned(),
            node_key: node_key.map(str::to_owned),
            state,
            message,
        };
        let write = super::writer::Write::Event {
            deployment: id,
            event,
        };
        if let Err(e) = self.0.inner.writer.write(write).await {
            tracing::error!(deployment.id = %id, error = %e, "cannot store a deployment event")
        }
    }

    /// Stores and tells events of many deployments in one commit, in this
    /// order (health seen of many resources at once).
    pub(super) async fn record_all(&self, events: Vec<(Uuid, rows::NewEvent)>) {
        let writes = events
            .into_iter()
            .map(|(deployment, event)| super::writer::Write::Event { deployment, event })
            .collect();
        for committed in self.0.inner.writer.submit_all(writes) {
            if let Err(e) = committed.wait().await {
                tracing::error!(error = %e, "cannot store a deployment event");
            }
        }
    }
}
