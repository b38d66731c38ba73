//! Where a provider finds Corbel, who it is, and how long it waits: read from
//! the environment Corbel sets, or built by hand in tests.

use std::fmt;
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
/// Every variable Corbel sets for a provider. They are the provider's alone:
/// [`ProviderEnv::take`](crate::ProviderEnv::take) (called by [`run`](crate::run)
/// and [`serve`](crate::serve)) removes them from the process environment, so
/// nothing the provider starts can register as the provider or write to its state.
pub const PROVIDER_ENV: [&str; 5] = [
    ENV_REGISTRY,
    ENV_PROVIDER_ID,
    ENV_PROVIDER_TOKEN,
    ENV_SOCKET_DIR,
    ENV_STATE_DIR,
];

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
        let settings = Settings::new(
            var(ENV_REGISTRY)?,
            var(ENV_PROVIDER_ID)?,
            var(ENV_PROVIDER_TOKEN)?,
            var(ENV_SOCKET_DIR)?,
        );
        settings.validate()?;
        Ok(settings)
    }

    /// Checks the values a typo would break, so the error names the variable.
    pub fn validate(&self) -> Result<(), SdkError> {
        let registry_ok = self
            .registry
            .strip_prefix("unix://")
            .map(|path| path.starts_with('/'))
            .unwrap_or_else(|| self.registry.starts_with("http://"));
        if !registry_ok {
            return Err(SdkError::InvalidEnv {
                name: ENV_REGISTRY,
                reason: format!(
                    "{:?} is neither unix:///absolute/path.sock nor http://host:port",
                    self.registry
                ),
            });
        }
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
    fn registry_addresses_are_checked() {
        for (address, ok) in [
            ("unix:///abs.sock", true),
            ("http://127.0.0.1:7000", true),
            ("unix://relative.sock", false),
            ("127.0.0.1:7000", false),
        ] {
            let mut pairs = FULL.to_vec();
            pairs[0] = (ENV_REGISTRY, address);
            assert_eq!(Settings::from_lookup(env(&pairs)).is_ok(), ok, "{address}");
        }
    }
}
