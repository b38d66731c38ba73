//! Login rate limits: the `[login]` section of the config file and the
//! `--login-*` flags (`CORBEL_LOGIN_*`). Defaults live in `Default`.

use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::settings::{at_least, seconds};

/// How many failed logins a user name from one address, a client address,
/// and a user name overall may have before `login` refuses them for a while
/// (see `auth::limiter`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoginLimits {
    /// Failed logins in a row for one user name from one address before
    /// each further one waits: `user_refill`, doubling with each failure
    /// (at most 15 minutes).
    pub user_burst: u32,
    /// The first wait of a user name from one address past its burst; and
    /// the time after which the name's ceiling allows one more failure.
    #[serde(rename = "user_refill_seconds", with = "seconds")]
    pub user_refill: Duration,
    /// Failed logins for one user name from all addresses before only the
    /// addresses it signed in from in the last 30 days get in.
    pub user_ceiling: u32,
    /// Failed logins in a row from one address (an IPv6 /64) before it is limited.
    pub address_burst: u32,
    /// One more attempt for a limited address after each of these.
    #[serde(rename = "address_refill_seconds", with = "seconds")]
    pub address_refill: Duration,
    /// Counters kept per kind (user names, addresses): fixed memory, whatever
    /// an attacker sends. Keys share counters by a keyed hash; a key is limited
    /// only when both of its counters are exhausted.
    pub tracked: usize,
    /// Proxies (exact addresses) whose `X-Forwarded-For` names the client.
    /// Empty: the peer address is the client, and the header is ignored.
    pub trusted_proxies: Vec<IpAddr>,
}

impl Default for LoginLimits {
    fn default() -> Self {
        Self {
            user_burst: 10,
            user_refill: Duration::from_secs(30),
            user_ceiling: 100,
            address_burst: 30,
            address_refill: Duration::from_secs(5),
            tracked: 16_384,
            trusted_proxies: Vec::new(),
        }
    }
}

impl LoginLimits {
    pub fn bounded(self) -> Self {
        Self {
            user_burst: at_least(self.user_burst, 1),
            user_refill: at_least(self.user_refill, Duration::from_secs(1)),
            user_ceiling: at_least(self.user_ceiling, 1),
            address_burst: at_least(self.address_burst, 1),
            address_refill: at_least(self.address_refill, Duration::from_secs(1)),
            tracked: self.tracked.clamp(16, 1 << 22),
            ..self
        }
    }
}

/// The `--login-*` flags; each overrides its key of `[login]`.
#[derive(Clone, Debug, Default, Serialize, clap::Args)]
pub struct LoginFlags {
    /// Failed logins in a row for one user name from one address before
    /// each further one waits longer.
    #[arg(
        long = "login-user-burst",
        env = "CORBEL_LOGIN_USER_BURST",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_burst: Option<u32>,
    /// Seconds of the first wait of a limited user name from one address.
    #[arg(
        long = "login-user-refill-seconds",
        env = "CORBEL_LOGIN_USER_REFILL_SECONDS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_refill_seconds: Option<u64>,
    /// Failed logins for one user name from all addresses before only
    /// addresses it signed in from get in.
    #[arg(
        long = "login-user-ceiling",
        env = "CORBEL_LOGIN_USER_CEILING",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_ceiling: Option<u32>,
    /// Failed logins in a row from one address before it is limited.
    #[arg(
        long = "login-address-burst",
        env = "CORBEL_LOGIN_ADDRESS_BURST",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address_burst: Option<u32>,
    /// Seconds after which a limited address gets one more attempt.
    #[arg(
        long = "login-address-refill-seconds",
        env = "CORBEL_LOGIN_ADDRESS_REFILL_SECONDS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address_refill_seconds: Option<u64>,
    /// Proxy addresses whose X-Forwarded-For header names the client
    /// (comma-separated in the environment).
    #[arg(
        long = "login-trusted-proxy",
        env = "CORBEL_LOGIN_TRUSTED_PROXIES",
        value_delimiter = ',',
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trusted_proxies: Option<Vec<IpAddr>>,
}
