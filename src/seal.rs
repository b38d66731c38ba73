//! Values sealed at rest: the server's secret key (a file outside the
//! database), and authenticated encryption of values with it. A leaf: it
//! imports nothing of the crate.
//!
//! A sealed value is text: `sealed:v1:<key id>:<hex of nonce ‖ ciphertext>`.
//! The cipher is XChaCha20-Poly1305 with a random 192-bit nonce per value; the
//! caller's *context* (for a provider's `secretConfig`, the provider's id) is
//! the associated data, so a value copied elsewhere does not open. The key id
//! is a short hash of the key: a value sealed under another key is named as
//! such, with both ids, instead of failing as garbage.
//!
//! The key file holds the 32-byte key as 64 hex characters. It must be
//! readable by its owner only (mode 0600 or stricter): a looser file is
//! refused, as `ssh` refuses a loose private key, because anyone who can read
//! it can read every secret in the database. The key is never printed: `Debug`
//! shows its id.

use std::fmt;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;
use sha2::{Digest, Sha256};

/// What every sealed value starts with, version included.
const PREFIX: &str = "sealed:";
const VERSION: &str = "v1";
const KEY_LEN: usize = 32;
const NONCE_LEN: usize = 24;
/// The most of a key file that is read: the key's hex, a line end, and room
/// for blank space around it.
const KEY_FILE_MAX: usize = 256;

/// The server's secret key. `Debug` shows only its id.
#[derive(Clone)]
pub struct SecretKey {
    bytes: [u8; KEY_LEN],
    id: String,
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretKey({})", self.id)
    }
}

/// Why a key file cannot be used. Never carries the key.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("cannot {action} the secret key file {}: {error}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        /// Not a `source`: shown in the message, so not twice in a chain.
        error: std::io::Error,
    },
    #[error(
        "the secret key file {} has mode {mode:04o}: it must be readable by its owner only \
         (run `chmod 600 {}`)",
        path.display(), path.display()
    )]
    Permissions { path: PathBuf, mode: u32 },
    #[error("the secret key file {} is not a regular file", path.display())]
    NotAFile { path: PathBuf },
    #[error("the secret key file {} {reason}", path.display())]
    Content { path: PathBuf, reason: String },
}

/// An IO failure on `path` while doing `action`, as a [`KeyFileError`].
fn io_error(path: &Path, action: &'static str) -> impl FnOnce(std::io::Error) -> KeyFileError {
    let path = path.to_owned();
    move |error| KeyFileError::Io {
        action,
        path,
        error,
    }
}

/// Why a sealed value does not open. Never carries the value.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("not a sealed value ({0})")]
    Format(String),
    #[error("sealed with key {sealed_with}, but this server's key is {this_key}")]
    OtherKey {
        sealed_with: String,
        this_key: String,
    },
    #[error("does not open with key {key}: it was changed, or copied from another record")]
    Rejected { key: String },
}

impl SecretKey {
    /// A new random key.
    pub fn generate() -> Self {
        let mut bytes = [0u8; KEY_LEN];
        rand::rng().fill_bytes(&mut bytes);
        Self::from_bytes(bytes)
    }

    fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        let mut hash = Sha256::new();
        hash.update(b"corbel secret key id\0");
        hash.update(bytes);
        let id = hex::encode(&hash.finalize()[..8]);
        Self { bytes, id }
    }

    /// The key's id: 16 hex characters of a hash of it, safe to show.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Reads a key file, refusing one others may read or write.
    pub fn load(path: &Path) -> Result<Self, KeyFileError> {
        let meta = std::fs::metadata(path).map_err(io_error(path, "read"))?;
        if !meta.is_file() {
            return Err(KeyFileError::NotAFile {
                path: path.to_owned(),
            });
        }
        let mode = meta.mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyFileError::Permissions {
                path: path.to_owned(),
                mode,
            });
        }
        // A key file is 65 bytes: a wrong path to a large file is refused
        // unread (and never read past the bound, should it grow meanwhile).
        if meta.len() > KEY_FILE_MAX as u64 {
            return Err(KeyFileError::Content {
                path: path.to_owned(),
                reason: format!(
                    "is {} bytes: a key file holds {} hex characters",
                    meta.len(),
                    KEY_LEN * 2
                ),
            });
        }
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|file| file.take(KEY_FILE_MAX as u64).read_to_string(&mut text))
            .map_err(io_error(path, "read"))?;
        Self::parse(text.trim()).map_err(|reason| KeyFileError::Content {
            path: path.to_owned(),
            reason,
        })
    }

    /// Reads the key file, or makes it (mode 0600) when there is none.
    /// Returns whether it was made.
    pub fn load_or_create(path: &Path) -> Result<(Self, bool), KeyFileError> {
        match std::fs::symlink_metadata(path) {
            Ok(_) => Ok((Self::load(path)?, false)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = Self::generate();
                key.write_new(path)?;
                Ok((key, true))
            }
            Err(error) => Err(io_error(path, "read")(error)),
        }
    }

    fn parse(text: &str) -> Result<Self, String> {
        if text.len() != KEY_LEN * 2 {
            return Err(format!(
                "must hold {} hex characters (a {KEY_LEN}-byte key), not {} characters",
                KEY_LEN * 2,
                text.len()
            ));
        }
        let mut bytes = [0u8; KEY_LEN];
        hex::decode_to_slice(text, &mut bytes)
            .map_err(|_| "must hold hex characters only (0-9, a-f)".to_owned())?;
        Ok(Self::from_bytes(bytes))
    }

    fn file_text(&self) -> String {
        format!("{}\n", hex::encode(self.bytes))
    }

    /// Writes the key to a new file (mode 0600), durably; refuses to replace
    /// an existing file.
    pub fn write_new(&self, path: &Path) -> Result<(), KeyFileError> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io_error(path, "create"))?;
        file.write_all(self.file_text().as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(io_error(path, "write"))?;
        sync_parent(path).map_err(io_error(path, "sync the directory of"))
    }

    /// Puts the key in place of the file at `path` atomically (a new file
    /// beside it, synced, then renamed over it): a crash leaves the old key or
    /// the new one, never a torn file.
    pub fn install(&self, path: &Path) -> Result<(), KeyFileError> {
        let mut name = path
            .file_name()
            .ok_or_else(|| KeyFileError::NotAFile {
                path: path.to_owned(),
            })?
            .to_owned();
        name.push(".new");
        let staged = path.with_file_name(name);
        match std::fs::remove_file(&staged) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(io_error(&staged, "remove")(error)),
        }
        self.write_new(&staged)?;
        std::fs::rename(&staged, path).map_err(io_error(path, "replace"))?;
        sync_parent(path).map_err(io_error(path, "sync the directory of"))
    }

    /// Seals `plain` for `context` (the associated data: what the value
    /// belongs to).
    pub fn seal(&self, context: &[u8], plain: &[u8]) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let sealed = self
            .cipher()
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plain,
                    aad: context,
                },
            )
            .expect("XChaCha20-Poly1305 seals any input that fits in memory");
        let mut body = Vec::with_capacity(NONCE_LEN + sealed.len());
        body.extend_from_slice(&nonce);
        body.extend_from_slice(&sealed);
        format!("{PREFIX}{VERSION}:{}:{}", self.id, hex::encode(body))
    }

    /// Opens a value [`seal`](Self::seal) made for the same `context`.
    pub fn open(&self, context: &[u8], sealed: &str) -> Result<Vec<u8>, OpenError> {
        let (key_id, body) = parse_sealed(sealed)?;
        if key_id != self.id {
            return Err(OpenError::OtherKey {
                sealed_with: key_id.to_owned(),
                this_key: self.id.clone(),
            });
        }
        let body =
            hex::decode(body).map_err(|_| OpenError::Format("its body is not hex".into()))?;
        if body.len() < NONCE_LEN + 16 {
            return Err(OpenError::Format("its body is too short".into()));
        }
        let (nonce, ciphertext) = body.split_at(NONCE_LEN);
        self.cipher()
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad: context,
                },
            )
            .map_err(|_| OpenError::Rejected {
                key: self.id.clone(),
            })
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new((&self.bytes).into())
    }
}

/// What a rotation did with the values stored under it (see [`rotate`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Resealed {
    /// Values stored unsealed (by an earlier version), now sealed.
    pub plain: usize,
    /// Values under the current key, now under the new one.
    pub rotated: usize,
    /// Values already under the new key (checked to open).
    pub kept: usize,
}

/// What [`rotate`] does with one sealed value.
#[derive(Debug, PartialEq, Eq)]
pub enum Rotated {
    /// It is under the new key already, and opens: kept as it is.
    Kept,
    /// It was opened under the current key: this is it under the new one.
    Resealed(String),
}

/// Moves one value sealed for `context` from `current` to `new`: one
/// already under `new` is checked to open and kept (so a rotation
/// interrupted after its commit finishes when run again), one under
/// `current` is opened and sealed again. At start `current` is `new`: every
/// value that opens is kept.
pub fn rotate(
    current: &SecretKey,
    new: &SecretKey,
    context: &[u8],
    sealed: &str,
) -> Result<Rotated, OpenError> {
    if sealed_key_id(sealed)? == new.id() {
        new.open(context, sealed)?;
        return Ok(Rotated::Kept);
    }
    let plain = current.open(context, sealed)?;
    Ok(Rotated::Resealed(new.seal(context, &plain)))
}

/// Whether `text` is in the sealed form (any version): what tells a sealed
/// value from one stored before sealing existed.
pub fn is_sealed(text: &str) -> bool {
    text.starts_with(PREFIX)
}

/// The id of the key `text` was sealed with.
pub fn sealed_key_id(text: &str) -> Result<&str, OpenError> {
    parse_sealed(text).map(|(id, _)| id)
}

fn parse_sealed(text: &str) -> Result<(&str, &str), OpenError> {
    let rest = text
        .strip_prefix(PREFIX)
        .ok_or_else(|| OpenError::Format("it lacks the `sealed:` prefix".into()))?;
    let (version, rest) = rest
        .split_once(':')
        .ok_or_else(|| OpenError::Format("it has no version".into()))?;
    if version != VERSION {
        return Err(OpenError::Format(format!(
            "its format `{version}` is unknown to this version of Corbel, which reads `{VERSION}`"
        )));
    }
    let (key_id, body) = rest
        .split_once(':')
        .ok_or_else(|| OpenError::Format("it has no key id".into()))?;
    Ok((key_id, body))
}

/// Makes a rename or a new file in `path`'s directory durable.
pub(crate) fn sync_parent(path: &Path) -> std::io::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::File::open(parent)?.sync_all()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_sealed_value_opens_with_its_key_and_context() {
        let key = SecretKey::generate();
        let sealed = key.seal(b"provider-1", b"{\"password\":\"hunter2\"}");
        assert!(is_sealed(&sealed), "{sealed}");
        assert!(!sealed.contains("hunter2"));
        assert_eq!(sealed_key_id(&sealed).unwrap(), key.id());
        assert_eq!(
            key.open(b"provider-1", &sealed).unwrap(),
            b"{\"password\":\"hunter2\"}"
        );
        // A random nonce per value: the same input seals differently.
        assert_ne!(
            sealed,
            key.seal(b"provider-1", b"{\"password\":\"hunter2\"}")
        );
    }

    #[test]
    fn another_key_is_named_with_both_ids() {
        let a = SecretKey::generate();
        let b = SecretKey::generate();
        assert_ne!(a.id(), b.id());
        let sealed = a.seal(b"p", b"x");
        let err = b.open(b"p", &sealed).unwrap_err();
        assert_eq!(
            err,
            OpenError::OtherKey {
                sealed_with: a.id().to_owned(),
                this_key: b.id().to_owned()
            }
        );
        let text = err.to_string();
        assert!(text.contains(a.id()) && text.contains(b.id()), "{text}");
    }

    #[test]
    fn a_value_for_another_context_does_not_open() {
        let key = SecretKey::generate();
        let sealed = key.seal(b"provider-1", b"x");
        assert_eq!(
            key.open(b"provider-2", &sealed).unwrap_err(),
            OpenError::Rejected {
                key: key.id().to_owned()
            }
        );
    }

    #[test]
    fn a_changed_value_is_rejected_not_garbage() {
        let key = SecretKey::generate();
        let sealed = key.seal(b"p", b"secret value");
        // Flip each hex digit of the body in turn: none opens.
        let body_at = sealed.rfind(':').unwrap() + 1;
        for i in body_at..sealed.len() {
            let mut bytes = sealed.clone().into_bytes();
            bytes[i] = if bytes[i] == b'0' { b'1' } else { b'0' };
            let changed = String::from_utf8(bytes).unwrap();
            assert!(
                matches!(key.open(b"p", &changed), Err(OpenError::Rejected { .. })),
                "byte {i}"
            );
        }
        // Cut short, not hex, other versions, no prefix: clear errors.
        let cut = &sealed[..body_at + 10];
        assert!(matches!(key.open(b"p", cut), Err(OpenError::Format(_))));
        let not_hex = format!("{}zz", &sealed[..body_at]);
        assert!(matches!(
            key.open(b"p", &not_hex),
            Err(OpenError::Format(_))
        ));
        let v9 = sealed.replacen("sealed:v1:", "sealed:v9:", 1);
        let err = key.open(b"p", &v9).unwrap_err().to_string();
        assert!(err.contains("v9"), "{err}");
        assert!(matches!(
            key.open(b"p", "{\"a\":1}"),
            Err(OpenError::Format(_))
        ));
        assert!(matches!(
            key.open(b"p", "sealed:v1"),
            Err(OpenError::Format(_))
        ));
    }

    #[test]
    fn the_key_file_is_made_0600_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret.key");
        let (made, created) = SecretKey::load_or_create(&path).unwrap();
        assert!(created);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (read, created) = SecretKey::load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(read.id(), made.id());
        let sealed = made.seal(b"c", b"v");
        assert_eq!(read.open(b"c", &sealed).unwrap(), b"v");
        assert!(!format!("{made:?}").contains(&hex::encode(made.bytes)));
    }

    #[test]
    fn a_loose_or_bad_key_file_is_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret.key");
        SecretKey::generate().write_new(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = SecretKey::load(&path).unwrap_err().to_string();
        assert!(err.contains("0644") && err.contains("chmod 600"), "{err}");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "not a key\n").unwrap();
        let err = SecretKey::load(&path).unwrap_err().to_string();
        assert!(err.contains("64 hex characters"), "{err}");
        std::fs::write(&path, format!("{}\n", "g".repeat(64))).unwrap();
        let err = SecretKey::load(&path).unwrap_err().to_string();
        assert!(err.contains("hex characters only"), "{err}");
        // A wrong path to a large file is refused by its size, unread.
        std::fs::write(&path, vec![b'0'; 10 * 1024 * 1024]).unwrap();
        let err = SecretKey::load(&path).unwrap_err().to_string();
        assert!(err.contains("is 10485760 bytes"), "{err}");

        let err = SecretKey::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }

    #[test]
    fn installing_a_key_replaces_the_file_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret.key");
        let old = SecretKey::generate();
        old.write_new(&path).unwrap();
        let new = SecretKey::generate();
        new.install(&path).unwrap();
        assert_eq!(SecretKey::load(&path).unwrap().id(), new.id());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(!dir.path().join("secret.key.new").exists());
    }
}
