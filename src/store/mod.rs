//! The database: connecting, migrating, readiness, the sea-orm entities, and the
//! lock that keeps one server on a data directory and database (`lock`).
//!
//! Entities stay inside `store`; areas read and write through the functions their
//! modules expose and convert rows to their own types at the boundary.

pub mod audit;
pub mod cluster;
pub mod deployments;
pub mod direct;
pub mod entities;
pub mod health;
mod location;
pub mod lock;
pub mod notify;
pub mod plans;
pub mod projects;
pub mod providers;
pub mod repositories;
pub mod revisions;
pub mod states;
pub mod users;

use std::time::Duration;

use migration::{Migrator, MigratorTrait};
use sea_orm::{ConnectOptions, Database, DatabaseConnection};

pub use location::{DatabaseLocation, InvalidDatabaseUrl, REDACTED};

/// A pool of connections to the store. Areas hold one and hand it to the store's
/// functions; only `store` builds queries or sea-orm models.
pub type Db = DatabaseConnection;
/// A transaction, for writes areas make inside one the store opened.
pub use sea_orm::DatabaseTransaction as Transaction;
/// An error the database answered with.
pub use sea_orm::DbErr;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot connect to {location}: {source}")]
    Connect { location: String, source: DbErr },
    #[error("migrations failed: {0}")]
    Migrate(DbErr),
    #[error(
        "the database's schema is at {database}, newer than this Corbel knows (up to \
         {binary}): another server of a newer version migrated it; run that version here too"
    )]
    NewerSchema { database: String, binary: String },
    #[error("database error: {0}")]
    Db(#[from] DbErr),
}

/// Opens a pool to the store. For SQLite the file (and its directory) is made if
/// missing.
pub async fn connect(location: &DatabaseLocation) -> Result<DatabaseConnection, StoreError> {
    connect_limited(location, None).await
}

/// As [`connect`]; on PostgreSQL, with `idle_in_transaction`, the server ends
/// a session that stays idle inside a transaction that long. A replica's
/// pools use its lease: a leader paused (or cut off) inside a fenced
/// transaction holds a share lock on the lease row, which would keep the
/// next leader's claim waiting for as long as it is paused.
pub async fn connect_limited(
    location: &DatabaseLocation,
    idle_in_transaction: Option<Duration>,
) -> Result<DatabaseConnection, StoreError> {
    if let DatabaseLocation::Sqlite(path) = location
        && let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::DataDir {
            path: dir.to_owned(),
            source,
        })?;
    }
    let mut options = ConnectOptions::new(location.connect_url());
    options
        .connect_timeout(Duration::from_secs(10))
        .acquire_timeout(Duration::from_secs(10))
        .sqlx_logging(false);
    match location {
        // SQLite serialises writers; a small pool avoids piling up on its lock.
        // WAL is asked for: sqlx leaves the journal mode alone, and the
        // default (a rollback journal, made and deleted per transaction) both
        // blocks readers behind a writer and, with `synchronous = NORMAL`, can
        // corrupt the file on a power cut. In WAL mode `synchronous = NORMAL`
        // is the documented safe choice: the database cannot corrupt, a
        // process crash loses nothing committed, and only the last commits
        // before a power cut may be lost. It saves an fsync per transaction,
        // which dominates the journal's small commits and a sync's batches.
        DatabaseLocation::Sqlite(_) => {
            sqlite_without_memory_statistics();
            options
                .max_connections(4)
                .min_connections(1)
                .map_sqlx_sqlite_opts(|o| {
                    o.journal_mode(sea_orm::sqlx::sqlite::SqliteJournalMode::Wal)
                        .synchronous(sea_orm::sqlx::sqlite::SqliteSynchronous::Normal)
                })
        }
        DatabaseLocation::Postgres(_) => {
            let options = options.max_connections(16).min_connections(1);
            match idle_in_transaction {
                Some(limit) => options.map_sqlx_postgres_opts(move |o| {
                    o.options([(
                        "idle_in_transaction_session_timeout",
                        limit.as_millis().max(1).to_string(),
                    )])
                }),
                None => options,
            }
        }
    };
    let db = Database::connect(options)
        .await
        .map_err(|source| StoreError::Connect {
            location: location.redacted(),
            source,
        })?;
    if let DatabaseLocation::Sqlite(path) = location {
        keep_to_owner(path);
    }
    // sqlx turns SQLite foreign keys on for every connection it opens;
    // cascades in the schema rely on it.
    Ok(db)
}

/// The database's files readable by their owner only: they hold password
/// and token hashes and sealed secrets, and the data directory may be open
/// to a provider run as another user (`runAs`). SQLite makes its `-wal` and
/// `-shm` files with the database's mode; those made before are set too.
fn keep_to_owner(database: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    for suffix in ["", "-wal", "-shm"] {
        let mut path = database.as_os_str().to_owned();
        path.push(suffix);
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.permissions().mode() & 0o077 == 0 {
            continue;
        }
        let owner_only = std::fs::Permissions::from_mode(meta.permissions().mode() & 0o700);
        if let Err(e) = std::fs::set_permissions(&path, owner_only) {
            tracing::warn!(path = %std::path::Path::new(&path).display(), error = %e,
                "cannot make the database readable by its owner only");
        }
    }
}

/// SQLite keeps statistics of its memory use (`sqlite3_memory_used`, which
/// nothing here reads) under one process-wide mutex, taken on every
/// allocation and free it makes; mutex locking and unlocking, SQLite's, were
/// 5% of a 100,000-element sync's profile. Turned off before SQLite starts
/// in this process; once it has started, SQLite refuses the change and keeps
/// them (harmless).
fn sqlite_without_memory_statistics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `sqlite3_config` must not run beside any other SQLite call;
        // this runs once, before this process opens its first database (the
        // store is what opens them all).
        let code = unsafe {
            rusqlite::ffi::sqlite3_config(
                rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS,
                std::ffi::c_int::from(0),
            )
        };
        tracing::debug!(code, "SQLite memory statistics off");
    });
}

/// Applies every pending migration.
/// Values one `IN (…)` list of [`find_in`] takes (under SQLite's and
/// PostgreSQL's limits on a statement's parameters).
const IN_LIST: usize = 500;

/// The rows of `E` whose `column` is one of `values`, in no particular
/// order: one query per [`IN_LIST`] values.
pub(crate) async fn find_in<E, V>(
    db: &DatabaseConnection,
    column: E::Column,
    values: &[V],
) -> Result<Vec<E::Model>, DbErr>
where
    E: sea_orm::EntityTrait,
    V: Into<sea_orm::Value> + Clone,
{
    use sea_orm::{ColumnTrait, QueryFilter};
    let mut rows = Vec::with_capacity(values.len());
    for chunk in values.chunks(IN_LIST) {
        rows.extend(
            E::find()
                .filter(column.is_in(chunk.iter().cloned()))
                .all(db)
                .await?,
        );
    }
    Ok(rows)
}

/// Brings the schema up to this binary's, after checking that the database
/// holds no migration this binary does not know (a newer server's).
pub async fn migrate(db: &DatabaseConnection) -> Result<(), StoreError> {
    if let Some(newer) = newer_schema(db).await? {
        return Err(newer);
    }
    Migrator::up(db, None).await.map_err(StoreError::Migrate)
}

/// The migrations this binary would apply to the database, by name.
pub async fn pending_migrations(db: &DatabaseConnection) -> Result<Vec<String>, StoreError> {
    let pending = Migrator::get_pending_migrations(db)
        .await
        .map_err(StoreError::Migrate)?;
    Ok(pending.iter().map(|m| m.name().to_owned()).collect())
}

/// The database's schema version: the last migration applied to it
/// (empty for a new database).
pub async fn database_schema(db: &DatabaseConnection) -> String {
    use sea_orm::{ConnectionTrait, Statement};
    let backend = db.get_database_backend();
    let query = Statement::from_string(
        backend,
        "SELECT max(version) AS version FROM seaql_migrations",
    );
    match db.query_one_raw(query).await {
        Ok(Some(row)) => row
            .try_get::<Option<String>>("", "version")
            .ok()
            .flatten()
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// The schema version this binary ends at: its last migration's name.
pub fn schema_version() -> String {
    Migrator::migrations()
        .last()
        .map(|m| m.name().to_owned())
        .unwrap_or_default()
}

/// The refusal to run on a database a newer binary migrated, naming both
/// versions; `None` when every applied migration is one of ours (or none
/// is: a new database).
async fn newer_schema(db: &DatabaseConnection) -> Result<Option<StoreError>, StoreError> {
    use sea_orm::{ConnectionTrait, Statement};
    let backend = db.get_database_backend();
    let query = Statement::from_string(backend, "SELECT version FROM seaql_migrations");
    // No table yet: a new database.
    let Ok(rows) = db.query_all_raw(query).await else {
        return Ok(None);
    };
    let known: std::collections::HashSet<String> = Migrator::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    let mut unknown = Vec::new();
    for row in rows {
        let version: String = row.try_get("", "version")?;
        if !known.contains(&version) {
            unknown.push(version);
        }
    }
    Ok(unknown
        .into_iter()
        .max()
        .map(|database| StoreError::NewerSchema {
            database,
            binary: schema_version(),
        }))
}

/// Why the store is not ready, if it is not: unreachable, or not migrated.
pub async fn readiness(db: &DatabaseConnection) -> Result<(), String> {
    db.ping()
        .await
        .map_err(|e| format!("database unreachable: {e}"))?;
    let pending = Migrator::get_pending_migrations(db)
        .await
        .map_err(|e| format!("cannot read migration state: {e}"))?;
    if pending.is_empty() {
        Ok(())
    } else {
        let names: Vec<&str> = pending.iter().map(|m| m.name()).collect();
        Err(format!("pending migrations: {}", names.join(", ")))
    }
}

/// True when the error is a unique-key or foreign-key violation: the edge maps it
/// to `CONFLICT`.
pub fn is_conflict(err: &DbErr) -> bool {
    matches!(
        err.sql_err(),
        Some(sea_orm::SqlErr::UniqueConstraintViolation(_))
            | Some(sea_orm::SqlErr::ForeignKeyConstraintViolation(_))
    )
}
