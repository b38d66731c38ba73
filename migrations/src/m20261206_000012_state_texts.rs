//! State columns typed (issue 36): from this release the server reads the
//! seven state and status columns as closed enums (sea-orm's
//! `DeriveActiveEnum` over text), so a row whose text names no state fails
//! the query that reads it. Nothing is changed here: the columns stay text
//! and each state is stored as exactly the text it always was. This
//! migration only checks that every row holds a text this release knows,
//! and otherwise fails naming each table, column, row and text it found, so
//! a server never starts on rows it cannot read. Fix (or delete) those rows
//! and start again: it runs again until it passes.
//!
//! The texts are written out here, as this release knows them, and never
//! edited; the server's test `every_text_the_migration_accepts_is_a_state`
//! holds each to a variant of its enum.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbErr};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// How a table's rows are named: `id`, a UUID or (events) a number.
#[derive(Clone, Copy)]
pub enum Id {
    Uuid,
    Integer,
}

/// A state column and the texts it may hold.
pub struct Column {
    pub table: &'static str,
    pub column: &'static str,
    pub id: Id,
    /// `NULL` is a value it may hold (an event without a state).
    pub nullable: bool,
    pub texts: &'static [&'static str],
}

const REPOSITORY: &[&str] = &["NEW", "SYNCING", "ACTIVE", "ERROR"];
const ELEMENT: &[&str] = &["NEW", "IN_PROGRESS", "ACTIVE", "ERROR"];
const PROVIDER: &[&str] = &[
    "UNLOADED",
    "FETCHING",
    "BUILDING",
    "STARTING",
    "REGISTERING",
    "CONNECTED",
    "DISCONNECTED",
    "FAILED",
    "UNLOADING",
];
const DEPLOYMENT: &[&str] = &[
    "PENDING",
    "IN_PROGRESS",
    "COMPLETE",
    "FAILED",
    "DESTROYING",
    "DESTROYED",
    "SUSPENDED",
];
const NODE: &[&str] = &[
    "TO_DEPLOY",
    "WAITING",
    "IN_PROGRESS",
    "COMPLETE",
    "SUSPENDED",
    "FAILED",
    "TAINTED",
    "TO_DESTROY",
    "DESTROYING",
    "DESTROYED",
    "TO_UPDATE",
    "UPDATING",
    "TO_RETIRE",
    "RETIRING",
    "RETIRED",
];
const PLAN: &[&str] = &["PENDING", "APPLIED"];
/// A `STATE` event carries a deployment's state, a `NODE` event a node's, a
/// `HEALTH` event a health (the last four).
const EVENT: &[&str] = &[
    "PENDING",
    "TO_DEPLOY",
    "WAITING",
    "IN_PROGRESS",
    "COMPLETE",
    "SUSPENDED",
    "FAILED",
    "TAINTED",
    "TO_DESTROY",
    "DESTROYING",
    "DESTROYED",
    "TO_UPDATE",
    "UPDATING",
    "TO_RETIRE",
    "RETIRING",
    "RETIRED",
    "HEALTHY",
    "DEGRADED",
    "DOWN",
    "UNKNOWN",
];

/// The seven columns this release reads as enums.
pub const COLUMNS: [Column; 7] = [
    column("repositories", "status", REPOSITORY),
    column("elements", "status", ELEMENT),
    column("providers", "status", PROVIDER),
    column("deployments", "state", DEPLOYMENT),
    column("deployment_nodes", "state", NODE),
    column("deployment_plans", "state", PLAN),
    Column {
        table: "deployment_events",
        column: "state",
        id: Id::Integer,
        nullable: true,
        texts: EVENT,
    },
];

const fn column(
    table: &'static str,
    column: &'static str,
    texts: &'static [&'static str],
) -> Column {
    Column {
        table,
        column,
        id: Id::Uuid,
        nullable: false,
        texts,
    }
}

/// Rows named in the error, at most: enough to see what is wrong.
const NAMED: u64 = 20;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        let mut found = Vec::new();
        let mut total = 0;
        for column in &COLUMNS {
            let (rows, count) = unknown(db, column).await?;
            found.extend(rows);
            total += count;
        }
        if total == 0 {
            return Ok(());
        }
        found.truncate(NAMED as usize);
        Err(DbErr::Migration(format!(
            "{total} row(s) hold a state this release does not know, and it would \
             fail to read them; fix or delete them, then start again:\n  {}{}",
            found.join("\n  "),
            if total > found.len() as u64 {
                format!("\n  … and {} more", total - found.len() as u64)
            } else {
                String::new()
            }
        )))
    }

    async fn down(&self, _manager: &SchemaManager) -> Result<(), DbErr> {
        // Nothing was changed.
        Ok(())
    }
}

/// The rows of `column` holding a text it does not know (up to [`NAMED`],
/// each as `table.column of row <id>: `<text>``), and how many there are.
async fn unknown<C: ConnectionTrait>(db: &C, column: &Column) -> Result<(Vec<String>, u64), DbErr> {
    let known = Expr::col(Alias::new(column.column)).is_not_in(column.texts.iter().copied());
    let condition = if column.nullable {
        Cond::all()
            .add(Expr::col(Alias::new(column.column)).is_not_null())
            .add(known)
    } else {
        // A NULL in a column that may not hold one is not known either.
        Cond::any()
            .add(Expr::col(Alias::new(column.column)).is_null())
            .add(known)
    };
    let count = Query::select()
        .expr_as(Expr::cust("COUNT(*)"), Alias::new("n"))
        .from(Alias::new(column.table))
        .cond_where(condition.clone())
        .to_owned();
    let count: i64 = match db.query_one(&count).await? {
        Some(row) => row.try_get("", "n")?,
        None => 0,
    };
    if count == 0 {
        return Ok((Vec::new(), 0));
    }
    let rows = Query::select()
        .columns([Alias::new("id"), Alias::new(column.column)])
        .from(Alias::new(column.table))
        .cond_where(condition)
        .order_by(Alias::new("id"), Order::Asc)
        .limit(NAMED)
        .to_owned();
    let mut named = Vec::new();
    for row in db.query_all(&rows).await? {
        let id = match column.id {
            Id::Uuid => row.try_get::<sea_orm::prelude::Uuid>("", "id")?.to_string(),
            Id::Integer => row.try_get::<i64>("", "id")?.to_string(),
        };
        let text = match row.try_get::<Option<String>>("", column.column)? {
            Some(text) => format!("`{text}`"),
            None => "NULL".to_owned(),
        };
        named.push(format!(
            "{}.{} of row {id}: {text}",
            column.table, column.column
        ));
    }
    Ok((named, count as u64))
}
