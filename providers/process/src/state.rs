//! The state directory: one JSON record per started service, so that a
//! restarted provider still knows what it started.
//!
//! Layout: `<dir>/resources/<id>.json` (a [`Record`]) and `<dir>/logs/<id>.log`
//! (the service's stdout and stderr, appended), where `<id>` is the
//! resource id with every byte outside `[A-Za-z0-9._-]` written as `%XX`.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What this provider remembers about a service it started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub resource_id: String,
    pub pid: i32,
    /// The service leads its own process group: `pgid == pid` when started.
    pub pgid: i32,
    /// `/proc/<pid>/stat` field 22, so that a reused pid is not taken for ours.
    pub start_time: u64,
    pub command: String,
    pub args: Vec<String>,
    pub port: Option<u16>,
    /// What the deploy returned, returned again by inspect and repeated deploys.
    pub outputs: Value,
    pub log: PathBuf,
}

#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        StateDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn record_path(&self, resource_id: &str) -> PathBuf {
        self.root
            .join("resources")
            .join(format!("{}.json", file_name(resource_id)))
    }

    /// The log file of `resource_id`; its directory is created.
    pub fn log_path(&self, resource_id: &str) -> io::Result<PathBuf> {
        let dir = self.root.join("logs");
        std::fs::create_dir_all(&dir)?;
        Ok(dir.join(format!("{}.log", file_name(resource_id))))
    }

    /// The record of `resource_id`, if there is one.
    pub fn read(&self, resource_id: &str) -> io::Result<Option<Record>> {
        match std::fs::read(self.record_path(resource_id)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Writes `record` atomically (a temporary file renamed over the old one).
    pub fn write(&self, record: &Record) -> io::Result<()> {
        let path = self.record_path(&record.resource_id);
        std::fs::create_dir_all(path.parent().expect("records live in a directory"))?;
        let temporary = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
        std::fs::write(&temporary, bytes)?;
        std::fs::rename(&temporary, &path)
    }

    pub fn remove(&self, resource_id: &str) -> io::Result<()> {
        match std::fs::remove_file(self.record_path(resource_id)) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }
}

/// A resource id made safe as a file name, distinct ids giving distinct names.
fn file_name(resource_id: &str) -> String {
    let mut name = String::with_capacity(resource_id.len());
    for (i, byte) in resource_id.bytes().enumerate() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_become_safe_distinct_file_names() {
        assert_eq!(file_name("dep-1/web"), "dep-1%2Fweb");
        assert_eq!(file_name("../x"), "%2E.%2Fx");
        assert_eq!(file_name("a%2F"), "a%252F");
        assert_ne!(file_name("a/b"), file_name("a%2Fb"));
    }

    #[test]
    fn records_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        assert_eq!(state.read("x/y").unwrap(), None);
        let record = Record {
            resource_id: "x/y".into(),
            pid: 1,
            pgid: 1,
            start_time: 2,
            command: "sleep".into(),
            args: vec!["1".into()],
            port: Some(80),
            outputs: serde_json::json!({"pid": 1}),
            log: state.log_path("x/y").unwrap(),
        };
        state.write(&record).unwrap();
        assert_eq!(state.read("x/y").unwrap(), Some(record));
        state.remove("x/y").unwrap();
        state.remove("x/y").unwrap();
        assert_eq!(state.read("x/y").unwrap(), None);
    }
}
