//! The fixture provider for the benchmarks that deploy: built in the
//! bench's profile, in a git repository of its own, loaded from there like any provider.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `corbel-provider-fixture` in the bench's profile and returns its
/// path.
pub fn build_fixture() -> PathBuf {
    super::profile::build(&["-p", "corbel-provider-fixture"]).join("corbel-provider-fixture")
}

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .args(["-c", "user.name=b", "-c", "user.email=b@example.com"])
        .args(["-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .status()
        .expect("git runs");
    assert!(status.success(), "git {args:?}");
}

/// A repository holding the fixture's `corbel-provider.yaml`; its URL.
pub fn fixture_repo(root: &Path, bin: &Path) -> String {
    let work = root.join("fixture");
    std::fs::create_dir_all(&work).expect("work dir");
    std::fs::write(
        work.join("corbel-provider.yaml"),
        format!(
            "name: fixture\nversion: 0.1.0\nruntime: shell\nshell:\n  run: FIXTURE_MODE=normal exec {}\nresource_types: [fixture.v1.noop]\n",
            bin.display()
        ),
    )
    .expect("metadata");
    git(&work, &["init", "-q"]);
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "fixture"]);
    format!("file://{}", work.display())
}
