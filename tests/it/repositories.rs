//! Repositories and elements against a real nginx, local directories and the
//! migration driver.

mod dependencies;
mod errors;
mod http;
mod invalid;
mod local;
mod modes;
