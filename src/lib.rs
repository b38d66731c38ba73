//! Corbel, a platform server: providers, repositories and deployments behind one
//! GraphQL API. See `ARCHITECTURE.md` for the code map.

pub mod api;
pub mod app;
pub mod audit;
pub mod auth;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod config;
pub mod cpu;
pub mod deploy;
pub mod events;
pub mod provider;
pub mod redact;
pub mod repository;
pub mod resolve;
pub mod seal;
pub mod secret;
pub mod settings;
pub mod standby;
pub mod store;
pub mod telemetry;
pub mod text;
pub mod web;
pub mod yaml;

/// The crate version, as shown by `corbel --version` and `serverInfo.version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// An error with its causes, `outer: inner: innermost`, for logs and for
/// messages that must say why.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
