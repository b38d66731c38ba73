//! `serverEvents`: the event bus, live, over the websocket.

use async_graphql::{Context, ID, SimpleObject, Subscription, Union};
use futures_util::{Stream, StreamExt};

use super::{ApiError, principal, state};
use crate::events::{Delivery, Event, EventBus};

#[derive(SimpleObject)]
pub struct UserLoggedIn {
    user_id: ID,
    username: String,
}

#[derive(SimpleObject)]
pub struct ApiTokenCreated {
    user_id: ID,
    token_id: ID,
    name: String,
}

#[derive(SimpleObject)]
pub struct ApiTokenRevoked {
    user_id: ID,
    token_id: ID,
}

/// A repository sync started, stored a batch, or ended.
#[derive(SimpleObject, Clone)]
pub struct RepositorySync {
    repository_id: ID,
    /// `SYNCING`, `ACTIVE` or `ERROR`.
    status: String,
    message: Option<String>,
    /// Inventory entries read so far (`null` once a sync failed).
    seen: Option<i64>,
    /// Elements stored for the repository (`null` once a sync failed).
    stored: Option<i64>,
}

/// The subscriber fell behind and this many events were dropped.
#[derive(SimpleObject)]
pub struct EventsMissed {
    missed: u64,
}

#[derive(Union)]
pub enum ServerEvent {
    UserLoggedIn(UserLoggedIn),
    ApiTokenCreated(ApiTokenCreated),
    ApiTokenRevoked(ApiTokenRevoked),
    RepositorySync(RepositorySync),
    ProviderStatusChanged(ProviderStatusChanged),
    EventsMissed(EventsMissed),
}

/// A provider's status (or status message) changed.
#[derive(SimpleObject)]
pub struct ProviderStatusChanged {
    provider_id: ID,
    status: String,
    message: Option<String>,
}

impl ServerEvent {
    /// The server-wide view of a delivery; provider log lines stay on
    /// `providerEvents`, where one asks for them.
    fn of(delivery: Delivery) -> Option<Self> {
        let event = match delivery {
            Delivery::Lagged(missed) => {
                return Some(ServerEvent::EventsMissed(EventsMissed { missed }));
            }
            Delivery::Event(event) => event,
        };
        Some(match &*event {
            Event::UserLoggedIn { user_id, username } => ServerEvent::UserLoggedIn(UserLoggedIn {
                user_id: ID(user_id.to_string()),
                username: username.clone(),
            }),
            Event::ApiTokenCreated {
                user_id,
                token_id,
                name,
            } => ServerEvent::ApiTokenCreated(ApiTokenCreated {
                user_id: ID(user_id.to_string()),
                token_id: ID(token_id.to_string()),
                name: name.clone(),
            }),
            Event::ApiTokenRevoked { user_id, token_id } => {
                ServerEvent::ApiTokenRevoked(ApiTokenRevoked {
                    user_id: ID(user_id.to_string()),
                    token_id: ID(token_id.to_string()),
                })
            }
            Event::RepositorySync {
                repository_id,
                status,
                message,
                seen,
                stored,
            } => ServerEvent::RepositorySync(RepositorySync {
                repository_id: ID(repository_id.to_string()),
                status: (*status).to_owned(),
                message: message.clone(),
                seen: (*seen >= 0).then_some(*seen),
                stored: (*stored >= 0).then_some(*stored),
            }),
            Event::ProviderStatus {
                provider_id,
                status,
                message,
            } => ServerEvent::ProviderStatusChanged(ProviderStatusChanged {
                provider_id: ID(provider_id.to_string()),
                status: status.as_str().to_owned(),
                message: message.clone(),
            }),
            Event::ProviderLog { .. } | Event::Deployment(_) => return None,
        })
    }
}

#[derive(Default)]
pub struct EventSubscription;

#[Subscription]
impl EventSubscription {
    /// Server-wide events (sign-ins, tokens made and revoked) as they happen.
    /// Secrets are never part of an event. Ends when the server shuts down.
    async fn server_events(
        &self,
        ctx: &Context<'_>,
    ) -> Result<impl Stream<Item = ServerEvent> + use<>, ApiError> {
        principal(ctx)?;
        Ok(state::<EventBus>(ctx)?
            .subscribe()
            .filter_map(|delivery| std::future::ready(ServerEvent::of(delivery))))
    }

    /// One repository's sync progress, live: an event when a sync starts, one
    /// per stored batch, and one when it ends.
    async fn repository_events(
        &self,
        ctx: &Context<'_>,
        id: ID,
    ) -> Result<impl Stream<Item = RepositorySync> + use<>, ApiError> {
        principal(ctx)?;
        let wanted = id.0.clone();
        Ok(state::<EventBus>(ctx)?
            .subscribe()
            .filter_map(move |delivery| {
                let event = match ServerEvent::of(delivery) {
                    Some(ServerEvent::RepositorySync(e)) if e.repository_id.0 == wanted => Some(e),
                    None => None,
                    Some(
                        ServerEvent::RepositorySync(_)
                        | ServerEvent::UserLoggedIn(_)
                        | ServerEvent::ApiTokenCreated(_)
                        | ServerEvent::ApiTokenRevoked(_)
                        | ServerEvent::ProviderStatusChanged(_)
                        | ServerEvent::EventsMissed(_),
                    ) => None,
                };
                std::future::ready(event)
            }))
    }
}
