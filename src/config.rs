//! Typed configuration. Sources, highest precedence first: command-line flags,
//! `CORBEL_*` environment variables (both through clap), the optional TOML file,
//! then the embedded defaults. The result is one [`Config`] the rest of the server
//! reads; nothing else looks at the environment.
//!
//! This module only assembles: each area owns its settings (their `Default` is
//! the one place a default is written) and its flags, and has a `[section]` of
//! the file named after it. `corbel config` prints exactly what `--config` reads.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::api::{ApiFlags, ApiLimits, GraphqlFlags, GraphqlLimits};
use crate::auth::{LoginFlags, LoginLimits};
use crate::cluster::{ClusterFlags, ClusterSettings};
use crate::deploy::{DeployFlags, DeploySettings};
use crate::provider::{ProviderFlags, ProviderSettings};
use crate::repository::{RepositoryFlags, RepositorySettings};
use crate::seal::{KeyFileError, SecretKey};
use crate::secret::Secret;
use crate::settings::seconds;
use crate::store::{DatabaseLocation, InvalidDatabaseUrl};
use crate::telemetry::LogFormat;

/// The effective configuration of one server.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to serve HTTP on.
    pub listen: SocketAddr,
    /// Directory for the database and everything Corbel keeps on disk.
    pub data_dir: PathBuf,
    /// `None` means the embedded default, SQLite in the data directory.
    pub database_url: Option<Secret>,
    pub log_format: LogFormat,
    /// In `tracing` `EnvFilter` syntax (e.g. `info,corbel=debug`).
    pub log_filter: String,
    /// Taken as the admin's token instead of making one (`CORBEL_ADMIN_TOKEN`).
    pub admin_token: Option<Secret>,
    /// The file holding the key that seals providers' `secretConfig` at rest;
    /// `None` means `secret.key` in the data directory, made at first start.
    pub secret_key_file: Option<PathBuf>,
    /// How long a session token from `login` stays valid.
    #[serde(rename = "session_ttl_seconds", with = "seconds")]
    pub session_ttl: Duration,
    /// How long shutdown waits for open websocket streams to finish.
    #[serde(rename = "shutdown_grace_seconds", with = "seconds")]
    pub shutdown_grace: Duration,
    /// How many days the audit log keeps an entry; 0 keeps them all.
    pub audit_retention_days: u32,
    pub graphql: GraphqlLimits,
    pub api: ApiLimits,
    pub login: LoginLimits,
    pub repository: RepositorySettings,
    pub provider: ProviderSettings,
    pub deploy: DeploySettings,
    pub cluster: ClusterSettings,
    /// The file this was read from, if any: it may hold secrets (the
    /// database password, the admin token), so providers are kept out of it.
    #[serde(skip)]
    pub file: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_dir: PathBuf::from("corbel-data"),
            database_url: None,
            log_format: LogFormat::default(),
            log_filter: "info".to_owned(),
            admin_token: None,
            secret_key_file: None,
            session_ttl: Duration::from_secs(12 * 3600),
            shutdown_grace: Duration::from_secs(10),
            audit_retention_days: 90,
            graphql: GraphqlLimits::default(),
            api: ApiLimits::default(),
            login: LoginLimits::default(),
            repository: RepositorySettings::default(),
            provider: ProviderSettings::default(),
            deploy: DeploySettings::default(),
            cluster: ClusterSettings::default(),
            file: None,
        }
    }
}

/// Settings given on the command line or in `CORBEL_*` variables; `None` means
/// "not said here", so the file or the default decides. Each area's flags are
/// its own (`--provider-*`, `--deploy-*`, `--repo-*`, `--graphql-*`,
/// `--login-*`).
#[derive(Clone, Debug, Default, Serialize, clap::Args)]
pub struct Overrides {
    /// Address to serve HTTP on.
    #[arg(long, env = "CORBEL_LISTEN", global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Directory for the database and everything Corbel keeps on disk.
    #[arg(long, env = "CORBEL_DATA_DIR", global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// `sqlite://…` or `postgres://…`.
    #[arg(
        long,
        env = "CORBEL_DATABASE_URL",
        global = true,
        hide_env_values = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database_url: Option<String>,
    /// Log format.
    #[arg(long, env = "CORBEL_LOG_FORMAT", global = true, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
    /// Log filter, in `tracing` `EnvFilter` syntax (e.g. `info,corbel=debug`).
    #[arg(long, env = "CORBEL_LOG", global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_filter: Option<String>,
    /// The admin's token, instead of a generated one.
    #[arg(
        long,
        env = "CORBEL_ADMIN_TOKEN",
        global = true,
        hide_env_values = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token: Option<String>,
    /// The key file that seals secrets at rest (64 hex characters, mode
    /// 0600).
    #[arg(long, env = "CORBEL_SECRET_KEY_FILE", global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_key_file: Option<PathBuf>,
    /// Lifetime of a login session, in seconds.
    #[arg(long, env = "CORBEL_SESSION_TTL_SECONDS", global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_ttl_seconds: Option<u64>,
    /// How long shutdown waits for websocket streams, in seconds.
    #[arg(long, env = "CORBEL_SHUTDOWN_GRACE_SECONDS", global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_seconds: Option<u64>,
    /// How many days the audit log keeps an entry (0 keeps them all).
    #[arg(long, env = "CORBEL_AUDIT_RETENTION_DAYS", global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit_retention_days: Option<u32>,
    #[command(flatten)]
    pub graphql: GraphqlFlags,
    #[command(flatten)]
    pub api: ApiFlags,
    #[command(flatten)]
    pub login: LoginFlags,
    #[command(flatten)]
    pub repository: RepositoryFlags,
    #[command(flatten)]
    pub provider: ProviderFlags,
    #[command(flatten)]
    pub deploy: DeployFlags,
    #[command(flatten)]
    pub cluster: ClusterFlags,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {} does not exist (named by --config or CORBEL_CONFIG)", path.display())]
    Missing { path: PathBuf },
    // The cause is the error's source, not in its text: printed as a chain,
    // it would otherwise show twice.
    #[error("cannot read config file {}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("invalid setting: {0}")]
    Flags(String),
    #[error(transparent)]
    DatabaseUrl(#[from] InvalidDatabaseUrl),
}

impl Config {
    /// Merges `flags` (which clap has already filled from the environment) over the
    /// optional TOML file over the defaults.
    pub fn load(flags: &Overrides, file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut table = match file {
            Some(path) => read_file(path)?,
            None => toml::Table::new(),
        };
        let given = toml::Table::try_from(flags).map_err(|e| ConfigError::Flags(e.to_string()))?;
        overlay(&mut table, given);
        let config: Config =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| match file {
                    Some(path) => ConfigError::Parse {
                        path: path.to_owned(),
                        message: e.to_string(),
                    },
                    None => ConfigError::Flags(e.to_string()),
                })?;
        let mut config = config.bounded();
        config.file = file.map(Path::to_owned);
        config.cluster.check().map_err(ConfigError::Flags)?;
        let database = config.database()?;
        if config.cluster.enabled
            && !matches!(database, crate::store::DatabaseLocation::Postgres(_))
        {
            return Err(ConfigError::Flags(
                "cluster: replicas share one PostgreSQL database; SQLite allows one server \
                 (set database_url to a postgres:// URL, or leave --cluster off)"
                    .to_owned(),
            ));
        }
        if database.has_redacted_password() {
            return Err(ConfigError::Flags(format!(
                "database_url: the password is `{}`, the placeholder `corbel config` \
                 prints in place of the real one: fill in the real password",
                crate::store::REDACTED
            )));
        }
        Ok(config)
    }

    /// Defaults for a server whose data lives in `data_dir`: what tests and
    /// benchmarks start from.
    pub fn for_data_dir(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            ..Self::default()
        }
    }

    fn bounded(self) -> Self {
        Self {
            graphql: self.graphql.bounded(),
            api: self.api.bounded(),
            login: self.login.bounded(),
            repository: self.repository.bounded(),
            provider: self.provider.bounded(),
            deploy: self.deploy.bounded(),
            cluster: self.cluster.bounded(),
            ..self
        }
    }

    /// Settings of the provider area, with the data directory made absolute:
    /// providers run in other directories and get socket paths from it.
    pub fn provider_settings(&self) -> std::io::Result<ProviderSettings> {
        let mut secret_files = self.provider.secret_files.clone();
        for path in self.file.iter().chain(&self.secret_key_file) {
            secret_files.push(std::path::absolute(path)?);
        }
        if let Ok(crate::store::DatabaseLocation::Sqlite(db)) = self.database() {
            let db = std::path::absolute(db)?;
            for suffix in ["-wal", "-shm", "-journal"] {
                let mut side = db.clone().into_os_string();
                side.push(suffix);
                secret_files.push(side.into());
            }
            secret_files.push(db);
        }
        let data_dir = std::path::absolute(&self.data_dir)?;
        Ok(ProviderSettings {
            socket_root: crate::provider::socket_root_for(&data_dir),
            data_dir,
            state_dir: match &self.provider.state_dir {
                Some(dir) => Some(std::path::absolute(dir)?),
                None => None,
            },
            secret_files,
            ..self.provider.clone()
        })
    }

    /// What this server must share with the other replicas of its
    /// database: its secret key's id (the key is read, or made at a first
    /// start) and the providers' state root.
    pub fn shared_with_replicas(&self) -> anyhow::Result<crate::cluster::Shared> {
        let key = self.secret_key_file().load()?;
        let state_dir = match &self.provider.state_dir {
            Some(dir) => std::path::absolute(dir)?,
            None => std::path::absolute(&self.data_dir)?.join("providers"),
        };
        Ok(crate::cluster::Shared {
            key_id: key.id().to_owned(),
            state_dir: state_dir.display().to_string(),
        })
    }

    /// The database this configuration points at.
    pub fn database(&self) -> Result<DatabaseLocation, InvalidDatabaseUrl> {
        match &self.database_url {
            None => Ok(DatabaseLocation::Sqlite(self.data_dir.join("corbel.db"))),
            Some(url) => DatabaseLocation::parse(url.expose()),
        }
    }

    /// Where the secret key is: the file given, or `secret.key` in the data
    /// directory.
    pub fn secret_key_file(&self) -> SecretKeyFile {
        match &self.secret_key_file {
            Some(path) => SecretKeyFile {
                path: path.clone(),
                given: true,
            },
            None => SecretKeyFile {
                path: self.data_dir.join("secret.key"),
                given: false,
            },
        }
    }

    /// The configuration as TOML, secrets redacted: what `corbel config` prints,
    /// in the shape `--config` reads, with the file's key names. A secret is
    /// never printed: the admin token is left out, and the database password
    /// is shown as `***`, which [`Config::load`] refuses, so a printed file is
    /// never taken as holding the real value. The comments at the top say so.
    pub fn to_redacted_toml(&self) -> String {
        let mut shown = toml::Table::try_from(self).expect("the config serialises");
        let mut notes = vec![
            "# Corbel's effective configuration (`corbel config`), in the form".to_owned(),
            "# `corbel --config FILE` reads.".to_owned(),
        ];
        shown.remove("admin_token");
        shown.remove("database_url");
        match (&self.database_url, self.database()) {
            (Some(_), Ok(location)) => {
                if location.has_password() {
                    notes.push(format!(
                        "# Redacted: the password in database_url shows as `{}`; fill in the \
                         real one\n# (or give it with CORBEL_DATABASE_URL) before using this file.",
                        crate::store::REDACTED
                    ));
                }
                shown.insert(
                    "database_url".into(),
                    toml::Value::String(location.redacted()),
                );
            }
            (None, Ok(location)) => notes.push(format!(
                "# database_url is not set: the database is {}.",
                location.redacted()
            )),
            (_, Err(_)) => {}
        }
        if self.admin_token.is_some() {
            notes.push(
                "# Not printed: admin_token is set; give it again (CORBEL_ADMIN_TOKEN).".to_owned(),
            );
        }
        let mut text = notes.join("\n");
        text.push_str("\n\n");
        text.push_str(&toml::to_string_pretty(&shown).expect("a table serialises"));
        text
    }
}

/// The secret key file of a configuration.
#[derive(Clone, Debug)]
pub struct SecretKeyFile {
    pub path: PathBuf,
    /// Named by `--secret-key-file`: it must exist. Otherwise it is the data
    /// directory's, made at first start.
    pub given: bool,
}

impl SecretKeyFile {
    /// Reads the key; the data directory's is made (mode 0600) if absent.
    pub fn load(&self) -> Result<SecretKey, KeyFileError> {
        if self.given {
            return SecretKey::load(&self.path);
        }
        let (key, made) = SecretKey::load_or_create(&self.path)?;
        if made {
            tracing::info!(
                path = %self.path.display(),
                key.id = key.id(),
                "made a new secret key file; back it up: without it the providers' \
                 secretConfig cannot be read"
            );
        }
        Ok(key)
    }
}

/// `over`'s keys replace `base`'s; tables (the areas' sections) merge key by key.
fn overlay(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(inner)), toml::Value::Table(more)) => overlay(inner, more),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => ConfigError::Missing {
            path: path.to_owned(),
        },
        _ => ConfigError::Read {
            path: path.to_owned(),
            source,
        },
    })?;
    text.parse::<toml::Table>().map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })
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
    fn the_advertised_url_is_an_http_url_with_a_host() {
        let with = |url: &str| {
            let flags = Overrides {
                cluster: ClusterFlags {
                    advertise_url: Some(url.to_owned()),
                    ..Default::default()
                },
                ..Default::default()
            };
            Config::load(&flags, None).map(|c| c.cluster.advertise_url)
        };
        assert_eq!(
            with("https://corbel-2.example:8443").unwrap().as_deref(),
            Some("https://corbel-2.example:8443")
        );
        for (bad, said) in [
            ("corbel-2:8080", "must be an http:// or https:// URL"),
            ("not a url", "is not a URL"),
            ("ftp://host", "must be an http:// or https:// URL"),
            ("http://u:p@host", "must not hold a user name or password"),
        ] {
            let err = with(bad).unwrap_err().to_string();
            assert!(
                err.contains("advertise_url:") && err.contains(said),
                "{bad}: {err}"
            );
        }
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
    fn a_printed_redacted_password_is_refused_not_used() {
        let flags = Overrides {
            database_url: Some("postgres://corbel:hunter2@127.0.0.1:5432/corbel".into()),
            admin_token: Some("tok-s3cret-long-enough".into()),
            ..Default::default()
        };
        let shown = Config::load(&flags, None).unwrap().to_redacted_toml();
        assert!(
            shown.contains("database_url = \"postgres://corbel:***@127.0.0.1:5432/corbel\""),
            "{shown}"
        );
        assert!(
            shown.contains("# Redacted: the password in database_url"),
            "{shown}"
        );
        assert!(
            shown.contains("# Not printed: admin_token is set"),
            "{shown}"
        );
        assert!(!shown.contains("admin_token ="), "{shown}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("corbel.toml");
        std::fs::write(&file, &shown).unwrap();
        let err = Config::load(&Overrides::default(), Some(&file)).unwrap_err();
        assert!(
            err.to_string().contains("fill in the real password"),
            "{err}"
        );
        // Given the real one, the file is good.
        let flags = Overrides {
            database_url: Some("postgres://corbel:hunter2@127.0.0.1:5432/corbel".into()),
            ..Default::default()
        };
        assert!(Config::load(&flags, Some(&file)).is_ok());
    }

    #[test]
    fn a_missing_config_file_is_one_line_naming_it() {
        let err = Config::load(
            &Overrides::default(),
            Some(Path::new("/nonexistent/corbel.toml")),
        )
        .unwrap_err();
        let chain = format!("{:#}", anyhow::Error::from(err));
        assert_eq!(
            chain,
            "config file /nonexistent/corbel.toml does not exist (named by --config or \
             CORBEL_CONFIG)"
        );
    }

    #[test]
    fn a_section_merges_file_and_flags_key_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("corbel.toml");
        std::fs::write(
            &file,
            "[provider]\ncall_timeout_ms = 2000\nhealth_interval_ms = 700\n[deploy]\nconcurrency = 0\n",
        )
        .unwrap();
        let mut flags = Overrides::default();
        flags.provider.health_interval_ms = Some(300);
        let config = Config::load(&flags, Some(&file)).unwrap();
        assert_eq!(config.provider.call_timeout, Duration::from_millis(2000));
        assert_eq!(config.provider.health_interval, Duration::from_millis(300));
        assert_eq!(
            config.provider.stop_grace,
            ProviderSettings::default().stop_grace
        );
        assert_eq!(config.deploy.concurrency, 1, "raised to its floor");
    }

    #[test]
    fn unknown_keys_in_a_section_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("corbel.toml");
        std::fs::write(&file, "[provider]\ncall_timeout = 5\n").unwrap();
        let err = Config::load(&Overrides::default(), Some(&file)).unwrap_err();
        assert!(err.to_string().contains("call_timeout"), "{err}");
    }

    #[test]
    fn the_printed_config_is_read_back_as_it_was() {
        let mut flags = Overrides::default();
        flags.provider.call_timeout_ms = Some(1234);
        flags.repository.refresh_check_ms = Some(77);
        flags.session_ttl_seconds = Some(60);
        let config = Config::load(&flags, None).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("corbel.toml");
        std::fs::write(&file, config.to_redacted_toml()).unwrap();
        let again = Config::load(&Overrides::default(), Some(&file)).unwrap();
        assert_eq!(again.to_redacted_toml(), config.to_redacted_toml());
        assert_eq!(again.provider, config.provider);
        assert_eq!(again.session_ttl, Duration::from_secs(60));
    }
}
