//! Which build a benchmark measures, and the workspace's binaries built the
//! same way. `cargo bench --profile dist` measures what is published (one
//! code-generation unit, optimised across crates: `Cargo.toml`); a plain
//! `cargo bench` measures the `release` build instead, and says so.

// Each bench uses the part it needs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/<profile>`: this bench runs from its `deps/`.
pub fn profile_dir() -> PathBuf {
    std::env::current_exe()
        .expect("the bench's path")
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_owned()
}

/// The profile's name: `dist`, or `release` for a plain `cargo bench`.
pub fn profile() -> String {
    profile_dir()
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("release")
        .to_owned()
}

/// `cargo build` in this bench's profile with `args` (`-p …`, `--bin …`);
/// the directory the binaries are in.
pub fn build(args: &[&str]) -> PathBuf {
    let profile = profile();
    let mut command = Command::new(env!("CARGO"));
    command.arg("build");
    if profile == "release" {
        command.arg("--release");
    } else {
        command.args(["--profile", &profile]);
    }
    // What `cargo bench` sets for the running bench (its package's name,
    // version, manifest) would reach the build scripts' `rerun-if-env-changed`
    // (ring's reads `CARGO_PKG_NAME`): every build from here would then differ
    // from the `cargo bench` one, and each would rebuild ring, rustls and the
    // server in turn.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_MANIFEST_")
            || matches!(
                &*name,
                "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "OUT_DIR"
                    | "CARGO_TARGET_TMPDIR"
            )
        {
            command.env_remove(&*name);
        }
    }
    let status = command.args(args).status().expect("cargo runs");
    assert!(status.success(), "cargo build {args:?} failed");
    profile_dir()
}

/// The line a bench prints first: the build it measures.
pub fn announce(bench: &str) {
    let profile = profile();
    let note = if profile == "dist" {
        ""
    } else {
        " (not what is published: run `cargo bench --profile dist`)"
    };
    println!(
        "corbel {bench} benchmark ({} cores, profile {profile}{note})",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
}
