//! Power: starting, stopping, restarting, pausing and resuming one deployed
//! resource through its provider, and reading its logs and what its provider
//! knows of it. A stopped or paused resource is `SUSPENDED`; a deployment is
//! `SUSPENDED` while any of its resources is.
//!
//! A power action holds the deployment's run lock (no deploy, destroy or
//! other power action runs beside it) and is not journaled: it creates and
//! removes nothing, so a crash between the provider's answer and the stored
//! state leaves a state that the next action on the resource corrects.

use uuid::Uuid;

use super::node_label;
use super::step::{node_change_event, resource_call};
use super::{
    DEPLOYED, DeployError, DeploymentState, Deployments, EventKind, NodeState, ResourceNode,
};
use crate::provider::{Exec, ExecStart, FilesOut, PowerAction};
use crate::store::deployments::{self as rows, NodeChange, NodeRow};

/// Most lines `logs` returns.
pub const MAX_LOG_LINES: u32 = 10_000;

/// The power part of [`Deployments`].
#[derive(Clone, Copy)]
pub struct Power<'a>(pub(super) &'a Deployments);

impl Power<'_> {
    /// Runs `action` on the resource `key[replica]` of a deployment that is
    /// `COMPLETE` or `SUSPENDED`, and returns the node in its new state.
    pub async fn power(
        &self,
        deployment_id: Uuid,
        key: &str,
        replica: i32,
        action: PowerAction,
    ) -> Result<ResourceNode, DeployError> {
        let deployment = self.0.queries().get(deployment_id).await?;
        if !matches!(
            deployment.state,
            DeploymentState::Complete | DeploymentState::Suspended
        ) {
            return Err(DeployError::Conflict(format!(
                "deployment `{}` is {}: power acts on a COMPLETE or SUSPENDED deployment",
                deployment.name,
                deployment.state.as_str()
            )));
        }
        let _lock = self
            .0
            .runs()
            .lock_for_request(deployment_id, deployment.state, "power a resource")
            .await?;
        let node = self
            .node(deployment_id, &deployment.name, key, replica)
            .await?;
        let state = node.state;
        if !DEPLOYED.contains(&state) {
            return Err(DeployError::Conflict(format!(
                "resource `{}` is {}: power acts on a COMPLETE or SUSPENDED resource",
                node_label(&node),
                state.as_str()
            )));
        }
        let provider = provider_of(&node)?;
        self.0
            .inner
            .providers
            .power(provider, &resource_call(&node), action)
            .await?;
        let new_state = if action.suspends() {
            NodeState::Suspended
        } else {
            NodeState::Complete
        };
        rows::change_node(&self.0.inner.db, node.id, NodeChange::to(new_state)).await?;
        let event = node_change_event(&node, new_state, &format!("power {}", action.as_str()));
        self.0
            .runs()
            .record(
                deployment_id,
                EventKind::Node,
                event.node_key.as_deref(),
                event.state,
                event.message,
            )
            .await;
        let resting = self.resting_state(deployment_id).await?;
        if resting != deployment.state {
            self.0.runs().settle(deployment_id, resting, None).await?;
        }
        self.0
            .queries()
            .nodes(deployment_id)
            .await?
            .into_iter()
            .find(|n| n.id == node.id)
            .ok_or_else(|| DeployError::NotFound(format!("resource `{key}[{replica}]` is gone")))
    }

    /// A deployed resource's last `tail` lines of log, from its provider.
    pub async fn logs(&self, node_id: Uuid, tail: u32) -> Result<String, DeployError> {
        let data = self
            .data(
                node_id,
                "logs",
                serde_json::json!({ "tail": tail.min(MAX_LOG_LINES) }),
            )
            .await?;
        Ok(match data.get("logs") {
            Some(serde_json::Value::String(text)) => text.clone(),
            _ => String::new(),
        })
    }

    /// Starts a command in a deployed resource through its provider (which
    /// needs the `exec` feature). Holds no lock: an exec changes nothing
    /// Corbel records, and a shell may last for hours.
    pub async fn exec(&self, node_id: Uuid, start: ExecStart) -> Result<Exec, DeployError> {
        let node = self.deployed(node_id, "a command to run in").await?;
        let provider = provider_of(&node)?;
        Ok(self
            .0
            .inner
            .providers
            .exec(provider, &resource_call(&node), start)
            .await?)
    }

    /// Extracts a tar archive into the directory `path` of a deployed
    /// resource through its provider (the `files` feature); the bytes it
    /// extracted.
    pub async fn put_files(
        &self,
        node_id: Uuid,
        path: &str,
        archive: impl tokio_stream::Stream<Item = Vec<u8>> + Send + 'static,
    ) -> Result<u64, DeployError> {
        let node = self.deployed(node_id, "files to write").await?;
        let provider = provider_of(&node)?;
        Ok(self
            .0
            .inner
            .providers
            .put_files(provider, &resource_call(&node), path, archive)
            .await?)
    }

    /// `path` of a deployed resource as a tar archive.
    pub async fn get_files(&self, node_id: Uuid, path: &str) -> Result<FilesOut, DeployError> {
        let node = self.deployed(node_id, "files to read").await?;
        let provider = provider_of(&node)?;
        Ok(self
            .0
            .inner
            .providers
            .get_files(provider, &resource_call(&node), path)
            .await?)
    }

    /// What a resource's provider knows of it (`RetrieveData` "inspect").
    pub async fn inspect(&self, node_id: Uuid) -> Result<serde_json::Value, DeployError> {
        self.data(node_id, "inspect", serde_json::json!({})).await
    }

    async fn data(
        &self,
        node_id: Uuid,
        kind: &str,
        config: serde_json::Value,
    ) -> Result<serde_json::Value, DeployError> {
        let node = self.deployed(node_id, kind).await?;
        let provider = provider_of(&node)?;
        Ok(self
            .0
            .inner
            .providers
            .resource_data(provider, &resource_call(&node), kind, config)
            .await?)
    }

    /// The node `node_id`, if it is deployed (`COMPLETE` or `SUSPENDED`);
    /// `what` names what only a deployed resource has.
    async fn deployed(&self, node_id: Uuid, what: &str) -> Result<NodeRow, DeployError> {
        let node = rows::find_node(&self.0.inner.db, node_id)
            .await?
            .ok_or_else(|| DeployError::NotFound(format!("no resource node {node_id}")))?;
        if !DEPLOYED.contains(&node.state) {
            return Err(DeployError::Conflict(format!(
                "resource `{}` is {}: only a deployed resource has {what}",
                node_label(&node),
                node.state.as_str()
            )));
        }
        Ok(node)
    }

    /// The state a settled deployment rests in: `SUSPENDED` while any of its
    /// resources is, else `COMPLETE`.
    pub(super) async fn resting_state(&self, id: Uuid) -> Result<DeploymentState, DeployError> {
        let nodes = rows::nodes_of(&self.0.inner.db, id).await?;
        let suspended = NodeState::Suspended;
        Ok(if nodes.iter().any(|n| n.state == suspended) {
            DeploymentState::Suspended
        } else {
            DeploymentState::Complete
        })
    }

    async fn node(
        &self,
        deployment_id: Uuid,
        name: &str,
        key: &str,
        replica: i32,
    ) -> Result<NodeRow, DeployError> {
        rows::nodes_of(&self.0.inner.db, deployment_id)
            .await?
            .into_iter()
            .find(|n| n.key == key && n.replica == replica)
            .ok_or_else(|| {
                DeployError::NotFound(format!(
                    "deployment `{name}` has no resource `{key}[{replica}]`"
                ))
            })
    }
}

fn provider_of(node: &NodeRow) -> Result<Uuid, DeployError> {
    node.provider_id.ok_or_else(|| {
        DeployError::Conflict(format!(
            "resource `{}` has no provider (it was deleted)",
            node_label(node)
        ))
    })
}
