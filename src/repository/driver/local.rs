//! The `local` driver: a directory of YAML manifests (`.yaml`/`.yml`). A file is
//! an element when it is a mapping with `name`, `version` and `resources`; other
//! YAML files (valid YAML of another shape) are not manifests and are passed
//! over. A file that is not valid YAML, is too large, or is a manifest with a
//! bad field is an invalid element, recorded with its reason; the others are
//! read all the same. Artifacts, if any, live at
//! `{path}/{name}/{version}/{category}/{file}`.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::io::ReaderStream;

use super::{ByteStream, Driver, FetchedElement, Found, Listed};
use crate::repository::inventory::{self, ArtifactRef, InventoryEntry};
use crate::repository::manifest::{self, Manifest};
use crate::repository::{InvalidElement, RepositoryError, RepositorySettings};
use crate::resolve::Version;

/// How deep below the root manifests are looked for.
const MAX_DEPTH: usize = 4;

#[derive(Clone)]
pub struct LocalDriver {
    root: PathBuf,
    max_manifest_bytes: usize,
}

impl LocalDriver {
    pub fn new(root: PathBuf, settings: &RepositorySettings) -> Self {
        Self {
            root,
            max_manifest_bytes: settings.max_manifest_bytes,
        }
    }

    /// Every manifest under the root, in path order, on the blocking pool.
    fn scan(&self, mut each: impl FnMut(Found) -> bool) -> Result<(), RepositoryError> {
        if !self.root.is_dir() {
            return Err(RepositoryError::Source(format!(
                "{}: not a directory",
                self.root.display()
            )));
        }
        let mut files = Vec::new();
        collect(&self.root, 0, &mut files)?;
        files.sort();
        for file in files {
            let path = file
                .strip_prefix(&self.root)
                .unwrap_or(&file)
                .display()
                .to_string();
            let found = match self.read(&file, &path) {
                Ok(None) => continue,
                Ok(Some(listed)) => Found::Element(listed),
                Err(invalid) => Found::Invalid(invalid),
            };
            if !each(found) {
                break;
            }
        }
        Ok(())
    }

    /// The element in `file` (at `path` under the root), `None` when the file
    /// is not a manifest at all, or why it is an invalid one.
    fn read(&self, file: &Path, path: &str) -> Result<Option<Listed>, InvalidElement> {
        let origin = file.display().to_string();
        let invalid = |(name, version): Known, e: RepositoryError| InvalidElement {
            name,
            version,
            path: path.to_owned(),
            message: e.to_string(),
            element_id: None,
        };
        let unknown = |e| invalid((None, None), e);
        let size = std::fs::metadata(file)
            .map_err(|e| unknown(RepositoryError::Manifest(format!("{origin}: {e}"))))?
            .len();
        if size > self.max_manifest_bytes as u64 {
            return Err(unknown(RepositoryError::Manifest(format!(
                "{origin}: manifest is {size} bytes, over the limit of {}",
                self.max_manifest_bytes
            ))));
        }
        let text = std::fs::read_to_string(file)
            .map_err(|e| unknown(RepositoryError::Manifest(format!("{origin}: {e}"))))?;
        let value = crate::yaml::from_str::<serde_json::Value>(&text, &origin)
            .map_err(|e| unknown(RepositoryError::Manifest(e.to_string())))?;
        let is_manifest = value.as_object().is_some_and(|m| {
            ["name", "version", "resources"]
                .iter()
                .all(|k| m.contains_key(*k))
        });
        if !is_manifest {
            return Ok(None);
        }
        let known = (
            value.get("name").map(text_of),
            value.get("version").map(text_of),
        );
        let manifest = manifest::check(value, &origin).map_err(|e| invalid(known, e))?;
        let entry = InventoryEntry {
            name: manifest.name.clone(),
            version: manifest.version.clone(),
            hash: Sha256::digest(text.as_bytes()).into(),
            digest: None,
            artifacts: Vec::new(),
        };
        Ok(Some(Listed {
            entry,
            manifest: Some(manifest),
            path: path.to_owned(),
        }))
    }
}

/// A bad manifest's name and version, as far as they could be read.
type Known = (Option<String>, Option<String>);

/// A YAML scalar as text (`version: 1.0` reads as the number 1.0).
fn text_of(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn collect(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Result<(), RepositoryError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| RepositoryError::Source(format!("{}: {e}", dir.display())))?;
    for entry in entries {
        let entry =
            entry.map_err(|e| RepositoryError::Source(format!("{}: {e}", dir.display())))?;
        let path = entry.path();
        let kind = entry
            .file_type()
            .map_err(|e| RepositoryError::Source(format!("{}: {e}", path.display())))?;
        if kind.is_dir() && depth < MAX_DEPTH {
            collect(&path, depth + 1, out)?;
        } else if kind.is_file() && path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    Ok(())
}

#[async_trait::async_trait]
impl Driver for LocalDriver {
    async fn inventory(
        &self,
        out: mpsc::Sender<Found>,
        _holding: super::Holding,
    ) -> Result<(), RepositoryError> {
        let driver = self.clone();
        tokio::task::spawn_blocking(move || driver.scan(|listed| out.blocking_send(listed).is_ok()))
            .await
            .map_err(|e| RepositoryError::Source(format!("scanning failed: {e}")))?
    }

    async fn element(
        &self,
        name: &str,
        version: &Version,
    ) -> Result<FetchedElement, RepositoryError> {
        let driver = self.clone();
        let (name, version) = (name.to_owned(), version.clone());
        tokio::task::spawn_blocking(move || {
            let mut found = None;
            driver.scan(|listed| match listed {
                Found::Element(listed)
                    if listed.entry.name == name
                        && listed.entry.version.to_string() == version.to_string() =>
                {
                    found = listed.manifest;
                    false
                }
                Found::Element(_) | Found::Invalid(_) | Found::Known(_) => true,
            })?;
            found
                .map(|manifest| FetchedElement {
                    manifest,
                    artifacts: None,
                })
                .ok_or_else(|| {
                    RepositoryError::Source(format!(
                        "{}: no manifest for {name} {version}",
                        driver.root.display()
                    ))
                })
        })
        .await
        .map_err(|e| RepositoryError::Source(format!("scanning failed: {e}")))?
    }

    async fn artifact(
        &self,
        name: &str,
        version: &Version,
        artifact: &ArtifactRef,
    ) -> Result<ByteStream, RepositoryError> {
        inventory::check_file_name(&artifact.file_name).map_err(RepositoryError::Invalid)?;
        let path = self
            .root
            .join(name)
            .join(version.to_string())
            .join(&artifact.category)
            .join(&artifact.file_name);
        let file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| RepositoryError::NotFound(format!("{}: {e}", path.display())))?;
        Ok(Box::pin(ReaderStream::new(file)))
    }

    async fn upload(&self, manifest: &Manifest, yaml: &str) -> Result<(), RepositoryError> {
        let file = self
            .root
            .join(format!("{}-{}.yaml", manifest.name, manifest.version));
        if tokio::fs::try_exists(&file).await.unwrap_or(false) {
            return Err(RepositoryError::Conflict(format!(
                "{} already exists",
                file.display()
            )));
        }
        // Write aside and rename, so a reader never sees half a file.
        let partial = file.with_extension("yaml.partial");
        tokio::fs::write(&partial, yaml)
            .await
            .map_err(|e| RepositoryError::Source(format!("{}: {e}", partial.display())))?;
        tokio::fs::rename(&partial, &file)
            .await
            .map_err(|e| RepositoryError::Source(format!("{}: {e}", file.display())))
    }
}
