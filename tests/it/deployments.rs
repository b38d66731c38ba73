//! Blueprints and deployments, deployed through the real `corbel-provider-process`
//! (loaded from git like any provider): real processes are started, placed,
//! rolled back, destroyed and recovered after a crash of the real server.

mod docker;
mod events;
mod faults;
mod installs;
mod jobs;
mod journal;
mod lifecycle;
mod placement;
mod plans;
mod recovery;
mod rollback;
mod validation;
