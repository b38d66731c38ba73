//! Building and running one server: check the socket paths, take the server
//! lock, connect and migrate the store, bootstrap the admin, bind the listener,
//! serve until the shutdown future resolves, then drain and release the lock.
//!
//! `App::build` binds (port 0 works), so tests and benchmarks run the real server
//! in-process; `App::run_until_stopped` serves.
//!
//! Here: the steps of a build. `areas` starts the areas, `router` makes the
//! HTTP edge over them, `run` serves and stops.

mod areas;
mod feed;
mod reader;
mod router;
mod run;

pub use feed::Feed;
pub use reader::{Reader, reader_router};

pub use router::NOT_LEADING;
pub use run::shutdown_signal;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use chrono::Utc;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::ServerFacts;
use crate::auth::Auth;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::deploy::Deployments;
use crate::provider::{self, Providers};
use crate::repository::Repositories;
use crate::store::Db as DatabaseConnection;
use crate::store::lock::{Holder, ServerLock};
use crate::store::{self, DatabaseLocation};
use router::Websockets;

pub struct App {
    listener: TcpListener,
    router: Router,
    db: DatabaseConnection,
    auth: Auth,
    repositories: Repositories,
    providers: Providers,
    deployments: Deployments,
    /// Serves the provider registry once spawned.
    registry: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Stops the registry, after the providers have been stopped.
    registry_stop: CancellationToken,
    /// Cancelled when shutdown begins: ends subscriptions and background loops.
    stopping: CancellationToken,
    ws_close: CancellationToken,
    ws_tasks: TaskTracker,
    shutdown_grace: Duration,
    /// The admin token made at first start, to be shown once.
    new_admin_token: Option<String>,
    facts: ServerFacts,
    /// This server's hold on its data directory and database, from before
    /// anything was touched until the very end.
    lock: ServerLock,
    /// This server as a replica: its membership and leadership.
    cluster: Cluster,
    /// One of several replicas (`--cluster`): membership was running before
    /// this server was built (as a standby), and it serves only while it
    /// leads.
    replica: bool,
}

/// Where a replica's server listens.
pub enum Listen {
    /// The listener it announced as it started.
    Bound(TcpListener),
    /// The address it served at as a standby (that listener is closed).
    At(SocketAddr),
}

/// What a replica's leading server ended with when it lost the leader lease.
#[derive(Debug, thiserror::Error)]
#[error(
    "lost the leader lease (epoch {epoch}): another replica may lead now, so this one \
     stops at once without finishing its work (the leader settles it from the journal); \
     start it again to rejoin as a standby"
)]
pub struct LostLeadership {
    pub epoch: i64,
}

impl App {
    pub async fn build(config: &Config) -> anyhow::Result<App> {
        let provider_settings = config
            .provider_settings()
            .context("resolving the data directory")?;
        // Nothing is made or removed before these two: a refused server leaves
        // the data directory, the database and a running server untouched.
        provider::check_socket_paths(&provider_settings)?;
        let location = config.database()?;
        let lock = ServerLock::acquire(
            Some(&provider_settings.data_dir),
            &location,
            Holder::me("serve", Some(config.listen)),
        )
        .await?;
        Self::build_holding(config, provider_settings, location, lock, None).await
    }

    /// The server of a replica that has just taken the leader lease (`--cluster`):
    /// `lock` holds its data directory; the database's lock is taken over
    /// from the previous leader here. It listens on `listen`: the listener
    /// given, or one bound to the address it served at as a standby.
    pub async fn build_leader(
        config: &Config,
        mut lock: ServerLock,
        cluster: Cluster,
        listen: Listen,
    ) -> anyhow::Result<App> {
        let provider_settings = config
            .provider_settings()
            .context("resolving the data directory")?;
        let location = config.database()?;
        if let Err(e) = lock.take_database_over(&location).await {
            lock.release().await;
            return Err(e.into());
        }
        Self::build_holding(
            config,
            provider_settings,
            location,
            lock,
            Some((cluster, listen)),
        )
        .await
    }

    /// [`Self::build_locked`]; a server refused there gives the lock up
    /// before it returns, so whatever the operator runs next (another
    /// start, `corbel secret-key rotate`) finds it free.
    async fn build_holding(
        config: &Config,
        provider_settings: provider::ProviderSettings,
        location: DatabaseLocation,
        lock: ServerLock,
        replica: Option<(Cluster, Listen)>,
    ) -> anyhow::Result<App> {
        let mut held = Some(lock);
        let built =
            Self::build_locked(config, provider_settings, location, &mut held, replica).await;
        if built.is_err()
            && let Some(lock) = held.take()
        {
            lock.release().await;
        }
        built
    }

    async fn build_locked(
        config: &Config,
        mut provider_settings: provider::ProviderSettings,
        location: DatabaseLocation,
        held: &mut Option<ServerLock>,
        replica: Option<(Cluster, Listen)>,
    ) -> anyhow::Result<App> {
        // Read (or, the first time, made) before the store is touched: a
        // refused key file leaves the database as it was.
        let secret_key = config.secret_key_file().load()?;
        let db = open_store(config, &location, replica.is_some()).await?;
        let stopping = CancellationToken::new();
        let instance_id = instance_id(&location);
        provider_settings.instance_id = instance_id.clone();
        let leader = replica.as_ref().map(|(cluster, _)| cluster);
        let (areas, registry, new_admin_token) = areas::start(
            config,
            &db,
            provider_settings,
            secret_key,
            leader,
            &stopping,
        )
        .await?;
        let is_replica = replica.is_some();
        let (listener, bound, cluster) = listen(config, &db, replica, &stopping).await?;
        let facts = ServerFacts {
            instance_id,
            database: location.kind(),
            started_at: Utc::now(),
        };
        let websockets = Websockets {
            close: CancellationToken::new(),
            tasks: TaskTracker::new(),
        };
        let role = if is_replica {
            router::Role::Leader
        } else {
            router::Role::Alone
        };
        let router = router::router(config, &db, &areas, &cluster, &facts, &websockets, role);
        let mut lock = held.take().expect("build holds the server lock");
        lock.set_listen(bound).await;
        Ok(App {
            listener,
            router,
            db,
            auth: areas.auth,
            repositories: areas.repositories,
            providers: areas.providers,
            deployments: areas.deployments,
            registry: registry.serve,
            registry_stop: registry.stop,
            stopping,
            ws_close: websockets.close,
            ws_tasks: websockets.tasks,
            shutdown_grace: config.shutdown_grace,
            new_admin_token,
            facts,
            lock,
            cluster,
            replica: is_replica,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The admin token made on this first start, if this was one.
    pub fn new_admin_token(&self) -> Option<&str> {
        self.new_admin_token.as_deref()
    }

    /// Prints the admin token made on this first start, if this was one: on
    /// the terminal once, never through the logs.
    pub fn show_new_admin_token(&self) {
        if let Some(token) = self.new_admin_token() {
            println!(
                "\nCreated user `admin`. Its token, shown only this once:\n\n    {token}\n\n\
                 Send it as `Authorization: Bearer <token>`; set a password with `setPassword`.\n"
            );
        }
    }

    pub fn facts(&self) -> &ServerFacts {
        &self.facts
    }
}

/// This server's `instanceId` (see `ProviderSettings::instance_id`): the
/// database's, so the same for every replica of it.
fn instance_id(location: &DatabaseLocation) -> String {
    hex::encode(Sha256::digest(location.identity().as_bytes()))
}

/// The store, migrated; a replica's (`replica`) pool lets idle connections
/// go within a lease (see `store::connect_limited`).
async fn open_store(
    config: &Config,
    location: &DatabaseLocation,
    replica: bool,
) -> anyhow::Result<DatabaseConnection> {
    let idle_limit = replica.then_some(config.cluster.lease);
    let db = store::connect_limited(location, idle_limit).await?;
    // A replica migrated at its start (`standby::serve`), one at a time
    // with the others.
    if !replica {
        store::migrate(&db).await?;
    }
    Ok(db)
}

/// The listener, its address, and this server as a member: a replica's own
/// (it joined as a standby), else one joined now, alone.
async fn listen(
    config: &Config,
    db: &DatabaseConnection,
    replica: Option<(Cluster, Listen)>,
    stopping: &CancellationToken,
) -> anyhow::Result<(TcpListener, SocketAddr, Cluster)> {
    let (replica, listen) = match replica {
        Some((cluster, listen)) => (Some(cluster), listen),
        None => (None, Listen::At(config.listen)),
    };
    let listener = match listen {
        Listen::Bound(listener) => listener,
        Listen::At(at) => TcpListener::bind(at)
            .await
            .with_context(|| format!("cannot listen on {at}"))?,
    };
    let bound = listener
        .local_addr()
        .context("reading the listener's address")?;
    let cluster = match replica {
        Some(cluster) => cluster,
        // The server lock is held: no other replica of this database is alive.
        None => join(config, db.clone(), bound, true, stopping).await?,
    };
    Ok((listener, bound, cluster))
}

/// This server as a member (at `bound`, unless an address is advertised),
/// until `stop`; `alone` when no other replica can be alive.
pub async fn join(
    config: &Config,
    db: DatabaseConnection,
    bound: SocketAddr,
    alone: bool,
    stop: &CancellationToken,
) -> anyhow::Result<Cluster> {
    let advertise_url = config
        .cluster
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("http://{bound}"));
    Cluster::join(
        db,
        config.cluster.clone(),
        advertise_url,
        config.shared_with_replicas()?,
        alone,
        stop.clone(),
    )
    .await
    .context("joining as a replica")
}
