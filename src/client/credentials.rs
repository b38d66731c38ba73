//! The credentials `corbel login` stores: the server and an API token, in
//! `$XDG_CONFIG_HOME/corbel/credentials.toml` (else `$HOME/.config/…`), mode
//! 0600 in a directory of mode 0700, written whole to a temporary file and
//! renamed into place, so a reader never sees half a file.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::ClientError;

#[derive(Clone, Deserialize, Serialize)]
pub struct Credentials {
    /// The server the token is for: it is sent nowhere else.
    pub server: String,
    pub token: String,
    /// The token's id, to revoke it by (`revokeApiToken`).
    pub token_id: String,
    pub username: String,
}

/// Never the token, even in a debug print.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("server", &self.server)
            .field("token", &"***")
            .field("token_id", &self.token_id)
            .field("username", &self.username)
            .finish()
    }
}

/// `$XDG_CONFIG_HOME/corbel/credentials.toml`, else under `$HOME/.config`.
pub fn path() -> Result<PathBuf, ClientError> {
    let base = match std::env::var_os("XDG_CONFIG_HOME") {
        Some(dir) if Path::new(&dir).is_absolute() => PathBuf::from(dir),
        _ => match std::env::var_os("HOME") {
            Some(home) if !home.is_empty() => PathBuf::from(home).join(".config"),
            _ => {
                return Err(ClientError::Local(
                    "neither XDG_CONFIG_HOME nor HOME is set: nowhere to keep credentials"
                        .to_owned(),
                ));
            }
        },
    };
    Ok(base.join("corbel").join("credentials.toml"))
}

/// The stored credentials; `None` when there are none.
pub fn load() -> Result<Option<Credentials>, ClientError> {
    let path = path()?;
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ClientError::Local(format!(
                "reading {}: {e}",
                path.display()
            )));
        }
    };
    toml::from_str(&text).map(Some).map_err(|e| {
        ClientError::Local(format!(
            "{} is not a credentials file ({e}): remove it and sign in again",
            path.display()
        ))
    })
}

/// Writes `credentials` atomically, readable by the user only.
pub fn store(credentials: &Credentials) -> Result<PathBuf, ClientError> {
    let path = path()?;
    let dir = path.parent().expect("the path has a directory");
    let local = |what: &str, e: std::io::Error| ClientError::Local(format!("{what}: {e}"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| local(&format!("creating {}", dir.display()), e))?;
    let text = toml::to_string(credentials).expect("credentials serialise");
    let temporary = dir.join(format!(".credentials.toml.{}", std::process::id()));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temporary)?;
        // The mode given at creation passes through the umask; make sure.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temporary, &path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(local(&format!("writing {}", path.display()), e));
    }
    Ok(path)
}

/// Removes the stored credentials; `false` when there were none.
pub fn remove() -> Result<bool, ClientError> {
    let path = path()?;
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(ClientError::Local(format!(
            "removing {}: {e}",
            path.display()
        ))),
    }
}
