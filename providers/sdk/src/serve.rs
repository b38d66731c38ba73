//! A provider's life, in order: take the environment (see `env.rs`), connect to the
//! registry, handshake, listen on `<socket dir>/<id>.sock`, register, serve
//! until told to stop (unregister, exit 0) or until the registry goes away
//! (the watchdog: a provider never outlives its server).
//!
//! Architecture invariant: the provider's socket accepts connections before
//! `Register` is sent, because Corbel dials it, checks health and sends
//! `Configure` while it handles `Register`.

use std::future::Future;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::pin::pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig,
};
use tonic::{Code, Request, Response, Status};
use tonic_health::ServingStatus;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus as WireStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::server::HealthReporter;
use tracing::{info, warn};

use crate::proto;
use crate::proto::registry_client::RegistryClient;
use crate::service::ProviderService;
use crate::settings::{REGISTRY_TLS_NAME, Remote};
use crate::{PROVIDER_ENV, Provider, ProviderEnv, Registration, SdkError, Settings};

/// The health service name the watchdog watches on the registry connection.
/// Corbel serves `grpc.health.v1` on its registry socket with this name SERVING.
pub const REGISTRY_HEALTH_SERVICE: &str = proto::registry_server::SERVICE_NAME;

/// How a provider that served successfully came to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// The shutdown future completed (SIGTERM or SIGINT under [`serve`]);
    /// `Unregister` was sent.
    Requested,
    /// The registry stopped serving or its connection closed: the server is gone.
    RegistryGone(String),
}

/// Runs a provider under Corbel: settings from the environment, stop on
/// SIGTERM or SIGINT. Prefer [`run`](crate::run) with [`serve_env`] as `main`:
/// called from `#[tokio::main]`, the runtime's threads already run, so Corbel's
/// variables cannot be removed from the environment (see
/// [`ProviderEnv`]); `serve` then warns in its log.
///
/// Exit codes: 0 after a requested stop or when the registry went away; 2 when
/// the environment is incomplete; 1 for any other error (refused handshake or
/// registration, unreachable registry, unusable socket). Errors go to stderr.
pub async fn serve<P: Provider>(provider: P) -> ExitCode {
    serve_env(ProviderEnv::take(), provider).await
}

/// [`serve`] with the variables [`ProviderEnv::take`] took (by [`run`](crate::run)).
pub async fn serve_env<P: Provider>(env: ProviderEnv, provider: P) -> ExitCode {
    serve_env_with(env, provider, |_| {}).await
}

/// [`serve_env`], with the settings read from `env` changed by `adjust` first
/// (e.g. fewer [`Settings::protocol_versions`]).
pub async fn serve_env_with<P: Provider>(
    env: ProviderEnv,
    provider: P,
    adjust: impl FnOnce(&mut Settings),
) -> ExitCode {
    init_tracing();
    let name = provider.info().name;
    if !env.removed() {
        warn!(
            "Corbel's variables ({}) are still in this process's environment, so programs it \
             starts inherit the registration token: they were taken with other threads \
             running; start the provider with corbel_provider_sdk::run",
            PROVIDER_ENV.join(", ")
        );
    }
    let mut settings = match env.settings() {
        Ok(settings) => settings,
        Err(error) => return fail(&name, error),
    };
    adjust(&mut settings);
    let shutdown = match termination() {
        Ok(shutdown) => shutdown,
        Err(error) => {
            eprintln!("{name}: cannot install signal handlers: {error}");
            return ExitCode::FAILURE;
        }
    };
    match serve_with(settings, provider, shutdown).await {
        Ok(Stopped::Requested) => ExitCode::SUCCESS,
        Ok(Stopped::RegistryGone(_)) => ExitCode::SUCCESS,
        Err(error) => fail(&name, error),
    }
}

fn fail(name: &str, error: SdkError) -> ExitCode {
    eprintln!("{name}: {error}");
    ExitCode::from(error.exit_code())
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // An author who installed a subscriber already keeps theirs.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        // Corbel captures stderr into the provider's log: no colour codes there.
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .try_init();
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed now, so a signal
/// arriving during startup is not lost.
fn termination() -> io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// Runs a provider until `shutdown` completes or the registry goes away.
pub async fn serve_with<P: Provider>(
    settings: Settings,
    provider: P,
    shutdown: impl Future<Output = ()>,
) -> Result<Stopped, SdkError> {
    settings.validate()?;
    let provider = Arc::new(provider);
    let mut shutdown = pin!(shutdown);
    // Until `Register` is sent nothing needs undoing, so a stop ends it all.
    // Once sent, the call runs to its answer (bounded by its deadline), so that
    // a registration Corbel accepted is always followed by `Unregister`.
    let prepared = tokio::select! {
        prepared = prepare(&settings, provider.clone()) => prepared?,
        () = &mut shutdown => {
            info!(provider.id = %settings.provider_id, "stop requested before registering");
            return Ok(Stopped::Requested);
        }
    };
    let watch = watch_registry(prepared.channel.clone(), settings.call_timeout).await;
    let Started {
        channel,
        mut server,
        registration,
    } = register(&settings, provider, prepared).await?;
    let stopped = tokio::select! {
        reason = registry_gone(watch) => {
            warn!(provider.id = %settings.provider_id, reason = %reason, "the registry is gone; stopping");
            Stopped::RegistryGone(reason)
        }
        () = &mut shutdown => {
            info!(provider.id = %settings.provider_id, "stop requested; unregistering");
            unregister(channel, &registration, settings.unregister_timeout).await;
            Stopped::Requested
        }
        result = &mut server.task => {
            let reason = match result {
                Ok(Ok(())) => "it stopped unasked".to_string(),
                Ok(Err(error)) => error.to_string(),
                Err(error) => error.to_string(),
            };
            return Err(SdkError::Serve(reason));
        }
    };
    server.stop(settings.shutdown_grace).await;
    Ok(stopped)
}

/// Why a call failed below gRPC (the connection, its TLS handshake), from
/// the error's sources; `None` when the registry answered. Over TLS it
/// says what to check: the registry refuses a client certificate it does
/// not trust by closing the connection at the first call.
fn below_grpc(status: &tonic::Status, tls: bool) -> Option<String> {
    let mut source = std::error::Error::source(status)?;
    let mut reasons = vec![source.to_string()];
    while let Some(next) = source.source() {
        source = next;
        reasons.push(source.to_string());
    }
    reasons.dedup();
    let reason = reasons.join(": ");
    Some(match (tls, tls_refusal(&reason)) {
        (true, Some(what)) => format!("the TLS handshake failed: {what} ({reason})"),
        (true, None) => format!(
            "the TLS handshake failed or the registry closed the connection ({reason}): \
             the registry trusts only a certificate this Corbel issued to this provider \
             (issueProviderCertificate), unexpired, with its key; this provider trusts only \
             a registry of the CA file it was given. Corbel's log says which it refused \
             (\"a remote provider's connection was refused: …\")"
        ),
        (false, _) => reason,
    })
}

/// What a TLS failure's error chain says was wrong, in a user's words: the
/// alert the registry sent about this provider's certificate, or what this
/// provider found wrong with the registry's (rustls's words for both).
fn tls_refusal(reason: &str) -> Option<&'static str> {
    const REFUSALS: [(&[&str], &str); 8] = [
        (
            &["alert: UnknownCA"],
            "the registry does not trust this provider's certificate: it was issued by another \
             CA (unknown CA); ask this Corbel for one (issueProviderCertificate)",
        ),
        (
            // The registry's CA has the same name as the one that signed the
            // certificate (another Corbel's, say), but not its key.
            &["alert: DecryptError"],
            "the registry does not trust this provider's certificate: its signature does not \
             verify with the registry's CA, so it was issued by another CA (of the same name); \
             ask this Corbel for one (issueProviderCertificate)",
        ),
        (
            &["alert: CertificateExpired"],
            "the registry refused this provider's certificate as expired (or not yet valid): \
             ask for a new one (issueProviderCertificate), and check both hosts' clocks",
        ),
        (
            &["alert: CertificateRequired"],
            "the registry asks for a client certificate and none was sent: give this \
             provider its certificate and key",
        ),
        (
            &["alert: BadCertificate"],
            "the registry refused this provider's certificate (bad certificate): use the \
             certificate and key issueProviderCertificate gave, unchanged",
        ),
        (
            &["UnknownIssuer"],
            "the registry's certificate is not from the CA file this provider was given \
             (unknown CA): give it the `ca` issueProviderCertificate returned",
        ),
        (
            &["not valid for name", "NotValidForName"],
            "the registry's certificate is not for the name this provider expects \
             (wrong name): the address may lead to another TLS server than Corbel's registry",
        ),
        (
            &[
                "certificate expired",
                "Expired",
                "NotValidYet",
                "not valid yet",
            ],
            "the registry's certificate has expired (or is not valid yet): check both \
             hosts' clocks, and the provider CA's dates",
        ),
    ];
    REFUSALS
        .iter()
        .find(|(said, _)| said.iter().any(|said| reason.contains(said)))
        .map(|(_, what)| *what)
}

struct Started {
    /// The registry connection: calls, and the watchdog's health stream.
    channel: Channel,
    server: RunningServer,
    registration: Registration,
}

/// Connected, agreed on a version, and serving: ready to register.
struct Prepared {
    channel: Channel,
    server: RunningServer,
    version: u32,
}

async fn prepare<P: Provider>(settings: &Settings, provider: Arc<P>) -> Result<Prepared, SdkError> {
    let deadline = settings.call_timeout;
    let channel = match &settings.remote {
        Some(remote) => connect_tls(&settings.registry, remote, deadline).await?,
        None => connect(&settings.registry, deadline).await?,
    };
    let ours = settings.protocol_versions.clone();
    let handshake = call(
        deadline,
        RegistryClient::new(channel.clone()).handshake(request(
            proto::HandshakeRequest {
                supported_versions: ours.clone(),
            },
            deadline,
        )),
    )
    .await
    .map_err(
        |status| match below_grpc(&status, settings.remote.is_some()) {
            // The connection itself failed (its TLS, say): not a refusal.
            Some(reason) => SdkError::Connect {
                address: settings.registry.clone(),
                reason,
            },
            None => SdkError::HandshakeRefused {
                code: status.code(),
                message: status.message().to_string(),
                ours: ours.clone(),
            },
        },
    )?;
    let version = handshake.chosen_version;
    if !ours.contains(&version) {
        return Err(SdkError::HandshakeRefused {
            code: Code::FailedPrecondition,
            message: format!(
                "the registry chose version {version}, which this provider does not speak (the registry speaks {:?})",
                handshake.server_versions
            ),
            ours,
        });
    }
    let server = RunningServer::start(settings, provider).await?;
    Ok(Prepared {
        channel,
        server,
        version,
    })
}

async fn register<P: Provider>(
    settings: &Settings,
    provider: Arc<P>,
    prepared: Prepared,
) -> Result<Started, SdkError> {
    let Prepared {
        channel,
        server,
        version,
    } = prepared;
    let id = &settings.provider_id;
    let deadline = settings.call_timeout;
    let endpoint = server.endpoint.clone();
    let info = provider.info();
    let response = call(
        deadline,
        RegistryClient::new(channel.clone()).register(request(
            proto::RegisterRequest {
                id: id.clone(),
                token: settings.token.clone(),
                name: info.name,
                version: info.version,
                protocol_version: version,
                features: info.features,
                resource_types: info.resource_types,
                endpoint: endpoint.clone(),
            },
            deadline,
        )),
    )
    .await
    .map_err(|status| SdkError::RegisterRefused {
        code: status.code(),
        message: status.message().to_string(),
    })?;
    let registration = Registration {
        provider_id: id.clone(),
        session: response.session,
        protocol_version: version,
        endpoint,
    };
    info!(
        provider.id = %id,
        provider.session = %registration.session,
        protocol.version = version,
        endpoint = %registration.endpoint,
        "registered"
    );
    provider.registered(&registration).await;
    Ok(Started {
        channel,
        server,
        registration,
    })
}

/// Opens a channel to `address` (`unix:///abs/path.sock` or `http://host:port`),
/// failing after `deadline`.
pub async fn connect(address: &str, deadline: Duration) -> Result<Channel, SdkError> {
    connect_with(address, None, deadline).await
}

/// Opens a channel to the registry at `address` (`https://host:port`) over
/// mutual TLS: the registry's certificate must come from `remote`'s CA and
/// name [`REGISTRY_TLS_NAME`]; this provider presents its own.
pub async fn connect_tls(
    address: &str,
    remote: &Remote,
    deadline: Duration,
) -> Result<Channel, SdkError> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&remote.ca))
        .domain_name(REGISTRY_TLS_NAME)
        .identity(Identity::from_pem(&remote.certificate, &remote.key));
    connect_with(address, Some(tls), deadline).await
}

async fn connect_with(
    address: &str,
    tls: Option<ClientTlsConfig>,
    deadline: Duration,
) -> Result<Channel, SdkError> {
    let failed = |reason: String| SdkError::Connect {
        address: address.to_string(),
        reason,
    };
    let mut endpoint =
        Endpoint::from_shared(address.to_string()).map_err(|e| failed(e.to_string()))?;
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| failed(error_chain(&e)))?;
    }
    let endpoint = endpoint
        .connect_timeout(deadline)
        // Notices a server that stopped answering without closing the socket.
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(20));
    match tokio::time::timeout(deadline, endpoint.connect()).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(error)) => Err(failed(error_chain(&error))),
        Err(_) => Err(failed(format!("no connection within {deadline:?}"))),
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A request carrying `deadline` as its gRPC timeout.
pub(crate) fn request<T>(message: T, deadline: Duration) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(deadline);
    request
}

/// Awaits a call, giving up after `deadline` even if the server never answers.
pub(crate) async fn call<T>(
    deadline: Duration,
    call: impl Future<Output = Result<Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(deadline, call).await {
        Ok(result) => result.map(Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "no answer within {deadline:?}"
        ))),
    }
}

/// Resolves, with the reason, once the registry is not SERVING any more.
/// Opens the watch of the registry's health now, before registering: the
/// stream lives on the connection the registration goes over, so a server
/// that dies after answering `Register` is seen gone even when a new server
/// is already listening at the same socket (a channel would reconnect to it,
/// and a watch opened then would find the new server SERVING).
async fn watch_registry(
    channel: Channel,
    deadline: Duration,
) -> Result<tonic::codec::Streaming<tonic_health::pb::HealthCheckResponse>, String> {
    let mut health = HealthClient::new(channel);
    let watch = health.watch(HealthCheckRequest {
        service: REGISTRY_HEALTH_SERVICE.to_string(),
    });
    // Only the opening has a deadline; the stream itself lasts as long as the server.
    match tokio::time::timeout(deadline, watch).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(format!(
            "cannot watch the registry's health ({REGISTRY_HEALTH_SERVICE}): {:?}: {}",
            status.code(),
            status.message()
        )),
        Err(_) => Err(format!(
            "the registry's health watch did not open within {deadline:?}"
        )),
    }
}

/// Follows the watch [`watch_registry`] opened until the registry is gone.
async fn registry_gone(
    watch: Result<tonic::codec::Streaming<tonic_health::pb::HealthCheckResponse>, String>,
) -> String {
    let mut stream = match watch {
        Ok(stream) => stream,
        Err(why) => return why,
    };
    loop {
        match stream.message().await {
            Ok(Some(update)) if update.status == WireStatus::Serving as i32 => continue,
            Ok(Some(update)) => {
                let status = WireStatus::try_from(update.status)
                    .map(|s| s.as_str_name().to_string())
                    .unwrap_or_else(|_| update.status.to_string());
                return format!("the registry reports {status}");
            }
            Ok(None) => return "the registry's health stream ended".to_string(),
            Err(status) => {
                return format!(
                    "the registry connection failed: {:?}: {}",
                    status.code(),
                    status.message()
                );
            }
        }
    }
}

/// Says goodbye; a registry that does not answer in time is not waited for.
async fn unregister(channel: Channel, registration: &Registration, deadline: Duration) {
    let mut registry = RegistryClient::new(channel);
    let result = call(
        deadline,
        registry.unregister(request(
            proto::UnregisterRequest {
                id: registration.provider_id.clone(),
                session: registration.session.clone(),
            },
            deadline,
        )),
    )
    .await;
    if let Err(status) = result {
        warn!(
            provider.id = %registration.provider_id,
            error = %status.message(),
            "unregister failed; stopping anyway"
        );
    }
}

/// The provider's own gRPC server on its unix socket, or for a remote
/// provider on TCP over mutual TLS.
struct RunningServer {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
    health: HealthReporter,
    /// What `Register` names, for Corbel to dial.
    endpoint: String,
    /// The unix socket (absolute), removed when the server stops; a remote
    /// provider has none.
    socket: Option<PathBuf>,
}

impl RunningServer {
    async fn start<P: Provider>(settings: &Settings, provider: Arc<P>) -> Result<Self, SdkError> {
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_service_status(proto::provider_server::SERVICE_NAME, ServingStatus::Serving)
            .await;
        health.set_service_status("", ServingStatus::Serving).await;
        let (stop, stopped) = oneshot::channel::<()>();
        // A dropped sender stops the server too.
        let stopped = async move {
            let _ = stopped.await;
        };
        let service = proto::provider_server::ProviderServer::new(ProviderService::new(provider));
        let (task, endpoint, socket) = match &settings.remote {
            Some(remote) => {
                let failed = |reason: String| SdkError::Bind {
                    path: PathBuf::from(remote.listen.to_string()),
                    reason,
                };
                // Only Corbel, with a certificate from the CA, may call.
                let tls = ServerTlsConfig::new()
                    .identity(Identity::from_pem(&remote.certificate, &remote.key))
                    .client_ca_root(Certificate::from_pem(&remote.ca));
                let listener = tokio::net::TcpListener::bind(remote.listen)
                    .await
                    .map_err(|e| failed(e.to_string()))?;
                let router = Server::builder()
                    .tls_config(tls)
                    .map_err(|e| failed(error_chain(&e)))?
                    .add_service(health_service)
                    .add_service(service);
                let incoming = tonic::transport::server::TcpIncoming::from(listener);
                let task = tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped));
                (task, remote.endpoint.clone(), None)
            }
            None => {
                let (listener, socket) = bind(settings)?;
                let router = Server::builder()
                    .add_service(health_service)
                    .add_service(service);
                let task = tokio::spawn(
                    router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), stopped),
                );
                (task, format!("unix://{}", socket.display()), Some(socket))
            }
        };
        Ok(RunningServer {
            stop: Some(stop),
            task,
            health,
            endpoint,
            socket,
        })
    }

    /// Stops accepting, lets in-flight calls finish within `grace`, then drops them.
    async fn stop(mut self, grace: Duration) {
        for service in [proto::provider_server::SERVICE_NAME, ""] {
            self.health
                .set_service_status(service, ServingStatus::NotServing)
                .await;
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(grace, &mut self.task).await.is_err() {
            warn!("calls still running after {grace:?}; dropping them");
            self.task.abort();
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(socket) = &self.socket {
            let _ = std::fs::remove_file(socket);
        }
    }
}

/// Creates the socket directory and binds `<dir>/<id>.sock`, replacing a stale
/// socket left by a killed predecessor (but never a file that is not a socket).
fn bind(settings: &Settings) -> Result<(UnixListener, PathBuf), SdkError> {
    let dir = &settings.socket_dir;
    let failed = |path: &PathBuf, error: io::Error| SdkError::Bind {
        path: path.clone(),
        reason: error.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|e| failed(dir, e))?;
    let dir = std::fs::canonicalize(dir).map_err(|e| failed(dir, e))?;
    let path = dir.join(format!("{}.sock", settings.provider_id));
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(&path).map_err(|e| failed(&path, e))?;
        }
        Ok(_) => {
            return Err(SdkError::Bind {
                path,
                reason: "a file that is not a socket is in the way".to_string(),
            });
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(failed(&path, error)),
    }
    let listener = UnixListener::bind(&path).map_err(|e| failed(&path, e))?;
    Ok((listener, path))
}

#[cfg(test)]
mod tests {
    use super::tls_refusal;

    #[test]
    fn tls_failures_say_what_was_wrong() {
        // As rustls 0.23 words them, inside the connection's error chain.
        let said = |chain: &str| tls_refusal(chain).unwrap_or("nothing");
        assert!(said("transport error: received fatal alert: UnknownCA").contains("unknown CA"));
        assert!(said("received fatal alert: DecryptError").contains("issued by another CA"));
        assert!(
            said("received fatal alert: CertificateExpired")
                .contains("refused this provider's certificate as expired")
        );
        assert!(said("invalid peer certificate: UnknownIssuer").contains("CA file"));
        assert!(
            said("invalid peer certificate: certificate not valid for name \"corbel-registry\"; certificate is only valid for DnsName(\"x\")")
                .contains("wrong name")
        );
        assert!(
            said("invalid peer certificate: certificate expired: verification time 2 (UNIX), but certificate is not valid after 1 (1 seconds ago)")
                .contains("registry's certificate has expired")
        );
        assert_eq!(tls_refusal("connection refused"), None);
    }
}
