//! The registry: the gRPC service providers register with, on a unix socket in
//! the data directory (`CORBEL_REGISTRY`), and for remote providers on TCP
//! with mutual TLS (`--provider-listen`; see `tls.rs`): there the client's
//! certificate must name the provider registering, the token must be its
//! stored one, it must be loaded as remote, and its endpoint is dialled over
//! TLS expecting its certificate.
//!
//! Registration is where a provider becomes usable: the token is checked, the
//! provider's endpoint dialled, its health checked and its configuration sent,
//! all before `Register` answers. The registry also serves `grpc.health.v1` with
//! the service `corbel.provider.v1.Registry`: providers watch it, and exit when
//! their server goes away.
//!
//! The registration path reads top to bottom here: `Register` → token check (a
//! launch's token: single use, and only from the launched process, see
//! `binding.rs`) →
//! protocol version → endpoint check → dial, health, configure → the slot is
//! connected and the supervisor watches the link. The registry never starts or
//! stops a process and never changes the stored provider beyond recording the
//! registration.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use corbel_proto::v1::registry_server::{Registry, RegistryServer};
use corbel_proto::v1::{
    HandshakeRequest, HandshakeResponse, RegisterRequest, RegisterResponse, UnregisterRequest,
    UnregisterResponse,
};
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;
use uuid::Uuid;

use super::authority::AuthorityFix;
use super::binding::{Binding, Peer};
use super::catalog::{self, token_hash};
use super::link::Link;
use super::secrets::Secrets;
use super::settings::{MAX_SOCKET_PATH, check_socket_path};
use super::state::{Connection, LaunchToken, Slot, Slots, same_secret};
use super::supervisor::Supervisor;
use super::{ProviderSettings, ProviderStatus, Providers, rows};
use crate::store::Db;

/// The name providers watch in `grpc.health.v1`.
pub const REGISTRY_SERVICE: &str = "corbel.provider.v1.Registry";

/// Binds the registry socket (replacing a stale one) and returns the future
/// that serves it until `stop` is cancelled.
pub async fn serve_registry(
    providers: Providers,
    stop: CancellationToken,
) -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    use anyhow::Context as _;
    let settings = providers.settings();
    let path = settings.registry_socket();
    check_socket_path(&path)?;
    if !settings.socket_root.as_os_str().is_empty() {
        private_dir(&settings.socket_root, &settings.socket_root_dirs())?;
    }
    tokio::fs::create_dir_all(settings.socket_dir())
        .await
        .with_context(|| format!("creating {}", settings.socket_dir().display()))?;
    match tokio::fs::remove_file(&path).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
    }
    let listener =
        UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(REGISTRY_SERVICE, ServingStatus::Serving)
        .await;
    tracing::info!(socket = %path.display(), "provider registry listening");
    Ok(async move {
        let server = tonic::transport::Server::builder()
            .add_service(health)
            .add_service(RegistryServer::new(RegistryService::new(&providers)))
            .serve_with_incoming_shutdown(
                // grpc-core clients' `:authority` made acceptable to h2.
                UnixListenerStream::new(listener).map(|accepted| accepted.map(AuthorityFix::new)),
                not_serving(reporter, stop.clone()),
            );
        until_stopped(server, stop, "provider registry").await;
        let _ = std::fs::remove_file(&path);
    })
}

/// Resolves once `stop` is cancelled, after telling health watchers
/// NOT_SERVING (their streams then end).
async fn not_serving(reporter: tonic_health::server::HealthReporter, stop: CancellationToken) {
    stop.cancelled().await;
    reporter
        .set_service_status(REGISTRY_SERVICE, ServingStatus::NotServing)
        .await;
}

/// Runs `server` to its end. Providers' health watches are endless streams:
/// once stopping, give them a moment to notice and then end it regardless.
async fn until_stopped(
    server: impl Future<Output = Result<(), tonic::transport::Error>>,
    stop: CancellationToken,
    what: &str,
) {
    tokio::select! {
        result = server => {
            if let Err(e) = result {
                tracing::error!(error = %e, "{what} failed");
            }
        }
        _ = async {
            stop.cancelled().await;
            tokio::time::sleep(Duration::from_secs(2)).await;
        } => {}
    }
}

/// Binds `--provider-listen` and returns the future that serves the registry
/// there, over mutual TLS, until `stop` is cancelled: remote providers
/// register here with a certificate from the provider CA naming them (see
/// `tls.rs`) and their stored token.
pub async fn serve_remote_registry(
    providers: Providers,
    addr: std::net::SocketAddr,
    tls: Arc<super::tls::ProviderTls>,
    stop: CancellationToken,
) -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    use anyhow::Context as _;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the provider registry on {addr}"))?;
    let bound = listener.local_addr()?;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(REGISTRY_SERVICE, ServingStatus::Serving)
        .await;
    // The handshakes are made here, so that a refused one says why.
    let acceptor = tls.acceptor().context("the provider registry's TLS")?;
    tracing::info!(address = %bound, "provider registry listening for remote providers (mutual TLS)");
    Ok(async move {
        let served = tonic::transport::Server::builder()
            .add_service(health)
            .add_service(RegistryServer::new(
                RegistryService::new(&providers).remote(tls),
            ))
            .serve_with_incoming_shutdown(
                super::tls::handshaken(listener, acceptor),
                not_serving(reporter, stop.clone()),
            );
        until_stopped(served, stop, "remote provider registry").await;
    })
}

/// Makes the socket root `dir` (mode 0711: a provider run as another user
/// passes through it to the registry) and checks that each of `checked` (it,
/// and the `corbel` directory holding it under `/run` or `/tmp`) is this
/// user's: a real directory (not a link) that nobody else may write to or
/// list. A socket root another user prepared in `/tmp` is refused, not used.
fn private_dir(dir: &Path, checked: &[&Path]) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(dir)
        .map_err(|e| anyhow::anyhow!("creating the socket directory {}: {e}", dir.display()))?;
    let me = nix::unistd::getuid().as_raw();
    for &checked in checked {
        let seen = std::fs::symlink_metadata(checked)
            .map_err(|e| anyhow::anyhow!("{}: {e}", checked.display()))?;
        if !seen.is_dir() || seen.uid() != me || seen.mode() & 0o066 != 0 {
            anyhow::bail!(
                "the socket directory {} is not this user's (a directory of uid {me} that others \
                 may neither write to nor list, mode 0711): remove it, or set XDG_RUNTIME_DIR to a \
                 directory of this user's",
                checked.display()
            );
        }
    }
    // The mode asked for, whatever the umask made of it.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
        .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    Ok(())
}

/// Checks every unix socket path the server will bind or hand out, before
/// anything is made: `registry.sock`, and the longest provider socket, which
/// a Docker or `runAs` provider binds in its own directory,
/// `<socket dir>/<12 hex>/<CORBEL_PROVIDER_ID>.sock` (a uuid is always 36
/// characters; others bind `<socket dir>/<id>.sock`).
pub fn check_socket_paths(settings: &ProviderSettings) -> anyhow::Result<()> {
    check_socket_path(&settings.registry_socket())?;
    let example = super::settings::own_socket_dir(&settings.socket_dir(), Uuid::nil())
        .join(format!("{}.sock", Uuid::nil().hyphenated()));
    let len = example.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        anyhow::bail!(
            "provider sockets would be {}/<12 hex>/<provider id>.sock, {len} bytes long (such as {}); \
             unix sockets allow {MAX_SOCKET_PATH}: set XDG_RUNTIME_DIR to a shorter directory",
            settings.socket_dir().display(),
            example.display()
        );
    }
    Ok(())
}

/// What registration needs: the rows (token, configuration), the slots (the
/// link), and the supervisor (health monitoring of a new link).
struct RegistryService {
    db: Db,
    settings: ProviderSettings,
    slots: Arc<Slots>,
    supervisor: Arc<Supervisor>,
    secrets: Secrets,
    /// The TLS listener's service: registrations from remote providers.
    tls: Option<Arc<super::tls::ProviderTls>>,
}

impl RegistryService {
    fn new(providers: &Providers) -> Self {
        let inner = &providers.inner;
        Self {
            db: inner.db.clone(),
            settings: inner.settings.clone(),
            slots: inner.slots.clone(),
            supervisor: inner.supervisor.clone(),
            secrets: inner.secrets.clone(),
            tls: None,
        }
    }

    /// The service of the TLS listener.
    fn remote(mut self, tls: Arc<super::tls::ProviderTls>) -> Self {
        self.tls = Some(tls);
        self
    }
}

#[tonic::async_trait]
impl Registry for RegistryService {
    async fn handshake(
        &self,
        request: Request<HandshakeRequest>,
    ) -> Result<Response<HandshakeResponse>, Status> {
        let theirs = request.into_inner().supported_versions;
        match corbel_proto::negotiate(corbel_proto::SUPPORTED_VERSIONS, &theirs) {
            Ok(chosen) => Ok(Response::new(HandshakeResponse {
                chosen_version: chosen,
                server_versions: corbel_proto::SUPPORTED_VERSIONS.to_vec(),
            })),
            Err(message) => {
                tracing::warn!(provider.versions = ?theirs, "handshake refused: {message}");
                Err(Status::failed_precondition(format!(
                    "handshake refused: {message}"
                )))
            }
        }
    }

    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        let peer = Peer {
            pid: request
                .extensions()
                .get::<UdsConnectInfo>()
                .and_then(|info| info.peer_cred)
                .and_then(|cred| cred.pid()),
        };
        // Over TLS, the client's certificate (the listener required one from
        // the CA) must name the provider registering.
        let certificate = request
            .peer_certs()
            .and_then(|certs| certs.first().map(|c| c.to_vec()));
        let session = self
            .register(request.into_inner(), peer, certificate)
            .await?;
        Ok(Response::new(RegisterResponse { session }))
    }

    async fn unregister(
        &self,
        request: Request<UnregisterRequest>,
    ) -> Result<Response<UnregisterResponse>, Status> {
        let request = request.into_inner();
        let id = parse_id(&request.id)?;
        self.unregister(id, &request.session).await?;
        Ok(Response::new(UnregisterResponse {}))
    }
}

fn parse_id(raw: &str) -> Result<Uuid, Status> {
    Uuid::parse_str(raw)
        .map_err(|_| Status::invalid_argument(format!("id: `{raw}` is not a provider id")))
}

impl RegistryService {
    /// Register, in order: the provider and its token (a launch's token only
    /// from the process launched, and only once), the protocol version, the
    /// endpoint; then the link is dialled, checked and configured, and only
    /// then does the provider count as connected.
    async fn register(
        &self,
        request: RegisterRequest,
        peer: Peer,
        certificate: Option<Vec<u8>>,
    ) -> Result<String, Status> {
        let id = parse_id(&request.id)?;
        if self.tls.is_some() {
            self.admit_remote(id, certificate.as_deref())?;
        }
        let slot = self.slots.slot(id);
        // Until this registration ends, no other one for the provider starts:
        // a launch's token is spent before the next one looks at it.
        let _turn = slot.registration_turn().await;
        let (row, admitted) = self.admit(id, &slot, &request, &peer).await?;
        if self.tls.is_some() {
            if admitted != Admitted::Stored {
                return Err(Status::permission_denied(
                    "a launch's token is for the process Corbel started, not for a remote provider",
                ));
            }
            if !slot.is_remote() {
                let message = format!(
                    "registration over TLS refused: provider `{}` is not loaded as a remote provider (`runtime: remote`)",
                    row.name
                );
                self.slots.note(&slot, &message);
                return Err(Status::failed_precondition(message));
            }
        }
        if !corbel_proto::SUPPORTED_VERSIONS.contains(&request.protocol_version) {
            return Err(Status::failed_precondition(format!(
                "protocol version {} was not agreed: this server speaks {:?}; call Handshake first",
                request.protocol_version,
                corbel_proto::SUPPORTED_VERSIONS
            )));
        }
        if slot.status() == ProviderStatus::Unloading {
            return Err(Status::unavailable("the provider is being unloaded"));
        }
        let endpoint = self.check_endpoint(&request.endpoint)?;
        let link = self.dial(&row, &slot, &endpoint).await?;
        if admitted == Admitted::Launch {
            slot.spend_launch(&request.token);
        }
        Ok(self.connect(slot.clone(), link, request, &endpoint).await)
    }

    /// Over TLS: the client's certificate must name provider `id`.
    fn admit_remote(&self, id: Uuid, certificate: Option<&[u8]>) -> Result<(), Status> {
        match certificate {
            Some(der) if super::tls::names_provider(der, id) => Ok(()),
            Some(_) => {
                tracing::warn!(provider.id = %id, "registration refused: the certificate names another provider");
                Err(Status::permission_denied(format!(
                    "registration refused: the client certificate is not provider {id}'s"
                )))
            }
            None => Err(Status::unauthenticated(
                "registration refused: no client certificate",
            )),
        }
    }

    /// The provider's row, if the token is the stored one, or the one given to
    /// the process Corbel started last, unspent and presented by that process.
    async fn admit(
        &self,
        id: Uuid,
        slot: &Slot,
        request: &RegisterRequest,
        peer: &Peer,
    ) -> Result<(rows::ProviderRow, Admitted), Status> {
        let row = rows::find(&self.db, id)
            .await
            .map_err(|e| {
                tracing::error!(provider.id = %id, error = %e, "cannot read the provider");
                Status::internal("cannot read the provider")
            })?
            .ok_or_else(|| Status::not_found(format!("no provider with id {id}")))?;
        let refuse = |message: String| {
            tracing::warn!(provider.id = %id, provider.name = %row.name, peer = %peer, "{message}");
            self.slots.note(slot, &message);
            Status::permission_denied(format!("{message} (provider `{}`)", row.name))
        };
        // The binding first: a process that is not the launched one is told
        // so, whether or not the token is spent.
        if let LaunchToken::Launch { spent, binding } = slot.launch_token(&request.token) {
            match self.launched_binding(binding).await {
                Ok(None) => {}
                Ok(Some(binding)) => binding.check(peer).map_err(|why| {
                    refuse(format!(
                        "registration refused: this launch's token came from another process: {why}"
                    ))
                })?,
                Err(why) => return Err(refuse(format!("registration refused: {why}"))),
            }
            if spent {
                return Err(refuse(format!(
                    "a second registration with this launch's token was refused ({peer}): the first one spent it"
                )));
            }
            return Ok((row, Admitted::Launch));
        }
        if same_secret(&token_hash(&request.token), &row.token_hash) {
            return Ok((row, Admitted::Stored));
        }
        let message = "registration refused: the token does not match";
        self.slots.set_message(slot, message.to_owned());
        Err(refuse(message.to_owned()))
    }

    /// The launch's binding, once the runtime has started the process (a
    /// registration can arrive between the spawn and the binding being noted).
    async fn launched_binding(
        &self,
        mut binding: watch::Receiver<Option<Option<Binding>>>,
    ) -> Result<Option<Binding>, String> {
        let known = tokio::time::timeout(
            self.settings.call_timeout,
            binding.wait_for(Option::is_some),
        )
        .await;
        match known {
            Ok(Ok(known)) => Ok(known.flatten()),
            Ok(Err(_)) => Err("the launch this token belongs to has ended".to_owned()),
            Err(_) => Err("the launched process was not noted in time".to_owned()),
        }
    }

    /// Dials the provider's endpoint, checks its health and hands it its
    /// configuration; any failure refuses the registration.
    async fn dial(
        &self,
        row: &rows::ProviderRow,
        slot: &Slot,
        endpoint: &str,
    ) -> Result<Link, Status> {
        let id = row.id;
        let refuse = |slot: &Slot, message: String| {
            tracing::warn!(provider.id = %id, "registration failed: {message}");
            self.slots
                .note(slot, &format!("registration failed: {message}"));
            Status::failed_precondition(message)
        };
        let tls = match (&self.tls, endpoint.starts_with("https://")) {
            (Some(tls), true) => Some(tls.client_config(id)),
            _ => None,
        };
        let link = Link::dial_with(
            endpoint,
            tls,
            self.settings.call_timeout,
            self.settings.resource_timeout,
        )
        .await
        .map_err(|e| refuse(slot, e.to_string()))?;
        link.check_health(None)
            .await
            .map_err(|e| refuse(slot, e.to_string()))?;
        let config = catalog::merge(
            &catalog::parse_object(&row.config).map_err(|e| refuse(slot, e.to_string()))?,
            &self
                .secrets
                .open(row)
                .map_err(|e| refuse(slot, e.to_string()))?,
        );
        link.configure(config.to_string()).await.map_err(|e| {
            match e.invalid_argument() {
                // The stored configuration is what is wrong: say so, in the
                // provider's words, to whoever reads its status and logs.
                Some(why) => {
                    let message = format!("the provider refused its configuration: {why}");
                    refuse(slot, message.clone());
                    Status::invalid_argument(message)
                }
                None => refuse(slot, e.to_string()),
            }
        })?;
        Ok(link)
    }

    /// Installs the checked link in the slot under a new session, records the
    /// registration, and has the supervisor watch the link's health.
    async fn connect(
        &self,
        slot: Arc<Slot>,
        link: Link,
        request: RegisterRequest,
        endpoint: &str,
    ) -> String {
        let id = slot.id;
        // What the provider may be sent depends on it: it goes with the link.
        let link = link.with_protocol_version(request.protocol_version);
        let (features, ignored): (Vec<String>, Vec<String>) = request
            .features
            .into_iter()
            .partition(|f| corbel_proto::KNOWN_FEATURES.contains(&f.as_str()));
        if !ignored.is_empty() {
            tracing::debug!(provider.id = %id, features = ?ignored, "unknown features ignored");
        }
        let session = Uuid::new_v4().to_string();
        let monitor = self.supervisor.monitor_stop();
        let replaced = slot.connect(Connection {
            link: link.clone(),
            session: session.clone(),
            features: features.clone(),
            resource_types: request.resource_types.clone(),
            monitor: monitor.clone(),
        });
        if let Some(old) = replaced {
            old.monitor.cancel();
            self.slots
                .note(&slot, "registered again: the previous link is replaced");
        }
        let now = Utc::now();
        if let Err(e) = rows::set_registered(
            &self.db,
            id,
            serde_json::to_string(&features).unwrap_or_else(|_| "[]".into()),
            serde_json::to_string(&request.resource_types).unwrap_or_else(|_| "[]".into()),
            now,
        )
        .await
        {
            tracing::error!(provider.id = %id, error = %e, "cannot store the registration");
        }
        self.slots.note(
            &slot,
            &format!(
                "registered: {} {} (protocol {}) at {endpoint}",
                request.name, request.version, request.protocol_version
            ),
        );
        self.slots
            .set_status(&slot, ProviderStatus::Connected, None)
            .await;
        self.supervisor
            .watch_health(slot.clone(), link, session.clone(), monitor);
        session
    }

    /// Ends the registration `session`; an unknown or stale session (a later
    /// registration replaced it) is `NOT_FOUND` and changes nothing.
    async fn unregister(&self, id: Uuid, session: &str) -> Result<(), Status> {
        let Some(slot) = self.slots.existing(id) else {
            return Err(Status::not_found(format!(
                "provider {id} has no registration"
            )));
        };
        if slot.disconnect(Some(session)).is_none() {
            return Err(Status::not_found(format!(
                "session `{session}` is not provider {id}'s current registration"
            )));
        }
        self.slots.note(&slot, "unregistered");
        if slot.status() != ProviderStatus::Unloading {
            self.slots
                .set_status(
                    &slot,
                    ProviderStatus::Disconnected,
                    Some("the provider unregistered".into()),
                )
                .await;
        }
        Ok(())
    }

    /// Only endpoints Corbel can trust to be the provider's own: a socket in
    /// the socket directory, or a loopback TCP port.
    fn check_endpoint(&self, endpoint: &str) -> Result<String, Status> {
        if self.tls.is_some() {
            // Dialled over TLS expecting the provider's own certificate: any
            // host will do, an impostor fails the handshake.
            if let Ok(url) = url::Url::parse(endpoint)
                && url.scheme() == "https"
                && url.host_str().is_some()
                && url.port().is_some()
                && url.path() == "/"
            {
                return Ok(endpoint.to_owned());
            }
            return Err(Status::invalid_argument(format!(
                "endpoint: `{endpoint}` must be https://<host>:<port>, served with the provider's certificate"
            )));
        }
        if let Some(path) = endpoint.strip_prefix("unix://") {
            let path = Path::new(path);
            let dir = self.settings.socket_dir();
            if path.is_absolute()
                && path.starts_with(&dir)
                && !path
                    .components()
                    .any(|c| c == std::path::Component::ParentDir)
            {
                return Ok(endpoint.to_owned());
            }
            return Err(Status::invalid_argument(format!(
                "endpoint: `{endpoint}` is not a socket in {}",
                dir.display()
            )));
        }
        if let Ok(url) = url::Url::parse(endpoint)
            && url.scheme() == "http"
            && matches!(url.host_str(), Some("127.0.0.1" | "[::1]" | "localhost"))
            && url.port().is_some()
        {
            return Ok(endpoint.to_owned());
        }
        Err(Status::invalid_argument(format!(
            "endpoint: `{endpoint}` must be unix://<socket in CORBEL_SOCKET_DIR> or http://127.0.0.1:<port>"
        )))
    }
}

/// Which token admitted a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admitted {
    /// The stored token: a provider run outside Corbel; may register again.
    Stored,
    /// The token of the process Corbel launched: spent once the registration succeeds.
    Launch,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison_needs_the_same_text() {
        let token = catalog::new_token();
        assert!(same_secret(&token_hash(&token), &token_hash(&token)));
        assert!(!same_secret(&token_hash(&token), &token_hash("cbp_other")));
        assert!(!same_secret("abc", "abcd"));
    }

    #[test]
    fn a_socket_root_others_may_write_to_or_a_link_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let parent = tmp.path().join("corbel-test");
        let root = parent.join("0123456789ab");
        private_dir(&root, &[&parent, &root]).unwrap();
        let mode = std::fs::metadata(&root).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o711);
        // Made again: the same directory is taken.
        private_dir(&root, &[&parent, &root]).unwrap();

        std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o777)).unwrap();
        let refused = private_dir(&root, &[&parent, &root]).unwrap_err();
        assert!(
            refused.to_string().contains("is not this user's"),
            "{refused}"
        );

        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let refused = private_dir(&link, &[&link]).unwrap_err();
        assert!(
            refused.to_string().contains("is not this user's"),
            "{refused}"
        );
    }
}
