//! What a provider says of its resources' health (protocol version 3): the
//! `WatchResources` stream of a provider that registered `watch`, and
//! `Inspect` read as an observation for the others. Either way the engine
//! gets [`Observation`]s; which way a provider is asked is
//! [`Providers::can_watch`].

use chrono::{DateTime, TimeZone, Utc};
use corbel_proto::v1 as proto;
use uuid::Uuid;

use super::{LinkError, ProviderError, ProviderStatus, Providers, ResourceCall};

/// How a provider sees a resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    Healthy,
    Degraded,
    Down,
}

/// One resource's health, as its provider reported it.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    pub resource_id: String,
    pub seen: Seen,
    /// Why, in the provider's words (empty when healthy).
    pub reason: String,
    /// When it changed, by the provider's clock, if it said.
    pub at: Option<DateTime<Utc>>,
    /// Its exit status, when it is down because it exited.
    pub exit_code: Option<i32>,
    /// The config the provider sees it run with, when it says.
    pub observed: Option<serde_json::Value>,
}

/// What a watch stream brings.
#[derive(Clone, Debug, PartialEq)]
pub enum Watched {
    Status(Observation),
    /// The first report is complete.
    Synced,
}

/// An open `WatchResources` stream.
pub struct Watch {
    stream: tonic::Streaming<proto::ResourceStatus>,
}

impl Watch {
    /// The statuses as a stream: it ends when the watch ends; an `Err` says
    /// it broke.
    pub fn into_stream(self) -> impl futures_util::Stream<Item = Result<Watched, String>> + Send {
        use futures_util::StreamExt;
        self.stream.map(watched)
    }
}

fn watched(item: Result<proto::ResourceStatus, tonic::Status>) -> Result<Watched, String> {
    match item {
        Ok(status) if status.synced => Ok(Watched::Synced),
        Ok(status) => Ok(Watched::Status(from_status(status))),
        Err(status) => Err(format!(
            "the watch broke: {} ({:?})",
            status.message(),
            status.code()
        )),
    }
}

fn seen(health: i32, present: bool) -> Seen {
    match proto::Health::try_from(health).unwrap_or(proto::Health::Unspecified) {
        proto::Health::Healthy => Seen::Healthy,
        proto::Health::Degraded => Seen::Degraded,
        proto::Health::Down => Seen::Down,
        proto::Health::Unspecified if present => Seen::Healthy,
        proto::Health::Unspecified => Seen::Down,
    }
}

/// The most of a provider's observed config that is read: a larger one is
/// ignored (no drift), not parsed nor stored.
const MAX_OBSERVED_BYTES: usize = 64 * 1024;

fn observed(json: &str) -> Option<serde_json::Value> {
    if json.trim().is_empty() || json.len() > MAX_OBSERVED_BYTES {
        return None;
    }
    serde_json::from_str(json)
        .ok()
        .filter(|v: &serde_json::Value| v.is_object())
}

fn from_status(status: proto::ResourceStatus) -> Observation {
    let at = (status.changed_at_unix_ms > 0)
        .then(|| Utc.timestamp_millis_opt(status.changed_at_unix_ms).single())
        .flatten();
    Observation {
        seen: seen(status.health, true),
        observed: observed(&status.observed_config_json),
        resource_id: status.resource_id,
        reason: crate::text::bounded(status.reason, 1024, "…"),
        at,
        exit_code: status.exit_code,
    }
}

impl Providers {
    /// Whether the provider is connected with protocol version 3 or later
    /// and registered the `watch` feature.
    pub async fn can_watch(&self, id: Uuid) -> bool {
        let Some(version) = self.protocol_version(id) else {
            return false;
        };
        if version < corbel_proto::HEALTH_VERSION {
            return false;
        }
        self.get(id)
            .await
            .is_ok_and(|p| p.features.iter().any(|f| f == "watch"))
    }

    /// Opens a watch on the provider's resources, reporting first on
    /// `resources`. `Invalid` when the provider does not implement it.
    pub async fn watch(
        &self,
        id: Uuid,
        resources: &[ResourceCall],
    ) -> Result<Watch, ProviderError> {
        let link = self.inner.calls.connected(id).await?;
        let resources = resources.iter().map(ResourceCall::resource).collect();
        let stream = link
            .watch_resources(proto::WatchResourcesRequest { resources })
            .await
            .map_err(|e| match &e {
                // It registered `watch` but does not serve it: ask it with
                // Inspect instead (`Invalid` says so to the caller).
                LinkError::Refused {
                    code: tonic::Code::Unimplemented,
                    ..
                } => ProviderError::Invalid(e.to_string()),
                _ => ProviderError::Unavailable(e.to_string()),
            })?;
        Ok(Watch { stream })
    }

    /// Asks the provider how one resource is (`Inspect`): absent is down;
    /// under protocol 3 its health fields say the rest.
    pub async fn observe(
        &self,
        id: Uuid,
        resource: &ResourceCall,
    ) -> Result<Observation, ProviderError> {
        let link = self.inner.calls.connected(id).await?;
        let answer = link
            .inspect(resource.resource())
            .await
            .map_err(|e| ProviderError::Unavailable(e.to_string()))?;
        let seen = seen(answer.health, answer.present);
        let reason = match (answer.reason.trim(), answer.present) {
            ("", false) => "its provider does not find it".to_owned(),
            (reason, _) => crate::text::bounded(reason.to_owned(), 1024, "…"),
        };
        Ok(Observation {
            resource_id: resource.resource_id.clone(),
            seen,
            reason,
            at: None,
            exit_code: None,
            observed: observed(&answer.observed_config_json),
        })
    }

    /// The provider's live status (what `provider.status` says now).
    pub fn live_status(&self, id: Uuid) -> ProviderStatus {
        self.inner.slots.slot(id).status()
    }
}
