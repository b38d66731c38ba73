//! Repositories of versioned elements: drivers, sync, and the element
//! lifecycle (install, upgrade, uninstall, edit, upload).
//!
//! The `Repositories` service owns the `repositories`, `elements`, `artifacts`
//! and `element_bindings` tables (through `store::repositories`); resolution is
//! delegated to the pure `resolve` module.

pub mod driver;
mod elements;
pub mod installations;
mod invalid;
pub mod inventory;
pub mod manifest;
mod sealed;
mod settings;
mod sync;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::store::{Db, DbErr};
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

pub use crate::seal::Resealed;
pub use driver::DriverSpec;
pub use elements::{InstallPlan, PlannedElement};
pub use sealed::reseal;
pub use settings::{RepositoryFlags, RepositorySettings};

use crate::events::Bus;
use crate::resolve::ResolveError;
use crate::store::repositories as rows;
use crate::text::text_enum;

#[derive(Debug, thiserror::Error)]
pub enum RepositoryError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    AlreadyInstalled(String),
    #[error("{message}")]
    HasDependents {
        message: String,
        dependents: Vec<String>,
    },
    #[error(transparent)]
    Resolve(ResolveError),
    #[error("{0}")]
    Inventory(String),
    #[error("{0}")]
    Manifest(String),
    #[error("{0}")]
    Source(String),
    /// An element's installation (its deployment) failed.
    #[error("{0}")]
    Deployment(String),
    #[error("a stored row is not valid: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Db(DbErr),
}

impl RepositoryError {
    /// True when the error is about one element (its inventory entry or its
    /// manifest), not about the source: such an element is recorded as
    /// invalid and the sync goes on.
    pub fn is_element_problem(&self) -> bool {
        match self {
            RepositoryError::Inventory(_)
            | RepositoryError::Manifest(_)
            | RepositoryError::Resolve(_)
            | RepositoryError::Invalid(_) => true,
            RepositoryError::NotFound(_)
            | RepositoryError::Conflict(_)
            | RepositoryError::AlreadyInstalled(_)
            | RepositoryError::HasDependents { .. }
            | RepositoryError::Source(_)
            | RepositoryError::Deployment(_)
            | RepositoryError::Corrupt(_)
            | RepositoryError::Db(_) => false,
        }
    }
}

impl From<DbErr> for RepositoryError {
    /// A unique or foreign key the store refused is a conflict, not a fault.
    fn from(e: DbErr) -> Self {
        if crate::store::is_conflict(&e) {
            Self::Conflict("that conflicts with an existing record".into())
        } else {
            Self::Db(e)
        }
    }
}

impl From<crate::text::UnknownText> for RepositoryError {
    fn from(e: crate::text::UnknownText) -> Self {
        RepositoryError::Corrupt(e.to_string())
    }
}

text_enum! {
    pub enum SyncMode {
        Lazy = "LAZY",
        Copy = "COPY",
    }
}

/// The repository and element statuses, as their columns hold them: the
/// store owns them (see `store::states`).
pub use crate::store::states::{ElementStatus, RepositoryStatus};

#[derive(Clone, Debug)]
pub struct Repository {
    pub id: Uuid,
    pub name: String,
    pub driver: DriverSpec,
    pub sync_mode: SyncMode,
    pub priority: i32,
    pub refresh_interval_seconds: i64,
    pub status: RepositoryStatus,
    pub status_message: Option<String>,
    pub elements_seen: i64,
    pub elements_stored: i64,
    pub last_synced_at: Option<DateTime<Utc>>,
    pub next_refresh_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Clone, Debug)]
pub struct Element {
    pub id: Uuid,
    pub repository_id: Uuid,
    pub name: String,
    pub version: String,
    /// `None` until fetched (LAZY repositories).
    pub manifest: Option<serde_json::Value>,
    pub status: ElementStatus,
    pub status_message: Option<String>,
    pub installed: bool,
    pub installed_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// An inventory entry, file or manifest of a repository that could not be
/// taken as an element, and why. A sync records these and goes on; the
/// repository stays `ACTIVE` and says how many there are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidElement {
    /// The element's name and version, where they could be read.
    pub name: Option<String>,
    pub version: Option<String>,
    /// Where it is, relative to the repository's root: a file
    /// (`web/1.0.0/manifests/web.yaml`), or an inventory entry
    /// (`inventory.json#/elements/web/1.0.0`).
    pub path: String,
    /// What is wrong, naming the field.
    pub message: String,
    /// The stored element it belongs to (a listed element whose manifest is
    /// bad), if any.
    pub element_id: Option<Uuid>,
}

#[derive(Clone, Debug)]
pub struct Artifact {
    pub element_id: Uuid,
    pub urn: String,
    pub category: String,
    pub file_name: String,
}

pub struct NewRepository {
    pub name: String,
    pub driver: DriverSpec,
    pub sync_mode: SyncMode,
    pub priority: i32,
    pub refresh_interval_seconds: i64,
}

#[derive(Default)]
pub struct RepositoryPatch {
    pub name: Option<String>,
    pub driver: Option<DriverSpec>,
    pub sync_mode: Option<SyncMode>,
    pub priority: Option<i32>,
    pub refresh_interval_seconds: Option<i64>,
}

pub use rows::ElementFilter;

/// Where a repository's sync stands: published when it starts, per stored
/// batch, and when it ends.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SyncEvent {
    pub repository_id: Uuid,
    pub status: RepositoryStatus,
    pub message: Option<String>,
    /// Entries read so far; `-1` when unknown (a failed sync).
    pub seen: i64,
    /// Elements stored; `-1` when unknown.
    pub stored: i64,
    /// Entries and manifests found invalid so far; `-1` when unknown.
    pub invalid: i64,
}

/// The first wait before a failed sync runs again (then twice as long after
/// each failure in a row).
pub const RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest wait between tries of a failing sync.
pub const RETRY_MOST: std::time::Duration = std::time::Duration::from_secs(300);

#[derive(Clone)]
pub struct Repositories {
    db: Db,
    settings: RepositorySettings,
    /// Repositories with a sync running in this process.
    syncing: Arc<Mutex<HashSet<Uuid>>>,
    /// Repositories whose last syncs failed: how many in a row, and when
    /// the next try is due (see [`Repositories::retry_in`]).
    failures: Arc<Mutex<HashMap<Uuid, (u32, tokio::time::Instant)>>>,
    /// Wakes the refresh loop when a failed sync set a try sooner than its
    /// next check.
    retry_set: Arc<tokio::sync::Notify>,
    tasks: TaskTracker,
    stopping: CancellationToken,
    bus: Bus<SyncEvent>,
}

impl Repositories {
    pub fn new(
        db: Db,
        settings: RepositorySettings,
        bus: Bus<SyncEvent>,
        stopping: CancellationToken,
    ) -> Self {
        Self {
            db,
            settings,
            syncing: Arc::default(),
            failures: Arc::default(),
            retry_set: Arc::default(),
            tasks: TaskTracker::new(),
            stopping,
            bus,
        }
    }

    /// When a sync of `id` that just failed runs again: [`RETRY_FIRST`]
    /// after its first failure, twice as long after each failure in a row,
    /// at most [`RETRY_MOST`], and never later than its own refresh
    /// interval. A source that was down when the repository was made is
    /// read within seconds of being up, not an hour later. The refresh loop
    /// is woken to start it on time.
    fn retry_in(&self, id: Uuid, interval: std::time::Duration) -> std::time::Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let row = failures.get(&id).map_or(0, |(row, _)| *row);
        let wait = RETRY_FIRST
            .saturating_mul(1 << row.min(16))
            .min(RETRY_MOST)
            .min(interval);
        // A little after the row's `next_refresh_at`, written just after
        // this: the loop then finds it due.
        let due = tokio::time::Instant::now() + wait + std::time::Duration::from_millis(50);
        failures.insert(id, (row + 1, due));
        self.retry_set.notify_one();
        wait
    }

    /// A sync of `id` succeeded (or it was deleted): its next failure is
    /// retried soon again.
    fn synced(&self, id: Uuid) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }

    /// The soonest try of a failed sync that is due, if any.
    fn next_retry(&self) -> Option<tokio::time::Instant> {
        let failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        failures.values().map(|(_, at)| *at).min()
    }

    /// Sync progress of every repository, as it happens.
    pub fn events(&self) -> &Bus<SyncEvent> {
        &self.bus
    }

    pub async fn create(&self, new: NewRepository) -> Result<Repository, RepositoryError> {
        check_repository_name(&new.name)?;
        new.driver.validate()?;
        check_interval(new.refresh_interval_seconds)?;
        let id = Uuid::new_v4();
        let row = rows::insert_repository(
            &self.db,
            rows::NewRepository {
                id,
                name: new.name.clone(),
                driver_kind: new.driver.kind().to_owned(),
                driver_spec: sealed::stored(self.key(), id, &new.driver),
                sync_mode: new.sync_mode.as_str().to_owned(),
                priority: new.priority,
                refresh_interval_seconds: new.refresh_interval_seconds,
            },
            RepositoryStatus::New,
        )
        .await
        .map_err(|e| conflict_or(e, || format!("a repository named `{}` exists", new.name)))?;
        let repository = self.to_repository(row)?;
        self.start_sync(repository.id);
        Ok(repository)
    }

    pub async fn update(
        &self,
        id: Uuid,
        patch: RepositoryPatch,
    ) -> Result<Repository, RepositoryError> {
        let row = self.repository_row(id).await?;
        let resync = patch.driver.is_some() || patch.sync_mode.is_some();
        if let Some(name) = &patch.name {
            check_repository_name(name)?;
        }
        if let Some(driver) = &patch.driver {
            driver.validate()?;
        }
        if let Some(seconds) = patch.refresh_interval_seconds {
            check_interval(seconds)?;
        }
        let change = rows::RepositoryChange {
            name: patch.name,
            driver: patch.driver.map(|driver| {
                (
                    driver.kind().to_owned(),
                    sealed::stored(self.key(), id, &driver),
                )
            }),
            sync_mode: patch.sync_mode.map(|mode| mode.as_str().to_owned()),
            priority: patch.priority,
            refresh_interval_seconds: patch.refresh_interval_seconds,
        };
        let row = rows::update_repository(&self.db, row, change)
            .await
            .map_err(|e| conflict_or(e, || "a repository with that name exists".to_owned()))?;
        if resync {
            self.start_sync(id);
        }
        self.to_repository(row)
    }

    pub async fn delete(&self, id: Uuid) -> Result<(), RepositoryError> {
        let row = self.repository_row(id).await?;
        let installed = rows::count_installed_in(&self.db, id).await?;
        if installed > 0 {
            return Err(RepositoryError::Conflict(format!(
                "repository `{}` holds {installed} installed element(s); uninstall them first",
                row.name
            )));
        }
        rows::delete_repository(&self.db, id).await?;
        self.synced(id);
        Ok(())
    }

    /// Starts a sync now; a sync already running is left to finish. With
    /// `refetch`, every manifest is read again from the source (COPY) or
    /// dropped to be fetched at its next use (LAZY), for a source that
    /// changes manifests without changing their inventory entries; it is
    /// refused while a sync runs, so that it is never silently lost.
    pub async fn refresh(&self, id: Uuid, refetch: bool) -> Result<Repository, RepositoryError> {
        let row = self.repository_row(id).await?;
        if !self.start_sync_with(id, refetch) && refetch {
            return Err(RepositoryError::Conflict(format!(
                "repository `{}` is syncing now; ask for the refetch when the sync has ended",
                row.name
            )));
        }
        self.get(id).await
    }

    /// The secret key drivers with credentials are sealed with.
    fn key(&self) -> Option<&crate::seal::SecretKey> {
        self.settings.secret_key.as_deref()
    }

    /// A stored row as the area shows it, its driver opened.
    fn to_repository(&self, row: rows::RepositoryRow) -> Result<Repository, RepositoryError> {
        to_repository(self.key(), row)
    }

    /// Seals the drivers with credentials stored in the clear by an earlier
    /// version, and checks that the sealed ones open (at start).
    pub async fn seal_stored(&self) -> Result<Resealed, RepositoryError> {
        match self.key() {
            Some(key) => reseal(&self.db, key, key).await,
            None => Ok(Resealed::default()),
        }
    }

    pub async fn get(&self, id: Uuid) -> Result<Repository, RepositoryError> {
        self.to_repository(self.repository_row(id).await?)
    }

    pub async fn list(&self) -> Result<Vec<Repository>, RepositoryError> {
        rows::list_repositories(&self.db)
            .await?
            .into_iter()
            .map(|row| self.to_repository(row))
            .collect()
    }

    async fn repository_row(&self, id: Uuid) -> Result<rows::RepositoryRow, RepositoryError> {
        rows::find_repository(&self.db, id)
            .await?
            .ok_or_else(|| RepositoryError::NotFound(format!("no repository {id}")))
    }

    /// Runs due refreshes until shutdown; first resumes syncs a crash cut short.
    pub async fn run_refresh_loop(self) {
        let mut every = tokio::time::interval(self.settings.refresh_check);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // A failed sync's next try may come before the next check.
            let retry = self
                .next_retry()
                .filter(|at| *at > tokio::time::Instant::now());
            tokio::select! {
                _ = self.stopping.cancelled() => break,
                _ = every.tick() => {}
                _ = self.retry_set.notified() => continue,
                _ = tokio::time::sleep_until(retry.unwrap_or_else(tokio::time::Instant::now)), if retry.is_some() => {}
            }
            match rows::due_repositories(&self.db, Utc::now()).await {
                Ok(due) => due.into_iter().for_each(|r| self.start_sync(r.id)),
                Err(e) => tracing::warn!(error = %e, "looking for due repository refreshes failed"),
            }
        }
        self.finish_syncs().await;
    }

    /// Waits for the syncs under way to end (they end on shutdown): for a
    /// server stopping whose refresh loop is not running, as on a replica
    /// that stepped down as leader.
    pub async fn finish_syncs(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Marks syncs left `SYNCING` by a stopped process as due again. Single
    /// node: with replicas, only the leader may do this (see DESIGN.md).
    pub async fn recover_interrupted(&self) -> Result<(), RepositoryError> {
        for row in rows::list_repositories(&self.db).await? {
            if row.status == RepositoryStatus::Syncing {
                rows::finish_sync(
                    &self.db,
                    row.id,
                    RepositoryStatus::Error,
                    Some("the server stopped during a sync; it will run again".into()),
                    None,
                    Utc::now(),
                )
                .await?;
            }
        }
        Ok(())
    }

    fn start_sync(&self, id: Uuid) {
        self.start_sync_with(id, false);
    }

    /// Starts a sync unless one runs; says whether it started.
    fn start_sync_with(&self, id: Uuid, refetch: bool) -> bool {
        {
            let mut syncing = self.syncing.lock().unwrap_or_else(|e| e.into_inner());
            if !syncing.insert(id) {
                return false;
            }
        }
        let this = self.clone();
        self.tasks.spawn(async move {
            let outcome = tokio::select! {
                outcome = sync::run(&this, id, refetch) => Some(outcome),
                _ = this.stopping.cancelled() => None,
            };
            if let Some(Err(e)) = outcome {
                tracing::error!(repository.id = %id, error = %e, "repository sync could not record its outcome");
            }
            this.syncing.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        });
        true
    }
}

fn check_repository_name(name: &str) -> Result<(), RepositoryError> {
    let trimmed = name.trim();
    if trimmed.is_empty() || trimmed.chars().count() > 100 || trimmed != name {
        return Err(RepositoryError::Invalid(
            "name must be 1 to 100 characters without surrounding spaces".into(),
        ));
    }
    Ok(())
}

fn check_interval(seconds: i64) -> Result<(), RepositoryError> {
    if !(1..=31_536_000).contains(&seconds) {
        return Err(RepositoryError::Invalid(format!(
            "refreshIntervalSeconds must be between 1 and 31536000, not {seconds}"
        )));
    }
    Ok(())
}

fn conflict_or(e: DbErr, message: impl FnOnce() -> String) -> RepositoryError {
    if crate::store::is_conflict(&e) {
        RepositoryError::Conflict(message())
    } else {
        RepositoryError::Db(e)
    }
}

fn to_repository(
    key: Option<&crate::seal::SecretKey>,
    row: rows::RepositoryRow,
) -> Result<Repository, RepositoryError> {
    Ok(Repository {
        driver: sealed::read(key, &row)?,
        sync_mode: row.sync_mode.parse()?,
        status: row.status,
        id: row.id,
        name: row.name,
        priority: row.priority,
        refresh_interval_seconds: row.refresh_interval_seconds,
        status_message: row.status_message,
        elements_seen: row.elements_seen,
        elements_stored: row.elements_stored,
        last_synced_at: row.last_synced_at,
        next_refresh_at: row.next_refresh_at,
        created_at: row.created_at,
        updated_at: row.updated_at,
    })
}

fn to_element(row: rows::ElementRow) -> Result<Element, RepositoryError> {
    Ok(Element {
        manifest: match row.manifest {
            Some(text) => {
                Some(serde_json::from_str(&text).map_err(|e| {
                    RepositoryError::Corrupt(format!("manifest of {}: {e}", row.id))
                })?)
            }
            None => None,
        },
        status: row.status,
        id: row.id,
        repository_id: row.repository_id,
        name: row.name,
        version: row.version,
        status_message: row.status_message,
        installed: row.installed,
        installed_at: row.installed_at,
        created_at: row.created_at,
    })
}
