//! A replica's life (`corbel serve --cluster`): a standby until it leads,
//! then the whole server.
//!
//! Several replicas share one PostgreSQL database. One of them, the holder of
//! the leader lease (`cluster`), runs the whole server: providers, runs,
//! recovery, the singletons. The others are standbys: members with a
//! heartbeat that answer queries and subscriptions themselves from the
//! database (`app::reader_router`, the leader's events on their own buses
//! through `app::Feed`) and forward what changes something to the leader
//! (its advertised URL), as Vault's performance standbys and Nomad's
//! followers do, so a client may use any replica. When the leader's lease
//! runs out (it died, or was cut off from the database and stopped itself),
//! the standby that claims the lease stops taking connections, takes the
//! database's server lock over (ending the old leader's session) and starts
//! the server on the same address; its start settles the journal the old
//! leader left, as after any crash. The standby's open websockets go on.
//!
//! A leader that loses its lease stops at once ([`LostLeadership`]): by its
//! own clock that happens a heartbeat before the database would let another
//! take over, so two replicas never act as leader together.
//!
//! Forwarding: HTTP requests are relayed with their headers (less hop-by-hop
//! ones) and bodies streamed both ways, with the client's address added to
//! `X-Forwarded-For`; `/exec` is relayed frame by frame, closed with 1012
//! when the leader goes away. While no replica leads, a change waits up to
//! one lease for a leader, then gets 503 `UNAVAILABLE`.
//!
//! Here: a replica's life, from its start to the server it runs once it
//! leads. `edge` chooses what is answered here and what goes to the leader,
//! `relay` forwards HTTP requests, `socket` relays websockets.

mod edge;
mod relay;
mod socket;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use crate::app::LostLeadership;
use crate::app::{App, Feed, Listen, Reader};
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
    let store = db.clone();
    crate::store::lock::migrating(&location, &me, migrate_under_none(&db)).await?;
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let bound = listener
        .local_addr()
        .context("reading the listener's address")?;
    // Membership outlives the server a leader runs: the lease is given up
    // only once that server has stopped, so no successor starts while it
    // still finishes work.
    let membership_stop = CancellationToken::new();
    let cluster = crate::app::join(config, db, bound, false, &membership_stop).await?;
    let membership = tokio::spawn(cluster.clone().run());
    let leading = cluster.leader_epoch().is_some();
    let feed_stop = CancellationToken::new();
    announce(bound, leading);

    let mut standby = None;
    let ran = async {
        let listen = if leading {
            Listen::Bound(listener)
        } else {
            // The same socket, kept for the server this replica runs once it
            // leads: between the standby's last accept and the server's first,
            // a client's connection waits in the socket's backlog instead of
            // being refused.
            let (listener, kept) = same_socket(listener)?;
            // The leader's events, on this replica's own buses: a standby's
            // subscriptions follow them, and go on after it starts leading.
            // (A replica leading from its start has no use for them.)
            let feed = Feed::start(store.clone(), feed_stop.clone()).await?;
            let served =
                Standby::serve(config, &store, &cluster, &feed, &feed_stop, listener).await?;
            let leads = until_leading(cluster.leadership(), &shutdown).await;
            standby = Some(served.stop(&cluster, leads).await);
            if !leads {
                return Ok(());
            }
            Listen::Bound(kept)
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
    // The standby's websockets, still served after it began leading, end
    // with the replica.
    if let Some(reader) = standby {
        reader.ws_close.cancel();
        feed_stop.cancel();
        reader.ws_tasks.close();
        reader.ws_tasks.wait().await;
    }
    feed_stop.cancel();
    membership_stop.cancel();
    let _ = membership.await;
    ran
}

/// `listener` twice: two descriptors of one listening socket.
fn same_socket(listener: TcpListener) -> anyhow::Result<(TcpListener, TcpListener)> {
    let listener = listener.into_std().context("taking the listener")?;
    let kept = listener.try_clone().context("keeping the listener")?;
    Ok((
        TcpListener::from_std(listener)?,
        TcpListener::from_std(kept)?,
    ))
}

/// A standby serving: its own server, and its relay to the leader.
struct Standby {
    relay: Arc<Relay>,
    reader: Reader,
    /// Stops taking connections (those open finish).
    promoted: CancellationToken,
    serving: tokio::task::JoinHandle<Result<(), std::io::Error>>,
    watching: tokio::task::JoinHandle<()>,
}

impl Standby {
    /// Answers what it can from the database and sends the rest to the
    /// leader (see `edge`), until [`Self::stop`].
    async fn serve(
        config: &Config,
        db: &crate::store::Db,
        cluster: &Cluster,
        feed: &Feed,
        feed_stop: &CancellationToken,
        listener: TcpListener,
    ) -> anyhow::Result<Standby> {
        let relay = Arc::new(Relay::new(cluster, config.graphql.max_body_bytes)?);
        let forward = relay::mutations_to_leader(relay.clone());
        let reader = crate::app::reader_router(config, db, cluster, feed, forward, feed_stop)?;
        let router = reader
            .router
            .clone()
            .layer(axum::middleware::from_fn_with_state(
                relay.clone(),
                edge::dispatch,
            ));
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
        tracing::info!(
            "standby: answering queries and subscriptions, sending changes to the leader"
        );
        Ok(Standby {
            relay,
            reader,
            promoted,
            serving,
            watching,
        })
    }

    /// Stops taking connections: this replica leads (`leads`) or stops. Its
    /// websockets go on (closed with the replica, see [`serve`]); relayed
    /// ones (`/exec`) close.
    async fn stop(self, cluster: &Cluster, leads: bool) -> Reader {
        // This descriptor of the socket is closed as the graceful shutdown
        // begins; requests under way finish.
        self.promoted.cancel();
        let _ = self.watching.await;
        if leads {
            // Requests still waiting on the old leader go to this one, whose
            // server starts on the address this relay served.
            self.relay
                .learned((cluster.id(), cluster.advertise_url().to_owned()));
        }
        self.relay.sockets.cancel();
        self.relay.socket_tasks.close();
        if leads {
            // Requests under way finish in the background.
            tokio::spawn(self.serving);
        } else {
            let _ = self.serving.await;
            self.relay.socket_tasks.wait().await;
        }
        self.reader
    }
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
