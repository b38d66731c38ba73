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
    let outcome = sync(repos, &repository).await;
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
            let message = e.to_string();
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
    let copy = repository.sync_mode == SyncMode::Copy;
    let source = driver::open(&repository.driver, &repos.settings)?;
    let mut stats = Stats::default();
    let mut seen_keys: HashSet<(String, String)> = HashSet::new();
    let mut fetch_later: Vec<(Uuid, String, crate::resolve::Version)> = Vec::new();

    let (tx, mut rx) = mpsc::channel::<Listed>(BATCH);
    let reading = source.inventory(tx);
    tokio::pin!(reading);
    let mut reading_done = None;
    // Load what is stored while the source is fetched and parsing starts.
    let loading = rows::existing_elements(db, id);
    tokio::pin!(loading);
    let mut existing = loop {
        tokio::select! {
            loaded = &mut loading => break loaded?,
            result = &mut reading, if reading_done.is_none() => reading_done = Some(result),
        }
    };
    let mut stored = existing.len() as i64;
    let mut inserts = Vec::new();
    let mut updates = Vec::new();
    loop {
        let listed = tokio::select! {
            listed = rx.recv() => listed,
            result = &mut reading, if reading_done.is_none() => {
                reading_done = Some(result);
                continue;
            }
        };
        let Some(Listed { entry, manifest }) = listed else {
            break;
        };
        stats.seen += 1;
        let key = (entry.name.clone(), entry.version.to_string());
        if !seen_keys.insert(key.clone()) {
            return Err(RepositoryError::Inventory(format!(
                "element `{}` {} is listed twice",
                key.0, key.1
            )));
        }
        let manifest_text = manifest.map(|m| m.document.to_string());
        let artifacts = if copy {
            Some(
                entry
                    .artifacts
                    .iter()
                    .map(|a| (a.urn(), a.category.clone(), a.file_name.clone()))
                    .collect(),
            )
        } else {
            None
        };
        match existing.remove(&key) {
            None => {
                // Time-ordered ids keep inserts at the end of the primary-key
                // index instead of scattering them across it.
                let element_id = Uuid::now_v7();
                if copy && manifest_text.is_none() {
                    fetch_later.push((element_id, entry.name.clone(), entry.version.clone()));
                }
                inserts.push(rows::ElementWrite {
                    id: element_id,
                    name: entry.name,
                    version: key.1,
                    hash: Some(entry.hash),
                    manifest: manifest_text,
                    artifacts,
                });
                stats.added += 1;
                stored += 1;
            }
            Some((element_id, hash, _installed))
                if hash.as_deref() != Some(entry.hash.as_str()) =>
            {
                if copy && manifest_text.is_none() {
                    fetch_later.push((element_id, entry.name.clone(), entry.version.clone()));
                }
                updates.push(rows::ElementWrite {
                    id: element_id,
                    name: entry.name,
                    version: key.1,
                    hash: Some(entry.hash),
                    // A changed entry's manifest is fetched again (LAZY: on access).
                    manifest: manifest_text,
                    artifacts,
                });
                stats.updated += 1;
            }
            Some(_) => {}
        }
        if inserts.len() + updates.len() >= BATCH {
            rows::write_batch(
                db,
                id,
                std::mem::take(&mut inserts),
                std::mem::take(&mut updates),
            )
            .await?;
            rows::set_repository_progress(db, id, stats.seen, stored).await?;
            publish(
                repos,
                id,
                RepositoryStatus::Syncing,
                None,
                stats.seen,
                stored,
            );
        }
    }
    let read = match reading_done {
        Some(result) => result,
        None => reading.await,
    };
    // Keep what was read before a failure: write it, then report the failure.
    rows::write_batch(db, id, inserts, updates).await?;
    rows::set_repository_progress(db, id, stats.seen, stored).await?;
    read?;

    // Whatever the inventory no longer lists goes, unless it is installed.
    let stale: Vec<Uuid> = existing
        .values()
        .filter(|(_, _, installed)| !installed)
        .map(|(element_id, _, _)| *element_id)
        .collect();
    stats.removed = rows::delete_elements(db, &stale).await?;
    stored -= stats.removed as i64;
    rows::set_repository_progress(db, id, stats.seen, stored).await?;

    if copy && !fetch_later.is_empty() {
        let source = &source;
        let mut fetches = futures_util::stream::iter(fetch_later)
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
        while let Some(result) = fetches.next().await {
            result?;
        }
    }
    stats.stored = stored;
    Ok(stats)
}
