//! Providers loaded from real git repositories (local bare repos and `git
//! daemon` on loopback), built and run by the shell runtime as real processes:
//! the reference `corbel-provider-process`, and `corbel-provider-fixture`, a
//! provider that misbehaves on purpose, and the Python example provider
//! (`providers/examples/python`), a grpc-core client; and by the docker runtime
//! as containers on the real Docker engine.

mod check;
mod config;
mod credentials;
mod docker;
mod failures;
mod faults;
mod lifecycle;
pub(crate) mod protocol;
mod python;
mod remote;
mod secrets;
mod sources;
