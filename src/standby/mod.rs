//! A replica's life (`corbel serve --cluster`): a standby until it leads,
//! then the whole server.
//!
//! Several replicas share one PostgreSQL database. One of them, the holder of
//! the leader lease (`cluster`), runs the whole server: providers, runs,
//! recovery, the singletons. The others are standbys: members with a
//! heartbeat that forward every request they receive to the leader (its
//! advertised URL), as Vault's standbys and Nomad's followers do, so a client
//! may use any replica. When the leader's lease runs out (it died, or was cut
//! off from the database and stopped itself), the standby that claims the
//! lease stops forwarding, takes the database's server lock over (ending the
//! old leader's session) and starts the server on the same address; its
//! start settles the journal the old leader left, as after any crash.
//!
//! A leader that loses its lease stops at once ([`LostLeadership`]): by its
//! own clock that happens a heartbeat before the database would let another
//! take over, so two replicas never act as leader together.
//!
//! Forwarding: HTTP requests are relayed with their headers (less hop-by-hop
//! ones) and bodies streamed both ways, with the client's address added to
//! `X-Forwarded-For`; `/graphql/ws` is relayed frame by frame. When the
//! leader goes away, a relayed websocket is closed with 1012 (service
//! restart): the client subscribes again on any replica, and
//! `deploymentEvents(after:)` resumes past the last event it saw. While no
//! replica leads, a request waits up to one lease for a leader, then gets 503
//! `UNAVAILABLE`.
//!
//! Here: a replica's life, from its start to the server it runs once it
//! leads. `relay` forwards HTTP requests to the leader, `socket` relays
//! websockets.

mod relay;
mod socket;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use crate::app::LostLeadership;
use crate::app::{App, Listen};
use crate::cluster::Cluster;
use crate::config::Config;
use crate::store::lock::{Holder, ServerLock};
use relay::Relay;

/// Runs this replica until `shutdown` fires: a standby while another leads,
/// the whole server once it leads. Returns [`LostLeadership`] as an error
/// when it led and lost the lease: the process must then end at once.
pub async fn serve(
    config: &Config,
    shutdown: CancellationToken,
    announce: impl FnOnce(SocketAddr, bool),
) -> anyhow::Result<()> {
    let provider_settings = config
        .provider_settings()
        .context("resolving the data directory")?;
    crate::provider::check_socket_paths(&provider_settings)?;
    let location = config.database()?;
    let me = Holder::me("serve", Some(config.listen));
    let lock =
        ServerLock::acquire_data_dir(&provider_settings.data_dir, &location, me.clone()).await?;
    let db = crate::store::connect_limited(&location, Some(config.cluster.lease)).await?;
    crate::store::lock::migrating(&location, &me, migrate_under_none(&db)).await?;
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let bound = listener
        .local_addr()
        .context("reading the listener's address")?;
    let advertise_url = config
        .cluster
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("http://{bound}"));
    // Membership outlives the server a leader runs: the lease is given up
    // only once that server has stopped, so no successor starts while it
    // still finishes work.
    let membership_stop = CancellationToken::new();
    let cluster = Cluster::join(
        db,
        config.cluster.clone(),
        advertise_url,
        config.shared_with_replicas()?,
        false,
        membership_stop.clone(),
    )
    .await
    .context("joining as a replica")?;
    let membership = tokio::spawn(cluster.clone().run());
    let leading = cluster.leader_epoch().is_some();
    announce(bound, leading);

    let ran = async {
        let listen = if leading {
            Listen::Bound(listener)
        } else if forward_until_leading(
            &cluster,
            config.graphql.max_body_bytes,
            listener,
            &shutdown,
        )
        .await?
        {
            Listen::At(bound)
        } else {
            return Ok(());
        };
        tracing::info!(replica = %cluster.id(), "leading: starting the server");
        let app = App::build_leader(config, lock, cluster.clone(), listen).await?;
        app.show_new_admin_token();
        let stopped = shutdown.clone();
        app.run_until_stopped(async move { stopped.cancelled().await })
            .await
    }
    .await;
    if ran.as_ref().is_err_and(|e| e.is::<LostLeadership>()) {
        // The lease is gone already; nothing more is done here.
        return ran;
    }
    membership_stop.cancel();
    let _ = membership.await;
    ran
}

/// Forwards requests to the leader until this replica leads (true) or
/// `shutdown` fires (false).
async fn forward_until_leading(
    cluster: &Cluster,
    max_body: usize,
    listener: TcpListener,
    shutdown: &CancellationToken,
) -> anyhow::Result<bool> {
    let relay = Arc::new(Relay::new(cluster, max_body)?);
    let router = Router::new()
        .route("/healthz", get(crate::api::http::healthz))
        .route("/graphql/ws", get(socket::relay_ws).post(relay::relay_http))
        .fallback(relay::relay_http)
        .with_state(relay.clone());
    let leadership = cluster.leadership();
    let promoted = CancellationToken::new();
    let stop = promoted.clone();
    let serving = tokio::spawn(
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .into_future(),
    );
    let watching = tokio::spawn(watch_leader(relay.clone(), promoted.clone()));
    tracing::info!("standby: forwarding requests to the leader");
    let leads = until_leading(leadership, shutdown).await;
    // The listener is dropped as the graceful shutdown begins, so the server
    // can bind the same address while relayed requests finish.
    promoted.cancel();
    let _ = watching.await;
    if leads {
        // Requests still waiting on the old leader go to this one, whose
        // server starts on the address this relay served.
        relay.learned((cluster.id(), cluster.advertise_url().to_owned()));
    }
    relay.sockets.cancel();
    relay.socket_tasks.close();
    if !leads {
        let _ = serving.await;
        relay.socket_tasks.wait().await;
    } else {
        // Requests under way finish in the background.
        tokio::spawn(serving);
    }
    Ok(leads)
}

/// Reads who leads every heartbeat, until `stop`: a request or a socket
/// waiting on a leader that has been replaced gives up on it.
async fn watch_leader(relay: Arc<Relay>, stop: CancellationToken) {
    let mut every = tokio::time::interval(relay.cluster.settings().heartbeat);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.cancelled() => return,
        }
        let read = tokio::select! {
            read = relay.who_leads() => read,
            _ = stop.cancelled() => return,
        };
        if let Ok(Some(found)) = read {
            relay.learned(found);
        }
    }
}

/// Waits until this replica leads (true), or `shutdown` fires or membership
/// ends (false).
async fn until_leading(
    mut leadership: tokio::sync::watch::Receiver<Option<i64>>,
    shutdown: &CancellationToken,
) -> bool {
    loop {
        if leadership.borrow_and_update().is_some() {
            return true;
        }
        tokio::select! {
            changed = leadership.changed() => if changed.is_err() { return false },
            _ = shutdown.cancelled() => return false,
        }
    }
}

/// Migrates the schema, unless replicas alive run the one it has (see
/// `cluster::check_migration`).
async fn migrate_under_none(db: &crate::store::Db) -> anyhow::Result<()> {
    crate::cluster::check_migration(db).await?;
    crate::store::migrate(db).await?;
    Ok(())
}
