//! PostgreSQL's `LISTEN`/`NOTIFY` on one channel: how the leading replica
//! tells the others what happened (each replica's own buses are fed from
//! it, see `app::feed`). A notification is delivered when the transaction
//! that sent it commits, in commit order, to every connection listening
//! then; one sent outside a transaction is its own.

use sea_orm::sqlx::postgres::PgListener;
use sea_orm::{ConnectionTrait, DbBackend, Statement};

use super::{Db, DbErr};

/// The channel every replica listens on.
pub const CHANNEL: &str = "corbel_events";

/// The most a payload may hold: PostgreSQL refuses 8,000 bytes or more.
pub const MAX_PAYLOAD: usize = 7_900;

/// Sends `payload` to every replica listening (at the commit of `db`'s
/// transaction, when it is one).
pub async fn notify(db: &impl ConnectionTrait, payload: &str) -> Result<(), DbErr> {
    db.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT pg_notify($1, $2)",
        [CHANNEL.into(), payload.into()],
    ))
    .await
    .map(|_| ())
}

/// The payload that says deployment events were committed up to id `last`
/// (`app::feed`'s `Message::DeploymentEvents`, as JSON).
pub fn deployment_events(last: i64) -> String {
    format!("{{\"deployment_events\":{last}}}")
}

/// A connection of its own, listening on [`CHANNEL`].
pub struct Listener(PgListener);

impl Listener {
    /// Listens on a connection taken from `db`'s pool (PostgreSQL only).
    pub async fn connect(db: &Db) -> Result<Listener, DbErr> {
        let pool = db.get_postgres_connection_pool();
        let mut listener = PgListener::connect_with(pool).await.map_err(sqlx_error)?;
        listener.listen(CHANNEL).await.map_err(sqlx_error)?;
        Ok(Listener(listener))
    }

    /// The next payload; `None` when the connection was lost: the next call
    /// connects again, and what was sent in between was not heard.
    pub async fn recv(&mut self) -> Result<Option<String>, DbErr> {
        match self.0.try_recv().await {
            Ok(Some(notification)) => Ok(Some(notification.payload().to_owned())),
            Ok(None) => Ok(None),
            Err(e) => Err(sqlx_error(e)),
        }
    }
}

fn sqlx_error(e: sea_orm::sqlx::Error) -> DbErr {
    DbErr::Custom(format!("listening for other replicas' events: {e}"))
}
