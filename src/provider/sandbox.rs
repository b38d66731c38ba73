//! What a provider Corbel starts may touch: a Landlock ruleset it is started
//! under (shell runtime; a Docker provider is a container already).
//!
//! Read and execute: the system's directories ([`SYSTEM_READ`]), the server's
//! own binary's directory (the shipped providers beside it), its checkout and
//! build directory, and what the operator adds (`[provider]
//! sandbox_read`). Read and write: its state directory, the socket directory
//! and what the operator adds (`sandbox_write`); `/dev` for its files (no new
//! device nodes). Nothing else: no `secret.key`, no `corbel.db`, no other
//! provider's directories. Connecting to the registry's socket is not a file
//! access Landlock governs (before ABI 9, which is not asked for), so it needs
//! no rule. Landlock also keeps the provider from tracing (or reading the
//! `/proc` memory and environment of) any process outside its ruleset, the
//! server first.
//!
//! A provider's build ([`SandboxPaths::for_build`]) needs far more (a
//! toolchain in a home directory, caches): it may read and execute
//! everything but what the server keeps secret, and write its checkout, its
//! build directory, Cargo's home and target directory, the temporary
//! directory and what the operator adds.
//!
//! Landlock only allows: "everything but X" is granted by walking from a
//! grant down to X and granting every sibling met on the way
//! ([`SandboxPaths::hidden`]). The directories on the way to X are granted
//! nothing themselves (a right on a directory is a right on all beneath it,
//! X included), so they cannot be listed. The walk grants what exists when
//! the ruleset is made and skips symbolic links (their targets are granted,
//! or not, where they really are). Every grant goes through the walk, the run
//! sandbox's too: a config file under `/etc` stays closed to a provider.
//!
//! The ruleset is made in the server (opening each path), and only applied in
//! the child between `fork` and `exec` ([`Sandbox::apply_in_child`]), which
//! allocates nothing. A kernel without Landlock runs providers and their
//! builds unconfined, with one warning in the log ([`landlock_abi`]).

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use landlock::{
    ABI, Access, AccessFs, BitFlags, PathBeneath, Ruleset, RulesetAttr, RulesetCreated,
    RulesetCreatedAttr,
};

/// The access rights handled: every file-system right of ABI 5 (writing,
/// truncating, renaming across directories, device ioctls). Older kernels get
/// what they know (best effort, as the crate does by default).
const HANDLED: ABI = ABI::V5;

/// System directories a provider (and what it runs) may read and execute.
/// Missing ones are skipped.
pub const SYSTEM_READ: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/sys",
];

/// What one provider (or its build) may touch beyond [`SYSTEM_READ`] and
/// `/dev`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxPaths {
    /// Read and execute.
    pub read: Vec<PathBuf>,
    /// Read, write, create and remove.
    pub write: Vec<PathBuf>,
    /// Kept out of every grant that holds them (files or directories): the
    /// server's data directory, its secret files. A grant inside one of them
    /// (a provider's own directories in the data directory) still holds.
    pub hidden: Vec<PathBuf>,
}

impl SandboxPaths {
    /// What a provider's build may touch: read and execute everything but
    /// `hidden`; write `own` (its checkout, its build directory, the
    /// operator's `sandbox_write`), Cargo's home (`CARGO_HOME`, by default
    /// `~/.cargo`: the registry cache and its locks) and the target directory
    /// the server's environment names (`CARGO_TARGET_DIR`, passed on to the
    /// build), and the temporary directory.
    pub fn for_build(own: Vec<PathBuf>, hidden: Vec<PathBuf>) -> SandboxPaths {
        let env = |name| std::env::var_os(name).map(PathBuf::from);
        let cargo_home = env("CARGO_HOME").or_else(|| env("HOME").map(|h| h.join(".cargo")));
        let mut write = own;
        write.extend(cargo_home);
        write.extend(env("CARGO_TARGET_DIR"));
        write.push(std::env::temp_dir());
        SandboxPaths {
            read: vec![PathBuf::from("/")],
            write,
            hidden,
        }
    }
}

/// A ruleset made and ready to be applied in a child process.
pub struct Sandbox {
    /// Taken by the child that applies it (the parent's copy closes with it).
    ruleset: Option<RulesetCreated>,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot make the provider's Landlock ruleset: {0}")]
pub struct SandboxError(#[from] landlock::RulesetError);

impl Sandbox {
    /// The ruleset for `paths`; `None` when the kernel has no Landlock (said
    /// once in the log).
    pub fn new(paths: &SandboxPaths) -> Result<Option<Sandbox>, SandboxError> {
        if landlock_abi() == 0 {
            return Ok(None);
        }
        let read = AccessFs::from_read(HANDLED);
        let all = AccessFs::from_all(HANDLED);
        let device_files = read | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;
        let mut ruleset = Ruleset::default().handle_access(all)?.create()?;
        let hidden: Vec<PathBuf> = paths.hidden.iter().map(|p| resolved(p)).collect();
        let server_dir = server_dir();
        let grants = SYSTEM_READ
            .iter()
            .map(|p| (Path::new(p), read))
            .chain(server_dir.iter().map(|p| (p.as_path(), read)))
            .chain(paths.read.iter().map(|p| (p.as_path(), read)))
            .chain([(Path::new("/dev"), device_files)])
            .chain([(Path::new("/dev/shm"), all)])
            .chain(paths.write.iter().map(|p| (p.as_path(), all)));
        for (path, access) in grants {
            for (file, access) in granted(path, access, &hidden) {
                ruleset = ruleset.add_rule(PathBeneath::new(file, access))?;
            }
        }
        Ok(Some(Sandbox {
            ruleset: Some(ruleset),
        }))
    }

    /// Restricts the calling process (and everything it will start) to the
    /// ruleset. Meant for a `pre_exec` hook: async-signal-safe, no allocation.
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

/// What granting `access` on `path` comes to with `hidden` kept out: the
/// path itself, or, if it holds something hidden, what lies beside the
/// hidden paths on the way down to them (see the module's header). A path
/// that does not exist grants nothing (and is no error: a system without
/// /lib32, an operator's path not made yet).
fn granted(
    path: &Path,
    access: BitFlags<AccessFs>,
    hidden: &[PathBuf],
) -> Vec<(File, BitFlags<AccessFs>)> {
    let mut rules = Vec::new();
    let Ok(path) = path.canonicalize() else {
        return rules;
    };
    if hidden.iter().any(|h| h.starts_with(&path) && *h != path) {
        walk(&path, access, hidden, &mut rules);
    } else if let Some((file, access, _)) = opened(&path, access) {
        rules.push((file, access));
    }
    rules
}

/// Grants `access` on every entry of `dir` but the hidden ones, going down
/// into those on the way to one.
fn walk(
    dir: &Path,
    access: BitFlags<AccessFs>,
    hidden: &[PathBuf],
    rules: &mut Vec<(File, BitFlags<AccessFs>)>,
) {
    // A directory the server cannot list is one its child could not use.
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let entries: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    // A crowded directory (a shared /tmp holding the data dir) is not opened
    // entry by entry: a rule each would make every start slow. Only the way
    // down to what is hidden is taken; what the child needs there it is
    // granted on its own (its checkout, its build dir, its temp dir).
    let crowded = entries.len() > MAX_WALKED_ENTRIES;
    for path in entries {
        if hidden.contains(&path) {
            continue;
        }
        let on_the_way = hidden.iter().any(|h| h.starts_with(&path));
        if crowded && !on_the_way {
            continue;
        }
        let Some((file, access, is_dir)) = opened(&path, access) else {
            continue;
        };
        if is_dir && on_the_way {
            walk(&path, access, hidden, rules);
        } else {
            rules.push((file, access));
        }
    }
}

/// The most entries of a directory on the way to a hidden path that are
/// granted one by one (see [`walk`]).
const MAX_WALKED_ENTRIES: usize = 256;

/// `path` opened for a rule (not followed if it is a symbolic link, which
/// is then no rule), with `access` narrowed to a file's rights for a file,
/// and whether it is a directory.
fn opened(path: &Path, access: BitFlags<AccessFs>) -> Option<(File, BitFlags<AccessFs>, bool)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_PATH | nix::libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    let kind = file.metadata().ok()?.file_type();
    if kind.is_symlink() {
        None
    } else if kind.is_dir() {
        Some((file, access, true))
    } else {
        Some((file, access & AccessFs::from_file(HANDLED), false))
    }
}

/// `path` absolute and without symbolic links, so that it compares with the
/// walked paths; one not made yet is resolved through its parent.
fn resolved(path: &Path) -> PathBuf {
    if let Ok(real) = path.canonicalize() {
        return real;
    }
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    match (absolute.parent(), absolute.file_name()) {
        (Some(parent), Some(name)) => parent
            .canonicalize()
            .map_or(absolute.clone(), |p| p.join(name)),
        _ => absolute,
    }
}

/// The directory of the server's own binary, where the providers shipped
/// with it are installed (and built, in a clone).
fn server_dir() -> Option<PathBuf> {
    std::env::current_exe().ok()?.parent().map(Path::to_owned)
}

/// The Landlock ABI the kernel offers, 0 for none; asked once, and a kernel
/// without it said once in the log.
pub fn landlock_abi() -> i64 {
    static ABI_SEEN: OnceLock<i64> = OnceLock::new();
    *ABI_SEEN.get_or_init(|| {
        // LANDLOCK_CREATE_RULESET_VERSION: the ABI version, no ruleset made.
        // SAFETY: a query with a null attribute and size 0, as documented.
        let abi = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_landlock_create_ruleset,
                std::ptr::null::<u8>(),
                0usize,
                1u32,
            )
        };
        let abi = abi.max(0);
        if abi == 0 {
            tracing::warn!(
                "this kernel has no Landlock: providers, their builds and their workloads \
                 run with the server's whole view of the file system"
            );
        }
        abi
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `script` run by `sh` in a child under the ruleset for `paths`: its
    /// output.
    fn confined_output(paths: &SandboxPaths, script: &str) -> String {
        let mut sandbox = Sandbox::new(paths).unwrap().expect("Landlock");
        let mut command = std::process::Command::new("/bin/sh");
        command.arg("-c").arg(script);
        // SAFETY: apply_in_child allocates nothing and only makes syscalls.
        unsafe {
            use std::os::unix::process::CommandExt as _;
            command.pre_exec(move || sandbox.apply_in_child());
        }
        let out = command.output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A child under the ruleset reads what it was given and nothing else:
    /// run for real, with `sh`, in a process of its own.
    #[test]
    fn a_child_reads_its_own_paths_only() {
        if landlock_abi() == 0 {
            eprintln!("no Landlock on this kernel: nothing to check");
            return;
        }
        let given = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("secret.key"), "k").unwrap();
        let paths = SandboxPaths {
            read: vec![],
            write: vec![given.path().to_owned()],
            hidden: vec![],
        };
        let script = format!(
            "echo ok > {given}/mine && cat {given}/mine; cat {other}/secret.key || echo refused",
            given = given.path().display(),
            other = other.path().display()
        );
        assert_eq!(confined_output(&paths, &script), "ok\nrefused\n");
    }

    /// A grant holding a hidden path grants all around it but the path:
    /// what lies beside it at every level, a directory granted inside it, not
    /// a symbolic link leading to it; and the data directory reached through
    /// a link of its own (and named relative) is still hidden.
    #[test]
    fn a_grant_keeps_out_what_is_hidden_beneath_it() {
        if landlock_abi() == 0 {
            eprintln!("no Landlock on this kernel: nothing to check");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let path = |p: &str| root.path().join(p);
        for dir in ["a/data/providers/mine", "a/data/providers/other", "b"] {
            std::fs::create_dir_all(path(dir)).unwrap();
        }
        for file in [
            "a/beside",
            "b/file",
            "a/data/secret.key",
            "a/data/providers/mine/src",
            "a/data/providers/other/src",
        ] {
            std::fs::write(path(file), format!("{file}\n")).unwrap();
        }
        std::os::unix::fs::symlink(path("a/data"), path("link")).unwrap();
        std::os::unix::fs::symlink(path("a/data"), path("b/data-link")).unwrap();
        let relative = pathdiff(&path("b/data-link"));
        let paths = SandboxPaths {
            read: vec![root.path().to_owned()],
            write: vec![path("a/data/providers/mine")],
            hidden: vec![relative],
        };
        let script = [
            "a/beside",
            "b/file",
            "a/data/secret.key",
            "link/secret.key",
            "a/data/providers/mine/src",
            "a/data/providers/other/src",
        ]
        .map(|f| format!("cat {p} || echo refused {f}; ", p = path(f).display()))
        .concat();
        let script = format!(
            "{script} ls {} >/dev/null || echo unlisted",
            path("a").display()
        );
        assert_eq!(
            confined_output(&paths, &script),
            "a/beside\nb/file\nrefused a/data/secret.key\nrefused link/secret.key\n\
             a/data/providers/mine/src\nrefused a/data/providers/other/src\nunlisted\n"
        );
    }

    /// `path` relative to the current directory, through `..` as needed.
    fn pathdiff(path: &Path) -> PathBuf {
        let here = std::env::current_dir().unwrap();
        let up = here.components().count() - 1;
        let mut relative: PathBuf = std::iter::repeat_n("..", up).collect();
        relative.push(path.strip_prefix("/").unwrap());
        relative
    }
}
