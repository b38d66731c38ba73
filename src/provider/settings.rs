//! The provider area's settings: the `[provider]` section of the config file and
//! the `--provider-*` flags (`CORBEL_PROVIDER_*`). Defaults live in `Default`.
//! Settings are values only: nothing here acts on them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::settings::{at_least, millis, seconds};

/// Where providers live on disk, and the timings of their lifecycle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderSettings {
    /// Absolute; holds `providers/<id>/`. Set from the server's data
    /// directory, not configured here.
    #[serde(skip)]
    pub data_dir: PathBuf,
    /// Absolute; a short directory of this server's own holding
    /// `registry.sock` and `sockets/` ([`socket_root_for`] its data
    /// directory), so that every socket path fits whatever the data
    /// directory's length. Empty: the data directory holds them (a
    /// conformance check's scratch directory).
    #[serde(skip)]
    pub socket_root: PathBuf,
    /// Files outside the data directory that hold the server's secrets (its
    /// secret key, its SQLite database, its config file): kept out of every
    /// provider's and build's sandbox with the data directory. Set from the
    /// server's configuration, not configured here.
    #[serde(skip)]
    pub secret_files: Vec<PathBuf>,
    /// Git URL schemes allowed (`file` covers local paths).
    pub git_schemes: Vec<String>,
    /// Whether fetches update git submodules.
    pub git_submodules: bool,
    /// Deadline of a git fetch.
    #[serde(rename = "fetch_timeout_seconds", with = "seconds")]
    pub fetch_timeout: Duration,
    /// Deadline of the build command.
    #[serde(rename = "build_timeout_seconds", with = "seconds")]
    pub build_timeout: Duration,
    /// From start to registration.
    #[serde(rename = "start_timeout_seconds", with = "seconds")]
    pub start_timeout: Duration,
    /// Deadline of each call to a provider.
    #[serde(rename = "call_timeout_ms", with = "millis")]
    pub call_timeout: Duration,
    /// Deadline of a whole `DeployResource` or `DestroyResource` call, its
    /// stream of events included (each event must also come within
    /// `call_timeout_ms` of the one before).
    #[serde(rename = "resource_timeout_seconds", with = "seconds")]
    pub resource_timeout: Duration,
    /// Between SIGTERM and SIGKILL.
    #[serde(rename = "stop_grace_ms", with = "millis")]
    pub stop_grace: Duration,
    /// How often a connected provider's health is checked.
    #[serde(rename = "health_interval_ms", with = "millis")]
    pub health_interval: Duration,
    /// First restart delay of a crashed provider; it doubles.
    #[serde(rename = "backoff_initial_ms", with = "millis")]
    pub backoff_initial: Duration,
    /// Longest restart delay.
    #[serde(rename = "backoff_max_ms", with = "millis")]
    pub backoff_max: Duration,
    /// Providers fetched and built at once.
    pub load_concurrency: usize,
    /// Lines of output kept per provider.
    #[serde(skip)]
    pub log_lines: usize,
    /// Where providers keep their state (`CORBEL_STATE_DIR`), one directory
    /// per provider id under it. Unset: `<data-dir>/providers/<id>/state`.
    /// Replicas that can take over one another's providers on one host (or
    /// with a shared file system) set the same directory, so a relaunched
    /// provider finds what its predecessor ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// The Docker engine of the `docker` runtime (`unix:///…`, `tcp://…`,
    /// `https://…`). Unset: `DOCKER_HOST`, else `unix:///var/run/docker.sock`.
    /// TLS as the docker CLI does it: `DOCKER_TLS_VERIFY` and `DOCKER_CERT_PATH`
    /// (`ca.pem`, `cert.pem`, `key.pem`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_host: Option<String>,
    /// Deadline of each call to the Docker engine (an image build has
    /// `build_timeout_seconds`; waiting for a container and following its
    /// output have none).
    #[serde(rename = "docker_call_timeout_ms", with = "millis")]
    pub docker_call_timeout: Duration,
    /// This server's `instanceId`: the label that tells this instance's
    /// containers from others on the same engine. Set by the server.
    #[serde(skip)]
    pub instance_id: String,
    /// A standby replica's view of the providers (`--cluster`): their rows
    /// only; what needs a provider's link is the leader's to answer
    /// ([`super::ProviderError::OnLeader`]). Set by the server.
    #[serde(skip)]
    pub standby: bool,
    /// Where remote providers register, over TCP with mutual TLS (see
    /// `tls.rs`). Unset: providers register on the local socket only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// The CA certificate (PEM) remote providers' certificates come from.
    /// Unset: `provider-ca.pem` in the data directory, made at first start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_cert_file: Option<PathBuf>,
    /// The CA's private key (PEM), given with `ca_cert_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_key_file: Option<PathBuf>,
    /// Whether shell providers start under a Landlock ruleset (see
    /// `sandbox.rs`): the system's directories, their checkout and build
    /// read-only, their state and socket directories writable, nothing else.
    /// `false` runs them with the server's whole view of the file system.
    pub sandbox: bool,
    /// More directories every sandboxed provider (and so every workload it
    /// starts) may read and execute, e.g. where a prebuilt binary lives.
    pub sandbox_read: Vec<PathBuf>,
    /// More directories every sandboxed provider may write, e.g. what its
    /// workloads need to write.
    pub sandbox_write: Vec<PathBuf>,
}

impl Default for ProviderSettings {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::new(),
            socket_root: PathBuf::new(),
            secret_files: Vec::new(),
            state_dir: None,
            git_schemes: ["https", "http", "git", "ssh", "file"]
                .map(String::from)
                .to_vec(),
            git_submodules: false,
            fetch_timeout: Duration::from_secs(300),
            build_timeout: Duration::from_secs(1800),
            start_timeout: Duration::from_secs(30),
            call_timeout: Duration::from_secs(30),
            resource_timeout: Duration::from_secs(1800),
            stop_grace: Duration::from_secs(5),
            health_interval: Duration::from_secs(5),
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(60),
            load_concurrency: 8,
            log_lines: 2_000,
            docker_host: None,
            docker_call_timeout: Duration::from_secs(60),
            instance_id: String::new(),
            standby: false,
            listen: None,
            ca_cert_file: None,
            ca_key_file: None,
            sandbox: true,
            sandbox_read: Vec::new(),
            sandbox_write: Vec::new(),
        }
    }
}

impl ProviderSettings {
    /// The settings with every value raised to what keeps the server sane (a
    /// zero timeout or interval would fail at once or spin).
    pub fn bounded(self) -> Self {
        Self {
            fetch_timeout: at_least(self.fetch_timeout, Duration::from_secs(1)),
            build_timeout: at_least(self.build_timeout, Duration::from_secs(1)),
            start_timeout: at_least(self.start_timeout, Duration::from_secs(1)),
            call_timeout: at_least(self.call_timeout, Duration::from_millis(10)),
            resource_timeout: at_least(self.resource_timeout, Duration::from_secs(1)),
            health_interval: at_least(self.health_interval, Duration::from_millis(10)),
            backoff_initial: at_least(self.backoff_initial, Duration::from_millis(1)),
            backoff_max: at_least(self.backoff_max, Duration::from_millis(1)),
            load_concurrency: at_least(self.load_concurrency, 1),
            docker_call_timeout: at_least(self.docker_call_timeout, Duration::from_millis(100)),
            ..self
        }
    }

    /// Where the sockets go: the socket root, or the data directory.
    pub fn socket_home(&self) -> &std::path::Path {
        if self.socket_root.as_os_str().is_empty() {
            &self.data_dir
        } else {
            &self.socket_root
        }
    }

    /// The directories on the way to the sockets that Corbel makes: the
    /// socket root's `corbel` parent under `/run` or `/tmp` (shared by the
    /// user's servers), and the root (none for the data directory).
    pub(super) fn socket_root_dirs(&self) -> Vec<&std::path::Path> {
        let root = self.socket_root.as_path();
        if root.as_os_str().is_empty() {
            return Vec::new();
        }
        let parent = root.parent().filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("corbel"))
        });
        parent.into_iter().chain([root]).collect()
    }

    pub fn registry_socket(&self) -> PathBuf {
        self.socket_home().join("registry.sock")
    }

    pub fn socket_dir(&self) -> PathBuf {
        self.socket_home().join("sockets")
    }

    pub(super) fn provider_dir(&self, id: Uuid) -> PathBuf {
        self.data_dir.join("providers").join(id.to_string())
    }

    /// The provider's own state directory (`CORBEL_STATE_DIR`).
    pub(super) fn provider_state_dir(&self, id: Uuid) -> PathBuf {
        match &self.state_dir {
            Some(root) => root.join(id.to_string()),
            None => self.provider_dir(id).join("state"),
        }
    }

    /// What provider `id`, started from `source_dir` and built in
    /// `build_dir`, may touch; `None` when sandboxing is off.
    pub(super) fn sandbox_paths(
        &self,
        id: Uuid,
        source_dir: &std::path::Path,
        build_dir: Option<&std::path::Path>,
    ) -> Option<super::sandbox::SandboxPaths> {
        self.sandbox.then(|| {
            let mut read = vec![source_dir.to_owned()];
            read.extend(build_dir.map(std::path::Path::to_owned));
            // A build into a shared target directory (see `runtime::build_env`).
            read.extend(std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from));
            read.extend(self.sandbox_read.iter().cloned());
            let mut write = vec![self.provider_state_dir(id), self.socket_dir()];
            write.extend(self.sandbox_write.iter().cloned());
            // Nothing hidden at run time: the grants are the provider's own
            // directories and the system's, none holding the data dir unless
            // the operator gave one. (Walking a granted directory that holds
            // the data dir down to it, as a build's ruleset does, left the
            // directories made there later closed to a running provider.)
            super::sandbox::SandboxPaths {
                read,
                write,
                hidden: Vec::new(),
            }
        })
    }

    /// What the build of provider `id`, fetched into `checkout` and built in
    /// `build_dir`, may touch (see [`SandboxPaths::for_build`]); `None` when
    /// sandboxing is off. Its own directory in the data directory is open to
    /// it (its checkout, its builds), its state and the rest are not.
    ///
    /// [`SandboxPaths::for_build`]: super::sandbox::SandboxPaths::for_build
    pub(super) fn build_sandbox_paths(
        &self,
        checkout: &std::path::Path,
        build_dir: &std::path::Path,
    ) -> Option<super::sandbox::SandboxPaths> {
        self.sandbox.then(|| {
            let mut own = vec![checkout.to_owned(), build_dir.to_owned()];
            own.extend(self.sandbox_write.iter().cloned());
            super::sandbox::SandboxPaths::for_build(own, self.hidden_paths())
        })
    }

    /// What no sandbox grants, whatever holds it: the data directory (but
    /// what is granted inside it), the providers' state root when it is
    /// elsewhere, the CA's key and the server's other secret files. But
    /// what the operator grants (`sandbox_read`, `sandbox_write`) is granted
    /// as given: a path under one of those is not hidden.
    fn hidden_paths(&self) -> Vec<PathBuf> {
        let mut hidden = vec![self.data_dir.clone()];
        hidden.extend(self.state_dir.iter().cloned());
        hidden.extend(self.ca_key_file.iter().cloned());
        hidden.extend(self.secret_files.iter().cloned());
        let given: Vec<_> = self
            .sandbox_read
            .iter()
            .chain(&self.sandbox_write)
            .collect();
        hidden.retain(|path| !given.iter().any(|g| path.starts_with(g)));
        hidden
    }

    pub(super) fn source(&self) -> super::source::SourceSettings {
        super::source::SourceSettings {
            allowed_schemes: self.git_schemes.clone(),
            timeout: self.fetch_timeout,
            submodules: self.git_submodules,
        }
    }
}

/// The `--provider-*` flags; each overrides its key of `[provider]`.
#[derive(Clone, Debug, Default, Serialize, clap::Args)]
pub struct ProviderFlags {
    /// Provider git URL schemes allowed, comma-separated (`file` covers local paths).
    #[arg(
        long = "provider-git-schemes",
        env = "CORBEL_PROVIDER_GIT_SCHEMES",
        global = true,
        value_delimiter = ','
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub git_schemes: Option<Vec<String>>,
    /// Update git submodules when fetching providers.
    #[arg(
        long = "provider-git-submodules",
        env = "CORBEL_PROVIDER_GIT_SUBMODULES",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub git_submodules: Option<bool>,
    /// Where providers keep their state, a directory per provider under it.
    #[arg(
        long = "provider-state-dir",
        env = "CORBEL_PROVIDER_STATE_DIR",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// Deadline of a provider's git fetch, in seconds.
    #[arg(
        long = "provider-fetch-timeout-seconds",
        env = "CORBEL_PROVIDER_FETCH_TIMEOUT_SECONDS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fetch_timeout_seconds: Option<u64>,
    /// Deadline of a provider's build command, in seconds.
    #[arg(
        long = "provider-build-timeout-seconds",
        env = "CORBEL_PROVIDER_BUILD_TIMEOUT_SECONDS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build_timeout_seconds: Option<u64>,
    /// How long a started provider has to register, in seconds.
    #[arg(
        long = "provider-start-timeout-seconds",
        env = "CORBEL_PROVIDER_START_TIMEOUT_SECONDS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_timeout_seconds: Option<u64>,
    /// Deadline of each call to a provider, in milliseconds.
    #[arg(
        long = "provider-call-timeout-ms",
        env = "CORBEL_PROVIDER_CALL_TIMEOUT_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_timeout_ms: Option<u64>,
    /// Deadline of a whole DeployResource or DestroyResource call, in seconds.
    #[arg(
        long = "provider-resource-timeout-seconds",
        env = "CORBEL_PROVIDER_RESOURCE_TIMEOUT_SECONDS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_timeout_seconds: Option<u64>,
    /// Between SIGTERM and SIGKILL when stopping a provider, in milliseconds.
    #[arg(
        long = "provider-stop-grace-ms",
        env = "CORBEL_PROVIDER_STOP_GRACE_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_grace_ms: Option<u64>,
    /// How often a provider's health is checked, in milliseconds.
    #[arg(
        long = "provider-health-interval-ms",
        env = "CORBEL_PROVIDER_HEALTH_INTERVAL_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_interval_ms: Option<u64>,
    /// First restart delay of a crashed provider, in milliseconds.
    #[arg(
        long = "provider-backoff-initial-ms",
        env = "CORBEL_PROVIDER_BACKOFF_INITIAL_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_initial_ms: Option<u64>,
    /// Longest restart delay of a crashed provider, in milliseconds.
    #[arg(
        long = "provider-backoff-max-ms",
        env = "CORBEL_PROVIDER_BACKOFF_MAX_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_max_ms: Option<u64>,
    /// Providers fetched and built at once.
    #[arg(
        long = "provider-load-concurrency",
        env = "CORBEL_PROVIDER_LOAD_CONCURRENCY",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_concurrency: Option<usize>,
    /// The Docker engine of the docker runtime (TLS from `DOCKER_TLS_VERIFY`
    /// and `DOCKER_CERT_PATH`).
    #[arg(
        long = "provider-docker-host",
        env = "CORBEL_PROVIDER_DOCKER_HOST",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_host: Option<String>,
    /// Deadline of each call to the Docker engine, in milliseconds.
    #[arg(
        long = "provider-docker-call-timeout-ms",
        env = "CORBEL_PROVIDER_DOCKER_CALL_TIMEOUT_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_call_timeout_ms: Option<u64>,
    /// Where remote providers register over TCP with mutual TLS (host:port).
    #[arg(
        id = "provider_listen",
        value_name = "HOST:PORT",
        long = "provider-listen",
        env = "CORBEL_PROVIDER_LISTEN",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// The remote providers' CA certificate (PEM); made in the data
    /// directory when unset.
    #[arg(
        id = "provider_ca_cert_file",
        value_name = "FILE",
        long = "provider-ca-cert",
        env = "CORBEL_PROVIDER_CA_CERT",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_cert_file: Option<PathBuf>,
    /// The remote providers' CA key (PEM), with `--provider-ca-cert`.
    #[arg(
        id = "provider_ca_key_file",
        value_name = "FILE",
        long = "provider-ca-key",
        env = "CORBEL_PROVIDER_CA_KEY",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_key_file: Option<PathBuf>,
    /// Start shell providers under a Landlock ruleset (true or false).
    #[arg(
        long = "provider-sandbox",
        env = "CORBEL_PROVIDER_SANDBOX",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<bool>,
    /// More directories sandboxed providers may read, comma-separated.
    #[arg(
        long = "provider-sandbox-read",
        env = "CORBEL_PROVIDER_SANDBOX_READ",
        global = true,
        value_delimiter = ','
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox_read: Option<Vec<PathBuf>>,
    /// More directories sandboxed providers may write, comma-separated.
    #[arg(
        long = "provider-sandbox-write",
        env = "CORBEL_PROVIDER_SANDBOX_WRITE",
        global = true,
        value_delimiter = ','
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox_write: Option<Vec<PathBuf>>,
}

/// The short directory of the unix sockets of the server whose data
/// directory is `data_dir` (absolute): `$XDG_RUNTIME_DIR/corbel-<h>`, else
/// `/run/corbel/<h>` for root (where there is a `/run`), else
/// `/tmp/corbel-<uid>/<h>`, `h` the first 12
/// hex digits of the SHA-256 of the data directory's path: the same at every
/// start (a provider left running finds the registry again), another for
/// each data directory. At most 44 bytes under `/run` or `/tmp`, so that
/// `<root>/sockets/<12 hex>/<uuid>.sock` fits a socket's 107.
pub fn socket_root_for(data_dir: &std::path::Path) -> PathBuf {
    use sha2::Digest as _;
    use std::os::unix::ffi::OsStrExt as _;
    let digest = sha2::Sha256::digest(data_dir.as_os_str().as_bytes());
    let short = hex::encode(&digest[..6]);
    let uid = nix::unistd::getuid();
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir.join(format!("corbel-{short}")),
        _ if uid.is_root() && std::path::Path::new("/run").is_dir() => {
            PathBuf::from("/run/corbel").join(short)
        }
        _ => PathBuf::from(format!("/tmp/corbel-{uid}")).join(short),
    }
}

/// Longest path a unix socket address holds on Linux.
pub(super) const MAX_SOCKET_PATH: usize = 107;

/// The socket directory of provider `id` alone (a provider run as another
/// user binds its socket there; a Docker provider's is mounted into its
/// container at the same path): `<socket dir>/<the last 12 hex digits of its
/// id>`, the random part of a v4 or v7 uuid. Short, so that the socket in
/// it, `<id>.sock` as the SDKs bind it, fits a unix socket's path under a
/// socket root of up to 44 bytes (`<socket dir>/<id>/<id>.sock` left 20).
pub(super) fn own_socket_dir(socket_dir: &std::path::Path, id: uuid::Uuid) -> std::path::PathBuf {
    let simple = id.simple().to_string();
    socket_dir.join(&simple[simple.len() - 12..])
}

/// Refuses a unix socket path longer than [`MAX_SOCKET_PATH`], naming it.
pub(super) fn check_socket_path(path: &std::path::Path) -> anyhow::Result<()> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        anyhow::bail!(
            "the socket path {} is {len} bytes long; unix sockets allow {MAX_SOCKET_PATH}: set XDG_RUNTIME_DIR to a shorter directory",
            path.display()
        );
    }
    Ok(())
}
