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
    EventsMissed(EventsMissed),
}

impl From<Delivery> for ServerEvent {
    fn from(delivery: Delivery) -> Self {
        let event = match delivery {
            Delivery::Lagged(missed) => return ServerEvent::EventsMissed(EventsMissed { missed }),
            Delivery::Event(event) => event,
        };
        match &*event {
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
        }
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
        Ok(state::<EventBus>(ctx)?.subscribe().map(ServerEvent::from))
    }
}
