//! How a container, read from the engine, reads as health: pure, no IO.
//!
//! HEALTHY when it runs (a HEALTHCHECK still `starting` counts as running);
//! DEGRADED when it runs but its HEALTHCHECK fails, or it is paused; DOWN
//! when it exited (with its status, and the signal that killed it when the
//! status says one did), was OOM-killed, or never started.

use bollard::models::{ContainerInspectResponse, ContainerStateStatusEnum, HealthStatusEnum};
use corbel_provider_sdk::proto::{Health, ResourceStatus};

/// The reason of a resource whose thing went away without DestroyResource.
pub const REMOVED: &str = "removed behind the provider's back";
/// The reason of a container the kernel killed for lack of memory.
pub const OOM: &str = "out of memory (OOM-killed)";
/// The longest health check output kept in a reason.
const MAX_REASON: usize = 300;

/// A thing's health as read: what a `ResourceStatus` or an
/// `InspectResponse` carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub health: Health,
    pub reason: String,
    pub exit_code: Option<i32>,
    /// When it became so (ms since the Unix epoch), when the engine says.
    pub since_ms: Option<i64>,
}

impl Observed {
    pub fn healthy() -> Self {
        Observed::new(Health::Healthy, "")
    }

    pub fn new(health: Health, reason: impl Into<String>) -> Self {
        Observed {
            health,
            reason: reason.into(),
            exit_code: None,
            since_ms: None,
        }
    }

    /// DOWN because it exited with `code`, for `reason`.
    pub fn exited(code: i64, reason: impl Into<String>) -> Self {
        Observed {
            exit_code: i32::try_from(code).ok(),
            ..Observed::new(Health::Down, reason)
        }
    }

    /// The status of `resource_id` on a board.
    pub fn status(self, resource_id: &str) -> ResourceStatus {
        ResourceStatus {
            resource_id: resource_id.to_owned(),
            health: self.health as i32,
            reason: self.reason,
            changed_at_unix_ms: self.since_ms.unwrap_or_else(corbel_provider_sdk::now_ms),
            observed_config_json: String::new(),
            synced: false,
            exit_code: self.exit_code,
        }
    }
}

/// The reason of a job's container that exited 0: done, not dead.
pub const COMPLETED: &str = "completed";

/// The health of an inspected container.
pub fn of_container(inspected: &ContainerInspectResponse) -> Observed {
    let state = inspected.state.clone().unwrap_or_default();
    let code = state.exit_code.unwrap_or_default();
    let started = state.started_at.as_deref().and_then(unix_ms);
    let finished = state.finished_at.as_deref().and_then(unix_ms);
    let ended = || {
        let error = state.error.as_deref().unwrap_or_default().trim();
        if state.oom_killed == Some(true) {
            Observed::exited(code, OOM)
        } else if !error.is_empty() {
            Observed::exited(code, format!("failed to start: {}", cut(error)))
        } else {
            Observed::exited(code, exit_reason(code))
        }
    };
    let (observed, since) = match state.status {
        Some(ContainerStateStatusEnum::RUNNING) => {
            let health = state.health.unwrap_or_default();
            match health.status {
                Some(HealthStatusEnum::UNHEALTHY) => {
                    let last = health.log.unwrap_or_default().pop();
                    let output = last.as_ref().and_then(|l| l.output.as_deref());
                    let code = last.as_ref().and_then(|l| l.exit_code);
                    (
                        Observed::new(Health::Degraded, failing_check(output, code)),
                        None,
                    )
                }
                _ => (Observed::healthy(), started),
            }
        }
        Some(ContainerStateStatusEnum::PAUSED) => (Observed::new(Health::Degraded, "paused"), None),
        Some(ContainerStateStatusEnum::RESTARTING) => {
            let mut down = ended();
            down.reason.push_str(", restarting");
            (down, finished)
        }
        Some(ContainerStateStatusEnum::EXITED)
            if code == 0
                && crate::job::is_job(
                    inspected.config.as_ref().and_then(|c| c.labels.as_ref()),
                ) =>
        {
            (Observed::new(Health::Healthy, COMPLETED), finished)
        }
        Some(ContainerStateStatusEnum::EXITED | ContainerStateStatusEnum::DEAD) => {
            (ended(), finished)
        }
        Some(ContainerStateStatusEnum::CREATED) => (
            Observed::new(Health::Down, "created but never started"),
            None,
        ),
        Some(ContainerStateStatusEnum::STOPPING) => (Observed::new(Health::Down, "stopping"), None),
        Some(ContainerStateStatusEnum::REMOVING) => {
            (Observed::new(Health::Down, "being removed"), None)
        }
        Some(ContainerStateStatusEnum::EMPTY) | None => (
            Observed::new(Health::Down, "in no state the engine names"),
            None,
        ),
    };
    Observed {
        since_ms: since,
        ..observed
    }
}

/// DEGRADED's reason: the last line of the last failing check's output.
pub fn failing_check(output: Option<&str>, exit_code: Option<i64>) -> String {
    let line = output
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty());
    match (line, exit_code) {
        (Some(line), _) => format!("health check failing: {}", cut(line)),
        (None, Some(code)) => format!("health check failing (exit status {code})"),
        (None, None) => "health check failing".to_owned(),
    }
}

/// "exited with status 137 (SIGKILL)": a status above 128 names the signal.
pub fn exit_reason(code: i64) -> String {
    match code.checked_sub(128).and_then(signal_name) {
        Some(signal) => format!("exited with status {code} ({signal})"),
        None => format!("exited with status {code}"),
    }
}

fn signal_name(signal: i64) -> Option<&'static str> {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    let index = usize::try_from(signal).ok()?.checked_sub(1)?;
    NAMES.get(index).copied()
}

/// Outside text cut to [`MAX_REASON`] characters.
fn cut(text: &str) -> String {
    match text.char_indices().nth(MAX_REASON) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// An engine's RFC 3339 time (`2026-12-06T08:52:37.588868392Z`, or with an
/// offset) in ms since the Unix epoch; `None` for anything else, and for the
/// engine's "never" (`0001-01-01T00:00:00Z`).
pub fn unix_ms(text: &str) -> Option<i64> {
    let (date, time) = text.split_once('T')?;
    let mut parts = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (parts.next()??, parts.next()??, parts.next()??);
    let zone_at = time.find(['Z', 'z', '+', '-'])?;
    let (clock, zone) = time.split_at(zone_at);
    let (hms, fraction) = clock.split_once('.').unwrap_or((clock, ""));
    let mut hms = hms.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hour, minute, second) = (hms.next()??, hms.next()??, hms.next()??);
    let millis: i64 = format!("{:0<3}", fraction.get(..3).unwrap_or(fraction))
        .parse()
        .ok()?;
    let offset_minutes = match zone {
        "Z" | "z" => 0,
        zone => {
            let sign = if zone.starts_with('-') { -1 } else { 1 };
            let (h, m) = zone[1..].split_once(':')?;
            sign * (h.parse::<i64>().ok()? * 60 + m.parse::<i64>().ok()?)
        }
    };
    if year < 1970 || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Some(seconds * 1000 + millis)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use bollard::models::{ContainerState, Health as EngineHealth, HealthcheckResult};

    use super::*;

    fn container(state: ContainerState) -> ContainerInspectResponse {
        ContainerInspectResponse {
            state: Some(state),
            ..Default::default()
        }
    }

    #[test]
    fn a_status_above_128_names_its_signal() {
        assert_eq!(exit_reason(137), "exited with status 137 (SIGKILL)");
        assert_eq!(exit_reason(143), "exited with status 143 (SIGTERM)");
        assert_eq!(exit_reason(1), "exited with status 1");
        assert_eq!(exit_reason(0), "exited with status 0");
        assert_eq!(exit_reason(200), "exited with status 200");
    }

    #[test]
    fn engine_times_read_as_unix_milliseconds() {
        assert_eq!(unix_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            unix_ms("2026-12-06T08:52:37.588868392Z"),
            Some(1_796_547_157_588)
        );
        assert_eq!(
            unix_ms("2026-12-06T09:52:37.5+01:00"),
            Some(1_796_547_157_500)
        );
        assert_eq!(unix_ms("0001-01-01T00:00:00Z"), None);
        assert_eq!(unix_ms("yesterday"), None);
    }

    #[test]
    fn containers_read_as_health() {
        let running = container(ContainerState {
            status: Some(ContainerStateStatusEnum::RUNNING),
            ..Default::default()
        });
        assert_eq!(of_container(&running).health, Health::Healthy);

        let killed = of_container(&container(ContainerState {
            status: Some(ContainerStateStatusEnum::EXITED),
            exit_code: Some(137),
            ..Default::default()
        }));
        assert_eq!(
            (killed.health, killed.reason.as_str(), killed.exit_code),
            (Health::Down, "exited with status 137 (SIGKILL)", Some(137))
        );

        let oom = of_container(&container(ContainerState {
            status: Some(ContainerStateStatusEnum::EXITED),
            exit_code: Some(137),
            oom_killed: Some(true),
            ..Default::default()
        }));
        assert_eq!((oom.reason.as_str(), oom.exit_code), (OOM, Some(137)));

        let log = |output: &str| HealthcheckResult {
            output: Some(output.to_owned()),
            exit_code: Some(1),
            ..Default::default()
        };
        let unhealthy = of_container(&container(ContainerState {
            status: Some(ContainerStateStatusEnum::RUNNING),
            health: Some(EngineHealth {
                status: Some(HealthStatusEnum::UNHEALTHY),
                log: Some(vec![log("old\n"), log("first\nno answer on :80\n")]),
                ..Default::default()
            }),
            ..Default::default()
        }));
        assert_eq!(
            (unhealthy.health, unhealthy.reason.as_str()),
            (Health::Degraded, "health check failing: no answer on :80")
        );

        let starting = of_container(&container(ContainerState {
            status: Some(ContainerStateStatusEnum::RUNNING),
            health: Some(EngineHealth {
                status: Some(HealthStatusEnum::STARTING),
                ..Default::default()
            }),
            ..Default::default()
        }));
        assert_eq!(starting.health, Health::Healthy);
    }
}
