//! Running a built server: the background tasks (the leader's singletons,
//! provider loading, session purging), serving HTTP until the shutdown
//! future resolves (or a replica loses its lease), then stopping every part
//! in the order that lets each finish its work.

use std::convert::Infallible;
use std::future::Future;
use std::os::fd::AsRawFd;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::{ConnectInfo, Request};
use axum::serve::IncomingStream;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

use super::{App, LostLeadership};
use crate::api::http::PeerSocket;
use crate::auth::Auth;
use crate::cluster::Cluster;
use crate::deploy::Deployments;
use crate::provider::Providers;
use crate::repository::Repositories;

/// How often expired sessions are purged.
const PURGE_EVERY: Duration = Duration::from_secs(3600);

impl App {
    /// Serves until `shutdown` resolves, then stops accepting, finishes in-flight
    /// requests, completes subscriptions, closes websockets and returns.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let stopping = self.stopping.clone();
        let background = tokio::spawn(purge_sessions(self.auth.clone(), stopping.clone()));
        let registry = tokio::spawn(self.registry);
        // A replica's membership runs from before it led, in `standby`.
        let membership = (!self.replica).then(|| tokio::spawn(self.cluster.clone().run()));
        let mut leadership = self.cluster.leadership();
        let led_with = *leadership.borrow_and_update();
        let leading = spawn_singletons(
            &self.cluster,
            &self.repositories,
            &self.deployments,
            &stopping,
        );
        if let Err(e) = self.deployments.recovery().recover().await {
            tracing::error!(error = %e, "cannot recover deployments");
        }
        let loading = tokio::spawn(load_providers(self.providers.clone()));
        let lease = self.replica.then_some((leadership, led_with));
        serve(self.listener, self.router, shutdown, &stopping, lease).await?;
        close_websockets(&self.ws_close, &self.ws_tasks, self.shutdown_grace).await;
        stopping.cancel();
        let _ = loading.await;
        let _ = leading.await;
        // Running deploy steps finish their provider call (a journal
        // boundary) before providers stop.
        self.deployments.shutdown(self.shutdown_grace).await;
        // Providers unregister as they stop, so the registry outlives them.
        self.providers.shutdown().await;
        self.registry_stop.cancel();
        let _ = registry.await;
        let _ = background.await;
        // The refresh loop waits for its syncs; a replica that stopped
        // leading has no loop, so it waits here.
        self.repositories.finish_syncs().await;
        if let Some(membership) = membership {
            let _ = membership.await;
        }
        let closed = self.db.close().await.context("closing the database");
        self.lock.release().await;
        closed?;
        tracing::info!("stopped");
        Ok(())
    }
}

/// The singletons, which run on the leader only: the repositories' refresh
/// loop, the deployments' reaper and event pruning, and live health (the
/// monitor, the roll-ups, the healer).
fn spawn_singletons(
    cluster: &Cluster,
    repositories: &Repositories,
    deployments: &Deployments,
    stopping: &CancellationToken,
) -> JoinHandle<()> {
    let repositories = repositories.clone();
    let deployments = deployments.clone();
    tokio::spawn(cluster.clone().lead(stopping.clone(), move || {
        let [reaper, pruner, monitor, rollups, healer] = [0; 5].map(|_| deployments.clone());
        vec![
            tokio::spawn(repositories.clone().run_refresh_loop()),
            tokio::spawn(async move { reaper.recovery().run_reaper().await }),
            tokio::spawn(async move { pruner.recovery().run_event_pruning().await }),
            tokio::spawn(async move { monitor.health().run_monitor().await }),
            tokio::spawn(async move { rollups.health().run_rollups().await }),
            tokio::spawn(async move { healer.health().run_healer().await }),
        ]
    }))
}

/// Loads the providers started automatically.
async fn load_providers(providers: Providers) {
    // Before anything starts a container: what a crashed run left goes
    // first.
    providers.sweep_containers().await;
    match providers.load_automatic().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(providers = n, "loading providers"),
        Err(e) => tracing::error!(error = %e, "cannot load providers"),
    }
}

/// Serves HTTP until `shutdown` resolves and in-flight requests are done. A
/// leading replica (`lease`: its leadership, and the epoch it led with)
/// stops at once when it loses the lease: by its own clock, a heartbeat
/// before the database would let another take over.
async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    stopping: &CancellationToken,
    lease: Option<(watch::Receiver<Option<i64>>, Option<i64>)>,
) -> anyhow::Result<()> {
    let signal = {
        let stopping = stopping.clone();
        async move {
            shutdown.await;
            tracing::info!("shutting down: finishing in-flight requests and streams");
            stopping.cancel();
        }
    };
    // Each connection's requests carry the peer's address (what `login`
    // limits failed attempts by) and the connection's socket.
    let connections = tower::service_fn(move |incoming: IncomingStream<'_, TcpListener>| {
        let peer = ConnectInfo(*incoming.remote_addr());
        let socket = PeerSocket(incoming.io().as_raw_fd());
        let router = router.clone().map_request(move |mut request: Request| {
            request.extensions_mut().insert(peer);
            request.extensions_mut().insert(socket);
            request
        });
        std::future::ready(Ok::<_, Infallible>(router))
    });
    let serving = axum::serve(listener, connections).with_graceful_shutdown(signal);
    let Some((mut leadership, led_with)) = lease else {
        serving.await.context("serving HTTP")?;
        return Ok(());
    };
    let lost = async {
        while leadership.borrow_and_update().is_some() {
            if leadership.changed().await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        served = serving => served.context("serving HTTP")?,
        () = lost => {
            stopping.cancel();
            return Err(LostLeadership { epoch: led_with.unwrap_or_default() }.into());
        }
    }
    Ok(())
}

/// HTTP is drained; subscriptions ended when `stopping` fired. Closes the
/// websockets themselves and waits for them, within the grace period.
async fn close_websockets(close: &CancellationToken, tasks: &TaskTracker, grace: Duration) {
    close.cancel();
    tasks.close();
    if tokio::time::timeout(grace, tasks.wait()).await.is_err() {
        tracing::warn!(
            open = tasks.len(),
            "websockets still open after the grace period; closing them"
        );
    }
}

async fn purge_sessions(auth: Auth, stopping: CancellationToken) {
    let mut every = tokio::time::interval(PURGE_EVERY);
    loop {
        tokio::select! {
            _ = stopping.cancelled() => return,
            _ = every.tick() => match auth.purge_expired().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(sessions = n, "purged expired sessions"),
                Err(e) => tracing::warn!(error = %e, "purging expired sessions failed"),
            },
        }
    }
}

/// Listens for SIGINT and SIGTERM from the moment it is called (so a signal that
/// arrives while the server is still starting is not lost) and returns a future
/// that resolves on the first of them.
pub fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
        let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
        Ok(async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}
