//! The `provider` driver: a repository read through a provider that has the
//! `repository` feature (`GetInventory`, `GetElement`), so a third party adds
//! a kind of repository without touching Corbel. The provider area does the
//! talking, behind [`ProviderSource`]; this side sees no protocol types.

use std::sync::Arc;

use tokio::sync::mpsc;
use uuid::Uuid;

use super::{ByteStream, Driver, FetchedElement, Found, Listed};
use crate::repository::invalid::entry_path;
use crate::repository::inventory::{self, ArtifactRef};
use crate::repository::manifest::{self, Manifest};
use crate::repository::{InvalidElement, RepositoryError, RepositorySettings};
use crate::resolve::Version;

/// One inventory entry as a provider sent it: name, version, and the entry
/// as JSON in the inventory format (`{"index": {...}}`).
pub struct SourcedEntry {
    pub name: String,
    pub version: String,
    pub json: String,
}

/// What the provider area offers repositories.
#[async_trait::async_trait]
pub trait ProviderSource: Send + Sync {
    /// Sends every entry of the provider's inventory to `out`, in order.
    async fn inventory(
        &self,
        provider_id: Uuid,
        out: mpsc::Sender<SourcedEntry>,
    ) -> Result<(), String>;
    /// One element version's manifest, as YAML.
    async fn manifest(
        &self,
        provider_id: Uuid,
        name: &str,
        version: &str,
    ) -> Result<String, String>;
}

/// The provider area's handle, when this server has one.
#[derive(Clone, Default)]
pub struct ProviderSources(pub Option<Arc<dyn ProviderSource>>);

impl std::fmt::Debug for ProviderSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ProviderSources(connected)"
        } else {
            "ProviderSources(none)"
        })
    }
}

pub struct ProviderDriver {
    provider_id: Uuid,
    source: Arc<dyn ProviderSource>,
    max_manifest_bytes: usize,
}

impl ProviderDriver {
    pub fn new(provider_id: Uuid, settings: &RepositorySettings) -> Result<Self, RepositoryError> {
        let source = settings.providers.0.clone().ok_or_else(|| {
            RepositoryError::Source("this server has no provider host".to_owned())
        })?;
        Ok(Self {
            provider_id,
            source,
            max_manifest_bytes: settings.max_manifest_bytes,
        })
    }
}

#[async_trait::async_trait]
impl Driver for ProviderDriver {
    async fn inventory(
        &self,
        out: mpsc::Sender<Found>,
        _holding: super::Holding,
    ) -> Result<(), RepositoryError> {
        let (entries, mut received) = mpsc::channel::<SourcedEntry>(64);
        let reading = self.source.inventory(self.provider_id, entries);
        let forwarding = async {
            while let Some(raw) = received.recv().await {
                let path = entry_path(&raw.name, &raw.version);
                let found = match inventory::entry_from_json(&raw.name, &raw.version, &raw.json) {
                    Ok(entry) => Found::Element(Listed {
                        entry,
                        manifest: None,
                        path,
                    }),
                    Err(e) => Found::Invalid(InvalidElement {
                        name: Some(raw.name),
                        version: Some(raw.version),
                        path,
                        message: e.to_string(),
                        element_id: None,
                    }),
                };
                if out.send(found).await.is_err() {
                    break;
                }
            }
            Ok::<(), RepositoryError>(())
        };
        let (read, forwarded) = tokio::join!(reading, forwarding);
        forwarded?;
        read.map_err(RepositoryError::Source)
    }

    async fn element(
        &self,
        name: &str,
        version: &Version,
    ) -> Result<FetchedElement, RepositoryError> {
        let yaml = self
            .source
            .manifest(self.provider_id, name, &version.to_string())
            .await
            .map_err(RepositoryError::Source)?;
        let origin = format!("provider {} element {name} {version}", self.provider_id);
        let manifest = manifest::parse_yaml(&yaml, self.max_manifest_bytes, &origin)?;
        if manifest.name != name || manifest.version.to_string() != version.to_string() {
            return Err(RepositoryError::Manifest(format!(
                "{origin}: the manifest says {} {}",
                manifest.name, manifest.version
            )));
        }
        Ok(FetchedElement {
            manifest,
            artifacts: None,
        })
    }

    async fn artifact(
        &self,
        name: &str,
        version: &Version,
        artifact: &ArtifactRef,
    ) -> Result<ByteStream, RepositoryError> {
        Err(RepositoryError::NotFound(format!(
            "{name} {version}: artifact {} cannot be read through a provider repository",
            artifact.urn()
        )))
    }

    async fn upload(&self, _manifest: &Manifest, _yaml: &str) -> Result<(), RepositoryError> {
        Err(RepositoryError::Invalid(
            "a provider repository takes no uploads: its provider is the source".to_owned(),
        ))
    }
}
