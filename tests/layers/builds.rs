//! Builds that share a target directory reuse each other's work: loading a
//! shipped provider from a clone (its `corbel-provider.yaml` runs `cargo build
//! --release -p …`) after `cargo run --release -- serve` compiles no
//! dependency again and replaces nothing the server's build made.
//!
//! Cargo resolves a dependency's features over the packages a build names, so
//! the check asks cargo itself what each build would compile: its unit graph
//! (`--unit-graph`, an unstable flag of stable cargo's, read with
//! `RUSTC_BOOTSTRAP=1` since stable cargo has no dry run). Every unit of a
//! registry crate that a provider's build compiles must be one the server's
//! build compiles: same crate, target, mode, profile and features.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use crate::root;

/// A compiled unit of a registry crate: (package, target, kinds, mode,
/// profile) → the feature sets it is compiled with.
type Units = BTreeMap<(String, String, String, String, String), BTreeSet<Vec<String>>>;

/// The units `cargo build <args>` would compile, from cargo's unit graph.
fn units(args: &[&str]) -> Units {
    let out = Command::new(env!("CARGO"))
        .current_dir(root())
        .env("RUSTC_BOOTSTRAP", "1")
        .args(["build", "-Z", "unstable-options", "--unit-graph"])
        .args(args)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo build {args:?} --unit-graph: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let graph: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a unit graph");
    let mut units = Units::new();
    for unit in graph["units"].as_array().expect("units") {
        let package = unit["pkg_id"].as_str().unwrap();
        if !package.starts_with("registry+") {
            continue; // the workspace's own crates are the builds' own work
        }
        let mut profile = unit["profile"].clone();
        profile.as_object_mut().unwrap().remove("name");
        let features = unit["features"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap().to_owned())
            .collect();
        let key = (
            package.rsplit('#').next().unwrap().to_owned(),
            unit["target"]["name"].as_str().unwrap().to_owned(),
            unit["target"]["kind"].to_string(),
            unit["mode"].as_str().unwrap().to_owned(),
            profile.to_string(),
        );
        units.entry(key).or_default().insert(features);
    }
    units
}

/// The `cargo build …` arguments of each shipped provider's
/// `corbel-provider.yaml` (`shell.build`), by the file's path.
fn provider_builds() -> Vec<(String, Vec<String>)> {
    let mut builds = Vec::new();
    for entry in std::fs::read_dir(root().join("providers")).unwrap() {
        let metadata = entry.unwrap().path().join("corbel-provider.yaml");
        let Ok(text) = std::fs::read_to_string(&metadata) else {
            continue;
        };
        let build = text
            .lines()
            .find_map(|line| line.trim().strip_prefix("build:"))
            .unwrap_or_else(|| panic!("{}: no shell.build", metadata.display()));
        let args: Vec<String> = build.split_whitespace().map(str::to_owned).collect();
        assert_eq!(
            args[..2],
            ["cargo", "build"],
            "{}: a shipped provider builds with cargo",
            metadata.display()
        );
        let shown = metadata.strip_prefix(root()).unwrap().display().to_string();
        builds.push((shown, args[2..].to_vec()));
    }
    builds.sort();
    builds
}

#[test]
fn a_shipped_provider_built_after_the_server_compiles_no_dependency_again() {
    let server = units(&["--release", "--locked", "-p", "corbel"]);
    let builds = provider_builds();
    assert!(builds.len() >= 3, "shipped providers found: {builds:?}");
    let mut problems = Vec::new();
    for (metadata, args) in &builds {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        for (key, features) in units(&args) {
            let (package, target, kinds, mode, _) = &key;
            let built = server.get(&key);
            for set in features {
                if built.is_none_or(|b| !b.contains(&set)) {
                    problems.push(format!(
                        "{metadata}: {package} ({target} {kinds} {mode}) with [{}]; the server's \
                         build has {:?}",
                        set.join(", "),
                        built.map(|b| b.iter().map(|s| s.join(", ")).collect::<Vec<_>>())
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "a provider's build would compile these again (ask for the server's features in \
         providers/server-features/Cargo.toml):\n{}",
        problems.join("\n")
    );
}
