//! What a service may touch: each starts under a Landlock ruleset unless its
//! config says `sandbox: none`.
//!
//! Read and execute: the system's directories ([`SYSTEM_READ`]), the
//! directory of its command when the command is a path, and its
//! `sandbox.read` paths. Read and write: its `cwd` and its `sandbox.write`
//! paths, `/dev/shm`, and the files of `/dev` (no new device nodes). Nothing
//! else: not the provider's state directory (records, other services' logs),
//! nor anything of the server's. Its log file is opened by the provider and
//! handed to it, so it needs no rule. Landlock also keeps it from tracing, or
//! reading the `/proc` memory and environment of, any process outside its
//! ruleset: the provider, the server.
//!
//! A ruleset only ever narrows: under a provider that Corbel confined, a
//! service (even with `sandbox: none`) can reach at most what the provider
//! can. The ruleset is made in the provider and applied in the child between
//! `fork` and `exec` ([`Confinement::apply_in_child`]), which allocates
//! nothing.

use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreated,
    RulesetCreatedAttr,
};

use crate::config::{Sandbox, ServiceConfig};

/// Every file-system right of ABI 5; older kernels get what they know.
const HANDLED: ABI = ABI::V5;

/// System directories a service may read and execute. Missing ones are skipped.
pub const SYSTEM_READ: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/sys",
];

/// A ruleset made for one service, ready to be applied in its process.
pub struct Confinement {
    /// Taken by the child that applies it.
    ruleset: Option<RulesetCreated>,
}

impl Confinement {
    /// The ruleset `service` starts under; `None` for `sandbox: none`.
    pub fn for_service(service: &ServiceConfig) -> Result<Option<Confinement>, String> {
        let Sandbox::Confined { read, write } = &service.sandbox else {
            return Ok(None);
        };
        let mut readable: Vec<PathBuf> = SYSTEM_READ.iter().map(PathBuf::from).collect();
        if service.command.contains('/')
            && let Some(dir) = Path::new(&service.command).parent()
        {
            readable.push(dir.to_owned());
        }
        readable.extend(read.iter().cloned());
        let mut writable: Vec<PathBuf> = service.cwd.iter().cloned().collect();
        writable.extend(write.iter().cloned());
        writable.push(PathBuf::from("/dev/shm"));
        ruleset(&readable, &writable)
            .map(|ruleset| {
                Some(Confinement {
                    ruleset: Some(ruleset),
                })
            })
            .map_err(|e| format!("cannot make the service's Landlock ruleset: {e}"))
    }

    /// Restricts the calling process, and all it starts, to the ruleset.
    /// Meant for a `pre_exec` hook: async-signal-safe, no allocation.
    pub fn apply_in_child(&mut self) -> std::io::Result<()> {
        let Some(ruleset) = self.ruleset.take() else {
            return Ok(());
        };
        match ruleset.restrict_self() {
            Ok(_) => Ok(()),
            Err(_) => Err(std::io::Error::from_raw_os_error(nix::libc::EPERM)),
        }
    }
}

fn ruleset(
    readable: &[PathBuf],
    writable: &[PathBuf],
) -> Result<RulesetCreated, landlock::RulesetError> {
    let read = AccessFs::from_read(HANDLED);
    let all = AccessFs::from_all(HANDLED);
    let device_files = read | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;
    let mut ruleset = Ruleset::default().handle_access(all)?.create()?;
    let grants = readable
        .iter()
        .map(|p| (p.as_path(), read))
        .chain([(Path::new("/dev"), device_files)])
        .chain(writable.iter().map(|p| (p.as_path(), all)));
    for (path, access) in grants {
        // A path that does not exist grants nothing.
        let Ok(fd) = PathFd::new(path) else { continue };
        let access = if path.is_dir() {
            access
        } else {
            access & AccessFs::from_file(HANDLED)
        };
        ruleset = ruleset.add_rule(PathBeneath::new(fd, access))?;
    }
    Ok(ruleset)
}
