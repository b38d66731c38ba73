//! The integration suite: the real server, in-process on `127.0.0.1:0` or as the
//! real binary, against a fresh SQLite database, or a fresh PostgreSQL database
//! when `CORBEL_TEST_POSTGRES_URL` names a server (see `scripts/test.sh`).

mod support;

mod audit;
mod auth;
mod binary;
mod cli;
mod cluster;
mod containment;
mod crash;
mod deployments;
mod engine;
mod exec;
mod health;
mod http;
mod input;
mod limits;
mod lock;
mod login;
mod parsing;
pub(crate) mod providers;
mod releases;
mod repositories;
mod schema;
mod server;
mod subscriptions;
mod teams;
mod tour;
mod web;
mod ws_limits;
