//! Calls on a connected provider, for the deployment engine and the API:
//! deploy, update (protocol version 2), destroy, inspect, describe, list nodes; finding the provider that
//! serves a resource type, and waiting for a provider to connect. Protocol
//! types are converted here; the engine sees only these domain types.
//!
//! Never starts, stops or registers a provider and never changes its state: a
//! provider that is not connected is an `Unavailable` answer, not a reason to
//! load it.

use std::sync::Arc;
use std::time::Duration;

use corbel_proto::v1 as proto;
use corbel_proto::v1::resource_event::Event as E;
use uuid::Uuid;

use super::catalog::Catalog;
use super::link::{Link, LinkError};
use super::state::Slots;
use super::{Provider, ProviderError, ProviderNode, ProviderStatus};

/// One resource, as a provider is asked to handle it.
#[derive(Clone, Debug)]
pub struct ResourceCall {
    pub key: String,
    pub resource_type: String,
    /// Templates already rendered.
    pub config: serde_json::Value,
    /// Stable across calls: the same resource has the same id.
    pub resource_id: String,
    /// The deployment it belongs to (`None` when describing a blueprint).
    pub deployment_id: Option<uuid::Uuid>,
    pub node: Option<String>,
    /// Outputs of the resources it depends on, by key.
    pub dependency_outputs: Vec<(String, serde_json::Value)>,
}

impl ResourceCall {
    pub(super) fn resource(&self) -> proto::Resource {
        proto::Resource {
            key: self.key.clone(),
            r#type: self.resource_type.clone(),
            config_json: self.config.to_string(),
            resource_id: self.resource_id.clone(),
            node: self.node.clone().unwrap_or_default(),
            deployment_id: self
                .deployment_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
        }
    }

    fn into_deploy(self) -> proto::DeployResourceRequest {
        proto::DeployResourceRequest {
            resource: Some(self.resource()),
            dependency_outputs_json: self
                .dependency_outputs
                .into_iter()
                .map(|(k, v)| (k, v.to_string()))
                .collect(),
        }
    }

    fn into_update(
        self,
        previous_config: &serde_json::Value,
        outputs: &serde_json::Value,
    ) -> proto::UpdateResourceRequest {
        let resource = self.resource();
        proto::UpdateResourceRequest {
            resource: Some(resource),
            previous_config_json: previous_config.to_string(),
            outputs_json: outputs.to_string(),
            dependency_outputs_json: self
                .dependency_outputs
                .into_iter()
                .map(|(k, v)| (k, v.to_string()))
                .collect(),
        }
    }
}

/// What a provider adds to a resource of a blueprint (`DescribeResources`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceDescription {
    pub key: String,
    pub depends_on: Vec<String>,
    pub features: Vec<String>,
    pub quota: Vec<(String, i64)>,
    /// The top-level config keys `update` may change in place; a change of any
    /// other key replaces the resource. Always empty for a provider that
    /// registered with a protocol version before 2, whatever it answered.
    pub updatable_keys: Vec<String>,
    /// The resource and its replacement cannot exist at once: a replacement
    /// destroys the old one first.
    pub replace_destroys_first: bool,
}

impl ResourceDescription {
    /// What a provider registered with `version` described: a version 1
    /// provider cannot be updated, so its `updatable_keys` are dropped.
    fn from_wire(d: proto::ResourceDescription, version: u32) -> Self {
        let mut quota: Vec<_> = d.quota.into_iter().collect();
        quota.sort();
        ResourceDescription {
            key: d.key,
            depends_on: d.depends_on,
            features: d.features,
            quota,
            updatable_keys: if version >= corbel_proto::UPDATE_VERSION {
                d.updatable_keys
            } else {
                Vec::new()
            },
            replace_destroys_first: d.replace_destroys_first,
        }
    }
}

/// A step a provider reports while it works on a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResourceProgress {
    Progress { percent: u32, message: String },
    Log(String),
}

/// How long the check after a lost call waits for the provider's answer.
const LOSS_PROBE: Duration = Duration::from_secs(1);

pub(super) struct Calls {
    slots: Arc<Slots>,
    catalog: Catalog,
}

impl Calls {
    pub fn new(slots: Arc<Slots>, catalog: Catalog) -> Self {
        Self { slots, catalog }
    }

    /// The provider's nodes, asked of it now.
    pub async fn nodes(&self, id: Uuid) -> Result<Vec<ProviderNode>, ProviderError> {
        let link = self.connected(id).await?;
        let nodes = link
            .list_nodes()
            .await
            .map_err(|e| ProviderError::Unavailable(e.to_string()))?;
        Ok(nodes
            .into_iter()
            .map(|n| {
                let mut capacity: Vec<_> = n.capacity.into_iter().collect();
                capacity.sort();
                let mut labels: Vec<_> = n.labels.into_iter().collect();
                labels.sort();
                ProviderNode {
                    name: n.name,
                    capacity,
                    labels,
                }
            })
            .collect())
    }

    /// A call to `id` was lost (no answer, a refused connection, a reset
    /// stream): its link is checked at once, and one that fails the check is
    /// dropped and the provider marked `DISCONNECTED` then, not two health
    /// intervals later. So a retry waits for the provider's next
    /// registration instead of failing again on a dead link at once.
    pub async fn check_after_loss(&self, id: Uuid) {
        let Some(slot) = self.slots.existing(id) else {
            return;
        };
        let Some((link, session)) = slot.link_and_session() else {
            return;
        };
        let Err(e) = link.check_health(Some(LOSS_PROBE)).await else {
            return;
        };
        let message = format!("a call was lost and the health check failed: {e}");
        self.slots.drop_failed_link(&slot, &session, message).await;
    }

    /// The link of a connected provider, or why there is none.
    pub async fn connected(&self, id: Uuid) -> Result<Link, ProviderError> {
        if self.catalog.settings().standby {
            return Err(ProviderError::OnLeader);
        }
        if let Some(link) = self.slots.existing(id).and_then(|slot| slot.link()) {
            return Ok(link);
        }
        let row = self.catalog.row(id).await?;
        Err(ProviderError::Unavailable(format!(
            "provider `{}` is not connected ({})",
            row.name,
            self.slots.slot(id).status().as_str()
        )))
    }

    /// Deploys one resource through the provider, reporting its progress to
    /// `progress`, and returns the resource's outputs.
    pub async fn deploy(
        &self,
        id: Uuid,
        resource: ResourceCall,
        mut progress: impl FnMut(ResourceProgress) + Send,
    ) -> Result<serde_json::Value, ProviderError> {
        let link = self.connected(id).await?;
        let started = std::time::Instant::now();
        let tail = self.tail(id, &resource);
        let result = bounded(&link, "DeployResource", async {
            let stream = link
                .deploy_resource(resource.into_deploy())
                .await
                .map_err(unavailable)?;
            follow(&link, "DeployResource", stream, &mut progress, tail).await
        })
        .await;
        record("DeployResource", &result, started);
        result
    }

    /// Updates one deployed resource in place to `resource.config`, from
    /// `previous_config`, with the `outputs` recorded for it; reports its
    /// progress and returns its new outputs. Refused (`Invalid`, nothing sent)
    /// for a provider registered with a protocol version before 2.
    pub async fn update(
        &self,
        id: Uuid,
        resource: ResourceCall,
        previous_config: &serde_json::Value,
        outputs: &serde_json::Value,
        mut progress: impl FnMut(ResourceProgress) + Send,
    ) -> Result<serde_json::Value, ProviderError> {
        let link = self.connected(id).await?;
        let version = link.protocol_version();
        if version < corbel_proto::UPDATE_VERSION {
            let name = self.catalog.row(id).await?.name;
            return Err(ProviderError::Invalid(format!(
                "provider `{name}` registered with protocol version {version}, which has no UpdateResource (version {} has): its resources are replaced, not updated",
                corbel_proto::UPDATE_VERSION
            )));
        }
        let started = std::time::Instant::now();
        let tail = self.tail(id, &resource);
        let result = bounded(&link, "UpdateResource", async {
            let stream = link
                .update_resource(resource.into_update(previous_config, outputs))
                .await
                .map_err(unavailable)?;
            follow(&link, "UpdateResource", stream, &mut progress, tail).await
        })
        .await;
        record("UpdateResource", &result, started);
        result
    }

    /// Destroys one resource through the provider.
    pub async fn destroy(
        &self,
        id: Uuid,
        resource: ResourceCall,
        outputs: &serde_json::Value,
        mut progress: impl FnMut(ResourceProgress) + Send,
    ) -> Result<(), ProviderError> {
        let link = self.connected(id).await?;
        let started = std::time::Instant::now();
        let tail = self.tail(id, &resource);
        let result = bounded(&link, "DestroyResource", async {
            let stream = link
                .destroy_resource(proto::DestroyResourceRequest {
                    resource: Some(resource.resource()),
                    outputs_json: outputs.to_string(),
                })
                .await
                .map_err(unavailable)?;
            follow(&link, "DestroyResource", stream, &mut progress, tail)
                .await
                .map(drop)
        })
        .await;
        record("DestroyResource", &result, started);
        result
    }

    /// What watches a stream after its `done` or `error`.
    fn tail(&self, id: Uuid, resource: &ResourceCall) -> Tail {
        Tail {
            slots: self.slots.clone(),
            provider: id,
            resource_id: resource.resource_id.clone(),
            key: resource.key.clone(),
        }
    }

    /// Whether the resource exists at the provider, and its outputs if so.
    pub async fn inspect(
        &self,
        id: Uuid,
        resource: &ResourceCall,
    ) -> Result<Option<serde_json::Value>, ProviderError> {
        let link = self.connected(id).await?;
        let answer = link
            .inspect(resource.resource())
            .await
            .map_err(unavailable)?;
        if !answer.present {
            return Ok(None);
        }
        let outputs = if answer.outputs_json.trim().is_empty() {
            serde_json::json!({})
        } else {
            serde_json::from_str(&answer.outputs_json).map_err(|e| {
                ProviderError::Unavailable(format!(
                    "the provider sent outputs that are not JSON: {e}"
                ))
            })?
        };
        Ok(Some(outputs))
    }

    /// What the provider adds to these resources; a provider that does not
    /// implement `DescribeResources` adds nothing.
    pub async fn describe(
        &self,
        id: Uuid,
        resources: &[ResourceCall],
    ) -> Result<Vec<ResourceDescription>, ProviderError> {
        let link = self.connected(id).await?;
        let version = link.protocol_version();
        let answer = link
            .describe_resources(resources.iter().map(ResourceCall::resource).collect())
            .await;
        match answer {
            Ok(descriptions) => Ok(descriptions
                .into_iter()
                .map(|d| ResourceDescription::from_wire(d, version))
                .collect()),
            Err(LinkError::Refused {
                code: tonic::Code::Unimplemented,
                ..
            }) => Ok(Vec::new()),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// The provider for a resource type: the one named, or the only provider
    /// that announced the type. Not connected is not an error here; the call
    /// that needs the link says so.
    pub async fn for_resource_type(
        &self,
        resource_type: &str,
        named: Option<&str>,
    ) -> Result<Uuid, ProviderError> {
        let all = self.catalog.list().await?;
        let serves = |p: &Provider| {
            p.resource_types.iter().any(|t| t == resource_type)
                || p.metadata
                    .as_ref()
                    .is_some_and(|m| m.resource_types.iter().any(|t| t == resource_type))
        };
        if let Some(name) = named {
            let provider = all
                .iter()
                .find(|p| p.name == name)
                .ok_or_else(|| ProviderError::NotFound(format!("no provider named `{name}`")))?;
            if !serves(provider) {
                return Err(ProviderError::Invalid(format!(
                    "provider `{name}` does not serve resource type `{resource_type}`"
                )));
            }
            return Ok(provider.id);
        }
        let mut serving: Vec<&Provider> = all.iter().filter(|p| serves(p)).collect();
        // Prefer connected providers when several serve the type.
        serving.sort_by_key(|p| (p.status != ProviderStatus::Connected, p.name.clone()));
        match serving.as_slice() {
            [] => Err(ProviderError::NotFound(format!(
                "no provider serves resource type `{resource_type}`"
            ))),
            [one] => Ok(one.id),
            [first, second, ..]
                if first.status == ProviderStatus::Connected
                    && second.status != ProviderStatus::Connected =>
            {
                Ok(first.id)
            }
            several => Err(ProviderError::Invalid(format!(
                "several providers serve resource type `{resource_type}` ({}); name one with `provider:`",
                several
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// A power action on a deployed resource. A provider without the `power`
    /// feature is refused here; what the provider refuses comes back in its
    /// words (`NotFound` when the resource is gone, `Invalid` when it has no
    /// power).
    pub async fn power(
        &self,
        id: Uuid,
        resource: &ResourceCall,
        action: PowerAction,
    ) -> Result<(), ProviderError> {
        let link = self.featured(id, "power").await?;
        link.power(resource.resource(), action.into())
            .await
            .map_err(refused)
    }

    /// What a provider with the `data` feature reads of a deployed resource:
    /// `kind` is "logs" or "inspect"; `config` its options (`{"tail": N}`).
    pub async fn resource_data(
        &self,
        id: Uuid,
        resource: &ResourceCall,
        kind: &str,
        config: serde_json::Value,
    ) -> Result<serde_json::Value, ProviderError> {
        let link = self.featured(id, "data").await?;
        let answer = link
            .retrieve_data(kind, config.to_string(), Some(resource.resource()))
            .await
            .map_err(refused)?;
        if answer.trim().is_empty() {
            return Ok(serde_json::Value::Null);
        }
        serde_json::from_str(&answer).map_err(|e| {
            ProviderError::Unavailable(format!("the provider sent data that is not JSON: {e}"))
        })
    }

    /// The link of a connected provider that announced `feature`.
    pub(super) async fn featured(&self, id: Uuid, feature: &str) -> Result<Link, ProviderError> {
        let link = self.connected(id).await?;
        let provider = self.catalog.get(id).await?;
        if !provider.features.iter().any(|f| f == feature) {
            return Err(ProviderError::Invalid(format!(
                "provider `{}` does not have the `{feature}` feature (it has: {})",
                provider.name,
                provider.features.join(", ")
            )));
        }
        Ok(link)
    }

    /// The protocol version the provider registered with, while it is connected.
    pub fn protocol_version(&self, id: Uuid) -> Option<u32> {
        self.slots
            .existing(id)
            .and_then(|slot| slot.link())
            .map(|link| link.protocol_version())
    }

    /// Whether the provider is connected now.
    pub fn is_connected(&self, id: Uuid) -> bool {
        self.slots
            .existing(id)
            .is_some_and(|slot| slot.link().is_some())
    }

    /// Waits until the provider is connected (or `limit` passes).
    pub async fn wait_connected(&self, id: Uuid, limit: Duration) -> bool {
        let slot = self.slots.slot(id);
        let mut watch = slot.watch();
        let wait = async {
            loop {
                if slot.link().is_some() {
                    return;
                }
                if watch.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok() && slot.link().is_some()
    }

    /// The link of a connected provider that announced the `repository` feature.
    pub async fn repository_link(&self, id: Uuid) -> Result<Link, String> {
        let link = self.connected(id).await.map_err(|e| e.to_string())?;
        let provider = self.catalog.get(id).await.map_err(|e| e.to_string())?;
        if !provider.features.iter().any(|f| f == "repository") {
            return Err(format!(
                "provider `{}` does not have the `repository` feature (it has: {})",
                provider.name,
                provider.features.join(", ")
            ));
        }
        Ok(link)
    }
}

/// Metrics for a streamed call, from its start to its last event.
fn record<T>(call: &'static str, result: &Result<T, ProviderError>, started: std::time::Instant) {
    let outcome = match result {
        Ok(_) => "ok",
        Err(ProviderError::Failed { .. }) => "failed",
        Err(_) => "unavailable",
    };
    crate::telemetry::record_provider_call(call, outcome, started.elapsed().as_secs_f64());
}

fn unavailable(e: LinkError) -> ProviderError {
    ProviderError::Unavailable(e.to_string())
}

/// A refusal that is the provider's answer about the resource (gone, or not
/// able to do that) in the provider's words; anything else is `Unavailable`.
pub(super) fn refused(e: LinkError) -> ProviderError {
    match &e {
        LinkError::Refused { code, message, .. } => match code {
            tonic::Code::NotFound => ProviderError::NotFound(message.clone()),
            tonic::Code::InvalidArgument
            | tonic::Code::FailedPrecondition
            | tonic::Code::Unimplemented => ProviderError::Invalid(message.clone()),
            _ => unavailable(e),
        },
        _ => unavailable(e),
    }
}

crate::text::text_enum! {
    /// A power action, as Corbel names it.
    pub enum PowerAction {
        Start = "START",
        Stop = "STOP",
        Restart = "RESTART",
        Pause = "PAUSE",
        Resume = "RESUME",
    }
}

impl PowerAction {
    /// Whether the resource is suspended (stopped or paused) after it.
    pub fn suspends(self) -> bool {
        matches!(self, PowerAction::Stop | PowerAction::Pause)
    }
}

impl From<PowerAction> for proto::PowerAction {
    fn from(a: PowerAction) -> Self {
        match a {
            PowerAction::Start => proto::PowerAction::Start,
            PowerAction::Stop => proto::PowerAction::Stop,
            PowerAction::Restart => proto::PowerAction::Restart,
            PowerAction::Pause => proto::PowerAction::Pause,
            PowerAction::Resume => proto::PowerAction::Resume,
        }
    }
}

/// A whole deploy or destroy, bounded by the resource deadline: past it, the
/// outcome is lost (the engine inspects or calls again), not a failure.
async fn bounded<T>(
    link: &Link,
    call: &'static str,
    work: impl std::future::Future<Output = Result<T, ProviderError>>,
) -> Result<T, ProviderError> {
    let deadline = link.resource_deadline();
    tokio::time::timeout(deadline, work)
        .await
        .unwrap_or_else(|_| {
            Err(unavailable(LinkError::Deadline {
                call,
                after: deadline,
            }))
        })
}

/// The rest of a stream after its `done` or `error`: read in the background,
/// and every further event reported as the protocol violation it is (in the
/// provider's log and the server's), then ignored.
struct Tail {
    slots: Arc<Slots>,
    provider: Uuid,
    resource_id: String,
    key: String,
}

impl Tail {
    fn watch(
        self,
        link: Link,
        call: &'static str,
        ended_with: &'static str,
        mut stream: tonic::Streaming<proto::ResourceEvent>,
    ) {
        tokio::spawn(async move {
            let mut extra = 0usize;
            // Bounded: each next event by the call deadline, as in `follow`.
            while let Ok(Some(event)) = link.next(call, &mut stream).await {
                extra += 1;
                let kind = match event.event {
                    Some(E::Progress(_)) => "a progress event",
                    Some(E::Log(_)) => "a log event",
                    Some(E::Done(_)) => "a second `done`",
                    Some(E::Error(_)) => "an `error`",
                    None => "an unknown event",
                };
                if extra > 10 {
                    continue; // counted, not reported line by line
                }
                self.report(&format!(
                    "protocol violation: {call} for resource {} (key `{}`) sent {kind} after `{ended_with}`; ignored",
                    self.resource_id, self.key
                ));
            }
            if extra > 10 {
                self.report(&format!(
                    "protocol violation: {call} for resource {} sent {extra} events after `{ended_with}`; all ignored",
                    self.resource_id
                ));
            }
        });
    }

    /// In the server's log and the provider's.
    fn report(&self, message: &str) {
        tracing::warn!(provider.id = %self.provider, resource.id = %self.resource_id, "{message}");
        if let Some(slot) = self.slots.existing(self.provider) {
            self.slots.note(&slot, message);
        }
    }
}

/// Reads a deploy or destroy stream to its `done` or `error`: progress to
/// `progress`, then the outputs or the failure. Whatever follows is the
/// tail's to report.
async fn follow(
    link: &Link,
    call: &'static str,
    mut stream: tonic::Streaming<proto::ResourceEvent>,
    progress: &mut (impl FnMut(ResourceProgress) + Send),
    tail: Tail,
) -> Result<serde_json::Value, ProviderError> {
    let result = read_until_end(link, call, &mut stream, progress).await;
    match &result {
        Ok(_) => tail.watch(link.clone(), call, "done", stream),
        Err(ProviderError::Failed { .. }) => tail.watch(link.clone(), call, "error", stream),
        Err(_) => {}
    }
    result
}

async fn read_until_end(
    link: &Link,
    call: &'static str,
    stream: &mut tonic::Streaming<proto::ResourceEvent>,
    progress: &mut (impl FnMut(ResourceProgress) + Send),
) -> Result<serde_json::Value, ProviderError> {
    while let Some(event) = link.next(call, stream).await.map_err(unavailable)? {
        match event.event {
            // A keep-alive: the step still goes; nothing to record.
            Some(E::Progress(p)) if p.message.is_empty() => {}
            Some(E::Progress(p)) => progress(ResourceProgress::Progress {
                percent: p.percent.min(100),
                message: p.message,
            }),
            Some(E::Log(l)) => progress(ResourceProgress::Log(l.line)),
            Some(E::Done(done)) if done.outputs_json.trim().is_empty() => {
                return Ok(serde_json::json!({}));
            }
            Some(E::Done(done)) => {
                return serde_json::from_str(&done.outputs_json).map_err(|e| {
                    ProviderError::Unavailable(format!(
                        "the provider sent outputs that are not JSON: {e}"
                    ))
                });
            }
            Some(E::Error(failure)) => {
                return Err(ProviderError::Failed {
                    message: failure.message,
                    retryable: failure.retryable,
                });
            }
            // A newer provider's event kind: ignored.
            None => {}
        }
    }
    Err(ProviderError::Unavailable(format!(
        "the provider ended {call} without `done` or `error`"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updatable_keys_count_only_from_protocol_version_2() {
        let wire = proto::ResourceDescription {
            key: "web".into(),
            quota: [("b".to_string(), 2), ("a".to_string(), 1)].into(),
            updatable_keys: vec!["label".into()],
            ..Default::default()
        };
        let v2 = ResourceDescription::from_wire(wire.clone(), 2);
        assert_eq!(v2.updatable_keys, ["label"]);
        assert_eq!(v2.quota, [("a".to_string(), 1), ("b".to_string(), 2)]);
        let v1 = ResourceDescription::from_wire(wire, 1);
        assert!(v1.updatable_keys.is_empty(), "{v1:?}");
        assert_eq!(v1.key, "web");
    }
}
