//! The GraphQL API: the schema root, one module per area, the edge error type,
//! the authentication guard, and the HTTP/websocket handlers that serve it.

mod audit;
mod audit_notes;
mod auth;
mod blueprint;
mod cost;
mod deploy;
mod deploy_enums;
mod deployment;
mod deployment_events;
pub mod documents;
pub mod error;
mod events;
mod exec;
pub mod http;
mod overview;
pub mod pagination;
mod plans;
pub mod policy;
mod provider;
mod repository;
mod revisions;
mod roles;
mod server;
mod settings;
mod teams;
mod upload;
mod user;

use async_graphql::{MergedObject, MergedSubscription, Schema, SchemaBuilder};
use chrono::{DateTime, Utc};

pub use error::{ApiError, ErrorCode};
pub use settings::{GraphqlFlags, GraphqlLimits};
pub use upload::{ApiFlags, ApiLimits};

use crate::auth::Principal;

#[derive(MergedObject, Default)]
pub struct Query(
    server::ServerQuery,
    auth::AuthQuery,
    teams::TeamsQuery,
    repository::RepositoryQuery,
    provider::ProviderQuery,
    deploy::DeployQuery,
    plans::PlanQuery,
    audit::AuditQueryRoot,
    overview::OverviewQuery,
);

#[derive(MergedObject, Default)]
pub struct Mutation(
    auth::AuthMutation,
    teams::TeamsMutation,
    repository::RepositoryMutation,
    provider::ProviderMutation,
    deploy::DeployMutation,
    exec::ExecMutation,
    plans::PlanMutation,
);

#[derive(MergedSubscription, Default)]
pub struct Subscription(
    events::EventSubscription,
    provider::ProviderSubscription,
    deployment_events::DeploySubscription,
    audit::AuditSubscription,
);

pub type CorbelSchema = Schema<Query, Mutation, Subscription>;

/// Facts about this server that `serverInfo` reports.
#[derive(Clone, Debug)]
pub struct ServerFacts {
    pub instance_id: String,
    pub database: &'static str,
    pub started_at: DateTime<Utc>,
}

/// Who is calling: put into every request's data by the HTTP and websocket
/// handlers. A request with no token and one with a token that is not valid
/// are both refused, but told apart: the fix differs.
#[derive(Clone, Debug)]
pub enum Caller {
    /// No token came with the request.
    Anonymous,
    /// A token came, but it is unknown, expired or revoked (or its user is
    /// disabled).
    InvalidToken,
    /// A valid token.
    SignedIn(Principal),
}

impl Caller {
    pub fn principal(&self) -> Option<&Principal> {
        match self {
            Self::SignedIn(principal) => Some(principal),
            Self::Anonymous | Self::InvalidToken => None,
        }
    }

    pub fn is_signed_in(&self) -> bool {
        self.principal().is_some()
    }

    /// The `UNAUTHENTICATED` error for this caller: what is missing, or wrong.
    pub fn unauthenticated(&self) -> ApiError {
        match self {
            Self::InvalidToken => ApiError::invalid_token(),
            Self::Anonymous | Self::SignedIn(_) => ApiError::unauthenticated(),
        }
    }
}

/// The schema's types and limits, without any server state: enough to print the
/// SDL (`corbel schema`) and the base of the served schema.
pub fn schema_builder(limits: &GraphqlLimits) -> SchemaBuilder<Query, Mutation, Subscription> {
    reads_schema_builder(limits)
        .extension(cost::CostLimit {
            limits: limits.clone(),
        })
        // Outside the guard, so it sees the mutations the guard refuses.
        .extension(audit::AuditTrail)
        .extension(policy::PolicyGuard)
}

/// The same schema without extensions, for queries over HTTP, whose cost
/// and policy checks run before they are executed (`http::read_schema`);
/// the audit trail records mutations only. With any extension installed,
/// async-graphql takes its slow path for every field it resolves: a
/// deployment's 1,000 nodes are some 15,000 fields.
pub fn reads_schema_builder(
    limits: &GraphqlLimits,
) -> SchemaBuilder<Query, Mutation, Subscription> {
    Schema::build(
        Query::default(),
        Mutation::default(),
        Subscription::default(),
    )
    .limit_depth(limits.max_depth)
    .limit_complexity(limits.max_complexity)
}

/// The address a request came from (see `http::client_address`), for the
/// per-address limit on failed logins; `None` when unknown.
#[derive(Clone, Copy, Debug)]
pub struct ClientAddress(pub Option<std::net::IpAddr>);

/// The SDL of the API, as `schema.graphql` holds it.
pub fn sdl() -> String {
    schema_builder(&GraphqlLimits::default()).finish().sdl()
}

/// The caller's principal, or `UNAUTHENTICATED`. The guard already refuses
/// anonymous requests for non-public fields; resolvers still ask, so a field is
/// never served without knowing whom to.
pub(crate) fn principal<'a>(ctx: &async_graphql::Context<'a>) -> Result<&'a Principal, ApiError> {
    match ctx.data_opt::<Caller>() {
        Some(Caller::SignedIn(principal)) => Ok(principal),
        Some(caller) => Err(caller.unauthenticated()),
        None => Err(ApiError::unauthenticated()),
    }
}

/// An id argument, or `VALIDATION` naming the argument.
pub(crate) fn parse_id(id: &async_graphql::ID, what: &str) -> Result<uuid::Uuid, ApiError> {
    id.parse::<uuid::Uuid>()
        .map_err(|_| ApiError::validation(format!("`{what}`: `{}` is not an id", id.0)))
}

/// Server state the schema was built with. Missing state is a wiring bug, so it
/// is an internal error rather than a panic.
pub(crate) fn state<'a, T: Send + Sync + 'static>(
    ctx: &async_graphql::Context<'a>,
) -> Result<&'a T, ApiError> {
    ctx.data_opt::<T>().ok_or_else(|| {
        tracing::error!(
            state = std::any::type_name::<T>(),
            "schema built without state"
        );
        ApiError::new(ErrorCode::Internal, "internal error")
    })
}
