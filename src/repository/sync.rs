//! One sync of a repository: read the inventory as a stream, add new elements,
//! update changed ones, remove stale ones (never an installed one), and in COPY
//! mode fetch every new or changed manifest (and any still missing). Writes go
//! in batches, each batch one transaction, so a failure leaves whole rows and
//! keeps what was stored.
//!
//! A bad entry or manifest is recorded as an invalid element and the sync goes
//! on: the repository ends `ACTIVE`, saying how many are invalid. Only a source
//! that cannot be read (or a store that cannot be written) ends it in `ERROR`.

use chrono::Utc;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::driver::{self, Found, Listed};
use super::{InvalidElement, Repositories, RepositoryError, RepositoryStatus, SyncEvent, SyncMode};
use crate::store::direct::Direct;
use crate::store::repositories as rows;

/// Maps keyed by element name and version, with foldhash: several times
/// SipHash's speed on these short keys and still seeded at random per map,
/// so an inventory cannot be made to collide them.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// Elements written per transaction.
const BATCH: usize = 1000;

/// Runs a sync and records its outcome on the repository; `Err` only when even
/// that could not be written.
pub async fn run(repos: &Repositories, id: Uuid, refetch: bool) -> Result<(), RepositoryError> {
    let db = &repos.db;
    let Some(row) = rows::find_repository(db, id).await? else {
        return Ok(());
    };
    let repository = super::to_repository(row)?;
    rows::set_repository_status(db, id, RepositoryStatus::Syncing.as_str(), None).await?;
    rows::set_repository_progress(db, id, 0, 0).await?;
    publish(repos, id, RepositoryStatus::Syncing, None, (0, 0, 0));
    tracing::info!(repository.id = %id, repository.name = %repository.name, "sync started");
    // The total deadline: a source that trickles bytes (each within the idle
    // deadline) or a provider that streams its inventory slowly ends here.
    let deadline = repos.settings.sync_deadline;
    let outcome = match tokio::time::timeout(deadline, sync(repos, &repository, refetch)).await {
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
                invalid = stats.invalid,
                "sync finished"
            );
            let message = (stats.invalid > 0)
                .then(|| format!("{} elements, {} invalid", stats.seen, stats.invalid));
            rows::finish_sync(
                db,
                id,
                RepositoryStatus::Active.as_str(),
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
            publish(
                repos,
                id,
                RepositoryStatus::Error,
                Some(message),
                (-1, -1, -1),
            );
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
    /// Invalid elements recorded for the repository after the sync.
    invalid: i64,
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

async fn sync(
    repos: &Repositories,
    repository: &super::Repository,
    refetch: bool,
) -> Result<Stats, RepositoryError> {
    let db = &repos.db;
    let id = repository.id;
    let source = driver::open(&repository.driver, &repos.settings)?;

    let (tx, mut rx) = mpsc::channel::<Found>(BATCH);
    let reading = source.inventory(tx);
    tokio::pin!(reading);
    let mut reading_done = None;
    // On SQLite, a connection of the sync's own does the bulk reads and
    // writes (see `store::direct`); on PostgreSQL, the pool.
    let direct = match Direct::open(db) {
        Some(Ok(direct)) => Some(direct),
        Some(Err(e)) => {
            tracing::warn!(repository.id = %id, error = %e, "the sync writes through the pool: its own SQLite connection did not open");
            None
        }
        None => None,
    };
    // Load what is stored while the source is fetched and parsing starts.
    let (existing, direct) = {
        let loading = load_existing(db, id, direct);
        tokio::pin!(loading);
        loop {
            tokio::select! {
                loaded = &mut loading => break loaded?,
                result = &mut reading, if reading_done.is_none() => reading_done = Some(result),
            }
        }
    };
    let mut diff = Diff::new(existing, repository.sync_mode == SyncMode::Copy, refetch);
    diff.direct = direct;
    // Take whatever the parser has handed over at once: one wake-up and one
    // `select!` per run of entries, not per entry.
    let mut received = Vec::with_capacity(BATCH);
    loop {
        let count = tokio::select! {
            count = rx.recv_many(&mut received, BATCH) => count,
            result = &mut reading, if reading_done.is_none() => {
                reading_done = Some(result);
                continue;
            }
        };
        if count == 0 {
            break;
        }
        for listed in received.drain(..) {
            diff.take(listed)?;
            if diff.pending() >= BATCH {
                // The batch is written while the next one is read; what is
                // published is what the last finished write stored.
                if let Some((seen, stored)) = diff.write(db, id).await? {
                    publish(
                        repos,
                        id,
                        RepositoryStatus::Syncing,
                        None,
                        (seen, stored, diff.invalid.len() as i64),
                    );
                }
            }
        }
    }
    let read = match reading_done {
        Some(result) => result,
        None => reading.await,
    };
    // Keep what was read before a failure: write it, then report the failure.
    diff.write(db, id).await?;
    diff.finish_write(db, id).await?;
    read?;

    // Whatever the inventory no longer lists goes, unless it is installed.
    let stale: Vec<Uuid> = diff
        .existing
        .values()
        .filter(|stored| !stored.installed)
        .map(|stored| stored.id)
        .collect();
    diff.stats.removed = rows::delete_elements(db, &stale).await?;
    diff.stored -= diff.stats.removed as i64;
    rows::set_repository_progress(db, id, diff.stats.seen, diff.stored).await?;
    // What this listing found wrong replaces what the last one found.
    let problems = std::mem::take(&mut diff.invalid)
        .into_iter()
        .map(InvalidElement::into_write)
        .collect();
    rows::replace_listing_problems(db, id, problems).await?;

    if !diff.fetch_later.is_empty() {
        fetch_manifests(repos, id, &*source, std::mem::take(&mut diff.fetch_later)).await?;
    }
    diff.stats.stored = diff.stored;
    diff.stats.invalid = rows::count_invalid(db, id).await? as i64;
    Ok(diff.stats)
}

/// What is stored for the repository, by name and version; through `direct`
/// (handed back) in a blocking thread, or through the pool.
async fn load_existing(
    db: &crate::store::Db,
    id: Uuid,
    direct: Option<Direct>,
) -> Result<(HashMap<Key, rows::Stored>, Option<Direct>), RepositoryError> {
    let Some(mut direct) = direct else {
        let mut existing = HashMap::default();
        rows::existing_elements(db, id, |name, version, stored| {
            existing.insert(Key::new(&name, &version), stored);
        })
        .await?;
        return Ok((existing, None));
    };
    let (loaded, direct) = tokio::task::spawn_blocking(move || {
        let mut existing = HashMap::default();
        let loaded = direct.existing_elements(id, |name, version, stored| {
            existing.insert(Key::new(name, version), stored);
        });
        (loaded.map(|()| existing), direct)
    })
    .await
    .map_err(|e| RepositoryError::Source(format!("loading stored elements failed: {e}")))?;
    Ok((loaded?, Some(direct)))
}

/// An element's name and version as one allocation: the name's length, the
/// name, then the version, so no two different pairs make the same key. A
/// million of them cost a third of what a million `(String, String)` do.
#[derive(PartialEq, Eq, Hash)]
struct Key(Box<[u8]>);

impl Key {
    fn new(name: &str, version: &str) -> Self {
        let mut bytes = Vec::with_capacity(4 + name.len() + version.len());
        bytes.extend_from_slice(&(name.len() as u32).to_le_bytes());
        bytes.extend_from_slice(name.as_bytes());
        bytes.extend_from_slice(version.as_bytes());
        Self(bytes.into_boxed_slice())
    }
}

/// What one sync found so far against what was stored: the writes not yet
/// made, the manifests to fetch (COPY), the counts.
struct Diff {
    copy: bool,
    /// Every stored element counts as changed: its manifest is read again.
    refetch: bool,
    /// Stored elements the inventory has not listed (yet).
    existing: HashMap<Key, rows::Stored>,
    /// Elements the inventory has listed, to find one listed twice. A key
    /// moves here from `existing`, so each is allocated once.
    seen_keys: HashSet<Key>,
    inserts: Vec<rows::ElementWrite>,
    updates: Vec<rows::ElementWrite>,
    fetch_later: Vec<(Uuid, String, crate::resolve::Version)>,
    /// Entries (or files) that are not valid elements, with the reason.
    invalid: Vec<InvalidElement>,
    stats: Stats,
    /// Elements stored for the repository once the pending writes are made.
    stored: i64,
    /// The sync's own SQLite connection, if it has one (and no write holds it).
    direct: Option<Direct>,
    /// The batch being written, with the progress it records once written.
    writing: Option<(Writing, (i64, i64))>,
}

/// A batch write in flight; it hands the sync's connection back.
type Writing = tokio::task::JoinHandle<(Result<(), RepositoryError>, Option<Direct>)>;

impl Diff {
    fn new(existing: HashMap<Key, rows::Stored>, copy: bool, refetch: bool) -> Self {
        Self {
            copy,
            refetch,
            stored: existing.len() as i64,
            existing,
            seen_keys: HashSet::default(),
            inserts: Vec::new(),
            updates: Vec::new(),
            fetch_later: Vec::new(),
            invalid: Vec::new(),
            stats: Stats::default(),
            direct: None,
            writing: None,
        }
    }

    fn pending(&self) -> usize {
        self.inserts.len() + self.updates.len()
    }

    /// One inventory entry: invalid, new, changed, or as stored.
    fn take(&mut self, found: Found) -> Result<(), RepositoryError> {
        self.stats.seen += 1;
        let Listed {
            entry,
            manifest,
            path,
        } = match found {
            Found::Element(listed) => listed,
            Found::Invalid(invalid) => {
                self.invalid.push(invalid);
                return Ok(());
            }
        };
        let version = entry.version.to_string();
        let key = Key::new(&entry.name, &version);
        if self.seen_keys.contains(&key) {
            self.invalid.push(InvalidElement {
                message: format!(
                    "element `{}` {version} is listed twice; the first one listed is kept",
                    entry.name
                ),
                name: Some(entry.name),
                version: Some(version),
                path,
                element_id: None,
            });
            return Ok(());
        }
        let (key, stored) = match self.existing.remove_entry(&key) {
            Some((key, stored)) => (key, Some(stored)),
            None => (key, None),
        };
        self.seen_keys.insert(key);
        let (element_id, new) = match stored {
            // Time-ordered ids keep inserts at the end of the primary-key
            // index instead of scattering them across it.
            None => (Uuid::now_v7(), true),
            // Changed, or (COPY) its manifest is still missing: a fetch that
            // failed before is tried again.
            Some(stored)
                if self.refetch
                    || stored.hash != Some(entry.hash)
                    || (self.copy && !stored.has_manifest) =>
            {
                (stored.id, false)
            }
            // As stored: nothing more is built for it.
            Some(_) => return Ok(()),
        };
        let manifest_text = manifest.map(|m| m.document.to_string());
        // Both modes list an element's artifacts from its entry; LAZY may
        // replace them with the element's own listing when it is fetched.
        let artifacts = Some(
            entry
                .artifacts
                .iter()
                .map(|a| (a.urn(), a.category.clone(), a.file_name.clone()))
                .collect(),
        );
        if self.copy && manifest_text.is_none() {
            self.fetch_later
                .push((element_id, entry.name.clone(), entry.version.clone()));
        }
        let write = rows::ElementWrite {
            id: element_id,
            name: entry.name,
            version,
            hash: Some(hex::encode(entry.hash)),
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

    /// Starts writing what is pending as one transaction, once the write
    /// before it has finished (its progress recorded): one batch is written
    /// while the next is read and compared. Answers the progress the
    /// finished write recorded, if one finished.
    async fn write(
        &mut self,
        db: &crate::store::Db,
        id: Uuid,
    ) -> Result<Option<(i64, i64)>, RepositoryError> {
        let finished = self.finish_write(db, id).await?;
        let (inserts, updates) = (
            std::mem::take(&mut self.inserts),
            std::mem::take(&mut self.updates),
        );
        let progress = (self.stats.seen, self.stored);
        let writing = match self.direct.take() {
            Some(mut direct) => tokio::task::spawn_blocking(move || {
                (
                    direct.write_batch(id, inserts, updates).map_err(Into::into),
                    Some(direct),
                )
            }),
            None => {
                let db = db.clone();
                tokio::spawn(async move {
                    let written = rows::write_batch(&db, id, inserts, updates).await;
                    (written.map_err(Into::into), None)
                })
            }
        };
        self.writing = Some((writing, progress));
        Ok(finished)
    }

    /// Waits for the write in flight, if any, and records its progress.
    async fn finish_write(
        &mut self,
        db: &crate::store::Db,
        id: Uuid,
    ) -> Result<Option<(i64, i64)>, RepositoryError> {
        let Some((writing, (seen, stored))) = self.writing.take() else {
            return Ok(None);
        };
        let (written, direct) = writing
            .await
            .map_err(|e| RepositoryError::Source(format!("writing elements failed: {e}")))?;
        self.direct = direct;
        written?;
        rows::set_repository_progress(db, id, seen, stored).await?;
        Ok(Some((seen, stored)))
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
