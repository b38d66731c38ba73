//! Building and running one server: check the socket paths, take the server
//! lock, connect and migrate the store, bootstrap the admin, bind the listener,
//! serve until the shutdown future resolves, then drain and release the lock.
//!
//! `App::build` binds (port 0 works), so tests and benchmarks run the real server
//! in-process; `App::run_until_stopped` serves.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::store::Db as DatabaseConnection;
use anyhow::Context as _;
use axum::Router;
use axum::routing::get;
use chrono::Utc;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

use crate::api::documents::DocumentCache;
use crate::api::http::{self as api_http, HttpShared};
use crate::api::{self, ServerFacts};
use crate::audit::Audit;
use crate::auth::Auth;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::deploy::Deployments;
use crate::events::Bus;
use crate::provider::{self, Providers};
use crate::repository::Repositories;
use crate::repository::driver::ProviderSources;
use crate::repository::installations::InstallationsHandle;
use crate::store;
use crate::store::lock::{Holder, ServerLock};

/// How often expired sessions are purged.
const PURGE_EVERY: Duration = Duration::from_secs(3600);

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
        location: store::DatabaseLocation,
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
        location: store::DatabaseLocation,
        held: &mut Option<ServerLock>,
        replica: Option<(Cluster, Listen)>,
    ) -> anyhow::Result<App> {
        // Read (or, the first time, made) before the store is touched: a
        // refused key file leaves the database as it was.
        let secret_key = config.secret_key_file().load()?;

        // A replica's pool: see `store::connect_limited`.
        let idle_limit = replica.as_ref().map(|_| config.cluster.lease);
        let db = store::connect_limited(&location, idle_limit).await?;
        // A replica migrated at its start (`standby::serve`), one at a time
        // with the others.
        if replica.is_none() {
            store::migrate(&db).await?;
        }

        let stopping = CancellationToken::new();
        // One bus per area, each of this many events: a subscriber further
        // behind is told how many it missed.
        const BUS_CAPACITY: usize = 1024;
        let auth = Auth::new(
            db.clone(),
            config.session_ttl,
            Bus::new(BUS_CAPACITY, stopping.clone()),
            &config.login,
        );
        let new_admin_token = auth
            .bootstrap(config.admin_token.as_ref())
            .await
            .context("creating the admin user")?;

        let instance_id = hex::encode(Sha256::digest(location.identity().as_bytes()));
        provider_settings.instance_id = instance_id.clone();
        // Remote providers' listener and CA, read before the key goes to
        // the providers.
        let remote = match provider_settings.listen {
            Some(addr) => Some((
                addr,
                Arc::new(load_provider_ca(&provider_settings, &secret_key)?),
            )),
            None => None,
        };
        let providers = Providers::new(
            db.clone(),
            provider_settings,
            secret_key,
            Bus::new(BUS_CAPACITY, stopping.clone()),
            stopping.clone(),
        );
        let sealed = providers
            .seal_stored_secrets()
            .await
            .context("checking the providers' stored secretConfig")?;
        if sealed.plain > 0 {
            tracing::info!(
                providers = sealed.plain,
                "sealed the secretConfig stored unsealed by an earlier version"
            );
        }
        providers
            .reset_after_restart()
            .await
            .context("resetting provider statuses")?;
        let registry_stop = CancellationToken::new();
        let registry = provider::serve_registry(providers.clone(), registry_stop.clone())
            .await
            .context("starting the provider registry")?;
        let registry: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> = match remote {
            Some((addr, tls)) => {
                providers.enable_remote(tls.clone());
                let remote = provider::serve_remote_registry(
                    providers.clone(),
                    addr,
                    tls,
                    registry_stop.clone(),
                )
                .await?;
                Box::pin(async move {
                    tokio::join!(registry, remote);
                })
            }
            None => Box::pin(registry),
        };

        // A leading replica's engine writes under the leader lease's fence.
        let fence = replica.as_ref().and_then(|(cluster, _)| {
            Some(store::cluster::Fence {
                name: crate::cluster::LEADER.to_owned(),
                holder: cluster.id(),
                epoch: cluster.leader_epoch()?,
            })
        });
        let deployments = Deployments::fenced(
            db.clone(),
            providers.clone(),
            Bus::new(BUS_CAPACITY, stopping.clone()),
            config.deploy.clone(),
            stopping.clone(),
            fence,
        );

        let mut repository_settings = config.repository.clone();
        repository_settings.providers = ProviderSources(Some(Arc::new(providers.clone())));
        repository_settings.installations =
            InstallationsHandle(Some(Arc::new(deployments.clone())));
        let repositories = Repositories::new(
            db.clone(),
            repository_settings,
            Bus::new(BUS_CAPACITY, stopping.clone()),
            stopping.clone(),
        );
        repositories
            .recover_interrupted()
            .await
            .context("recovering interrupted repository syncs")?;

        let audit = Audit::new(db.clone(), Bus::new(BUS_CAPACITY, stopping.clone()));
        audit.spawn_pruning(config.audit_retention_days, stopping.clone());

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
        let is_replica = replica.is_some();
        let cluster = match replica {
            Some(cluster) => cluster,
            None => {
                // The server lock is held: no other replica of this database is alive.
                let advertise_url = config
                    .cluster
                    .advertise_url
                    .clone()
                    .unwrap_or_else(|| format!("http://{bound}"));
                Cluster::join(
                    db.clone(),
                    config.cluster.clone(),
                    advertise_url,
                    true,
                    stopping.clone(),
                )
                .await
                .context("joining as a replica")?
            }
        };
        let facts = ServerFacts {
            instance_id,
            database: location.kind(),
            started_at: Utc::now(),
        };
        let with_data = |builder: async_graphql::SchemaBuilder<_, _, _>| {
            builder
                .data(facts.clone())
                .data(auth.clone())
                .data(repositories.clone())
                .data(providers.clone())
                .data(deployments.clone())
                .data(audit.clone())
                .data(cluster.clone())
                .finish()
        };
        let schema = with_data(api::schema_builder(&config.graphql));
        let reads = with_data(api::reads_schema_builder(&config.graphql));

        let ws_close = CancellationToken::new();
        let ws_tasks = TaskTracker::new();
        let state = Arc::new(HttpShared {
            schema,
            reads,
            auth: auth.clone(),
            repositories: repositories.clone(),
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
            anonymous_gate: crate::api::http::anonymous_gate(),
            ws_close: ws_close.clone(),
            ws_tasks: ws_tasks.clone(),
        });
        crate::telemetry::metrics();
        let router = Router::new()
            .route(
                "/graphql",
                get(crate::web::graphiql).post(api_http::graphql_post),
            )
            .route("/graphql/ws", get(api_http::graphql_ws))
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
        // A replica that may have lost its lease (paused, cut off) takes no
        // request, even before its heartbeat notices: a standby relaying it
        // sends it to the next leader.
        let router = if is_replica {
            let cluster = cluster.clone();
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
        } else {
            router
        };

        let mut lock = held.take().expect("build holds the server lock");
        lock.set_listen(bound).await;
        Ok(App {
            listener,
            router,
            db,
            auth,
            repositories,
            providers,
            deployments,
            registry,
            registry_stop,
            stopping,
            ws_close,
            ws_tasks,
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
        // The singletons run on the leader only.
        let leading = {
            let repositories = self.repositories.clone();
            let deployments = self.deployments.clone();
            tokio::spawn(self.cluster.clone().lead(stopping.clone(), move || {
                let deployments = deployments.clone();
                vec![
                    tokio::spawn(repositories.clone().run_refresh_loop()),
                    tokio::spawn(async move { deployments.recovery().run_reaper().await }),
                ]
            }))
        };
        if let Err(e) = self.deployments.recovery().recover().await {
            tracing::error!(error = %e, "cannot recover deployments");
        }
        let loading = {
            let providers = self.providers.clone();
            tokio::spawn(async move {
                // Before anything starts a container: what a crashed run
                // left goes first.
                providers.sweep_containers().await;
                match providers.load_automatic().await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(providers = n, "loading providers"),
                    Err(e) => tracing::error!(error = %e, "cannot load providers"),
                }
            })
        };
        let signal = {
            let stopping = stopping.clone();
            async move {
                shutdown.await;
                tracing::info!("shutting down: finishing in-flight requests and streams");
                stopping.cancel();
            }
        };
        // The peer address is what `login` limits failed attempts by.
        let service = self
            .router
            .into_make_service_with_connect_info::<SocketAddr>();
        let serving = axum::serve(self.listener, service).with_graceful_shutdown(signal);
        if self.replica {
            // A leader that loses its lease stops at once: by its own clock,
            // a heartbeat before the database would let another take over.
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
        } else {
            serving.await.context("serving HTTP")?;
        }
        // HTTP is drained; subscriptions ended when `stopping` fired. Now close the
        // websockets themselves and wait for them, within the grace period.
        self.ws_close.cancel();
        self.ws_tasks.close();
        if tokio::time::timeout(self.shutdown_grace, self.ws_tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = self.ws_tasks.len(),
                "websockets still open after the grace period; closing them"
            );
        }
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

/// The header a replica that no longer leads marks its refusal with: the
/// request was not taken, so a relay may send it to the next leader.
pub const NOT_LEADING: &str = "x-corbel-not-leading";

/// The remote providers' CA: the operator's files, or the one made in the data
/// directory at the first start with `--provider-listen`.
fn load_provider_ca(
    settings: &provider::ProviderSettings,
    secret_key: &crate::seal::SecretKey,
) -> anyhow::Result<provider::tls::ProviderTls> {
    use provider::tls::{CaSource, ProviderTls};
    let source = match (&settings.ca_cert_file, &settings.ca_key_file) {
        (Some(cert), Some(key)) => CaSource::Files { cert, key },
        (None, None) => CaSource::DataDir {
            data_dir: &settings.data_dir,
            key: secret_key,
        },
        _ => anyhow::bail!(
            "provider ca_cert_file and ca_key_file go together (--provider-ca-cert, --provider-ca-key): give both or neither"
        ),
    };
    ProviderTls::load(source).context("loading the provider CA")
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
