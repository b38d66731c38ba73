//! Each service's health, as it changes, on a [`HealthBoard`] (the "watch"
//! feature): one task per service waits for its exit, and nothing polls.
//!
//! - A service this provider spawned is its child: the task waits for the
//!   child, so the exit is known at once with its wait status. The reason
//!   reads `exited with status <code>` (`exit_code` = the code) or
//!   `killed by <SIGNAL> (exit status <128 + signal>)` (`exit_code` = 128 +
//!   the signal; `, core dumped` after the signal's name when it did).
//! - A service started by an earlier instance of the provider (found from the
//!   records at start-up, or adopted by a deploy) is not its child: the task
//!   waits on a pidfd (`pidfd_open`, readable once the process exited), and
//!   the reason is [`NOT_A_CHILD`], with no `exit_code`. On a kernel without
//!   pidfds (before Linux 5.3) such a service is reported HEALTHY and its
//!   exit is seen by `Inspect` only; the provider logs it once per service.
//!
//! A destroyed service is [`Watcher::forget`]ten before it is stopped, so its
//! death is never reported as DOWN.

use std::collections::HashMap;
use std::future::Future;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use corbel_provider_sdk::HealthBoard;
use corbel_provider_sdk::proto::Health;
use nix::sys::signal::Signal;
use tokio::process::Child;
use tokio::task::AbortHandle;

use crate::lifecycle;
use crate::procfs::{self, Liveness};
use crate::state::{Phase, Record};

/// Why an adopted service is DOWN: a pidfd tells that it exited, not how.
pub const NOT_A_CHILD: &str = "exited (status unknown: not a child of this provider)";

/// The board, and the task watching each service that runs.
pub struct Watcher {
    board: HealthBoard,
    watched: Mutex<HashMap<String, Watched>>,
    /// Numbers each watch, so a task replaced meanwhile reports nothing.
    next: AtomicU64,
}

/// What a task watches, and the task.
struct Watched {
    pid: i32,
    start_time: u64,
    generation: u64,
    task: AbortHandle,
}

impl Watcher {
    pub fn new() -> Arc<Self> {
        Arc::new(Watcher {
            board: HealthBoard::new(),
            watched: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        })
    }

    pub fn board(&self) -> &HealthBoard {
        &self.board
    }

    /// A service this provider spawned and has not reaped: HEALTHY now, DOWN
    /// with its wait status when it exits (the task reaps it).
    pub fn child(self: &Arc<Self>, resource_id: &str, pid: i32, start_time: u64, child: Child) {
        let mut child = child;
        self.watch(resource_id, pid, start_time, async move {
            exit_of(child.wait().await)
        });
    }

    /// A service this provider did not spawn (or no longer holds as a child),
    /// running as `pid` since `start_time`: HEALTHY now, DOWN when its pidfd
    /// says it exited. One already watched as that process stays as it is.
    pub fn adopt(self: &Arc<Self>, resource_id: &str, pid: i32, start_time: u64) {
        let same = |w: &Watched| w.pid == pid && w.start_time == start_time;
        if self.lock().get(resource_id).is_some_and(same) {
            return;
        }
        let pidfd = rustix::process::Pid::from_raw(pid)
            .ok_or(rustix::io::Errno::SRCH)
            .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()));
        match pidfd {
            // Open first, then checked: the pidfd is of the process recorded.
            Ok(pidfd) if procfs::liveness(pid, start_time) == Liveness::Running => {
                self.watch(resource_id, pid, start_time, async move {
                    exited_by_pidfd(pidfd, pid).await;
                    (None, NOT_A_CHILD.to_string())
                });
            }
            Ok(_) | Err(rustix::io::Errno::SRCH) => self.down(
                resource_id,
                format!("pid {pid} exited (status unknown: not a child of this provider)"),
            ),
            Err(error) => {
                tracing::warn!(resource.id = resource_id, pid, %error,
                    "cannot open a pidfd: this service's exit is seen by Inspect only");
                if let Some(old) = self.lock().remove(resource_id) {
                    old.task.abort();
                }
                self.board.set(resource_id, Health::Healthy, "");
            }
        }
    }

    /// What a record says, as a status: its process watched if it runs, DOWN
    /// with the reason if not. For the records found at start-up.
    pub async fn observe(self: &Arc<Self>, record: &Record) {
        let id = &record.resource_id;
        if record.job.is_some() {
            return crate::job::observe(self, record);
        }
        match &record.phase {
            // Only a job finishes.
            Phase::Finished(_) => self.forget(id),
            Phase::Running(running) => match procfs::liveness(running.pid, running.start_time) {
                Liveness::Running => self.adopt(id, running.pid, running.start_time),
                Liveness::Gone => self.down(
                    id,
                    format!(
                        "pid {} exited while no provider watched it (status unknown)",
                        running.pid
                    ),
                ),
                Liveness::Reused => self.down(
                    id,
                    format!(
                        "pid {} exited while no provider watched it (status unknown; \
                         the pid is now another process's)",
                        running.pid
                    ),
                ),
            },
            Phase::Intent => match lifecycle::find_service(id).await {
                Some(found) => self.adopt(id, found.pid, found.stat.start_time),
                None => self.down(id, "its start was interrupted before the service ran"),
            },
        }
    }

    /// A job, running or completed: HEALTHY with `reason`, and not watched
    /// (its end is its deploy's, not a service's death).
    pub fn job(&self, resource_id: &str, reason: &str) {
        let mut watched = self.lock();
        if let Some(old) = watched.remove(resource_id) {
            old.task.abort();
        }
        self.board.set(resource_id, Health::Healthy, reason);
    }

    /// DOWN for a reason other than an exit seen: no task watches it.
    pub fn down(&self, resource_id: &str, reason: impl Into<String>) {
        let mut watched = self.lock();
        if let Some(old) = watched.remove(resource_id) {
            old.task.abort();
        }
        self.board.exited(resource_id, None, reason);
    }

    /// Destroyed on purpose: no longer reported. Its task runs on, to reap
    /// a child as it is stopped, and reports nothing: it is no longer the
    /// resource's watch.
    pub fn forget(&self, resource_id: &str) {
        let mut watched = self.lock();
        watched.remove(resource_id);
        self.board.forget(resource_id);
    }

    /// Stops every task (the provider is going away; its services are not).
    pub fn stop(&self) {
        for (_, watched) in self.lock().drain() {
            watched.task.abort();
        }
    }

    /// HEALTHY now; `exit`'s outcome (exit code, reason) as DOWN when it comes,
    /// unless this watch was replaced or forgotten meanwhile.
    fn watch(
        self: &Arc<Self>,
        resource_id: &str,
        pid: i32,
        start_time: u64,
        exit: impl Future<Output = (Option<i32>, String)> + Send + 'static,
    ) {
        // Held while the task starts, so it cannot report before it is known.
        let mut watched = self.lock();
        if let Some(old) = watched.remove(resource_id) {
            old.task.abort();
        }
        self.board.set(resource_id, Health::Healthy, "");
        let generation = self.next.fetch_add(1, Ordering::Relaxed);
        let (watcher, id) = (self.clone(), resource_id.to_string());
        let task = tokio::spawn(async move {
            let (exit_code, reason) = exit.await;
            watcher.exited(&id, generation, exit_code, reason);
        });
        let task = task.abort_handle();
        let entry = Watched {
            pid,
            start_time,
            generation,
            task,
        };
        watched.insert(resource_id.to_string(), entry);
    }

    fn exited(&self, resource_id: &str, generation: u64, exit_code: Option<i32>, reason: String) {
        let mut watched = self.lock();
        if watched
            .get(resource_id)
            .is_some_and(|w| w.generation == generation)
        {
            watched.remove(resource_id);
            self.board.exited(resource_id, exit_code, reason);
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Watched>> {
        self.watched
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Resolves once the process of `pidfd` exited. If the pidfd cannot be
/// polled, never: the service then counts as running, as without pidfds.
async fn exited_by_pidfd(pidfd: OwnedFd, pid: i32) {
    match lifecycle::readable_fd(pidfd) {
        Ok(fd) => {
            if fd.readable().await.is_ok() {
                return;
            }
        }
        Err(error) => {
            tracing::warn!(pid, %error, "cannot poll a pidfd: this service's exit is seen by Inspect only");
        }
    }
    std::future::pending::<()>().await;
}

/// A child's wait status as (exit code, reason): `exited with status 1`,
/// `killed by SIGKILL (exit status 137)`.
pub fn exit_of(status: std::io::Result<ExitStatus>) -> (Option<i32>, String) {
    let status = match status {
        Ok(status) => status,
        Err(error) => return (None, format!("exited (status unknown: {error})")),
    };
    if let Some(code) = status.code() {
        return (Some(code), format!("exited with status {code}"));
    }
    match status.signal() {
        Some(signal) => {
            let name = Signal::try_from(signal)
                .map(|s| s.as_str().to_string())
                .unwrap_or_else(|_| format!("signal {signal}"));
            let core = if status.core_dumped() {
                ", core dumped"
            } else {
                ""
            };
            let code = 128 + signal;
            (
                Some(code),
                format!("killed by {name}{core} (exit status {code})"),
            )
        }
        None => (None, format!("exited ({status})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_statuses_read_as_one_wording() {
        // Raw wait statuses: exit code in the second byte, signal in the low bits.
        assert_eq!(
            exit_of(Ok(ExitStatus::from_raw(0))),
            (Some(0), "exited with status 0".to_string())
        );
        assert_eq!(
            exit_of(Ok(ExitStatus::from_raw(1 << 8))),
            (Some(1), "exited with status 1".to_string())
        );
        assert_eq!(
            exit_of(Ok(ExitStatus::from_raw(9))),
            (Some(137), "killed by SIGKILL (exit status 137)".to_string())
        );
        assert_eq!(
            exit_of(Ok(ExitStatus::from_raw(11 | 0x80))),
            (
                Some(139),
                "killed by SIGSEGV, core dumped (exit status 139)".to_string()
            )
        );
    }
}
