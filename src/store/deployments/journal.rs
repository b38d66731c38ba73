//! The journal (`journal`), the event history (`deployment_events`), and the
//! engine's group commit, which writes node changes, journal entries and
//! events for many calls in one transaction of a few set-based statements.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, Condition, ConnectionTrait, DatabaseConnection, DbErr,
    EntityTrait, FromQueryResult, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect, QueryTrait,
    Set, TransactionTrait,
};
use uuid::Uuid;

use super::nodes::{NodeChange, apply_all};
use crate::store::cluster::{Fence, check_fence, fenced_out};
use crate::store::entities::{deployment_event, journal};
use crate::store::states::EventState;

pub use deployment_event::Model as EventRow;
pub use journal::Model as JournalRow;

/// An event to store with a state change, in the same transaction.
#[derive(Clone, Debug)]
pub struct NewEvent {
    pub kind: String,
    pub node_key: Option<String>,
    pub state: Option<EventState>,
    pub message: String,
}

/// One of the engine's hot writes (see `deploy::writer`).
#[derive(Clone, Debug)]
pub enum GroupWrite {
    /// A deployment event on its own.
    Event { deployment: Uuid, event: NewEvent },
    /// The journal entry for the call about to be made, with the node's
    /// state and its event (none for an entry written ahead of its call,
    /// whose node changes with [`GroupWrite::Node`] once it calls). Older
    /// entries of the node go: the new call supersedes them (calls are
    /// idempotent per resource, and the new one settles whatever they left).
    Begin {
        call: CallStart,
        event: Option<NewEvent>,
    },
    /// A node's change with its event, the journal untouched.
    Node {
        deployment: Uuid,
        node: Uuid,
        change: NodeChange,
        event: NewEvent,
    },
    /// A call's result and the end of its entry, with its event.
    Finish {
        deployment: Uuid,
        node: Uuid,
        entry: Uuid,
        change: NodeChange,
        event: Option<NewEvent>,
    },
}

/// Rows one statement of [`super::commit_group`] takes: SQLite takes at most 32,766
/// parameters a statement, and an event has six.
const ROWS_PER_STATEMENT: usize = 1_000;

/// Nodes one update of [`super::commit_group`] changes (up to 12 parameters each).
const NODES_PER_STATEMENT: usize = 500;

/// [`super::commit_group`] off PostgreSQL, through the pool: the group's
/// statements in one transaction.
pub(super) async fn commit_group(
    db: &DatabaseConnection,
    writes: &[&GroupWrite],
    fence: Option<&Fence>,
) -> Result<Vec<Option<EventRow>>, DbErr> {
    let backend = db.get_database_backend();
    let group = Group::of(writes);
    let txn = db.begin().await?;
    if let Some(fence) = fence
        && !check_fence(&txn, fence).await?
    {
        return Err(fenced_out(fence));
    }
    for change in &group.changes {
        txn.execute_raw(change.build(backend)).await?;
    }
    let mut stored = Vec::with_capacity(group.answers.owners.len());
    for statement in &group.events {
        for row in txn.query_all_raw(backend.build(statement)).await? {
            stored.push(EventRow::from_query_result(&row, "")?);
        }
    }
    txn.commit().await?;
    group.answers(stored)
}

/// What [`super::commit_group`] writes, as statements: the changes (node updates,
/// journal deletes and inserts, in that order), then the event inserts, which
/// return the stored rows.
pub(in crate::store) struct Group {
    pub(in crate::store) changes: Vec<Change>,
    pub(in crate::store) events: Vec<sea_orm::sea_query::InsertStatement>,
    answers: Answers,
}

/// Which write each stored event answers.
pub(super) struct Answers {
    /// Which write each event belongs to, in the events' order.
    owners: Vec<usize>,
    writes: usize,
}

impl Answers {
    pub(super) fn of(gathered: Gathered, writes: usize) -> Answers {
        Answers {
            owners: gathered.owners,
            writes,
        }
    }

    /// The event each write stored, from the rows the inserts returned.
    fn events(self, mut stored: Vec<EventRow>) -> Result<Vec<Option<EventRow>>, DbErr> {
        // One statement numbers its rows in the order of its values; RETURNING
        // may list them in any order.
        stored.sort_unstable_by_key(|row| row.id);
        if stored.len() != self.owners.len() {
            return Err(DbErr::Custom(format!(
                "{} events stored of {}",
                stored.len(),
                self.owners.len()
            )));
        }
        let mut out = vec![None; self.writes];
        for (index, row) in self.owners.into_iter().zip(stored) {
            out[index] = Some(row);
        }
        Ok(out)
    }

    pub(super) fn of_rows(
        self,
        rows: &[sea_orm::QueryResult],
    ) -> Result<Vec<Option<EventRow>>, DbErr> {
        let stored = rows
            .iter()
            .map(|row| EventRow::from_query_result(row, ""))
            .collect::<Result<_, _>>()?;
        self.events(stored)
    }
}

/// One of a group's statements that change rows.
pub(in crate::store) enum Change {
    Update(sea_orm::sea_query::UpdateStatement),
    Delete(sea_orm::sea_query::DeleteStatement),
    Insert(sea_orm::sea_query::InsertStatement),
}

impl Change {
    pub(in crate::store) fn build(&self, backend: sea_orm::DbBackend) -> sea_orm::Statement {
        match self {
            Change::Update(statement) => backend.build(statement),
            Change::Delete(statement) => backend.build(statement),
            Change::Insert(statement) => backend.build(statement),
        }
    }
}

impl Group {
    pub(in crate::store) fn of(writes: &[&GroupWrite]) -> Group {
        let gathered = Gathered::of(writes);
        let mut changes = gathered.node_updates();
        changes.extend(gathered.entry_deletes());
        changes.extend(gathered.entry_inserts());
        Group {
            changes,
            events: gathered.event_inserts(),
            answers: Answers::of(gathered, writes.len()),
        }
    }

    /// The event each write stored, from the rows the inserts returned.
    pub(in crate::store) fn answers(
        self,
        stored: Vec<EventRow>,
    ) -> Result<Vec<Option<EventRow>>, DbErr> {
        self.answers.events(stored)
    }
}

/// What a group's writes come to, taken write by write, before it is
/// turned into statements.
#[derive(Default)]
pub(super) struct Gathered {
    /// Each node's changes merged, in the order its first change came.
    pub(super) changes: Vec<(Uuid, NodeChange)>,
    /// Where each node's merged change is in `changes`.
    changed: HashMap<Uuid, usize>,
    /// The entries the group ends.
    pub(super) ended: Vec<Uuid>,
    /// The nodes whose older entries a new call supersedes.
    pub(super) superseded: Vec<Uuid>,
    /// The new entries by node: the last one begun (an earlier one in the
    /// group is superseded too), unless the group also ends it.
    pub(super) entries: HashMap<Uuid, journal::ActiveModel>,
    pub(super) events: Vec<deployment_event::ActiveModel>,
    /// Which write each event belongs to, in the events' order.
    owners: Vec<usize>,
}

impl Gathered {
    pub(super) fn of(writes: &[&GroupWrite]) -> Gathered {
        let mut gathered = Gathered::default();
        for (index, write) in writes.iter().enumerate() {
            gathered.add(index, write);
        }
        gathered
    }

    /// Takes the `index`th write of the group.
    fn add(&mut self, index: usize, write: &GroupWrite) {
        let (deployment, event) = match write {
            GroupWrite::Event { deployment, event } => (*deployment, Some(event)),
            GroupWrite::Begin { call, event } => {
                if let Some(change) = &call.change {
                    self.merge(call.node_id, change);
                }
                self.superseded.push(call.node_id);
                let entry = journal::ActiveModel {
                    id: Set(call.entry),
                    deployment_id: Set(call.deployment_id),
                    node_id: Set(call.node_id),
                    provider_id: Set(call.provider_id),
                    intent: Set(call.intent.clone()),
                    created_at: Set(Utc::now()),
                };
                self.entries.insert(call.node_id, entry);
                (call.deployment_id, event.as_ref())
            }
            GroupWrite::Node {
                deployment,
                node,
                change,
                event,
            } => {
                self.merge(*node, change);
                (*deployment, Some(event))
            }
            GroupWrite::Finish {
                deployment,
                node,
                entry,
                change,
                event,
            } => {
                self.merge(*node, change);
                // An entry this group began ends before it is written.
                if self
                    .entries
                    .get(node)
                    .is_some_and(|begun| begun.id.try_as_ref() == Some(entry))
                {
                    self.entries.remove(node);
                }
                self.ended.push(*entry);
                (*deployment, event.as_ref())
            }
        };
        if let Some(event) = event {
            self.events.push(new_event(deployment, event.clone()));
            self.owners.push(index);
        }
    }

    fn merge(&mut self, node: Uuid, change: &NodeChange) {
        match self.changed.get(&node) {
            Some(&at) => self.changes[at].1.then(change.clone()),
            None => {
                self.changed.insert(node, self.changes.len());
                self.changes.push((node, change.clone()));
            }
        }
    }

    fn node_updates(&self) -> Vec<Change> {
        self.changes
            .chunks(NODES_PER_STATEMENT)
            .map(|chunk| Change::Update(apply_all(chunk).into_query()))
            .collect()
    }

    /// The entries that end or are superseded, gone.
    fn entry_deletes(&self) -> Vec<Change> {
        let mut statements = Vec::new();
        let (mut ended, mut superseded) = (
            self.ended.chunks(ROWS_PER_STATEMENT),
            self.superseded.chunks(ROWS_PER_STATEMENT),
        );
        loop {
            let (ids, nodes) = (ended.next(), superseded.next());
            if ids.is_none() && nodes.is_none() {
                break;
            }
            let mut gone = Condition::any();
            if let Some(ids) = ids {
                gone = gone.add(journal::Column::Id.is_in(ids.iter().copied()));
            }
            if let Some(nodes) = nodes {
                gone = gone.add(journal::Column::NodeId.is_in(nodes.iter().copied()));
            }
            statements.push(Change::Delete(
                journal::Entity::delete_many().filter(gone).into_query(),
            ));
        }
        statements
    }

    fn entry_inserts(&self) -> Vec<Change> {
        let entries: Vec<&journal::ActiveModel> = self.entries.values().collect();
        entries
            .chunks(ROWS_PER_STATEMENT)
            .map(|chunk| {
                let rows = chunk.iter().map(|&entry| entry.clone());
                Change::Insert(journal::Entity::insert_many(rows).into_query())
            })
            .collect()
    }

    /// The events' inserts, each returning the rows it stored.
    fn event_inserts(&self) -> Vec<sea_orm::sea_query::InsertStatement> {
        self.events
            .chunks(ROWS_PER_STATEMENT)
            .map(|chunk| {
                let mut insert =
                    deployment_event::Entity::insert_many(chunk.iter().cloned()).into_query();
                insert.returning_all();
                insert
            })
            .collect()
    }
}

fn new_event(deployment_id: Uuid, event: NewEvent) -> deployment_event::ActiveModel {
    deployment_event::ActiveModel {
        id: sea_orm::NotSet,
        deployment_id: Set(deployment_id),
        at: Set(Utc::now()),
        kind: Set(event.kind),
        node_key: Set(event.node_key),
        state: Set(event.state),
        message: Set(event.message),
    }
}

/// A call about to be made: its journal entry (`entry`) and the node's
/// change, if it changes with the entry.
#[derive(Clone, Debug)]
pub struct CallStart {
    pub entry: Uuid,
    pub deployment_id: Uuid,
    pub node_id: Uuid,
    pub provider_id: Uuid,
    pub intent: String,
    pub change: Option<NodeChange>,
}

/// Deletes a journal entry whose call needs no change to its node.
pub async fn drop_entry(db: &DatabaseConnection, entry: Uuid) -> Result<(), DbErr> {
    journal::Entity::delete_by_id(entry)
        .exec(db)
        .await
        .map(drop)
}

pub async fn journal(db: &DatabaseConnection) -> Result<Vec<JournalRow>, DbErr> {
    journal::Entity::find()
        .order_by_asc(journal::Column::CreatedAt)
        .all(db)
        .await
}

/// The entries of one deployment, oldest first.
pub async fn journal_of(
    db: &DatabaseConnection,
    deployment_id: Uuid,
) -> Result<Vec<JournalRow>, DbErr> {
    journal::Entity::find()
        .filter(journal::Column::DeploymentId.eq(deployment_id))
        .order_by_asc(journal::Column::CreatedAt)
        .all(db)
        .await
}

pub async fn journal_len(db: &DatabaseConnection) -> Result<u64, DbErr> {
    journal::Entity::find().count(db).await
}

// ---- events ----

pub async fn insert_event(
    db: &DatabaseConnection,
    deployment_id: Uuid,
    event: NewEvent,
) -> Result<EventRow, DbErr> {
    new_event(deployment_id, event).insert(db).await
}

/// Events of a deployment after `after` (an event id; 0 for all), oldest
/// first.
pub async fn events_of(
    db: &DatabaseConnection,
    deployment_id: Uuid,
    after: i64,
    limit: u64,
) -> Result<Vec<EventRow>, DbErr> {
    deployment_event::Entity::find()
        .filter(deployment_event::Column::DeploymentId.eq(deployment_id))
        .filter(deployment_event::Column::Id.gt(after))
        .order_by_asc(deployment_event::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// Every deployment's events after id `after` up to `upto`, oldest first
/// (at most `limit`): what a replica's feed reads when the leader says it
/// committed events up to `upto`.
pub async fn events_between(
    db: &DatabaseConnection,
    after: i64,
    upto: i64,
    limit: u64,
) -> Result<Vec<EventRow>, DbErr> {
    deployment_event::Entity::find()
        .filter(deployment_event::Column::Id.gt(after))
        .filter(deployment_event::Column::Id.lte(upto))
        .order_by_asc(deployment_event::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// The id of the last event stored (0 when there is none).
pub async fn last_event_id(db: &DatabaseConnection) -> Result<i64, DbErr> {
    let last = deployment_event::Entity::find()
        .select_only()
        .column(deployment_event::Column::Id)
        .order_by_desc(deployment_event::Column::Id)
        .into_tuple::<i64>()
        .one(db)
        .await?;
    Ok(last.unwrap_or(0))
}

/// The id of the first event at or after `since`, if any. Events are
/// written in time order, so a binary search over their ids finds it in
/// about 25 lookups by primary key, with no index on their time.
pub(super) async fn first_event_since(
    db: &DatabaseConnection,
    since: DateTime<Utc>,
) -> Result<Option<i64>, DbErr> {
    let edge = |from_id: i64| async move {
        deployment_event::Entity::find()
            .select_only()
            .columns([deployment_event::Column::Id, deployment_event::Column::At])
            .filter(deployment_event::Column::Id.gte(from_id))
            .order_by_asc(deployment_event::Column::Id)
            .into_tuple::<(i64, DateTime<Utc>)>()
            .one(db)
            .await
    };
    let last: Option<(i64, DateTime<Utc>)> = deployment_event::Entity::find()
        .select_only()
        .columns([deployment_event::Column::Id, deployment_event::Column::At])
        .order_by_desc(deployment_event::Column::Id)
        .into_tuple()
        .one(db)
        .await?;
    let Some((mut high, _)) = last.filter(|(_, at)| *at >= since) else {
        return Ok(None);
    };
    let Some((mut low, _)) = edge(i64::MIN).await? else {
        return Ok(None);
    };
    // The smallest id whose next event (itself, or the first after a gap)
    // is at or after `since`.
    while low < high {
        let mid = low + (high - low) / 2;
        match edge(mid).await? {
            Some((_, at)) if at >= since => high = mid,
            _ => low = mid + 1,
        }
    }
    Ok(edge(low).await?.map(|(id, _)| id))
}

/// Events deleted at a time by [`prune_events`]: a batch of 10,000 made a
/// writer wait up to 330 ms on SQLite (`cargo bench --bench history`).
const PRUNE_BATCH: u64 = 1_000;

/// Deletes the events older than `before`, [`PRUNE_BATCH`] at a time, each
/// batch a statement of its own (a writer waits for one batch at most),
/// resting as long as each batch took (pruning holds the store's write
/// lock at most half the time); how many went. The oldest events have the
/// lowest ids: the first event at or after `before` bounds them.
pub async fn prune_events(db: &DatabaseConnection, before: DateTime<Utc>) -> Result<u64, DbErr> {
    // The newest event seen bounds what may go: events written while this
    // runs are newer, and had an empty table's bound been "everything", the
    // first events of a deployment started at that moment went with it.
    let newest = last_event_id(db).await?;
    if newest == 0 {
        return Ok(0);
    }
    let edge = first_event_since(db, before).await?.unwrap_or(newest + 1);
    let mut deleted = 0;
    loop {
        let started = std::time::Instant::now();
        let last: Option<i64> = deployment_event::Entity::find()
            .select_only()
            .column(deployment_event::Column::Id)
            .filter(deployment_event::Column::Id.lt(edge))
            .order_by_asc(deployment_event::Column::Id)
            .offset(PRUNE_BATCH - 1)
            .into_tuple()
            .one(db)
            .await?;
        // The batch: up to its last id, or everything before the edge.
        let upto = last.unwrap_or(edge - 1);
        let done = deployment_event::Entity::delete_many()
            .filter(deployment_event::Column::Id.lte(upto))
            .exec(db)
            .await?;
        deleted += done.rows_affected;
        if last.is_none() || done.rows_affected == 0 {
            return Ok(deleted);
        }
        tokio::time::sleep(started.elapsed()).await;
    }
}
