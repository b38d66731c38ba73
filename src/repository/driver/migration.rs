//! The `migration` driver: no source at all. Elements are attached through the
//! API (`uploadElement`) and live only in the store, as for installations that
//! predate repositories.

use tokio::sync::mpsc;

use super::{ByteStream, Driver, FetchedElement, Found};
use crate::repository::RepositoryError;
use crate::repository::inventory::ArtifactRef;
use crate::repository::manifest::Manifest;
use crate::resolve::Version;

pub struct MigrationDriver;

#[async_trait::async_trait]
impl Driver for MigrationDriver {
    async fn inventory(
        &self,
        _out: mpsc::Sender<Found>,
        _holding: super::Holding,
    ) -> Result<(), RepositoryError> {
        Ok(())
    }

    async fn element(
        &self,
        name: &str,
        version: &Version,
    ) -> Result<FetchedElement, RepositoryError> {
        Err(RepositoryError::Source(format!(
            "the migration driver has no source for {name} {version}; its manifest lives in the store"
        )))
    }

    async fn artifact(
        &self,
        name: &str,
        version: &Version,
        artifact: &ArtifactRef,
    ) -> Result<ByteStream, RepositoryError> {
        Err(RepositoryError::NotFound(format!(
            "artifact {} of {name} {version}: the migration driver stores no files",
            artifact.urn()
        )))
    }

    async fn upload(&self, _manifest: &Manifest, _yaml: &str) -> Result<(), RepositoryError> {
        // Nothing to write: the store keeps the element.
        Ok(())
    }
}
