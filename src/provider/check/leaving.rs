//! The checks of how a provider leaves: on SIGTERM (exit 0, having called
//! `Unregister`), and on its own when its host goes away.

use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::super::binding::Binding;
use super::super::check_host::CheckHost;
use super::super::link::Link;
use super::super::metadata::Metadata;
use super::{Check, Outcome, Started};

/// How long an exit already made takes to be seen.
const STILL_RUNNING_WITHIN: Duration = Duration::from_millis(100);
/// How often the provider's health is probed while it settles.
const SETTLE_PROBE: Duration = Duration::from_millis(250);
/// How long a provider has to exit once its host is gone.
const HOST_GONE_EXIT: Duration = Duration::from_secs(10);

impl Check {
    /// How it leaves, once the protocol's checks are done: it must still run
    /// (a provider runs until it is stopped), then exit 0 on SIGTERM.
    pub(super) async fn check_leaving(
        &mut self,
        host: &CheckHost,
        link: &Link,
        started: &mut Started,
        meta: &Metadata,
    ) {
        if self.check_still_running(link, started).await {
            self.check_sigterm(host, started, meta).await;
        }
    }

    /// Whether the provider still runs and answers health checks once the
    /// protocol's checks are done and at least `settle` after it registered
    /// (probed every [`SETTLE_PROBE`] until then); a failure if not.
    async fn check_still_running(&mut self, link: &Link, started: &mut Started) -> bool {
        let settle = self.options.settle;
        let until = (started.registered_at + settle)
            .max(tokio::time::Instant::now() + STILL_RUNNING_WITHIN);
        let after = |started: &Started| {
            format!(
                "{} ms after it registered",
                started.registered_at.elapsed().as_millis()
            )
        };
        let died = |exit: String, started: &Started| {
            format!(
                "{exit} on its own, {}: a provider runs until Corbel stops it",
                after(started)
            )
        };
        loop {
            let probe = tokio::time::Instant::now() + SETTLE_PROBE;
            tokio::select! {
                exit = started.running.wait() => {
                    self.report.add("runs until stopped", Outcome::Fail, died(exit, started));
                    return false;
                }
                _ = tokio::time::sleep_until(probe.min(until)) => {}
            }
            if let Err(e) = link.check_health(Some(SETTLE_PROBE)).await {
                // A process that died broke its link a moment before it is seen to exit.
                let exited =
                    tokio::time::timeout(STILL_RUNNING_WITHIN, started.running.wait()).await;
                let (said, running) = match exited {
                    Ok(exit) => (died(exit, started), false),
                    Err(_) => (
                        format!("stopped answering health checks {}: {e}", after(started)),
                        true,
                    ),
                };
                self.report.add("runs until stopped", Outcome::Fail, said);
                return running;
            }
            if tokio::time::Instant::now() >= until {
                let said = format!(
                    "running and healthy {} after it registered (--settle-ms {})",
                    after(started).trim_end_matches(" after it registered"),
                    settle.as_millis()
                );
                self.report.add("runs until stopped", Outcome::Pass, said);
                return true;
            }
        }
    }

    /// `meta`: its `run:` command, whose shell may be what a SIGTERM ended.
    async fn check_sigterm(&mut self, host: &CheckHost, started: &mut Started, meta: &Metadata) {
        let run = meta.runtime.shell_run();
        let grace = self.options.settings.stop_grace;
        (self.say)("stopping it with SIGTERM");
        signal(started.running.binding(), Signal::SIGTERM);
        let exit = tokio::time::timeout(grace, started.running.wait()).await;
        let (outcome, said) = match exit {
            Ok(exit) if exit == "exit status 0" => {
                (Outcome::Pass, format!("{exit} within {grace:?}"))
            }
            // The shell's death, not the provider's doing: a warning that
            // says so (the provider got the signal too, as its group did).
            Ok(exit) if exit == "killed by SIGTERM" && run.is_some_and(|r| !execs(r)) => (
                Outcome::Warn,
                format!(
                    "{exit}: the process Corbel waits for is `sh -c` running `run:`, and a \
                     shell that starts the provider without `exec` is what the signal ended, \
                     whatever the provider did; Corbel sees a provider killed, not one that \
                     exited 0: write `run: exec {}`",
                    run.unwrap_or_default().trim()
                ),
            ),
            Ok(exit) => (
                Outcome::Fail,
                format!("{exit}; a provider exits 0 on SIGTERM"),
            ),
            Err(_) => {
                started.running.stop(Duration::ZERO).await;
                (
                    Outcome::Fail,
                    format!("still running {grace:?} after SIGTERM (stop_grace_ms); killed"),
                )
            }
        };
        self.report.add("exits 0 on SIGTERM", outcome, said);
        let session = started.session.clone();
        let unregistered = host
            .seen()
            .unregistrations
            .iter()
            .any(|u| u.session == session);
        if unregistered {
            self.report
                .add("Unregister on SIGTERM", Outcome::Pass, "with its session");
        } else {
            self.report.add(
                "Unregister on SIGTERM",
                Outcome::Warn,
                "did not call Registry.Unregister with its session before exiting",
            );
        }
    }

    pub(super) async fn check_host_gone(&mut self, host: &CheckHost, started: &mut Started) {
        (self.say)("stopping the host");
        host.kill();
        let exit = tokio::time::timeout(HOST_GONE_EXIT, started.running.wait()).await;
        let result = match exit {
            Ok(exit) => Ok(format!("{exit} once the registry was gone")),
            Err(_) => {
                started.running.stop(Duration::ZERO).await;
                Err(format!(
                    "still running {HOST_GONE_EXIT:?} after its host went away: watch \
                     grpc.health.v1 Watch(\"corbel.provider.v1.Registry\") and exit when it \
                     is not SERVING or the stream breaks; killed"
                ))
            }
        };
        self.report.result("exits when the host goes away", result);
    }
}

fn signal(binding: Option<Binding>, signal: Signal) {
    if let Some(Binding::ProcessGroup(group)) = binding {
        let _ = killpg(Pid::from_raw(group), signal);
    }
}

/// Whether a `run:` command hands its shell's place to the provider: its
/// last line starts with `exec`.
fn execs(run: &str) -> bool {
    run.trim()
        .lines()
        .last()
        .is_some_and(|line| line.trim_start().starts_with("exec "))
}
