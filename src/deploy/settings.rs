//! The deployment engine's settings: the `[deploy]` section of the config file
//! and the `--deploy-*` flags (`CORBEL_DEPLOY_*`). Defaults live in `Default`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::settings::{at_least, millis};

/// How the engine runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeploySettings {
    /// Provider calls in flight at once, per deployment.
    pub concurrency: usize,
    /// How often expired leases are looked for.
    #[serde(rename = "reaper_interval_ms", with = "millis")]
    pub reaper_interval: Duration,
    /// How long a step waits for its provider to (re)connect before failing:
    /// a provider restarting after a crash, or loading after a server restart,
    /// delays the work rather than failing it.
    #[serde(rename = "provider_wait_ms", with = "millis")]
    pub provider_wait: Duration,
    /// How often the resources of a provider that cannot watch them
    /// (protocol 1 or 2, or no `watch` feature) are inspected.
    #[serde(rename = "health_poll_interval_ms", with = "millis")]
    pub health_poll_interval: Duration,
    /// How long a provider may be not connected before its resources turn
    /// `UNKNOWN`.
    #[serde(rename = "health_grace_ms", with = "millis")]
    pub health_grace: Duration,
    /// Deployment events older than this many days are deleted (hourly, in
    /// batches); 0 keeps them all.
    pub event_retention_days: u32,
}

impl Default for DeploySettings {
    fn default() -> Self {
        Self {
            concurrency: 16,
            reaper_interval: Duration::from_secs(10),
            provider_wait: Duration::from_secs(60),
            health_poll_interval: Duration::from_secs(10),
            health_grace: Duration::from_secs(30),
            event_retention_days: 90,
        }
    }
}

impl DeploySettings {
    /// The settings with every value raised to what keeps the engine sane.
    pub fn bounded(self) -> Self {
        Self {
            concurrency: at_least(self.concurrency, 1),
            reaper_interval: at_least(self.reaper_interval, Duration::from_millis(10)),
            health_poll_interval: at_least(self.health_poll_interval, Duration::from_millis(50)),
            ..self
        }
    }
}

/// The `--deploy-*` flags; each overrides its key of `[deploy]`.
#[derive(Clone, Debug, Default, Serialize, clap::Args)]
pub struct DeployFlags {
    /// Provider calls in flight at once per deployment.
    #[arg(
        long = "deploy-concurrency",
        env = "CORBEL_DEPLOY_CONCURRENCY",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<usize>,
    /// How often expired deployment leases are looked for, in milliseconds.
    #[arg(
        long = "deploy-reaper-interval-ms",
        env = "CORBEL_DEPLOY_REAPER_INTERVAL_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reaper_interval_ms: Option<u64>,
    /// How long a deploy step waits for its provider to connect, in milliseconds.
    #[arg(
        long = "deploy-provider-wait-ms",
        env = "CORBEL_DEPLOY_PROVIDER_WAIT_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_wait_ms: Option<u64>,
    /// How often resources of providers that cannot watch are inspected, in
    /// milliseconds.
    #[arg(
        long = "deploy-health-poll-interval-ms",
        env = "CORBEL_DEPLOY_HEALTH_POLL_INTERVAL_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_poll_interval_ms: Option<u64>,
    /// How long a provider may be not connected before its resources turn
    /// UNKNOWN, in milliseconds.
    #[arg(
        long = "deploy-health-grace-ms",
        env = "CORBEL_DEPLOY_HEALTH_GRACE_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_grace_ms: Option<u64>,
    /// Days deployment events are kept (0 keeps them all).
    #[arg(
        long = "deploy-event-retention-days",
        env = "CORBEL_DEPLOY_EVENT_RETENTION_DAYS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_retention_days: Option<u32>,
}
