//! Every `corbel::config::Config` setting the suite shares, in one place: the
//! tests' fast timings (and their environment form for the real binary). A
//! test that needs a one-off value sets it inline on top of these.

use corbel::config::Config;

use super::ADMIN_TOKEN;

/// Fast timings for tests; the defaults suit production.
pub fn quick(config: &mut Config) {
    config.provider.start_timeout = std::time::Duration::from_secs(20);
    config.provider.call_timeout = std::time::Duration::from_millis(10_000);
    config.provider.health_interval = std::time::Duration::from_millis(200);
    config.provider.backoff_initial = std::time::Duration::from_millis(50);
    config.provider.backoff_max = std::time::Duration::from_millis(1_000);
    config.provider.stop_grace = std::time::Duration::from_millis(3_000);
}

/// Expired leases are reaped within a tenth of a second.
pub fn fast_reaper(config: &mut Config) {
    config.deploy.reaper_interval = std::time::Duration::from_millis(100);
}

/// The real binary's environment: `quick`'s timings.
pub const QUICK_ENV: [(&str, &str); 7] = [
    ("CORBEL_ADMIN_TOKEN", ADMIN_TOKEN),
    ("CORBEL_PROVIDER_START_TIMEOUT_SECONDS", "20"),
    ("CORBEL_PROVIDER_CALL_TIMEOUT_MS", "10000"),
    ("CORBEL_PROVIDER_HEALTH_INTERVAL_MS", "200"),
    ("CORBEL_PROVIDER_BACKOFF_INITIAL_MS", "50"),
    ("CORBEL_PROVIDER_BACKOFF_MAX_MS", "1000"),
    ("CORBEL_PROVIDER_STOP_GRACE_MS", "3000"),
];
