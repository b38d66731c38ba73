//! The real Docker engine, for the docker runtime: a check that it answers (a
//! test that needs it fails, never skips), a provider repository whose image
//! is built `FROM scratch` (there is no registry to pull from) with the
//! process provider and the libraries `ldd` lists for it, and counting and
//! removing containers and images by Corbel's labels. The engine is asked
//! through the docker CLI: a client other than the one under test.

use std::path::Path;
use std::process::Command;

use super::provider_repos::{ProviderRepo, workspace_bin};

/// Corbel's labels (`src/provider/docker.rs`).
pub const LABEL_INSTANCE: &str = "io.corbel.instance";
pub const LABEL_PROVIDER: &str = "io.corbel.provider";

/// Panics, saying what to do, unless the Docker engine answers.
pub fn require_engine() {
    let answer = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output();
    match answer {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "the Docker engine does not answer (`docker info`: {}); the docker runtime's \
             tests need it: start dockerd (scripts/test.sh does)",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => panic!("cannot run the docker CLI ({e}); the docker runtime's tests need it"),
    }
}

/// `docker` with `args`; its stdout, trimmed. Panics on failure.
pub fn docker(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("the docker CLI runs");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Ids of the containers, running or not, carrying `label` (`key=value`).
pub fn containers(label: &str) -> Vec<String> {
    let listed = docker(&[
        "ps",
        "-aq",
        "--no-trunc",
        "--filter",
        &format!("label={label}"),
    ]);
    listed.lines().map(str::to_owned).collect()
}

/// Ids of the images carrying `label`.
pub fn images(label: &str) -> Vec<String> {
    let listed = docker(&["images", "-q", "--filter", &format!("label={label}")]);
    let mut ids: Vec<String> = listed.lines().map(str::to_owned).collect();
    ids.dedup();
    ids
}

pub fn provider_label(provider: &str) -> String {
    format!("{LABEL_PROVIDER}={provider}")
}

pub fn instance_label(instance: &str) -> String {
    format!("{LABEL_INSTANCE}={instance}")
}

/// Removes, when dropped (a failed test included), the containers and images
/// carrying the labels added to it: only what the test made.
#[derive(Default)]
pub struct Cleanup {
    labels: Vec<String>,
}

impl Cleanup {
    pub fn new() -> Cleanup {
        require_engine();
        Cleanup::default()
    }

    pub fn label(&mut self, label: String) {
        self.labels.push(label);
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for label in &self.labels {
            for id in containers(label) {
                let _ = Command::new("docker")
                    .args(["rm", "-f", "-v", &id])
                    .output();
            }
        }
        for label in &self.labels {
            for id in images(label) {
                let _ = Command::new("docker").args(["rmi", "-f", &id]).output();
            }
        }
    }
}

/// The image: the process provider and its libraries, on nothing.
pub const DOCKERFILE: &str = "\
FROM scratch
ARG PROVIDER=corbel-provider-process
COPY rootfs/ /
LABEL io.corbel.test.provider=$PROVIDER
";

/// `corbel-provider.yaml` for the process provider as a container.
pub fn docker_metadata() -> String {
    "name: boxed\nversion: 0.1.0\ndescription: the process provider in a container\n\
     runtime: docker\ndocker:\n  dockerfile: Dockerfile\n  context: .\n  \
     build_args: {PROVIDER: corbel-provider-process}\n  \
     command: [/corbel-provider-process]\n  limits: {memory: 256m, cpus: 1}\n\
     features: [deploy, destroy, inspect, nodes]\nresource_types: [process.v1.service]\n"
        .to_owned()
}

/// A repository (tagged `v1`) with [`docker_metadata`], [`DOCKERFILE`] and
/// `rootfs/`: the process provider (stripped) and what `ldd` lists for it.
pub fn docker_provider_repo() -> ProviderRepo {
    ProviderRepo::with_files_and(
        &[
            ("corbel-provider.yaml", &docker_metadata()),
            ("Dockerfile", DOCKERFILE),
        ],
        |work| provider_rootfs(&work.join("rootfs")),
    )
}

/// The process provider at `/corbel-provider-process` under `root`, with
/// the shared libraries and loader it needs at their own paths.
pub fn provider_rootfs(root: &Path) {
    let binary = workspace_bin("corbel-provider-process");
    std::fs::create_dir_all(root).unwrap();
    let target = root.join("corbel-provider-process");
    let stripped = Command::new("strip")
        .arg("-o")
        .arg(&target)
        .arg(&binary)
        .status();
    if !matches!(stripped, Ok(s) if s.success()) {
        std::fs::copy(&binary, &target).unwrap();
    }
    let ldd = Command::new("ldd").arg(&binary).output().expect("ldd runs");
    assert!(ldd.status.success(), "ldd {}", binary.display());
    for line in String::from_utf8(ldd.stdout).unwrap().lines() {
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        let Some(path) = path.filter(|p| p.starts_with('/')) else {
            continue; // linux-vdso: in the kernel
        };
        let copy = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
        std::fs::copy(path, &copy).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}

/// The label the docker provider (`providers/docker`) puts on everything it
/// makes, naming the deployment.
pub const LABEL_DEPLOYMENT: &str = "io.corbel.deployment";

/// A small image for containers as resources: Debian's static busybox on
/// nothing, its applets installed in `/bin`. Built once per test process
/// (docker's cache makes every build after the first instant); its tag.
pub fn busybox_image() -> &'static str {
    const TAG: &str = "corbel-test-busybox:1";
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        require_engine();
        let context = tempfile::tempdir().unwrap();
        let busybox = Path::new("/bin/busybox");
        assert!(
            busybox.exists(),
            "/bin/busybox is missing: install Debian's busybox-static (scripts/test.sh does)"
        );
        std::fs::copy(busybox, context.path().join("busybox")).unwrap();
        std::fs::write(
            context.path().join("Dockerfile"),
            "FROM scratch\nCOPY busybox /bin/busybox\n\
             RUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n\
             LABEL io.corbel.test=busybox\n",
        )
        .unwrap();
        docker(&[
            "build",
            "-q",
            "-t",
            TAG,
            &context.path().display().to_string(),
        ]);
    });
    TAG
}

/// Ids of the networks carrying `label` (`key=value`).
pub fn networks(label: &str) -> Vec<String> {
    let listed = docker(&[
        "network",
        "ls",
        "-q",
        "--no-trunc",
        "--filter",
        &format!("label={label}"),
    ]);
    listed.lines().map(str::to_owned).collect()
}

/// Names of the volumes carrying `label` (`key=value`).
pub fn volumes(label: &str) -> Vec<String> {
    let listed = docker(&["volume", "ls", "-q", "--filter", &format!("label={label}")]);
    listed.lines().map(str::to_owned).collect()
}

/// A container's state as the engine says it (`running`, `exited`, `paused`).
pub fn container_state(id: &str) -> String {
    docker(&["inspect", "-f", "{{.State.Status}}", id])
}

/// Removes, when dropped, every container, network and volume of a
/// deployment (by [`LABEL_DEPLOYMENT`]): what a failed test left.
pub struct DeploymentCleanup(pub String);

impl Drop for DeploymentCleanup {
    fn drop(&mut self) {
        let label = format!("{LABEL_DEPLOYMENT}={}", self.0);
        for id in containers(&label) {
            let _ = Command::new("docker").args(["rm", "-f", &id]).output();
        }
        for id in networks(&label) {
            let _ = Command::new("docker").args(["network", "rm", &id]).output();
        }
        for name in volumes(&label) {
            let _ = Command::new("docker")
                .args(["volume", "rm", "-f", &name])
                .output();
        }
    }
}

/// The label on a [`Net`]'s network and containers, naming the network.
const LABEL_NET: &str = "io.corbel.test.net";

/// A private Docker network and the containers on it, removed when dropped
/// (a failed test included): hosts of their own, for partition tests and
/// remote providers.
pub struct Net {
    pub name: String,
    /// Files the containers are given (mounted by the test).
    pub files: tempfile::TempDir,
}

impl Net {
    /// A new network, `<prefix>-<random>`.
    pub fn new(prefix: &str) -> Net {
        require_engine();
        let name = format!(
            "{prefix}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        docker(&[
            "network",
            "create",
            "--label",
            &format!("{LABEL_NET}={name}"),
            &name,
        ]);
        Net {
            name,
            files: tempfile::tempdir().unwrap(),
        }
    }

    /// `docker run -d` of the busybox image on this network with the host's
    /// `/usr` (and `/lib`, `/lib64` from it) read-only, as `name`: the
    /// host's programs run in it. Returns the container's name.
    pub fn run(&self, name: &str, extra: &[String], command: &str) -> String {
        let container = format!("{}-{name}", self.name);
        let mut args: Vec<String> = [
            "run",
            "-d",
            "--name",
            &container,
            "--hostname",
            name,
            "--network",
            &self.name,
            "--label",
            &format!("{LABEL_NET}={}", self.name),
        ]
        .map(str::to_owned)
        .to_vec();
        for (host, inside) in [
            ("/usr", "/usr"),
            ("/usr/lib", "/lib"),
            ("/usr/lib64", "/lib64"),
        ] {
            if Path::new(host).exists() {
                args.extend(["-v".to_owned(), format!("{host}:{inside}:ro")]);
            }
        }
        args.extend_from_slice(extra);
        args.extend([busybox_image().to_owned(), "sh".into(), "-c".into()]);
        args.push(command.to_owned());
        docker(&args.iter().map(String::as_str).collect::<Vec<_>>());
        container
    }

    /// The host's address on this network: where its containers reach a
    /// server on the host.
    pub fn gateway(&self) -> String {
        docker(&[
            "network",
            "inspect",
            "-f",
            "{{range .IPAM.Config}}{{.Gateway}}{{end}}",
            &self.name,
        ])
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for id in containers(&format!("{LABEL_NET}={}", self.name)) {
            let _ = Command::new("docker").args(["rm", "-f", &id]).output();
        }
        let _ = Command::new("docker")
            .args(["network", "rm", &self.name])
            .output();
    }
}

/// The container's address on its network.
pub fn ip(container: &str) -> String {
    docker(&[
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        container,
    ])
}
