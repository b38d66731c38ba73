//! The host `corbel provider check` runs a provider against: a registry of its
//! own on a unix socket in a scratch directory, speaking the protocol as the
//! server's registry does (handshake, register with dial, health and
//! configure, unregister, `grpc.health.v1` for the watchdog), but recording
//! what the provider did instead of storing it. It runs on a runtime of its
//! own, so that `kill` drops every connection at once, as a killed server
//! would.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use corbel_proto::v1::registry_server::{Registry, RegistryServer};
use corbel_proto::v1::{
    HandshakeRequest, HandshakeResponse, RegisterRequest, RegisterResponse, UnregisterRequest,
    UnregisterResponse,
};
use tokio::sync::watch;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;

use super::authority::AuthorityFix;
use super::link::Link;
use super::registry::REGISTRY_SERVICE;

/// What the provider did with the host, in order.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// The versions of each `Handshake`, and the version chosen (or the refusal).
    pub handshakes: Vec<(Vec<u32>, Result<u32, String>)>,
    /// Each accepted `Register` (token blanked) with its session.
    pub registrations: Vec<(RegisterRequest, String)>,
    /// Each refused `Register`, with the reason.
    pub refusals: Vec<String>,
    pub unregistrations: Vec<UnregisterRequest>,
}

pub struct CheckHost {
    socket: PathBuf,
    seen: watch::Sender<Seen>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

struct Service {
    token: String,
    id: String,
    config_json: String,
    deadline: Duration,
    seen: watch::Sender<Seen>,
}

impl CheckHost {
    /// Serves the registry at `<dir>/registry.sock`, for the provider `id`
    /// with `token`, sending `config_json` with the `Configure` of a
    /// registration.
    pub fn start(
        dir: &Path,
        id: &str,
        token: &str,
        config_json: String,
        deadline: Duration,
    ) -> anyhow::Result<CheckHost> {
        use anyhow::Context as _;
        let socket = dir.join("registry.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket)
            .with_context(|| format!("binding {}", socket.display()))?;
        listener.set_nonblocking(true)?;
        let seen = watch::channel(Seen::default()).0;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("check-host")
            .enable_all()
            .build()
            .context("starting the host's runtime")?;
        let service = Service {
            token: token.to_owned(),
            id: id.to_owned(),
            config_json,
            deadline,
            seen: seen.clone(),
        };
        runtime.spawn(async move {
            let (reporter, health) = tonic_health::server::health_reporter();
            reporter
                .set_service_status(REGISTRY_SERVICE, ServingStatus::Serving)
                .await;
            let Ok(listener) = tokio::net::UnixListener::from_std(listener) else {
                return;
            };
            let _ = tonic::transport::Server::builder()
                .add_service(health)
                .add_service(RegistryServer::new(service))
                // grpc-core clients' `:authority` made acceptable, as the server's registry does.
                .serve_with_incoming(
                    UnixListenerStream::new(listener)
                        .map(|accepted| accepted.map(AuthorityFix::new)),
                )
                .await;
            // Keeps the reporter (and so the watched status) alive until the end.
            drop(reporter);
        });
        Ok(CheckHost {
            socket,
            seen,
            runtime: Mutex::new(Some(runtime)),
        })
    }

    /// `CORBEL_REGISTRY` for the provider.
    pub fn address(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn seen(&self) -> Seen {
        self.seen.borrow().clone()
    }

    /// Waits until `done` holds for what was seen, or `within` passes.
    pub async fn wait_for(&self, within: Duration, done: impl Fn(&Seen) -> bool) -> Option<Seen> {
        let mut rx = self.seen.subscribe();
        let waited = tokio::time::timeout(within, rx.wait_for(|seen| done(seen))).await;
        waited.ok()?.ok().map(|seen| seen.clone())
    }

    /// Drops the registry and every connection at once, like a killed server.
    pub fn kill(&self) {
        let runtime = self
            .runtime
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(runtime) = runtime {
            runtime.shutdown_background();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for CheckHost {
    fn drop(&mut self) {
        self.kill();
    }
}

#[tonic::async_trait]
impl Registry for Service {
    async fn handshake(
        &self,
        request: Request<HandshakeRequest>,
    ) -> Result<Response<HandshakeResponse>, Status> {
        let theirs = request.into_inner().supported_versions;
        let chosen = corbel_proto::negotiate(corbel_proto::SUPPORTED_VERSIONS, &theirs);
        self.seen
            .send_modify(|seen| seen.handshakes.push((theirs, chosen.clone())));
        match chosen {
            Ok(chosen) => Ok(Response::new(HandshakeResponse {
                chosen_version: chosen,
                server_versions: corbel_proto::SUPPORTED_VERSIONS.to_vec(),
            })),
            Err(message) => Err(Status::failed_precondition(format!(
                "handshake refused: {message}"
            ))),
        }
    }

    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        let mut request = request.into_inner();
        if let Err(status) = self.admit(&request).await {
            self.seen.send_modify(|seen| {
                seen.refusals
                    .push(format!("{:?}: {}", status.code(), status.message()))
            });
            return Err(status);
        }
        request.token.clear();
        let session = uuid::Uuid::new_v4().to_string();
        self.seen
            .send_modify(|seen| seen.registrations.push((request, session.clone())));
        Ok(Response::new(RegisterResponse { session }))
    }

    async fn unregister(
        &self,
        request: Request<UnregisterRequest>,
    ) -> Result<Response<UnregisterResponse>, Status> {
        let request = request.into_inner();
        let known = self
            .seen
            .borrow()
            .registrations
            .iter()
            .any(|(r, session)| r.id == request.id && *session == request.session);
        self.seen
            .send_modify(|seen| seen.unregistrations.push(request.clone()));
        if known {
            Ok(Response::new(UnregisterResponse {}))
        } else {
            Err(Status::not_found(format!(
                "no session `{}` for provider `{}`",
                request.session, request.id
            )))
        }
    }
}

impl Service {
    /// What the server's registry checks before it answers `Register`.
    async fn admit(&self, request: &RegisterRequest) -> Result<(), Status> {
        if request.id != self.id {
            return Err(Status::invalid_argument(format!(
                "id: `{}` is not the CORBEL_PROVIDER_ID given (`{}`)",
                request.id, self.id
            )));
        }
        if request.token != self.token {
            return Err(Status::permission_denied(
                "token: not the CORBEL_PROVIDER_TOKEN given",
            ));
        }
        if !corbel_proto::SUPPORTED_VERSIONS.contains(&request.protocol_version) {
            return Err(Status::failed_precondition(format!(
                "protocol_version: {} is not one this host speaks ({:?})",
                request.protocol_version,
                corbel_proto::SUPPORTED_VERSIONS
            )));
        }
        let refuse = |what: &str, why: String| {
            Status::failed_precondition(format!("{what} at `{}`: {why}", request.endpoint))
        };
        let link = Link::dial(&request.endpoint, self.deadline, self.deadline)
            .await
            .map_err(|e| refuse("cannot reach the provider", e.to_string()))?;
        link.check_health(None)
            .await
            .map_err(|e| refuse("health check failed", e.to_string()))?;
        link.configure(self.config_json.clone())
            .await
            .map_err(|e| refuse("Configure failed", e.to_string()))?;
        Ok(())
    }
}
