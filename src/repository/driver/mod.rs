//! Repository drivers: where a repository's inventory, manifests and artifacts
//! come from. One trait, one module per kind, and [`open`] maps a spec to its
//! driver: a new kind is a module and an arm here.

mod http;
mod local;
mod migration;
mod pace;
mod provider;

pub use provider::{ProviderSource, ProviderSources, SourcedEntry};

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Bytes;
use futures_util::Stream;
use tokio::sync::mpsc;

use super::inventory::{ArtifactRef, InventoryEntry, Known};
use super::manifest::Manifest;
use super::{InvalidElement, RepositoryError, RepositorySettings};
use crate::resolve::Version;

/// What a repository is backed by, as stored and as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum DriverSpec {
    /// A static file server in the nginx layout.
    Http { url: String },
    /// A directory of YAML manifests on this machine.
    Local { path: PathBuf },
    /// No source: elements are attached through the API.
    Migration,
    /// Read through a provider with the `repository` feature.
    #[serde(rename_all = "camelCase")]
    Provider { provider_id: uuid::Uuid },
}

impl DriverSpec {
    pub fn kind(&self) -> &'static str {
        match self {
            DriverSpec::Http { .. } => "http",
            DriverSpec::Local { .. } => "local",
            DriverSpec::Migration => "migration",
            DriverSpec::Provider { .. } => "provider",
        }
    }

    /// Checks the spec before it is stored.
    pub fn validate(&self) -> Result<(), RepositoryError> {
        match self {
            DriverSpec::Http { url } => http::validate_url(url),
            DriverSpec::Local { path } => {
                if path.is_absolute() {
                    Ok(())
                } else {
                    Err(RepositoryError::Invalid(format!(
                        "driver.local.path: `{}` must be an absolute path",
                        path.display()
                    )))
                }
            }
            DriverSpec::Migration | DriverSpec::Provider { .. } => Ok(()),
        }
    }
}

/// An element as its source has it.
pub struct FetchedElement {
    pub manifest: Manifest,
    /// The element's artifacts, where the source lists them per element.
    pub artifacts: Option<Vec<ArtifactRef>>,
}

/// An inventory entry, with the manifest when the source reads it anyway.
pub struct Listed {
    pub entry: InventoryEntry,
    pub manifest: Option<Manifest>,
    /// Where the entry is, relative to the source's root (as
    /// [`InvalidElement::path`]).
    pub path: String,
}

/// What a driver's inventory hands over: an element, or an entry (or file)
/// that cannot be one, with the reason. A bad entry never stops the listing.
// Nearly every item is an element, which is moved, not copied, into the sync:
// boxing it would cost an allocation per entry to save space on rare ones.
#[allow(clippy::large_enum_variant)]
pub enum Found {
    Element(Listed),
    Invalid(InvalidElement),
    /// Entries the sync said it holds as listed (see [`Known`]), in order:
    /// what it answered for each, in place of the entries. Handed over in
    /// runs, one wake-up of the sync for many.
    Known(Vec<u32>),
}

/// What a sync holds, handed to [`Driver::inventory`]: a driver may skip
/// building an entry it knows and hand over [`Found::Known`] instead.
pub type Holding = Arc<dyn Known + Send + Sync>;

pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, std::io::Error>> + Send>>;

#[async_trait::async_trait]
pub trait Driver: Send + Sync {
    /// Sends every inventory entry to `out`, in order, as it is read; an
    /// entry `holding` knows may be sent as what it answered. Fails only when
    /// the source cannot be read at all.
    async fn inventory(
        &self,
        out: mpsc::Sender<Found>,
        holding: Holding,
    ) -> Result<(), RepositoryError>;

    /// Where an element's manifest is, relative to the source's root: what an
    /// invalid element found by [`Driver::element`] is recorded at.
    fn element_path(&self, name: &str, version: &Version) -> String {
        format!("{name}/{version}")
    }

    /// Fetches one element version's manifest (and artifacts, where listed).
    async fn element(
        &self,
        name: &str,
        version: &Version,
    ) -> Result<FetchedElement, RepositoryError>;

    /// Opens an artifact's bytes as a stream.
    async fn artifact(
        &self,
        name: &str,
        version: &Version,
        artifact: &ArtifactRef,
    ) -> Result<ByteStream, RepositoryError>;

    /// Stores a new element at the source, where the source can take one.
    async fn upload(&self, manifest: &Manifest, yaml: &str) -> Result<(), RepositoryError>;
}

/// The driver for a spec.
pub fn open(
    spec: &DriverSpec,
    settings: &RepositorySettings,
) -> Result<Box<dyn Driver>, RepositoryError> {
    Ok(match spec {
        DriverSpec::Http { url } => Box::new(http::HttpDriver::new(url, settings)?),
        DriverSpec::Local { path } => Box::new(local::LocalDriver::new(path.clone(), settings)),
        DriverSpec::Migration => Box::new(migration::MigrationDriver),
        DriverSpec::Provider { provider_id } => {
            Box::new(provider::ProviderDriver::new(*provider_id, settings)?)
        }
    })
}
