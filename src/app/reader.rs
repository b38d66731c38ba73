//! A standby's own server (`--cluster`): the whole API over the database,
//! with no providers running, no runs, no background work. Its
//! subscriptions follow the leader's events through the [`Feed`]; a
//! websocket's mutations go on to the leader (`forward`), as the standby's
//! HTTP edge sends on the rest of what changes something (`standby`).
//! What needs a provider's link is answered by the leader: the providers'
//! area says so ([`crate::provider::ProviderError::OnLeader`]) and the
//! standby sends the request on.

use axum::Router;
use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::areas::Areas;
use super::feed::Feed;
use super::router::{self, Role, Websockets};
use crate::api::ServerFacts;
use crate::api::http::ForwardMutation;
use crate::audit::Audit;
use crate::auth::Auth;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::deploy::Deployments;
use crate::provider::Providers;
use crate::repository::Repositories;
use crate::store::Db;

/// A standby's server, and its websockets (closed at its end).
pub struct Reader {
    pub router: Router,
    /// Closes its websockets.
    pub ws_close: CancellationToken,
    pub ws_tasks: TaskTracker,
}

/// The standby's server over `db`, its events from `feed`, ended with `stop`.
pub fn reader_router(
    config: &Config,
    db: &Db,
    cluster: &Cluster,
    feed: &Feed,
    forward: ForwardMutation,
    stop: &CancellationToken,
) -> anyhow::Result<Reader> {
    let (areas, instance_id) = reader_areas(config, db, cluster, feed, stop)?;
    let facts = ServerFacts {
        instance_id,
        database: config.database()?.kind(),
        started_at: Utc::now(),
    };
    let websockets = Websockets {
        close: CancellationToken::new(),
        tasks: TaskTracker::new(),
    };
    let router = router::router(
        config,
        db,
        &areas,
        cluster,
        &facts,
        &websockets,
        Role::Standby(forward),
    );
    Ok(Reader {
        router,
        ws_close: websockets.close,
        ws_tasks: websockets.tasks,
    })
}

/// The areas over the database, with the feed's buses and nothing started;
/// this server's `instanceId`.
fn reader_areas(
    config: &Config,
    db: &Db,
    cluster: &Cluster,
    feed: &Feed,
    stop: &CancellationToken,
) -> anyhow::Result<(Areas, String)> {
    let secret_key = config.secret_key_file().load()?;
    let location = config.database()?;
    let mut provider_settings = config.provider_settings()?;
    provider_settings.standby = true;
    provider_settings.instance_id = super::instance_id(&location);
    let auth = Auth::new(
        db.clone(),
        config.session_ttl,
        feed.auth.clone(),
        &config.login,
    );
    let providers = Providers::new(
        db.clone(),
        provider_settings.clone(),
        secret_key.clone(),
        feed.providers.clone(),
        stop.clone(),
    );
    // A lease epoch no replica ever holds: whatever the engine tried to
    // write here would be refused (nothing here asks it to).
    let never_held = crate::store::cluster::Fence {
        name: crate::cluster::LEADER.to_owned(),
        holder: cluster.id(),
        epoch: -1,
    };
    let deployments = Deployments::fenced(
        db.clone(),
        providers.clone(),
        feed.deployments.clone(),
        config.deploy.clone(),
        stop.clone(),
        Some(never_held),
    );
    let repositories = Repositories::new(
        db.clone(),
        super::areas::repository_settings(config, &providers, &deployments, secret_key),
        feed.repositories.clone(),
        stop.clone(),
    );
    let audit = Audit::new(db.clone(), feed.audit.clone());
    let areas = Areas {
        auth,
        providers,
        deployments,
        repositories,
        audit,
    };
    Ok((areas, provider_settings.instance_id))
}
