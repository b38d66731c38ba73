//! Logs (tracing) and metrics (Prometheus text on `/metrics`).
//!
//! The metrics recorder is process-wide (the `metrics` facade has one global
//! recorder), so it is installed once and every server in the process shares it.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Pretty,
    Json,
}

/// Name of the GraphQL request counter, labelled by `operation` and `outcome`.
pub const GRAPHQL_REQUESTS: &str = "corbel_graphql_requests_total";
/// Name of the GraphQL latency histogram, labelled by `operation`.
pub const GRAPHQL_DURATION: &str = "corbel_graphql_request_duration_seconds";
/// Name of the gauge of GraphQL HTTP requests being worked on now.
pub const GRAPHQL_IN_FLIGHT: &str = "corbel_graphql_requests_in_flight";
/// Name of the build-info gauge (always 1), labelled by `version`.
pub const BUILD_INFO: &str = "corbel_build_info";
/// Calls to providers, labelled by `call` (the RPC) and `outcome` (`ok`,
/// `refused`, `deadline`, `unreachable`).
pub const PROVIDER_CALLS: &str = "corbel_provider_calls_total";
/// Provider call latency in seconds, labelled by `call`.
pub const PROVIDER_CALL_DURATION: &str = "corbel_provider_call_duration_seconds";
/// Deploy and destroy steps, labelled by `intent` and `outcome` (`complete`,
/// `failed`, `lost`: the outcome is unknown and the journal keeps the call).
pub const DEPLOY_STEPS: &str = "corbel_deploy_steps_total";

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Starts logging to stderr in the chosen format. Safe to call more than once:
/// only the first call takes effect. Pretty logs are coloured only on a
/// terminal, and never with `NO_COLOR` set (<https://no-color.org>).
pub fn init_logging(format: LogFormat, filter: &str) {
    use std::io::IsTerminal as _;
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let colour = colour_wanted(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Whether to colour logs: only on a terminal, and not when `NO_COLOR` is set
/// to anything but the empty string.
fn colour_wanted(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|value| value.is_empty())
}

/// The process's metrics handle, installing the recorder on first use.
pub fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(GRAPHQL_DURATION.to_owned()), LATENCY_BUCKETS)
            .expect("bucket list is not empty")
            .set_buckets_for_metric(
                Matcher::Full(PROVIDER_CALL_DURATION.to_owned()),
                LATENCY_BUCKETS,
            )
            .expect("bucket list is not empty")
            .build_recorder();
        let handle = recorder.handle();
        // Another recorder may already be set (a test harness); ours then only
        // renders what it records itself, which is still correct for `/metrics`.
        let _ = metrics::set_global_recorder(recorder);
        metrics::describe_counter!(
            GRAPHQL_REQUESTS,
            "GraphQL requests by operation and outcome"
        );
        metrics::describe_histogram!(GRAPHQL_DURATION, "GraphQL request latency in seconds");
        metrics::describe_gauge!(
            GRAPHQL_IN_FLIGHT,
            "GraphQL HTTP requests being worked on (a request whose client left is dropped)"
        );
        metrics::describe_gauge!(BUILD_INFO, "Build information; the value is always 1");
        metrics::describe_counter!(PROVIDER_CALLS, "Calls to providers by RPC and outcome");
        metrics::describe_histogram!(
            PROVIDER_CALL_DURATION,
            "Provider call latency in seconds (streams: until their last event)"
        );
        metrics::describe_counter!(
            DEPLOY_STEPS,
            "Deploy and destroy steps by intent and outcome"
        );
        metrics::describe_gauge!(
            "corbel_resources",
            "Deployed resources by health (HEALTHY, DEGRADED, DOWN, UNKNOWN), on the leader"
        );
        metrics::gauge!(BUILD_INFO, "version" => crate::VERSION).set(1.0);
        handle
    })
}

/// Records one finished GraphQL request: its outcome (`ok`, or `error` when
/// the response has errors) and how long it took.
pub fn record_graphql(operation: &str, ok: bool, seconds: f64) {
    let series = operation_series(operation);
    if ok { &series.ok } else { &series.error }.increment(1);
    series.duration.record(seconds);
}

/// How many operation names get series of their own; requests of any other
/// name are counted under `operation="other"`. Names come from clients, and
/// the exporter keeps each series (a histogram's buckets) for the process's
/// life: unbounded, a client making up names would grow the server's memory
/// and `/metrics` without end.
pub const OPERATION_SERIES: usize = 200;

/// The metrics of one operation name, registered once: a request then costs
/// a map lookup instead of building and hashing labelled keys in the
/// exporter's registry for each of its two series.
struct OperationSeries {
    ok: metrics::Counter,
    error: metrics::Counter,
    duration: metrics::Histogram,
}

impl OperationSeries {
    fn register(label: String) -> OperationSeries {
        OperationSeries {
            ok: metrics::counter!(GRAPHQL_REQUESTS, "operation" => label.clone(), "outcome" => "ok"),
            error: metrics::counter!(GRAPHQL_REQUESTS, "operation" => label.clone(), "outcome" => "error"),
            duration: metrics::histogram!(GRAPHQL_DURATION, "operation" => label),
        }
    }
}

/// The series of `operation` (a request's name, as the client sent it),
/// registered at its first request while there is room.
fn operation_series(operation: &str) -> Arc<OperationSeries> {
    let cleaned;
    let label = if is_label(operation) {
        operation
    } else {
        cleaned = operation_label(operation);
        &cleaned
    };
    type Known = RwLock<HashMap<String, Arc<OperationSeries>>>;
    static KNOWN: OnceLock<Known> = OnceLock::new();
    static OTHER: OnceLock<Arc<OperationSeries>> = OnceLock::new();
    let known = KNOWN.get_or_init(|| {
        metrics();
        RwLock::default()
    });
    if let Some(series) = known.read().unwrap_or_else(|e| e.into_inner()).get(label) {
        return series.clone();
    }
    let mut known = known.write().unwrap_or_else(|e| e.into_inner());
    if let Some(series) = known.get(label) {
        return series.clone();
    }
    if known.len() >= OPERATION_SERIES {
        return OTHER
            .get_or_init(|| Arc::new(OperationSeries::register("other".to_owned())))
            .clone();
    }
    let series = Arc::new(OperationSeries::register(label.to_owned()));
    known.insert(label.to_owned(), series.clone());
    series
}

/// Counts a GraphQL HTTP request as in flight until the guard is dropped: when
/// the handler returns, or when its future is dropped because the client left.
pub fn graphql_in_flight() -> InFlight {
    // One handle for every request: looking it up in the registry twice per
    // request showed in the `serverInfo` profile. Taken once the recorder
    // is in place.
    static GAUGE: OnceLock<metrics::Gauge> = OnceLock::new();
    let gauge = GAUGE
        .get_or_init(|| {
            metrics();
            metrics::gauge!(GRAPHQL_IN_FLIGHT)
        })
        .clone();
    gauge.increment(1.0);
    InFlight(gauge)
}

pub struct InFlight(metrics::Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Records one finished call to a provider.
pub fn record_provider_call(call: &'static str, outcome: &'static str, seconds: f64) {
    metrics::counter!(PROVIDER_CALLS, "call" => call, "outcome" => outcome).increment(1);
    metrics::histogram!(PROVIDER_CALL_DURATION, "call" => call).record(seconds);
}

/// Records one finished deploy or destroy step.
pub fn record_deploy_step(intent: &'static str, outcome: &'static str) {
    metrics::counter!(DEPLOY_STEPS, "intent" => intent, "outcome" => outcome).increment(1);
}

/// Whether `name` is its own label: what [`operation_label`] keeps of it.
fn is_label(name: &str) -> bool {
    (1..=OPERATION_LABEL_LEN).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The longest operation label.
const OPERATION_LABEL_LEN: usize = 64;

/// Operation names come from clients: keep the label to a bounded, safe alphabet.
fn operation_label(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(OPERATION_LABEL_LEN)
        .collect();
    if cleaned.is_empty() {
        "anonymous".to_owned()
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::{colour_wanted, is_label, operation_label};

    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(colour_wanted(true, None));
        assert!(colour_wanted(true, Some(OsStr::new(""))));
        assert!(!colour_wanted(true, Some(OsStr::new("1"))));
        assert!(!colour_wanted(false, None));
    }

    #[test]
    fn operation_labels_are_bounded_and_safe() {
        assert_eq!(operation_label(""), "anonymous");
        assert_eq!(operation_label("Get\"Info\n"), "GetInfo");
        assert_eq!(operation_label(&"x".repeat(500)).len(), 64);
        for name in ["GetInfo", "get_info_2", &"x".repeat(64)] {
            assert!(is_label(name), "{name}");
            assert_eq!(operation_label(name), name);
        }
        for name in ["", "Get\"Info", "Ünïcode", &"x".repeat(65)] {
            assert!(!is_label(name), "{name}");
        }
    }
}
