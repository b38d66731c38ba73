//! Events across replicas (`--cluster`): what the leader publishes reaches
//! every replica's own buses, so a standby serves subscriptions itself and
//! a client of a surviving replica sees no close, no gap and no duplicate
//! when the leader dies.
//!
//! The leader sends each event as a PostgreSQL notification ([`Notifier`]):
//! the deployment writer's group transactions say, at their commit, up to
//! which id they stored events (`store::notify::deployment_events`); the
//! other areas' buses send their events themselves ([`Message`] as JSON).
//! Every replica listens ([`Feed`]): deployment events are read from the
//! history past the last one it published, so whatever the notifications
//! (a lost connection, a leader that died after its commit), each event id
//! reaches its bus once, in order; the other events are published as they
//! come (what is sent while a replica's connection is down is not heard:
//! they are states, and the next one says where things stand).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::audit::Entry;
use crate::auth::AuthEvent;
use crate::deploy::{self, DeploymentEvent};
use crate::events::{Bus, Outbound};
use crate::provider::ProviderEvent;
use crate::repository::SyncEvent;
use crate::store::Db;
use crate::store::notify::{self, Listener, MAX_PAYLOAD};

/// Each bus of the feed holds this many events.
const CAPACITY: usize = 1024;
/// Deployment events read from the history at a time.
const READ_BATCH: u64 = 1000;
/// Notifications waiting to be sent, past which an event is dropped (with a
/// warning) rather than holding the leader's publishers.
const SEND_QUEUE: usize = 4096;
/// How long a replica waits before listening again after a failure.
const RECONNECT: Duration = Duration::from_secs(1);

/// One notification, as JSON (externally tagged: `{"auth": …}`).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Message {
    /// Deployment events were committed up to this id.
    DeploymentEvents(i64),
    Auth(AuthEvent),
    Provider(ProviderEvent),
    Sync(SyncEvent),
    Audit(Entry),
}

/// A replica's buses, fed from the leader's notifications.
#[derive(Clone)]
pub struct Feed {
    pub auth: Bus<AuthEvent>,
    pub providers: Bus<ProviderEvent>,
    pub deployments: Bus<DeploymentEvent>,
    pub repositories: Bus<SyncEvent>,
    pub audit: Bus<Entry>,
}

impl Feed {
    /// Listens until `stop` (which also ends the buses' subscriptions).
    pub async fn start(db: Db, stop: CancellationToken) -> anyhow::Result<Feed> {
        let feed = Feed {
            auth: Bus::new(CAPACITY, stop.clone()),
            providers: Bus::new(CAPACITY, stop.clone()),
            deployments: Bus::new(CAPACITY, stop.clone()),
            repositories: Bus::new(CAPACITY, stop.clone()),
            audit: Bus::new(CAPACITY, stop.clone()),
        };
        // Events stored before this replica listened are history.
        let last = deploy::last_event_id(&db).await?;
        tokio::spawn(listen(db, feed.clone(), last, stop));
        Ok(feed)
    }

    fn publish(&self, message: Message) {
        match message {
            Message::Auth(event) => self.auth.publish(event),
            Message::Provider(event) => self.providers.publish(event),
            Message::Sync(event) => self.repositories.publish(event),
            Message::Audit(event) => self.audit.publish(event),
            Message::DeploymentEvents(_) => {}
        }
    }
}

/// Listens until `stop`; after a failure, listens again and first reads the
/// deployment events committed meanwhile.
async fn listen(db: Db, feed: Feed, mut last: i64, stop: CancellationToken) {
    loop {
        let connected = tokio::select! {
            connected = Listener::connect(&db) => connected,
            () = stop.cancelled() => return,
        };
        match connected {
            Ok(mut listener) => {
                catch_up(&db, &feed, &mut last, i64::MAX).await;
                loop {
                    let heard = tokio::select! {
                        heard = listener.recv() => heard,
                        () = stop.cancelled() => return,
                    };
                    match heard {
                        Ok(Some(payload)) => {
                            heard_from_leader(&db, &feed, &mut last, &payload).await
                        }
                        // Connected again at the next call.
                        Ok(None) => catch_up(&db, &feed, &mut last, i64::MAX).await,
                        Err(e) => {
                            tracing::warn!(error = %e, "the replicas' feed broke: listening again");
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot listen for the leader's events"),
        }
        tokio::select! {
            () = tokio::time::sleep(RECONNECT) => {}
            () = stop.cancelled() => return,
        }
    }
}

async fn heard_from_leader(db: &Db, feed: &Feed, last: &mut i64, payload: &str) {
    match serde_json::from_str::<Message>(payload) {
        Ok(Message::DeploymentEvents(upto)) => catch_up(db, feed, last, upto).await,
        Ok(message) => feed.publish(message),
        Err(e) => tracing::warn!(error = %e, "an unreadable notification on the replicas' feed"),
    }
}

/// Publishes the deployment events stored after `last` up to `upto`, in
/// order, and moves `last` past them.
async fn catch_up(db: &Db, feed: &Feed, last: &mut i64, upto: i64) {
    while *last < upto {
        let events = match deploy::events_between(db, *last, upto, READ_BATCH).await {
            Ok(events) => events,
            Err(e) => {
                // Read again at the next notification or reconnection.
                tracing::warn!(error = %e, "cannot read the deployment events the leader committed");
                return;
            }
        };
        let Some(newest) = events.last().map(|event| event.id) else {
            return;
        };
        for event in events {
            feed.deployments.publish(event);
        }
        *last = newest;
    }
}

/// The leader's side: notifications sent one after another on the pool,
/// in the order they were published.
#[derive(Clone)]
pub(super) struct Notifier {
    queue: mpsc::Sender<String>,
}

impl Notifier {
    pub fn spawn(db: Db, stop: CancellationToken) -> Notifier {
        let (queue, mut sending) = mpsc::channel::<String>(SEND_QUEUE);
        tokio::spawn(async move {
            loop {
                let payload = tokio::select! {
                    Some(payload) = sending.recv() => payload,
                    () = stop.cancelled() => return,
                    else => return,
                };
                if let Err(e) = notify::notify(&db, &payload).await {
                    tracing::warn!(error = %e, "cannot tell the other replicas of an event");
                }
            }
        });
        Notifier { queue }
    }

    /// What a bus gives the other replicas: each event, as `wrap` makes it
    /// a [`Message`].
    pub fn outbound<E: Clone + 'static>(&self, wrap: fn(E) -> Message) -> Outbound<E> {
        let queue = self.queue.clone();
        std::sync::Arc::new(move |event: &E| {
            let Some(payload) = payload_of(wrap(event.clone())) else {
                return;
            };
            if queue.try_send(payload).is_err() {
                tracing::warn!("the replicas' feed is behind: an event was not sent to them");
            }
        })
    }
}

/// `message` as JSON within PostgreSQL's limit: a provider's long output
/// line is cut, an audit entry's long arguments left out; anything else too
/// long is not sent.
fn payload_of(message: Message) -> Option<String> {
    let payload = serde_json::to_string(&message).ok()?;
    if payload.len() <= MAX_PAYLOAD {
        return Some(payload);
    }
    let cut = match message {
        Message::Provider(ProviderEvent::Log {
            provider_id,
            mut line,
        }) => {
            line.line = crate::text::bounded(line.line, MAX_PAYLOAD / 2, " …");
            Message::Provider(ProviderEvent::Log { provider_id, line })
        }
        Message::Audit(mut entry) => {
            entry.arguments = serde_json::Map::from_iter([(
                "cut".to_owned(),
                serde_json::Value::from("too long to send to other replicas: see `auditLog`"),
            )]);
            Message::Audit(entry)
        }
        _ => {
            tracing::warn!(
                bytes = payload.len(),
                "an event too long to send to the other replicas"
            );
            return None;
        }
    };
    serde_json::to_string(&cut)
        .ok()
        .filter(|payload| payload.len() <= MAX_PAYLOAD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_line_is_cut_to_fit_a_notification() {
        let line = crate::provider::LogLine {
            at: chrono::Utc::now(),
            stream: crate::provider::LogStream::Stdout,
            line: "x".repeat(20_000),
        };
        let message = Message::Provider(ProviderEvent::Log {
            provider_id: uuid::Uuid::nil(),
            line,
        });
        let payload = payload_of(message).expect("sent, cut");
        assert!(payload.len() <= MAX_PAYLOAD, "{} bytes", payload.len());
        match serde_json::from_str::<Message>(&payload) {
            Ok(Message::Provider(ProviderEvent::Log { line, .. })) => {
                assert!(line.line.ends_with(" …"));
                assert!(line.line.len() > 3000);
            }
            _ => panic!("not read back as a provider's line: {payload}"),
        }
        let deployment = notify::deployment_events(42);
        assert!(matches!(
            serde_json::from_str::<Message>(&deployment),
            Ok(Message::DeploymentEvents(42))
        ));
    }
}
