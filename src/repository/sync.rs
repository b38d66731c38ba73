//! One sync of a repository: read the inventory as a stream, add new elements,
//! update changed ones, remove stale ones (never an installed one), and in COPY
//! mode fetch every new or changed manifest (and any still missing). Writes go
//! in batches, each batch one transaction, so a failure leaves whole rows and
//! keeps what was stored.
//!
//! A bad entry or manifest is recorded as an invalid element and the sync goes
//! on: the repository ends `ACTIVE`, saying how many are invalid. Only a source
//! that cannot be read (or a store that cannot be written) ends it in `ERROR`.

use std::sync::{Arc, OnceLock};

use chrono::Utc;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::driver::{self, Found, Listed};
use super::inventory::Known;
use super::{InvalidElement, Repositories, RepositoryError, RepositoryStatus, SyncEvent, SyncMode};
use crate::store::direct::Direct;
use crate::store::repositories as rows;

/// Sets and maps keyed by element name and version hash with foldhash:
/// several times SipHash's speed on these short keys and still seeded at
/// random per map, so an inventory cannot be made to collide them.
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// What is stored for a repository, by key, each with its position (which
/// [`Found::Known`] names).
type Existing = indexmap::IndexMap<Key, rows::Stored, foldhash::fast::RandomState>;

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
    let writes = TaskTracker::new();
    let syncing = sync(repos, &repository, refetch, &writes);
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
    writes: &TaskTracker,
) -> Result<Stats, RepositoryError> {
    let db = &repos.db;
    let id = repository.id;
    let source = driver::open(&repository.driver, &repos.settings)?;

    let (tx, mut rx) = mpsc::channel::<Found>(BATCH);
    // Once loaded, what is stored tells the driver which entries it need
    // not build: those listed as they were (most of a refresh).
    let copy = repository.sync_mode == SyncMode::Copy;
    let holding = Arc::new(KnownStored {
        existing: OnceLock::new(),
        copy,
        refetch,
    });
    let reading = source.inventory(tx, holding.clone());
    tokio::pin!(reading);
    let mut reading_done = None;
    // On SQLite, a connection of the sync's own does the bulk reads and
    // writes (see `store::direct`); on PostgreSQL, the pool.
    let direct = match Direct::open(db).map(|opened| opened.and_then(Direct::for_bulk)) {
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
    let existing = Arc::new(existing);
    let _ = holding.existing.set(existing.clone());
    let mut diff = Diff::new(existing, copy, refetch);
    diff.direct = direct;
    diff.writes = writes.clone();
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
    if let Some(mut direct) = diff.direct.take()
        && diff.stats.added + diff.stats.updated > 0
    {
        // What this sync wrote goes from the log to the file now, beside what
        // is left to do, not in the commit of whoever writes next (the
        // engine's writer, say).
        tokio::task::spawn_blocking(move || match direct.checkpoint() {
            Ok((log, copied)) => {
                tracing::debug!(repository.id = %id, log, copied, "checkpoint after a sync");
            }
            Err(e) => {
                tracing::debug!(repository.id = %id, error = %e, "checkpoint after a sync failed");
            }
        });
    }
    read?;

    // Whatever the inventory no longer lists goes, unless it is installed.
    let stale: Vec<Uuid> = diff
        .existing
        .values()
        .zip(&diff.seen)
        .filter(|(stored, seen)| !**seen && !stored.installed)
        .map(|(stored, _)| stored.id)
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
) -> Result<(Existing, Option<Direct>), RepositoryError> {
    let Some(mut direct) = direct else {
        let mut existing = Existing::default();
        rows::existing_elements(db, id, |name, version, stored| {
            existing.insert(Key::new(&name, &version), stored);
        })
        .await?;
        return Ok((existing, None));
    };
    let (loaded, direct) = tokio::task::spawn_blocking(move || {
        let mut existing = Existing::default();
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
/// It hashes and compares as its bytes, so a map of keys can be asked with
/// bytes made on the stack (see [`with_key`]).
#[derive(PartialEq, Eq, Hash)]
struct Key(Box<[u8]>);

impl std::borrow::Borrow<[u8]> for Key {
    fn borrow(&self) -> &[u8] {
        &self.0
    }
}

impl Key {
    fn new(name: &str, version: &str) -> Self {
        let mut bytes = Vec::with_capacity(4 + name.len() + version.len());
        put_key(&mut bytes, name, version);
        Self(bytes.into_boxed_slice())
    }

    /// The name and version it was made of.
    fn parts(&self) -> (String, String) {
        let (len, rest) = self.0.split_at(4.min(self.0.len()));
        let len = u32::from_le_bytes(len.try_into().unwrap_or_default()) as usize;
        let (name, version) = rest.split_at(len.min(rest.len()));
        (
            String::from_utf8_lossy(name).into_owned(),
            String::from_utf8_lossy(version).into_owned(),
        )
    }
}

fn put_key(bytes: &mut Vec<u8>, name: &str, version: &str) {
    bytes.extend_from_slice(&(name.len() as u32).to_le_bytes());
    bytes.extend_from_slice(name.as_bytes());
    bytes.extend_from_slice(version.as_bytes());
}

/// Calls `f` with the bytes of `name` and `version`'s key, made in a buffer
/// of the thread's own (asked once per inventory entry: no allocation).
fn with_key<R>(name: &str, version: &str, f: impl FnOnce(&[u8]) -> R) -> R {
    thread_local! {
        static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUFFER.with_borrow_mut(|bytes| {
        bytes.clear();
        put_key(bytes, name, version);
        f(bytes)
    })
}

/// What the sync holds, as the driver asks it: an entry is known when it is
/// stored with the same hash and the sync needs nothing more of it (no
/// refetch asked; in COPY, its manifest is stored).
struct KnownStored {
    /// Set once loaded; until then nothing is known.
    existing: OnceLock<Arc<Existing>>,
    copy: bool,
    refetch: bool,
}

impl Known for KnownStored {
    fn known(&self, name: &str, version: &str, hash: &[u8; 32]) -> Option<u32> {
        if self.refetch {
            return None;
        }
        let existing = self.existing.get()?;
        let (index, _, stored) = with_key(name, version, |key| existing.get_full(key))?;
        let unchanged = stored.hash.as_ref() == Some(hash) && (stored.has_manifest || !self.copy);
        unchanged.then(|| u32::try_from(index).ok()).flatten()
    }
}

/// What one sync found so far against what was stored: the writes not yet
/// made, the manifests to fetch (COPY), the counts.
struct Diff {
    copy: bool,
    /// Every stored element counts as changed: its manifest is read again.
    refetch: bool,
    /// Stored elements, read only (the driver asks them too).
    existing: Arc<Existing>,
    /// Which of `existing` the inventory has listed, by position.
    seen: Vec<bool>,
    /// New elements the inventory has listed, to find one listed twice.
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
    /// Where batch writes run, so the sync's caller can wait for one this
    /// sync, stopped, no longer waits for.
    writes: TaskTracker,
}

/// A batch write in flight; it hands the sync's connection back.
type Writing = tokio::task::JoinHandle<(Result<(), RepositoryError>, Option<Direct>)>;

impl Diff {
    fn new(existing: Arc<Existing>, copy: bool, refetch: bool) -> Self {
        Self {
            copy,
            refetch,
            stored: existing.len() as i64,
            seen: vec![false; existing.len()],
            existing,
            seen_keys: HashSet::default(),
            inserts: Vec::new(),
            updates: Vec::new(),
            fetch_later: Vec::new(),
            invalid: Vec::new(),
            stats: Stats::default(),
            direct: None,
            writing: None,
            writes: TaskTracker::new(),
        }
    }

    fn pending(&self) -> usize {
        self.inserts.len() + self.updates.len()
    }

    /// What the driver handed over: one inventory entry (invalid, new,
    /// changed, or as stored), or a run of entries known as stored.
    fn take(&mut self, found: Found) -> Result<(), RepositoryError> {
        let Listed {
            entry,
            manifest,
            path,
        } = match found {
            Found::Element(listed) => listed,
            Found::Invalid(invalid) => {
                self.stats.seen += 1;
                self.invalid.push(invalid);
                return Ok(());
            }
            Found::Known(run) => {
                for index in run {
                    self.known(index as usize);
                }
                return Ok(());
            }
        };
        self.stats.seen += 1;
        let version = entry.version.to_string();
        let key = Key::new(&entry.name, &version);
        let stored = match self.existing.get_full(&key) {
            Some((index, _, &stored)) => {
                if std::mem::replace(&mut self.seen[index], true) {
                    self.listed_twice(entry.name, version, path);
                    return Ok(());
                }
                Some(stored)
            }
            None => {
                if !self.seen_keys.insert(key) {
                    self.listed_twice(entry.name, version, path);
                    return Ok(());
                }
                None
            }
        };
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

    /// An entry listed as stored: the driver did not even build it.
    fn known(&mut self, index: usize) {
        self.stats.seen += 1;
        match self.seen.get_mut(index) {
            Some(seen) if !*seen => *seen = true,
            _ => {
                let (name, version) = self
                    .existing
                    .get_index(index)
                    .map(|(key, _)| key.parts())
                    .unwrap_or_default();
                let path = super::invalid::entry_path(&name, &version);
                self.listed_twice(name, version, path);
            }
        }
    }

    fn listed_twice(&mut self, name: String, version: String, path: String) {
        self.invalid.push(InvalidElement {
            message: format!(
                "element `{name}` {version} is listed twice; the first one listed is kept"
            ),
            name: Some(name),
            version: Some(version),
            path,
            element_id: None,
        });
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
            Some(mut direct) => self.writes.spawn_blocking(move || {
                (
                    direct.write_batch(id, inserts, updates).map_err(Into::into),
                    Some(direct),
                )
            }),
            None => {
                let db = db.clone();
                self.writes.spawn(async move {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(hash: u8, has_manifest: bool) -> rows::Stored {
        rows::Stored {
            id: Uuid::now_v7(),
            hash: Some([hash; 32]),
            installed: false,
            has_manifest,
        }
    }

    fn holding(copy: bool, refetch: bool) -> KnownStored {
        let mut existing = Existing::default();
        existing.insert(Key::new("core", "1.0.0"), stored(1, false));
        existing.insert(Key::new("web", "2.0.0"), stored(2, true));
        let holding = KnownStored {
            existing: OnceLock::new(),
            copy,
            refetch,
        };
        let _ = holding.existing.set(Arc::new(existing));
        holding
    }

    #[test]
    fn an_entry_is_known_when_stored_with_its_hash_and_nothing_more_is_needed() {
        let lazy = holding(false, false);
        assert_eq!(lazy.known("core", "1.0.0", &[1; 32]), Some(0));
        assert_eq!(lazy.known("web", "2.0.0", &[2; 32]), Some(1));
        // Changed, absent, or another spelling of the version: built.
        assert_eq!(lazy.known("core", "1.0.0", &[9; 32]), None);
        assert_eq!(lazy.known("core", "1.1.0", &[1; 32]), None);
        assert_eq!(lazy.known("cor", "e1.0.0", &[1; 32]), None);
        // COPY fetches a missing manifest again; a refetch reads every one.
        let copy = holding(true, false);
        assert_eq!(copy.known("core", "1.0.0", &[1; 32]), None);
        assert_eq!(copy.known("web", "2.0.0", &[2; 32]), Some(1));
        assert_eq!(holding(false, true).known("web", "2.0.0", &[2; 32]), None);
        // Before what is stored is loaded, nothing is known.
        let loading = KnownStored {
            existing: OnceLock::new(),
            copy: false,
            refetch: false,
        };
        assert_eq!(loading.known("core", "1.0.0", &[1; 32]), None);
    }

    #[test]
    fn a_known_entry_listed_twice_is_invalid_and_the_unlisted_are_stale() {
        let existing = holding(false, false).existing.get().unwrap().clone();
        let mut diff = Diff::new(existing, false, false);
        diff.take(Found::Known(vec![0])).unwrap();
        diff.take(Found::Known(vec![0])).unwrap();
        assert_eq!(diff.stats.seen, 2);
        assert_eq!(diff.invalid.len(), 1);
        let twice = &diff.invalid[0];
        assert_eq!(
            (twice.name.as_deref(), twice.version.as_deref()),
            (Some("core"), Some("1.0.0"))
        );
        assert!(twice.message.contains("listed twice"), "{}", twice.message);
        assert_eq!(twice.path, "inventory.json#/elements/core/1.0.0");
        assert_eq!(diff.seen, [true, false], "web is not listed: stale");
        assert_eq!(diff.pending(), 0, "nothing is written for a known entry");
    }
}
