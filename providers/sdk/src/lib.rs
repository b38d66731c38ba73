//! Write a Corbel provider: implement [`Provider`], call [`serve`].
//!
//! ```no_run
//! use corbel_provider_sdk::{Provider, ProviderInfo, async_trait};
//!
//! struct Hello;
//!
//! #[async_trait]
//! impl Provider for Hello {
//!     fn info(&self) -> ProviderInfo {
//!         ProviderInfo::new("hello", "0.1.0")
//!     }
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     corbel_provider_sdk::run(|env| corbel_provider_sdk::serve_env(env, Hello))
//! }
//! ```
//!
//! The SDK takes the environment Corbel sets out of the process (so nothing the
//! provider starts inherits its token; see [`run`]), handshakes, serves the
//! `Provider` service and `grpc.health.v1` on `<CORBEL_SOCKET_DIR>/<id>.sock`,
//! registers, exits when Corbel goes away, and unregisters on SIGTERM. See the
//! crate's README for the lifecycle and [`testing`] to test without Corbel.

pub mod config;
mod env;
mod error;
mod exec;
mod files;
mod health;
mod provider;
pub mod records;
mod serve;
mod service;
mod settings;
pub mod testing;

pub use corbel_proto::SUPPORTED_VERSIONS;
/// The protocol's messages, clients and servers (`corbel.provider.v1`).
pub use corbel_proto::v1 as proto;

pub use async_trait::async_trait;
pub use serde_json;
pub use tonic::{Code, Status};

pub use env::{ProviderEnv, run, single_threaded};
pub use error::SdkError;
pub use exec::{ExecInput, ExecInputs, ExecOutputs};
pub use files::{FilesArchive, FilesSink};
pub use health::{HealthBoard, now_ms};
pub use provider::{
    Events, Failure, InventorySink, Provider, ProviderInfo, Registration, StatusSink, StepError,
    StepResult,
};
pub use records::{Records, StateLock};
pub use serve::{
    REGISTRY_HEALTH_SERVICE, Stopped, connect, connect_tls, serve, serve_env, serve_env_with,
    serve_with,
};
pub use settings::{
    ENV_ENDPOINT, ENV_LISTEN, ENV_PROVIDER_ID, ENV_PROVIDER_TOKEN, ENV_REGISTRY, ENV_SOCKET_DIR,
    ENV_STATE_DIR, ENV_TLS_CA, ENV_TLS_CERT, ENV_TLS_KEY, PROVIDER_ENV, REGISTRY_TLS_NAME, Remote,
    Settings,
};

/// Compiles the README's code blocks as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
