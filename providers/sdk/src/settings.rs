//! Where a provider finds Corbel, who it is, and how long it waits: read from
//! the environment Corbel sets, or built by hand in tests.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::SdkError;

/// The registry's address: `unix:///abs/path.sock` or `http://127.0.0.1:PORT`.
pub const ENV_REGISTRY: &str = "CORBEL_REGISTRY";
/// The provider's id in Corbel.
pub const ENV_PROVIDER_ID: &str = "CORBEL_PROVIDER_ID";
/// The secret proving the id; never logged.
pub const ENV_PROVIDER_TOKEN: &str = "CORBEL_PROVIDER_TOKEN";
/// The directory the provider's socket goes in.
pub const ENV_SOCKET_DIR: &str = "CORBEL_SOCKET_DIR";
/// The provider's own directory for what it must remember across restarts
/// (see [`Records`](crate::records::Records)); it outlives the provider.
pub const ENV_STATE_DIR: &str = "CORBEL_STATE_DIR";
/// A remote provider's certificate (a PEM file, from Corbel's
/// `issueProviderCertificate`): setting it makes the provider remote. It
/// registers over mutual TLS at an `https://` `CORBEL_REGISTRY` and serves
/// over TLS on TCP (`CORBEL_PROVIDER_LISTEN`) instead of a unix socket.
pub const ENV_TLS_CERT: &str = "CORBEL_TLS_CERT";
/// The private key of `CORBEL_TLS_CERT` (a PEM file).
pub const ENV_TLS_KEY: &str = "CORBEL_TLS_KEY";
/// The CA both sides trust (a PEM file).
pub const ENV_TLS_CA: &str = "CORBEL_TLS_CA";
/// Where a remote provider serves (`host:port`).
pub const ENV_LISTEN: &str = "CORBEL_PROVIDER_LISTEN";
/// How Corbel reaches a remote provider (`https://host:port`); unset, the
/// listen address (which must then not be a wildcard).
pub const ENV_ENDPOINT: &str = "CORBEL_PROVIDER_ENDPOINT";
/// The name the registry's certificate must carry.
pub const REGISTRY_TLS_NAME: &str = "registry.corbel";
/// Every variable Corbel sets for a provider, and those a remote provider is
/// given. They are the provider's alone:
/// [`ProviderEnv::take`](crate::ProviderEnv::take) (called by [`run`](crate::run)
/// and [`serve`](crate::serve)) removes them from the process environment, so
/// nothing the provider starts can register as the provider or write to its state.
pub const PROVIDER_ENV: [&str; 10] = [
    ENV_REGISTRY,
    ENV_PROVIDER_ID,
    ENV_PROVIDER_TOKEN,
    ENV_SOCKET_DIR,
    ENV_STATE_DIR,
    ENV_TLS_CERT,
    ENV_TLS_KEY,
    ENV_TLS_CA,
    ENV_LISTEN,
    ENV_ENDPOINT,
];

/// How a remote provider registers and serves: mutual TLS with certificates
/// from Corbel's provider CA.
#[derive(Clone)]
pub struct Remote {
    /// This provider's certificate (PEM), naming it.
    pub certificate: String,
    /// Its private key (PEM). Kept out of `Debug`.
    pub key: String,
    /// The CA (PEM) the registry's certificate and Corbel's client
    /// certificate come from.
    pub ca: String,
    /// Where the provider serves.
    pub listen: SocketAddr,
    /// What it tells Corbel to dial: `https://host:port`.
    pub endpoint: String,
}

/// Everything [`serve_with`](crate::serve_with) needs to know.
#[derive(Clone)]
pub struct Settings {
    /// The registry's address: `unix:///abs/path.sock` or `http://host:port`.
    pub registry: String,
    /// The provider's id; also names its socket, `<socket_dir>/<id>.sock`.
    pub provider_id: String,
    /// The registration secret. Kept out of `Debug`.
    pub token: String,
    /// The directory the provider's socket is created in (created if missing).
    pub socket_dir: PathBuf,
    /// Deadline of every call to the registry (connect, handshake, register).
    pub call_timeout: Duration,
    /// Deadline of the goodbye `Unregister`: short, a stopping provider must not linger.
    pub unregister_timeout: Duration,
    /// How long in-flight calls may finish once the provider stops serving.
    pub shutdown_grace: Duration,
    /// The protocol versions offered in `Handshake`: every one this SDK speaks
    /// ([`SUPPORTED_VERSIONS`](crate::SUPPORTED_VERSIONS)) unless narrowed,
    /// e.g. to `[1]` to behave as a provider that predates version 2.
    pub protocol_versions: Vec<u32>,
    /// Set for a provider on another host (`CORBEL_TLS_*`): it registers and
    /// serves over mutual TLS, and `socket_dir` is unused.
    pub remote: Option<Remote>,
}

impl Settings {
    /// Settings with the default deadlines (10 s calls, 2 s unregister, 2 s grace).
    pub fn new(
        registry: impl Into<String>,
        provider_id: impl Into<String>,
        token: impl Into<String>,
        socket_dir: impl Into<PathBuf>,
    ) -> Self {
        Settings {
            registry: registry.into(),
            provider_id: provider_id.into(),
            token: token.into(),
            socket_dir: socket_dir.into(),
            call_timeout: Duration::from_secs(10),
            unregister_timeout: Duration::from_secs(2),
            shutdown_grace: Duration::from_secs(2),
            protocol_versions: corbel_proto::SUPPORTED_VERSIONS.to_vec(),
            remote: None,
        }
    }

    /// Reads `CORBEL_REGISTRY`, `CORBEL_PROVIDER_ID`, `CORBEL_PROVIDER_TOKEN` and
    /// `CORBEL_SOCKET_DIR` as [`ProviderEnv::take`](crate::ProviderEnv::take)
    /// took them (taking them now if nothing did before). A missing one is an
    /// error naming it.
    pub fn from_env() -> Result<Self, SdkError> {
        crate::ProviderEnv::take().settings()
    }

    /// Like [`from_env`](Self::from_env) with the variables looked up by `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, SdkError> {
        let var = |name: &'static str| {
            lookup(name)
                .filter(|value| !value.is_empty())
                .ok_or(SdkError::MissingEnv(name))
        };
        let (registry, id, token) = (
            var(ENV_REGISTRY)?,
            var(ENV_PROVIDER_ID)?,
            var(ENV_PROVIDER_TOKEN)?,
        );
        let remote = match lookup(ENV_TLS_CERT).filter(|v| !v.is_empty()) {
            Some(_) => Some(Self::remote_from(&var)?),
            None => None,
        };
        let socket_dir = match remote {
            Some(_) => lookup(ENV_SOCKET_DIR).unwrap_or_default(),
            None => var(ENV_SOCKET_DIR)?,
        };
        let mut settings = Settings::new(registry, id, token, socket_dir);
        settings.remote = remote;
        settings.validate()?;
        Ok(settings)
    }

    /// The `CORBEL_TLS_*` files read, and where to serve.
    fn remote_from(
        var: &impl Fn(&'static str) -> Result<String, SdkError>,
    ) -> Result<Remote, SdkError> {
        let file = |name: &'static str| -> Result<String, SdkError> {
            let path = var(name)?;
            std::fs::read_to_string(&path).map_err(|e| SdkError::InvalidEnv {
                name,
                reason: format!("cannot read {path}: {e}"),
            })
        };
        let listen_text = var(ENV_LISTEN)?;
        let listen: SocketAddr = listen_text.parse().map_err(|_| SdkError::InvalidEnv {
            name: ENV_LISTEN,
            reason: format!("{listen_text:?} is not host:port (an IP address and a port)"),
        })?;
        let endpoint = match var(ENV_ENDPOINT) {
            Ok(endpoint) => endpoint,
            Err(_) if listen.ip().is_unspecified() => {
                return Err(SdkError::InvalidEnv {
                    name: ENV_ENDPOINT,
                    reason: format!(
                        "must be set when {ENV_LISTEN} is a wildcard ({listen}): say how Corbel reaches this host"
                    ),
                });
            }
            Err(_) => format!("https://{listen}"),
        };
        Ok(Remote {
            certificate: file(ENV_TLS_CERT)?,
            key: file(ENV_TLS_KEY)?,
            ca: file(ENV_TLS_CA)?,
            listen,
            endpoint,
        })
    }

    /// Checks the values a typo would break, so the error names the variable.
    pub fn validate(&self) -> Result<(), SdkError> {
        if let Some(remote) = &self.remote {
            if !self.registry.starts_with("https://") {
                return Err(SdkError::InvalidEnv {
                    name: ENV_REGISTRY,
                    reason: format!(
                        "{:?}: a remote provider (CORBEL_TLS_CERT set) registers at https://host:port",
                        self.registry
                    ),
                });
            }
            if !remote.endpoint.starts_with("https://") {
                return Err(SdkError::InvalidEnv {
                    name: ENV_ENDPOINT,
                    reason: format!("{:?} is not https://host:port", remote.endpoint),
                });
            }
            return self.validate_id();
        }
        let registry_ok = match self.registry.strip_prefix("unix://") {
            Some(path) => path.starts_with('/'),
            None => self.registry.strip_prefix("http://").is_some_and(|rest| {
                ["127.0.0.1:", "[::1]:", "localhost:"]
                    .iter()
                    .any(|host| rest.starts_with(host))
            }),
        };
        if !registry_ok {
            return Err(SdkError::InvalidEnv {
                name: ENV_REGISTRY,
                reason: format!(
                    "{:?} is neither unix:///absolute/path.sock nor http://127.0.0.1:port; \
                     a registry on another host is reached over TLS (set CORBEL_TLS_CERT, \
                     CORBEL_TLS_KEY, CORBEL_TLS_CA and an https:// address)",
                    self.registry
                ),
            });
        }
        self.validate_id()
    }

    fn validate_id(&self) -> Result<(), SdkError> {
        let id = &self.provider_id;
        if id.is_empty() || id.contains('/') || id == "." || id == ".." {
            return Err(SdkError::InvalidEnv {
                name: ENV_PROVIDER_ID,
                reason: format!("{id:?} cannot name a socket file"),
            });
        }
        Ok(())
    }

    /// The socket this provider serves on: `<socket_dir>/<provider_id>.sock`.
    pub fn socket_path(&self) -> PathBuf {
        self.socket_dir.join(format!("{}.sock", self.provider_id))
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("registry", &self.registry)
            .field("provider_id", &self.provider_id)
            .field("token", &"<redacted>")
            .field("socket_dir", &self.socket_dir)
            .field("call_timeout", &self.call_timeout)
            .field("unregister_timeout", &self.unregister_timeout)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("protocol_versions", &self.protocol_versions)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    const FULL: &[(&str, &str)] = &[
        (ENV_REGISTRY, "unix:///run/corbel/registry.sock"),
        (ENV_PROVIDER_ID, "p1"),
        (ENV_PROVIDER_TOKEN, "s3cret"),
        (ENV_SOCKET_DIR, "/run/corbel/providers"),
    ];

    #[test]
    fn every_missing_variable_is_named() {
        for missing in [
            ENV_REGISTRY,
            ENV_PROVIDER_ID,
            ENV_PROVIDER_TOKEN,
            ENV_SOCKET_DIR,
        ] {
            let pairs: Vec<_> = FULL
                .iter()
                .copied()
                .filter(|(k, _)| *k != missing)
                .collect();
            let err = Settings::from_lookup(env(&pairs)).unwrap_err();
            assert!(err.to_string().contains(missing), "{err}");
            assert_eq!(err.exit_code(), 2);
        }
    }

    #[test]
    fn the_token_stays_out_of_debug_and_the_socket_is_named_by_id() {
        let settings = Settings::from_lookup(env(FULL)).unwrap();
        assert!(!format!("{settings:?}").contains("s3cret"));
        assert_eq!(
            settings.socket_path(),
            PathBuf::from("/run/corbel/providers/p1.sock")
        );
    }

    #[test]
    fn a_remote_provider_reads_its_tls_files_and_says_where_it_is_reached() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["cert.pem", "key.pem", "ca.pem"] {
            std::fs::write(dir.path().join(name), format!("PEM of {name}")).unwrap();
        }
        let file = |name: &str| dir.path().join(name).display().to_string();
        let remote = |listen: &str, endpoint: Option<&str>, key: &str| {
            let mut pairs = vec![
                (
                    ENV_REGISTRY.to_owned(),
                    "https://corbel.example:7443".to_owned(),
                ),
                (ENV_PROVIDER_ID.to_owned(), "p1".to_owned()),
                (ENV_PROVIDER_TOKEN.to_owned(), "s3cret".to_owned()),
                (ENV_TLS_CERT.to_owned(), file("cert.pem")),
                (ENV_TLS_KEY.to_owned(), file(key)),
                (ENV_TLS_CA.to_owned(), file("ca.pem")),
                (ENV_LISTEN.to_owned(), listen.to_owned()),
            ];
            if let Some(endpoint) = endpoint {
                pairs.push((ENV_ENDPOINT.to_owned(), endpoint.to_owned()));
            }
            let map: HashMap<String, String> = pairs.into_iter().collect();
            Settings::from_lookup(move |name| map.get(name).cloned())
        };
        // No socket directory is needed; the endpoint defaults to the address.
        let settings = remote("10.0.0.5:7444", None, "key.pem").unwrap();
        let tls = settings.remote.as_ref().unwrap();
        assert_eq!(tls.endpoint, "https://10.0.0.5:7444");
        assert_eq!(tls.key, "PEM of key.pem");
        // A wildcard says nothing of how Corbel reaches it.
        let err = remote("0.0.0.0:7444", None, "key.pem").unwrap_err();
        assert!(err.to_string().contains(ENV_ENDPOINT), "{err}");
        let given = remote(
            "0.0.0.0:7444",
            Some("https://worker.example:7444"),
            "key.pem",
        );
        assert_eq!(
            given.unwrap().remote.unwrap().endpoint,
            "https://worker.example:7444"
        );
        // A file that cannot be read is named with its variable.
        let err = remote("10.0.0.5:7444", None, "missing.pem").unwrap_err();
        assert!(err.to_string().contains(ENV_TLS_KEY), "{err}");
        assert!(err.to_string().contains("missing.pem"), "{err}");
        // A remote provider's registry is https.
        let mut plain = settings.clone();
        plain.registry = "http://corbel.example:7443".to_owned();
        assert!(
            plain
                .validate()
                .unwrap_err()
                .to_string()
                .contains(ENV_REGISTRY)
        );
    }

    #[test]
    fn registry_addresses_are_checked() {
        for (address, ok) in [
            ("unix:///abs.sock", true),
            ("http://127.0.0.1:7000", true),
            ("unix://relative.sock", false),
            // Another host is reached over TLS only.
            ("http://192.0.2.1:7000", false),
            ("https://192.0.2.1:7000", false),
            ("127.0.0.1:7000", false),
        ] {
            let mut pairs = FULL.to_vec();
            pairs[0] = (ENV_REGISTRY, address);
            assert_eq!(Settings::from_lookup(env(&pairs)).is_ok(), ok, "{address}");
        }
    }
}
