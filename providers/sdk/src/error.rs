//! What can stop a provider from starting or serving.
//!
//! Policy: every variant names what failed and carries the other side's message
//! verbatim, because that text is what a provider author reads in Corbel's
//! captured logs. The token never appears in any message.

use std::path::PathBuf;

use tonic::Code;

/// Why [`serve_with`](crate::serve_with) could not run or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum SdkError {
    /// A required environment variable is not set (or is empty).
    #[error("environment variable {0} is not set; a provider is started by Corbel, which sets it")]
    MissingEnv(&'static str),
    /// An environment variable is set but unusable.
    #[error("environment variable {name} is invalid: {reason}")]
    InvalidEnv { name: &'static str, reason: String },
    /// The registry could not be reached.
    #[error("cannot connect to the registry at {address}: {reason}")]
    Connect { address: String, reason: String },
    /// The registry and this provider share no protocol version, or the
    /// handshake failed otherwise.
    #[error(
        "the registry refused the handshake ({code:?}; this provider speaks {ours:?}): {message}"
    )]
    HandshakeRefused {
        code: Code,
        message: String,
        ours: Vec<u32>,
    },
    /// The registry refused the registration (e.g. a wrong token).
    #[error("the registry refused the registration ({code:?}): {message}")]
    RegisterRefused { code: Code, message: String },
    /// The provider's own socket could not be prepared or bound.
    #[error("cannot listen on {path}: {reason}")]
    Bind { path: PathBuf, reason: String },
    /// The provider's gRPC server stopped on its own.
    #[error("the provider's gRPC server failed: {0}")]
    Serve(String),
}

impl SdkError {
    /// The process exit code [`serve`](crate::serve) uses for this error:
    /// 2 for a missing or invalid environment, 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            SdkError::MissingEnv(_) | SdkError::InvalidEnv { .. } => 2,
            SdkError::Connect { .. }
            | SdkError::HandshakeRefused { .. }
            | SdkError::RegisterRefused { .. }
            | SdkError::Bind { .. }
            | SdkError::Serve(_) => 1,
        }
    }
}
