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

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read as _, Seek as _, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use sea_orm::sqlx::postgres::{PgConnectOptions, PgConnection};
use sea_orm::sqlx::{self, Connection as _};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::DatabaseLocation;

/// The PostgreSQL advisory lock key held by the one server on a database:
/// the ASCII bytes of `corbel` (0x636f7262656c). Advisory locks are per
/// database, so one cluster serves many Corbel databases.
pub const ADVISORY_KEY: i64 = 0x636f_7262_656c;

/// The PostgreSQL advisory lock replicas migrate under, one at a time:
/// `corbelmg`.
pub const MIGRATE_KEY: i64 = 0x636f_7262_656c_6d67;

/// How long a replica waits for another's migration.
const MIGRATE_WAIT: Duration = Duration::from_secs(300);

/// The lock file in the data directory.
pub const LOCK_FILE: &str = "corbel.lock";

/// How often the PostgreSQL lock session is checked (and, once lost, retaken).
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// How long a start waits for a lock whose holder looks dead.
const SETTLE: Duration = Duration::from_secs(5);

/// Deadline of each statement on the lock session, and of connecting it.
const PG_DEADLINE: Duration = Duration::from_secs(10);

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

/// Runs `migrate` holding [`MIGRATE_KEY`] on a session of its own (on
/// PostgreSQL), so replicas that start together migrate one after another:
/// the second finds the work done. Without replicas the server lock already
/// keeps migrations apart.
pub async fn migrating<T, E: From<LockError>>(
    database: &DatabaseLocation,
    me: &Holder,
    migrate: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let DatabaseLocation::Postgres(url) = database else {
        return migrate.await;
    };
    let failed = |reason: String| LockError::Postgres {
        location: database.redacted(),
        reason,
    };
    let options = connect_options(url, me).map_err(|e| failed(e.to_string()))?;
    let mut connection = connect(&options).await.map_err(failed)?;
    let locked = tokio::time::timeout(
        MIGRATE_WAIT,
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(MIGRATE_KEY)
            .execute(&mut connection),
    )
    .await;
    match locked {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(failed(crate::error_chain(&e)).into()),
        Err(_) => {
            return Err(failed(format!(
                "another replica's migration did not end within {MIGRATE_WAIT:?}"
            ))
            .into());
        }
    }
    let done = migrate.await;
    // Closing the session releases the lock too.
    let _ = connection.close().await;
    done
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

/// The advisory lock, held by a task that owns its session.
struct PgHold {
    commands: mpsc::Sender<PgCommand>,
}

enum PgCommand {
    Rename(String),
    Release(oneshot::Sender<()>),
}

/// The session holding the lock, as another session sees it.
struct PgHolder {
    session: i32,
    application_name: String,
    user: Option<String>,
    client: Option<String>,
    since: Option<String>,
}

impl PgHolder {
    /// The pid and host a Corbel session put in its application name.
    fn corbel_process(&self) -> Option<(u32, &str)> {
        let field = |key: &str| {
            self.application_name
                .split(' ')
                .find_map(|w| w.strip_prefix(key))
        };
        Some((field("pid=")?.parse().ok()?, field("host=")?))
    }

    /// True when the holder is a process on this host that is gone (or is this
    /// very process, which has just dropped an earlier hold): its session will
    /// end in a moment.
    fn looks_dead(&self, me: &Holder) -> bool {
        let Some((pid, host)) = self.corbel_process() else {
            return false;
        };
        // PostgreSQL may have cut the name short, in the host.
        if host.is_empty() || !me.host.starts_with(host) {
            return false;
        }
        pid == me.pid || !process_alive(pid)
    }
}

impl fmt::Display for PgHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.application_name.is_empty() {
            "a session with no application name"
        } else {
            &self.application_name
        };
        write!(f, "\"{name}\" (PostgreSQL session {}", self.session)?;
        if let Some(user) = &self.user {
            write!(f, " of {user}")?;
        }
        if let Some(client) = &self.client {
            write!(f, " from {client}")?;
        }
        if let Some(since) = &self.since {
            write!(f, ", connected at {since}")?;
        }
        write!(f, ")")
    }
}

fn process_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

enum Attempt {
    Taken(PgConnection),
    Busy(PgConnection, Option<PgHolder>),
}

impl PgHold {
    /// Takes the advisory lock, or refuses naming its holder (after waiting
    /// `SETTLE` for one that looks dead). `take_over`: the holder is known to
    /// be a previous leader whose lease ran out, so its session is ended and
    /// the lock taken, within `PG_DEADLINE`.
    async fn acquire(
        url: &url::Url,
        database: &DatabaseLocation,
        me: &Holder,
        take_over: bool,
    ) -> Result<PgHold, LockError> {
        let failed = |reason: String| LockError::Postgres {
            location: database.redacted(),
            reason,
        };
        let options = connect_options(url, me).map_err(|e| failed(e.to_string()))?;
        let deadline = Instant::now() + if take_over { PG_DEADLINE } else { SETTLE };
        let mut connection = connect(&options).await.map_err(&failed)?;
        let connection = loop {
            let (mut again, holder) = match attempt(connection).await.map_err(&failed)? {
                Attempt::Taken(connection) => break connection,
                Attempt::Busy(again, holder) => (again, holder),
            };
            let waiting = take_over || holder.as_ref().is_none_or(|h| h.looks_dead(me));
            if !waiting || Instant::now() >= deadline {
                let _ = again.close().await;
                if take_over {
                    return Err(failed(format!(
                        "the previous leader's session still holds it after {PG_DEADLINE:?}"
                    )));
                }
                return Err(LockError::Held {
                    what: format!("the PostgreSQL database {}", database.redacted()),
                    holder: holder.map_or_else(
                        || "a session that could not be named".to_owned(),
                        |h| h.to_string(),
                    ),
                    lock: format!("the advisory lock {ADVISORY_KEY:#x}"),
                    instead: "database (--database-url)",
                });
            }
            if take_over && let Some(holder) = holder {
                tracing::warn!(holder = %holder, "ending the previous leader's lock session");
                let ended = within(
                    sqlx::query_scalar::<_, bool>("SELECT pg_terminate_backend($1)")
                        .bind(holder.session)
                        .fetch_one(&mut again),
                )
                .await;
                if let Err(e) = ended {
                    tracing::warn!(error = %e, "cannot end the previous leader's lock session");
                }
            }
            connection = again;
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let (commands, received) = mpsc::channel(4);
        tokio::spawn(keep(connection, options, database.redacted(), received));
        Ok(PgHold { commands })
    }

    async fn rename(&self, name: String) {
        let _ = self.commands.send(PgCommand::Rename(name)).await;
    }

    async fn release(self) {
        let (done, released) = oneshot::channel();
        if self.commands.send(PgCommand::Release(done)).await.is_ok() {
            let _ = tokio::time::timeout(PG_DEADLINE, released).await;
        }
    }
}

fn connect_options(url: &url::Url, me: &Holder) -> Result<PgConnectOptions, sqlx::Error> {
    let options: PgConnectOptions = url.as_str().parse()?;
    // The server drops the session (and the lock) of a client whose host
    // vanished within about a minute, rather than the kernel's two hours.
    Ok(options.application_name(&me.application_name()).options([
        ("tcp_keepalives_idle", "30"),
        ("tcp_keepalives_interval", "10"),
        ("tcp_keepalives_count", "3"),
    ]))
}

async fn connect(options: &PgConnectOptions) -> Result<PgConnection, String> {
    match tokio::time::timeout(PG_DEADLINE, PgConnection::connect_with(options)).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(e)) => Err(crate::error_chain(&e)),
        Err(_) => Err(format!("no connection within {PG_DEADLINE:?}")),
    }
}

/// Runs `query` on the lock session with a deadline.
async fn within<T>(query: impl Future<Output = Result<T, sqlx::Error>>) -> Result<T, String> {
    match tokio::time::timeout(PG_DEADLINE, query).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(crate::error_chain(&e)),
        Err(_) => Err(format!("no answer within {PG_DEADLINE:?}")),
    }
}

async fn attempt(mut connection: PgConnection) -> Result<Attempt, String> {
    let taken: bool = within(
        sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(ADVISORY_KEY)
            .fetch_one(&mut connection),
    )
    .await?;
    if taken {
        return Ok(Attempt::Taken(connection));
    }
    let holder = within(
        sqlx::query_as::<
            _,
            (
                i32,
                Option<String>,
                Option<String>,
                Option<String>,
                Option<String>,
            ),
        >(
            "SELECT a.pid, a.application_name, a.usename::text, host(a.client_addr), \
                    to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') \
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND l.classid::int8 = $1 AND l.objid::int8 = $2 AND l.objsubid = 1 \
             LIMIT 1",
        )
        .bind(ADVISORY_KEY >> 32)
        .bind(ADVISORY_KEY & 0xffff_ffff)
        .fetch_optional(&mut connection),
    )
    .await?
    .map(|(session, name, user, client, since)| PgHolder {
        session,
        application_name: name.unwrap_or_default(),
        user,
        client,
        since,
    });
    Ok(Attempt::Busy(connection, holder))
}

/// True when this session still holds the lock.
async fn still_held(connection: &mut PgConnection) -> Result<bool, String> {
    within(
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_locks \
             WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND granted \
               AND classid::int8 = $1 AND objid::int8 = $2 AND objsubid = 1)",
        )
        .bind(ADVISORY_KEY >> 32)
        .bind(ADVISORY_KEY & 0xffff_ffff)
        .fetch_one(connection),
    )
    .await
}

/// Owns the lock session: checks it every `CHECK_EVERY`, takes the lock again
/// on a new session when it is lost, and releases it when told to (or when the
/// `ServerLock` is dropped).
async fn keep(
    connection: PgConnection,
    mut options: PgConnectOptions,
    location: String,
    mut commands: mpsc::Receiver<PgCommand>,
) {
    let mut held = Some(connection);
    // The last complaint, so a lasting problem is logged once.
    let mut complaint: Option<String> = None;
    let mut every = tokio::time::interval_at(Instant::now() + CHECK_EVERY, CHECK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            command = commands.recv() => match command {
                Some(PgCommand::Rename(name)) => {
                    options = options.application_name(&name);
                    if let Some(connection) = &mut held {
                        let renamed = within(
                            sqlx::query("SELECT set_config('application_name', $1, false)")
                                .bind(&name)
                                .execute(&mut *connection),
                        )
                        .await;
                        if let Err(e) = renamed {
                            tracing::warn!(error = %e, "cannot rename the lock session");
                        }
                    }
                }
                Some(PgCommand::Release(done)) => {
                    if let Some(mut connection) = held.take() {
                        let _ = within(
                            sqlx::query("SELECT pg_advisory_unlock($1)")
                                .bind(ADVISORY_KEY)
                                .execute(&mut connection),
                        )
                        .await;
                        let _ = connection.close().await;
                    }
                    let _ = done.send(());
                    return;
                }
                None => {
                    if let Some(connection) = held.take() {
                        let _ = connection.close().await;
                    }
                    return;
                }
            },
            _ = every.tick() => match held.as_mut() {
                Some(connection) => {
                    let lost = match still_held(connection).await {
                        Ok(true) => None,
                        Ok(false) => Some("the session no longer holds it".to_owned()),
                        Err(e) => Some(e),
                    };
                    if let Some(reason) = lost {
                        tracing::error!(
                            database = %location,
                            error = %reason,
                            "lost the PostgreSQL session holding the server lock: another \
                             server could start on this database; taking the lock again"
                        );
                        held = None;
                        complaint = Some(reason);
                    }
                }
                None => match connect(&options).await {
                    Err(e) => complain(&mut complaint, &location, e),
                    Ok(connection) => match attempt(connection).await {
                        Ok(Attempt::Taken(connection)) => {
                            tracing::info!(database = %location, "took the server lock again");
                            held = Some(connection);
                            complaint = None;
                        }
                        Ok(Attempt::Busy(connection, holder)) => {
                            let _ = connection.close().await;
                            let holder = holder.map_or_else(
                                || "a session that could not be named".to_owned(),
                                |h| h.to_string(),
                            );
                            complain(
                                &mut complaint,
                                &location,
                                format!("another server holds it now: {holder}; stop this one"),
                            );
                        }
                        Err(e) => complain(&mut complaint, &location, e),
                    },
                },
            },
        }
    }
}

fn complain(last: &mut Option<String>, location: &str, reason: String) {
    if last.as_deref() != Some(reason.as_str()) {
        tracing::error!(database = %location, error = %reason, "cannot take the server lock again");
        *last = Some(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_application_name_carries_pid_and_host() {
        let me = Holder::me("serve", Some("127.0.0.1:8080".parse().unwrap()));
        let seen = PgHolder {
            session: 1,
            application_name: me.application_name(),
            user: None,
            client: None,
            since: None,
        };
        assert_eq!(seen.corbel_process(), Some((me.pid, me.host.as_str())));
        assert!(seen.looks_dead(&me), "this very process counts as ending");
    }

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
