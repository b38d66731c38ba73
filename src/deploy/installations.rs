//! Installed elements' blueprints, run as deployments owned by the platform
//! (one per installed element), for the repository area.
//!
//! Owns only the `Installations` port: it stores the installation's
//! deployment row, starts its run through `runs` and waits for its end; never
//! plans, runs or settles anything itself.

use futures_util::StreamExt;
use uuid::Uuid;

use super::blueprint;
use super::{DeployError, DeploymentState, Deployments, EventKind, EventState, OnFailure};
use crate::events::Delivery;
use crate::repository::installations::Installations;
use crate::store::deployments as rows;

/// A blueprint document made of a manifest's `resources`.
fn document(resources: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({ "version": "1", "resources": resources })
}

#[async_trait::async_trait]
impl Installations for Deployments {
    fn check(&self, _label: &str, resources: &serde_json::Value) -> Result<(), String> {
        let parsed = blueprint::parse_resources(resources).map_err(|p| p.to_string())?;
        let problems = blueprint::check(&parsed);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(blueprint::Problems(problems).to_string())
        }
    }

    async fn deploy(
        &self,
        element_id: Uuid,
        label: &str,
        resources: &serde_json::Value,
    ) -> Result<Option<Uuid>, String> {
        let parsed = blueprint::parse_resources(resources).map_err(|p| p.to_string())?;
        if parsed.resources.is_empty() {
            return Ok(None);
        }
        let platform =
            crate::store::projects::ensure_project(&self.inner.db, crate::auth::PLATFORM_PROJECT)
                .await
                .map_err(|e| e.to_string())?;
        let row = rows::insert_deployment(
            &self.inner.db,
            rows::NewDeployment {
                project_id: platform,
                name: format!("installation of {label}"),
                blueprint_id: None,
                element_id: Some(element_id),
                source: document(resources).to_string(),
                variables: "{}".to_owned(),
                on_failure: OnFailure::Rollback.as_str().to_owned(),
                expires_at: None,
                created_by: None,
            },
            DeploymentState::Pending,
            super::Phase::Deploy.as_str(),
        )
        .await
        .map_err(|e| e.to_string())?;
        let lock = self
            .runs()
            .lock(row.id, "deploy")
            .map_err(|e| e.to_string())?;
        let waiting = self.waiter(row.id);
        self.runs().spawn_deploy(lock);
        match waiting.await {
            Ok(DeploymentState::Complete) => Ok(Some(row.id)),
            Ok(_) => {
                let failed = self
                    .queries()
                    .get(row.id)
                    .await
                    .map_err(|e| e.to_string())?;
                Err(failed
                    .error
                    .unwrap_or_else(|| "the installation failed".to_owned()))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    async fn destroy(&self, element_id: Uuid) -> Result<(), String> {
        let found = rows::list_deployments(
            &self.inner.db,
            &rows::DeploymentFilter {
                element_id: Some(element_id),
                ..Default::default()
            },
            0,
            1_000,
        )
        .await
        .map_err(|e| e.to_string())?;
        for row in found {
            if row.state == DeploymentState::Destroyed {
                continue;
            }
            let waiting = self.waiter(row.id);
            self.runs()
                .destroy(row.id)
                .await
                .map_err(|e| e.to_string())?;
            match waiting.await {
                Ok(DeploymentState::Destroyed) => {}
                Ok(_) => {
                    let failed = self
                        .queries()
                        .get(row.id)
                        .await
                        .map_err(|e| e.to_string())?;
                    return Err(failed
                        .error
                        .unwrap_or_else(|| "the installation could not be destroyed".into()));
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    }
}

impl Deployments {
    /// A future that resolves when the deployment next ends a run (complete,
    /// failed or destroyed). Subscribes at once, so a run that starts after
    /// this call is never missed.
    fn waiter(
        &self,
        id: Uuid,
    ) -> impl std::future::Future<Output = Result<DeploymentState, DeployError>> + use<> {
        let mut events = Box::pin(self.inner.bus.subscribe());
        let this = self.clone();
        async move {
            while let Some(delivery) = events.next().await {
                match delivery {
                    Delivery::Event(e) => {
                        if e.deployment_id == id
                            && e.kind == EventKind::State
                            && let Some(state) = e.state.and_then(EventState::deployment_state)
                            && matches!(
                                state,
                                DeploymentState::Complete
                                    | DeploymentState::Failed
                                    | DeploymentState::Destroyed
                            )
                        {
                            return Ok(state);
                        }
                    }
                    // Fell behind: the stored state tells whether it ended.
                    Delivery::Lagged(_) => {
                        let state = this.queries().get(id).await?.state;
                        if matches!(
                            state,
                            DeploymentState::Complete
                                | DeploymentState::Failed
                                | DeploymentState::Destroyed
                        ) && !this.runs().is_busy(id)
                        {
                            return Ok(state);
                        }
                    }
                }
            }
            Err(DeployError::Conflict(
                "the server is stopping; the installation resumes at the next start".into(),
            ))
        }
    }
}
