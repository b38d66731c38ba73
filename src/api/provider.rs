//! Providers in the API: create, load, unload, configure, and watch them.
//! The registration token is shown once (on create and on rotation); secret
//! configuration values are never shown, only their names.

use async_graphql::{
    ComplexObject, Context, Enum, ID, InputObject, Json, Object, SimpleObject, Subscription,
};
use chrono::{DateTime, Utc};
use futures_util::{Stream, StreamExt};

use super::pagination::{Page, paginate};
use super::{ApiError, parse_id, principal, state};
use crate::deploy::Deployments;
use crate::events::Delivery;
use crate::provider::{self as domain, Providers};

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
pub enum ProviderStatus {
    Unloaded,
    Fetching,
    Building,
    Starting,
    Registering,
    Connected,
    Disconnected,
    Failed,
    Unloading,
}

impl From<domain::ProviderStatus> for ProviderStatus {
    fn from(s: domain::ProviderStatus) -> Self {
        match s {
            domain::ProviderStatus::Unloaded => ProviderStatus::Unloaded,
            domain::ProviderStatus::Fetching => ProviderStatus::Fetching,
            domain::ProviderStatus::Building => ProviderStatus::Building,
            domain::ProviderStatus::Starting => ProviderStatus::Starting,
            domain::ProviderStatus::Registering => ProviderStatus::Registering,
            domain::ProviderStatus::Connected => ProviderStatus::Connected,
            domain::ProviderStatus::Disconnected => ProviderStatus::Disconnected,
            domain::ProviderStatus::Failed => ProviderStatus::Failed,
            domain::ProviderStatus::Unloading => ProviderStatus::Unloading,
        }
    }
}

/// What the provider's `corbel-provider.yaml` says.
#[derive(SimpleObject)]
pub struct ProviderMetadata {
    name: String,
    description: String,
    version: String,
    author: Option<String>,
    /// `shell` or `docker`.
    runtime: String,
    features: Vec<String>,
    resource_types: Vec<String>,
}

#[derive(SimpleObject)]
pub struct ProviderLogLine {
    at: DateTime<Utc>,
    /// `build`, `stdout`, `stderr`, or `corbel` for Corbel's own notes.
    stream: String,
    line: String,
}

impl From<domain::LogLine> for ProviderLogLine {
    fn from(l: domain::LogLine) -> Self {
        ProviderLogLine {
            at: l.at,
            stream: l.stream.as_str().to_owned(),
            line: l.line,
        }
    }
}

#[derive(SimpleObject)]
pub struct ProviderNode {
    name: String,
    /// How many resources of each type (or `*`) the node holds.
    capacity: Json<serde_json::Map<String, serde_json::Value>>,
    /// How many resources of each type it holds now (deployed, or being
    /// deployed or destroyed), and `*`: all of them.
    used: Json<serde_json::Map<String, serde_json::Value>>,
    labels: Json<serde_json::Map<String, serde_json::Value>>,
}

/// Shared: a list of 1,000 nodes on one provider holds one, not 1,000 copies.
#[derive(Clone)]
pub struct Provider(pub(super) std::sync::Arc<domain::Provider>);

#[Object]
impl Provider {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn name(&self) -> &str {
        &self.0.name
    }
    /// Without any credentials the URL may carry.
    async fn git_url(&self) -> &str {
        &self.0.git_url
    }
    /// The tag, branch or commit asked for; empty means the default branch.
    #[graphql(name = "ref")]
    async fn git_ref(&self) -> &str {
        &self.0.git_ref
    }
    /// The directory of the repository holding `corbel-provider.yaml`; empty
    /// is the root.
    async fn path(&self) -> &str {
        &self.0.path
    }
    /// The plain configuration values.
    /// Its plain configuration, shown to anyone signed in (secrets go in
    /// `secretConfig`, never shown).
    async fn config(&self) -> Json<serde_json::Value> {
        Json(self.0.config.clone())
    }
    /// Names of the secret configuration values (never the values).
    async fn secret_config_keys(&self) -> &[String] {
        &self.0.secret_keys
    }
    async fn auto_load(&self) -> bool {
        self.0.auto_load
    }
    /// The user it runs as; empty: the server's.
    async fn run_as(&self) -> &str {
        &self.0.run_as
    }
    async fn status(&self) -> ProviderStatus {
        self.0.status.into()
    }
    async fn status_message(&self) -> Option<&str> {
        self.0.status_message.as_deref()
    }
    /// The commit checked out by the last fetch.
    async fn resolved_commit(&self) -> Option<&str> {
        self.0.resolved_commit.as_deref()
    }
    async fn metadata(&self) -> Option<ProviderMetadata> {
        self.0.metadata.clone().map(|m| ProviderMetadata {
            name: m.name,
            description: m.description,
            version: m.version,
            author: m.author,
            runtime: m.runtime,
            features: m.features,
            resource_types: m.resource_types,
        })
    }
    /// Features announced at registration (unknown ones are dropped).
    async fn features(&self) -> &[String] {
        &self.0.features
    }
    async fn resource_types(&self) -> &[String] {
        &self.0.resource_types
    }
    /// Restarts after the provider exited or stopped answering.
    async fn restarts(&self) -> i32 {
        self.0.restarts
    }
    /// The last successful registration or health check.
    async fn last_seen_at(&self) -> Option<DateTime<Utc>> {
        self.0.last_seen_at
    }
    /// The last lines of build and run output, oldest first.
    async fn logs(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 100, validator(minimum = 0, maximum = 10000))] last: i32,
    ) -> Result<Vec<ProviderLogLine>, ApiError> {
        super::policy::server_admin_only(ctx, "a provider's log")?;
        let lines = state::<Providers>(ctx)?
            .logs(self.0.id, last as usize)
            .await?;
        Ok(lines.into_iter().map(Into::into).collect())
    }
    /// The nodes the provider places resources on, asked of it now
    /// (`PROVIDER_UNAVAILABLE` when it is not connected or does not answer).
    async fn nodes(&self, ctx: &Context<'_>) -> Result<Vec<ProviderNode>, ApiError> {
        let nodes = state::<Providers>(ctx)?.nodes(self.0.id).await?;
        let mut usage = state::<Deployments>(ctx)?
            .queries()
            .node_usage(self.0.id)
            .await?;
        Ok(nodes
            .into_iter()
            .map(|n| ProviderNode {
                used: Json(used_of(usage.remove(&n.name).unwrap_or_default())),
                name: n.name,
                capacity: Json(
                    n.capacity
                        .into_iter()
                        .map(|(k, v)| (k, serde_json::Value::from(v)))
                        .collect(),
                ),
                labels: Json(
                    n.labels
                        .into_iter()
                        .map(|(k, v)| (k, serde_json::Value::from(v)))
                        .collect(),
                ),
            })
            .collect())
    }
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }
    async fn updated_at(&self) -> DateTime<Utc> {
        self.0.updated_at
    }
}

/// A provider with its registration token, shown this once.
#[derive(SimpleObject)]
#[graphql(complex)]
pub struct ProviderWithToken {
    #[graphql(skip)]
    provider: domain::Provider,
    /// Give it to a provider run outside Corbel as `CORBEL_PROVIDER_TOKEN`.
    /// Corbel stores only its hash.
    token: String,
}

#[ComplexObject]
impl ProviderWithToken {
    async fn provider(&self) -> Provider {
        Provider(self.provider.clone().into())
    }
}

#[derive(InputObject)]
pub struct CreateProviderInput {
    name: String,
    /// `https://`, `http://`, `git://`, `ssh://`, `file://` or a local path (as
    /// the server's allowed list says).
    git_url: String,
    /// A tag, branch or commit; empty means the default branch.
    #[graphql(name = "ref", default)]
    git_ref: String,
    /// The directory of the repository holding `corbel-provider.yaml`, for a
    /// provider in a subdirectory (a monorepo); its build and run commands
    /// run there. Empty (the default) is the repository's root.
    #[graphql(default)]
    path: String,
    /// Plain configuration values (a JSON object), shown by the API.
    #[graphql(default_with = "Json(serde_json::json!({}))")]
    config: Json<serde_json::Value>,
    /// Secret configuration values (a JSON object): sent to the provider,
    /// never shown.
    #[graphql(default_with = "Json(serde_json::json!({}))")]
    secret_config: Json<serde_json::Value>,
    /// Load it now and at every server start.
    #[graphql(default = true)]
    auto_load: bool,
    /// Run it (and what it starts) as this user of the host, with its own
    /// state and socket directories and none of the server's files; the
    /// server must run as root. Empty (the default): the server's user.
    #[graphql(default)]
    run_as: String,
}

#[derive(InputObject)]
pub struct UpdateProviderInput {
    name: Option<String>,
    git_url: Option<String>,
    #[graphql(name = "ref")]
    git_ref: Option<String>,
    path: Option<String>,
    auto_load: Option<bool>,
    /// The user to run it as from its next load; empty: the server's.
    run_as: Option<String>,
}

#[derive(Default)]
pub struct ProviderQuery;

#[Object]
impl ProviderQuery {
    async fn providers(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Page<Provider>, ApiError> {
        principal(ctx)?;
        let all = state::<Providers>(ctx)?.list().await?;
        paginate(
            all.into_iter().map(|p| Provider(p.into())).collect(),
            first,
            after,
        )
    }

    async fn provider(&self, ctx: &Context<'_>, id: ID) -> Result<Provider, ApiError> {
        principal(ctx)?;
        let provider = state::<Providers>(ctx)?.get(parse_id(&id, "id")?).await?;
        Ok(Provider(provider.into()))
    }
}

#[derive(Default)]
pub struct ProviderMutation;

#[Object]
impl ProviderMutation {
    /// Creates a provider; with `autoLoad` (the default) it starts loading at
    /// once. The registration token is in the answer, this once.
    async fn create_provider(
        &self,
        ctx: &Context<'_>,
        input: CreateProviderInput,
    ) -> Result<ProviderWithToken, ApiError> {
        principal(ctx)?;
        let (provider, token) = state::<Providers>(ctx)?
            .create(domain::NewProvider {
                name: input.name,
                git_url: input.git_url,
                git_ref: input.git_ref,
                path: input.path,
                config: input.config.0,
                secret_config: input.secret_config.0,
                auto_load: input.auto_load,
                run_as: input.run_as,
            })
            .await?;
        Ok(ProviderWithToken { provider, token })
    }

    /// Changes where the provider comes from; it takes effect at the next load.
    async fn update_provider(
        &self,
        ctx: &Context<'_>,
        id: ID,
        input: UpdateProviderInput,
    ) -> Result<Provider, ApiError> {
        principal(ctx)?;
        let provider = state::<Providers>(ctx)?
            .update(
                parse_id(&id, "id")?,
                domain::ProviderPatch {
                    name: input.name,
                    git_url: input.git_url,
                    git_ref: input.git_ref,
                    path: input.path,
                    auto_load: input.auto_load,
                    run_as: input.run_as,
                },
            )
            .await?;
        Ok(Provider(provider.into()))
    }

    /// Deletes a provider; refused (`CONFLICT`) while it is loaded or while
    /// deployments hold resources on it.
    async fn delete_provider(&self, ctx: &Context<'_>, id: ID) -> Result<bool, ApiError> {
        principal(ctx)?;
        state::<Providers>(ctx)?
            .delete(parse_id(&id, "id")?)
            .await?;
        Ok(true)
    }

    /// Fetches, builds and starts the provider in the background; follow it
    /// with `providerEvents` or its `status`.
    async fn load_provider(&self, ctx: &Context<'_>, id: ID) -> Result<Provider, ApiError> {
        principal(ctx)?;
        let provider = state::<Providers>(ctx)?.load(parse_id(&id, "id")?).await?;
        Ok(Provider(provider.into()))
    }

    /// Stops the provider (SIGTERM, then SIGKILL after the grace period) and
    /// answers once it has stopped.
    async fn unload_provider(&self, ctx: &Context<'_>, id: ID) -> Result<Provider, ApiError> {
        principal(ctx)?;
        let provider = state::<Providers>(ctx)?
            .unload(parse_id(&id, "id")?)
            .await?;
        Ok(Provider(provider.into()))
    }

    /// Replaces the configuration. A connected provider gets it at once and it
    /// is stored only if the provider takes it; `secretConfig` left out keeps
    /// the secret values.
    async fn configure_provider(
        &self,
        ctx: &Context<'_>,
        id: ID,
        config: Json<serde_json::Value>,
        secret_config: Option<Json<serde_json::Value>>,
    ) -> Result<Provider, ApiError> {
        principal(ctx)?;
        let provider = state::<Providers>(ctx)?
            .configure(parse_id(&id, "id")?, config.0, secret_config.map(|j| j.0))
            .await?;
        Ok(Provider(provider.into()))
    }

    /// A new registration token; the old one stops working at once.
    async fn rotate_provider_token(
        &self,
        ctx: &Context<'_>,
        id: ID,
    ) -> Result<ProviderWithToken, ApiError> {
        principal(ctx)?;
        let (provider, token) = state::<Providers>(ctx)?
            .rotate_token(parse_id(&id, "id")?)
            .await?;
        Ok(ProviderWithToken { provider, token })
    }

    /// A certificate and key for a remote provider (`runtime: remote`) to
    /// register with over mutual TLS, and serve with. The key is shown this
    /// once and not kept; asking again issues another. Refused unless the
    /// server listens for remote providers (`--provider-listen`).
    async fn issue_provider_certificate(
        &self,
        ctx: &Context<'_>,
        id: ID,
    ) -> Result<ProviderCertificate, ApiError> {
        principal(ctx)?;
        let issued = state::<Providers>(ctx)?
            .issue_certificate(parse_id(&id, "id")?)
            .await?;
        Ok(ProviderCertificate {
            certificate: issued.certificate,
            key: issued.key,
            ca: issued.ca,
            server_name: issued.server_name,
        })
    }
}

/// What a remote provider needs to register over mutual TLS, shown once.
#[derive(SimpleObject)]
pub struct ProviderCertificate {
    /// PEM; names only this provider. Its `CORBEL_TLS_CERT`.
    certificate: String,
    /// PEM private key of `certificate`, not kept by Corbel. Its `CORBEL_TLS_KEY`.
    key: String,
    /// PEM of the CA both sides trust. Its `CORBEL_TLS_CA`.
    ca: String,
    /// The name in the registry's certificate, which the provider checks.
    server_name: String,
}

/// A provider's status change or output line.
#[derive(SimpleObject)]
pub struct ProviderEvent {
    provider_id: ID,
    /// Set on status changes (and status message updates, such as fetch
    /// progress).
    status: Option<ProviderStatus>,
    message: Option<String>,
    /// Set on output lines.
    log: Option<ProviderLogLine>,
    /// This many events were dropped because the subscriber fell behind.
    missed: Option<u64>,
}

#[derive(Default)]
pub struct ProviderSubscription;

#[Subscription]
impl ProviderSubscription {
    /// One provider's status changes and output lines: first its status now,
    /// then every change and line as it happens.
    async fn provider_events(
        &self,
        ctx: &Context<'_>,
        id: ID,
    ) -> Result<impl Stream<Item = ProviderEvent> + use<>, ApiError> {
        principal(ctx)?;
        let wanted = parse_id(&id, "id")?;
        // Subscribe before reading the status, so nothing falls in between.
        let live = state::<Providers>(ctx)?.events().subscribe();
        let now = state::<Providers>(ctx)?.get(wanted).await?;
        let first = ProviderEvent {
            provider_id: ID(wanted.to_string()),
            status: Some(now.status.into()),
            message: now.status_message,
            log: None,
            missed: None,
        };
        let live = live.filter_map(move |delivery| {
            let event = match delivery {
                Delivery::Lagged(missed) => Some(ProviderEvent {
                    provider_id: ID(wanted.to_string()),
                    status: None,
                    message: None,
                    log: None,
                    missed: Some(missed),
                }),
                Delivery::Event(event) => match &*event {
                    domain::ProviderEvent::Status {
                        provider_id,
                        status,
                        message,
                    } if *provider_id == wanted => Some(ProviderEvent {
                        provider_id: ID(provider_id.to_string()),
                        status: Some((*status).into()),
                        message: message.clone(),
                        log: None,
                        missed: None,
                    }),
                    domain::ProviderEvent::Log { provider_id, line } if *provider_id == wanted => {
                        Some(ProviderEvent {
                            provider_id: ID(provider_id.to_string()),
                            status: None,
                            message: None,
                            log: Some(line.clone().into()),
                            missed: None,
                        })
                    }
                    _ => None,
                },
            };
            std::future::ready(event)
        });
        Ok(futures_util::stream::once(std::future::ready(first)).chain(live))
    }
}

/// A node's counts by type, and `*`: their sum.
fn used_of(
    by_type: std::collections::HashMap<String, i64>,
) -> serde_json::Map<String, serde_json::Value> {
    let all: i64 = by_type.values().sum();
    let mut used: serde_json::Map<String, serde_json::Value> = by_type
        .into_iter()
        .map(|(kind, count)| (kind, count.into()))
        .collect();
    used.insert("*".to_owned(), all.into());
    used
}
