//! No code: see `Cargo.toml`. The shipped providers depend on this crate so
//! that building one alone resolves the same features of their shared
//! dependencies as building the server, and reuses its compiled crates.
