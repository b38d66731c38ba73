//! The remote registry's TLS handshakes, made here rather than inside the
//! gRPC server so that a refused one says why: the provider's side of a TLS
//! 1.3 handshake often meets a closed connection instead of the alert, and
//! only this side knows what was wrong with its certificate. Each refusal is
//! logged with the peer's address and counted by reason
//! (`corbel_provider_tls_refusals_total{reason}`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, CertificateError};
use tokio_rustls::server::TlsStream;

use super::{ProviderTls, TlsError};

/// How long a client has to finish its handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// Handshakes accepted and waiting for the server to take them.
const WAITING: usize = 64;

/// The metric counting refused handshakes.
pub const REFUSALS: &str = "corbel_provider_tls_refusals_total";

impl ProviderTls {
    /// The registry's side: Corbel's certificate, a client certificate from
    /// the CA required, HTTP/2 (gRPC).
    pub fn acceptor(&self) -> Result<TlsAcceptor, TlsError> {
        let bad = |what: &str, e: &dyn std::fmt::Display| TlsError::Ca(format!("{what}: {e}"));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            let ca = ca.map_err(|e| bad("its certificate", &e))?;
            roots.add(ca).map_err(|e| bad("its certificate", &e))?;
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(|e| bad("verifying clients", &e))?;
        let certificates = CertificateDer::pem_slice_iter(self.own.certificate.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad("the registry's certificate", &e))?;
        let key = PrivateKeyDer::from_pem_slice(self.own.key.as_bytes())
            .map_err(|e| bad("the registry's key", &e))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("protocol versions", &e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certificates, key)
            .map_err(|e| bad("the registry's certificate", &e))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// The connections of `listener` once their handshake is done, for the gRPC
/// server; handshakes run side by side, each bounded by [`HANDSHAKE`].
pub fn handshaken(
    listener: tokio::net::TcpListener,
    acceptor: TlsAcceptor,
) -> tokio_stream::wrappers::ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>> {
    let (done, handshaken) = tokio::sync::mpsc::channel(WAITING);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "the remote provider registry cannot accept");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = done.closed() => return,
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, done) = (acceptor.clone(), done.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = done.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => refused(peer, &e),
                    Err(_) => refused_as(
                        peer,
                        "timeout",
                        "it did not finish its handshake within 10 s",
                    ),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(handshaken)
}

fn refused(peer: SocketAddr, error: &std::io::Error) {
    let tls = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    let (reason, said) = match tls {
        Some(rustls::Error::InvalidCertificate(why)) => match why {
            CertificateError::UnknownIssuer => (
                "unknown_ca",
                "its certificate was not issued by this Corbel's provider CA (unknown CA)",
            ),
            CertificateError::BadSignature => (
                "unknown_ca",
                "its certificate's signature does not verify with this Corbel's provider CA: \
                 issued by another CA of the same name",
            ),
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => (
                "expired",
                "its certificate has expired: issue it a new one (issueProviderCertificate)",
            ),
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => (
                "not_yet_valid",
                "its certificate is not valid yet: check both hosts' clocks",
            ),
            _ => ("bad_certificate", "its certificate was refused"),
        },
        Some(rustls::Error::NoCertificatesPresented) => (
            "no_certificate",
            "it sent no client certificate (a provider needs the one issueProviderCertificate gave)",
        ),
        Some(_) => ("handshake", "its TLS handshake failed"),
        None => ("handshake", "the connection ended during the handshake"),
    };
    tracing::warn!(
        peer = %peer,
        error = %error,
        "a remote provider's connection was refused: {said}"
    );
    metrics::counter!(REFUSALS, "reason" => reason).increment(1);
}

fn refused_as(peer: SocketAddr, reason: &'static str, said: &str) {
    tracing::warn!(peer = %peer, "a remote provider's connection was refused: {said}");
    metrics::counter!(REFUSALS, "reason" => reason).increment(1);
}
