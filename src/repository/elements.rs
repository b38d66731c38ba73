//! The element lifecycle: reading (with LAZY manifests fetched on first access),
//! resolving, installing, upgrading, uninstalling, editing, uploading, and
//! streaming artifacts.

use std::collections::{HashMap, HashSet, VecDeque};

use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::driver::{self, ByteStream};
use super::inventory::ArtifactRef;
use super::manifest;
use super::{
    Artifact, Element, ElementFilter, ElementStatus, InvalidElement, Repositories, RepositoryError,
    to_element,
};
use crate::resolve::{Candidate, CandidateId, Requirement, Version, World};
use crate::store::repositories as rows;

/// One element of an install plan.
#[derive(Clone, Debug)]
pub struct PlannedElement {
    pub element: Element,
    /// Already installed: the plan reuses it.
    pub already_installed: bool,
}

/// What installing an element would do, dependencies first.
#[derive(Clone, Debug)]
pub struct InstallPlan {
    pub order: Vec<PlannedElement>,
}

/// A world built for one resolution, and the rows behind its candidates.
struct Universe {
    world: World,
    rows: Vec<rows::ElementRow>,
    root: CandidateId,
}

/// The bindings a resolution records: each newly installed element (of
/// `to_install`) with every element it depends on, directly or not.
fn bindings(
    universe: &Universe,
    resolution: &crate::resolve::Resolution,
    to_install: &[Uuid],
) -> Vec<(Uuid, Uuid)> {
    let row_of = |c: &CandidateId| &universe.rows[c.0 as usize];
    let mut direct: HashMap<Uuid, Vec<Uuid>> = HashMap::new();
    for (dependent, dependency) in &resolution.edges {
        direct
            .entry(row_of(dependent).id)
            .or_default()
            .push(row_of(dependency).id);
    }
    let mut bindings = Vec::new();
    for element in to_install {
        let mut seen = HashSet::new();
        let mut stack: Vec<Uuid> = direct.get(element).cloned().unwrap_or_default();
        while let Some(dependency) = stack.pop() {
            if seen.insert(dependency) {
                bindings.push((*element, dependency));
                stack.extend(direct.get(&dependency).into_iter().flatten().copied());
            }
        }
    }
    bindings
}

impl Repositories {
    pub async fn elements(
        &self,
        filter: &ElementFilter,
        offset: u64,
        limit: u64,
    ) -> Result<(Vec<Element>, u64), RepositoryError> {
        let (found, total) = rows::list_elements(&self.db, filter, offset, limit).await?;
        Ok((
            found
                .into_iter()
                .map(to_element)
                .collect::<Result<_, _>>()?,
            total,
        ))
    }

    pub async fn element(&self, id: Uuid) -> Result<Element, RepositoryError> {
        to_element(self.element_row(id).await?)
    }

    async fn element_row(&self, id: Uuid) -> Result<rows::ElementRow, RepositoryError> {
        rows::find_element(&self.db, id)
            .await?
            .ok_or_else(|| RepositoryError::NotFound(format!("no element {id}")))
    }

    /// The element's manifest, fetched from its source first if not yet stored.
    pub async fn manifest(&self, id: Uuid) -> Result<serde_json::Value, RepositoryError> {
        let row = self.element_row(id).await?;
        self.ensure_manifest(&row).await
    }

    async fn ensure_manifest(
        &self,
        row: &rows::ElementRow,
    ) -> Result<serde_json::Value, RepositoryError> {
        if let Some(text) = &row.manifest {
            return serde_json::from_str(text)
                .map_err(|e| RepositoryError::Corrupt(format!("manifest of {}: {e}", row.id)));
        }
        let repository = self.to_repository(
            rows::find_repository(&self.db, row.repository_id)
                .await?
                .ok_or_else(|| {
                    RepositoryError::NotFound(format!("no repository {}", row.repository_id))
                })?,
        )?;
        let version: Version = row
            .version
            .parse()
            .map_err(|e: crate::resolve::ResolveError| RepositoryError::Corrupt(e.to_string()))?;
        let source = driver::open(&repository.driver, &self.settings)?;
        let fetched = match source.element(&row.name, &version).await {
            Ok(fetched) => fetched,
            Err(e) => {
                // Found bad when first fetched: recorded like a sync's find.
                if e.is_element_problem() {
                    let path = source.element_path(&row.name, &version);
                    let problem =
                        InvalidElement::of_element(row.id, &row.name, &row.version, path, &e);
                    super::invalid::record(&self.db, row.repository_id, problem).await;
                }
                return Err(e);
            }
        };
        let artifacts = fetched.artifacts.map(|list| {
            list.iter()
                .map(|a| (a.urn(), a.category.clone(), a.file_name.clone()))
                .collect()
        });
        rows::store_manifest(
            &self.db,
            row.id,
            fetched.manifest.document.to_string(),
            artifacts,
        )
        .await?;
        Ok(fetched.manifest.document)
    }

    /// The element's artifacts. An element whose manifest is not fetched yet
    /// (LAZY) is fetched first, since its own listing may name artifacts the
    /// inventory did not; if that fails, what the inventory listed is shown.
    pub async fn artifacts(&self, element_id: Uuid) -> Result<Vec<Artifact>, RepositoryError> {
        let row = self.element_row(element_id).await?;
        if row.manifest.is_none()
            && let Err(e) = self.ensure_manifest(&row).await
        {
            tracing::warn!(element.id = %element_id, error = %e,
                "artifacts listed from the inventory: the element cannot be fetched");
        }
        Ok(rows::artifacts_of(&self.db, element_id)
            .await?
            .into_iter()
            .map(|a| Artifact {
                element_id: a.element_id,
                urn: a.urn,
                category: a.category,
                file_name: a.file_name,
            })
            .collect())
    }

    /// The artifact's file name and its bytes, streamed from the source.
    pub async fn artifact_stream(
        &self,
        element_id: Uuid,
        urn: &str,
    ) -> Result<(String, ByteStream), RepositoryError> {
        let row = self.element_row(element_id).await?;
        let artifact = self
            .artifacts(element_id)
            .await?
            .into_iter()
            .find(|a| a.urn == urn)
            .ok_or_else(|| {
                RepositoryError::NotFound(format!("element {element_id} has no artifact {urn}"))
            })?;
        let repository = self.to_repository(
            rows::find_repository(&self.db, row.repository_id)
                .await?
                .ok_or_else(|| RepositoryError::NotFound("no repository".into()))?,
        )?;
        let version: Version = row
            .version
            .parse()
            .map_err(|e: crate::resolve::ResolveError| RepositoryError::Corrupt(e.to_string()))?;
        let reference = ArtifactRef {
            category: artifact.category.clone(),
            uuid: urn
                .split_once(':')
                .map(|(_, u)| u.to_owned())
                .unwrap_or_default(),
            file_name: artifact.file_name.clone(),
        };
        let stream = driver::open(&repository.driver, &self.settings)?
            .artifact(&row.name, &version, &reference)
            .await?;
        Ok((artifact.file_name, stream))
    }

    /// Elements this one is bound to depend on (installed ones only have bindings).
    pub async fn dependencies(&self, id: Uuid) -> Result<Vec<Element>, RepositoryError> {
        let ids = rows::dependencies_of(&self.db, id).await?;
        self.by_ids(&ids).await
    }

    pub async fn dependents(&self, id: Uuid) -> Result<Vec<Element>, RepositoryError> {
        let ids = rows::dependents_of(&self.db, id).await?;
        self.by_ids(&ids).await
    }

    async fn by_ids(&self, ids: &[Uuid]) -> Result<Vec<Element>, RepositoryError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        rows::elements_by_ids(&self.db, ids)
            .await?
            .into_iter()
            .map(to_element)
            .collect()
    }

    /// Every candidate that resolving `root` could need: the versions of every
    /// name reachable through requirements, with their manifests fetched.
    /// `replacing` (an upgrade's old version) is left out.
    async fn universe(
        &self,
        root: &rows::ElementRow,
        replacing: Option<Uuid>,
    ) -> Result<Universe, RepositoryError> {
        let priorities = rows::repository_priorities(&self.db).await?;
        let mut candidates = Vec::new();
        let mut kept = Vec::new();
        let mut seen_names: HashSet<String> = HashSet::new();
        let mut queue: VecDeque<String> = VecDeque::new();
        let mut root_id = None;
        seen_names.insert(root.name.clone());
        queue.push_back(root.name.clone());
        while !queue.is_empty() {
            let names: Vec<String> = queue.drain(..).collect();
            for row in rows::elements_named(&self.db, &names).await? {
                if Some(row.id) == replacing {
                    continue;
                }
                let is_root = row.id == root.id;
                if row.name == root.name && !is_root {
                    // The root's name is bound to the root.
                    continue;
                }
                let requirements = match self.requirements_of(&row).await {
                    Ok(r) => r,
                    Err(e) if !is_root => {
                        tracing::warn!(element.name = %row.name, element.version = %row.version, error = %e,
                            "left out of resolution: its manifest cannot be read");
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                for requirement in &requirements {
                    if seen_names.insert(requirement.name.clone()) {
                        queue.push_back(requirement.name.clone());
                    }
                }
                let Ok(version) = row.version.parse::<Version>() else {
                    continue;
                };
                let id = CandidateId(kept.len() as u64);
                if is_root {
                    root_id = Some(id);
                }
                candidates.push(Candidate {
                    id,
                    name: row.name.clone(),
                    version,
                    priority: priorities.get(&row.repository_id).copied().unwrap_or(0),
                    installed: row.installed && !is_root,
                    requirements,
                });
                kept.push(row);
            }
        }
        let root =
            root_id.ok_or_else(|| RepositoryError::NotFound(format!("no element {}", root.id)))?;
        Ok(Universe {
            world: World::new(candidates),
            rows: kept,
            root,
        })
    }

    async fn requirements_of(
        &self,
        row: &rows::ElementRow,
    ) -> Result<Vec<Requirement>, RepositoryError> {
        let document = self.ensure_manifest(row).await?;
        let origin = format!("{} {}", row.name, row.version);
        manifest::requirements(&row.name, document.get("requirements"), &origin)
    }

    /// Previews the install plan of `id` without changing anything.
    pub async fn resolve_plan(&self, id: Uuid) -> Result<InstallPlan, RepositoryError> {
        let root = self.element_row(id).await?;
        let universe = self.universe(&root, None).await?;
        let resolution = universe
            .world
            .resolve(universe.root)
            .map_err(RepositoryError::Resolve)?;
        let order = resolution
            .order
            .iter()
            .map(|c| {
                let row = universe.rows[c.0 as usize].clone();
                Ok(PlannedElement {
                    already_installed: row.installed,
                    element: to_element(row)?,
                })
            })
            .collect::<Result<_, RepositoryError>>()?;
        Ok(InstallPlan { order })
    }

    pub async fn install(&self, id: Uuid) -> Result<Element, RepositoryError> {
        let root = self.element_row(id).await?;
        if root.installed {
            return Err(RepositoryError::AlreadyInstalled(format!(
                "{} {} is already installed",
                root.name, root.version
            )));
        }
        if let Some(other) = self.installed_named(&root.name).await? {
            return Err(RepositoryError::AlreadyInstalled(format!(
                "{} {} is installed; upgrade it instead of installing {}",
                other.name, other.version, root.version
            )));
        }
        self.check_blueprint(&self.ensure_manifest(&root).await?, &root)?;
        let universe = self.universe(&root, None).await?;
        let resolution = universe
            .world
            .resolve(universe.root)
            .map_err(RepositoryError::Resolve)?;
        self.apply(&universe, &resolution, None).await?;
        self.element(id).await
    }

    /// Swaps the installed `from` for `to` (same name) in one commit.
    pub async fn upgrade(&self, from: Uuid, to: Uuid) -> Result<Element, RepositoryError> {
        let old = self.element_row(from).await?;
        let new = self.element_row(to).await?;
        if !old.installed {
            return Err(RepositoryError::Invalid(format!(
                "{} {} is not installed",
                old.name, old.version
            )));
        }
        if old.name != new.name || old.id == new.id || old.version == new.version {
            return Err(RepositoryError::Invalid(format!(
                "an upgrade goes to another version of {}, not to {} {}",
                old.name, new.name, new.version
            )));
        }
        if new.installed {
            return Err(RepositoryError::AlreadyInstalled(format!(
                "{} {} is already installed",
                new.name, new.version
            )));
        }
        self.check_blueprint(&self.ensure_manifest(&new).await?, &new)?;
        let new_version: Version = new
            .version
            .parse()
            .map_err(|e: crate::resolve::ResolveError| RepositoryError::Corrupt(e.to_string()))?;
        // Everything bound to the old version must accept the new one.
        for dependent in
            rows::elements_by_ids(&self.db, &rows::dependents_of(&self.db, from).await?).await?
        {
            let requirements = self.requirements_of(&dependent).await?;
            if let Some(r) = requirements
                .iter()
                .find(|r| r.name == new.name && !r.matches(&new_version))
            {
                return Err(RepositoryError::Resolve(
                    crate::resolve::ResolveError::Conflict {
                        root: format!("{} {}", new.name, new.version),
                        chains: vec![format!(
                            "installed {} {} requires {r}, which {} does not satisfy",
                            dependent.name, dependent.version, new.version
                        )],
                        installed: vec![format!("{} {}", dependent.name, dependent.version)],
                    },
                ));
            }
        }
        let universe = self.universe(&new, Some(from)).await?;
        let resolution = universe
            .world
            .resolve(universe.root)
            .map_err(RepositoryError::Resolve)?;
        self.apply(&universe, &resolution, Some(from)).await?;
        self.element(to).await
    }

    /// Records a resolution: marks what it installs IN_PROGRESS, then in one
    /// transaction makes it ACTIVE with its bindings (and releases `replacing`).
    async fn apply(
        &self,
        universe: &Universe,
        resolution: &crate::resolve::Resolution,
        replacing: Option<Uuid>,
    ) -> Result<(), RepositoryError> {
        let row_of = |c: &CandidateId| &universe.rows[c.0 as usize];
        // Dependencies first, as the resolution orders them.
        let installing: Vec<&rows::ElementRow> = resolution
            .order
            .iter()
            .map(row_of)
            .filter(|r| !r.installed)
            .collect();
        let to_install: Vec<Uuid> = installing.iter().map(|r| r.id).collect();
        let bindings = bindings(universe, resolution, &to_install);
        rows::set_element_status(&self.db, &to_install, ElementStatus::InProgress, None).await?;
        let deployed = self.deploy_installations(&installing, &to_install).await?;
        let install = rows::InstallTxn {
            activate: to_install.clone(),
            release: replacing,
            bindings,
            rebind: replacing.zip(resolution.order.last().map(|c| row_of(c).id)),
        };
        self.commit_install(install, &deployed).await?;
        // Blue-green: the new version runs; now the old one goes.
        if let Some(old) = replacing {
            self.destroy_replaced(old).await?;
        }
        Ok(())
    }

    /// Each element's installation, dependencies first; on a failure, the
    /// ones made are undone and all of `to_install` is marked ERROR. The
    /// elements deployed.
    async fn deploy_installations(
        &self,
        installing: &[&rows::ElementRow],
        to_install: &[Uuid],
    ) -> Result<Vec<Uuid>, RepositoryError> {
        let mut deployed: Vec<Uuid> = Vec::new();
        for row in installing {
            let result = match self.ensure_manifest(row).await {
                Ok(document) => self.deploy_installation(row, &document).await,
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                self.undo_installations(&deployed).await;
                rows::set_element_status(
                    &self.db,
                    to_install,
                    ElementStatus::Error,
                    Some(e.to_string()),
                )
                .await?;
                return Err(e);
            }
            deployed.push(row.id);
        }
        Ok(deployed)
    }

    /// Records the install once every installation is complete; if it
    /// cannot be, the installations (`deployed`) are undone and what it
    /// would have activated is marked ERROR.
    async fn commit_install(
        &self,
        install: rows::InstallTxn,
        deployed: &[Uuid],
    ) -> Result<(), RepositoryError> {
        let to_install = install.activate.clone();
        let Err(e) = rows::commit_install(&self.db, install).await else {
            return Ok(());
        };
        self.undo_installations(deployed).await;
        let conflict = crate::store::is_conflict(&e);
        let message = if conflict {
            "another version of one of these elements was installed meanwhile".to_owned()
        } else {
            "the install could not be recorded".to_owned()
        };
        rows::set_element_status(
            &self.db,
            &to_install,
            ElementStatus::Error,
            Some(message.clone()),
        )
        .await?;
        Err(if conflict {
            RepositoryError::AlreadyInstalled(message)
        } else {
            e.into()
        })
    }

    /// Destroys the installation of `old`, the version an upgrade replaced;
    /// if it cannot be, `old` is marked ERROR (the upgrade stands).
    async fn destroy_replaced(&self, old: Uuid) -> Result<(), RepositoryError> {
        if let Some(installations) = &self.settings.installations.0
            && let Err(e) = installations.destroy(old).await
        {
            tracing::warn!(element.id = %old, error = %e, "the replaced version's installation could not be destroyed");
            rows::set_element_status(
                &self.db,
                &[old],
                ElementStatus::Error,
                Some(format!("its installation could not be destroyed: {e}")),
            )
            .await?;
        }
        Ok(())
    }

    /// Deploys an element's installation and waits for it.
    async fn deploy_installation(
        &self,
        row: &rows::ElementRow,
        document: &serde_json::Value,
    ) -> Result<(), RepositoryError> {
        let Some(installations) = &self.settings.installations.0 else {
            return Ok(());
        };
        let resources = document
            .get("resources")
            .cloned()
            .unwrap_or_else(|| serde_json::json!({}));
        let label = format!("{} {}", row.name, row.version);
        installations
            .deploy(row.id, &label, &resources)
            .await
            .map(drop)
            .map_err(|e| RepositoryError::Deployment(format!("installing {label}: {e}")))
    }

    /// Destroys installations made by an install that then failed.
    async fn undo_installations(&self, elements: &[Uuid]) {
        let Some(installations) = &self.settings.installations.0 else {
            return;
        };
        for element in elements.iter().rev() {
            if let Err(e) = installations.destroy(*element).await {
                tracing::warn!(element.id = %element, error = %e, "cannot undo an installation");
            }
        }
    }

    /// The blueprint part of a manifest, checked as the deploy area would.
    fn check_blueprint(
        &self,
        document: &serde_json::Value,
        row: &rows::ElementRow,
    ) -> Result<(), RepositoryError> {
        check_blueprint(document, row)?;
        if let Some(installations) = &self.settings.installations.0 {
            let label = format!("{} {}", row.name, row.version);
            let resources = document
                .get("resources")
                .cloned()
                .unwrap_or_else(|| serde_json::json!({}));
            installations
                .check(&label, &resources)
                .map_err(|e| RepositoryError::Manifest(format!("{label}: {e}")))?;
        }
        Ok(())
    }

    async fn installed_named(
        &self,
        name: &str,
    ) -> Result<Option<rows::ElementRow>, RepositoryError> {
        Ok(rows::elements_named(&self.db, &[name.to_owned()])
            .await?
            .into_iter()
            .find(|r| r.installed))
    }

    pub async fn uninstall(&self, id: Uuid) -> Result<Element, RepositoryError> {
        let row = self.element_row(id).await?;
        if !row.installed {
            return Err(RepositoryError::Invalid(format!(
                "{} {} is not installed",
                row.name, row.version
            )));
        }
        let dependents: Vec<String> =
            rows::elements_by_ids(&self.db, &rows::dependents_of(&self.db, id).await?)
                .await?
                .into_iter()
                .filter(|d| d.installed)
                .map(|d| format!("{} {}", d.name, d.version))
                .collect();
        if !dependents.is_empty() {
            return Err(RepositoryError::HasDependents {
                message: format!(
                    "{} {} cannot be uninstalled: {} depend(s) on it",
                    row.name,
                    row.version,
                    dependents.join(", ")
                ),
                dependents,
            });
        }
        if let Some(installations) = &self.settings.installations.0 {
            installations.destroy(id).await.map_err(|e| {
                RepositoryError::Deployment(format!(
                    "{} {} stays installed: its installation could not be destroyed: {e}",
                    row.name, row.version
                ))
            })?;
        }
        rows::commit_uninstall(&self.db, id).await?;
        self.element(id).await
    }

    /// Replaces the manifest; its name and version must stay those of the element.
    pub async fn edit(
        &self,
        id: Uuid,
        document: serde_json::Value,
    ) -> Result<Element, RepositoryError> {
        let row = self.element_row(id).await?;
        let checked = manifest::check(document, "manifest")?;
        if checked.name != row.name || checked.version.to_string() != row.version {
            return Err(RepositoryError::Invalid(format!(
                "manifest is {} {}, but the element is {} {}",
                checked.name, checked.version, row.name, row.version
            )));
        }
        rows::store_manifest(&self.db, id, checked.document.to_string(), None).await?;
        self.element(id).await
    }

    /// Adds an element to a repository whose driver takes uploads.
    pub async fn upload(
        &self,
        repository_id: Uuid,
        yaml: &str,
    ) -> Result<Element, RepositoryError> {
        let repository = self.get(repository_id).await?;
        // Parsed on the blocking pool, stopped with the request (`crate::cpu`).
        let max_bytes = self.settings.max_manifest_bytes;
        let text = yaml.to_owned();
        let checked = crate::cpu::run(move |stop| {
            manifest::parse_yaml_until(&text, max_bytes, "manifest", stop)
        })
        .await?;
        let exists = rows::elements_named(&self.db, std::slice::from_ref(&checked.name))
            .await?
            .into_iter()
            .any(|r| r.repository_id == repository_id && r.version == checked.version.to_string());
        if exists {
            return Err(RepositoryError::Conflict(format!(
                "{} {} is already in repository `{}`",
                checked.name, checked.version, repository.name
            )));
        }
        driver::open(&repository.driver, &self.settings)?
            .upload(&checked, yaml)
            .await?;
        let id = Uuid::now_v7();
        rows::insert_element(
            &self.db,
            repository_id,
            rows::ElementWrite {
                id,
                name: checked.name.clone(),
                version: checked.version.to_string(),
                hash: Some(hex::encode(Sha256::digest(yaml.as_bytes()))),
                manifest: Some(checked.document.to_string()),
                artifacts: Some(Vec::new()),
            },
        )
        .await?;
        self.element(id).await
    }
}

/// The shape every manifest's blueprint part must have: `resources` is a
/// mapping of named resources, each a mapping with a string `type`.
fn check_blueprint(
    document: &serde_json::Value,
    row: &rows::ElementRow,
) -> Result<(), RepositoryError> {
    let origin = format!("{} {}", row.name, row.version);
    let resources = document
        .get("resources")
        .and_then(|r| r.as_object())
        .ok_or_else(|| {
            RepositoryError::Manifest(format!("{origin}: field `resources`: must be a mapping"))
        })?;
    for (name, resource) in resources {
        let Some(resource) = resource.as_object() else {
            return Err(RepositoryError::Manifest(format!(
                "{origin}: field `resources.{name}`: must be a mapping"
            )));
        };
        if !resource.get("type").is_some_and(|t| t.is_string()) {
            return Err(RepositoryError::Manifest(format!(
                "{origin}: field `resources.{name}.type`: missing or not a string"
            )));
        }
    }
    Ok(())
}
