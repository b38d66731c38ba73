//! Live health through the real process provider: a workload killed behind
//! Corbel's back is DOWN with its reason, told as HEALTH events and counted
//! on `/metrics`; a `restart` policy brings it back once per death, its
//! readers following its new outputs; a crash loop stops healing; a provider
//! that goes away turns its resources UNKNOWN, and HEALTHY again when it
//! returns.

mod down;
mod heal;
mod providers;
/// Shared with the crash tests (`crash::heal`) and the Docker test.
pub(crate) mod support;
