//! The API's settings: the `[graphql]` section of the config file and the
//! `--graphql-*` flags (`CORBEL_GRAPHQL_*`). Defaults live in `Default`.

use serde::{Deserialize, Serialize};

/// Limits on what one GraphQL request may ask for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GraphqlLimits {
    /// Deepest selection nesting accepted.
    pub max_depth: usize,
    /// Highest query complexity (one per field, by default) accepted.
    pub max_complexity: usize,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
}

impl Default for GraphqlLimits {
    fn default() -> Self {
        Self {
            max_depth: 16,
            max_complexity: 2_000,
            max_body_bytes: 1024 * 1024,
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
    /// Largest GraphQL request body, in bytes.
    #[arg(
        long = "graphql-max-body-bytes",
        env = "CORBEL_GRAPHQL_MAX_BODY_BYTES",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<usize>,
}
