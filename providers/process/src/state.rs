//! The state directory: one durable record per service, so that a restarted
//! provider knows what it started, or was about to start.
//!
//! Layout: `<dir>/resources/<id>.json` (a [`Record`], kept by the SDK's
//! [`Records`]) and `<dir>/logs/<id>.log` (the service's stdout and stderr,
//! appended; rotated to `<id>.log.1`, `.2`, … by [`crate::logs`]), where
//! `<id>` is the resource id made a file name by [`encode_id`].

use std::io;
use std::path::{Path, PathBuf};

use corbel_provider_sdk::records::{Records, encode_id};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What this provider remembers about a service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub resource_id: String,
    pub command: String,
    pub args: Vec<String>,
    /// The port chosen for it (`port: true`), passed as `PORT`.
    pub port: Option<u16>,
    pub log: PathBuf,
    /// For a `process.v1.job`: its current run (a service has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobRun>,
    /// How far its start got; stored flat, as `"phase": "intent" | "running"
    /// | "finished"`.
    #[serde(flatten)]
    pub phase: Phase,
}

/// A job's run: which attempt, since when, and where it tells how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRun {
    /// 0 for the first run, then one more per retry.
    pub attempt: u32,
    /// When this attempt started (ms since the Unix epoch).
    pub started_unix_ms: u64,
    /// The log's length before this attempt wrote to it.
    pub log_offset: u64,
    /// The file the job's shell writes its exit status to as it ends, so
    /// that a provider started after the job's own learns how it ended.
    pub status_file: PathBuf,
}

/// An intent is written, durably, before the process is spawned; running once
/// it is known. A provider killed in between leaves an intent, and finds the
/// process (if it was spawned) by its tag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    Intent,
    Running(Running),
    /// A job that ran to its end: its outputs if it succeeded, else why not.
    /// Kept until destroyed, so a repeated deploy answers it again.
    Finished(Finished),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finished {
    pub outputs: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Running {
    pub pid: i32,
    /// The service leads its own process group: `pgid == pid` when started.
    pub pgid: i32,
    /// `/proc/<pid>/stat` field 22, so that a reused pid is not taken for ours.
    pub start_time: u64,
    /// What the deploy returned, returned again by inspect and repeated deploys.
    pub outputs: Value,
}

/// A record as written before phases existed: always a running service.
/// Read so that services started by an older provider are still managed.
#[derive(Deserialize)]
struct LegacyRecord {
    resource_id: String,
    pid: i32,
    pgid: i32,
    start_time: u64,
    command: String,
    args: Vec<String>,
    port: Option<u16>,
    outputs: Value,
    log: PathBuf,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stored {
    Current(Record),
    Legacy(LegacyRecord),
}

impl From<Stored> for Record {
    fn from(stored: Stored) -> Self {
        match stored {
            Stored::Current(record) => record,
            Stored::Legacy(old) => Record {
                resource_id: old.resource_id,
                command: old.command,
                args: old.args,
                port: old.port,
                log: old.log,
                job: None,
                phase: Phase::Running(Running {
                    pid: old.pid,
                    pgid: old.pgid,
                    start_time: old.start_time,
                    outputs: old.outputs,
                }),
            },
        }
    }
}

#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
    records: Records,
}

impl StateDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        StateDir {
            records: Records::in_state_dir(&root),
            root,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The log file of `resource_id`; its directory is created.
    pub fn log_path(&self, resource_id: &str) -> io::Result<PathBuf> {
        Ok(self
            .logs_dir()?
            .join(format!("{}.log", encode_id(resource_id))))
    }

    /// The directory of the services' logs, created if missing.
    pub fn logs_dir(&self) -> io::Result<PathBuf> {
        let dir = self.root.join("logs");
        std::fs::create_dir_all(&dir).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot create {}: {e}", dir.display()))
        })?;
        Ok(dir)
    }

    /// Where the job `resource_id` writes its exit status; its directory is created.
    pub fn status_path(&self, resource_id: &str) -> io::Result<PathBuf> {
        let dir = self.root.join("jobs");
        std::fs::create_dir_all(&dir).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot create {}: {e}", dir.display()))
        })?;
        Ok(dir.join(format!("{}.status", encode_id(resource_id))))
    }

    /// The resource ids that have a record.
    pub fn ids(&self) -> io::Result<Vec<String>> {
        self.records.ids()
    }

    /// The record of `resource_id`, if there is one. Errors name the file.
    pub fn read(&self, resource_id: &str) -> io::Result<Option<Record>> {
        Ok(self.records.read::<Stored>(resource_id)?.map(Record::from))
    }

    /// Writes `record`, durably, over any previous one.
    pub fn write(&self, record: &Record) -> io::Result<()> {
        self.records.write(&record.resource_id, record)
    }

    /// Removes the record of `resource_id`, durably; absent is fine.
    pub fn remove(&self, resource_id: &str) -> io::Result<()> {
        self.records.remove(resource_id)
    }

    /// The file the record of `resource_id` is kept in.
    pub fn record_path(&self, resource_id: &str) -> PathBuf {
        self.records.path_of(resource_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn intent(state: &StateDir) -> Record {
        Record {
            resource_id: "x/y".into(),
            command: "sleep".into(),
            args: vec!["1".into()],
            port: Some(80),
            log: state.log_path("x/y").unwrap(),
            job: None,
            phase: Phase::Intent,
        }
    }

    #[test]
    fn records_round_trip_in_both_phases() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        assert_eq!(state.read("x/y").unwrap(), None);
        let mut record = intent(&state);
        state.write(&record).unwrap();
        assert_eq!(state.read("x/y").unwrap(), Some(record.clone()));
        record.phase = Phase::Running(Running {
            pid: 1,
            pgid: 1,
            start_time: 2,
            outputs: json!({"pid": 1, "port": 80}),
        });
        state.write(&record).unwrap();
        assert_eq!(state.read("x/y").unwrap(), Some(record));
        assert_eq!(
            state.record_path("x/y"),
            dir.path().join("resources").join("x%2Fy.json")
        );
        assert_eq!(
            state.log_path("x/y").unwrap(),
            dir.path().join("logs").join("x%2Fy.log")
        );
        state.remove("x/y").unwrap();
        state.remove("x/y").unwrap();
        assert_eq!(state.read("x/y").unwrap(), None);
    }

    #[test]
    fn the_format_on_disk_is_flat_with_a_phase() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        state.write(&intent(&state)).unwrap();
        let stored: Value =
            serde_json::from_slice(&std::fs::read(state.record_path("x/y")).unwrap()).unwrap();
        assert_eq!(stored["phase"], "intent");
        assert_eq!(stored["command"], "sleep");
        assert!(stored.get("pid").is_none());
    }

    #[test]
    fn a_record_from_before_phases_reads_as_running() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        let old = json!({
            "resource_id": "old", "pid": 7, "pgid": 7, "start_time": 9,
            "command": "sleep", "args": ["5"], "port": null,
            "outputs": {"pid": 7}, "log": "/l/old.log",
        });
        std::fs::create_dir_all(state.record_path("old").parent().unwrap()).unwrap();
        std::fs::write(state.record_path("old"), old.to_string()).unwrap();
        let record = state.read("old").unwrap().unwrap();
        assert_eq!(
            record.phase,
            Phase::Running(Running {
                pid: 7,
                pgid: 7,
                start_time: 9,
                outputs: json!({"pid": 7}),
            })
        );
        assert_eq!(record.args, ["5"]);
    }
}
