//! `runAs`: a provider run as another user than the server's, when the
//! server runs as root. The provider (its shell command, or its container)
//! starts with that user's ids and no supplementary groups; it owns its
//! state directory and a socket directory of its own
//! (`<socket dir>/<provider id>`), and may reach its checkout, its build and
//! the registry's socket, nothing more of the data directory: the server's
//! key, database and other providers' state stay the server's (mode 0600 or
//! 0700), on top of the provider's sandbox (`sandbox.rs`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Uid, User};

use super::ProviderError;
use super::settings::ProviderSettings;

/// The user a provider runs as.
#[derive(Clone, Debug)]
pub struct RunAs {
    pub name: String,
    pub uid: Uid,
    pub gid: Gid,
    pub home: PathBuf,
}

/// Checks a `runAs` value as given to `createProvider` or `updateProvider`:
/// empty, or a user of this host other than root, with the server running
/// as root.
pub(super) fn check(user: &str) -> Result<(), ProviderError> {
    resolve(user).map(|_| ()).map_err(ProviderError::Invalid)
}

/// The user `name` names; `None` for empty (the server's own user).
pub(super) fn resolve(name: &str) -> Result<Option<RunAs>, String> {
    if name.is_empty() {
        return Ok(None);
    }
    let server = Uid::effective();
    if !server.is_root() {
        return Err(format!(
            "runAs: running a provider as `{name}` needs the server to run as root \
             (it runs as uid {server}); leave runAs empty to run it as the server's user"
        ));
    }
    let user = match User::from_name(name) {
        Ok(Some(user)) => user,
        Ok(None) => return Err(format!("runAs: no user named `{name}` on this host")),
        Err(e) => return Err(format!("runAs: cannot look up the user `{name}`: {e}")),
    };
    if user.uid.is_root() {
        return Err(format!(
            "runAs: `{name}` is root; name an unprivileged user, or leave runAs empty"
        ));
    }
    Ok(Some(RunAs {
        name: user.name,
        uid: user.uid,
        gid: user.gid,
        home: user.dir,
    }))
}

/// The user provider `id` runs as (`runAs` `name`), given its own state and
/// socket directories and a way to its checkout and the registry; `None` to
/// run it as the server's user.
pub(super) async fn prepare(
    settings: &ProviderSettings,
    id: uuid::Uuid,
    name: &str,
) -> Result<Option<RunAs>, String> {
    let Some(user) = resolve(name)? else {
        return Ok(None);
    };
    let sockets = super::settings::own_socket_dir(&settings.socket_dir(), id);
    check_socket(&sockets, id)?;
    let state = settings.provider_state_dir(id);
    let mut pass = vec![
        settings.data_dir.clone(),
        settings.data_dir.join("providers"),
        settings.provider_dir(id),
    ];
    // The way to the sockets: the socket root (and its `corbel` parent).
    pass.extend(
        settings
            .socket_root_dirs()
            .into_iter()
            .map(Path::to_path_buf),
    );
    pass.push(settings.socket_dir());
    pass.extend(settings.state_dir.iter().cloned());
    let registry = settings.registry_socket();
    let given = user.clone();
    tokio::task::spawn_blocking(move || {
        let pass: Vec<&Path> = pass.iter().map(PathBuf::as_path).collect();
        given.hand_over(&[&state, &sockets], &pass, &registry)
    })
    .await
    .map_err(|e| format!("cannot prepare the provider's directories: {e}"))??;
    Ok(Some(user))
}

/// Refuses a socket directory of its own, `sockets`, in which provider
/// `id`'s socket (`<id>.sock`, as the SDK binds it) would be too long a path.
pub(super) fn check_socket(sockets: &Path, id: uuid::Uuid) -> Result<(), String> {
    super::settings::check_socket_path(&sockets.join(format!("{id}.sock")))
        .map_err(|e| format!("{e:#}"))
}

impl RunAs {
    /// The variables a login of this user would have.
    pub fn environment(&self) -> Vec<(String, String)> {
        vec![
            ("HOME".to_owned(), self.home.display().to_string()),
            ("USER".to_owned(), self.name.clone()),
            ("LOGNAME".to_owned(), self.name.clone()),
        ]
    }

    /// Gives the user its own directories, `own` (made when missing, owned by
    /// it with whatever they hold, closed to others), and a way through `pass` (each directory
    /// searchable by others, not readable: it lists nothing) and to the
    /// registry's socket (`registry`, which asks for the launch's token).
    pub fn hand_over(&self, own: &[&Path], pass: &[&Path], registry: &Path) -> Result<(), String> {
        for dir in own {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            chown_all(dir, self.uid, self.gid)
                .map_err(|e| format!("cannot give {} to `{}`: {e}", dir.display(), self.name))?;
            // Its own: closed to other users (other providers run as others).
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("cannot close {} to others: {e}", dir.display()))?;
        }
        for dir in pass {
            add_mode(dir, 0o001)?;
        }
        add_mode(registry, 0o006)
    }
}

/// `path` and everything under it, owned by `uid`:`gid` (symlinks
/// themselves, never what they point to).
fn chown_all(path: &Path, uid: Uid, gid: Gid) -> std::io::Result<()> {
    use nix::fcntl::{AT_FDCWD, AtFlags};
    nix::unistd::fchownat(
        AT_FDCWD,
        path,
        Some(uid),
        Some(gid),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(std::io::Error::from)?;
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_all(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// Adds `bits` to `path`'s mode.
fn add_mode(path: &Path, bits: u32) -> Result<(), String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mode = meta.permissions().mode();
    if mode & bits == bits {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | bits))
        .map_err(|e| format!("cannot open {} to the provider's user: {e}", path.display()))
}
