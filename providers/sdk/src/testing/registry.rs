//! The in-process registry: what Corbel's `Registry` does, minus the database.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus as WireStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::server::HealthReporter;

use super::TEST_TOKEN;
use crate::proto::provider_client::ProviderClient;
use crate::proto::registry_server::{Registry, RegistryServer};
use crate::serve::{call, request};
use crate::{REGISTRY_HEALTH_SERVICE, Settings, connect, proto};

/// Options of a [`TestRegistry`].
#[derive(Debug, Clone)]
pub struct TestRegistryBuilder {
    versions: Vec<u32>,
    token: String,
    initial_config: Value,
}

impl TestRegistryBuilder {
    /// Protocol versions the registry speaks (default: [`crate::SUPPORTED_VERSIONS`]).
    pub fn versions(mut self, versions: &[u32]) -> Self {
        self.versions = versions.to_vec();
        self
    }

    /// The token `Register` must carry (default [`TEST_TOKEN`]).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = token.into();
        self
    }

    /// The configuration sent with `Configure` during `Register` (default `{}`).
    pub fn initial_config(mut self, config: Value) -> Self {
        self.initial_config = config;
        self
    }

    pub async fn start(self) -> TestRegistry {
        TestRegistry::start_with(self).await
    }
}

/// One accepted `Register`, its token blanked.
#[derive(Debug, Clone, PartialEq)]
pub struct Registered {
    pub request: proto::RegisterRequest,
    pub session: String,
}

/// A minimal in-process Corbel registry on a temporary unix socket.
pub struct TestRegistry {
    /// Holds the registry socket and the providers' socket directory.
    dir: TempDir,
    socket: PathBuf,
    state: Arc<RegistryState>,
    health: HealthReporter,
    /// The registry's own runtime: shutting it down drops every connection.
    runtime: std::sync::Mutex<Option<tokio::runtime::Runtime>>,
}

struct RegistryState {
    versions: Vec<u32>,
    token: String,
    initial_config: String,
    sessions: AtomicU64,
    registrations: watch::Sender<Vec<Registered>>,
    unregistrations: watch::Sender<Vec<proto::UnregisterRequest>>,
}

impl TestRegistry {
    pub fn builder() -> TestRegistryBuilder {
        TestRegistryBuilder {
            versions: crate::SUPPORTED_VERSIONS.to_vec(),
            token: TEST_TOKEN.to_string(),
            initial_config: Value::Object(Default::default()),
        }
    }

    /// A registry with the default options.
    pub async fn start() -> TestRegistry {
        Self::builder().start().await
    }

    async fn start_with(options: TestRegistryBuilder) -> TestRegistry {
        let dir = tempfile::Builder::new()
            .prefix("corbel-test-")
            .tempdir()
            .expect("create a temporary directory");
        let socket = dir.path().join("registry.sock");
        let listener =
            std::os::unix::net::UnixListener::bind(&socket).expect("bind the registry socket");
        listener
            .set_nonblocking(true)
            .expect("make the registry socket non-blocking");
        let state = Arc::new(RegistryState {
            versions: options.versions,
            token: options.token,
            initial_config: options.initial_config.to_string(),
            sessions: AtomicU64::new(0),
            registrations: watch::channel(Vec::new()).0,
            unregistrations: watch::channel(Vec::new()).0,
        });
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_service_status(REGISTRY_HEALTH_SERVICE, ServingStatus::Serving)
            .await;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("test-registry")
            .enable_all()
            .build()
            .expect("start the registry runtime");
        let registry = RegistryServer::new(TestRegistryService {
            state: state.clone(),
        });
        runtime.spawn(async move {
            let listener =
                tokio::net::UnixListener::from_std(listener).expect("adopt the registry socket");
            let _ = Server::builder()
                .add_service(health_service)
                .add_service(registry)
                .serve_with_incoming(UnixListenerStream::new(listener))
                .await;
        });
        TestRegistry {
            dir,
            socket,
            state,
            health,
            runtime: std::sync::Mutex::new(Some(runtime)),
        }
    }

    /// `unix:///…/registry.sock`, the value of `CORBEL_REGISTRY`.
    pub fn address(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The directory providers put their sockets in (`CORBEL_SOCKET_DIR`).
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.path().join("providers")
    }

    /// Settings for [`serve_with`] registering as `provider_id` with this
    /// registry's token.
    pub fn settings(&self, provider_id: &str) -> Settings {
        Settings::new(
            self.address(),
            provider_id,
            self.state.token.clone(),
            self.socket_dir(),
        )
    }

    /// The environment Corbel would give a provider process.
    pub fn env(&self, provider_id: &str) -> Vec<(&'static str, String)> {
        vec![
            (crate::ENV_REGISTRY, self.address()),
            (crate::ENV_PROVIDER_ID, provider_id.to_string()),
            (crate::ENV_PROVIDER_TOKEN, self.state.token.clone()),
            (
                crate::ENV_SOCKET_DIR,
                self.socket_dir().display().to_string(),
            ),
        ]
    }

    /// Every accepted registration so far, oldest first.
    pub fn registrations(&self) -> Vec<Registered> {
        self.state.registrations.borrow().clone()
    }

    /// Every `Unregister` received so far, oldest first.
    pub fn unregistrations(&self) -> Vec<proto::UnregisterRequest> {
        self.state.unregistrations.borrow().clone()
    }

    /// Waits until at least `count` registrations were accepted.
    pub async fn wait_for_registrations(
        &self,
        count: usize,
        timeout: Duration,
    ) -> Option<Vec<Registered>> {
        let mut rx = self.state.registrations.subscribe();
        let seen = tokio::time::timeout(timeout, rx.wait_for(|r| r.len() >= count)).await;
        seen.ok()?.ok().map(|list| list.clone())
    }

    /// Waits until at least `count` `Unregister` calls arrived.
    pub async fn wait_for_unregistrations(
        &self,
        count: usize,
        timeout: Duration,
    ) -> Option<Vec<proto::UnregisterRequest>> {
        let mut rx = self.state.unregistrations.subscribe();
        let seen = tokio::time::timeout(timeout, rx.wait_for(|r| r.len() >= count)).await;
        seen.ok()?.ok().map(|list| list.clone())
    }

    /// Sets the health the watchdog watches; `false` is a graceful goodbye.
    pub async fn set_serving(&self, serving: bool) {
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        self.health
            .set_service_status(REGISTRY_HEALTH_SERVICE, status)
            .await;
    }

    /// Drops the registry and every connection at once, like a SIGKILL.
    pub fn kill(&self) {
        let runtime = self
            .runtime
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(runtime) = runtime {
            runtime.shutdown_background();
        }
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.kill();
    }
}

struct TestRegistryService {
    state: Arc<RegistryState>,
}

#[tonic::async_trait]
impl Registry for TestRegistryService {
    async fn handshake(
        &self,
        request: Request<proto::HandshakeRequest>,
    ) -> Result<Response<proto::HandshakeResponse>, Status> {
        let theirs = request.into_inner().supported_versions;
        let chosen = corbel_proto::negotiate(&self.state.versions, &theirs)
            .map_err(Status::failed_precondition)?;
        Ok(Response::new(proto::HandshakeResponse {
            chosen_version: chosen,
            server_versions: self.state.versions.clone(),
        }))
    }

    async fn register(
        &self,
        request: Request<proto::RegisterRequest>,
    ) -> Result<Response<proto::RegisterResponse>, Status> {
        let mut request = request.into_inner();
        if request.token != self.state.token {
            return Err(Status::permission_denied(format!(
                "wrong token for provider {}",
                request.id
            )));
        }
        request.token.clear();
        if !self.state.versions.contains(&request.protocol_version) {
            return Err(Status::failed_precondition(format!(
                "protocol version {} was not agreed",
                request.protocol_version
            )));
        }
        self.check_and_configure(&request.endpoint).await?;
        let session = format!(
            "session-{}",
            self.state.sessions.fetch_add(1, Ordering::SeqCst) + 1
        );
        self.state.registrations.send_modify(|list| {
            list.push(Registered {
                request,
                session: session.clone(),
            })
        });
        Ok(Response::new(proto::RegisterResponse { session }))
    }

    async fn unregister(
        &self,
        request: Request<proto::UnregisterRequest>,
    ) -> Result<Response<proto::UnregisterResponse>, Status> {
        let request = request.into_inner();
        self.state
            .unregistrations
            .send_modify(|list| list.push(request));
        Ok(Response::new(proto::UnregisterResponse {}))
    }
}

impl TestRegistryService {
    /// What Corbel does while handling `Register`: dial, check health, configure.
    async fn check_and_configure(&self, endpoint: &str) -> Result<(), Status> {
        let refuse = |what: &str, why: String| {
            Status::failed_precondition(format!("{what} at {endpoint}: {why}"))
        };
        let deadline = Duration::from_secs(10);
        let channel = connect(endpoint, deadline)
            .await
            .map_err(|e| refuse("cannot reach the provider", e.to_string()))?;
        let health = call(
            deadline,
            HealthClient::new(channel.clone()).check(request(
                HealthCheckRequest {
                    service: proto::provider_server::SERVICE_NAME.to_string(),
                },
                deadline,
            )),
        )
        .await
        .map_err(|s| refuse("health check failed", s.message().to_string()))?;
        if health.status != WireStatus::Serving as i32 {
            return Err(refuse("not serving", format!("status {}", health.status)));
        }
        call(
            deadline,
            ProviderClient::new(channel).configure(request(
                proto::ConfigureRequest {
                    config_json: self.state.initial_config.clone(),
                },
                deadline,
            )),
        )
        .await
        .map_err(|s| {
            refuse(
                "Configure failed",
                format!("{:?}: {}", s.code(), s.message()),
            )
        })?;
        Ok(())
    }
}
