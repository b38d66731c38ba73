//! The engine's hot writes — a call's journal entry before it is made, its
//! result after, and every deployment event — go through one writer task
//! that commits them in groups: whatever is queued when a transaction starts
//! goes into it (up to [`MAX_GROUP`]), so with many calls in flight one
//! commit serves many of them instead of one each, and writers no longer
//! queue for SQLite's one write lock.
//!
//! What is durable stays the same: [`Writer::write`] answers only once the
//! transaction holding the write has committed, so a provider call still
//! starts after its journal entry is stored. A write that fails (a row gone)
//! fails alone: the group is rolled back and its writes are committed again
//! one by one, each answering for itself.
//!
//! Events are published by the writer after their commit, in the order of
//! their ids: one writer commits them in order, so a reader that replays the
//! stored history and then follows the bus misses nothing and sees nothing
//! twice.

use sea_orm::{ConnectionTrait, DbErr, TransactionTrait};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::DeploymentEvent;
use super::queries::to_event;
use crate::events::Bus;
use crate::store::Db;
use crate::store::deployments::{self as rows, CallStart, EventRow, NewEvent, NodeChange};

/// Most writes one transaction takes.
pub(super) const MAX_GROUP: usize = 256;

/// One write.
pub(super) enum Write {
    /// A deployment event on its own.
    Event { deployment: Uuid, event: NewEvent },
    /// The journal entry and node change before a call, with its event.
    Begin { call: CallStart, event: NewEvent },
    /// A call's result and the end of its entry, with its event.
    Finish {
        deployment: Uuid,
        node: Uuid,
        entry: Uuid,
        change: NodeChange,
        event: Option<NewEvent>,
    },
}

struct Job {
    write: Write,
    done: oneshot::Sender<Result<(), String>>,
}

/// The handle; the task ends when the last handle is dropped.
#[derive(Clone)]
pub(super) struct Writer {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Writer {
    pub(super) fn spawn(db: Db, bus: Bus<DeploymentEvent>) -> Self {
        let (jobs, queue) = mpsc::unbounded_channel();
        tokio::spawn(run(db, bus, queue));
        Self { jobs }
    }

    /// Commits `write` (with whatever else is queued) and publishes its
    /// event; answers once it is durable.
    pub(super) async fn write(&self, write: Write) -> Result<(), DbErr> {
        let (done, answer) = oneshot::channel();
        self.jobs
            .send(Job { write, done })
            .map_err(|_| DbErr::Custom("the deployment writer has stopped".into()))?;
        answer
            .await
            .map_err(|_| DbErr::Custom("the deployment writer has stopped".into()))?
            .map_err(DbErr::Custom)
    }

    /// Queues `write` without waiting for it: it commits before anything
    /// queued after it (a failure is logged). For progress and log events,
    /// which the call's result, queued next, waits behind.
    pub(super) fn queue(&self, write: Write) {
        let (done, _) = oneshot::channel();
        if self.jobs.send(Job { write, done }).is_err() {
            tracing::error!("the deployment writer has stopped: an event is lost");
        }
    }
}

/// Answers a job; a failure nobody waits for is logged.
fn answer(job: Job, answer: Result<(), String>) {
    if let Err(Err(error)) = job.done.send(answer) {
        tracing::error!(%error, "cannot store a deployment write");
    }
}

async fn run(db: Db, bus: Bus<DeploymentEvent>, mut queue: mpsc::UnboundedReceiver<Job>) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    while queue.recv_many(&mut group, MAX_GROUP).await > 0 {
        let size = group.len();
        metrics::histogram!("corbel_deploy_write_group_size").record(size as f64);
        match commit(&db, &group).await {
            Ok(events) => {
                for (job, event) in group.drain(..).zip(events) {
                    publish(&bus, event);
                    answer(job, Ok(()));
                }
            }
            // Each alone: the one that failed says why, the others commit.
            Err(_) if size > 1 => {
                for job in group.drain(..) {
                    let outcome = match commit(&db, std::slice::from_ref(&job)).await {
                        Ok(events) => {
                            events.into_iter().for_each(|e| publish(&bus, e));
                            Ok(())
                        }
                        Err(e) => Err(e.to_string()),
                    };
                    answer(job, outcome);
                }
            }
            Err(e) => {
                for job in group.drain(..) {
                    answer(job, Err(e.to_string()));
                }
            }
        }
    }
}

/// Writes `jobs` in one transaction; the event each stored, in order.
async fn commit(db: &Db, jobs: &[Job]) -> Result<Vec<Option<EventRow>>, DbErr> {
    let txn = db.begin().await?;
    let mut events = Vec::with_capacity(jobs.len());
    for job in jobs {
        events.push(apply(&txn, &job.write).await?);
    }
    txn.commit().await?;
    Ok(events)
}

async fn apply(txn: &impl ConnectionTrait, write: &Write) -> Result<Option<EventRow>, DbErr> {
    match write {
        Write::Event { deployment, event } => {
            rows::insert_event_in(txn, *deployment, event.clone())
                .await
                .map(Some)
        }
        Write::Begin { call, event } => rows::begin_call_in(txn, call, event.clone())
            .await
            .map(Some),
        Write::Finish {
            deployment,
            node,
            entry,
            change,
            event,
        } => {
            rows::finish_call_in(
                txn,
                *deployment,
                *node,
                *entry,
                change.clone(),
                event.clone(),
            )
            .await
        }
    }
}

fn publish(bus: &Bus<DeploymentEvent>, row: Option<EventRow>) {
    let Some(row) = row else {
        return;
    };
    let id = row.deployment_id;
    match to_event(row) {
        Ok(event) => bus.publish(event),
        Err(e) => tracing::error!(deployment.id = %id, error = %e, "bad event row"),
    }
}
