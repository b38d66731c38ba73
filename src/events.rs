//! The event bus: areas publish what happened, GraphQL subscriptions follow it.
//!
//! One broadcast channel carries every event; each subscriber filters. A slow
//! subscriber that falls more than the channel's capacity behind loses the oldest
//! events and is told how many (`Lagged`), rather than slowing publishers.

use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Everything that can be published. Later areas add their variants here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A user signed in and got a session.
    UserLoggedIn { user_id: Uuid, username: String },
    /// An API token was made (its secret is never part of an event).
    ApiTokenCreated {
        user_id: Uuid,
        token_id: Uuid,
        name: String,
    },
    /// An API token was revoked.
    ApiTokenRevoked { user_id: Uuid, token_id: Uuid },
    /// A repository sync started, progressed (one per batch) or ended.
    RepositorySync {
        repository_id: Uuid,
        status: &'static str,
        message: Option<String>,
        /// Entries read so far; `-1` when unknown (a failed sync).
        seen: i64,
        /// Elements stored; `-1` when unknown.
        stored: i64,
    },
    /// A provider's status changed (or its status message, e.g. fetch progress).
    ProviderStatus {
        provider_id: Uuid,
        status: crate::provider::ProviderStatus,
        message: Option<String>,
    },
    /// A provider printed a line (build or run output, or Corbel's note on it).
    ProviderLog {
        provider_id: Uuid,
        line: crate::provider::LogLine,
    },
    /// A deployment's history grew by one entry (already stored).
    Deployment(Arc<crate::deploy::DeploymentEvent>),
}

/// What a subscriber receives.
#[derive(Clone, Debug)]
pub enum Delivery {
    Event(Arc<Event>),
    /// This many events were dropped because the subscriber fell behind.
    Lagged(u64),
}

#[derive(Clone)]
pub struct EventBus {
    sender: broadcast::Sender<Arc<Event>>,
    /// Cancelled at shutdown: every subscription stream then ends, so websocket
    /// clients get `complete` instead of a dropped connection.
    closed: CancellationToken,
}

impl EventBus {
    pub fn new(capacity: usize, closed: CancellationToken) -> Self {
        let (sender, _) = broadcast::channel(capacity);
        Self { sender, closed }
    }

    /// Publishes to whoever listens now; nobody listening is fine.
    pub fn publish(&self, event: Event) {
        let _ = self.sender.send(Arc::new(event));
    }

    /// Everything published from now on, until shutdown.
    pub fn subscribe(&self) -> impl Stream<Item = Delivery> + Send + 'static + use<> {
        let closed = self.closed.clone();
        BroadcastStream::new(self.sender.subscribe())
            .map(|item| match item {
                Ok(event) => Delivery::Event(event),
                Err(BroadcastStreamRecvError::Lagged(n)) => Delivery::Lagged(n),
            })
            .take_until(closed.cancelled_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn subscribers_get_events_and_end_at_shutdown() {
        let closed = CancellationToken::new();
        let bus = EventBus::new(8, closed.clone());
        let mut stream = Box::pin(bus.subscribe());
        let event = Event::ApiTokenRevoked {
            user_id: Uuid::nil(),
            token_id: Uuid::nil(),
        };
        bus.publish(event.clone());
        match stream.next().await {
            Some(Delivery::Event(got)) => assert_eq!(*got, event),
            other => panic!("expected the event, got {other:?}"),
        }
        closed.cancel();
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn a_slow_subscriber_is_told_it_lagged() {
        let bus = EventBus::new(2, CancellationToken::new());
        let mut stream = Box::pin(bus.subscribe());
        for _ in 0..5 {
            bus.publish(Event::ApiTokenRevoked {
                user_id: Uuid::nil(),
                token_id: Uuid::nil(),
            });
        }
        assert!(matches!(stream.next().await, Some(Delivery::Lagged(3))));
    }
}
