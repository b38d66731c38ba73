//! One sync of a repository: read the inventory as a stream, add new elements,
//! update changed ones, remove stale ones (never an installed one), and in COPY
//! mode fetch every new or changed manifest. Writes go in batches, each batch one
//! transaction, so a failure leaves whole rows and keeps what was stored.

use std::collections::HashSet;

use chrono::Utc;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::driver::{self, Listed};
use super::{Repositories, RepositoryError, RepositoryStatus, SyncEvent, SyncMode};
use crate::store::repositories as rows;

/// Elements written per transaction.
const BATCH: usize = 1000;

/// Runs a sync and records its outcome on the repository; `Err` only when even
/// that could not be written.
pub async fn run(repos: &Repositories, id: Uuid) -> Result<(), RepositoryError> {
    let db = &repos.db;
    let Some(row) = rows::find_repository(db, id).await? else {
        return Ok(());
    };
    let repository = super::to_repository(row)?;
    rows::set_repository_status(db, id, RepositoryStatus::Syncing.as_str(), None).await?;
    rows::set_repository_progress(db, id, 0, 0).await?;
    publish(repos, id, RepositoryStatus::Syncing, None, 0, 0);
    tracing::info!(repository.id = %id, repository.name = %repository.name, "sync started");
    // The total deadline: a source that trickles bytes (each within the idle
    // deadline) or a provider that streams its inventory slowly ends here.
    let deadline = repos.settings.sync_deadline;
    let outcome = match tokio::time::timeout(deadline, sync(repos, &repository)).await {
        Ok(outcome) => outcome,
        Err(_elapsed) => Err(RepositoryError::Source(format!(
            "the sync passed its deadline of {}s (sync_deadline_seconds) and was stopped",
            deadline.as_secs_f32()
        ))),
    };
    let next = Utc::now() + chrono::TimeDelta::seconds(repository.refresh_interval_seconds);
    match outcome {
        Ok(stats) => {
            tracing::info!(
                repository.id = %id,
                seen = stats.seen, added = stats.added, updated = stats.updated, removed = stats.removed,
                "sync finished"
            );
            rows::finish_sync(
                db,
                id,
                RepositoryStatus::Active.as_str(),
                None,
                Some(Utc::now()),
                next,
            )
            .await?;
            publish(
                repos,
                id,
                RepositoryStatus::Active,
                None,
                stats.seen,
                stats.stored,
            );
        }
        Err(e) => {
            // Whatever a driver or library put in the message, the URL's
            // secrets do not reach the log, the row or the events.
            let message = match &repository.driver {
                driver::DriverSpec::Http { url } => crate::redact::message(&e.to_string(), url),
                _ => e.to_string(),
            };
            tracing::warn!(repository.id = %id, error = %message, "sync failed");
            let message = match e {
                RepositoryError::Db(_) | RepositoryError::Corrupt(_) => {
                    "internal error while storing elements".to_owned()
                }
                _ => message,
            };
            rows::finish_sync(
                db,
                id,
                RepositoryStatus::Error.as_str(),
                Some(message.clone()),
                None,
                next,
            )
            .await?;
            publish(repos, id, RepositoryStatus::Error, Some(message), -1, -1);
        }
    }
    Ok(())
}

#[derive(Default)]
struct Stats {
    seen: i64,
    added: i64,
    updated: i64,
    removed: u64,
    stored: i64,
}

/// Tells subscribers where a sync stands (`-1`: unknown counts).
fn publish(
    repos: &Repositories,
    id: Uuid,
    status: RepositoryStatus,
    message: Option<String>,
    seen: i64,
    stored: i64,
) {
    repos.bus.publish(SyncEvent {
        repository_id: id,
        status,
        message,
        seen,
        stored,
    });
}

async fn sync(
    repos: &Repositories,
    repository: &super::Repository,
) -> Result<Stats, RepositoryError> {
    let db = &repos.db;
    let id = repository.id;
    let source = driver::open(&repository.driver, &repos.settings)?;

    let (tx, mut rx) = mpsc::channel::<Listed>(BATCH);
    let reading = source.inventory(tx);
    tokio::pin!(reading);
    let mut reading_done = None;
    // Load what is stored while the source is fetched and parsing starts.
    let loading = rows::existing_elements(db, id);
    tokio::pin!(loading);
    let existing = loop {
        tokio::select! {
            loaded = &mut loading => break loaded?,
            result = &mut reading, if reading_done.is_none() => reading_done = Some(result),
        }
    };
    let mut diff = Diff::new(existing, repository.sync_mode == SyncMode::Copy);
    loop {
        let listed = tokio::select! {
            listed = rx.recv() => listed,
            result = &mut reading, if reading_done.is_none() => {
                reading_done = Some(result);
                continue;
            }
        };
        let Some(listed) = listed else {
            break;
        };
        diff.take(listed)?;
        if diff.pending() >= BATCH {
            diff.write(db, id).await?;
            publish(
                repos,
                id,
                RepositoryStatus::Syncing,
                None,
                diff.stats.seen,
                diff.stored,
            );
        }
    }
    let read = match reading_done {
        Some(result) => result,
        None => reading.await,
    };
    // Keep what was read before a failure: write it, then report the failure.
    diff.write(db, id).await?;
    read?;

    // Whatever the inventory no longer lists goes, unless it is installed.
    let stale: Vec<Uuid> = diff
        .existing
        .values()
        .filter(|(_, _, installed)| !installed)
        .map(|(element_id, _, _)| *element_id)
        .collect();
    diff.stats.removed = rows::delete_elements(db, &stale).await?;
    diff.stored -= diff.stats.removed as i64;
    rows::set_repository_progress(db, id, diff.stats.seen, diff.stored).await?;

    if !diff.fetch_later.is_empty() {
        fetch_manifests(repos, &*source, std::mem::take(&mut diff.fetch_later)).await?;
    }
    diff.stats.stored = diff.stored;
    Ok(diff.stats)
}

/// What one sync found so far against what was stored: the writes not yet
/// made, the manifests to fetch (COPY), the counts.
struct Diff {
    copy: bool,
    /// Stored elements the inventory has not listed (yet).
    existing: rows::Existing,
    seen_keys: HashSet<(String, String)>,
    inserts: Vec<rows::ElementWrite>,
    updates: Vec<rows::ElementWrite>,
    fetch_later: Vec<(Uuid, String, crate::resolve::Version)>,
    stats: Stats,
    /// Elements stored for the repository once the pending writes are made.
    stored: i64,
}

impl Diff {
    fn new(existing: rows::Existing, copy: bool) -> Self {
        Self {
            copy,
            stored: existing.len() as i64,
            existing,
            seen_keys: HashSet::new(),
            inserts: Vec::new(),
            updates: Vec::new(),
            fetch_later: Vec::new(),
            stats: Stats::default(),
        }
    }

    fn pending(&self) -> usize {
        self.inserts.len() + self.updates.len()
    }

    /// One inventory entry: new, changed, or as stored.
    fn take(&mut self, Listed { entry, manifest }: Listed) -> Result<(), RepositoryError> {
        self.stats.seen += 1;
        let key = (entry.name.clone(), entry.version.to_string());
        if !self.seen_keys.insert(key.clone()) {
            return Err(RepositoryError::Inventory(format!(
                "element `{}` {} is listed twice",
                key.0, key.1
            )));
        }
        let manifest_text = manifest.map(|m| m.document.to_string());
        let artifacts = self.copy.then(|| {
            entry
                .artifacts
                .iter()
                .map(|a| (a.urn(), a.category.clone(), a.file_name.clone()))
                .collect()
        });
        let (element_id, new) = match self.existing.remove(&key) {
            // Time-ordered ids keep inserts at the end of the primary-key
            // index instead of scattering them across it.
            None => (Uuid::now_v7(), true),
            Some((element_id, hash, _installed))
                if hash.as_deref() != Some(entry.hash.as_str()) =>
            {
                (element_id, false)
            }
            Some(_) => return Ok(()),
        };
        if self.copy && manifest_text.is_none() {
            self.fetch_later
                .push((element_id, entry.name.clone(), entry.version.clone()));
        }
        let write = rows::ElementWrite {
            id: element_id,
            name: entry.name,
            version: key.1,
            hash: Some(entry.hash),
            // A changed entry's manifest is fetched again (LAZY: on access).
            manifest: manifest_text,
            artifacts,
        };
        if new {
            self.inserts.push(write);
            self.stats.added += 1;
            self.stored += 1;
        } else {
            self.updates.push(write);
            self.stats.updated += 1;
        }
        Ok(())
    }

    /// Writes what is pending as one transaction, then the progress.
    async fn write(&mut self, db: &crate::store::Db, id: Uuid) -> Result<(), RepositoryError> {
        rows::write_batch(
            db,
            id,
            std::mem::take(&mut self.inserts),
            std::mem::take(&mut self.updates),
        )
        .await?;
        rows::set_repository_progress(db, id, self.stats.seen, self.stored).await?;
        Ok(())
    }
}

/// COPY: fetches the manifests the inventory did not carry, a few at once. A
/// bad manifest (too large, not valid, past the YAML bounds) does not stop the
/// others: each good one is stored, and the first bad one is reported at the
/// end (with how many more there were). Anything else stops the fetch.
async fn fetch_manifests(
    repos: &Repositories,
    source: &dyn driver::Driver,
    wanted: Vec<(Uuid, String, crate::resolve::Version)>,
) -> Result<(), RepositoryError> {
    let db = &repos.db;
    let mut fetches = futures_util::stream::iter(wanted)
        .map(|(element_id, name, version)| async move {
            let fetched = source.element(&name, &version).await?;
            let artifacts = fetched.artifacts.map(|list| {
                list.iter()
                    .map(|a| (a.urn(), a.category.clone(), a.file_name.clone()))
                    .collect()
            });
            rows::store_manifest(
                db,
                element_id,
                fetched.manifest.document.to_string(),
                artifacts,
            )
            .await?;
            Ok::<_, RepositoryError>(())
        })
        .buffer_unordered(repos.settings.fetch_concurrency.max(1));
    let mut refused: Option<RepositoryError> = None;
    let mut more = 0usize;
    while let Some(result) = fetches.next().await {
        match result {
            Ok(()) => {}
            Err(e @ RepositoryError::Manifest(_)) => match refused {
                None => refused = Some(e),
                Some(_) => more += 1,
            },
            Err(e) => return Err(e),
        }
    }
    match refused {
        None => Ok(()),
        Some(e) if more == 0 => Err(e),
        Some(e) => Err(RepositoryError::Manifest(format!(
            "{e} (and {more} more manifests refused)"
        ))),
    }
}
