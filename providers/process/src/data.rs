//! `RetrieveData` on a service (the "data" feature): its log ("logs") and
//! what `/proc` says of it ("inspect"). Both answer NOT_FOUND for a resource
//! the provider holds no record of (never deployed, or destroyed).

use corbel_provider_sdk::config::{object, present};
use corbel_provider_sdk::proto::{self, Health};
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::{HealthBoard, Status};

use crate::lifecycle::{self, shell_words};
use crate::logs;
use crate::procfs::{self, Liveness};
use crate::state::{Phase, Record};

/// The most lines "logs" returns (Corbel asks for 10,000 at most).
pub const MAX_TAIL_LINES: u64 = 10_000;
/// The most bytes of log "logs" reads, across files.
pub const MAX_TAIL_BYTES: u64 = 1 << 20;
/// Lines "logs" returns when `tail` is not given.
pub const DEFAULT_TAIL_LINES: u64 = 100;

/// Which data of a service a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `{"tail": N}`: its last N lines of output, as `{"logs": "<text>"}`.
    Logs { tail: u64 },
    /// What `/proc` and the board say of it, as an object.
    Inspect,
}

impl Kind {
    /// Reads a request's type and config; INVALID_ARGUMENT naming what is wrong.
    pub fn parse(request: &proto::RetrieveDataRequest) -> Result<Kind, Status> {
        if request.resource.is_none() {
            return Err(Status::invalid_argument(format!(
                "data type `{}`: this provider serves data of a deployed resource only \
                 (`logs`, `inspect`), with `resource` set",
                request.r#type
            )));
        }
        match request.r#type.as_str() {
            "logs" => {
                let config = object(&request.config_json).map_err(Status::invalid_argument)?;
                let tail = match present(&config, "tail") {
                    None => DEFAULT_TAIL_LINES,
                    Some(value) => value.as_u64().ok_or_else(|| {
                        Status::invalid_argument("config.tail: expected a non-negative integer")
                    })?,
                };
                Ok(Kind::Logs {
                    tail: tail.min(MAX_TAIL_LINES),
                })
            }
            "inspect" => Ok(Kind::Inspect),
            other => Err(Status::invalid_argument(format!(
                "data type `{other}`: this provider serves `logs` and `inspect`"
            ))),
        }
    }
}

/// The last `tail` lines of `record`'s service, rotated files included.
pub async fn logs(record: &Record, tail: u64) -> Result<Value, Status> {
    let log = record.log.clone();
    let text = lifecycle::blocking(move || logs::tail(&log, tail as usize, MAX_TAIL_BYTES))
        .await
        .map_err(|e| Status::internal(format!("cannot read the log: {e}")))?;
    Ok(json!({ "logs": text }))
}

/// What `record`'s service is: pid, state, start time (RFC 3339), resident
/// memory, CPU seconds, command and health (the board's, else `/proc`'s).
pub async fn inspect(record: &Record, board: &HealthBoard) -> Value {
    let mut answer = json!({ "command": shell_words(&record.command, &record.args) });
    if let Some(port) = record.port {
        answer["port"] = json!(port);
    }
    let process = match &record.phase {
        Phase::Running(running) => Some((running.pid, running.start_time)),
        Phase::Intent => lifecycle::find_service(&record.resource_id)
            .await
            .map(|found| (found.pid, found.stat.start_time)),
        Phase::Finished(finished) => {
            answer["outputs"] = finished.outputs.clone();
            None
        }
    };
    let alive = match process {
        Some((pid, start_time)) => {
            answer["pid"] = json!(pid);
            process_fields(&mut answer, pid, start_time)
        }
        None => {
            let finished = matches!(record.phase, Phase::Finished(_));
            answer["state"] = json!(if finished { "finished" } else { "not started" });
            false
        }
    };
    let status = board.get(&record.resource_id);
    let (health, reason) = match &status {
        Some(status) => (status.health(), status.reason.clone()),
        None if alive => (Health::Healthy, String::new()),
        None => (Health::Down, "not running".to_string()),
    };
    answer["health"] = json!(health_name(health));
    if !reason.is_empty() {
        answer["reason"] = json!(reason);
    }
    if let Some(code) = status.and_then(|s| s.exit_code) {
        answer["exit_code"] = json!(code);
    }
    answer
}

/// Adds what `/proc` says of `pid` (if it is still the process that
/// started at `start_time`); true if it runs.
fn process_fields(answer: &mut Value, pid: i32, start_time: u64) -> bool {
    let stat = procfs::stat(pid).filter(|s| s.start_time == start_time);
    let Some(stat) = stat else {
        answer["state"] = json!("exited");
        return false;
    };
    let (state, alive) = match stat.state {
        'Z' => ("zombie", false),
        'X' | 'x' => ("exited", false),
        'T' | 't' => ("stopped", true),
        _ => ("running", true),
    };
    answer["state"] = json!(state);
    answer["process_state"] = json!(stat.state.to_string());
    if let Some(started) = procfs::started_at(start_time) {
        answer["started_at"] = json!(rfc3339(started));
    }
    if let Some(usage) = procfs::usage(pid) {
        answer["cpu_seconds"] = json!(usage.cpu_seconds);
        if let Some(rss) = usage.rss_bytes {
            answer["rss_bytes"] = json!(rss);
        }
    }
    alive && procfs::liveness(pid, start_time) == Liveness::Running
}

/// "HEALTHY", "DEGRADED", "DOWN" (or "UNSPECIFIED").
pub fn health_name(health: Health) -> &'static str {
    let name = health.as_str_name();
    name.strip_prefix("HEALTH_").unwrap_or(name)
}

/// Seconds since the Unix epoch as RFC 3339 in UTC, e.g. `2026-12-06T08:50:18Z`.
pub fn rfc3339(unix_seconds: u64) -> String {
    let (days, secs) = (unix_seconds / 86_400, unix_seconds % 86_400);
    // Howard Hinnant's civil_from_days, for days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_798_548_018), "2026-12-29T12:40:18Z");
        assert_eq!(rfc3339(4_107_542_399), "2100-02-28T23:59:59Z");
    }

    #[test]
    fn requests_are_read_or_refused_naming_what_is_wrong() {
        let request = |kind: &str, config: &str| proto::RetrieveDataRequest {
            r#type: kind.to_string(),
            config_json: config.to_string(),
            resource: Some(proto::Resource::default()),
        };
        assert_eq!(
            Kind::parse(&request("logs", r#"{"tail": 5}"#)).unwrap(),
            Kind::Logs { tail: 5 }
        );
        assert_eq!(
            Kind::parse(&request("logs", "")).unwrap(),
            Kind::Logs { tail: 100 }
        );
        assert_eq!(
            Kind::parse(&request("logs", r#"{"tail": 99999999}"#)).unwrap(),
            Kind::Logs {
                tail: MAX_TAIL_LINES
            }
        );
        assert_eq!(
            Kind::parse(&request("inspect", "{}")).unwrap(),
            Kind::Inspect
        );
        for (kind, config, said) in [
            ("logs", r#"{"tail": -1}"#, "config.tail"),
            ("logs", r#"{"tail": "ten"}"#, "config.tail"),
            ("logs", "[", "config: not JSON"),
            ("metrics", "{}", "`metrics`"),
        ] {
            let refused = Kind::parse(&request(kind, config)).unwrap_err();
            assert_eq!(refused.code(), corbel_provider_sdk::Code::InvalidArgument);
            assert!(refused.message().contains(said), "{}", refused.message());
        }
        let no_resource = proto::RetrieveDataRequest {
            resource: None,
            ..request("logs", "{}")
        };
        assert!(
            Kind::parse(&no_resource)
                .unwrap_err()
                .message()
                .contains("resource")
        );
    }
}
