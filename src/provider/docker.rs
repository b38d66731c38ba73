//! The Docker runtime: a provider built as an image from its checkout and run
//! as a container, through bollard, behind the same `Runtime`/`Running` traits
//! as the shell runtime.
//!
//! - **Images** are tagged `corbel-provider-<provider id>:<commit>`, so two
//!   providers (or two commits) never collide, and labelled with a digest of
//!   what else the build read (`dockerfile`, `context`, `build_args`, the
//!   provider's `path`; no label names the commit, since the engine adds each
//!   label as a build step, and one that changed with every commit would make
//!   a rebuild of unchanged files miss its cache). A build whose tag exists
//!   with the same digest is a cache hit: nothing is sent to the engine.
//!   Otherwise the context is sent as a tar (symlinks kept as links, never
//!   followed out of the checkout; `.git` left out) and the engine's output
//!   goes to the provider's log, each step to its status message. A provider
//!   keeps one image: a new build removes its images of other commits, and
//!   deleting the provider removes the last.
//! - **Containers** carry `io.corbel.instance` (this server's `instanceId`),
//!   `io.corbel.provider` (the provider id) and `io.corbel.boot` (this server
//!   process). They mount, at the same paths, the registry socket, a socket
//!   directory of their own (`<socket dir>/<id>`, their `CORBEL_SOCKET_DIR`:
//!   never the other providers' sockets) and the provider's state directory,
//!   so registration is the shell runtime's. No restart policy: the supervisor
//!   restarts with its backoff. A container that exits is removed once its
//!   status and last output are read; stopping is the engine's stop (SIGTERM,
//!   SIGKILL after the grace), then removal.
//! - **No orphans**: a provider has at most one container, so starting one
//!   first removes whatever this instance left of that provider; and at server
//!   start, [`Engine::sweep`] removes this instance's containers of any other
//!   boot (a crashed server's), before any provider loads. This holds with
//!   replicas too: only the leader runs providers, and it starts (and
//!   sweeps) only once it holds the server lock, taken over from a leader
//!   whose lease has run out, which stopped itself before that.
//! - **Binding**: the launch is bound to the container's pid namespace (see
//!   `binding.rs`), when the engine's `State.Pid` is a process this server can
//!   see and its cgroup names the container; otherwise (a remote engine,
//!   Corbel itself in a container) the launch is unbound and the log says so.
//!
//! Every engine call has a deadline (`docker_call_timeout_ms`; the build has
//! `build_timeout_seconds`), except following a container's output and waiting
//! for it to exit, which last as long as the container.
//!
//! This file holds the labels and [`DockerRuntime`]; `engine` is the client
//! and what it lists and removes, `image` builds, `container` runs.

mod container;
mod engine;
mod image;

use std::path::PathBuf;
use std::sync::Arc;

use uuid::Uuid;

use super::metadata::DockerSpec;
use super::runtime::{Job, Running, Runtime, RuntimeError};

pub use engine::Engine;

/// This server's `instanceId`, on every container it starts.
pub const LABEL_INSTANCE: &str = "io.corbel.instance";
/// The provider a container or image belongs to.
pub const LABEL_PROVIDER: &str = "io.corbel.provider";
/// The server process that started a container: one of another boot of the
/// same instance is an orphan.
pub const LABEL_BOOT: &str = "io.corbel.boot";
/// The digest of an image's build inputs besides the commit (its tag).
pub const LABEL_BUILD: &str = "io.corbel.build";

/// Lines of output quoted in a failure message.
const TAIL_LINES: usize = 20;

/// A provider's `docker:` section, for one provider at one commit.
pub struct DockerRuntime {
    pub engine: Arc<Engine>,
    pub spec: DockerSpec,
    pub provider: Uuid,
    /// The checkout's commit: the image's tag.
    pub commit: String,
    /// The provider's `path` in its repository (part of the build digest).
    pub path: String,
    /// Mounted at the same path in the container.
    pub registry_socket: PathBuf,
    /// The server's socket directory. The container gets only a directory of
    /// its own in it, `<socket dir>/<provider id>`, as its `CORBEL_SOCKET_DIR`:
    /// never the other providers' sockets, which it could otherwise call.
    pub socket_dir: PathBuf,
    /// The provider's state directory, mounted at the same path.
    pub state_dir: PathBuf,
}

impl DockerRuntime {
    /// `corbel-provider-<provider id>:<commit>`.
    pub fn image(&self) -> String {
        image_tag(self.provider, &self.commit)
    }
}

pub fn image_tag(provider: Uuid, commit: &str) -> String {
    format!("corbel-provider-{provider}:{commit}")
}

#[async_trait::async_trait]
impl Runtime for DockerRuntime {
    async fn build(&self, job: &Job) -> Result<(), RuntimeError> {
        self.build_image(job).await
    }

    async fn start(
        &self,
        job: &Job,
        env: &[(String, String)],
    ) -> Result<Box<dyn Running>, RuntimeError> {
        self.start_container(job, env).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_tagged_by_provider_and_commit() {
        let id = Uuid::nil();
        assert_eq!(
            image_tag(id, "0123abcd"),
            "corbel-provider-00000000-0000-0000-0000-000000000000:0123abcd"
        );
    }
}
