//! `[api]`: settings of the HTTP API beside GraphQL's (`[graphql]`): how
//! large an upload to `PUT /files/…` may be.

use serde::{Deserialize, Serialize};

/// The `[api]` settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiLimits {
    /// Most bytes of one upload (`PUT /files/…`, `corbel cp` into a
    /// resource): a larger one is refused, and nothing of it is written.
    pub max_upload_bytes: u64,
}

impl Default for ApiLimits {
    fn default() -> Self {
        Self {
            max_upload_bytes: 1 << 30,
        }
    }
}

impl ApiLimits {
    pub fn bounded(self) -> Self {
        Self {
            max_upload_bytes: self.max_upload_bytes.max(1),
        }
    }
}

/// The `--api-*` flags; each overrides its key of `[api]`.
#[derive(Clone, Debug, Default, Serialize, clap::Args)]
pub struct ApiFlags {
    /// Most bytes of one upload to a resource (`PUT /files/…`).
    #[arg(
        long = "api-max-upload-bytes",
        env = "CORBEL_API_MAX_UPLOAD_BYTES",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_upload_bytes: Option<u64>,
}
