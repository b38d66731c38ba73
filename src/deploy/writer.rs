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

use tokio::sync::{mpsc, oneshot};

use super::DeploymentEvent;
use super::queries::to_event;
use crate::events::Bus;
use crate::store::cluster::Fence;
use crate::store::deployments::{self as rows, EventRow};
use crate::store::direct::Direct;
use crate::store::{Db, DbErr};

/// Most sends one transaction takes (a send may hold several writes).
pub(super) const MAX_GROUP: usize = 256;

pub(super) use rows::GroupWrite as Write;

struct Job {
    write: Write,
    done: oneshot::Sender<Result<(), String>>,
}

/// The handle; the task ends when the last handle is dropped.
#[derive(Clone)]
pub(super) struct Writer {
    /// Jobs sent together commit in one transaction.
    jobs: mpsc::UnboundedSender<Vec<Job>>,
}

impl Writer {
    /// On SQLite the writer is a thread with a connection of its own
    /// ([`Direct`]): a commit is one hand-off to it and one back, where the
    /// pool costs a round trip to sqlx's thread per statement. On PostgreSQL
    /// (or if that connection cannot be opened) it is a task on the pool.
    ///
    /// With a `fence` (a replica leading, on PostgreSQL), each transaction
    /// first checks the leader lease: a leader that lost it writes nothing
    /// more, even before it has noticed.
    pub(super) fn spawn(db: Db, bus: Bus<DeploymentEvent>, fence: Option<Fence>) -> Self {
        let (jobs, queue) = mpsc::unbounded_channel();
        if let Some(fence) = fence {
            tokio::spawn(run(db, bus, queue, Some(fence)));
            return Self { jobs };
        }
        match Direct::open(&db) {
            Some(Ok(direct)) => {
                std::thread::Builder::new()
                    .name("corbel-writer".into())
                    .spawn(move || run_direct(direct, bus, queue))
                    .expect("the deployment writer's thread starts");
            }
            opened => {
                if let Some(Err(e)) = opened {
                    tracing::warn!(error = %e, "the deployment writer commits through the pool: its own SQLite connection did not open");
                }
                tokio::spawn(run(db, bus, queue, None));
            }
        }
        Self { jobs }
    }

    /// Commits `write` (with whatever else is queued) and publishes its
    /// event; answers once it is durable.
    pub(super) async fn write(&self, write: Write) -> Result<(), DbErr> {
        let committed = self.submit_all(vec![write]).pop();
        committed.expect("one answer per write").wait().await
    }

    /// Queues `writes` to commit in one transaction, in this order (a call's
    /// result with the entries of the dependents it let start: one commit
    /// for a chain's link, not two), and returns at once; each
    /// [`Committed::wait`] answers once its write is durable. Anything queued
    /// after them commits with them or later.
    pub(super) fn submit_all(&self, writes: Vec<Write>) -> Vec<Committed> {
        if writes.is_empty() {
            return Vec::new();
        }
        let (jobs, answers): (Vec<Job>, Vec<_>) = writes
            .into_iter()
            .map(|write| {
                let (done, answer) = oneshot::channel();
                (Job { write, done }, answer)
            })
            .unzip();
        let queued = self.jobs.send(jobs).is_ok();
        answers
            .into_iter()
            .map(|answer| Committed { answer, queued })
            .collect()
    }

    /// Queues `write` without waiting for it: it commits before anything
    /// queued after it (a failure is logged). For progress and log events,
    /// which the call's result, queued next, waits behind.
    pub(super) fn queue(&self, write: Write) {
        let (done, _) = oneshot::channel();
        if self.jobs.send(vec![Job { write, done }]).is_err() {
            tracing::error!("the deployment writer has stopped: an event is lost");
        }
    }
}

/// A write queued by [`Writer::submit_all`].
pub(super) struct Committed {
    answer: oneshot::Receiver<Result<(), String>>,
    queued: bool,
}

impl Committed {
    /// Whether the write has ended: its result if so (without waiting).
    pub(super) fn ended(&mut self) -> Option<Result<(), DbErr>> {
        if !self.queued {
            return Some(Err(writer_stopped()));
        }
        match self.answer.try_recv() {
            Ok(result) => Some(result.map_err(DbErr::Custom)),
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => Some(Err(writer_stopped())),
        }
    }

    /// Once the write is durable; its error if it failed.
    pub(super) async fn wait(self) -> Result<(), DbErr> {
        if !self.queued {
            return Err(writer_stopped());
        }
        self.answer
            .await
            .map_err(|_| writer_stopped())?
            .map_err(DbErr::Custom)
    }
}

fn writer_stopped() -> DbErr {
    DbErr::Custom("the deployment writer has stopped".into())
}

/// Answers a job; a failure nobody waits for is logged.
fn answer(job: Job, answer: Result<(), String>) {
    if let Err(Err(error)) = job.done.send(answer) {
        tracing::error!(%error, "cannot store a deployment write");
    }
}

async fn run(
    db: Db,
    bus: Bus<DeploymentEvent>,
    mut queue: mpsc::UnboundedReceiver<Vec<Job>>,
    fence: Option<Fence>,
) {
    let mut batches = Vec::with_capacity(MAX_GROUP);
    let mut group = Vec::with_capacity(MAX_GROUP);
    while queue.recv_many(&mut batches, MAX_GROUP).await > 0 {
        group.extend(batches.drain(..).flatten());
        let outcome = rows::commit_group(&db, &writes_of(&group), fence.as_ref()).await;
        if let Some(group) = settle(&bus, &mut group, outcome) {
            for job in group.drain(..) {
                let outcome = rows::commit_group(&db, &[&job.write], fence.as_ref()).await;
                settle_one(&bus, job, outcome);
            }
        }
    }
}

/// How long a group of writes nobody waits for (a call's progress and log
/// events) waits for one that somebody does (the call's result, which
/// usually follows at once), so that both take one commit, not two.
const LINGER: std::time::Duration = std::time::Duration::from_millis(2);

/// [`run`] on a connection of the writer's own, in its thread.
fn run_direct(
    mut direct: Direct,
    bus: Bus<DeploymentEvent>,
    mut queue: mpsc::UnboundedReceiver<Vec<Job>>,
) {
    // The thread's own clock for the linger, so that it keeps working while
    // the server's runtime shuts down (without one, nothing lingers).
    let clock = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .inspect_err(|e| tracing::warn!(error = %e, "the deployment writer commits events without lingering"))
        .ok();
    let mut group = Vec::with_capacity(MAX_GROUP);
    while let Some(first) = queue.blocking_recv() {
        take_queued(&mut group, first, &mut queue);
        // Only events nobody waits for: what follows them soon joins them.
        if let Some(clock) = &clock
            && group.iter().all(|job| job.done.is_closed())
            && let Ok(Some(more)) =
                clock.block_on(async { tokio::time::timeout(LINGER, queue.recv()).await })
        {
            take_queued(&mut group, more, &mut queue);
        }
        let outcome = direct.commit_group(&writes_of(&group));
        if let Some(group) = settle(&bus, &mut group, outcome) {
            for job in group.drain(..) {
                let outcome = direct.commit_group(&[&job.write]);
                settle_one(&bus, job, outcome);
            }
        }
    }
}

/// Adds `first` to the group, and whatever else is queued by now: it all goes
/// into the same transaction.
fn take_queued(
    group: &mut Vec<Job>,
    first: Vec<Job>,
    queue: &mut mpsc::UnboundedReceiver<Vec<Job>>,
) {
    group.extend(first);
    while group.len() < MAX_GROUP
        && let Ok(more) = queue.try_recv()
    {
        group.extend(more);
    }
}

fn writes_of(group: &[Job]) -> Vec<&Write> {
    group.iter().map(|job| &job.write).collect()
}

/// Answers a group's jobs after its commit; a group of several that failed
/// is handed back, to commit each alone: the one that failed says why, the
/// others commit.
fn settle<'a>(
    bus: &Bus<DeploymentEvent>,
    group: &'a mut Vec<Job>,
    outcome: Result<Vec<Option<EventRow>>, DbErr>,
) -> Option<&'a mut Vec<Job>> {
    metrics::histogram!("corbel_deploy_write_group_size").record(group.len() as f64);
    match outcome {
        Ok(events) => {
            for (job, event) in group.drain(..).zip(events) {
                publish(bus, event);
                answer(job, Ok(()));
            }
            None
        }
        Err(_) if group.len() > 1 => Some(group),
        Err(e) => {
            for job in group.drain(..) {
                answer(job, Err(e.to_string()));
            }
            None
        }
    }
}

/// Answers a job committed alone.
fn settle_one(bus: &Bus<DeploymentEvent>, job: Job, outcome: Result<Vec<Option<EventRow>>, DbErr>) {
    let outcome = match outcome {
        Ok(events) => {
            events.into_iter().for_each(|e| publish(bus, e));
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    };
    answer(job, outcome);
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
