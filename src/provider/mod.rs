//! The provider host: providers are plugin programs Corbel fetches from git,
//! builds, runs and keeps a gRPC link to.
//!
//! The map, following a provider from its row to its calls:
//!
//! - `catalog`: the stored providers (create, update, delete, get, list,
//!   configure, rotate the token) and the checks on what is stored;
//! - `supervisor`: load and unload, one task per loaded provider (fetch, build,
//!   start, restart with backoff), health monitoring of each link, shutdown;
//! - `registry`: the gRPC service providers register with (handshake, token
//!   and endpoint checks, unregister);
//! - `calls`: calls on a connected provider (deploy, update, destroy,
//!   inspect, describe, nodes) and waiting for one to connect;
//! - `state`: the in-memory slots (live status, link, log ring);
//! - `secrets`: `secretConfig` sealed at rest with the server's key;
//! - `repository`: the provider host as a repository source;
//! - below them: `source` fetches with git2, `metadata` reads
//!   `corbel-provider.yaml`, `checkout` finds it in the fetched tree,
//!   `runtime` builds and starts (`docker` as a container), `link` is
//!   Corbel's client to a registered provider, `logs` the log ring and lines;
//! - `check` is `corbel provider check`, with `check_host` its registry.
//!
//! This file holds the shared types and `Providers`, a cheap handle that
//! forwards to the parts. Proto types stay inside this module.

mod authority;
mod binding;
mod calls;
mod catalog;
pub mod check;
mod check_host;
mod checkout;
mod docker;
mod exec;
mod link;
mod logs;
pub mod metadata;
mod registry;
mod repository;
mod run_as;
mod runtime;
pub mod sandbox;
mod secrets;
mod settings;
pub mod source;
mod state;
mod supervisor;
pub mod tls;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use crate::store::{Db, DbErr};
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub use crate::seal::Resealed;
pub use calls::{PowerAction, ResourceCall, ResourceDescription, ResourceProgress};
pub use exec::{Exec, ExecExit, ExecIn, ExecOut, ExecStart, FilesOut};
pub use link::LinkError;
pub use logs::{LogLine, LogStream};
pub use registry::{check_socket_paths, serve_registry, serve_remote_registry};
pub use secrets::reseal;
pub use settings::{ProviderFlags, ProviderSettings, socket_root_for};
pub use watch::{Observation, Seen, Watch, Watched};

use crate::events::Bus;
use crate::seal::SecretKey;
use crate::store::providers as rows;
use calls::Calls;
use catalog::Catalog;
use secrets::Secrets;
use state::Slots;
use supervisor::Supervisor;

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
    /// Asked of a standby replica, which has no provider links: the leader
    /// answers it (the standby sends the request on).
    #[error("only the leading replica reaches providers")]
    OnLeader,
    /// The provider answered, and the answer is a failure of the work itself.
    #[error("{message}")]
    Failed { message: String, retryable: bool },
    #[error("a stored row is not valid: {0}")]
    Corrupt(String),
    /// A stored `secretConfig` does not open with this server's key.
    #[error("{0}")]
    Sealed(String),
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

/// Where a provider's launch is, as its column holds it (see `store::states`).
pub use crate::store::states::ProviderStatus;

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
    /// Where `corbel-provider.yaml` is in the repository; empty is the root.
    pub path: String,
    pub config: serde_json::Value,
    /// Names of the secret configuration values; the values are never shown.
    pub secret_keys: Vec<String>,
    pub auto_load: bool,
    /// The user it runs as; empty: the server's.
    pub run_as: String,
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
    pub path: String,
    pub config: serde_json::Value,
    pub secret_config: serde_json::Value,
    pub auto_load: bool,
    /// The user to run it as (the server must run as root); empty: the
    /// server's.
    pub run_as: String,
}

/// What `issueProviderCertificate` hands out, once.
pub struct IssuedCertificate {
    pub certificate: String,
    /// The private key: shown once, never kept or logged.
    pub key: String,
    pub ca: String,
    /// The name the registry's certificate carries.
    pub server_name: String,
}

#[derive(Default)]
pub struct ProviderPatch {
    pub name: Option<String>,
    pub git_url: Option<String>,
    pub git_ref: Option<String>,
    pub path: Option<String>,
    pub auto_load: Option<bool>,
    pub run_as: Option<String>,
}

/// What the provider area publishes on its bus.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ProviderEvent {
    /// A provider's status changed (or its status message, e.g. fetch progress).
    Status {
        provider_id: Uuid,
        status: ProviderStatus,
        message: Option<String>,
    },
    /// A provider printed a line (build or run output, or Corbel's note on it).
    Log { provider_id: Uuid, line: LogLine },
    /// A provider was created (it is `UNLOADED` until it loads).
    Created { provider_id: Uuid, name: String },
    /// A provider was deleted.
    Deleted { provider_id: Uuid, name: String },
}

/// The provider host: a cheap handle on its parts. Each method forwards to the
/// part whose job it is; `create` alone spans two (store, then load).
#[derive(Clone)]
pub struct Providers {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    settings: ProviderSettings,
    slots: Arc<Slots>,
    catalog: Catalog,
    supervisor: Arc<Supervisor>,
    calls: Calls,
    secrets: Secrets,
    /// Set when remote providers may register (`--provider-listen`).
    tls: std::sync::OnceLock<Arc<tls::ProviderTls>>,
    /// The providers made or unloaded through this server since it
    /// started: the start-up loader leaves them as they are.
    touched: std::sync::Mutex<std::collections::HashSet<Uuid>>,
}

impl Providers {
    pub fn new(
        db: Db,
        settings: ProviderSettings,
        key: SecretKey,
        bus: Bus<ProviderEvent>,
        stopping: CancellationToken,
    ) -> Self {
        let secrets = Secrets::new(key);
        let slots = Arc::new(Slots::new(db.clone(), bus, settings.log_lines));
        let catalog = Catalog::new(db.clone(), settings.clone(), slots.clone(), secrets.clone());
        let supervisor = Arc::new(Supervisor::new(
            db.clone(),
            settings.clone(),
            slots.clone(),
            stopping,
        ));
        let calls = Calls::new(slots.clone(), catalog.clone());
        Self {
            inner: Arc::new(Inner {
                db,
                settings,
                slots,
                catalog,
                supervisor,
                calls,
                secrets,
                tls: std::sync::OnceLock::new(),
                touched: std::sync::Mutex::default(),
            }),
        }
    }

    /// Lets remote providers register with certificates from `tls`'s CA
    /// (the server then serves the registry over TLS too).
    pub fn enable_remote(&self, tls: Arc<tls::ProviderTls>) {
        let _ = self.inner.tls.set(tls);
    }

    /// A new certificate and key for the remote provider `id`, with the CA
    /// that issued it. Nothing of it is kept: asking again issues another.
    pub async fn issue_certificate(&self, id: Uuid) -> Result<IssuedCertificate, ProviderError> {
        let Some(tls) = self.inner.tls.get() else {
            return Err(ProviderError::Invalid(
                "remote providers are off: start the server with --provider-listen".into(),
            ));
        };
        self.inner.catalog.get(id).await?;
        let issued = tls
            .issue(id)
            .map_err(|e| ProviderError::Unavailable(e.to_string()))?;
        Ok(IssuedCertificate {
            certificate: issued.certificate,
            key: issued.key,
            ca: tls.ca_pem().to_owned(),
            server_name: tls::REGISTRY_NAME.to_owned(),
        })
    }

    pub fn settings(&self) -> &ProviderSettings {
        &self.inner.settings
    }

    /// Status changes and output lines of every provider, as they happen.
    pub fn events(&self) -> &Bus<ProviderEvent> {
        self.inner.slots.bus()
    }

    // The catalog: stored providers.

    /// At boot nothing runs yet: statuses left by the previous run are reset.
    pub async fn reset_after_restart(&self) -> Result<(), ProviderError> {
        self.inner.catalog.reset_after_restart().await
    }

    /// At boot, before anything reads them: `secretConfig`s stored before
    /// sealing existed are sealed, and every stored one must open with this
    /// server's key (an error names each provider that does not, and both
    /// key ids).
    pub async fn seal_stored_secrets(&self) -> Result<Resealed, ProviderError> {
        self.inner.secrets.seal_stored(&self.inner.db).await
    }

    /// Stores a new provider and, with `autoLoad`, loads it; the provider and
    /// its registration token, shown once.
    pub async fn create(&self, new: NewProvider) -> Result<(Provider, String), ProviderError> {
        let auto_load = new.auto_load;
        let (id, token) = self.inner.catalog.create(new).await?;
        self.touched().insert(id);
        if auto_load {
            match self.load(id).await {
                // The start-up loader may have seen the new row first.
                Ok(_) | Err(ProviderError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok((self.get(id).await?, token))
    }

    pub async fn update(&self, id: Uuid, patch: ProviderPatch) -> Result<Provider, ProviderError> {
        self.inner.catalog.update(id, patch).await
    }

    /// Refused while the provider is loaded or holds resources. A provider
    /// that ran in Docker takes its image with it.
    pub async fn delete(&self, id: Uuid) -> Result<(), ProviderError> {
        let docker = uses_docker(&self.inner.catalog.row(id).await?);
        self.inner.catalog.delete(id).await?;
        if docker {
            self.inner.supervisor.engine().prune_images(id, None).await;
        }
        Ok(())
    }

    /// A new registration token; the old one stops working at once.
    pub async fn rotate_token(&self, id: Uuid) -> Result<(Provider, String), ProviderError> {
        self.inner.catalog.rotate_token(id).await
    }

    /// Stores a new configuration, sent first to a connected provider.
    pub async fn configure(
        &self,
        id: Uuid,
        config: serde_json::Value,
        secret: Option<serde_json::Value>,
    ) -> Result<Provider, ProviderError> {
        self.inner.catalog.configure(id, config, secret).await
    }

    pub async fn get(&self, id: Uuid) -> Result<Provider, ProviderError> {
        self.inner.catalog.get(id).await
    }

    pub async fn list(&self) -> Result<Vec<Provider>, ProviderError> {
        self.inner.catalog.list().await
    }

    /// The last `n` lines of the provider's build and run output.
    pub async fn logs(&self, id: Uuid, n: usize) -> Result<Vec<LogLine>, ProviderError> {
        self.inner.catalog.logs(id, n).await
    }

    // The supervisor: running providers.

    /// Loads every provider with `autoLoad`; the supervisor bounds how many
    /// fetch and build at once. One this server made (loaded with its
    /// creation) or unloaded by hand before the loader came to it (the loader
    /// runs after the sweep of containers, which can take seconds) is left
    /// as it is.
    pub async fn load_automatic(&self) -> Result<usize, ProviderError> {
        let mut started = 0;
        for row in self.inner.catalog.rows().await? {
            let touched = self.touched().contains(&row.id);
            if row.auto_load && !touched && self.load(row.id).await.is_ok() {
                started += 1;
            }
        }
        Ok(started)
    }

    fn touched(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<Uuid>> {
        self.inner.touched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts loading a provider in the background.
    pub async fn load(&self, id: Uuid) -> Result<Provider, ProviderError> {
        let row = self.inner.catalog.row(id).await?;
        self.inner.supervisor.load(row).await?;
        self.get(id).await
    }

    /// Stops a loaded provider and waits until it has stopped.
    pub async fn unload(&self, id: Uuid) -> Result<Provider, ProviderError> {
        self.inner.catalog.row(id).await?;
        self.touched().insert(id);
        self.inner
            .supervisor
            .unload(self.inner.slots.slot(id))
            .await;
        self.get(id).await
    }

    /// Removes the containers a crashed run of this instance left on the
    /// Docker engine: at start, before any provider loads. The engine is not
    /// asked at all unless a stored provider runs in Docker (its metadata is
    /// stored before its first container starts), so a server without one
    /// never waits for an engine it does not use.
    pub async fn sweep_containers(&self) {
        let docker = match self.inner.catalog.rows().await {
            Ok(rows) => rows.iter().any(uses_docker),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the providers to sweep their containers");
                return;
            }
        };
        if !docker {
            return;
        }
        match self.inner.supervisor.engine().sweep().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(containers = n, "removed containers left by an earlier run"),
            Err(e) => tracing::warn!(error = %e, "cannot sweep containers left by an earlier run"),
        }
    }

    /// Stops every provider: at server shutdown.
    pub async fn shutdown(&self) {
        self.inner.supervisor.shutdown().await;
    }

    // Calls on connected providers.

    /// The provider's nodes, asked of it now.
    pub async fn nodes(&self, id: Uuid) -> Result<Vec<ProviderNode>, ProviderError> {
        self.inner.calls.nodes(id).await
    }

    /// Deploys one resource, reporting its progress; its outputs.
    pub async fn deploy(
        &self,
        id: Uuid,
        resource: ResourceCall,
        progress: impl FnMut(ResourceProgress) + Send,
    ) -> Result<serde_json::Value, ProviderError> {
        self.inner.calls.deploy(id, resource, progress).await
    }

    /// Updates one deployed resource in place (protocol version 2), reporting
    /// its progress; its new outputs. `Invalid`, with nothing sent, when the
    /// provider registered with version 1: its resources are replaced instead.
    /// (Not `update`: that one changes a provider's stored row.)
    pub async fn update_resource(
        &self,
        id: Uuid,
        resource: ResourceCall,
        previous_config: &serde_json::Value,
        outputs: &serde_json::Value,
        progress: impl FnMut(ResourceProgress) + Send,
    ) -> Result<serde_json::Value, ProviderError> {
        self.inner
            .calls
            .update(id, resource, previous_config, outputs, progress)
            .await
    }

    /// Destroys one resource, reporting its progress.
    pub async fn destroy(
        &self,
        id: Uuid,
        resource: ResourceCall,
        outputs: &serde_json::Value,
        progress: impl FnMut(ResourceProgress) + Send,
    ) -> Result<(), ProviderError> {
        self.inner
            .calls
            .destroy(id, resource, outputs, progress)
            .await
    }

    /// Whether the resource exists at the provider, and its outputs if so.
    pub async fn inspect(
        &self,
        id: Uuid,
        resource: &ResourceCall,
    ) -> Result<Option<serde_json::Value>, ProviderError> {
        self.inner.calls.inspect(id, resource).await
    }

    /// A power action on a deployed resource.
    pub async fn power(
        &self,
        id: Uuid,
        resource: &ResourceCall,
        action: PowerAction,
    ) -> Result<(), ProviderError> {
        self.inner.calls.power(id, resource, action).await
    }

    /// What the provider reads of a deployed resource ("logs", "inspect").
    pub async fn resource_data(
        &self,
        id: Uuid,
        resource: &ResourceCall,
        kind: &str,
        config: serde_json::Value,
    ) -> Result<serde_json::Value, ProviderError> {
        self.inner
            .calls
            .resource_data(id, resource, kind, config)
            .await
    }

    /// What the provider adds to these resources.
    pub async fn describe(
        &self,
        id: Uuid,
        resources: &[ResourceCall],
    ) -> Result<Vec<ResourceDescription>, ProviderError> {
        self.inner.calls.describe(id, resources).await
    }

    /// The provider for a resource type: the one named, or the only one.
    pub async fn for_resource_type(
        &self,
        resource_type: &str,
        named: Option<&str>,
    ) -> Result<Uuid, ProviderError> {
        self.inner
            .calls
            .for_resource_type(resource_type, named)
            .await
    }

    /// Whether the provider is connected now.
    pub fn is_connected(&self, id: Uuid) -> bool {
        self.inner.calls.is_connected(id)
    }

    /// The protocol version the provider registered with, while it is
    /// connected (`None` otherwise). From 2 it can update resources in place.
    pub fn protocol_version(&self, id: Uuid) -> Option<u32> {
        self.inner.calls.protocol_version(id)
    }

    /// Waits until the provider is connected (or `limit` passes).
    pub async fn wait_connected(&self, id: Uuid, limit: Duration) -> bool {
        self.inner.calls.wait_connected(id, limit).await
    }

    /// See [`calls::Calls::check_after_loss`].
    pub async fn check_after_loss(&self, id: Uuid) {
        self.inner.calls.check_after_loss(id).await
    }
}

/// Whether the provider's last fetched metadata runs it in Docker (stored
/// before its first container starts).
fn uses_docker(row: &rows::ProviderRow) -> bool {
    row.metadata.as_deref().is_some_and(|m| {
        serde_json::from_str::<ProviderMetadata>(m).is_ok_and(|m| m.runtime == "docker")
    })
}
