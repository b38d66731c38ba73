//! One server per data directory and database: `ServerLock`.
//!
//! A data directory and a database belong to one running server at a time.
//! (Replicas, `--cluster`, share a database: each takes only its data
//! directory's lock at start, and the database's once it leads, ending the
//! session of the previous leader, whose lease has run out:
//! [`ServerLock::take_database_over`].) `ServerLock::acquire` takes, before
//! anything else is touched:
//!
//! - an exclusive `flock` on `<data-dir>/corbel.lock`, into which the holder
//!   writes who it is (pid, host, listen address, version, start time), so a
//!   refused process can name it;
//! - for SQLite, a lock beside the database file too when another server could
//!   reach the same file through another data directory (`lock_path_for_db`);
//! - for PostgreSQL, the session-level advisory lock [`ADVISORY_KEY`] on a
//!   connection of its own (never one of sea-orm's pool, which recycles its
//!   connections and would drop the lock with one). The session's
//!   `application_name` describes the holder; a refused process finds it in
//!   `pg_stat_activity` joined with `pg_locks`.
//!
//! The operating system drops a `flock` when its process dies, and PostgreSQL an
//! advisory lock when its session ends, so a killed server never leaves a lock
//! behind. A PostgreSQL session ends a moment after its client is gone, so a
//! refused start waits a little (`SETTLE`) when the holder looks like a process
//! that has just died on this host.
//!
//! The shape is that of a lease, so that it can become the leader lease of
//! replicas: `acquire` either refuses naming the holder or returns the held value;
//! the value is kept alive by a background check (`CHECK_EVERY`) that notices a
//! lost PostgreSQL session (logged at error level) and takes the lock again;
//! `release` gives it up. A leader would add a fencing epoch and step down on
//! loss instead of only logging it.
//!
//! The files are here; the PostgreSQL sessions (the advisory lock's, kept by
//! a task of its own, and the migration lock's) are in `postgres`.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read as _, Seek as _, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use super::DatabaseLocation;

mod postgres;

use postgres::PgHold;
pub use postgres::migrating;

/// The PostgreSQL advisory lock key held by the one server on a database:
/// the ASCII bytes of `corbel` (0x636f7262656c). Advisory locks are per
/// database, so one cluster serves many Corbel databases.
pub const ADVISORY_KEY: i64 = 0x636f_7262_656c;

/// The PostgreSQL advisory lock replicas migrate under, one at a time:
/// `corbelmg`.
pub const MIGRATE_KEY: i64 = 0x636f_7262_656c_6d67;

/// The lock file in the data directory.
pub const LOCK_FILE: &str = "corbel.lock";

/// A lock file bigger than this is not a holder record.
const MAX_RECORD: u64 = 4096;

/// Who holds the lock, or asks for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The subcommand: `serve` or `migrate`.
    pub command: String,
    pub pid: u32,
    pub host: String,
    /// The address it listens on, for a server.
    pub listen: Option<String>,
    pub version: String,
    pub started_at: DateTime<Utc>,
}

impl Holder {
    /// This process, running `command`.
    pub fn me(command: &str, listen: Option<SocketAddr>) -> Holder {
        Holder {
            command: command.to_owned(),
            pid: std::process::id(),
            host: host_name(),
            listen: listen.map(|a| a.to_string()),
            version: crate::VERSION.to_owned(),
            started_at: Utc::now(),
        }
    }

    /// What the PostgreSQL lock session calls itself. PostgreSQL keeps 63
    /// bytes, so the host comes last.
    fn application_name(&self) -> String {
        let mut name = format!("corbel {} pid={}", self.command, self.pid);
        if let Some(listen) = &self.listen {
            name.push_str(&format!(" listen={listen}"));
        }
        name.push_str(&format!(" host={}", self.host));
        name
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "corbel {} (pid {} on host {}",
            self.command, self.pid, self.host
        )?;
        if let Some(listen) = &self.listen {
            write!(f, ", listening on {listen}")?;
        }
        write!(
            f,
            ", version {}, started {})",
            self.version,
            self.started_at.to_rfc3339_opts(SecondsFormat::Secs, true)
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it.
    #[error("{what} is in use by {holder}, which holds {lock}: stop it, or use another {instead}")]
    Held {
        /// What was asked for: the data directory, the database.
        what: String,
        holder: String,
        /// The lock itself: a file, or the advisory lock.
        lock: String,
        /// The setting that chooses another one.
        instead: &'static str,
    },
    #[error("cannot lock {path}: {source}")]
    File { path: PathBuf, source: io::Error },
    #[error("cannot take the server lock on {location}: {reason}")]
    Postgres { location: String, reason: String },
}

/// The hold on a data directory and its database; see the module doc.
/// Dropping it releases it too, without waiting for PostgreSQL to be told.
pub struct ServerLock {
    me: Holder,
    /// Data directory first, then the database's, if it has its own.
    files: Vec<LockFile>,
    postgres: Option<PgHold>,
}

impl ServerLock {
    /// Takes every lock `database` needs, and `<data_dir>/corbel.lock` when a
    /// data directory is given (the data directory is made if missing), or
    /// refuses naming the holder. `corbel migrate` passes no data directory: it
    /// only needs the database.
    pub async fn acquire(
        data_dir: Option<&Path>,
        database: &DatabaseLocation,
        me: Holder,
    ) -> Result<ServerLock, LockError> {
        let files = {
            let data_dir = data_dir.map(Path::to_owned);
            let database = database.clone();
            let me = me.clone();
            tokio::task::spawn_blocking(move || lock_files(data_dir.as_deref(), &database, &me))
                .await
                .expect("locking files does not panic")?
        };
        let postgres = match database {
            DatabaseLocation::Sqlite(_) => None,
            DatabaseLocation::Postgres(url) => {
                Some(PgHold::acquire(url, database, &me, false).await?)
            }
        };
        Ok(ServerLock {
            me,
            files,
            postgres,
        })
    }

    /// Takes only the data directory's lock: for a replica, which shares its
    /// PostgreSQL database with the others and takes the database's lock
    /// only once it leads ([`Self::take_database_over`]).
    pub async fn acquire_data_dir(
        data_dir: &Path,
        database: &DatabaseLocation,
        me: Holder,
    ) -> Result<ServerLock, LockError> {
        let files = {
            let data_dir = data_dir.to_owned();
            let database = database.clone();
            let me = me.clone();
            tokio::task::spawn_blocking(move || lock_files(Some(&data_dir), &database, &me))
                .await
                .expect("locking files does not panic")?
        };
        Ok(ServerLock {
            me,
            files,
            postgres: None,
        })
    }

    /// Takes the database's lock for a replica that has just taken the leader
    /// lease over: whoever holds the lock held it as the previous leader,
    /// whose lease has run out, so its session is ended
    /// (`pg_terminate_backend`) rather than waited for. That also fences a
    /// leader cut off from the database, whose session PostgreSQL would
    /// otherwise keep for a minute.
    pub async fn take_database_over(
        &mut self,
        database: &DatabaseLocation,
    ) -> Result<(), LockError> {
        if let DatabaseLocation::Postgres(url) = database
            && self.postgres.is_none()
        {
            self.postgres = Some(PgHold::acquire(url, database, &self.me, true).await?);
        }
        Ok(())
    }

    /// Records the address the server really listens on (port 0 is resolved only
    /// once bound). Best effort: the record only helps name the holder.
    pub async fn set_listen(&mut self, addr: SocketAddr) {
        self.me.listen = Some(addr.to_string());
        for lock in &mut self.files {
            if let Err(e) = write_record(&mut lock.file, &self.me) {
                tracing::warn!(path = %lock.path.display(), error = %e, "cannot update the lock file");
            }
        }
        if let Some(postgres) = &self.postgres {
            postgres.rename(self.me.application_name()).await;
        }
    }

    /// Gives the hold up and waits until it is gone, so another server can take
    /// it at once.
    pub async fn release(self) {
        if let Some(postgres) = self.postgres {
            postgres.release().await;
        }
        for lock in self.files.into_iter().rev() {
            // Emptied while still held, so no reader sees a stale holder.
            let _ = lock.file.set_len(0);
            let _ = lock.file.unlock();
        }
    }
}

struct LockFile {
    path: PathBuf,
    file: File,
}

fn lock_files(
    data_dir: Option<&Path>,
    database: &DatabaseLocation,
    me: &Holder,
) -> Result<Vec<LockFile>, LockError> {
    let mut files = Vec::new();
    if let Some(data_dir) = data_dir {
        let dir = made_dir(data_dir)?;
        files.push(lock_file(
            dir.join(LOCK_FILE),
            format!("the data directory {}", data_dir.display()),
            "--data-dir",
            me,
        )?);
    }
    if let DatabaseLocation::Sqlite(db) = database {
        let path = lock_path_for_db(db)?;
        if files.iter().all(|f| f.path != path) {
            files.push(lock_file(
                path,
                format!("the SQLite database {}", db.display()),
                "database (--database-url)",
                me,
            )?);
        }
    }
    Ok(files)
}

/// Makes `dir` if missing and returns its canonical path, so two spellings of
/// one directory share one lock.
fn made_dir(dir: &Path) -> Result<PathBuf, LockError> {
    let failed = |source| LockError::File {
        path: dir.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(failed)?;
    std::fs::canonicalize(dir).map_err(failed)
}

/// The lock of a SQLite database file: the data-directory lock of the directory
/// it sits in when it has the default name (`corbel.db`), else `<file>.lock`
/// beside it. Every server that opens the file computes the same path,
/// whatever its data directory.
fn lock_path_for_db(db: &Path) -> Result<PathBuf, LockError> {
    let absolute = std::path::absolute(db).map_err(|source| LockError::File {
        path: db.to_owned(),
        source,
    })?;
    let (Some(dir), Some(name)) = (absolute.parent(), absolute.file_name()) else {
        return Err(LockError::File {
            path: db.to_owned(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "not a file path"),
        });
    };
    let file = std::fs::canonicalize(&absolute)
        .unwrap_or_else(|_| made_dir(dir).map_or(absolute.clone(), |dir| dir.join(name)));
    let dir = file.parent().unwrap_or(dir);
    match file.file_name() {
        Some(name) if name == "corbel.db" => Ok(dir.join(LOCK_FILE)),
        Some(name) => Ok(dir.join(format!("{}.lock", name.to_string_lossy()))),
        None => Ok(dir.join(LOCK_FILE)),
    }
}

fn lock_file(
    path: PathBuf,
    what: String,
    instead: &'static str,
    me: &Holder,
) -> Result<LockFile, LockError> {
    let failed = |source| LockError::File {
        path: path.clone(),
        source,
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(failed)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = match read_record(&mut file) {
                Some(holder) => holder.to_string(),
                None => "another process (it has not written its name yet)".to_owned(),
            };
            return Err(LockError::Held {
                what,
                holder,
                lock: path.display().to_string(),
                instead,
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(failed(e)),
    }
    write_record(&mut file, me).map_err(failed)?;
    Ok(LockFile { path, file })
}

fn read_record(file: &mut File) -> Option<Holder> {
    let mut text = String::new();
    file.take(MAX_RECORD).read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
}

fn write_record(file: &mut File, me: &Holder) -> io::Result<()> {
    let mut text = serde_json::to_string(me).expect("a holder serialises");
    text.push('\n');
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(text.as_bytes())
}

fn host_name() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_has_one_lock_whatever_the_data_dir() {
        let dir = tempfile::tempdir().unwrap();
        let canonical = std::fs::canonicalize(dir.path()).unwrap();
        assert_eq!(
            lock_path_for_db(&dir.path().join("corbel.db")).unwrap(),
            canonical.join(LOCK_FILE)
        );
        assert_eq!(
            lock_path_for_db(&dir.path().join("x").join("..").join("other.db")).unwrap(),
            canonical.join("other.db.lock")
        );
    }
}
