//! One sync of a repository: read the inventory as a stream, add new elements,
//! update changed ones, remove stale ones (never an installed one), and in COPY
//! mode fetch every new or changed manifest (and any still missing). Writes go
//! in batches, each batch one transaction, so a failure leaves whole rows and
//! keeps what was stored.
//!
//! A bad entry or manifest is recorded as an invalid element and the sync goes
//! on: the repository ends `ACTIVE`, saying how many are invalid. Only a source
//! that cannot be read (or a store that cannot be written) ends it in `ERROR`.

mod diff;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use chrono::Utc;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::driver::{self, Found};
use super::{InvalidElement, Repositories, RepositoryError, RepositoryStatus, SyncEvent, SyncMode};
use crate::store::direct::Direct;
use crate::store::repositories as rows;
use diff::{Diff, KnownStored, Stats};

/// Elements written per transaction.
const BATCH: usize = 1000;

/// Runs a sync and records its outcome on the repository; `Err` only when even
/// that could not be written.
pub async fn run(repos: &Repositories, id: Uuid, refetch: bool) -> Result<(), RepositoryError> {
    let db = &repos.db;
    let Some(row) = rows::find_repository(db, id).await? else {
        return Ok(());
    };
    let repository = repos.to_repository(row)?;
    rows::set_repository_status(db, id, RepositoryStatus::Syncing, None).await?;
    rows::set_repository_progress(db, id, 0, 0).await?;
    publish(repos, id, RepositoryStatus::Syncing, None, (0, 0, 0));
    tracing::info!(repository.id = %id, repository.name = %repository.name, "sync started");
    let outcome = sync_by_deadline(repos, &repository, refetch).await;
    let interval =
        std::time::Duration::from_secs(repository.refresh_interval_seconds.max(0) as u64);
    match outcome {
        Ok(stats) => {
            repos.synced(id);
            finished(repos, id, &stats, after(interval)).await
        }
        Err(e) => {
            let wait = repos.retry_in(id, interval);
            failed(repos, &repository, e, wait).await
        }
    }
}

/// Now and `wait`.
fn after(wait: std::time::Duration) -> chrono::DateTime<Utc> {
    Utc::now() + chrono::TimeDelta::from_std(wait).unwrap_or(chrono::TimeDelta::MAX)
}

/// [`sync`] within the total deadline: a source that trickles bytes (each
/// within the idle deadline) or a provider that streams its inventory slowly
/// ends here. Returns once no batch write of the sync is in flight.
async fn sync_by_deadline(
    repos: &Repositories,
    repository: &super::Repository,
    refetch: bool,
) -> Result<Stats, RepositoryError> {
    let deadline = repos.settings.sync_deadline;
    let writes = TaskTracker::new();
    let syncing = sync(repos, repository, refetch, &writes);
    let outcome = match tokio::time::timeout(deadline, syncing).await {
        Ok(outcome) => outcome,
        Err(_elapsed) => Err(RepositoryError::Source(format!(
            "the sync passed its deadline of {}s (sync_deadline_seconds) and was stopped",
            deadline.as_secs_f32()
        ))),
    };
    // A batch write a stopped (or failed) sync left in flight cannot be
    // cancelled: it ends before the outcome is recorded, so a sync started
    // next reads what it stored instead of writing the same rows again.
    writes.close();
    writes.wait().await;
    outcome
}

/// Records a sync that read its source to the end: the repository is
/// `ACTIVE`, saying how many elements are invalid.
async fn finished(
    repos: &Repositories,
    id: Uuid,
    stats: &Stats,
    next: chrono::DateTime<Utc>,
) -> Result<(), RepositoryError> {
    tracing::info!(
        repository.id = %id,
        seen = stats.seen, added = stats.added, updated = stats.updated, removed = stats.removed,
        invalid = stats.invalid,
        "sync finished"
    );
    let message =
        (stats.invalid > 0).then(|| format!("{} elements, {} invalid", stats.seen, stats.invalid));
    rows::finish_sync(
        &repos.db,
        id,
        RepositoryStatus::Active,
        message.clone(),
        Some(Utc::now()),
        next,
    )
    .await?;
    publish(
        repos,
        id,
        RepositoryStatus::Active,
        message,
        (stats.seen, stats.stored, stats.invalid),
    );
    Ok(())
}

/// Records a sync that failed with `e`: the repository is in `ERROR`, with
/// a message that holds no secret of its URL nor the store's insides, and
/// says when it is tried again (`wait`).
async fn failed(
    repos: &Repositories,
    repository: &super::Repository,
    e: RepositoryError,
    wait: std::time::Duration,
) -> Result<(), RepositoryError> {
    let next = after(wait);
    let id = repository.id;
    // Whatever a driver or library put in the message, the URL's
    // secrets do not reach the log, the row or the events.
    let message = match &repository.driver {
        driver::DriverSpec::Http { url } => crate::redact::message(&e.to_string(), url),
        driver::DriverSpec::Local { .. }
        | driver::DriverSpec::Migration
        | driver::DriverSpec::Provider { .. } => e.to_string(),
    };
    tracing::warn!(repository.id = %id, error = %message, "sync failed");
    let message = match e {
        RepositoryError::Db(_) | RepositoryError::Corrupt(_) => {
            "internal error while storing elements".to_owned()
        }
        RepositoryError::Invalid(_)
        | RepositoryError::NotFound(_)
        | RepositoryError::Conflict(_)
        | RepositoryError::AlreadyInstalled(_)
        | RepositoryError::HasDependents { .. }
        | RepositoryError::Resolve(_)
        | RepositoryError::Inventory(_)
        | RepositoryError::Manifest(_)
        | RepositoryError::Source(_)
        | RepositoryError::Deployment(_) => message,
    };
    let message = format!(
        "{message} (retrying in {})",
        crate::text::duration_words(wait)
    );
    rows::finish_sync(
        &repos.db,
        id,
        RepositoryStatus::Error,
        Some(message.clone()),
        None,
        next,
    )
    .await?;
    publish(
        repos,
        id,
        RepositoryStatus::Error,
        Some(message),
        (-1, -1, -1),
    );
    Ok(())
}

/// Tells subscribers where a sync stands: (seen, stored, invalid), `-1` for
/// an unknown count.
fn publish(
    repos: &Repositories,
    id: Uuid,
    status: RepositoryStatus,
    message: Option<String>,
    (seen, stored, invalid): (i64, i64, i64),
) {
    repos.bus.publish(SyncEvent {
        repository_id: id,
        status,
        message,
        seen,
        stored,
        invalid,
    });
}

/// The sync itself: what is stored is loaded while the inventory starts
/// streaming in, each entry is compared with it and the changes written in
/// batches, then the sync is settled.
async fn sync(
    repos: &Repositories,
    repository: &super::Repository,
    refetch: bool,
    writes: &TaskTracker,
) -> Result<Stats, RepositoryError> {
    let db = &repos.db;
    let id = repository.id;
    let source = driver::open(&repository.driver, &repos.settings)?;

    let (tx, mut rx) = mpsc::channel::<Found>(BATCH);
    // Once loaded, what is stored tells the driver which entries it need
    // not build: those listed as they were (most of a refresh).
    let copy = repository.sync_mode == SyncMode::Copy;
    let holding = Arc::new(KnownStored::new(copy, refetch));
    let mut reading = Reading::new(source.inventory(tx, holding.clone()));
    let direct = own_connection(db, id);
    // Load what is stored while the source is fetched and parsing starts.
    let (existing, direct) = reading
        .alongside(diff::load_existing(db, id, direct))
        .await?;
    let existing = Arc::new(existing);
    let _ = holding.existing.set(existing.clone());
    let mut diff = Diff::new(existing, copy, refetch);
    diff.direct = direct;
    diff.writes = writes.clone();
    // Take whatever the parser has handed over at once: one wake-up and one
    // `select!` per run of entries, not per entry.
    let mut received = Vec::with_capacity(BATCH);
    while reading.receive(&mut rx, &mut received).await > 0 {
        for found in received.drain(..) {
            take(repos, id, &mut diff, found).await?;
        }
    }
    let read = reading.finish().await;
    // Keep what was read before a failure: write it, then report the failure.
    diff.write(db, id).await?;
    diff.finish_write(db, id).await?;
    diff.checkpoint(id);
    read?;
    settle(repos, id, &*source, diff).await
}

/// On SQLite, a connection of the sync's own does the bulk reads and writes
/// (see `store::direct`); on PostgreSQL, the pool.
fn own_connection(db: &crate::store::Db, id: Uuid) -> Option<Direct> {
    match Direct::open(db).map(|opened| opened.and_then(Direct::for_bulk)) {
        Some(Ok(direct)) => Some(direct),
        Some(Err(e)) => {
            tracing::warn!(repository.id = %id, error = %e, "the sync writes through the pool: its own SQLite connection did not open");
            None
        }
        None => None,
    }
}

/// Takes one thing the driver handed over into `diff`, writing a full batch.
async fn take(
    repos: &Repositories,
    id: Uuid,
    diff: &mut Diff,
    found: Found,
) -> Result<(), RepositoryError> {
    diff.take(found)?;
    if diff.pending() >= BATCH {
        // The batch is written while the next one is read; what is
        // published is what the last finished write stored.
        if let Some((seen, stored)) = diff.write(&repos.db, id).await? {
            publish(
                repos,
                id,
                RepositoryStatus::Syncing,
                None,
                (seen, stored, diff.invalid.len() as i64),
            );
        }
    }
    Ok(())
}

/// With the whole inventory read and written: removes what it no longer
/// lists (unless installed), records what it found wrong, fetches (COPY)
/// the manifests it did not carry, and counts.
async fn settle(
    repos: &Repositories,
    id: Uuid,
    source: &dyn driver::Driver,
    mut diff: Diff,
) -> Result<Stats, RepositoryError> {
    let db = &repos.db;
    diff.stats.removed = rows::delete_elements(db, &diff.stale()).await?;
    diff.stored -= diff.stats.removed as i64;
    rows::set_repository_progress(db, id, diff.stats.seen, diff.stored).await?;
    // What this listing found wrong replaces what the last one found.
    let problems = std::mem::take(&mut diff.invalid)
        .into_iter()
        .map(InvalidElement::into_write)
        .collect();
    rows::replace_listing_problems(db, id, problems).await?;

    if !diff.fetch_later.is_empty() {
        fetch_manifests(repos, id, source, std::mem::take(&mut diff.fetch_later)).await?;
    }
    diff.stats.stored = diff.stored;
    diff.stats.invalid = rows::count_invalid(db, id).await? as i64;
    Ok(diff.stats)
}

/// The driver reading the inventory, polled alongside whatever the sync
/// waits for; its result, once it has ended.
struct Reading<'a> {
    inventory: Pin<Box<dyn Future<Output = Result<(), RepositoryError>> + Send + 'a>>,
    done: Option<Result<(), RepositoryError>>,
}

impl<'a> Reading<'a> {
    fn new(
        inventory: Pin<Box<dyn Future<Output = Result<(), RepositoryError>> + Send + 'a>>,
    ) -> Self {
        Self {
            inventory,
            done: None,
        }
    }

    /// Waits for `other`, reading meanwhile.
    async fn alongside<T>(&mut self, other: impl Future<Output = T>) -> T {
        tokio::pin!(other);
        loop {
            tokio::select! {
                out = &mut other => return out,
                result = &mut self.inventory, if self.done.is_none() => self.done = Some(result),
            }
        }
    }

    /// Moves what the driver has handed over into `received` (none once it
    /// has ended), reading meanwhile.
    async fn receive(
        &mut self,
        rx: &mut mpsc::Receiver<Found>,
        received: &mut Vec<Found>,
    ) -> usize {
        loop {
            tokio::select! {
                count = rx.recv_many(received, BATCH) => return count,
                result = &mut self.inventory, if self.done.is_none() => self.done = Some(result),
            }
        }
    }

    /// How the reading ended.
    async fn finish(self) -> Result<(), RepositoryError> {
        match self.done {
            Some(result) => result,
            None => self.inventory.await,
        }
    }
}

/// COPY: fetches the manifests the inventory did not carry, a few at once. A
/// bad manifest (missing, too large, not valid, past the YAML bounds) is
/// recorded as an invalid element and the others go on; anything else (the
/// source gone, the store failing) stops the fetch.
async fn fetch_manifests(
    repos: &Repositories,
    repository_id: Uuid,
    source: &dyn driver::Driver,
    wanted: Vec<(Uuid, String, crate::resolve::Version)>,
) -> Result<(), RepositoryError> {
    let db = &repos.db;
    let mut fetches = futures_util::stream::iter(wanted)
        .map(|(element_id, name, version)| async move {
            let fetched = match source.element(&name, &version).await {
                Ok(fetched) => fetched,
                Err(e) if e.is_element_problem() => {
                    let path = source.element_path(&name, &version);
                    let problem = InvalidElement::of_element(
                        element_id,
                        &name,
                        &version.to_string(),
                        path,
                        &e,
                    );
                    tracing::info!(repository.id = %repository_id, element.name = %name,
                        element.version = %version, error = %e, "invalid element");
                    rows::record_element_problem(db, repository_id, problem.into_write()).await?;
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
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
    Ok(())
}
