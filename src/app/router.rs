//! The server's HTTP edge as one router: the GraphQL schemas over the areas,
//! the routes, the layers every request passes, and a replica's refusal of
//! requests once it may no longer lead.

use std::sync::{Arc, LazyLock};

use axum::Router;
use axum::routing::get;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

use super::areas::Areas;
use crate::api::documents::DocumentCache;
use crate::api::http::{self as api_http, ForwardMutation, HttpShared};
use crate::api::{self, ServerFacts};
use crate::cluster::Cluster;
use crate::config::Config;
use crate::store::{self, Db};

/// The header a replica that no longer leads marks its refusal with: the
/// request was not taken, so a relay may send it to the next leader.
pub const NOT_LEADING: &str = "x-corbel-not-leading";

/// The websockets the router opens: closed, and waited for, at shutdown.
pub(super) struct Websockets {
    pub close: CancellationToken,
    pub tasks: TaskTracker,
}

/// Which server the router is for.
pub(super) enum Role {
    /// A server alone (not `--cluster`).
    Alone,
    /// A leading replica: it takes requests only while it leads.
    Leader,
    /// A standby's own server (`reader`): a websocket's mutations go on to
    /// the leader.
    Standby(ForwardMutation),
}

/// Everything a request can reach: the schemas over `areas`, the routes and
/// their layers.
pub(super) fn router(
    config: &Config,
    db: &Db,
    areas: &Areas,
    cluster: &Cluster,
    facts: &ServerFacts,
    websockets: &Websockets,
    role: Role,
) -> Router {
    let forward = match &role {
        Role::Standby(forward) => Some(forward.clone()),
        Role::Alone | Role::Leader => None,
    };
    let state = shared(config, db, areas, cluster, facts, websockets, forward);
    crate::telemetry::metrics();
    let router = Router::new()
        .route(
            "/graphql",
            get(crate::web::graphiql).post(api_http::graphql_post),
        )
        .route("/graphql/ws", get(api_http::graphql_ws))
        .route("/exec", get(api_http::exec_ws))
        .route(
            "/files/{node}",
            get(api_http::get_files).put(api_http::put_files),
        )
        .route("/artifacts/{element}/{urn}", get(api_http::artifact))
        .route("/healthz", get(api_http::healthz))
        .route("/readyz", get(api_http::readyz))
        .route("/metrics", get(api_http::metrics))
        .merge(crate::web::router())
        .with_state(state)
        .layer(CatchPanicLayer::custom(|_| {
            api_http::edge_error(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                api::ErrorCode::Internal,
                "internal error",
            )
        }))
        .layer(TraceLayer::new_for_http());
    match role {
        Role::Leader => only_while_leading(router, cluster.clone()),
        Role::Alone | Role::Standby(_) => router,
    }
}

/// What every handler shares: both schemas with the areas as their data, and
/// the edge's own limits and state.
fn shared(
    config: &Config,
    db: &Db,
    areas: &Areas,
    cluster: &Cluster,
    facts: &ServerFacts,
    websockets: &Websockets,
    forward_mutations: Option<ForwardMutation>,
) -> Arc<HttpShared> {
    let with_data = schema_data(facts, areas, cluster);
    let schema = with_data(api::schema_builder(&config.graphql));
    let reads = with_data(api::reads_schema_builder(&config.graphql));
    // Built when a document first passes validation (half a megabyte a
    // schema, which an idle server need not hold).
    let limits = config.graphql.clone();
    let valid_reads: api_http::LazySchema = LazyLock::new(Box::new(move || {
        with_data(
            api::reads_schema_builder(&limits).validation_mode(async_graphql::ValidationMode::Fast),
        )
    }));
    Arc::new(HttpShared {
        schema,
        reads,
        valid_reads,
        auth: areas.auth.clone(),
        repositories: areas.repositories.clone(),
        deployments: areas.deployments.clone(),
        audit: areas.audit.clone(),
        api: config.api.clone(),
        readiness: {
            let db = db.clone();
            Arc::new(move || {
                let db = db.clone();
                Box::pin(async move { store::readiness(&db).await })
            })
        },
        limits: config.graphql.clone(),
        trusted_proxies: config.login.trusted_proxies.clone(),
        documents: Arc::new(DocumentCache::new(512, 16 * 1024)),
        anonymous_gate: api_http::anonymous_gate(),
        signed_in_ws_gate: api_http::signed_in_ws_gate(),
        ws_close: websockets.close.clone(),
        ws_tasks: websockets.tasks.clone(),
        ws_sockets: Arc::default(),
        ws_queues: Arc::default(),
        forward_mutations,
    })
}

/// What makes a schema of a builder: the areas as its data.
fn schema_data(
    facts: &ServerFacts,
    areas: &Areas,
    cluster: &Cluster,
) -> impl Fn(
    async_graphql::SchemaBuilder<api::Query, api::Mutation, api::Subscription>,
) -> api::CorbelSchema
+ Send
+ 'static {
    let (facts, areas, cluster) = (facts.clone(), areas.clone(), cluster.clone());
    move |builder| {
        builder
            .data(facts.clone())
            .data(areas.auth.clone())
            .data(areas.repositories.clone())
            .data(areas.providers.clone())
            .data(areas.deployments.clone())
            .data(areas.audit.clone())
            .data(cluster.clone())
            .finish()
    }
}

/// A replica that may have lost its lease (paused, cut off) takes no
/// request, even before its heartbeat notices: a standby relaying it sends
/// it to the next leader.
fn only_while_leading(router: Router, cluster: Cluster) -> Router {
    router.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let leads = cluster.leads_now();
            async move {
                if leads {
                    next.run(request).await
                } else {
                    not_leading()
                }
            }
        },
    ))
}

fn not_leading() -> axum::response::Response {
    let mut refused = api_http::edge_error(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        api::ErrorCode::Unavailable,
        "this replica no longer leads: retry (any replica forwards to the leader)",
    );
    refused
        .headers_mut()
        .insert(NOT_LEADING, axum::http::HeaderValue::from_static("1"));
    refused
}
