//! The provider host: providers are plugin programs Corbel fetches from git,
//! builds, runs and keeps a gRPC link to.
//!
//! - `source` fetches with git2, `metadata` reads `corbel-provider.yaml`;
//! - `runtime` builds and starts (shell now; Docker behind the same trait later);
//! - `supervisor` runs one provider's lifecycle and restarts it with backoff;
//! - `registry` is the gRPC service providers register with;
//! - `link` is Corbel's client to a registered provider.
//!
//! The `Providers` service owns the `providers` table (through
//! `store::providers`) and the in-memory state of each loaded provider: its
//! live status, link and log ring. Proto types stay inside this module.

mod calls;
mod link;
mod logs;
pub mod metadata;
mod registry;
mod repository;
mod runtime;
mod settings;
pub mod source;
mod state;
mod supervisor;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::store::{Db, DbErr};
use chrono::{DateTime, Utc};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

pub use calls::{ResourceCall, ResourceDescription, ResourceProgress};
pub use link::LinkError;
pub use logs::{LogLine, LogStream};
pub use registry::{check_socket_paths, serve_registry};
pub use settings::{ProviderFlags, ProviderSettings};

use crate::events::Bus;
use crate::store::providers as rows;
use crate::text::text_enum;
use state::Slot;

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// The provider is not connected, or a call to it failed.
    #[error("{0}")]
    Unavailable(String),
    /// The provider answered, and the answer is a failure of the work itself.
    #[error("{message}")]
    Failed { message: String, retryable: bool },
    #[error("a stored row is not valid: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Db(DbErr),
}

impl From<DbErr> for ProviderError {
    /// A unique or foreign key the store refused is a conflict, not a fault.
    fn from(e: DbErr) -> Self {
        if crate::store::is_conflict(&e) {
            Self::Conflict("the change conflicts with stored data".into())
        } else {
            Self::Db(e)
        }
    }
}

impl From<crate::text::UnknownText> for ProviderError {
    fn from(e: crate::text::UnknownText) -> Self {
        ProviderError::Corrupt(e.to_string())
    }
}

text_enum! {
    pub enum ProviderStatus {
        Unloaded = "UNLOADED",
        Fetching = "FETCHING",
        Building = "BUILDING",
        Starting = "STARTING",
        Registering = "REGISTERING",
        Connected = "CONNECTED",
        Disconnected = "DISCONNECTED",
        Failed = "FAILED",
        Unloading = "UNLOADING",
    }
}

/// What `corbel-provider.yaml` said, as stored and shown.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProviderMetadata {
    pub name: String,
    pub description: String,
    pub version: String,
    pub author: Option<String>,
    pub runtime: String,
    pub features: Vec<String>,
    pub resource_types: Vec<String>,
}

/// A node a provider places resources on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderNode {
    pub name: String,
    pub capacity: Vec<(String, i64)>,
    pub labels: Vec<(String, String)>,
}

#[derive(Clone, Debug)]
pub struct Provider {
    pub id: Uuid,
    pub name: String,
    /// The git URL without any credentials in it.
    pub git_url: String,
    pub git_ref: String,
    pub config: serde_json::Value,
    /// Names of the secret configuration values; the values are never shown.
    pub secret_keys: Vec<String>,
    pub auto_load: bool,
    pub status: ProviderStatus,
    pub status_message: Option<String>,
    pub resolved_commit: Option<String>,
    pub metadata: Option<ProviderMetadata>,
    pub features: Vec<String>,
    pub resource_types: Vec<String>,
    pub restarts: i32,
    pub last_seen_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

pub struct NewProvider {
    pub name: String,
    pub git_url: String,
    pub git_ref: String,
    pub config: serde_json::Value,
    pub secret_config: serde_json::Value,
    pub auto_load: bool,
}

#[derive(Default)]
pub struct ProviderPatch {
    pub name: Option<String>,
    pub git_url: Option<String>,
    pub git_ref: Option<String>,
    pub auto_load: Option<bool>,
}

/// What the provider area publishes on its bus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProviderEvent {
    /// A provider's status changed (or its status message, e.g. fetch progress).
    Status {
        provider_id: Uuid,
        status: ProviderStatus,
        message: Option<String>,
    },
    /// A provider printed a line (build or run output, or Corbel's note on it).
    Log { provider_id: Uuid, line: LogLine },
}

#[derive(Clone)]
pub struct Providers {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    settings: ProviderSettings,
    bus: Bus<ProviderEvent>,
    /// Cancelled when the server stops.
    stopping: CancellationToken,
    /// In-memory state of every provider touched since start.
    slots: Mutex<HashMap<Uuid, Arc<Slot>>>,
    /// Supervisors and health monitors.
    tasks: TaskTracker,
    /// Bounds how many providers fetch and build at once.
    loading: Semaphore,
}

impl Providers {
    pub fn new(
        db: Db,
        settings: ProviderSettings,
        bus: Bus<ProviderEvent>,
        stopping: CancellationToken,
    ) -> Self {
        let loading = Semaphore::new(settings.load_concurrency.max(1));
        Self {
            inner: Arc::new(Inner {
                db,
                settings,
                bus,
                stopping,
                slots: Mutex::default(),
                tasks: TaskTracker::new(),
                loading,
            }),
        }
    }

    pub fn settings(&self) -> &ProviderSettings {
        &self.inner.settings
    }

    /// Status changes and output lines of every provider, as they happen.
    pub fn events(&self) -> &Bus<ProviderEvent> {
        &self.inner.bus
    }

    /// At boot nothing runs yet: statuses left by the previous run are reset.
    pub async fn reset_after_restart(&self) -> Result<(), ProviderError> {
        rows::reset_statuses(
            &self.inner.db,
            ProviderStatus::Unloaded.as_str(),
            ProviderStatus::Failed.as_str(),
        )
        .await?;
        Ok(())
    }

    /// Loads every provider with `autoLoad`; the supervisors bound how many
    /// fetch and build at once.
    pub async fn load_automatic(&self) -> Result<usize, ProviderError> {
        let mut started = 0;
        for row in rows::list(&self.inner.db).await? {
            if row.auto_load && self.load(row.id).await.is_ok() {
                started += 1;
            }
        }
        Ok(started)
    }

    pub async fn create(&self, new: NewProvider) -> Result<(Provider, String), ProviderError> {
        check_name(&new.name)?;
        self.check_git_url(&new.git_url)?;
        check_ref(&new.git_ref)?;
        let config = config_object("config", new.config)?;
        let secret = config_object("secretConfig", new.secret_config)?;
        let token = new_token();
        let row = rows::insert(
            &self.inner.db,
            rows::NewProvider {
                name: new.name.clone(),
                git_url: new.git_url,
                git_ref: new.git_ref,
                config: config.to_string(),
                secret_config: secret.to_string(),
                auto_load: new.auto_load,
                token_hash: token_hash(&token),
            },
            ProviderStatus::Unloaded.as_str(),
        )
        .await
        .map_err(|e| conflict_or(e, || format!("a provider named `{}` exists", new.name)))?;
        let id = row.id;
        if new.auto_load {
            match self.load(id).await {
                // The start-up loader may have seen the new row first.
                Ok(_) | Err(ProviderError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok((self.get(id).await?, token))
    }

    pub async fn update(&self, id: Uuid, patch: ProviderPatch) -> Result<Provider, ProviderError> {
        let row = self.row(id).await?;
        if let Some(name) = &patch.name {
            check_name(name)?;
        }
        if let Some(url) = &patch.git_url {
            self.check_git_url(url)?;
        }
        if let Some(reference) = &patch.git_ref {
            check_ref(reference)?;
        }
        let change = rows::ProviderChange {
            name: patch.name,
            git_url: patch.git_url,
            git_ref: patch.git_ref,
            auto_load: patch.auto_load,
            ..Default::default()
        };
        rows::update(&self.inner.db, row, change)
            .await
            .map_err(|e| conflict_or(e, || "another provider has that name".to_owned()))?;
        self.get(id).await
    }

    pub async fn delete(&self, id: Uuid) -> Result<(), ProviderError> {
        let row = self.row(id).await?;
        if let Some(slot) = self.existing_slot(id)
            && slot.is_loaded()
        {
            return Err(ProviderError::Conflict(format!(
                "provider `{}` is loaded ({}); unload it first",
                row.name,
                slot.status().as_str()
            )));
        }
        match rows::delete_unless_holding(&self.inner.db, id).await? {
            rows::Deletion::Deleted => {}
            rows::Deletion::NotFound => {
                return Err(ProviderError::NotFound(format!("no provider with id {id}")));
            }
            rows::Deletion::Holding(held) => {
                return Err(ProviderError::Conflict(format!(
                    "the provider holds {held} resource(s) of deployments; destroy them first"
                )));
            }
        }
        self.inner
            .slots
            .lock()
            .expect("the slot map is never poisoned")
            .remove(&id);
        let dir = self.inner.settings.provider_dir(id);
        if let Err(e) = tokio::fs::remove_dir_all(&dir).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(provider.id = %id, error = %e, "cannot remove the provider's directory");
        }
        Ok(())
    }

    /// A new registration token; the old one stops working at once.
    pub async fn rotate_token(&self, id: Uuid) -> Result<(Provider, String), ProviderError> {
        let row = self.row(id).await?;
        let token = new_token();
        let change = rows::ProviderChange {
            token_hash: Some(token_hash(&token)),
            ..Default::default()
        };
        rows::update(&self.inner.db, row, change).await?;
        Ok((self.get(id).await?, token))
    }

    /// Stores a new configuration. When the provider is connected it is sent
    /// first, and stored only if the provider takes it. `secret = None` keeps
    /// the secret values.
    pub async fn configure(
        &self,
        id: Uuid,
        config: serde_json::Value,
        secret: Option<serde_json::Value>,
    ) -> Result<Provider, ProviderError> {
        let row = self.row(id).await?;
        let config = config_object("config", config)?;
        let secret = match secret {
            Some(value) => config_object("secretConfig", value)?,
            None => parse_object(&row.secret_config)?,
        };
        if let Some(link) = self.slot(id).link() {
            link.configure(merge(&config, &secret).to_string())
                .await
                .map_err(|e| ProviderError::Unavailable(e.to_string()))?;
        }
        let change = rows::ProviderChange {
            config: Some(config.to_string()),
            secret_config: Some(secret.to_string()),
            ..Default::default()
        };
        rows::update(&self.inner.db, row, change).await?;
        self.get(id).await
    }

    pub async fn get(&self, id: Uuid) -> Result<Provider, ProviderError> {
        let row = self.row(id).await?;
        self.to_provider(row)
    }

    pub async fn list(&self) -> Result<Vec<Provider>, ProviderError> {
        rows::list(&self.inner.db)
            .await?
            .into_iter()
            .map(|row| self.to_provider(row))
            .collect()
    }

    /// The last `n` lines of the provider's build and run output.
    pub async fn logs(&self, id: Uuid, n: usize) -> Result<Vec<LogLine>, ProviderError> {
        self.row(id).await?;
        Ok(self.slot(id).logs(n))
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

    /// The link of a connected provider, or why there is none.
    pub(super) async fn connected(&self, id: Uuid) -> Result<link::Link, ProviderError> {
        if let Some(link) = self.existing_slot(id).and_then(|slot| slot.link()) {
            return Ok(link);
        }
        let row = self.row(id).await?;
        Err(ProviderError::Unavailable(format!(
            "provider `{}` is not connected ({})",
            row.name,
            self.slot(id).status().as_str()
        )))
    }

    /// Stops every provider: at server shutdown.
    pub async fn shutdown(&self) {
        let slots: Vec<Arc<Slot>> = self
            .inner
            .slots
            .lock()
            .expect("the slot map is never poisoned")
            .values()
            .cloned()
            .collect();
        let unloads = slots.iter().map(|slot| self.unload_slot(slot.clone()));
        futures_util::future::join_all(unloads).await;
        self.inner.tasks.close();
        let bound = self.inner.settings.stop_grace + Duration::from_secs(5);
        if tokio::time::timeout(bound, self.inner.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("provider tasks still running at shutdown");
        }
    }

    async fn row(&self, id: Uuid) -> Result<rows::ProviderRow, ProviderError> {
        rows::find(&self.inner.db, id)
            .await?
            .ok_or_else(|| ProviderError::NotFound(format!("no provider with id {id}")))
    }

    fn check_git_url(&self, url: &str) -> Result<(), ProviderError> {
        source::check_url(url, &self.inner.settings.source())
            .map_err(|e| ProviderError::Invalid(format!("gitUrl: {e}")))
    }

    fn to_provider(&self, row: rows::ProviderRow) -> Result<Provider, ProviderError> {
        let config = parse_object(&row.config)?;
        let secret = parse_object(&row.secret_config)?;
        let mut secret_keys: Vec<String> = secret
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        secret_keys.sort();
        let metadata = row
            .metadata
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| ProviderError::Corrupt(format!("provider metadata: {e}")))?;
        let mut provider = Provider {
            id: row.id,
            name: row.name,
            git_url: source::display_url(&row.git_url),
            git_ref: row.git_ref,
            config,
            secret_keys,
            auto_load: row.auto_load,
            status: row.status.parse()?,
            status_message: row.status_message,
            resolved_commit: row.resolved_commit,
            metadata,
            features: string_list(&row.features)?,
            resource_types: string_list(&row.resource_types)?,
            restarts: row.restarts,
            last_seen_at: row.last_seen_at,
            created_at: row.created_at,
            updated_at: row.updated_at,
        };
        // What runs now is known here, not in the row: the row trails it.
        if let Some(slot) = self.existing_slot(row.id) {
            slot.overlay(&mut provider);
        }
        Ok(provider)
    }
}

fn check_name(name: &str) -> Result<(), ProviderError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(ProviderError::Invalid(format!(
            "name: `{name}` must be 1 to 64 characters of A-Z, a-z, 0-9, `.`, `_`, `-`"
        )))
    }
}

fn check_ref(reference: &str) -> Result<(), ProviderError> {
    if reference.len() > 255 || reference.chars().any(|c| c.is_control() || c == ' ') {
        return Err(ProviderError::Invalid(
            "ref: must be a tag, branch or commit (at most 255 characters, no spaces)".into(),
        ));
    }
    Ok(())
}

fn config_object(
    field: &str,
    value: serde_json::Value,
) -> Result<serde_json::Value, ProviderError> {
    match value {
        serde_json::Value::Object(_) => Ok(value),
        serde_json::Value::Null => Ok(serde_json::json!({})),
        other => Err(ProviderError::Invalid(format!(
            "{field}: must be a JSON object, not {}",
            json_kind(&other)
        ))),
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn parse_object(text: &str) -> Result<serde_json::Value, ProviderError> {
    serde_json::from_str(text).map_err(|e| ProviderError::Corrupt(format!("provider config: {e}")))
}

fn string_list(text: &str) -> Result<Vec<String>, ProviderError> {
    serde_json::from_str(text).map_err(|e| ProviderError::Corrupt(format!("provider list: {e}")))
}

/// The configuration a provider receives: plain values, then secret ones.
fn merge(config: &serde_json::Value, secret: &serde_json::Value) -> serde_json::Value {
    let mut merged = config.as_object().cloned().unwrap_or_default();
    if let Some(secret) = secret.as_object() {
        merged.extend(secret.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    serde_json::Value::Object(merged)
}

fn new_token() -> String {
    crate::secret::new_token("cbp_")
}

fn token_hash(token: &str) -> String {
    crate::secret::hash_token(token)
}

/// Equal in constant time (for equal lengths; lengths are not secret here).
fn same_secret(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

fn conflict_or(e: DbErr, message: impl FnOnce() -> String) -> ProviderError {
    if crate::store::is_conflict(&e) {
        ProviderError::Conflict(message())
    } else {
        ProviderError::Db(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_override_plain_values_when_merged() {
        let merged = merge(
            &serde_json::json!({"a": 1, "password": "shown?"}),
            &serde_json::json!({"password": "hidden"}),
        );
        assert_eq!(merged, serde_json::json!({"a": 1, "password": "hidden"}));
    }

    #[test]
    fn names_refs_and_configs_are_checked() {
        assert!(check_name("process").is_ok());
        assert!(check_name("bad name").is_err());
        assert!(check_name("").is_err());
        assert!(check_ref("v1.0").is_ok());
        assert!(check_ref("a\nb").is_err());
        assert!(config_object("config", serde_json::json!([1])).is_err());
        assert_eq!(
            config_object("config", serde_json::Value::Null).unwrap(),
            serde_json::json!({})
        );
    }

    #[test]
    fn token_comparison_needs_the_same_text() {
        let token = new_token();
        assert!(same_secret(&token_hash(&token), &token_hash(&token)));
        assert!(!same_secret(&token_hash(&token), &token_hash("cbp_other")));
        assert!(!same_secret("abc", "abcd"));
    }
}
