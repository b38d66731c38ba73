//! Replicas and cluster leases (`replicas`, `cluster_leases`): each statement
//! reads the time from the database (`NOW_MS`), never from the caller, so
//! replicas whose clocks disagree still agree on whose lease has run out.
//!
//! A lease is claimed by one conditional `UPDATE … RETURNING`, which the
//! database runs atomically: it succeeds for the holder (a renewal, keeping
//! its epoch while the lease has not run out) or when nobody holds an
//! unexpired lease (a new holder, with the next epoch). A write made on the
//! strength of a lease ([`fenced`]) first reads the lease row under a share
//! lock (PostgreSQL) in the same transaction, as held by this holder with
//! this epoch and not run out; a claim by another replica waits for that
//! transaction, so a write never lands after its writer lost the lease.

use std::future::Future;
use std::pin::Pin;

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, Statement,
    TransactionTrait, Value,
};
use uuid::Uuid;

/// A replica as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaRow {
    pub id: Uuid,
    pub advertise_url: String,
    pub host: String,
    pub pid: i32,
    pub version: String,
    pub started_ms: i64,
    pub heartbeat_ms: i64,
    pub lease_until_ms: i64,
    pub stopped_ms: Option<i64>,
    /// The id of the secret key it runs with (none before issue 40).
    pub key_id: Option<String>,
    /// The provider state directory it uses.
    pub state_dir: Option<String>,
}

/// The database's clock, in milliseconds since the Unix epoch.
fn now_ms(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint",
        _ => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
    }
}

/// `sql` with `NOW_MS` the database's clock, and `$n` placeholders as the
/// backend writes them (SQLite: `?n`, which it numbers the same way).
fn statement(backend: DbBackend, sql: &str, values: Vec<Value>) -> Statement {
    let mut sql = sql.replace("NOW_MS", now_ms(backend));
    if backend == DbBackend::Sqlite {
        sql = sql.replace('$', "?");
    }
    Statement::from_sql_and_values(backend, sql, values)
}

/// Adds this replica, its lease running `lease_ms` from now.
pub async fn join(
    db: &DatabaseConnection,
    row: &ReplicaRow,
    lease_ms: i64,
) -> Result<ReplicaRow, DbErr> {
    let backend = db.get_database_backend();
    db.execute_raw(statement(
        backend,
        "INSERT INTO replicas (id, advertise_url, host, pid, version, started_ms, heartbeat_ms, \
         lease_until_ms, stopped_ms, key_id, state_dir) \
         VALUES ($1, $2, $3, $4, $5, NOW_MS, NOW_MS, NOW_MS + $6, NULL, $7, $8)",
        vec![
            row.id.into(),
            row.advertise_url.clone().into(),
            row.host.clone().into(),
            row.pid.into(),
            row.version.clone().into(),
            lease_ms.into(),
            row.key_id.clone().into(),
            row.state_dir.clone().into(),
        ],
    ))
    .await?;
    replica(db, row.id)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound(format!("replica {} after joining", row.id)))
}

/// Renews this replica's lease; false when the replica was marked stopped
/// (it must not go on as a member).
pub async fn heartbeat(db: &DatabaseConnection, id: Uuid, lease_ms: i64) -> Result<bool, DbErr> {
    let backend = db.get_database_backend();
    let done = db
        .execute_raw(statement(
            backend,
            "UPDATE replicas SET heartbeat_ms = NOW_MS, lease_until_ms = NOW_MS + $1 \
             WHERE id = $2 AND stopped_ms IS NULL",
            vec![lease_ms.into(), id.into()],
        ))
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Marks this replica stopped, its lease over now.
pub async fn leave(db: &DatabaseConnection, id: Uuid) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    db.execute_raw(statement(
        backend,
        "UPDATE replicas SET stopped_ms = NOW_MS, lease_until_ms = NOW_MS WHERE id = $1",
        vec![id.into()],
    ))
    .await?;
    Ok(())
}

const REPLICA_COLUMNS: &str = "id, advertise_url, host, pid, version, started_ms, heartbeat_ms, \
                               lease_until_ms, stopped_ms, key_id, state_dir";

fn replica_of(row: &sea_orm::QueryResult) -> Result<ReplicaRow, DbErr> {
    Ok(ReplicaRow {
        id: row.try_get("", "id")?,
        advertise_url: row.try_get("", "advertise_url")?,
        host: row.try_get("", "host")?,
        pid: row.try_get("", "pid")?,
        version: row.try_get("", "version")?,
        started_ms: row.try_get("", "started_ms")?,
        heartbeat_ms: row.try_get("", "heartbeat_ms")?,
        lease_until_ms: row.try_get("", "lease_until_ms")?,
        stopped_ms: row.try_get("", "stopped_ms")?,
        key_id: row.try_get("", "key_id")?,
        state_dir: row.try_get("", "state_dir")?,
    })
}

pub async fn replica(db: &DatabaseConnection, id: Uuid) -> Result<Option<ReplicaRow>, DbErr> {
    let backend = db.get_database_backend();
    let row = db
        .query_one_raw(statement(
            backend,
            &format!("SELECT {REPLICA_COLUMNS} FROM replicas WHERE id = $1"),
            vec![id.into()],
        ))
        .await?;
    row.as_ref().map(replica_of).transpose()
}

/// Every replica, the most recently started first, and the database's clock.
pub async fn replicas(db: &DatabaseConnection) -> Result<(Vec<ReplicaRow>, i64), DbErr> {
    let backend = db.get_database_backend();
    let rows = db
        .query_all_raw(statement(
            backend,
            &format!("SELECT {REPLICA_COLUMNS} FROM replicas ORDER BY started_ms DESC, id"),
            vec![],
        ))
        .await?;
    let now = database_now(db).await?;
    Ok((rows.iter().map(replica_of).collect::<Result<_, _>>()?, now))
}

/// The database's clock, in milliseconds.
pub async fn database_now(db: &impl ConnectionTrait) -> Result<i64, DbErr> {
    let backend = db.get_database_backend();
    let row = db
        .query_one_raw(statement(backend, "SELECT NOW_MS AS now_ms", vec![]))
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("the database's clock".into()))?;
    row.try_get("", "now_ms")
}

/// Ends the lease of every replica that did not leave: for the one server a
/// database allows, at its start, whose predecessors are dead. How many.
pub async fn end_leases(db: &DatabaseConnection) -> Result<u64, DbErr> {
    let backend = db.get_database_backend();
    let done = db
        .execute_raw(statement(
            backend,
            "UPDATE replicas SET lease_until_ms = NOW_MS \
             WHERE stopped_ms IS NULL AND lease_until_ms > NOW_MS",
            vec![],
        ))
        .await?;
    Ok(done.rows_affected())
}

/// Removes replicas whose lease ran out more than `keep_ms` ago; how many.
pub async fn forget_gone(db: &impl ConnectionTrait, keep_ms: i64) -> Result<u64, DbErr> {
    let backend = db.get_database_backend();
    let done = db
        .execute_raw(statement(
            backend,
            "DELETE FROM replicas WHERE lease_until_ms < NOW_MS - $1",
            vec![keep_ms.into()],
        ))
        .await?;
    Ok(done.rows_affected())
}

/// Who holds a lease, with its epoch, and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRow {
    pub holder: Option<Uuid>,
    pub epoch: i64,
    pub until_ms: i64,
}

pub async fn lease(db: &DatabaseConnection, name: &str) -> Result<Option<LeaseRow>, DbErr> {
    let backend = db.get_database_backend();
    let row = db
        .query_one_raw(statement(
            backend,
            "SELECT holder, epoch, until_ms FROM cluster_leases WHERE name = $1",
            vec![name.into()],
        ))
        .await?;
    row.map(|row| {
        Ok(LeaseRow {
            holder: row.try_get("", "holder")?,
            epoch: row.try_get("", "epoch")?,
            until_ms: row.try_get("", "until_ms")?,
        })
    })
    .transpose()
}

/// The replica holding lease `name` now, and the URL it advertises.
pub async fn holder_url(
    db: &DatabaseConnection,
    name: &str,
) -> Result<Option<(Uuid, String)>, DbErr> {
    let backend = db.get_database_backend();
    let row = db
        .query_one_raw(statement(
            backend,
            "SELECT r.id, r.advertise_url FROM cluster_leases l JOIN replicas r ON r.id = l.holder \
             WHERE l.name = $1 AND l.until_ms > NOW_MS AND r.stopped_ms IS NULL",
            vec![name.into()],
        ))
        .await?;
    row.map(|row| Ok((row.try_get("", "id")?, row.try_get("", "advertise_url")?)))
        .transpose()
}

/// Claims or renews lease `name` for `me` for `lease_ms`: its epoch if `me`
/// holds it now. A renewal keeps the epoch; a new holder, or a holder whose
/// lease ran out meanwhile, gets the next one. `take_over` claims it even
/// from a holder whose lease has not run out, for a holder known dead (the
/// one server on a database, at its start).
pub async fn claim(
    db: &DatabaseConnection,
    name: &str,
    me: Uuid,
    lease_ms: i64,
    take_over: bool,
) -> Result<Option<i64>, DbErr> {
    let backend = db.get_database_backend();
    let row = db
        .query_one_raw(statement(
            backend,
            "UPDATE cluster_leases SET \
               epoch = CASE WHEN holder = $1 AND until_ms > NOW_MS THEN epoch ELSE epoch + 1 END, \
               holder = $1, until_ms = NOW_MS + $2 \
             WHERE name = $3 AND ($4 OR holder IS NULL OR holder = $1 OR until_ms <= NOW_MS) \
             RETURNING epoch",
            vec![me.into(), lease_ms.into(), name.into(), take_over.into()],
        ))
        .await?;
    row.map(|row| row.try_get("", "epoch")).transpose()
}

/// Gives lease `name` up, if `me` still holds it with `epoch`.
pub async fn release(
    db: &DatabaseConnection,
    name: &str,
    me: Uuid,
    epoch: i64,
) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    db.execute_raw(statement(
        backend,
        "UPDATE cluster_leases SET holder = NULL, until_ms = 0 \
         WHERE name = $1 AND holder = $2 AND epoch = $3",
        vec![name.into(), me.into(), epoch.into()],
    ))
    .await?;
    Ok(())
}

/// A lease a group of writes is made under: each transaction first checks
/// that `holder` still holds lease `name` with `epoch` ([`check_fence`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub name: String,
    pub holder: Uuid,
    pub epoch: i64,
}

/// In `txn`, first thing: whether `fence` still holds (read under a share
/// lock on PostgreSQL, so a claim by another waits for the transaction).
pub async fn check_fence(txn: &DatabaseTransaction, fence: &Fence) -> Result<bool, DbErr> {
    let backend = txn.get_database_backend();
    let share = if backend == DbBackend::Postgres {
        " FOR SHARE"
    } else {
        ""
    };
    let held = txn
        .query_one_raw(statement(
            backend,
            &format!(
                "SELECT epoch FROM cluster_leases \
                 WHERE name = $1 AND holder = $2 AND epoch = $3 AND until_ms > NOW_MS{share}"
            ),
            vec![
                fence.name.as_str().into(),
                fence.holder.into(),
                fence.epoch.into(),
            ],
        ))
        .await?;
    Ok(held.is_some())
}

/// What a write refused by its fence fails with.
pub fn fenced_out(fence: &Fence) -> DbErr {
    DbErr::Custom(format!(
        "fenced: lease {} is no longer held with epoch {}; the write was refused",
        fence.name, fence.epoch
    ))
}

/// Why a fenced write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum FencedError {
    #[error("lease {name} is no longer held with epoch {epoch}: the write was refused")]
    Fenced { name: String, epoch: i64 },
    #[error(transparent)]
    Db(#[from] DbErr),
}

/// A write on the strength of lease `name`, held by `me` with `epoch`.
pub type FencedWrite<'t, T> = Pin<Box<dyn Future<Output = Result<T, DbErr>> + Send + 't>>;

/// Runs `write` in a transaction that first checks, under a share lock on
/// PostgreSQL, that `me` holds lease `name` with `epoch` and that it has not
/// run out; refuses with [`FencedError::Fenced`] otherwise, writing nothing.
pub async fn fenced<T: Send>(
    db: &DatabaseConnection,
    name: &str,
    me: Uuid,
    epoch: i64,
    write: impl for<'t> FnOnce(&'t DatabaseTransaction) -> FencedWrite<'t, T> + Send,
) -> Result<T, FencedError> {
    let txn = db.begin().await?;
    let fence = Fence {
        name: name.to_owned(),
        holder: me,
        epoch,
    };
    if !check_fence(&txn, &fence).await? {
        txn.rollback().await?;
        return Err(FencedError::Fenced {
            name: name.to_owned(),
            epoch,
        });
    }
    let value = write(&txn).await?;
    txn.commit().await?;
    Ok(value)
}
