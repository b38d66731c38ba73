//! The engine as the provider uses it: the client, labels, names, lookups by
//! label, and how an engine error becomes a gRPC status or a step failure.

use std::collections::HashMap;
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::query_parameters::{ListContainersOptions, ListNetworksOptions, ListVolumesOptions};
use corbel_provider_sdk::{Failure, Status, StepError, proto};

/// The resource id a thing belongs to: how everything is found again.
pub const LABEL_RESOURCE: &str = "io.corbel.resource";
/// The deployment it belongs to, when Corbel names one.
pub const LABEL_DEPLOYMENT: &str = "io.corbel.deployment";
/// The blueprint key.
pub const LABEL_KEY: &str = "io.corbel.key";
/// Who made it: this provider.
pub const LABEL_MANAGED_BY: &str = "io.corbel.managed-by";
pub const MANAGED_BY: &str = "corbel-provider-docker";

/// The deadline of one engine call (a build or a pull has its own).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// bollard's own deadline on an answer: far off, every call here has its own.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Connects to `host` (else bollard's defaults) and agrees on an API version
/// (bollard 0.21 speaks 1.53 by default; an older engine refuses it).
pub async fn connect(host: Option<&str>) -> Result<Docker, Problem> {
    let client = match host {
        Some(host) => Docker::connect_with_host(host),
        None => Docker::connect_with_defaults(),
    }
    .map_err(|e| Problem::unavailable(format!("cannot reach the Docker engine: {e}")))?
    .with_timeout(CLIENT_TIMEOUT);
    match tokio::time::timeout(Duration::from_secs(15), client.negotiate_version()).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(Problem::unavailable(format!(
            "cannot reach the Docker engine: {}",
            message(&e)
        ))),
        Err(_) => Err(Problem::unavailable(
            "cannot reach the Docker engine: no answer within 15 s",
        )),
    }
}

/// How a call went wrong, and so what status or failure it becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Invalid,
    NotFound,
    Precondition,
    /// The engine is unreachable, busy, or the thing is in use: try again.
    Unavailable,
    Internal,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub kind: Kind,
    pub message: String,
}

impl Problem {
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Problem {
            kind,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Problem::new(Kind::Invalid, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Problem::new(Kind::NotFound, message)
    }
    pub fn precondition(message: impl Into<String>) -> Self {
        Problem::new(Kind::Precondition, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Problem::new(Kind::Unavailable, message)
    }

    /// An engine error while doing `what`.
    pub fn engine(what: &str, e: &DockerError) -> Self {
        let kind = match status(e) {
            Some(400) => Kind::Invalid,
            Some(404) => Kind::NotFound,
            Some(409) => Kind::Precondition,
            Some(500..) | None => Kind::Unavailable,
            Some(_) => Kind::Internal,
        };
        Problem::new(kind, format!("{what}: {}", message(e)))
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<Problem> for Status {
    fn from(p: Problem) -> Self {
        match p.kind {
            Kind::Invalid => Status::invalid_argument(p.message),
            Kind::NotFound => Status::not_found(p.message),
            Kind::Precondition => Status::failed_precondition(p.message),
            Kind::Unavailable => Status::unavailable(p.message),
            Kind::Internal => Status::internal(p.message),
        }
    }
}

impl From<Problem> for StepError {
    fn from(p: Problem) -> Self {
        let failure = if p.kind == Kind::Unavailable {
            Failure::retryable(p.message)
        } else {
            Failure::new(p.message)
        };
        StepError::Failed(failure)
    }
}

/// The HTTP status of an engine error, if it answered.
pub fn status(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// The engine's own message when it gave one.
pub fn message(e: &DockerError) -> String {
    match e {
        DockerError::DockerResponseServerError { message, .. } => message.trim().to_owned(),
        DockerError::DockerStreamError { error } => error.trim().to_owned(),
        e => e.to_string(),
    }
}

/// `call` under [`CALL_TIMEOUT`], its error saying `what` failed.
pub async fn call<T>(
    what: &str,
    call: impl Future<Output = Result<T, DockerError>>,
) -> Result<T, Problem> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(Problem::engine(what, &e)),
        Err(_) => Err(Problem::unavailable(format!(
            "{what}: no answer from the engine within {} s",
            CALL_TIMEOUT.as_secs()
        ))),
    }
}

/// The labels of everything made for `resource`, over the user's own.
pub fn labels(
    resource: &proto::Resource,
    own: &std::collections::BTreeMap<String, String>,
) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> =
        own.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    labels.insert(LABEL_RESOURCE.into(), resource.resource_id.clone());
    if !resource.deployment_id.is_empty() {
        labels.insert(LABEL_DEPLOYMENT.into(), resource.deployment_id.clone());
    }
    labels.insert(LABEL_KEY.into(), resource.key.clone());
    labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
    labels
}

/// Whether `labels` say the thing is `resource_id`'s.
pub fn carries(labels: Option<&HashMap<String, String>>, resource_id: &str) -> bool {
    labels
        .and_then(|l| l.get(LABEL_RESOURCE))
        .is_some_and(|id| id == resource_id)
}

/// The name a resource gets unless its config names it:
/// `corbel-<key>-<the resource id without dashes>`. The whole id: Corbel's
/// ids are UUID v7, whose first 12 digits are a millisecond timestamp that
/// the nodes of one plan share.
pub fn default_name(resource: &proto::Resource) -> String {
    let key: String = resource
        .key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let key = if key.is_empty() {
        "resource".into()
    } else {
        key
    };
    let id: String = resource
        .resource_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.'))
        .collect();
    format!("corbel-{key}-{id}")
}

fn label_filter(resource_id: &str) -> Option<HashMap<String, Vec<String>>> {
    Some(HashMap::from([(
        "label".to_owned(),
        vec![format!("{LABEL_RESOURCE}={resource_id}")],
    )]))
}

/// Ids of the containers (running or not) labelled with `resource_id`, oldest first.
pub async fn containers_of(client: &Docker, resource_id: &str) -> Result<Vec<String>, Problem> {
    let options = ListContainersOptions {
        all: true,
        filters: label_filter(resource_id),
        ..Default::default()
    };
    let mut listed = call("listing containers", client.list_containers(Some(options))).await?;
    listed.sort_by_key(|c| c.created.unwrap_or_default());
    Ok(listed.into_iter().filter_map(|c| c.id).collect())
}

/// Networks labelled with `resource_id`: (id, name, created), oldest first.
pub async fn networks_of(
    client: &Docker,
    resource_id: &str,
) -> Result<Vec<(String, String)>, Problem> {
    let options = ListNetworksOptions {
        filters: label_filter(resource_id),
    };
    let listed = call("listing networks", client.list_networks(Some(options))).await?;
    let mut found: Vec<(String, String, (String, u32))> = listed
        .into_iter()
        .filter(|n| carries(n.labels.as_ref(), resource_id))
        .filter_map(|n| {
            let created = serde_json::to_value(&n.created)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            Some((n.id?, n.name.unwrap_or_default(), time_key(&created)))
        })
        .collect();
    found.sort_by(|a, b| (&a.2, &a.0).cmp(&(&b.2, &b.0)));
    Ok(found.into_iter().map(|(id, name, _)| (id, name)).collect())
}

/// An engine's RFC 3339 time as a key that sorts by time: its seconds, then
/// its nanoseconds. The text itself does not sort: the engine trims the
/// fraction's trailing zeros, so `…:05.1Z` would sort after `…:05.12Z`. One
/// engine writes every time with the same offset.
fn time_key(created: &str) -> (String, u32) {
    let seconds = created.get(..19).unwrap_or(created).to_owned();
    let digits: String = created
        .get(19..)
        .and_then(|rest| rest.strip_prefix('.'))
        .unwrap_or_default()
        .chars()
        .take_while(char::is_ascii_digit)
        .take(9)
        .collect();
    let nanos = format!("{digits:0<9}").parse().unwrap_or(0);
    (seconds, nanos)
}

/// Volumes labelled with `resource_id`: (name, mountpoint).
pub async fn volumes_of(
    client: &Docker,
    resource_id: &str,
) -> Result<Vec<(String, String)>, Problem> {
    let options = ListVolumesOptions {
        filters: label_filter(resource_id),
    };
    let listed = call("listing volumes", client.list_volumes(Some(options))).await?;
    Ok(listed
        .volumes
        .unwrap_or_default()
        .into_iter()
        .filter(|v| carries(Some(&v.labels), resource_id))
        .map(|v| (v.name, v.mountpoint))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::time_key;

    #[test]
    fn engine_times_sort_by_time_whatever_their_fraction() {
        let mut times = [
            "2026-12-03T02:59:05.1Z",
            "2026-12-03T02:59:05.12Z",
            "2026-12-03T02:59:05Z",
            "2026-12-03T02:59:04.999999999Z",
            "2026-12-03T02:59:05.0999Z",
        ];
        times.sort_by_key(|t| time_key(t));
        assert_eq!(
            times,
            [
                "2026-12-03T02:59:04.999999999Z",
                "2026-12-03T02:59:05Z",
                "2026-12-03T02:59:05.0999Z",
                "2026-12-03T02:59:05.1Z",
                "2026-12-03T02:59:05.12Z",
            ]
        );
    }
}
