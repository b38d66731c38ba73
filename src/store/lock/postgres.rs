//! The PostgreSQL side of the server lock: the advisory lock held on a
//! session of its own (`PgHold`), by a task that checks the session and takes
//! the lock again when it is lost (`keep`), naming the holder when the lock is
//! refused; and the migration lock replicas take one after another
//! (`migrating`).

use std::fmt;
use std::time::Duration;

use sea_orm::sqlx::postgres::{PgConnectOptions, PgConnection};
use sea_orm::sqlx::{self, Connection as _};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::{ADVISORY_KEY, Holder, LockError, MIGRATE_KEY};
use crate::store::DatabaseLocation;

/// How long a replica waits for another's migration.
const MIGRATE_WAIT: Duration = Duration::from_secs(300);

/// How often the PostgreSQL lock session is checked (and, once lost, retaken).
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// How long a start waits for a lock whose holder looks dead.
const SETTLE: Duration = Duration::from_secs(5);

/// Deadline of each statement on the lock session, and of connecting it.
const PG_DEADLINE: Duration = Duration::from_secs(10);

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

/// The advisory lock, held by a task that owns its session.
pub(super) struct PgHold {
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
    pub(super) async fn acquire(
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

    pub(super) async fn rename(&self, name: String) {
        let _ = self.commands.send(PgCommand::Rename(name)).await;
    }

    pub(super) async fn release(self) {
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
    options: PgConnectOptions,
    location: String,
    mut commands: mpsc::Receiver<PgCommand>,
) {
    let mut keeper = Keeper {
        held: Some(connection),
        options,
        location,
        complaint: None,
    };
    let mut every = tokio::time::interval_at(Instant::now() + CHECK_EVERY, CHECK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            command = commands.recv() => match command {
                Some(PgCommand::Rename(name)) => keeper.rename(name).await,
                Some(PgCommand::Release(done)) => {
                    keeper.release().await;
                    let _ = done.send(());
                    return;
                }
                None => {
                    if let Some(connection) = keeper.held.take() {
                        let _ = connection.close().await;
                    }
                    return;
                }
            },
            _ = every.tick() => if keeper.held.is_some() {
                keeper.check().await;
            } else {
                keeper.retake().await;
            },
        }
    }
}

/// What [`keep`] carries from one turn to the next.
struct Keeper {
    /// The session holding the lock; `None` once lost, until taken again.
    held: Option<PgConnection>,
    /// How a new session connects, under the holder's latest name.
    options: PgConnectOptions,
    location: String,
    /// The last complaint, so a lasting problem is logged once.
    complaint: Option<String>,
}

impl Keeper {
    async fn rename(&mut self, name: String) {
        self.options = self.options.clone().application_name(&name);
        if let Some(connection) = &mut self.held {
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

    async fn release(&mut self) {
        if let Some(mut connection) = self.held.take() {
            let _ = within(
                sqlx::query("SELECT pg_advisory_unlock($1)")
                    .bind(ADVISORY_KEY)
                    .execute(&mut connection),
            )
            .await;
            let _ = connection.close().await;
        }
    }

    /// Lets the session go when it no longer holds the lock.
    async fn check(&mut self) {
        let Some(connection) = self.held.as_mut() else {
            return;
        };
        let lost = match still_held(connection).await {
            Ok(true) => None,
            Ok(false) => Some("the session no longer holds it".to_owned()),
            Err(e) => Some(e),
        };
        if let Some(reason) = lost {
            tracing::error!(
                database = %self.location,
                error = %reason,
                "lost the PostgreSQL session holding the server lock: another \
                 server could start on this database; taking the lock again"
            );
            self.held = None;
            self.complaint = Some(reason);
        }
    }

    /// Takes the lock again on a new session.
    async fn retake(&mut self) {
        let connection = match connect(&self.options).await {
            Ok(connection) => connection,
            Err(e) => return self.complain(e),
        };
        match attempt(connection).await {
            Ok(Attempt::Taken(connection)) => {
                tracing::info!(database = %self.location, "took the server lock again");
                self.held = Some(connection);
                self.complaint = None;
            }
            Ok(Attempt::Busy(connection, holder)) => {
                let _ = connection.close().await;
                let holder = holder.map_or_else(
                    || "a session that could not be named".to_owned(),
                    |h| h.to_string(),
                );
                self.complain(format!(
                    "another server holds it now: {holder}; stop this one"
                ));
            }
            Err(e) => self.complain(e),
        }
    }

    fn complain(&mut self, reason: String) {
        if self.complaint.as_deref() != Some(reason.as_str()) {
            tracing::error!(database = %self.location, error = %reason, "cannot take the server lock again");
            self.complaint = Some(reason);
        }
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
}
