//! `deploymentEvents`: a deployment's history, then its events live, until
//! the caller may no longer read it.

use std::collections::VecDeque;
use std::pin::Pin;

use async_graphql::{Context, ID, Subscription};
use futures_util::{Stream, StreamExt};
use uuid::Uuid;

use super::deployment::{DeploymentEvent, deployment_in};
use super::{ApiError, state};
use crate::deploy::{self as domain, Deployments};
use crate::events::Delivery;

/// How much history `deploymentEvents` replays before following live.
const REPLAY_LIMIT: u64 = 10_000;

#[derive(Default)]
pub struct DeploySubscription;

#[Subscription]
impl DeploySubscription {
    /// A deployment's history, then every new event as it happens. With
    /// `after` (an event's `id`), only the history past that event: how a
    /// client that lost its socket (a replica failing over) resumes with
    /// nothing missed and nothing twice.
    async fn deployment_events(
        &self,
        ctx: &Context<'_>,
        id: ID,
        after: Option<ID>,
    ) -> Result<impl Stream<Item = DeploymentEvent> + use<>, ApiError> {
        let after = replay_after(after.as_ref())?;
        let followed = deployment_in(ctx, &id, "id").await?;
        let wanted = followed.id;
        let revoked = access_revoked(ctx, followed.project_id)?;
        // Subscribe first, then read the history: an event stored in between
        // is in both, and the id filter drops the second copy.
        let deployments = state::<Deployments>(ctx)?;
        let live = deployments.events().subscribe();
        deployments.queries().get(wanted).await?;
        let history = deployments
            .queries()
            .history_after(wanted, after, REPLAY_LIMIT)
            .await?;
        let last = history.last().map_or(after, |e| e.id);
        let replay: Vec<DeploymentEvent> = history.iter().map(Into::into).collect();
        let follower = Follower {
            live: Box::pin(live),
            deployments: deployments.clone(),
            wanted,
            last,
            missed: VecDeque::new(),
        };
        let live = futures_util::stream::unfold(follower, |mut follower| async move {
            let event = follower.next().await?;
            Some((event, follower))
        });
        Ok(futures_util::stream::iter(replay)
            .chain(live)
            .take_until(revoked))
    }
}

/// The event id the history is replayed after: `after`, or 0 (all of it).
fn replay_after(after: Option<&ID>) -> Result<i64, ApiError> {
    match after {
        None => Ok(0),
        Some(given) => given
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| {
                ApiError::validation(format!(
                    "after: `{}` is not a deployment event's id",
                    given.as_str()
                ))
            }),
    }
}

/// One subscriber following a deployment live, past its history.
///
/// Events of one deployment are published in id order (the engine stores
/// and publishes each under the deployment's lock), so it delivers ids in
/// order: live ones past the history, and after a lag the missed ones read
/// back from the history.
struct Follower<S> {
    live: Pin<Box<S>>,
    /// To read back what a lag dropped.
    deployments: Deployments,
    /// The deployment followed.
    wanted: Uuid,
    /// The id of the last event delivered (or replayed): older ones are
    /// copies.
    last: i64,
    /// Events read back after a lag, still to deliver.
    missed: VecDeque<DeploymentEvent>,
}

impl<S: Stream<Item = Delivery<domain::DeploymentEvent>>> Follower<S> {
    /// The next event, or `None` once the bus closes.
    async fn next(&mut self) -> Option<DeploymentEvent> {
        loop {
            if let Some(event) = self.missed.pop_front() {
                return Some(event);
            }
            match self.live.next().await? {
                Delivery::Event(e) => {
                    if e.deployment_id == self.wanted && e.id > self.last {
                        self.last = e.id;
                        return Some(DeploymentEvent::from(e.as_ref()));
                    }
                }
                Delivery::Lagged(_) => self.read_missed().await,
            }
        }
    }

    /// Reads back from the history what a lag dropped.
    async fn read_missed(&mut self) {
        match self
            .deployments
            .queries()
            .history_after(self.wanted, self.last, REPLAY_LIMIT)
            .await
        {
            Ok(found) => {
                if let Some(e) = found.last() {
                    self.last = e.id;
                }
                self.missed.extend(found.iter().map(DeploymentEvent::from));
            }
            Err(e) => {
                tracing::warn!(deployment.id = %self.wanted, error = %e, "cannot read missed events");
            }
        }
    }
}

/// Resolves when the caller may no longer read `project` (their membership
/// or role changed, they were disabled or deleted), or when the server
/// stops: a subscription that takes it ends then.
fn access_revoked(
    ctx: &Context<'_>,
    project: Option<uuid::Uuid>,
) -> Result<impl std::future::Future<Output = ()> + use<>, ApiError> {
    let auth = state::<crate::auth::Auth>(ctx)?.clone();
    let who = super::principal(ctx)?.user.id;
    let mut changes = Box::pin(auth.events().subscribe());
    Ok(async move {
        loop {
            match changes.next().await {
                None => return,
                Some(Delivery::Event(e)) => match e.as_ref() {
                    crate::auth::AuthEvent::AccessChanged { user_id }
                        if user_id.is_none_or(|u| u == who) => {}
                    _ => continue,
                },
                // Missed events may have been changes: look again.
                Some(Delivery::Lagged(_)) => {}
            }
            let still = match auth.access_of(who).await {
                Ok(Some(access)) => access
                    .require(project, crate::auth::ProjectRole::Viewer, "it")
                    .is_ok(),
                Ok(None) => false,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read a subscriber's access; ending it");
                    false
                }
            };
            if !still {
                return;
            }
        }
    })
}
