//! A durable record per resource: what a provider must remember across its
//! own crashes to keep Corbel's exactly-once promise (see the README's
//! "Exactly once: what a provider must do").
//!
//! One JSON file per resource id in one directory, `<dir>/<encoded id>.json`,
//! where the id is made a safe file name by [`encode_id`]. A write is durable
//! when it returns: a temporary file is written and fsynced, renamed over the
//! record, and the directory is fsynced. A reader sees the old record or the
//! new one, never half of one.
//!
//! The calls block on the disk (an fsync takes milliseconds); a provider with
//! many concurrent calls may run them through `tokio::task::spawn_blocking`.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The state directory used when `CORBEL_STATE_DIR` is unset (relative to the
/// working directory). Corbel always sets it for the providers it starts.
pub const DEFAULT_STATE_DIR: &str = "./state";
/// The directory, inside a state directory, that [`Records::in_state_dir`] uses.
pub const RECORDS_DIR: &str = "resources";

/// `CORBEL_STATE_DIR` (as [`ProviderEnv::take`](crate::ProviderEnv::take)
/// took it), or [`DEFAULT_STATE_DIR`] when it is unset or empty.
pub fn state_dir_from_env() -> PathBuf {
    crate::ProviderEnv::take()
        .state_dir()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR))
}

/// A directory of records keyed by resource id. Cheap to make and to clone:
/// it holds only the path, and touches the disk only when used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Records {
    dir: PathBuf,
}

impl Records {
    /// Records kept in `dir` (created by the first write).
    pub fn open(dir: impl Into<PathBuf>) -> Self {
        Records { dir: dir.into() }
    }

    /// Records kept in `<state_dir>/resources`, leaving the rest of the state
    /// directory to the provider (logs, caches).
    pub fn in_state_dir(state_dir: impl AsRef<Path>) -> Self {
        Self::open(state_dir.as_ref().join(RECORDS_DIR))
    }

    /// Records in `$CORBEL_STATE_DIR/resources`, or `./state/resources` when
    /// the variable is unset.
    pub fn from_env() -> Self {
        Self::in_state_dir(state_dir_from_env())
    }

    /// The directory the records are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file holding the record of `id`.
    pub fn path_of(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{}.json", encode_id(id)))
    }

    /// Stores `value` as the record of `id`, replacing any previous one; it is
    /// on disk when this returns.
    pub fn write<T: Serialize + ?Sized>(&self, id: &str, value: &T) -> io::Result<()> {
        let path = self.path_of(id);
        let bytes = serde_json::to_vec_pretty(value)
            .map_err(|e| named(&path, "cannot serialise the record for", e.into()))?;
        self.create_dir()?;
        // Hidden (a leading `.` is always encoded in record names), so a
        // temporary file is never taken for a record.
        let mut temporary = tempfile::Builder::new()
            .prefix(&format!(".{}.", encode_id(id)))
            .suffix(".tmp")
            .tempfile_in(&self.dir)
            .map_err(|e| named(&self.dir, "cannot create a temporary file in", e))?;
        temporary
            .write_all(&bytes)
            .and_then(|()| temporary.as_file().sync_all())
            .map_err(|e| named(temporary.path(), "cannot write", e))?;
        temporary
            .persist(&path)
            .map_err(|e| named(&path, "cannot rename a temporary file to", e.error))?;
        sync_dir(&self.dir)
    }

    /// The record of `id`, or `None` if there is none.
    pub fn read<T: DeserializeOwned>(&self, id: &str) -> io::Result<Option<T>> {
        let path = self.path_of(id);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(named(&path, "cannot read", error)),
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            named(
                &path,
                "cannot parse",
                io::Error::new(io::ErrorKind::InvalidData, e),
            )
        })
    }

    /// Removes the record of `id`; removing one that is not there succeeds.
    /// The removal is on disk when this returns.
    pub fn remove(&self, id: &str) -> io::Result<()> {
        let path = self.path_of(id);
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(named(&path, "cannot remove", error)),
        }
    }

    /// The ids that have a record, sorted. Files that are not records
    /// (temporary files, names [`encode_id`] cannot make) are skipped.
    pub fn ids(&self) -> io::Result<Vec<String>> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(named(&self.dir, "cannot list", error)),
        };
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| named(&self.dir, "cannot list", e))?;
            let name = entry.file_name();
            if let Some(id) = name
                .to_str()
                .and_then(|name| name.strip_suffix(".json"))
                .and_then(decode_id)
            {
                ids.push(id);
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// Creates the directory if it is missing, and makes every directory it
    /// created durable (each one's entry in its parent is fsynced).
    fn create_dir(&self) -> io::Result<()> {
        if self.dir.is_dir() {
            return Ok(());
        }
        let mut missing = Vec::new();
        let mut ancestor = self.dir.as_path();
        while !ancestor.as_os_str().is_empty() && !ancestor.exists() {
            missing.push(ancestor);
            ancestor = ancestor.parent().unwrap_or(Path::new(""));
        }
        fs::create_dir_all(&self.dir).map_err(|e| named(&self.dir, "cannot create", e))?;
        for dir in missing {
            let parent = match dir.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent,
                _ => Path::new("."),
            };
            sync_dir(parent)?;
        }
        Ok(())
    }
}

/// One process at a time per state directory: an exclusive advisory lock
/// (`flock`) on `<state_dir>/.lock`, released when dropped or when the process
/// dies, however it dies.
///
/// Why a provider wants it: when Corbel goes away the SDK lets calls in flight
/// finish (for `Settings::shutdown_grace`), and a stopped (SIGSTOP) provider
/// may finish them much later, while a restarted Corbel has already started a
/// new instance. Two instances acting on one resource could both create it.
/// Held for the life of the process, this makes the new instance wait for the
/// old one to be gone.
#[derive(Debug)]
pub struct StateLock {
    /// Holds the lock while open.
    _file: File,
}

impl StateLock {
    /// The file locked in `state_dir`.
    pub fn path(state_dir: impl AsRef<Path>) -> PathBuf {
        state_dir.as_ref().join(".lock")
    }

    /// Waits until this process holds the lock (the directory is created).
    pub fn acquire(state_dir: impl AsRef<Path>) -> io::Result<StateLock> {
        let (file, path) = Self::open(state_dir.as_ref())?;
        file.lock().map_err(|e| named(&path, "cannot lock", e))?;
        Ok(StateLock { _file: file })
    }

    /// The lock, or `None` if another process holds it.
    pub fn try_acquire(state_dir: impl AsRef<Path>) -> io::Result<Option<StateLock>> {
        let (file, path) = Self::open(state_dir.as_ref())?;
        match file.try_lock() {
            Ok(()) => Ok(Some(StateLock { _file: file })),
            Err(fs::TryLockError::WouldBlock) => Ok(None),
            Err(fs::TryLockError::Error(error)) => Err(named(&path, "cannot lock", error)),
        }
    }

    fn open(state_dir: &Path) -> io::Result<(File, PathBuf)> {
        fs::create_dir_all(state_dir).map_err(|e| named(state_dir, "cannot create", e))?;
        let path = Self::path(state_dir);
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| named(&path, "cannot open", e))?;
        Ok((file, path))
    }
}

/// A resource id as a file name: bytes outside `[A-Za-z0-9_-]` (and a `.`
/// that would come first) become `%XX`, so no id can name another directory,
/// a hidden file, or another id's file. The empty id is `%`.
pub fn encode_id(id: &str) -> String {
    let mut name = String::with_capacity(id.len());
    for (i, byte) in id.bytes().enumerate() {
        let plain =
            byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' || (byte == b'.' && i > 0);
        if plain {
            name.push(byte as char);
        } else {
            name.push_str(&format!("%{byte:02X}"));
        }
    }
    if name.is_empty() {
        name.push('%');
    }
    name
}

/// The id [`encode_id`] made `name` from, or `None` if it made no id into
/// `name` (so decoding never yields two names for one id).
pub fn decode_id(name: &str) -> Option<String> {
    if name == "%" {
        return Some(String::new());
    }
    let mut bytes = Vec::with_capacity(name.len());
    let mut rest = name.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(first);
            rest = tail;
        }
    }
    let id = String::from_utf8(bytes).ok()?;
    (encode_id(&id) == name).then_some(id)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| named(dir, "cannot fsync the directory", e))
}

/// `error`, its message prefixed with what was done to which path.
fn named(path: &Path, doing: &str, error: io::Error) -> io::Error {
    io::Error::new(error.kind(), format!("{doing} {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Greeting {
        text: String,
        count: u32,
    }

    fn greeting(text: &str, count: u32) -> Greeting {
        Greeting {
            text: text.to_string(),
            count,
        }
    }

    #[test]
    fn ids_become_safe_distinct_file_names_and_back() {
        for (id, name) in [
            ("dep-1/web", "dep-1%2Fweb"),
            ("../x", "%2E.%2Fx"),
            ("a%2F", "a%252F"),
            ("a.b", "a.b"),
            (".hidden", "%2Ehidden"),
            ("", "%"),
            ("é", "%C3%A9"),
        ] {
            assert_eq!(encode_id(id), name, "{id:?}");
            assert_eq!(decode_id(name).as_deref(), Some(id), "{name:?}");
        }
        assert_ne!(encode_id("a/b"), encode_id("a%2Fb"));
        // Names no id encodes to.
        for name in ["%41", "a%2", "a%zz", ".x", "a/b", "%FF", "%2e"] {
            assert_eq!(decode_id(name), None, "{name:?}");
        }
    }

    #[test]
    fn a_record_round_trips_and_is_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::open(dir.path().join("deep").join("records"));
        assert_eq!(records.read::<Greeting>("web").unwrap(), None);
        records.write("web", &greeting("hi", 1)).unwrap();
        assert_eq!(records.read("web").unwrap(), Some(greeting("hi", 1)));
        records.write("web", &greeting("bye", 2)).unwrap();
        assert_eq!(records.read("web").unwrap(), Some(greeting("bye", 2)));
        // Only the record is left: no temporary file.
        let names: Vec<_> = fs::read_dir(records.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["web.json"]);
    }

    #[test]
    fn removing_twice_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::open(dir.path());
        records.write("web", &greeting("hi", 1)).unwrap();
        records.remove("web").unwrap();
        records.remove("web").unwrap();
        assert_eq!(records.read::<Greeting>("web").unwrap(), None);
        // Nothing was ever written here.
        Records::open(dir.path().join("none")).remove("x").unwrap();
    }

    #[test]
    fn odd_ids_stay_inside_the_directory_and_are_listed_as_given() {
        let root = tempfile::tempdir().unwrap();
        let records = Records::in_state_dir(root.path());
        assert_eq!(records.dir(), root.path().join("resources"));
        assert_eq!(records.ids().unwrap(), Vec::<String>::new());
        let ids = ["../x", "a/b", "a%2Fb", ".", "..", "", "web", "dep 1/ü"];
        for (n, id) in ids.iter().enumerate() {
            records.write(id, &greeting(id, n as u32)).unwrap();
        }
        for (n, id) in ids.iter().enumerate() {
            assert_eq!(records.read(id).unwrap(), Some(greeting(id, n as u32)));
            assert_eq!(records.path_of(id).parent(), Some(records.dir()));
        }
        // Nothing escaped: the state directory holds only `resources`.
        let top: Vec<_> = fs::read_dir(root.path()).unwrap().collect();
        assert_eq!(top.len(), 1);

        // Files that are not records are not listed.
        fs::write(records.dir().join(".web.json.x.tmp"), "{").unwrap();
        fs::write(records.dir().join("notes.txt"), "").unwrap();
        fs::write(records.dir().join("%41.json"), "{}").unwrap();
        let mut expected: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
        expected.sort();
        assert_eq!(records.ids().unwrap(), expected);

        records.remove("a/b").unwrap();
        assert!(!records.ids().unwrap().contains(&"a/b".to_string()));
        assert_eq!(
            records.read::<Greeting>("a%2Fb").unwrap(),
            Some(greeting("a%2Fb", 2))
        );
    }

    #[test]
    fn a_state_directory_is_locked_by_one_holder_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let held = StateLock::try_acquire(&state)
            .unwrap()
            .expect("free at first");
        // Another open file description is another holder, as another process is.
        assert!(StateLock::try_acquire(&state).unwrap().is_none());
        let waiting = std::thread::spawn({
            let state = state.clone();
            move || StateLock::acquire(&state).unwrap()
        });
        drop(held);
        let second = waiting.join().unwrap();
        assert!(StateLock::try_acquire(&state).unwrap().is_none());
        drop(second);
        assert!(StateLock::try_acquire(&state).unwrap().is_some());
        // The lock file sits beside the records, not among them.
        assert_eq!(StateLock::path(&state), state.join(".lock"));
        assert_eq!(
            Records::in_state_dir(&state).ids().unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::open(dir.path());
        fs::write(records.path_of("bad"), "not json").unwrap();
        let error = records.read::<Greeting>("bad").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(
            error
                .to_string()
                .contains(&*records.path_of("bad").to_string_lossy()),
            "{error}"
        );

        // A file where the directory should be.
        let blocked = Records::open(dir.path().join("bad.json"));
        let error = blocked.write("x", &greeting("x", 0)).unwrap_err();
        assert!(error.to_string().contains("bad.json"), "{error}");
    }
}
