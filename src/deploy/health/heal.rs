//! Healing: a DOWN resource whose blueprint says `restart: on-failure` (not
//! after a clean exit) or `always` is restarted, with exponential backoff
//! from `delay` to `max_delay`, at most `attempts` times within `window`;
//! past that the healer gives up ("crash loop") and the node stays DOWN,
//! saying why. `restartResource` restarts one by hand.
//!
//! A restart is a run through the journal (phase `RESTART`): the node and the
//! dependents whose config reads its outputs (they must see its new outputs:
//! a new pid, a new container id) are marked, destroyed and deployed again,
//! in one transaction with the node's restart book. The book's
//! `next_restart_at` is the next look at the node: due, a node still DOWN (or
//! FAILED: the restart did not bring it back) is restarted again; one that
//! runs is healed and the look is cleared. So a restart a crash cut short is
//! resumed by recovery, not started twice: the healer waits while the
//! deployment is busy and then finds it running.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::super::blueprint::{Blueprint, Restart, RestartPolicy};
use super::super::template::{self, Reference};
use super::super::{DeployError, Deployment, Deployments, EventKind, NodeState, Phase, REPLACED};
use super::{ResourceHealth, health_of_row};
use crate::store::deployments::{self as rows, DeploymentChange, NodeRow};
use crate::store::health::{self as stored, HealthRow, Observed, RestartBook};

/// The longest the healer sleeps between looks (a booked restart it was
/// not told of, e.g. one a replica that led before booked).
const IDLE_LOOK: Duration = Duration::from_secs(60);
/// The shortest: a look still due (its deployment busy with a run) is
/// taken again this much later, not at once.
const MIN_WAIT: Duration = Duration::from_millis(250);
/// After the store failed.
const RETRY: Duration = Duration::from_secs(1);
/// A node a restart left FAILED (it did not come back) or still marked
/// `TO_DESTROY` (its run failed before it went): restarted again at its
/// next look.
const RESTARTED_BADLY: [NodeState; 2] = [NodeState::Failed, NodeState::ToDestroy];

/// A node's restart policy in its blueprint, unless it is `never`.
fn policy<'b>(blueprint: &'b Blueprint, node: &NodeRow) -> Option<&'b Restart> {
    blueprint
        .resource(&node.key)
        .map(|r| &r.restart)
        .filter(|r| r.policy != RestartPolicy::Never)
}

/// The healing part of [`Deployments`].
#[derive(Clone, Copy)]
pub(in crate::deploy) struct Healer<'a>(pub(in crate::deploy) &'a Deployments);

impl Healer<'_> {
    /// The node's restart policy, unless it is `never`.
    async fn policy(&self, node: &NodeRow) -> Result<Option<Restart>, DeployError> {
        let bp = self.0.queries().parsed(node.deployment_id).await?;
        Ok(policy(&bp, node).cloned())
    }

    /// Nodes are DOWN (each with its exit status), their DOWN stored: books
    /// the restart of each whose policy asks for one and has none booked
    /// yet. The books are read now, after the DOWN was stored: a look that
    /// cleared one before is seen, and one clearing it after refuses to (see
    /// [`stored::clear_look_unless_down`]). Each deployment's blueprint is
    /// read once.
    pub(super) async fn on_down_all(
        &self,
        downs: &[(&NodeRow, Option<i32>)],
    ) -> Result<(), DeployError> {
        if downs.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = downs.iter().map(|(node, _)| node.id).collect();
        let books: HashMap<Uuid, RestartBook> = stored::health_of_nodes(&self.0.inner.db, &ids)
            .await?
            .iter()
            .map(|row| (row.node_id, RestartBook::of(row)))
            .collect();
        let mut policies: HashMap<Uuid, Arc<Blueprint>> = HashMap::new();
        let mut booked = false;
        for (node, exit_code) in downs {
            let book = books.get(&node.id).cloned().unwrap_or_default();
            if book.gave_up || book.next_restart_at.is_some() {
                continue;
            }
            let blueprint = match policies.get(&node.deployment_id) {
                Some(blueprint) => blueprint.clone(),
                None => {
                    let blueprint = self.0.queries().parsed(node.deployment_id).await?;
                    policies.insert(node.deployment_id, blueprint.clone());
                    blueprint
                }
            };
            let Some(restart) = policy(&blueprint, node) else {
                continue;
            };
            if restart.policy == RestartPolicy::OnFailure && *exit_code == Some(0) {
                continue;
            }
            let mut book = book;
            let now = Utc::now();
            open_window(&mut book, restart, now);
            book.next_restart_at = Some(now + chrono_of(backoff(restart, book.window_restarts)));
            stored::set_restart_book(&self.0.inner.db, node.id, &book).await?;
            booked = true;
        }
        if booked {
            self.0.inner.health.heal_due.notify_one();
        }
        Ok(())
    }

    /// Restarts what is due, until the server stops (a leader singleton).
    /// Between looks it sleeps until the earliest booked one, or until a
    /// new one is booked: no polling while nothing is due.
    pub(in crate::deploy) async fn run(&self) {
        let state = &self.0.inner.health;
        loop {
            let next = match self.heal_due().await {
                Ok(next) => next,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot look for restarts that are due");
                    Some(Utc::now() + chrono_of(RETRY))
                }
            };
            let wait = next.map_or(Duration::MAX, |at| {
                (at - Utc::now())
                    .to_std()
                    .unwrap_or(Duration::ZERO)
                    .max(MIN_WAIT)
            });
            tokio::select! {
                () = state.heal_due.notified() => {}
                () = tokio::time::sleep(wait.min(IDLE_LOOK)) => {}
                () = self.0.inner.stopping.cancelled() => return,
            }
        }
    }

    /// Takes every look that is due; answers when the next one is.
    async fn heal_due(&self) -> Result<Option<DateTime<Utc>>, DeployError> {
        let db = &self.0.inner.db;
        for row in stored::restarts_due(db, Utc::now()).await? {
            if self.0.inner.stopping.is_cancelled() {
                break;
            }
            if let Err(e) = self.heal_one(row).await {
                tracing::warn!(error = %e, "cannot restart a resource");
            }
        }
        Ok(stored::next_restart(db).await?)
    }

    /// One due look at a node: heal it, restart it, or give up.
    async fn heal_one(&self, row: HealthRow) -> Result<(), DeployError> {
        let db = &self.0.inner.db;
        let Some(node) = rows::find_node(db, row.node_id).await? else {
            return Ok(());
        };
        if self.0.runs().is_busy(node.deployment_id) {
            return Ok(()); // a run (maybe this very restart) is under way
        }
        let mut book = RestartBook::of(&row);
        let down = health_of_row(&node, Some(&row)).health == ResourceHealth::Down;
        // FAILED or still marked: a restart that did not bring it back.
        let needs =
            RESTARTED_BADLY.contains(&node.state) || (node.state == NodeState::Complete && down);
        let policy = self.policy(&node).await?;
        let (true, Some(restart)) = (needs, policy) else {
            // It runs again, or is not ours to heal: no more looks, unless
            // it went DOWN since it was read (then the look stays due).
            stored::clear_look_unless_down(db, node.id, node.updated_at).await?;
            return Ok(());
        };
        let now = Utc::now();
        open_window(&mut book, &restart, now);
        if book.window_restarts >= restart.attempts as i32 {
            return self.give_up(&node, &mut book, &restart).await;
        }
        book.restarts += 1;
        book.window_restarts += 1;
        book.next_restart_at = Some(now + chrono_of(backoff(&restart, book.window_restarts)));
        let why = row.reason.clone().unwrap_or_else(|| "down".to_owned());
        let message = format!(
            "restarting {} (restart {} of {} in {}): {why}",
            super::super::node_label(&node),
            book.window_restarts,
            restart.attempts,
            crate::text::duration_words(restart.window)
        );
        match self.start(&node, &book, message).await {
            Err(DeployError::Conflict(_)) => Ok(()), // busy or settling: next look
            other => other.map(|_| ()),
        }
    }

    /// Stops healing a crash loop: the node stays DOWN, saying why.
    async fn give_up(
        &self,
        node: &NodeRow,
        book: &mut RestartBook,
        restart: &Restart,
    ) -> Result<(), DeployError> {
        book.gave_up = true;
        book.next_restart_at = None;
        stored::set_restart_book(&self.0.inner.db, node.id, book).await?;
        let reason = format!(
            "crash loop: {} restarts in {}",
            book.window_restarts,
            crate::text::duration_words(restart.window)
        );
        if node.state == NodeState::Complete {
            self.0
                .health()
                .record(node, ResourceHealth::Down, Some(&reason), Utc::now())
                .await?;
        } else {
            self.0
                .runs()
                .record(
                    node.deployment_id,
                    EventKind::Health,
                    Some(&super::super::node_label(node)),
                    Some(ResourceHealth::Down.into()),
                    format!("DOWN: {reason}"),
                )
                .await;
        }
        Ok(())
    }

    /// Restarts one node by hand (`restartResource`), whatever its health.
    pub(in crate::deploy) async fn restart_by_hand(
        &self,
        deployment: Uuid,
        key: &str,
        replica: i32,
        by: Option<&str>,
    ) -> Result<Deployment, DeployError> {
        let db = &self.0.inner.db;
        let node = rows::nodes_of(db, deployment)
            .await?
            .into_iter()
            .find(|n| n.key == key && n.replica == replica)
            .ok_or_else(|| {
                DeployError::NotFound(format!(
                    "the deployment has no resource `{key}` replica {replica}"
                ))
            })?;
        let state = node.state;
        if !REPLACED.contains(&state) && !RESTARTED_BADLY.contains(&state) {
            return Err(DeployError::Conflict(format!(
                "resource `{key}` replica {replica} is {}: only a deployed or failed resource can be restarted",
                state.as_str()
            )));
        }
        let row = stored::health_of_node(db, node.id).await?;
        if row.is_none() {
            // A row to keep its restart book in.
            let health = health_of_row(&node, None);
            let now = Observed {
                node_id: node.id,
                deployment_id: deployment,
                health: health.health.as_str(),
                reason: health.reason.as_deref(),
                at: Utc::now(),
                node_updated_at: node.updated_at,
                drift: None,
            };
            let row = stored::observed_row(now, None).expect("a first row is always stored");
            stored::put_observed(db, vec![row]).await?;
        }
        let mut book = row.as_ref().map(RestartBook::of).unwrap_or_default();
        book.restarts += 1;
        book.gave_up = false;
        let who = by.map(|b| format!(" by {b}")).unwrap_or_default();
        let message = format!("restarting {}{who}", super::super::node_label(&node));
        self.start(&node, &book, message).await?;
        self.0.queries().get(deployment).await
    }

    /// Marks the node and the dependents reading its outputs, with its book,
    /// in one transaction, and starts the run.
    async fn start(
        &self,
        node: &NodeRow,
        book: &RestartBook,
        message: String,
    ) -> Result<(), DeployError> {
        let id = node.deployment_id;
        let deployment = self.0.queries().get(id).await?;
        // Only a settled deployment is restarted: one IN_PROGRESS has a run
        // under way, or one a crash cut short that recovery is to resume
        // (it holds no lock here until it is resumed).
        if !matches!(
            deployment.state,
            super::super::DeploymentState::Complete | super::super::DeploymentState::Failed
        ) {
            return Err(DeployError::Conflict(format!(
                "deployment `{}` is {}",
                deployment.name,
                deployment.state.as_str()
            )));
        }
        let lock = self
            .0
            .runs()
            .lock_for_request(id, deployment.state, "restart")
            .await?;
        let bp = self.0.queries().parsed(id).await?;
        let dependents: Vec<String> = readers_of(&bp, &node.key).into_iter().collect();
        stored::begin_restart(
            &self.0.inner.db,
            id,
            stored::RestartStart {
                deployment: DeploymentChange {
                    state: super::super::DeploymentState::InProgress,
                    phase: Some(Phase::Restart.as_str()),
                    error: None,
                    operation_id: Some(Uuid::now_v7()),
                },
                restarted: &[node.id],
                dependents: &dependents,
                holding: &REPLACED,
                to_destroy: NodeState::ToDestroy,
                book: (node.id, book),
            },
        )
        .await?;
        let message = match dependents.is_empty() {
            true => message,
            false => format!(
                "{message}; with {}, which read its outputs",
                dependents.join(", ")
            ),
        };
        self.0
            .runs()
            .record(
                id,
                EventKind::State,
                Some(&super::super::node_label(node)),
                Some(super::super::DeploymentState::InProgress.into()),
                message,
            )
            .await;
        self.0.runs().spawn_deploy(lock);
        Ok(())
    }
}

/// The keys whose config reads `key`'s outputs, directly or through another
/// such key (each is replaced too, so its readers must follow). Each
/// resource's templates are read once.
fn readers_of(bp: &Blueprint, key: &str) -> BTreeSet<String> {
    let mut readers: HashMap<&str, Vec<&str>> = HashMap::new();
    for resource in &bp.resources {
        let read: BTreeSet<String> = template::strings(&resource.config, "")
            .into_iter()
            .flat_map(|(_, text)| template::references(text).unwrap_or_default())
            .filter_map(|r| match r {
                Reference::Output { resource, .. } => Some(resource),
                Reference::Variable(_) => None,
            })
            .collect();
        for source in read {
            if let Some(source) = bp.resource(&source) {
                readers
                    .entry(source.key.as_str())
                    .or_default()
                    .push(resource.key.as_str());
            }
        }
    }
    let mut found = BTreeSet::new();
    let mut frontier = vec![key];
    while let Some(source) = frontier.pop() {
        for &reader in readers.get(source).into_iter().flatten() {
            if reader != key && found.insert(reader.to_owned()) {
                frontier.push(reader);
            }
        }
    }
    found
}

/// Opens a new restart window when the last one has run out.
fn open_window(book: &mut RestartBook, restart: &Restart, now: DateTime<Utc>) {
    let expired = book
        .window_from
        .is_none_or(|from| now - from > chrono_of(restart.window));
    if expired {
        book.window_from = Some(now);
        book.window_restarts = 0;
    }
}

/// `delay`, doubled for each restart already made in the window, at most
/// `max_delay`.
fn backoff(restart: &Restart, made: i32) -> Duration {
    let factor = 2u32.saturating_pow(made.clamp(0, 30) as u32);
    restart
        .delay
        .checked_mul(factor)
        .unwrap_or(restart.max_delay)
        .min(restart.max_delay)
}

fn chrono_of(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restart() -> Restart {
        Restart {
            policy: RestartPolicy::OnFailure,
            attempts: 5,
            window: Duration::from_secs(600),
            delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(5),
        }
    }

    #[test]
    fn backoff_doubles_from_the_delay_up_to_the_most() {
        let r = restart();
        let waits: Vec<u64> = (0..6).map(|n| backoff(&r, n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 5, 5, 5]);
        assert_eq!(backoff(&r, i32::MAX), Duration::from_secs(5));
    }

    #[test]
    fn a_window_opens_again_once_it_has_run_out() {
        let r = restart();
        let now = Utc::now();
        let mut book = RestartBook {
            window_from: Some(now - chrono::Duration::seconds(601)),
            window_restarts: 5,
            ..Default::default()
        };
        open_window(&mut book, &r, now);
        assert_eq!((book.window_from, book.window_restarts), (Some(now), 0));
        let mut fresh = RestartBook {
            window_from: Some(now - chrono::Duration::seconds(10)),
            window_restarts: 3,
            ..Default::default()
        };
        open_window(&mut fresh, &r, now);
        assert_eq!(fresh.window_restarts, 3, "the window still runs");
    }

    #[test]
    fn readers_are_the_keys_whose_config_reads_the_outputs_through_any_chain() {
        let bp = crate::deploy::blueprint::parse(
            "version: 1\nresources:\n  db:\n    type: t\n  api:\n    type: t\n    depends_on: [db]\n    config: {db_pid: '{{ resources.db.outputs.pid }}'}\n  web:\n    type: t\n    depends_on: [api]\n    config: {api: 'http://{{ resources.api.outputs.host }}'}\n  side:\n    type: t\n    depends_on: [db]\n",
        )
        .expect("the blueprint parses");
        let readers: Vec<String> = readers_of(&bp, "db").into_iter().collect();
        assert_eq!(readers, ["api", "web"], "side only waits for db: it stays");
        assert!(readers_of(&bp, "web").is_empty());
    }

    #[test]
    fn durations_read_as_a_user_writes_them() {
        assert_eq!(crate::text::duration_words(Duration::from_secs(600)), "10m");
        assert_eq!(crate::text::duration_words(Duration::from_secs(3600)), "1h");
        assert_eq!(crate::text::duration_words(Duration::from_secs(90)), "90s");
        assert_eq!(
            crate::text::duration_words(Duration::from_millis(500)),
            "500ms"
        );
    }
}
