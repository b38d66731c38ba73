//! The repository area's settings: the `[repository]` section of the config
//! file and the `--repo-*` flags (`CORBEL_REPO_*`). Defaults live in `Default`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::driver::ProviderSources;
use super::installations::InstallationsHandle;
use crate::settings::{at_least, millis, seconds};

/// Limits and timings of repository work.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RepositorySettings {
    /// Largest `inventory.json` a sync accepts, in bytes.
    pub max_inventory_bytes: u64,
    /// Largest element manifest accepted, in bytes.
    pub max_manifest_bytes: usize,
    /// Idle deadline of each request to a repository's source: connecting,
    /// and each wait for more of a body.
    #[serde(rename = "http_timeout_seconds", with = "seconds")]
    pub http_timeout: Duration,
    /// Total deadline of one sync, every request in it included, and of each
    /// artifact download from a source: a source that trickles bytes cannot
    /// hold a sync (or a download) longer.
    #[serde(rename = "sync_deadline_seconds", with = "seconds")]
    pub sync_deadline: Duration,
    /// The pace a body from a source must keep, in bytes a second over each
    /// window of `stall_timeout`: a trickle fails with that reason.
    pub min_bytes_per_second: u64,
    /// The window over which `min_bytes_per_second` is judged.
    #[serde(rename = "stall_timeout_seconds", with = "seconds")]
    pub stall_timeout: Duration,
    /// How often due refreshes are looked for.
    #[serde(rename = "refresh_check_ms", with = "millis")]
    pub refresh_check: Duration,
    /// How many manifests a COPY sync fetches at once.
    #[serde(skip)]
    pub fetch_concurrency: usize,
    /// The provider host, for repositories read through providers (wired by
    /// the app, not configured).
    #[serde(skip)]
    pub providers: ProviderSources,
    /// The deployment engine, which runs installed elements' blueprints (wired
    /// by the app, not configured).
    #[serde(skip)]
    pub installations: InstallationsHandle,
    /// The server's secret key, which seals drivers with credentials (wired
    /// by the app, not configured).
    #[serde(skip)]
    pub secret_key: Option<std::sync::Arc<crate::seal::SecretKey>>,
}

impl Default for RepositorySettings {
    fn default() -> Self {
        Self {
            max_inventory_bytes: 512 * 1024 * 1024,
            max_manifest_bytes: 1024 * 1024,
            http_timeout: Duration::from_secs(30),
            sync_deadline: Duration::from_secs(30 * 60),
            min_bytes_per_second: 1024,
            stall_timeout: Duration::from_secs(60),
            refresh_check: Duration::from_secs(5),
            fetch_concurrency: 8,
            providers: ProviderSources::default(),
            installations: InstallationsHandle::default(),
            secret_key: None,
        }
    }
}

impl RepositorySettings {
    /// The settings with every value raised to what keeps the server sane.
    pub fn bounded(self) -> Self {
        Self {
            refresh_check: at_least(self.refresh_check, Duration::from_millis(10)),
            sync_deadline: at_least(self.sync_deadline, Duration::from_secs(1)),
            stall_timeout: at_least(self.stall_timeout, Duration::from_secs(1)),
            ..self
        }
    }
}

/// The `--repo-*` flags; each overrides its key of `[repository]`.
#[derive(Clone, Debug, Default, Serialize, clap::Args)]
pub struct RepositoryFlags {
    /// Largest repository inventory accepted, in bytes.
    #[arg(
        long = "repo-max-inventory-bytes",
        env = "CORBEL_REPO_MAX_INVENTORY_BYTES",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_inventory_bytes: Option<u64>,
    /// Largest element manifest accepted, in bytes.
    #[arg(
        long = "repo-max-manifest-bytes",
        env = "CORBEL_REPO_MAX_MANIFEST_BYTES",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_manifest_bytes: Option<usize>,
    /// Deadline of each request to a repository source, in seconds.
    #[arg(
        long = "repo-http-timeout-seconds",
        env = "CORBEL_REPO_HTTP_TIMEOUT_SECONDS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_timeout_seconds: Option<u64>,
    /// Total deadline of one repository sync (and of one artifact download
    /// from a source), in seconds.
    #[arg(
        long = "repo-sync-deadline-seconds",
        env = "CORBEL_REPO_SYNC_DEADLINE_SECONDS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_deadline_seconds: Option<u64>,
    /// The pace a body from a repository source must keep, in bytes a
    /// second (0: none).
    #[arg(
        long = "repo-min-bytes-per-second",
        env = "CORBEL_REPO_MIN_BYTES_PER_SECOND",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_bytes_per_second: Option<u64>,
    /// The window over which that pace is judged, in seconds.
    #[arg(
        long = "repo-stall-timeout-seconds",
        env = "CORBEL_REPO_STALL_TIMEOUT_SECONDS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stall_timeout_seconds: Option<u64>,
    /// How often due repository refreshes are looked for, in milliseconds.
    #[arg(
        long = "repo-refresh-check-ms",
        env = "CORBEL_REPO_REFRESH_CHECK_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refresh_check_ms: Option<u64>,
}
