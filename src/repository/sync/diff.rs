//! What one sync found against what was stored: the stored elements by
//! key (which the driver may skip building), the counts, and the writes not
//! yet made, one batch in flight while the next is read.

use std::sync::{Arc, OnceLock};

use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::repository::driver::{Found, Listed};
use crate::repository::inventory::Known;
use crate::repository::{InvalidElement, RepositoryError};
use crate::store::direct::Direct;
use crate::store::repositories as rows;

/// Sets and maps keyed by element name and version hash with foldhash:
/// several times SipHash's speed on these short keys and still seeded at
/// random per map, so an inventory cannot be made to collide them.
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// What is stored for a repository, by key, each with its position (which
/// [`Found::Known`] names).
pub(super) type Existing = indexmap::IndexMap<Key, rows::Stored, foldhash::fast::RandomState>;

#[derive(Default)]
pub(super) struct Stats {
    pub seen: i64,
    pub added: i64,
    pub updated: i64,
    pub removed: u64,
    pub stored: i64,
    /// Invalid elements recorded for the repository after the sync.
    pub invalid: i64,
}

/// What is stored for the repository, by name and version; through `direct`
/// (handed back) in a blocking thread, or through the pool.
pub(super) async fn load_existing(
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
pub(super) struct Key(Box<[u8]>);

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
pub(super) struct KnownStored {
    /// Set once loaded; until then nothing is known.
    pub existing: OnceLock<Arc<Existing>>,
    copy: bool,
    refetch: bool,
}

impl KnownStored {
    /// Knowing nothing until what is stored is loaded.
    pub fn new(copy: bool, refetch: bool) -> Self {
        Self {
            existing: OnceLock::new(),
            copy,
            refetch,
        }
    }
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

/// How an inventory entry stands against what was stored and listed so far.
enum Listing {
    /// Neither stored nor listed before.
    New,
    /// Stored (and not listed before).
    Stored(rows::Stored),
    /// Listed before: the first one listed is kept.
    Twice,
}

/// What one sync found so far against what was stored: the writes not yet
/// made, the manifests to fetch (COPY), the counts.
pub(super) struct Diff {
    copy: bool,
    /// Every stored element counts as changed: its manifest is read again.
    refetch: bool,
    /// Stored elements, read only (the driver asks them too).
    pub existing: Arc<Existing>,
    /// Which of `existing` the inventory has listed, by position.
    pub seen: Vec<bool>,
    /// New elements the inventory has listed, to find one listed twice.
    seen_keys: HashSet<Key>,
    inserts: Vec<rows::ElementWrite>,
    updates: Vec<rows::ElementWrite>,
    pub fetch_later: Vec<(Uuid, String, crate::resolve::Version)>,
    /// Entries (or files) that are not valid elements, with the reason.
    pub invalid: Vec<InvalidElement>,
    pub stats: Stats,
    /// Elements stored for the repository once the pending writes are made.
    pub stored: i64,
    /// The sync's own SQLite connection, if it has one (and no write holds it).
    pub direct: Option<Direct>,
    /// The batch being written, with the progress it records once written.
    writing: Option<(Writing, (i64, i64))>,
    /// Where batch writes run, so the sync's caller can wait for one this
    /// sync, stopped, no longer waits for.
    pub writes: TaskTracker,
}

/// A batch write in flight; it hands the sync's connection back.
type Writing = tokio::task::JoinHandle<(Result<(), RepositoryError>, Option<Direct>)>;

impl Diff {
    pub fn new(existing: Arc<Existing>, copy: bool, refetch: bool) -> Self {
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

    pub fn pending(&self) -> usize {
        self.inserts.len() + self.updates.len()
    }

    /// What the driver handed over: one inventory entry (invalid, new,
    /// changed, or as stored), or a run of entries known as stored.
    pub fn take(&mut self, found: Found) -> Result<(), RepositoryError> {
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
        let (element_id, new) = match self.listing(&entry.name, &version) {
            Listing::Twice => {
                self.listed_twice(entry.name, version, path);
                return Ok(());
            }
            // Time-ordered ids keep inserts at the end of the primary-key
            // index instead of scattering them across it.
            Listing::New => (Uuid::now_v7(), true),
            // Changed, or (COPY) its manifest is still missing: a fetch that
            // failed before is tried again.
            Listing::Stored(stored)
                if self.refetch
                    || stored.hash != Some(entry.hash)
                    || (self.copy && !stored.has_manifest) =>
            {
                (stored.id, false)
            }
            // As stored: nothing more is built for it.
            Listing::Stored(_) => return Ok(()),
        };
        let write = self.element_write(element_id, entry, version, manifest);
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

    /// How the entry `name` `version` is listed, marking it seen.
    fn listing(&mut self, name: &str, version: &str) -> Listing {
        let key = Key::new(name, version);
        match self.existing.get_full(&key) {
            Some((index, _, &stored)) => {
                if std::mem::replace(&mut self.seen[index], true) {
                    Listing::Twice
                } else {
                    Listing::Stored(stored)
                }
            }
            None => {
                if self.seen_keys.insert(key) {
                    Listing::New
                } else {
                    Listing::Twice
                }
            }
        }
    }

    /// The row to write for a new or changed entry; in COPY, its manifest
    /// is fetched later if the entry did not carry it.
    fn element_write(
        &mut self,
        element_id: Uuid,
        entry: crate::repository::inventory::InventoryEntry,
        version: String,
        manifest: Option<crate::repository::manifest::Manifest>,
    ) -> rows::ElementWrite {
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
        rows::ElementWrite {
            id: element_id,
            name: entry.name,
            version,
            hash: Some(hex::encode(entry.hash)),
            // A changed entry's manifest is fetched again (LAZY: on access).
            manifest: manifest_text,
            artifacts,
        }
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
                let path = crate::repository::invalid::entry_path(&name, &version);
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
    pub async fn write(
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
    pub async fn finish_write(
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

    /// What this sync wrote goes from the log to the file now, beside what
    /// is left to do, not in the commit of whoever writes next (the engine's
    /// writer, say). Gives up the sync's own connection.
    pub fn checkpoint(&mut self, id: Uuid) {
        if let Some(mut direct) = self.direct.take()
            && self.stats.added + self.stats.updated > 0
        {
            tokio::task::spawn_blocking(move || match direct.checkpoint() {
                Ok((log, copied)) => {
                    tracing::debug!(repository.id = %id, log, copied, "checkpoint after a sync");
                }
                Err(e) => {
                    tracing::debug!(repository.id = %id, error = %e, "checkpoint after a sync failed");
                }
            });
        }
    }

    /// The stored elements the inventory no longer lists, but for the
    /// installed ones.
    pub fn stale(&self) -> Vec<Uuid> {
        self.existing
            .values()
            .zip(&self.seen)
            .filter(|(stored, seen)| !**seen && !stored.installed)
            .map(|(stored, _)| stored.id)
            .collect()
    }
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
