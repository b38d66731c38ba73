//! The API's settings: the `[graphql]` section of the config file and the
//! `--graphql-*` flags (`CORBEL_GRAPHQL_*`). Defaults live in `Default`.
//!
//! Requests without a valid token get the `anonymous_*` limits, which are
//! tighter: an anonymous caller may only read `serverInfo`, log in and
//! introspect, none of which needs much.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::settings::millis;

/// Limits on what one GraphQL request may ask for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GraphqlLimits {
    /// Deepest selection nesting accepted.
    pub max_depth: usize,
    /// Highest query complexity (one per field, by default) accepted.
    pub max_complexity: usize,
    /// Largest request body, in bytes (also the largest websocket message).
    pub max_body_bytes: usize,
    /// Largest document after fragment expansion (fields, fragments and
    /// spreads counted once per place they end up), checked before anything
    /// else walks the document.
    pub max_query_size: usize,
    /// The same for a request without a valid token.
    pub anonymous_max_query_size: usize,
    /// Most requests in one batch.
    pub max_batch: usize,
    /// The same for a request without a valid token.
    pub anonymous_max_batch: usize,
    /// Largest response body, in bytes.
    pub max_response_bytes: usize,
    /// The same for a request without a valid token.
    pub anonymous_max_response_bytes: usize,
    /// How long one HTTP request (a whole batch) may run.
    #[serde(rename = "request_timeout_ms", with = "millis")]
    pub request_timeout: Duration,
    /// The same for a request without a valid token.
    #[serde(rename = "anonymous_request_timeout_ms", with = "millis")]
    pub anonymous_request_timeout: Duration,
    /// How long a websocket may stay open without `connection_init`.
    #[serde(rename = "ws_init_timeout_ms", with = "millis")]
    pub ws_init_timeout: Duration,
    /// Most operations (subscriptions, queries, mutations) one websocket may
    /// have live at once; another `subscribe` gets an error for its id.
    pub ws_max_subscriptions: usize,
    /// Most websockets open at once from one client address; another upgrade
    /// is refused with 429.
    pub ws_max_sockets_per_address: usize,
    /// Most bytes waiting to be sent on one websocket (one message of any
    /// size is let through when nothing waits): a client that lets more pile
    /// up is not reading, and is cut off.
    pub ws_send_queue_bytes: usize,
    /// Most bytes waiting to be sent over all websockets together. Past it, a
    /// socket that adds to its queue while holding at least an equal share of
    /// this budget (it over the sockets open) is cut off as not reading; a
    /// socket with nothing waiting (a client that reads) never is.
    pub ws_send_queue_total_bytes: usize,
    /// How long a websocket's next operation waits for its client to read
    /// what it was sent (an operation starts only while less than 16 KiB
    /// waits): past it with nothing sent meanwhile, the client is not
    /// reading, and is cut off.
    #[serde(rename = "ws_send_stall_ms", with = "millis")]
    pub ws_send_stall: Duration,
}

impl Default for GraphqlLimits {
    fn default() -> Self {
        Self {
            max_depth: 16,
            max_complexity: 2_000,
            max_body_bytes: 1024 * 1024,
            max_query_size: 10_000,
            anonymous_max_query_size: 1_000,
            max_batch: 50,
            anonymous_max_batch: 5,
            max_response_bytes: 32 * 1024 * 1024,
            anonymous_max_response_bytes: 1024 * 1024,
            request_timeout: Duration::from_secs(30),
            anonymous_request_timeout: Duration::from_secs(5),
            ws_init_timeout: Duration::from_secs(10),
            ws_max_subscriptions: 100,
            ws_max_sockets_per_address: 64,
            ws_send_queue_bytes: 4 * 1024 * 1024,
            // Sixteen sockets' full queues: room for a few slow readers of
            // large answers, and under issue 38's +100 MiB with what is being
            // answered besides.
            ws_send_queue_total_bytes: 64 * 1024 * 1024,
            ws_send_stall: Duration::from_secs(10),
        }
    }
}

/// The limits that apply to one request, chosen by whether it carries a valid
/// token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    pub max_query_size: usize,
    pub max_batch: usize,
    pub max_response_bytes: usize,
    pub timeout: Duration,
    /// Whether these are the anonymous limits (named in error messages).
    pub anonymous: bool,
}

impl GraphqlLimits {
    pub fn for_caller(&self, signed_in: bool) -> RequestLimits {
        if signed_in {
            RequestLimits {
                max_query_size: self.max_query_size,
                max_batch: self.max_batch,
                max_response_bytes: self.max_response_bytes,
                timeout: self.request_timeout,
                anonymous: false,
            }
        } else {
            // An anonymous limit never exceeds the authenticated one.
            RequestLimits {
                max_query_size: self.anonymous_max_query_size.min(self.max_query_size),
                max_batch: self.anonymous_max_batch.min(self.max_batch),
                max_response_bytes: self
                    .anonymous_max_response_bytes
                    .min(self.max_response_bytes),
                timeout: self.anonymous_request_timeout.min(self.request_timeout),
                anonymous: true,
            }
        }
    }

    /// Zero would refuse everything or never fire: raise such values to a floor.
    pub fn bounded(self) -> Self {
        use crate::settings::at_least;
        Self {
            max_query_size: at_least(self.max_query_size, 1),
            anonymous_max_query_size: at_least(self.anonymous_max_query_size, 1),
            max_batch: at_least(self.max_batch, 1),
            anonymous_max_batch: at_least(self.anonymous_max_batch, 1),
            // Room for an error saying the response was too large.
            max_response_bytes: at_least(self.max_response_bytes, 1024),
            anonymous_max_response_bytes: at_least(self.anonymous_max_response_bytes, 1024),
            request_timeout: at_least(self.request_timeout, Duration::from_millis(10)),
            anonymous_request_timeout: at_least(
                self.anonymous_request_timeout,
                Duration::from_millis(10),
            ),
            ws_init_timeout: at_least(self.ws_init_timeout, Duration::from_millis(10)),
            ws_max_subscriptions: at_least(self.ws_max_subscriptions, 1),
            ws_max_sockets_per_address: at_least(self.ws_max_sockets_per_address, 1),
            ws_send_queue_bytes: at_least(self.ws_send_queue_bytes, 1024),
            ws_send_queue_total_bytes: at_least(self.ws_send_queue_total_bytes, 1024),
            ws_send_stall: at_least(self.ws_send_stall, Duration::from_millis(10)),
            ..self
        }
    }
}

impl RequestLimits {
    /// The config key of a limit, as errors name it (`graphql.anonymous_max_batch`).
    pub fn key(&self, name: &str) -> String {
        if self.anonymous {
            format!("graphql.anonymous_{name}")
        } else {
            format!("graphql.{name}")
        }
    }
}

/// The `--graphql-*` flags; each overrides its key of `[graphql]`.
#[derive(Clone, Debug, Default, Serialize, clap::Args)]
pub struct GraphqlFlags {
    /// Deepest GraphQL selection nesting accepted.
    #[arg(
        long = "graphql-max-depth",
        env = "CORBEL_GRAPHQL_MAX_DEPTH",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<usize>,
    /// Highest GraphQL query complexity accepted.
    #[arg(
        long = "graphql-max-complexity",
        env = "CORBEL_GRAPHQL_MAX_COMPLEXITY",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_complexity: Option<usize>,
    /// Largest GraphQL request body (and websocket message), in bytes.
    #[arg(
        long = "graphql-max-body-bytes",
        env = "CORBEL_GRAPHQL_MAX_BODY_BYTES",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<usize>,
    /// Largest GraphQL document after fragment expansion (selections counted).
    #[arg(
        long = "graphql-max-query-size",
        env = "CORBEL_GRAPHQL_MAX_QUERY_SIZE",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_query_size: Option<usize>,
    /// Largest expanded document for a request without a token.
    #[arg(
        long = "graphql-anonymous-max-query-size",
        env = "CORBEL_GRAPHQL_ANONYMOUS_MAX_QUERY_SIZE",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anonymous_max_query_size: Option<usize>,
    /// Most requests in one GraphQL batch.
    #[arg(
        long = "graphql-max-batch",
        env = "CORBEL_GRAPHQL_MAX_BATCH",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_batch: Option<usize>,
    /// Most requests in one batch without a token.
    #[arg(
        long = "graphql-anonymous-max-batch",
        env = "CORBEL_GRAPHQL_ANONYMOUS_MAX_BATCH",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anonymous_max_batch: Option<usize>,
    /// Largest GraphQL response body, in bytes.
    #[arg(
        long = "graphql-max-response-bytes",
        env = "CORBEL_GRAPHQL_MAX_RESPONSE_BYTES",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_response_bytes: Option<usize>,
    /// Largest response body for a request without a token, in bytes.
    #[arg(
        long = "graphql-anonymous-max-response-bytes",
        env = "CORBEL_GRAPHQL_ANONYMOUS_MAX_RESPONSE_BYTES",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anonymous_max_response_bytes: Option<usize>,
    /// How long one GraphQL HTTP request may run, in milliseconds.
    #[arg(
        long = "graphql-request-timeout-ms",
        env = "CORBEL_GRAPHQL_REQUEST_TIMEOUT_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_timeout_ms: Option<u64>,
    /// How long a request without a token may run, in milliseconds.
    #[arg(
        long = "graphql-anonymous-request-timeout-ms",
        env = "CORBEL_GRAPHQL_ANONYMOUS_REQUEST_TIMEOUT_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anonymous_request_timeout_ms: Option<u64>,
    /// How long a websocket may stay open without `connection_init`, in ms.
    #[arg(
        long = "graphql-ws-init-timeout-ms",
        env = "CORBEL_GRAPHQL_WS_INIT_TIMEOUT_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ws_init_timeout_ms: Option<u64>,
    /// Most live operations on one websocket.
    #[arg(
        long = "graphql-ws-max-subscriptions",
        env = "CORBEL_GRAPHQL_WS_MAX_SUBSCRIPTIONS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ws_max_subscriptions: Option<usize>,
    /// Most websockets open at once from one client address.
    #[arg(
        long = "graphql-ws-max-sockets-per-address",
        env = "CORBEL_GRAPHQL_WS_MAX_SOCKETS_PER_ADDRESS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ws_max_sockets_per_address: Option<usize>,
    /// Most bytes waiting to be sent on one websocket before it is cut off.
    #[arg(
        long = "graphql-ws-send-queue-bytes",
        env = "CORBEL_GRAPHQL_WS_SEND_QUEUE_BYTES",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ws_send_queue_bytes: Option<usize>,
    /// Most bytes waiting to be sent over all websockets together.
    #[arg(
        long = "graphql-ws-send-queue-total-bytes",
        env = "CORBEL_GRAPHQL_WS_SEND_QUEUE_TOTAL_BYTES",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ws_send_queue_total_bytes: Option<usize>,
    /// How long an operation waits for its websocket's client to read, with
    /// nothing sent, before the socket is cut off; in ms.
    #[arg(
        long = "graphql-ws-send-stall-ms",
        env = "CORBEL_GRAPHQL_WS_SEND_STALL_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ws_send_stall_ms: Option<u64>,
}
