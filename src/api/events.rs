//! `serverEvents` and `repositoryEvents`: the areas' event buses, live, over
//! the websocket.

use std::future::ready;

use async_graphql::{Context, ID, SimpleObject, Subscription, Union};
use futures_util::{Stream, StreamExt};
use uuid::Uuid;

use super::{ApiError, parse_id, principal, state};
use crate::auth::{Auth, AuthEvent};
use crate::deploy::{Deployments, EventKind};
use crate::events::Delivery;
use crate::provider::{ProviderEvent, Providers};
use crate::repository::{Repositories, SyncEvent};

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
    /// `SYNCING`, `ACTIVE` or `ERROR` (or `NEW`, in the first event of
    /// `repositoryEvents`, for a repository that has not synced yet).
    status: String,
    message: Option<String>,
    /// Inventory entries read so far (`null` once a sync failed).
    seen: Option<i64>,
    /// Elements stored for the repository (`null` once a sync failed).
    stored: Option<i64>,
    /// Invalid elements found so far; at the end, recorded for the
    /// repository (`null` once a sync failed).
    invalid: Option<i64>,
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
    ProviderCreated(ProviderCreated),
    ProviderDeleted(ProviderDeleted),
    DeploymentChanged(DeploymentChanged),
    DeploymentHealthChanged(DeploymentHealthChanged),
    EventsMissed(EventsMissed),
}

/// A deployment's rolled-up health changed (a deployment-level HEALTH event
/// of its history); its nodes' own HEALTH events are in `deploymentEvents`.
#[derive(SimpleObject)]
pub struct DeploymentHealthChanged {
    deployment_id: ID,
    health: super::deploy_enums::ResourceHealth,
    message: String,
}

/// A deployment's state changed (or its lease moved): a STATE event of its
/// history. Follow one deployment's every event with `deploymentEvents`.
#[derive(SimpleObject)]
pub struct DeploymentChanged {
    deployment_id: ID,
    /// The deployment's state, when this event changed it.
    state: Option<String>,
    message: String,
}

/// A provider was created (it is `UNLOADED` until it loads).
#[derive(SimpleObject)]
pub struct ProviderCreated {
    provider_id: ID,
    name: String,
}

/// A provider was deleted.
#[derive(SimpleObject)]
pub struct ProviderDeleted {
    provider_id: ID,
    name: String,
}

/// A provider's status (or status message) changed.
#[derive(SimpleObject)]
pub struct ProviderStatusChanged {
    provider_id: ID,
    status: String,
    message: Option<String>,
}

/// What `serverEvents` shows of an auth event (access changes it does not).
fn auth_view(event: &AuthEvent) -> Option<ServerEvent> {
    Some(match event {
        AuthEvent::UserLoggedIn { user_id, username } => ServerEvent::UserLoggedIn(UserLoggedIn {
            user_id: ID(user_id.to_string()),
            username: username.clone(),
        }),
        AuthEvent::ApiTokenCreated {
            user_id,
            token_id,
            name,
        } => ServerEvent::ApiTokenCreated(ApiTokenCreated {
            user_id: ID(user_id.to_string()),
            token_id: ID(token_id.to_string()),
            name: name.clone(),
        }),
        AuthEvent::ApiTokenRevoked { user_id, token_id } => {
            ServerEvent::ApiTokenRevoked(ApiTokenRevoked {
                user_id: ID(user_id.to_string()),
                token_id: ID(token_id.to_string()),
            })
        }
        AuthEvent::AccessChanged { .. } | AuthEvent::SessionEnded { .. } => return None,
    })
}

impl From<&SyncEvent> for RepositorySync {
    fn from(e: &SyncEvent) -> Self {
        RepositorySync {
            repository_id: ID(e.repository_id.to_string()),
            status: e.status.as_str().to_owned(),
            message: e.message.clone(),
            seen: (e.seen >= 0).then_some(e.seen),
            stored: (e.stored >= 0).then_some(e.stored),
            invalid: (e.invalid >= 0).then_some(e.invalid),
        }
    }
}

/// The server-wide view of one area's delivery: a lag becomes `EventsMissed`,
/// and `view` picks what the server-wide stream shows of an event (provider log
/// lines stay on `providerEvents`, where one asks for them).
fn server_view<E>(
    delivery: Delivery<E>,
    view: impl Fn(&E) -> Option<ServerEvent>,
) -> Option<ServerEvent> {
    match delivery {
        Delivery::Lagged(missed) => Some(ServerEvent::EventsMissed(EventsMissed { missed })),
        Delivery::Event(event) => view(&event),
    }
}

/// What `serverEvents` shows of a provider event (log lines it does not).
fn provider_view(event: &ProviderEvent) -> Option<ServerEvent> {
    match event {
        ProviderEvent::Status {
            provider_id,
            status,
            message,
        } => Some(ServerEvent::ProviderStatusChanged(ProviderStatusChanged {
            provider_id: ID(provider_id.to_string()),
            status: status.as_str().to_owned(),
            message: message.clone(),
        })),
        ProviderEvent::Created { provider_id, name } => {
            Some(ServerEvent::ProviderCreated(ProviderCreated {
                provider_id: ID(provider_id.to_string()),
                name: name.clone(),
            }))
        }
        ProviderEvent::Deleted { provider_id, name } => {
            Some(ServerEvent::ProviderDeleted(ProviderDeleted {
                provider_id: ID(provider_id.to_string()),
                name: name.clone(),
            }))
        }
        ProviderEvent::Log { .. } => None,
    }
}

/// The deployments' state changes `serverEvents` shows: every one for a
/// server admin (`visible` is `None`), else those of the `visible` projects.
fn deployment_changes(
    engine: Deployments,
    visible: Option<Vec<Uuid>>,
) -> impl Stream<Item = ServerEvent> + use<> {
    engine.events().subscribe().filter_map(move |d| {
        let (engine, visible) = (engine.clone(), visible.clone());
        async move {
            let e = match d {
                Delivery::Lagged(missed) => {
                    return Some(ServerEvent::EventsMissed(EventsMissed { missed }));
                }
                Delivery::Event(e) if e.kind == EventKind::State => e,
                Delivery::Event(e) if e.kind == EventKind::Health && e.node_key.is_none() => e,
                Delivery::Event(_) => return None,
            };
            if let Some(visible) = visible {
                let project = engine
                    .queries()
                    .get(e.deployment_id)
                    .await
                    .ok()?
                    .project_id?;
                if !visible.contains(&project) {
                    return None;
                }
            }
            let deployment_id = ID(e.deployment_id.to_string());
            if e.kind == EventKind::Health {
                let health = e
                    .state?
                    .as_str()
                    .parse::<crate::deploy::ResourceHealth>()
                    .ok()?;
                return Some(ServerEvent::DeploymentHealthChanged(
                    DeploymentHealthChanged {
                        deployment_id,
                        health: health.into(),
                        message: e.message.clone(),
                    },
                ));
            }
            Some(ServerEvent::DeploymentChanged(DeploymentChanged {
                deployment_id,
                state: e.state.map(|s| s.as_str().to_owned()),
                message: e.message.clone(),
            }))
        }
    })
}

#[derive(Default)]
pub struct EventSubscription;

#[Subscription]
impl EventSubscription {
    /// Server-wide events (sign-ins, tokens made and revoked, repository syncs,
    /// providers created, deleted and changing status, deployments changing
    /// state or health) as they happen. Secrets are never part of an
    /// event. Ends when the server shuts down.
    async fn server_events(
        &self,
        ctx: &Context<'_>,
    ) -> Result<impl Stream<Item = ServerEvent> + use<>, ApiError> {
        // Sign-ins and tokens are server admins' to see; anyone else sees
        // the deployments of their projects as they were when subscribing.
        let visible = super::policy::access(ctx).await?.visible();
        let admin = visible.is_none();
        let auth = state::<Auth>(ctx)?
            .events()
            .subscribe()
            .filter_map(move |d| ready(server_view(d, |e| admin.then(|| auth_view(e)).flatten())));
        let syncs = state::<Repositories>(ctx)?
            .events()
            .subscribe()
            .filter_map(|d| {
                ready(server_view(d, |e| {
                    Some(ServerEvent::RepositorySync(e.into()))
                }))
            });
        let providers = state::<Providers>(ctx)?
            .events()
            .subscribe()
            .filter_map(|d| ready(server_view(d, provider_view)));
        let deployments = deployment_changes(state::<Deployments>(ctx)?.clone(), visible);
        Ok(futures_util::stream::select(
            futures_util::stream::select(auth, deployments),
            futures_util::stream::select(syncs, providers),
        ))
    }

    /// One repository's sync progress, live: first where it stands now (its
    /// status, including `NEW`, and its counts), then an event when a sync
    /// starts, one per stored batch, and one when it ends.
    async fn repository_events(
        &self,
        ctx: &Context<'_>,
        id: ID,
    ) -> Result<impl Stream<Item = RepositorySync> + use<>, ApiError> {
        principal(ctx)?;
        let wanted = parse_id(&id, "id")?;
        let repositories = state::<Repositories>(ctx)?;
        // Subscribe before reading where it stands, so nothing falls in between.
        let live = repositories.events().subscribe();
        let now = repositories.get(wanted).await?;
        let invalid = repositories.invalid_count(wanted).await?;
        let first = RepositorySync {
            repository_id: ID(wanted.to_string()),
            status: now.status.as_str().to_owned(),
            message: now.status_message,
            seen: Some(now.elements_seen),
            stored: Some(now.elements_stored),
            invalid: Some(i64::try_from(invalid).unwrap_or(i64::MAX)),
        };
        let live = live.filter_map(move |delivery| {
            ready(match delivery {
                Delivery::Event(e) if e.repository_id == wanted => Some(RepositorySync::from(&*e)),
                Delivery::Event(_) | Delivery::Lagged(_) => None,
            })
        });
        Ok(futures_util::stream::once(ready(first)).chain(live))
    }
}
