//! Mutual TLS for remote providers: a provider on another host registers over
//! TCP (`--provider-listen`), and both sides prove who they are with
//! certificates from one CA, as go-plugin's AutoMTLS does.
//!
//! - The CA is the operator's (`--provider-ca-cert`, `--provider-ca-key`) or
//!   made at the first start with a listener: `provider-ca.pem` in the data
//!   directory, its key beside it sealed with the secret key. Replicas of one
//!   cluster are given the same CA.
//! - Corbel's own certificate names [`REGISTRY_NAME`]: the registry serves
//!   with it, and Corbel presents it when it dials a provider.
//! - A provider's certificate ([`ProviderTls::issue`], shown once by
//!   `issueProviderCertificate`) names only that provider
//!   ([`provider_name`]): the registry refuses it for any other id, and Corbel
//!   dials the provider's endpoint expecting that name, so an endpoint that is
//!   not the provider's own fails the handshake.

mod accept;

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};
use uuid::Uuid;

use crate::seal::SecretKey;

pub use accept::{REFUSALS, handshaken};

/// The name in Corbel's own certificate; providers check the registry for it.
pub const REGISTRY_NAME: &str = "registry.corbel";

/// The associated data of the sealed CA key.
const CA_KEY_CONTEXT: &[u8] = b"corbel provider CA key";

/// How long an issued certificate is valid.
const LEAF_DAYS: i64 = 825;

/// The only name a provider's certificate carries.
pub fn provider_name(id: Uuid) -> String {
    format!("{id}.providers.corbel")
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("the provider CA: {0}")]
    Ca(String),
    #[error("issuing a certificate: {0}")]
    Issue(#[from] rcgen::Error),
}

/// A certificate and its private key, in PEM.
#[derive(Clone)]
pub struct Issued {
    pub certificate: String,
    pub key: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued").finish_non_exhaustive()
    }
}

/// The provider CA, and Corbel's certificate from it.
pub struct ProviderTls {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
    own: Issued,
}

impl std::fmt::Debug for ProviderTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderTls").finish_non_exhaustive()
    }
}

/// Where the CA comes from.
pub enum CaSource<'a> {
    /// The operator's certificate and (unsealed) key files.
    Files { cert: &'a Path, key: &'a Path },
    /// Made on first use in `data_dir`, the key sealed with `key`.
    DataDir {
        data_dir: &'a Path,
        key: &'a SecretKey,
    },
}

impl ProviderTls {
    /// Loads the CA (making it the first time, for [`CaSource::DataDir`]) and
    /// issues Corbel's own certificate.
    pub fn load(source: CaSource<'_>) -> Result<Self, TlsError> {
        let (ca_pem, key) = match source {
            CaSource::Files { cert, key } => (read(cert)?, read(key)?),
            CaSource::DataDir { data_dir, key } => load_or_make(data_dir, key)?,
        };
        let signing = KeyPair::from_pem(&key).map_err(|e| TlsError::Ca(format!("its key: {e}")))?;
        let issuer = Issuer::from_ca_cert_pem(&ca_pem, signing)
            .map_err(|e| TlsError::Ca(format!("its certificate: {e}")))?;
        let own = leaf(&issuer, REGISTRY_NAME)?;
        Ok(Self {
            ca_pem,
            issuer,
            own,
        })
    }

    /// A new key and certificate for provider `id`; nothing of it is kept.
    pub fn issue(&self, id: Uuid) -> Result<Issued, TlsError> {
        leaf(&self.issuer, &provider_name(id))
    }

    /// The CA certificate, in PEM: what a provider trusts.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Dialling provider `id`: its certificate must name it; Corbel presents
    /// its own.
    pub fn client_config(&self, id: Uuid) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .domain_name(provider_name(id))
            .identity(Identity::from_pem(&self.own.certificate, &self.own.key))
    }
}

/// Whether `der` (a client's certificate) names provider `id`.
pub fn names_provider(der: &[u8], id: Uuid) -> bool {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return false;
    };
    let wanted = provider_name(id);
    match cert.subject_alternative_name() {
        Ok(Some(san)) => {
            san.value.general_names.iter().any(
                |name| matches!(name, GeneralName::DNSName(n) if n.eq_ignore_ascii_case(&wanted)),
            )
        }
        _ => false,
    }
}

fn leaf(issuer: &Issuer<'static, KeyPair>, name: &str) -> Result<Issued, TlsError> {
    let mut params = CertificateParams::new(vec![name.to_owned()])?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + time::Duration::days(LEAF_DAYS);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok(Issued {
        certificate: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// `provider-ca.pem` and the sealed `provider-ca.key` in `data_dir`, made
/// when the certificate is not there. The key is written first and the
/// certificate last, so a key alone is what a crash while making them left,
/// before anything was issued: it is made again.
fn load_or_make(data_dir: &Path, secret: &SecretKey) -> Result<(String, String), TlsError> {
    let cert_path = data_dir.join("provider-ca.pem");
    let key_path = data_dir.join("provider-ca.key");
    match (cert_path.exists(), key_path.exists()) {
        (true, true) => {
            let cert = read(&cert_path)?;
            let sealed = read(&key_path)?;
            let key = secret
                .open(CA_KEY_CONTEXT, sealed.trim())
                .map_err(|e| TlsError::File {
                    path: key_path.clone(),
                    message: format!("does not open with this server's secret key: {e}"),
                })?;
            let key = String::from_utf8(key).map_err(|_| TlsError::File {
                path: key_path,
                message: "is not PEM".to_owned(),
            })?;
            Ok((cert, key))
        }
        (false, _) => {
            let mut params = CertificateParams::new(Vec::<String>::new())?;
            params
                .distinguished_name
                .push(DnType::CommonName, "Corbel provider CA");
            params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            let now = time::OffsetDateTime::now_utc();
            params.not_before = now - time::Duration::minutes(5);
            params.not_after = now + time::Duration::days(10 * 365);
            let key = KeyPair::generate()?;
            let cert = params.self_signed(&key)?;
            let (cert, key) = (cert.pem(), key.serialize_pem());
            write_private(&key_path, &secret.seal(CA_KEY_CONTEXT, key.as_bytes()))?;
            write_private(&cert_path, &cert)?;
            tracing::info!(certificate = %cert_path.display(), "made the provider CA");
            Ok((cert, key))
        }
        (true, false) => Err(TlsError::Ca(format!(
            "{} is there without its key {}: restore the key, or remove both to make a new CA \
             (every remote provider then needs a new certificate)",
            cert_path.display(),
            key_path.display()
        ))),
    }
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|e| TlsError::File {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// Written whole (a temporary file renamed), readable by its owner only.
fn write_private(path: &Path, text: &str) -> Result<(), TlsError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let fail = |e: std::io::Error| TlsError::File {
        path: path.to_owned(),
        message: e.to_string(),
    };
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".partial");
    let partial = path.with_file_name(name);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&partial)
        .map_err(fail)?;
    file.write_all(text.as_bytes()).map_err(fail)?;
    file.sync_all().map_err(fail)?;
    std::fs::rename(&partial, path).map_err(fail)?;
    crate::seal::sync_parent(path).map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_is_made_once_and_names_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let key = SecretKey::generate();
        let source = || CaSource::DataDir {
            data_dir: dir.path(),
            key: &key,
        };
        let first = ProviderTls::load(source()).unwrap();
        let again = ProviderTls::load(source()).unwrap();
        assert_eq!(first.ca_pem(), again.ca_pem(), "made once, then read");
        let sealed = std::fs::read_to_string(dir.path().join("provider-ca.key")).unwrap();
        assert!(!sealed.contains("PRIVATE KEY"), "the key is sealed at rest");

        let id = Uuid::new_v4();
        let issued = again.issue(id).unwrap();
        let der = pem_der(&issued.certificate);
        assert!(names_provider(&der, id));
        assert!(!names_provider(&der, Uuid::new_v4()));
        assert!(!names_provider(b"not a certificate", id));

        // Another server key does not open it, and says which file.
        let err = ProviderTls::load(CaSource::DataDir {
            data_dir: dir.path(),
            key: &SecretKey::generate(),
        })
        .unwrap_err();
        assert!(err.to_string().contains("provider-ca.key"), "{err}");

        // A key left alone by a crash is made again; a certificate without
        // its key is refused, naming both.
        let crashed = tempfile::tempdir().unwrap();
        std::fs::write(crashed.path().join("provider-ca.key"), "torn").unwrap();
        let made = ProviderTls::load(CaSource::DataDir {
            data_dir: crashed.path(),
            key: &key,
        })
        .unwrap();
        assert_ne!(made.ca_pem(), first.ca_pem());
        std::fs::remove_file(crashed.path().join("provider-ca.key")).unwrap();
        let err = ProviderTls::load(CaSource::DataDir {
            data_dir: crashed.path(),
            key: &key,
        })
        .unwrap_err();
        assert!(err.to_string().contains("without its key"), "{err}");
    }

    fn pem_der(pem: &str) -> Vec<u8> {
        let (_, parsed) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        parsed.contents
    }
}
