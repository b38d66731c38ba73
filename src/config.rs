//! Typed configuration. Sources, highest precedence first: command-line flags,
//! `CORBEL_*` environment variables (both through clap), the optional TOML file,
//! then the embedded defaults. The result is one [`Config`] the rest of the server
//! reads; nothing else looks at the environment.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A value that must never be printed: `Debug` and `Serialize` show it redacted.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself; call only where it is used, never to log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("<redacted>")
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Pretty,
    Json,
}

/// Limits on what one GraphQL request may ask for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GraphqlLimits {
    /// Deepest selection nesting accepted.
    pub max_depth: usize,
    /// Highest query complexity (one per field, by default) accepted.
    pub max_complexity: usize,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
}

impl Default for GraphqlLimits {
    fn default() -> Self {
        Self {
            max_depth: 16,
            max_complexity: 2_000,
            max_body_bytes: 1024 * 1024,
        }
    }
}

/// The effective configuration of one server.
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// `None` means the embedded default, SQLite in the data directory.
    pub database_url: Option<Secret>,
    pub log_format: LogFormat,
    pub log_filter: String,
    pub graphql: GraphqlLimits,
    /// Taken as the admin's token instead of making one (`CORBEL_ADMIN_TOKEN`).
    pub admin_token: Option<Secret>,
    /// How long a session token from `login` stays valid.
    #[serde(with = "seconds")]
    pub session_ttl: Duration,
    /// How long shutdown waits for open websocket streams to finish.
    #[serde(with = "seconds")]
    pub shutdown_grace: Duration,
    /// Largest `inventory.json` a repository sync accepts, in bytes.
    pub repo_max_inventory_bytes: u64,
    /// Largest element manifest accepted, in bytes.
    pub repo_max_manifest_bytes: usize,
    /// Deadline of each request to a repository's source.
    #[serde(with = "seconds")]
    pub repo_http_timeout: Duration,
    /// How often due repository refreshes are looked for, in milliseconds.
    pub repo_refresh_check_ms: u64,
    /// Provider git URL schemes allowed (`file` covers local paths).
    pub provider_git_schemes: Vec<String>,
    /// Whether provider fetches update git submodules.
    pub provider_git_submodules: bool,
    /// Deadline of a provider's git fetch, in seconds.
    pub provider_fetch_timeout_seconds: u64,
    /// Deadline of a provider's build command, in seconds.
    pub provider_build_timeout_seconds: u64,
    /// How long a started provider has to register, in seconds.
    pub provider_start_timeout_seconds: u64,
    /// Deadline of each call to a provider, in milliseconds.
    pub provider_call_timeout_ms: u64,
    /// Between SIGTERM and SIGKILL when stopping a provider, in milliseconds.
    pub provider_stop_grace_ms: u64,
    /// How often a provider's health is checked, in milliseconds.
    pub provider_health_interval_ms: u64,
    /// First restart delay of a crashed provider, in milliseconds; it doubles.
    pub provider_backoff_initial_ms: u64,
    /// Longest restart delay, in milliseconds.
    pub provider_backoff_max_ms: u64,
    /// Providers fetched and built at once.
    pub provider_load_concurrency: usize,
    /// Provider calls in flight at once per deployment.
    pub deploy_concurrency: usize,
    /// How often expired deployment leases are looked for, in milliseconds.
    pub deploy_reaper_interval_ms: u64,
    /// How long a deploy step waits for its provider to connect, in milliseconds.
    pub deploy_provider_wait_ms: u64,
}

/// Optional settings as a TOML file or the command line gives them; `None` means
/// "not said here", so the next source down decides.
#[derive(Clone, Debug, Default, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct Overrides {
    /// Address to serve HTTP on.
    #[arg(long, env = "CORBEL_LISTEN", global = true)]
    pub listen: Option<SocketAddr>,
    /// Directory for the database and everything Corbel keeps on disk.
    #[arg(long, env = "CORBEL_DATA_DIR", global = true)]
    pub data_dir: Option<PathBuf>,
    /// `sqlite://…` or `postgres://…`; default: SQLite in the data directory.
    #[arg(
        long,
        env = "CORBEL_DATABASE_URL",
        global = true,
        hide_env_values = true
    )]
    pub database_url: Option<String>,
    /// Log format.
    #[arg(long, env = "CORBEL_LOG_FORMAT", global = true, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log filter, in `tracing` `EnvFilter` syntax (e.g. `info,corbel=debug`).
    #[arg(long, env = "CORBEL_LOG", global = true)]
    pub log_filter: Option<String>,
    /// Deepest GraphQL selection nesting accepted.
    #[arg(long, env = "CORBEL_GRAPHQL_MAX_DEPTH", global = true)]
    pub graphql_max_depth: Option<usize>,
    /// Highest GraphQL query complexity accepted.
    #[arg(long, env = "CORBEL_GRAPHQL_MAX_COMPLEXITY", global = true)]
    pub graphql_max_complexity: Option<usize>,
    /// Largest GraphQL request body, in bytes.
    #[arg(long, env = "CORBEL_GRAPHQL_MAX_BODY_BYTES", global = true)]
    pub graphql_max_body_bytes: Option<usize>,
    /// The admin's token, instead of a generated one.
    #[arg(
        long,
        env = "CORBEL_ADMIN_TOKEN",
        global = true,
        hide_env_values = true
    )]
    pub admin_token: Option<String>,
    /// Lifetime of a login session, in seconds.
    #[arg(long, env = "CORBEL_SESSION_TTL_SECONDS", global = true)]
    pub session_ttl_seconds: Option<u64>,
    /// How long shutdown waits for websocket streams, in seconds.
    #[arg(long, env = "CORBEL_SHUTDOWN_GRACE_SECONDS", global = true)]
    pub shutdown_grace_seconds: Option<u64>,
    /// Largest repository inventory accepted, in bytes.
    #[arg(long, env = "CORBEL_REPO_MAX_INVENTORY_BYTES", global = true)]
    pub repo_max_inventory_bytes: Option<u64>,
    /// Largest element manifest accepted, in bytes.
    #[arg(long, env = "CORBEL_REPO_MAX_MANIFEST_BYTES", global = true)]
    pub repo_max_manifest_bytes: Option<usize>,
    /// Deadline of each request to a repository source, in seconds.
    #[arg(long, env = "CORBEL_REPO_HTTP_TIMEOUT_SECONDS", global = true)]
    pub repo_http_timeout_seconds: Option<u64>,
    /// How often due repository refreshes are looked for, in milliseconds.
    #[arg(long, env = "CORBEL_REPO_REFRESH_CHECK_MS", global = true)]
    pub repo_refresh_check_ms: Option<u64>,
    /// Provider git URL schemes allowed, comma-separated (`file` covers local paths).
    #[arg(
        long,
        env = "CORBEL_PROVIDER_GIT_SCHEMES",
        global = true,
        value_delimiter = ','
    )]
    pub provider_git_schemes: Option<Vec<String>>,
    /// Update git submodules when fetching providers.
    #[arg(long, env = "CORBEL_PROVIDER_GIT_SUBMODULES", global = true)]
    pub provider_git_submodules: Option<bool>,
    /// Deadline of a provider's git fetch, in seconds.
    #[arg(long, env = "CORBEL_PROVIDER_FETCH_TIMEOUT_SECONDS", global = true)]
    pub provider_fetch_timeout_seconds: Option<u64>,
    /// Deadline of a provider's build command, in seconds.
    #[arg(long, env = "CORBEL_PROVIDER_BUILD_TIMEOUT_SECONDS", global = true)]
    pub provider_build_timeout_seconds: Option<u64>,
    /// How long a started provider has to register, in seconds.
    #[arg(long, env = "CORBEL_PROVIDER_START_TIMEOUT_SECONDS", global = true)]
    pub provider_start_timeout_seconds: Option<u64>,
    /// Deadline of each call to a provider, in milliseconds.
    #[arg(long, env = "CORBEL_PROVIDER_CALL_TIMEOUT_MS", global = true)]
    pub provider_call_timeout_ms: Option<u64>,
    /// Between SIGTERM and SIGKILL when stopping a provider, in milliseconds.
    #[arg(long, env = "CORBEL_PROVIDER_STOP_GRACE_MS", global = true)]
    pub provider_stop_grace_ms: Option<u64>,
    /// How often a provider's health is checked, in milliseconds.
    #[arg(long, env = "CORBEL_PROVIDER_HEALTH_INTERVAL_MS", global = true)]
    pub provider_health_interval_ms: Option<u64>,
    /// First restart delay of a crashed provider, in milliseconds.
    #[arg(long, env = "CORBEL_PROVIDER_BACKOFF_INITIAL_MS", global = true)]
    pub provider_backoff_initial_ms: Option<u64>,
    /// Longest restart delay of a crashed provider, in milliseconds.
    #[arg(long, env = "CORBEL_PROVIDER_BACKOFF_MAX_MS", global = true)]
    pub provider_backoff_max_ms: Option<u64>,
    /// Providers fetched and built at once.
    #[arg(long, env = "CORBEL_PROVIDER_LOAD_CONCURRENCY", global = true)]
    pub provider_load_concurrency: Option<usize>,
    /// Provider calls in flight at once per deployment.
    #[arg(long, env = "CORBEL_DEPLOY_CONCURRENCY", global = true)]
    pub deploy_concurrency: Option<usize>,
    /// How often expired deployment leases are looked for, in milliseconds.
    #[arg(long, env = "CORBEL_DEPLOY_REAPER_INTERVAL_MS", global = true)]
    pub deploy_reaper_interval_ms: Option<u64>,
    /// How long a deploy step waits for its provider to connect, in milliseconds.
    #[arg(long, env = "CORBEL_DEPLOY_PROVIDER_WAIT_MS", global = true)]
    pub deploy_provider_wait_ms: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid database URL: {0}")]
    DatabaseUrl(String),
}

impl Config {
    /// Merges `flags` (which clap has already filled from the environment) over the
    /// optional TOML file over the defaults.
    pub fn load(flags: &Overrides, file: Option<&Path>) -> Result<Self, ConfigError> {
        let from_file = match file {
            Some(path) => read_file(path)?,
            None => Overrides::default(),
        };
        let pick = flags.clone().or(from_file);
        let defaults = GraphqlLimits::default();
        let config = Config {
            listen: pick
                .listen
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8080))),
            data_dir: pick
                .data_dir
                .unwrap_or_else(|| PathBuf::from("corbel-data")),
            database_url: pick.database_url.map(Secret::new),
            log_format: pick.log_format.unwrap_or_default(),
            log_filter: pick.log_filter.unwrap_or_else(|| "info".to_owned()),
            graphql: GraphqlLimits {
                max_depth: pick.graphql_max_depth.unwrap_or(defaults.max_depth),
                max_complexity: pick
                    .graphql_max_complexity
                    .unwrap_or(defaults.max_complexity),
                max_body_bytes: pick
                    .graphql_max_body_bytes
                    .unwrap_or(defaults.max_body_bytes),
            },
            admin_token: pick.admin_token.map(Secret::new),
            session_ttl: Duration::from_secs(pick.session_ttl_seconds.unwrap_or(12 * 3600)),
            shutdown_grace: Duration::from_secs(pick.shutdown_grace_seconds.unwrap_or(10)),
            repo_max_inventory_bytes: pick.repo_max_inventory_bytes.unwrap_or(512 * 1024 * 1024),
            repo_max_manifest_bytes: pick.repo_max_manifest_bytes.unwrap_or(1024 * 1024),
            repo_http_timeout: Duration::from_secs(pick.repo_http_timeout_seconds.unwrap_or(30)),
            repo_refresh_check_ms: pick.repo_refresh_check_ms.unwrap_or(5_000).max(10),
            provider_git_schemes: pick.provider_git_schemes.unwrap_or_else(|| {
                ["https", "http", "git", "ssh", "file"]
                    .map(String::from)
                    .to_vec()
            }),
            provider_git_submodules: pick.provider_git_submodules.unwrap_or(false),
            provider_fetch_timeout_seconds: pick
                .provider_fetch_timeout_seconds
                .unwrap_or(300)
                .max(1),
            provider_build_timeout_seconds: pick
                .provider_build_timeout_seconds
                .unwrap_or(1800)
                .max(1),
            provider_start_timeout_seconds: pick
                .provider_start_timeout_seconds
                .unwrap_or(30)
                .max(1),
            provider_call_timeout_ms: pick.provider_call_timeout_ms.unwrap_or(30_000).max(10),
            provider_stop_grace_ms: pick.provider_stop_grace_ms.unwrap_or(5_000),
            provider_health_interval_ms: pick.provider_health_interval_ms.unwrap_or(5_000).max(10),
            provider_backoff_initial_ms: pick.provider_backoff_initial_ms.unwrap_or(500).max(1),
            provider_backoff_max_ms: pick.provider_backoff_max_ms.unwrap_or(60_000).max(1),
            provider_load_concurrency: pick.provider_load_concurrency.unwrap_or(8).max(1),
            deploy_concurrency: pick.deploy_concurrency.unwrap_or(16).max(1),
            deploy_reaper_interval_ms: pick.deploy_reaper_interval_ms.unwrap_or(10_000).max(10),
            deploy_provider_wait_ms: pick.deploy_provider_wait_ms.unwrap_or(60_000),
        };
        config.database()?;
        Ok(config)
    }

    /// Defaults for a server whose data lives in `data_dir`: what tests and
    /// benchmarks start from.
    pub fn for_data_dir(data_dir: impl Into<PathBuf>) -> Self {
        let mut config =
            Self::load(&Overrides::default(), None).expect("the embedded defaults are valid");
        config.data_dir = data_dir.into();
        config
    }

    /// Settings of the repository area.
    pub fn repository_settings(&self) -> crate::repository::RepositorySettings {
        crate::repository::RepositorySettings {
            max_inventory_bytes: self.repo_max_inventory_bytes,
            max_manifest_bytes: self.repo_max_manifest_bytes,
            http_timeout: self.repo_http_timeout,
            refresh_check: Duration::from_millis(self.repo_refresh_check_ms),
            ..Default::default()
        }
    }

    /// Settings of the provider area. The data directory is made absolute:
    /// providers run in other directories and get socket paths from it.
    pub fn provider_settings(&self) -> std::io::Result<crate::provider::ProviderSettings> {
        let data_dir = std::path::absolute(&self.data_dir)?;
        Ok(crate::provider::ProviderSettings {
            data_dir,
            git_schemes: self.provider_git_schemes.clone(),
            git_submodules: self.provider_git_submodules,
            fetch_timeout: Duration::from_secs(self.provider_fetch_timeout_seconds),
            build_timeout: Duration::from_secs(self.provider_build_timeout_seconds),
            start_timeout: Duration::from_secs(self.provider_start_timeout_seconds),
            call_timeout: Duration::from_millis(self.provider_call_timeout_ms),
            stop_grace: Duration::from_millis(self.provider_stop_grace_ms),
            health_interval: Duration::from_millis(self.provider_health_interval_ms),
            backoff_initial: Duration::from_millis(self.provider_backoff_initial_ms),
            backoff_max: Duration::from_millis(self.provider_backoff_max_ms),
            load_concurrency: self.provider_load_concurrency,
            log_lines: 2_000,
        })
    }

    /// Settings of the deployment engine.
    pub fn deploy_settings(&self) -> crate::deploy::DeploySettings {
        crate::deploy::DeploySettings {
            concurrency: self.deploy_concurrency,
            reaper_interval: Duration::from_millis(self.deploy_reaper_interval_ms),
            provider_wait: Duration::from_millis(self.deploy_provider_wait_ms),
        }
    }

    /// The database this configuration points at.
    pub fn database(&self) -> Result<DatabaseLocation, ConfigError> {
        match &self.database_url {
            None => Ok(DatabaseLocation::Sqlite(self.data_dir.join("corbel.db"))),
            Some(url) => DatabaseLocation::parse(url.expose()),
        }
    }

    /// The configuration as TOML, secrets redacted: what `corbel config` prints.
    pub fn to_redacted_toml(&self) -> String {
        let mut shown = toml::Table::new();
        let value = toml::Value::try_from(self).expect("the config serialises");
        if let toml::Value::Table(table) = value {
            shown = table;
        }
        if let Ok(location) = self.database() {
            shown.insert(
                "database_url".into(),
                toml::Value::String(location.redacted()),
            );
        }
        toml::to_string_pretty(&shown).expect("a table serialises")
    }
}

impl Overrides {
    /// Each setting from `self`, else from `other`.
    fn or(self, other: Overrides) -> Overrides {
        Overrides {
            listen: self.listen.or(other.listen),
            data_dir: self.data_dir.or(other.data_dir),
            database_url: self.database_url.or(other.database_url),
            log_format: self.log_format.or(other.log_format),
            log_filter: self.log_filter.or(other.log_filter),
            graphql_max_depth: self.graphql_max_depth.or(other.graphql_max_depth),
            graphql_max_complexity: self.graphql_max_complexity.or(other.graphql_max_complexity),
            graphql_max_body_bytes: self.graphql_max_body_bytes.or(other.graphql_max_body_bytes),
            admin_token: self.admin_token.or(other.admin_token),
            session_ttl_seconds: self.session_ttl_seconds.or(other.session_ttl_seconds),
            shutdown_grace_seconds: self.shutdown_grace_seconds.or(other.shutdown_grace_seconds),
            repo_max_inventory_bytes: self
                .repo_max_inventory_bytes
                .or(other.repo_max_inventory_bytes),
            repo_max_manifest_bytes: self
                .repo_max_manifest_bytes
                .or(other.repo_max_manifest_bytes),
            repo_http_timeout_seconds: self
                .repo_http_timeout_seconds
                .or(other.repo_http_timeout_seconds),
            repo_refresh_check_ms: self.repo_refresh_check_ms.or(other.repo_refresh_check_ms),
            provider_git_schemes: self.provider_git_schemes.or(other.provider_git_schemes),
            provider_git_submodules: self
                .provider_git_submodules
                .or(other.provider_git_submodules),
            provider_fetch_timeout_seconds: self
                .provider_fetch_timeout_seconds
                .or(other.provider_fetch_timeout_seconds),
            provider_build_timeout_seconds: self
                .provider_build_timeout_seconds
                .or(other.provider_build_timeout_seconds),
            provider_start_timeout_seconds: self
                .provider_start_timeout_seconds
                .or(other.provider_start_timeout_seconds),
            provider_call_timeout_ms: self
                .provider_call_timeout_ms
                .or(other.provider_call_timeout_ms),
            provider_stop_grace_ms: self.provider_stop_grace_ms.or(other.provider_stop_grace_ms),
            provider_health_interval_ms: self
                .provider_health_interval_ms
                .or(other.provider_health_interval_ms),
            provider_backoff_initial_ms: self
                .provider_backoff_initial_ms
                .or(other.provider_backoff_initial_ms),
            provider_backoff_max_ms: self
                .provider_backoff_max_ms
                .or(other.provider_backoff_max_ms),
            provider_load_concurrency: self
                .provider_load_concurrency
                .or(other.provider_load_concurrency),
            deploy_concurrency: self.deploy_concurrency.or(other.deploy_concurrency),
            deploy_reaper_interval_ms: self
                .deploy_reaper_interval_ms
                .or(other.deploy_reaper_interval_ms),
            deploy_provider_wait_ms: self
                .deploy_provider_wait_ms
                .or(other.deploy_provider_wait_ms),
        }
    }
}

fn read_file(path: &Path) -> Result<Overrides, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// Where the store lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatabaseLocation {
    Sqlite(PathBuf),
    Postgres(url::Url),
}

impl DatabaseLocation {
    pub fn parse(raw: &str) -> Result<Self, ConfigError> {
        let url = url::Url::parse(raw).map_err(|e| {
            // The raw text may hold a password: name the problem, not the value.
            ConfigError::DatabaseUrl(format!("not a URL ({e})"))
        })?;
        match url.scheme() {
            "sqlite" => {
                let path = raw
                    .trim_start_matches("sqlite://")
                    .trim_start_matches("sqlite:");
                let path = path.split('?').next().unwrap_or_default();
                if path.is_empty() {
                    return Err(ConfigError::DatabaseUrl(
                        "sqlite URL names no file (sqlite://PATH)".into(),
                    ));
                }
                Ok(Self::Sqlite(PathBuf::from(path)))
            }
            "postgres" | "postgresql" => {
                if url.host_str().is_none_or(str::is_empty) {
                    return Err(ConfigError::DatabaseUrl(
                        "postgres URL names no host".into(),
                    ));
                }
                Ok(Self::Postgres(url))
            }
            other => Err(ConfigError::DatabaseUrl(format!(
                "unsupported scheme `{other}` (use sqlite:// or postgres://)"
            ))),
        }
    }

    /// `"sqlite"` or `"postgres"`, as `serverInfo.database` reports it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => "sqlite",
            Self::Postgres(_) => "postgres",
        }
    }

    /// The URL sea-orm connects with (it holds the password, if any).
    pub fn connect_url(&self) -> String {
        match self {
            Self::Sqlite(path) => format!("sqlite://{}?mode=rwc", path.display()),
            Self::Postgres(url) => url.to_string(),
        }
    }

    /// The location without credentials, fit for logs and `corbel config`.
    pub fn redacted(&self) -> String {
        match self {
            Self::Sqlite(path) => format!("sqlite://{}", path.display()),
            Self::Postgres(url) => {
                let mut url = url.clone();
                if url.password().is_some() {
                    let _ = url.set_password(Some("<redacted>"));
                }
                url.to_string()
            }
        }
    }

    /// What identifies the store itself, independent of credentials and of how a
    /// replica spells a relative path: hashed into `serverInfo.instanceId`, so
    /// replicas on one store share it.
    pub fn identity(&self) -> String {
        match self {
            Self::Sqlite(path) => {
                let absolute = std::path::absolute(path).unwrap_or_else(|_| path.clone());
                format!("sqlite:{}", absolute.display())
            }
            Self::Postgres(url) => format!(
                "postgres:{}:{}{}",
                url.host_str().unwrap_or_default(),
                url.port().unwrap_or(5432),
                url.path()
            ),
        }
    }
}

mod seconds {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_file_and_defaults_fill_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("corbel.toml");
        std::fs::write(
            &file,
            "listen = \"127.0.0.1:9000\"\ndata_dir = \"/srv/corbel\"\nlog_format = \"json\"\n",
        )
        .unwrap();
        let flags = Overrides {
            listen: Some("127.0.0.1:9100".parse().unwrap()),
            ..Default::default()
        };
        let config = Config::load(&flags, Some(&file)).unwrap();
        assert_eq!(config.listen.port(), 9100);
        assert_eq!(config.data_dir, PathBuf::from("/srv/corbel"));
        assert_eq!(config.log_format, LogFormat::Json);
        assert_eq!(config.graphql, GraphqlLimits::default());
    }

    #[test]
    fn unknown_file_keys_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("corbel.toml");
        std::fs::write(&file, "lisen = \"127.0.0.1:9000\"\n").unwrap();
        let err = Config::load(&Overrides::default(), Some(&file)).unwrap_err();
        assert!(err.to_string().contains("lisen"), "{err}");
    }

    #[test]
    fn secrets_are_redacted_in_printed_config() {
        let flags = Overrides {
            database_url: Some("postgres://corbel:hunter2@127.0.0.1:5432/corbel".into()),
            admin_token: Some("tok-s3cret".into()),
            ..Default::default()
        };
        let config = Config::load(&flags, None).unwrap();
        let shown = config.to_redacted_toml();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("tok-s3cret"), "{shown}");
        assert!(shown.contains("127.0.0.1:5432/corbel"), "{shown}");
        assert!(!format!("{config:?}").contains("hunter2"));
    }

    #[test]
    fn database_urls_are_checked() {
        assert!(DatabaseLocation::parse("mysql://x/y").is_err());
        assert!(DatabaseLocation::parse("not a url").is_err());
        let pg = DatabaseLocation::parse("postgres://u:p@db.example:6543/c").unwrap();
        assert_eq!(pg.identity(), "postgres:db.example:6543/c");
        let other_creds = DatabaseLocation::parse("postgres://v:q@db.example:6543/c").unwrap();
        assert_eq!(pg.identity(), other_creds.identity());
    }
}
