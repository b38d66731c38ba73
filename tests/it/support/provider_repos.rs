//! Providers in git: a bare repository with `corbel-provider.yaml`, the
//! metadata for the shell runtime (the process provider, the misbehaving
//! fixture, any command), and the workspace binaries they run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use tempfile::TempDir;

use super::corbel_bin;
use super::git::git;

/// A built binary of this workspace (`scripts/test.sh` builds them all first;
/// a test run without it builds the one asked for here).
pub fn workspace_bin(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    let path = corbel_bin().with_file_name(name);
    if !path.exists() {
        BUILT.get_or_init(|| {
            let status = Command::new(env!("CARGO"))
                .args(["build", "--bins", "--workspace"])
                .status()
                .expect("cargo runs");
            assert!(status.success(), "building the workspace binaries failed");
        });
    }
    assert!(path.exists(), "{} is not built", path.display());
    path
}

/// A bare repository holding a provider, with a work tree to commit from.
pub struct ProviderRepo {
    dir: TempDir,
}

impl ProviderRepo {
    /// One commit with `corbel-provider.yaml` (and `files`), tagged `v1`.
    pub fn new(metadata: &str, files: &[(&str, &str)]) -> ProviderRepo {
        let mut all = vec![("corbel-provider.yaml", metadata)];
        all.extend_from_slice(files);
        Self::with_files(&all)
    }

    /// One commit with `files` (paths relative to the root, directories made
    /// as needed), tagged `v1`.
    pub fn with_files(files: &[(&str, &str)]) -> ProviderRepo {
        Self::with_files_and(files, |_| {})
    }

    /// As [`with_files`](Self::with_files), with `prepare` writing more (binary
    /// files, say) into the work tree before the commit.
    pub fn with_files_and(files: &[(&str, &str)], prepare: impl FnOnce(&Path)) -> ProviderRepo {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        git(dir.path(), &["init", "--bare", "-q", "provider.git"]);
        git(&work, &["init", "-q"]);
        prepare(&work);
        let repo = ProviderRepo { dir };
        repo.commit_files(files);
        git(&work, &["tag", "v1"]);
        git(
            &work,
            &["remote", "add", "origin", repo.bare().to_str().unwrap()],
        );
        git(&work, &["push", "-q", "origin", "main", "--tags"]);
        repo
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    pub fn bare(&self) -> PathBuf {
        self.dir.path().join("provider.git")
    }

    pub fn url(&self) -> String {
        format!("file://{}", self.bare().display())
    }

    /// Commits new contents (pushed when the remote exists) and returns the commit.
    pub fn commit(&self, metadata: &str, files: &[(&str, &str)]) -> String {
        let mut all = vec![("corbel-provider.yaml", metadata)];
        all.extend_from_slice(files);
        self.commit_files(&all)
    }

    /// Commits `files` (pushed when the remote exists) and returns the commit.
    pub fn commit_files(&self, files: &[(&str, &str)]) -> String {
        let work = self.work();
        for (name, text) in files {
            let path = work.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        git(&work, &["add", "-A"]);
        git(&work, &["commit", "-q", "-m", "provider"]);
        if !git(&work, &["remote"]).is_empty() {
            git(&work, &["push", "-q", "origin", "main"]);
        }
        git(&work, &["rev-parse", "HEAD"])
    }

    pub fn head(&self) -> String {
        git(&self.work(), &["rev-parse", "HEAD"])
    }
}

/// `corbel-provider.yaml` for a prebuilt binary. The run command records the
/// process id in `provider.pid` (exec keeps it) so a test can kill it.
pub fn shell_metadata(name: &str, build: &str, run: &str) -> String {
    typed_metadata(name, build, run, "process.v1.service")
}

fn typed_metadata(name: &str, build: &str, run: &str, resource_type: &str) -> String {
    format!(
        "name: {name}\nversion: 0.1.0\ndescription: test provider\nruntime: shell\nshell:\n  build: {build}\n  run: {run}\nfeatures: [deploy, destroy, inspect, nodes]\nresource_types: [{resource_type}]\n"
    )
}

pub fn process_metadata() -> String {
    typed_metadata(
        "process",
        "echo building the process provider",
        &format!(
            "echo $$ > provider.pid; exec {}",
            workspace_bin("corbel-provider-process").display()
        ),
        "process.v1.service, process.v1.job",
    )
}

/// The docker provider (`providers/docker`), prebuilt, on this machine's engine.
pub fn docker_resources_metadata() -> String {
    format!(
        "name: docker\nversion: 0.1.0\ndescription: containers as resources\nruntime: shell\n\
         shell:\n  build: echo prebuilt\n  run: echo $$ > provider.pid; exec {}\n\
         features: [deploy, destroy, inspect, nodes, data, power, exec, files]\n\
         resource_types: [docker.v1.container, docker.v1.network, docker.v1.volume, docker.v1.job]\n",
        workspace_bin("corbel-provider-docker").display()
    )
}

pub fn fixture_metadata(mode: &str) -> String {
    typed_metadata(
        "fixture",
        "true",
        &format!(
            "echo $$ > provider.pid; FIXTURE_MODE={mode} exec {}",
            workspace_bin("corbel-provider-fixture").display()
        ),
        "fixture.v1.noop",
    )
}
