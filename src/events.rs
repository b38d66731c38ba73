//! Event buses: an area publishes what happened on its own bus, GraphQL
//! subscriptions follow it.
//!
//! A leaf: the bus is generic, and each area owns its event type
//! (`auth::AuthEvent`, `repository::SyncEvent`, `provider::ProviderEvent`,
//! `deploy::DeploymentEvent`). One broadcast channel per area; each subscriber
//! filters. A slow subscriber that falls more than the channel's capacity
//! behind loses the oldest events and is told how many (`Lagged`), rather than
//! slowing publishers.

use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_util::sync::CancellationToken;

/// What a subscriber receives.
#[derive(Clone, Debug)]
pub enum Delivery<E> {
    Event(Arc<E>),
    /// This many events were dropped because the subscriber fell behind.
    Lagged(u64),
}

/// Where a bus also sends what is published on it (other replicas).
pub type Outbound<E> = Arc<dyn Fn(&E) + Send + Sync>;

pub struct Bus<E> {
    sender: broadcast::Sender<Arc<E>>,
    /// Cancelled at shutdown: every subscription stream then ends, so websocket
    /// clients get `complete` instead of a dropped connection.
    closed: CancellationToken,
    outbound: Option<Outbound<E>>,
}

impl<E> Clone for Bus<E> {
    fn clone(&self) -> Self {
        Self {
            sender: self.sender.clone(),
            closed: self.closed.clone(),
            outbound: self.outbound.clone(),
        }
    }
}

impl<E: Send + Sync + 'static> Bus<E> {
    pub fn new(capacity: usize, closed: CancellationToken) -> Self {
        let (sender, _) = broadcast::channel(capacity);
        Self {
            sender,
            closed,
            outbound: None,
        }
    }

    /// As [`Self::new`]; everything published is also given to `outbound`.
    pub fn with_outbound(
        capacity: usize,
        closed: CancellationToken,
        outbound: Option<Outbound<E>>,
    ) -> Self {
        Self {
            outbound,
            ..Self::new(capacity, closed)
        }
    }

    /// Publishes to whoever listens now; nobody listening is fine.
    pub fn publish(&self, event: E) {
        if let Some(outbound) = &self.outbound {
            outbound(&event);
        }
        let _ = self.sender.send(Arc::new(event));
    }

    /// Everything published from now on, until shutdown.
    pub fn subscribe(&self) -> impl Stream<Item = Delivery<E>> + Send + 'static + use<E> {
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
        let bus = Bus::new(8, closed.clone());
        let mut stream = Box::pin(bus.subscribe());
        bus.publish("hello");
        match stream.next().await {
            Some(Delivery::Event(got)) => assert_eq!(*got, "hello"),
            other => panic!("expected the event, got {other:?}"),
        }
        closed.cancel();
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn a_slow_subscriber_is_told_it_lagged() {
        let bus = Bus::new(2, CancellationToken::new());
        let mut stream = Box::pin(bus.subscribe());
        for _ in 0..5 {
            bus.publish(7_u32);
        }
        assert!(matches!(stream.next().await, Some(Delivery::Lagged(3))));
    }
}
