//! The areas one server wires together, each started once the areas it
//! needs are: auth, providers (with the registry they register through),
//! deployments, repositories, audit. What each step checks or recovers at
//! start happens here, in this order.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use super::feed::{Message, Notifier};
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
use crate::seal::SecretKey;
use crate::store::{self, Db};

/// One bus per area, each of this many events: a subscriber further behind
/// is told how many it missed.
const BUS_CAPACITY: usize = 1024;

/// The areas of one server, as the API and the HTTP edge are given them
/// (handles: a clone shares them).
#[derive(Clone)]
pub(super) struct Areas {
    pub auth: Auth,
    pub providers: Providers,
    pub deployments: Deployments,
    pub repositories: Repositories,
    pub audit: Audit,
}

/// The provider registry (and the remote one, if providers may connect over
/// TCP), to be spawned once the server runs.
pub(super) struct Registry {
    pub serve: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Stops it, after the providers have been stopped.
    pub stop: CancellationToken,
}

/// Every area, each started once those it needs are; the registry to
/// serve; the admin token made at the first start. A leading replica's
/// (`leader`) areas tell the other replicas what happens (`feed`).
pub(super) async fn start(
    config: &Config,
    db: &Db,
    provider_settings: provider::ProviderSettings,
    secret_key: SecretKey,
    leader: Option<&Cluster>,
    stopping: &CancellationToken,
) -> anyhow::Result<(Areas, Registry, Option<String>)> {
    let notifier = leader.map(|_| Notifier::spawn(db.clone(), stopping.clone()));
    let notifier = notifier.as_ref();
    let (auth, new_admin_token) = start_auth(config, db, stopping, notifier).await?;
    let (providers, registry) = start_providers(
        db,
        provider_settings,
        secret_key.clone(),
        stopping,
        notifier,
    )
    .await?;
    let deployments = start_deployments(config, db, &providers, leader, stopping);
    let repositories = start_repositories(
        config,
        db,
        &providers,
        &deployments,
        secret_key,
        stopping,
        notifier,
    )
    .await?;
    let audit = start_audit(config, db, stopping, notifier);
    let areas = Areas {
        auth,
        providers,
        deployments,
        repositories,
        audit,
    };
    Ok((areas, registry, new_admin_token))
}

/// Auth, with the admin bootstrapped: the token made at the first start.
async fn start_auth(
    config: &Config,
    db: &Db,
    stopping: &CancellationToken,
    notifier: Option<&Notifier>,
) -> anyhow::Result<(Auth, Option<String>)> {
    let auth = Auth::new(
        db.clone(),
        config.session_ttl,
        bus(stopping, notifier, Message::Auth),
        &config.login,
    );
    let new_admin_token = auth
        .bootstrap(config.admin_token.as_ref())
        .await
        .context("creating the admin user")?;
    Ok((auth, new_admin_token))
}

/// The providers, their stored secrets sealed and statuses reset, and the
/// registry they register through (bound, not yet served).
async fn start_providers(
    db: &Db,
    settings: provider::ProviderSettings,
    secret_key: SecretKey,
    stopping: &CancellationToken,
    notifier: Option<&Notifier>,
) -> anyhow::Result<(Providers, Registry)> {
    // Remote providers' listener and CA, read before the key goes to
    // the providers.
    let remote = match settings.listen {
        Some(addr) => Some((addr, Arc::new(load_provider_ca(&settings, &secret_key)?))),
        None => None,
    };
    let providers = Providers::new(
        db.clone(),
        settings,
        secret_key,
        bus(stopping, notifier, Message::Provider),
        stopping.clone(),
    );
    settle_stored_providers(&providers).await?;
    let stop = CancellationToken::new();
    let registry = provider::serve_registry(providers.clone(), stop.clone())
        .await
        .context("starting the provider registry")?;
    let serve: Pin<Box<dyn Future<Output = ()> + Send>> = match remote {
        Some((addr, tls)) => {
            providers.enable_remote(tls.clone());
            let remote =
                provider::serve_remote_registry(providers.clone(), addr, tls, stop.clone()).await?;
            Box::pin(async move {
                tokio::join!(registry, remote);
            })
        }
        None => Box::pin(registry),
    };
    Ok((providers, Registry { serve, stop }))
}

/// What an earlier run left in the providers' rows: secretConfig stored
/// unsealed (by an earlier version), statuses of providers no longer running.
async fn settle_stored_providers(providers: &Providers) -> anyhow::Result<()> {
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
        .context("resetting provider statuses")
}

/// The remote providers' CA: the operator's files, or the one made in the data
/// directory at the first start with `--provider-listen`.
fn load_provider_ca(
    settings: &provider::ProviderSettings,
    secret_key: &SecretKey,
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

/// The deploy engine; a leading replica's (`leader`) writes under the leader
/// lease's fence.
fn start_deployments(
    config: &Config,
    db: &Db,
    providers: &Providers,
    leader: Option<&Cluster>,
    stopping: &CancellationToken,
) -> Deployments {
    let fence = leader.and_then(|cluster| {
        Some(store::cluster::Fence {
            name: crate::cluster::LEADER.to_owned(),
            holder: cluster.id(),
            epoch: cluster.leader_epoch()?,
        })
    });
    Deployments::fenced(
        db.clone(),
        providers.clone(),
        Bus::new(BUS_CAPACITY, stopping.clone()),
        config.deploy.clone(),
        stopping.clone(),
        fence,
    )
}

/// The repositories, reading through providers and installing through
/// deployments, their credentials sealed, with the syncs an earlier run
/// left recovered.
async fn start_repositories(
    config: &Config,
    db: &Db,
    providers: &Providers,
    deployments: &Deployments,
    secret_key: SecretKey,
    stopping: &CancellationToken,
    notifier: Option<&Notifier>,
) -> anyhow::Result<Repositories> {
    let repositories = Repositories::new(
        db.clone(),
        repository_settings(config, providers, deployments, secret_key),
        bus(stopping, notifier, Message::Sync),
        stopping.clone(),
    );
    let sealed = repositories
        .seal_stored()
        .await
        .context("checking the repositories' stored credentials")?;
    if sealed.plain > 0 {
        tracing::info!(
            repositories = sealed.plain,
            "sealed the repository credentials stored in the clear by an earlier version"
        );
    }
    repositories
        .recover_interrupted()
        .await
        .context("recovering interrupted repository syncs")?;
    Ok(repositories)
}

/// The audit log, with its pruning running.
fn start_audit(
    config: &Config,
    db: &Db,
    stopping: &CancellationToken,
    notifier: Option<&Notifier>,
) -> Audit {
    let audit = Audit::new(db.clone(), bus(stopping, notifier, Message::Audit));
    audit.spawn_pruning(config.audit_retention_days, stopping.clone());
    audit
}

/// An area's bus, ended at shutdown; a leading replica's also tells the
/// other replicas (`notifier`, see `feed`).
fn bus<E: Clone + Send + Sync + 'static>(
    stopping: &CancellationToken,
    notifier: Option<&Notifier>,
    wrap: fn(E) -> Message,
) -> Bus<E> {
    Bus::with_outbound(
        BUS_CAPACITY,
        stopping.clone(),
        notifier.map(|notifier| notifier.outbound(wrap)),
    )
}

/// `[repository]`, reading through `providers` and installing through
/// `deployments`, its credentials sealed with `secret_key`.
pub(super) fn repository_settings(
    config: &Config,
    providers: &Providers,
    deployments: &Deployments,
    secret_key: SecretKey,
) -> crate::repository::RepositorySettings {
    let mut settings = config.repository.clone();
    settings.providers = ProviderSources(Some(Arc::new(providers.clone())));
    settings.installations = InstallationsHandle(Some(Arc::new(deployments.clone())));
    settings.secret_key = Some(Arc::new(secret_key));
    settings
}
