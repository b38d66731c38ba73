//! What can go wrong in a client command, and the exit code each kind gets.
//! The codes are a contract with scripts (documented in `corbel --help` and
//! the README): a GraphQL error's `extensions.code` decides its kind, never
//! its message.

use serde_json::{Value, json};

/// Exit codes other than clap's own 2 for a usage error.
pub mod exit {
    pub const FAILED: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const NOT_SIGNED_IN: u8 = 3;
    pub const NOT_FOUND: u8 = 4;
    pub const CONFLICT: u8 = 5;
    pub const UNREACHABLE: u8 = 6;
    pub const API: u8 = 7;
    /// Ctrl-C while waiting for a run (the run goes on on the server).
    pub const INTERRUPTED: u8 = 130;
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The operation ran and failed (a deployment ended `FAILED`).
    #[error("{0}")]
    Failed(String),
    /// The command line asks for something that cannot be done as asked (a
    /// name that matches several deployments, a password with no terminal).
    #[error("{0}")]
    Usage(String),
    /// No token, or one the server does not take; `corbel login` helps.
    #[error("UNAUTHENTICATED: {0}")]
    NotSignedIn(String),
    /// A name no list holds (the API's `NOT_FOUND` arrives as [`Self::Api`]).
    #[error("NOT_FOUND: {0}")]
    NotFound(String),
    /// A conflict found by the client (a live deployment of that name).
    #[error("CONFLICT: {0}")]
    Conflict(String),
    /// The server could not be reached, or did not answer as a GraphQL
    /// server does.
    #[error("UNREACHABLE: {0}")]
    Transport(String),
    /// A GraphQL error: its message and `extensions.code`.
    #[error("{code}: {message}")]
    Api { code: String, message: String },
    /// Ctrl-C while waiting.
    #[error("{0}")]
    Interrupted(String),
    /// Reading or writing a local file (the credentials, a blueprint).
    #[error("{0}")]
    Local(String),
}

impl ClientError {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Failed(_) => exit::FAILED,
            Self::Usage(_) => exit::USAGE,
            Self::NotSignedIn(_) => exit::NOT_SIGNED_IN,
            Self::NotFound(_) => exit::NOT_FOUND,
            Self::Conflict(_) => exit::CONFLICT,
            Self::Transport(_) => exit::UNREACHABLE,
            Self::Api { code, .. } => match code.as_str() {
                "UNAUTHENTICATED" | "FORBIDDEN" => exit::NOT_SIGNED_IN,
                "NOT_FOUND" => exit::NOT_FOUND,
                "CONFLICT" | "ALREADY_INSTALLED" | "HAS_DEPENDENTS" => exit::CONFLICT,
                _ => exit::API,
            },
            Self::Interrupted(_) => exit::INTERRUPTED,
            Self::Local(_) => exit::API,
        }
    }

    /// The error's code as `-o json` shows it: the API's, or the client's own.
    pub fn code(&self) -> &str {
        match self {
            Self::Failed(_) => "FAILED",
            Self::Usage(_) => "USAGE",
            Self::NotSignedIn(_) => "UNAUTHENTICATED",
            Self::NotFound(_) => "NOT_FOUND",
            Self::Conflict(_) => "CONFLICT",
            Self::Transport(_) => "UNREACHABLE",
            Self::Api { code, .. } => code,
            Self::Interrupted(_) => "INTERRUPTED",
            Self::Local(_) => "LOCAL",
        }
    }

    /// The message without its code (which the text form adds, and JSON
    /// gives apart).
    pub fn message(&self) -> String {
        match self {
            Self::Api { message, .. } => message.clone(),
            Self::Failed(m)
            | Self::Usage(m)
            | Self::NotSignedIn(m)
            | Self::NotFound(m)
            | Self::Conflict(m)
            | Self::Transport(m)
            | Self::Interrupted(m)
            | Self::Local(m) => m.clone(),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({ "error": { "message": self.message(), "code": self.code(), "exitCode": self.exit_code() } })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_codes_map_to_exit_codes() {
        let api = |code: &str| ClientError::Api {
            code: code.to_owned(),
            message: "m".to_owned(),
        };
        assert_eq!(api("UNAUTHENTICATED").exit_code(), 3);
        assert_eq!(api("FORBIDDEN").exit_code(), 3);
        assert_eq!(api("NOT_FOUND").exit_code(), 4);
        assert_eq!(api("CONFLICT").exit_code(), 5);
        assert_eq!(api("ALREADY_INSTALLED").exit_code(), 5);
        assert_eq!(api("HAS_DEPENDENTS").exit_code(), 5);
        assert_eq!(api("VALIDATION").exit_code(), 7);
        assert_eq!(api("INTERNAL").exit_code(), 7);
        assert_eq!(ClientError::Transport("x".into()).exit_code(), 6);
        assert_eq!(ClientError::Failed("x".into()).exit_code(), 1);
    }
}
