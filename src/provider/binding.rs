//! Binding a registration to the process Corbel launched: the registry checks
//! that a `Register` carrying a launch's token comes from that launch, by the
//! credentials of the unix socket peer (SO_PEERCRED: the pid that connected).
//!
//! The shell runtime starts each provider with `setsid`: the provider leads a
//! session and a process group of its own, and its group id is its pid. The
//! rule is that the peer's process group (`/proc/<pid>/stat`) is that group.
//! Why a group and not the pid or descendants:
//!
//! - the run command is `sh -c …`, which may or may not `exec` the provider,
//!   so the registering process may be a child of the launched one;
//! - "a descendant of the launched process" is not enough: a provider's
//!   workloads are its descendants too;
//! - a process can only join a group of its own session (setpgid), and the
//!   provider's session holds nothing but the provider and what it starts
//!   without a new session. The process provider starts each service with
//!   `setsid`, so its services can neither be in the group nor join it.
//!
//! What it does not stop: a program a provider starts in the provider's own
//! session could join the provider's group (a provider that starts programs
//! should give each its own session, as the process provider does); and a
//! process of the same user can read a provider's initial environment in
//! `/proc/<pid>/environ` — which is why the token is also single use
//! (`Slot::spend_launch`): once the provider has registered, it is worthless.
//!
//! The Docker runtime binds a launch to its container's pid namespace: the
//! engine reports the container's first process (`State.Pid`, in the engine
//! host's pid numbering), and every process of the container, and nothing
//! else, is in that process's pid namespace (the runtime never shares the
//! host's). The namespace is named by the inode of `/proc/<pid>/ns/pid`; the
//! runtime takes it only after `/proc/<pid>/cgroup` names the container, so a
//! pid from another numbering (Corbel itself in a container, a remote engine)
//! is never trusted: that launch is then not bound (see
//! `docker/container.rs`). What it does not stop: `docker exec` into the
//! container, which needs the engine, and with it root on the host, anyway.
//!
//! Providers that register with their stored token (run outside Corbel) are
//! not bound. A runtime that cannot tell its process from others returns no
//! binding from `Running::binding`.

use std::fmt;

/// How the registry recognises the process a runtime launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// The registering process is in this process group (the shell runtime:
    /// the group, and the session, the launched process leads).
    ProcessGroup(i32),
    /// The registering process is in this pid namespace (the Docker runtime:
    /// the container's; the inode of `/proc/<pid>/ns/pid`).
    PidNamespace(u64),
}

/// The process at the other end of a registration's connection, as the
/// kernel reported it when it connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// `None` when the connection is not a unix socket or the kernel gave no pid.
    pub pid: Option<i32>,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pid {
            Some(pid) => write!(f, "pid {pid}"),
            None => f.write_str("a peer of unknown pid"),
        }
    }
}

impl Binding {
    /// `Ok` if `peer` is the launched process (or one in its group); else why not.
    pub fn check(&self, peer: &Peer) -> Result<(), String> {
        match *self {
            Binding::ProcessGroup(launched) => {
                let Some(pid) = peer.pid else {
                    return Err(format!(
                        "the caller's process is unknown; the launched provider is process group {launched}"
                    ));
                };
                match process_group(pid) {
                    Some(group) if group == launched => Ok(()),
                    Some(group) => Err(format!(
                        "the caller (pid {pid}, process group {group}) is not the launched provider (process group {launched})"
                    )),
                    None => Err(format!(
                        "the caller (pid {pid}) is gone or unreadable; the launched provider is process group {launched}"
                    )),
                }
            }
            Binding::PidNamespace(launched) => {
                let Some(pid) = peer.pid else {
                    return Err(format!(
                        "the caller's process is unknown; the launched provider is the container of pid namespace {launched}"
                    ));
                };
                match pid_namespace(pid) {
                    Some(ns) if ns == launched => Ok(()),
                    Some(ns) => Err(format!(
                        "the caller (pid {pid}, pid namespace {ns}) is not in the launched provider's container (pid namespace {launched})"
                    )),
                    None => Err(format!(
                        "the caller (pid {pid}) is gone or unreadable; the launched provider is the container of pid namespace {launched}"
                    )),
                }
            }
        }
    }
}

/// Process `pid`'s pid namespace: the inode `/proc/<pid>/ns/pid` leads to.
pub fn pid_namespace(pid: i32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino())
}

/// Process `pid`'s group, from `/proc/<pid>/stat`.
fn process_group(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_group(&stat)
}

/// The group in a `/proc/<pid>/stat` line: the third field after the name,
/// which is in parentheses and may hold spaces and parentheses itself.
fn parse_group(stat: &str) -> Option<i32> {
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split(' ').nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_group_is_read_past_a_name_with_spaces_and_parentheses() {
        assert_eq!(parse_group("42 (a) b) (c) S 1 77 77 0 -1"), Some(77));
        assert_eq!(parse_group("42 (x) S 1"), None);
        assert_eq!(parse_group("garbage"), None);
    }

    #[test]
    fn this_process_is_in_its_group_and_not_in_another() {
        let me = Peer {
            pid: Some(std::process::id() as i32),
        };
        let mine = process_group(std::process::id() as i32).unwrap();
        assert_eq!(Binding::ProcessGroup(mine).check(&me), Ok(()));
        let other = Binding::ProcessGroup(mine + 1).check(&me).unwrap_err();
        assert!(other.contains("is not the launched provider"), "{other}");
        let unknown = Binding::ProcessGroup(mine)
            .check(&Peer { pid: None })
            .unwrap_err();
        assert!(unknown.contains("unknown"), "{unknown}");
    }

    #[test]
    fn this_process_is_in_its_pid_namespace_and_not_in_another() {
        let me = Peer {
            pid: Some(std::process::id() as i32),
        };
        let mine = pid_namespace(std::process::id() as i32).unwrap();
        assert_eq!(Binding::PidNamespace(mine).check(&me), Ok(()));
        let other = Binding::PidNamespace(mine + 1).check(&me).unwrap_err();
        assert!(
            other.contains("is not in the launched provider's container"),
            "{other}"
        );
        let gone = Binding::PidNamespace(mine)
            .check(&Peer {
                pid: Some(i32::MAX),
            })
            .unwrap_err();
        assert!(gone.contains("gone or unreadable"), "{gone}");
    }
}
