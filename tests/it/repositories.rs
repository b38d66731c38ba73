//! Repositories and elements against a real nginx, local directories and the
//! migration driver.

pub(crate) mod credentials;
mod dependencies;
mod errors;
mod http;
mod invalid;
mod local;
mod modes;
