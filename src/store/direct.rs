//! A SQLite connection of the store's own, driven synchronously from one
//! thread, beside sea-orm's pool: for the engine's writer, whose small
//! commits are bound by hand-offs, not by SQL, and for a repository sync's
//! bulk reads and writes, where building and binding a 500-row statement
//! per chunk costs more than SQLite's work. Through the pool, each
//! statement of a transaction is a trip to sqlx's worker thread and back, so
//! a commit of four statements is six round trips between threads; here the
//! whole transaction runs where it is called.
//!
//! The statements are the ones the pool would run (built by sea-query for
//! SQLite), and values are bound as sqlx binds them (a UUID as 16 bytes, a
//! time as RFC 3339 text, a boolean as an integer), so rows written either
//! way read back the same. The file is in WAL mode (set by the pool's first
//! connection; see `store::connect`), which lets this connection and the
//! pool's work side by side.

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::types::Value as Sql;
use sea_orm::sea_query::Value;
use sea_orm::{ActiveEnum as _, DbBackend, DbErr};

use super::deployments::{EventRow, Group, GroupWrite};
use super::repositories::{ElementWrite, Stored, hash_bytes};
use super::states::{ElementStatus, EventState};

/// How long a write waits for SQLite's one write lock, held by the pool's
/// connections: sqlx's own default.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Direct {
    connection: rusqlite::Connection,
}

impl Direct {
    /// A connection to the SQLite file behind `db`; `None` on PostgreSQL, or
    /// for an in-memory database, which another connection would not see.
    pub fn open(db: &super::Db) -> Option<Result<Direct, DbErr>> {
        if db.get_database_backend() != DbBackend::Sqlite {
            return None;
        }
        let options = db.get_sqlite_connection_pool().connect_options();
        let path = options.get_filename();
        let name = path.to_string_lossy();
        if name == ":memory:" || name.starts_with("file:") {
            return None;
        }
        Some(Self::open_file(path))
    }

    fn open_file(path: &Path) -> Result<Direct, DbErr> {
        let connection = rusqlite::Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(error)?;
        connection.busy_timeout(BUSY_TIMEOUT).map_err(error)?;
        // What sqlx sets on the pool's connections (see `store::connect`).
        connection
            .execute_batch("PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL;")
            .map_err(error)?;
        Ok(Direct { connection })
    }

    /// Sized for bulk writes (a repository sync): a page cache of 8 MiB, used
    /// as it fills, so a batch's dirty pages are not spilled to the log
    /// before it commits (SQLite's default cache is 2 MiB).
    pub fn for_bulk(self) -> Result<Self, DbErr> {
        self.connection
            .execute_batch("PRAGMA cache_size = -8192;")
            .map_err(error)?;
        Ok(self)
    }

    /// Copies what the write-ahead log holds into the database file, as far
    /// as no reader still needs it (`PASSIVE`: it waits for no one). After a
    /// bulk write this spares the next writer, whoever it is, the
    /// checkpoint SQLite would otherwise run in its commit.
    ///
    /// Answers the frames in the log and how many of them are now in the file.
    pub fn checkpoint(&mut self) -> Result<(i64, i64), DbErr> {
        self.connection
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
                Ok((row.get(1)?, row.get(2)?))
            })
            .map_err(error)
    }

    /// [`super::deployments::commit_group`] on this connection: the same
    /// statements in one transaction, the event each write stored.
    pub fn commit_group(&mut self, writes: &[&GroupWrite]) -> Result<Vec<Option<EventRow>>, DbErr> {
        let group = Group::of(writes);
        // IMMEDIATE: the write lock is taken (or waited for) at the start, so
        // the transaction never has to upgrade a read it began with.
        let txn = self
            .connection
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(error)?;
        for change in &group.changes {
            let statement = change.build(DbBackend::Sqlite);
            let values = bind(statement.values)?;
            txn.prepare_cached(&statement.sql)
                .and_then(|mut prepared| prepared.execute(rusqlite::params_from_iter(values)))
                .map_err(error)?;
        }
        let mut stored = Vec::with_capacity(writes.len());
        for insert in &group.events {
            let statement = DbBackend::Sqlite.build(insert);
            let values = bind(statement.values)?;
            let mut prepared = txn.prepare_cached(&statement.sql).map_err(error)?;
            let mut rows = prepared
                .query(rusqlite::params_from_iter(values))
                .map_err(error)?;
            while let Some(row) = rows.next().map_err(error)? {
                stored.push(event_row(row)?);
            }
        }
        txn.commit().map_err(error)?;
        group.answers(stored)
    }
}

impl Direct {
    /// [`super::repositories::existing_elements`] in one statement: this
    /// connection hands rows over as SQLite steps through them, so memory
    /// holds one row, never the repository's.
    pub fn existing_elements(
        &mut self,
        repository_id: uuid::Uuid,
        mut each: impl FnMut(&str, &str, Stored),
    ) -> Result<(), DbErr> {
        let mut statement = self
            .connection
            .prepare_cached(
                "SELECT id, name, version, inventory_hash, installed, manifest IS NOT NULL \
                 FROM elements WHERE repository_id = ?1",
            )
            .map_err(error)?;
        let mut rows = statement
            .query([repository_id.as_bytes().as_slice()])
            .map_err(error)?;
        while let Some(row) = rows.next().map_err(error)? {
            let text = |i: usize| row.get_ref(i).and_then(|v| Ok(v.as_str_or_null()?));
            let id = row
                .get_ref(0)
                .and_then(|v| Ok(v.as_blob()?))
                .map_err(error)?;
            let stored = Stored {
                id: uuid::Uuid::from_slice(id)
                    .map_err(|e| DbErr::Custom(format!("sqlite: an element id: {e}")))?,
                hash: text(3).map_err(error)?.and_then(hash_bytes),
                installed: row.get(4).map_err(error)?,
                has_manifest: row.get(5).map_err(error)?,
            };
            let name = text(1).map_err(error)?.unwrap_or_default();
            let version = text(2).map_err(error)?.unwrap_or_default();
            each(name, version, stored);
        }
        Ok(())
    }

    /// [`super::repositories::write_batch`] with prepared statements, one row
    /// at a time, in one transaction.
    pub fn write_batch(
        &mut self,
        repository_id: uuid::Uuid,
        inserts: Vec<ElementWrite>,
        updates: Vec<ElementWrite>,
    ) -> Result<(), DbErr> {
        let now = time_text(&Utc::now());
        let repository = repository_id.as_bytes().as_slice();
        let txn = self
            .connection
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(error)?;
        {
            let mut statements = ElementStatements::prepare(&txn).map_err(error)?;
            for write in inserts {
                statements.insert(repository, &now, write).map_err(error)?;
            }
            for write in updates {
                statements.update(&now, write).map_err(error)?;
            }
        }
        txn.commit().map_err(error)
    }
}

/// The statements of [`Direct::write_batch`], prepared once on its
/// transaction. They leave the rows `repositories::write_batch` leaves
/// through the pool: a change to one is a change to the other.
struct ElementStatements<'t> {
    insert: rusqlite::CachedStatement<'t>,
    update: rusqlite::CachedStatement<'t>,
    forget: rusqlite::CachedStatement<'t>,
    listed_urns: rusqlite::CachedStatement<'t>,
    drop_artifact: rusqlite::CachedStatement<'t>,
    artifact: rusqlite::CachedStatement<'t>,
}

impl<'t> ElementStatements<'t> {
    fn prepare(txn: &'t rusqlite::Connection) -> rusqlite::Result<Self> {
        Ok(ElementStatements {
            insert: txn.prepare_cached(
                "INSERT INTO elements (id, repository_id, name, version, inventory_hash, \
                 manifest, status, status_message, installed, installed_at, created_at, \
                 updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?8, NULL, 0, NULL, ?7, ?7)",
            )?,
            update: txn.prepare_cached(
                "UPDATE elements SET inventory_hash = ?2, manifest = ?3, updated_at = ?4 \
                 WHERE id = ?1",
            )?,
            // A changed entry is judged again: what was found wrong with it goes.
            forget: txn.prepare_cached("DELETE FROM invalid_elements WHERE element_id = ?1")?,
            // A changed element's artifacts are replaced in place: a row that
            // is listed as it was is not written, so a refresh dirties the
            // pages of what changed, not of every artifact the element has
            // (a delete and an insert touch the table and both its indexes).
            listed_urns: txn.prepare_cached("SELECT urn FROM artifacts WHERE element_id = ?1")?,
            drop_artifact: txn
                .prepare_cached("DELETE FROM artifacts WHERE element_id = ?1 AND urn = ?2")?,
            artifact: txn.prepare_cached(
                "INSERT INTO artifacts (id, element_id, urn, category, file_name) \
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (element_id, urn) \
                 DO UPDATE SET category = excluded.category, file_name = excluded.file_name \
                 WHERE artifacts.category IS NOT excluded.category \
                 OR artifacts.file_name IS NOT excluded.file_name",
            )?,
        })
    }

    fn insert(
        &mut self,
        repository: &[u8],
        now: &str,
        write: ElementWrite,
    ) -> rusqlite::Result<()> {
        let id = write.id.as_bytes().as_slice();
        self.insert.execute(rusqlite::params![
            id,
            repository,
            write.name,
            write.version,
            write.hash,
            write.manifest,
            now,
            ElementStatus::New.as_str()
        ])?;
        self.artifacts_of(id, write.artifacts)
    }

    fn update(&mut self, now: &str, write: ElementWrite) -> rusqlite::Result<()> {
        let id = write.id.as_bytes().as_slice();
        self.forget.execute([id])?;
        if let Some(list) = &write.artifacts {
            self.drop_unlisted(id, list)?;
        }
        self.update
            .execute(rusqlite::params![id, write.hash, write.manifest, now])?;
        self.artifacts_of(id, write.artifacts)
    }

    fn artifacts_of(
        &mut self,
        id: &[u8],
        list: Option<Vec<(String, String, String)>>,
    ) -> rusqlite::Result<()> {
        for (urn, category, file_name) in list.into_iter().flatten() {
            self.artifact.execute(rusqlite::params![
                uuid::Uuid::now_v7().as_bytes().as_slice(),
                id,
                urn,
                category,
                file_name
            ])?;
        }
        Ok(())
    }

    /// Drops what an element had that its new listing leaves out.
    fn drop_unlisted(
        &mut self,
        id: &[u8],
        list: &[(String, String, String)],
    ) -> rusqlite::Result<()> {
        let listed: std::collections::HashSet<&str> =
            list.iter().map(|(urn, _, _)| urn.as_str()).collect();
        let gone: Vec<String> = self
            .listed_urns
            .query_map([id], |row| row.get::<_, String>(0))?
            .filter(|urn| {
                urn.as_ref()
                    .map_or(true, |urn| !listed.contains(urn.as_str()))
            })
            .collect::<Result<_, _>>()?;
        for urn in gone {
            self.drop_artifact.execute(rusqlite::params![id, urn])?;
        }
        Ok(())
    }
}

fn error(e: rusqlite::Error) -> DbErr {
    DbErr::Custom(format!("sqlite: {e}"))
}

/// The statement's values as sqlx would bind them.
fn bind(values: Option<sea_orm::sea_query::Values>) -> Result<Vec<Sql>, DbErr> {
    let Some(values) = values else {
        return Ok(Vec::new());
    };
    values.0.into_iter().map(to_sql).collect()
}

fn to_sql(value: Value) -> Result<Sql, DbErr> {
    fn or_null<T>(value: Option<T>, to: impl FnOnce(T) -> Sql) -> Sql {
        value.map_or(Sql::Null, to)
    }
    Ok(match value {
        Value::Bool(v) => or_null(v, |v| Sql::Integer(v.into())),
        Value::Int(v) => or_null(v, |v| Sql::Integer(v.into())),
        Value::BigInt(v) => or_null(v, Sql::Integer),
        Value::String(v) => or_null(v, Sql::Text),
        Value::Uuid(v) => or_null(v, |v| Sql::Blob(v.as_bytes().to_vec())),
        Value::ChronoDateTimeUtc(v) => or_null(v, |v| Sql::Text(time_text(&v))),
        other => {
            return Err(DbErr::Custom(format!(
                "the direct SQLite connection does not bind {other:?}"
            )));
        }
    })
}

/// A time as sqlx writes it to SQLite.
fn time_text(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, false)
}

fn event_row(row: &rusqlite::Row<'_>) -> Result<EventRow, DbErr> {
    let read = |e: rusqlite::Error| DbErr::Custom(format!("sqlite: reading an event: {e}"));
    let deployment: Vec<u8> = row.get("deployment_id").map_err(read)?;
    let at: String = row.get("at").map_err(read)?;
    Ok(EventRow {
        id: row.get("id").map_err(read)?,
        deployment_id: uuid::Uuid::from_slice(&deployment)
            .map_err(|e| DbErr::Custom(format!("sqlite: an event's deployment id: {e}")))?,
        at: DateTime::parse_from_rfc3339(&at)
            .map_err(|e| DbErr::Custom(format!("sqlite: an event's time `{at}`: {e}")))?
            .with_timezone(&Utc),
        kind: row.get("kind").map_err(read)?,
        node_key: row.get("node_key").map_err(read)?,
        state: row
            .get::<_, Option<String>>("state")
            .map_err(read)?
            .map(|text| EventState::try_from_value(&text))
            .transpose()?,
        message: row.get("message").map_err(read)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_moves_the_whole_log_into_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        // Another writer that leaves its log for someone else to copy.
        let writer = rusqlite::Connection::open(&path).unwrap();
        writer
            .execute_batch(
                "PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0; \
                 CREATE TABLE t (x TEXT); \
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) \
                 INSERT INTO t SELECT hex(randomblob(100)) FROM n;",
            )
            .unwrap();
        let mut direct = Direct::open_file(&path).unwrap().for_bulk().unwrap();
        let (log, copied) = direct.checkpoint().unwrap();
        assert!(log > 10, "the writes are in the log: {log} frames");
        assert_eq!(copied, log, "all of it is in the file now");
        let count: i64 = writer
            .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
            .unwrap();
        assert_eq!(count, 2000);
    }
}
