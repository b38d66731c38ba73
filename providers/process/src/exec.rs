//! Exec: a command run in a running service's context: its environment
//! ([`lifecycle::service_env`]), its working directory and its Landlock
//! ruleset, as the provider's user. Without a terminal its stdout and stderr
//! are pipes; with one (`tty`), a pty of the size asked, whose master the
//! provider reads and writes, resized on request.
//!
//! The command starts a session of its own, so it and everything it starts
//! form one process group: when the command exits, when Corbel hangs up and
//! when its `timeout_seconds` pass, the whole group is killed (SIGKILL), so an
//! exec leaves nothing running behind it. Its output is all sent before its
//! exit.

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use corbel_provider_sdk::proto;
use corbel_provider_sdk::{ExecInput, ExecInputs, ExecOutputs, Status};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::task::JoinHandle;

use crate::config::ServiceConfig;
use crate::lifecycle::{self, service_env};
use crate::procfs::{self, Liveness};
use crate::state::{Phase, Record, StateDir};

/// How much output one message carries at most.
const CHUNK: usize = 64 * 1024;

/// Runs `start.command` in the service `start.resource` (see the module).
pub async fn exec(
    state: &StateDir,
    pass_env: &[String],
    start: proto::ExecStart,
    mut inputs: ExecInputs,
    outputs: ExecOutputs,
) -> Result<proto::ExecExit, Status> {
    let resource = start.resource.clone().unwrap_or_default();
    let service = ServiceConfig::parse(&resource.config_json).map_err(Status::invalid_argument)?;
    let record = running_record(state, resource.resource_id).await?;
    let mut env = service_env(&record, &service, pass_env, |name| std::env::var(name).ok());
    if start.tty {
        env.entry("TERM".to_owned())
            .or_insert_with(|| "xterm-256color".to_owned());
    }
    let mut command = Command::new(&start.command[0]);
    command.args(&start.command[1..]).env_clear().envs(env);
    if let Some(cwd) = &service.cwd {
        command.current_dir(cwd);
    }
    let mut confinement =
        crate::sandbox::Confinement::for_service(&service).map_err(Status::internal)?;
    let shown = lifecycle::shell_words(&start.command[0], &start.command[1..]);
    let mut session = if start.tty {
        Session::terminal(&mut command, start.size, confinement.take())?
    } else {
        Session::pipes(&mut command, start.stdin, confinement.take())?
    };
    let spawned = command.spawn();
    // The command's copies of a terminal's other side close with it: the
    // master reads its end once the command's side is all closed.
    drop(command);
    let mut child =
        spawned.map_err(|e| Status::failed_precondition(format!("cannot start `{shown}`: {e}")))?;
    let group = Pid::from_raw(child.id().map_or(0, |pid| pid as i32));
    let readers = session.read_into(&mut child, &outputs)?;
    let deadline = (start.timeout_seconds > 0)
        .then(|| tokio::time::Instant::now() + Duration::from_secs(start.timeout_seconds.into()));
    let mut timed_out = false;
    let mut inputs_done = false;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            input = inputs.next(), if !inputs_done => match input {
                Some(ExecInput::Stdin(bytes)) => session.write(&bytes).await,
                Some(ExecInput::CloseStdin) => session.close_stdin().await,
                Some(ExecInput::Resize { rows, cols }) => session.resize(rows, cols),
                Some(ExecInput::HungUp) => {
                    inputs_done = true;
                    kill(group);
                }
                None => inputs_done = true, // stdin closed and the caller done: it runs on
            },
            () = sleep_until(deadline), if !timed_out => {
                timed_out = true;
                kill(group);
            }
        }
    };
    // What it left in its group goes with it; then its output ends.
    kill(group);
    drop(session);
    for reader in readers {
        let _ = reader.await;
    }
    let status = status.map_err(|e| Status::internal(format!("cannot wait for `{shown}`: {e}")))?;
    Ok(exit_of(status, timed_out))
}

/// The record of the service `id`, if it runs: NOT_FOUND without one,
/// FAILED_PRECONDITION when it has exited or is still starting.
pub(crate) async fn running_record(state: &StateDir, id: String) -> Result<Record, Status> {
    let record = {
        let (state, id) = (state.clone(), id.clone());
        lifecycle::blocking(move || state.read(&id))
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?
    }
    .ok_or_else(|| Status::not_found(format!("no service {id} here")))?;
    match &record.phase {
        Phase::Running(running)
            if procfs::liveness(running.pid, running.start_time) == Liveness::Running =>
        {
            Ok(record)
        }
        Phase::Running(running) => Err(Status::failed_precondition(format!(
            "the service is not running (pid {} has exited)",
            running.pid
        ))),
        Phase::Intent => Err(Status::failed_precondition("the service is still starting")),
        Phase::Finished(_) => Err(Status::failed_precondition(
            "the job has run to its end: nothing runs to run a command in",
        )),
    }
}

/// Starts `command` in a session of its own under `confinement` (a
/// service's ruleset).
pub(crate) fn confine(command: &mut Command, mut confinement: Option<crate::sandbox::Confinement>) {
    // SAFETY: setsid is async-signal-safe; applying the ruleset allocates
    // nothing.
    unsafe {
        command.pre_exec(move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            match &mut confinement {
                Some(confinement) => confinement.apply_in_child(),
                None => Ok(()),
            }
        });
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn kill(group: Pid) {
    if group.as_raw() > 0 {
        let _ = killpg(group, Signal::SIGKILL);
    }
}

fn exit_of(status: ExitStatus, timed_out: bool) -> proto::ExecExit {
    use std::os::unix::process::ExitStatusExt;
    let signal = status
        .signal()
        .and_then(|n| Signal::try_from(n).ok())
        .map(|s| s.as_str().to_owned())
        .unwrap_or_default();
    proto::ExecExit {
        code: status.code().unwrap_or(-1),
        signal,
        timed_out,
    }
}

/// The command's side of the exec: its pipes, or its terminal's master.
enum Session {
    Pipes {
        stdin: Option<tokio::process::ChildStdin>,
    },
    Terminal {
        /// Written to for stdin, resized; `None` once stdin is closed.
        master: Option<tokio::fs::File>,
        /// The master's descriptor number, for resizes.
        fd: i32,
        /// A copy of the master read for output, taken by the reader.
        reader: Option<tokio::fs::File>,
    },
}

impl Session {
    fn pipes(
        command: &mut Command,
        stdin: bool,
        mut confinement: Option<crate::sandbox::Confinement>,
    ) -> Result<Session, Status> {
        command
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        confine(command, confinement.take());
        Ok(Session::Pipes { stdin: None })
    }

    fn terminal(
        command: &mut Command,
        size: Option<proto::TerminalSize>,
        mut confinement: Option<crate::sandbox::Confinement>,
    ) -> Result<Session, Status> {
        let size = size.unwrap_or(proto::TerminalSize { rows: 24, cols: 80 });
        let winsize = winsize(size.rows as u16, size.cols as u16);
        let pty = nix::pty::openpty(Some(&winsize), None)
            .map_err(|e| Status::internal(format!("cannot open a terminal: {e}")))?;
        let slave = pty.slave;
        let stdio = |fd: &OwnedFd| {
            fd.try_clone()
                .map(Stdio::from)
                .map_err(|e| Status::internal(format!("cannot open a terminal: {e}")))
        };
        command
            .stdin(stdio(&slave)?)
            .stdout(stdio(&slave)?)
            .stderr(stdio(&slave)?);
        // SAFETY: setsid and ioctl are async-signal-safe; applying the
        // ruleset allocates nothing. The terminal (its stdin) becomes the
        // new session's controlling terminal.
        unsafe {
            command.pre_exec(move || {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                if nix::libc::ioctl(0, nix::libc::TIOCSCTTY as _, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                match &mut confinement {
                    Some(confinement) => confinement.apply_in_child(),
                    None => Ok(()),
                }
            });
        }
        drop(slave); // the command's copies are made at spawn
        let fd = pty.master.as_raw_fd();
        let reader = pty
            .master
            .try_clone()
            .map_err(|e| Status::internal(format!("cannot open a terminal: {e}")))?;
        Ok(Session::Terminal {
            master: Some(tokio::fs::File::from_std(pty.master.into())),
            fd,
            reader: Some(tokio::fs::File::from_std(reader.into())),
        })
    }

    /// Starts sending the command's output; the tasks end at its end.
    fn read_into(
        &mut self,
        child: &mut tokio::process::Child,
        outputs: &ExecOutputs,
    ) -> Result<Vec<JoinHandle<()>>, Status> {
        Ok(match self {
            Session::Pipes { stdin } => {
                *stdin = child.stdin.take();
                let out = child.stdout.take().expect("piped");
                let err = child.stderr.take().expect("piped");
                vec![
                    tokio::spawn(pump(out, outputs.clone(), false)),
                    tokio::spawn(pump(err, outputs.clone(), true)),
                ]
            }
            Session::Terminal { reader, .. } => {
                let reader = reader.take().expect("read once");
                vec![tokio::spawn(pump(reader, outputs.clone(), false))]
            }
        })
    }

    async fn write(&mut self, bytes: &[u8]) {
        let written = match self {
            Session::Pipes { stdin: Some(w) } => w.write_all(bytes).await.and(w.flush().await),
            Session::Terminal {
                master: Some(w), ..
            } => w.write_all(bytes).await.and(w.flush().await),
            _ => Ok(()),
        };
        if written.is_err() {
            // It stopped reading (or exited): later stdin has nowhere to go.
            self.drop_stdin();
        }
    }

    /// End of stdin: the pipe closes; on a terminal, an end-of-file
    /// character (^D) is typed, as a user would.
    async fn close_stdin(&mut self) {
        if let Session::Terminal {
            master: Some(w), ..
        } = self
        {
            let _ = w.write_all(&[4]).await;
            let _ = w.flush().await;
            return;
        }
        self.drop_stdin();
    }

    fn drop_stdin(&mut self) {
        match self {
            Session::Pipes { stdin } => *stdin = None,
            Session::Terminal { master, .. } => *master = None,
        }
    }

    fn resize(&mut self, rows: u16, cols: u16) {
        if let Session::Terminal {
            master: Some(_),
            fd,
            ..
        } = self
        {
            let size = winsize(rows, cols);
            // SAFETY: `fd` is the open master `master` holds; TIOCSWINSZ
            // reads one winsize.
            unsafe {
                nix::libc::ioctl(*fd, nix::libc::TIOCSWINSZ, &size);
            }
        }
    }
}

fn winsize(rows: u16, cols: u16) -> nix::pty::Winsize {
    nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Sends what `from` gives until its end (a terminal's master answers EIO
/// once the command's side is closed: an end too), or until Corbel hangs up.
async fn pump(mut from: impl AsyncRead + Unpin, outputs: ExecOutputs, stderr: bool) {
    let mut buffer = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let bytes = buffer[..n].to_vec();
        let open = if stderr {
            outputs.stderr(bytes).await
        } else {
            outputs.stdout(bytes).await
        };
        if !open {
            return;
        }
    }
}
