//! Exec: a command run inside a resource's running container through the
//! engine's exec API (as `docker exec` does): its output streamed as it
//! comes (with a terminal, all of it on stdout), stdin and resizes passed
//! on, then its exit status from the engine's inspect. The engine has no
//! call to kill an exec: at a timeout, or when Corbel hangs up, the
//! command's process (its pid in the engine's inspect, as the host sees
//! it) is killed with SIGKILL, and its group when it leads one: the provider
//! needs the right to signal it (the engine's user, or root).

use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use corbel_provider_sdk::proto;
use corbel_provider_sdk::{ExecInput, ExecInputs, ExecOutputs, Status};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::container;
use crate::engine::{Problem, call};

/// Runs `start.command` in the container of `start.resource`.
// Long: the engine's exec made, started, then one select over its output,
// Corbel's inputs and the deadline, read in turn; then its status.
pub async fn exec(
    client: &Docker,
    start: proto::ExecStart,
    mut inputs: ExecInputs,
    outputs: ExecOutputs,
) -> Result<proto::ExecExit, Status> {
    let resource = start.resource.clone().unwrap_or_default();
    let Some(found) = container::find(client, &resource).await? else {
        return Err(Problem::not_found(format!(
            "no container of resource {}",
            resource.resource_id
        ))
        .into());
    };
    if container::state_of(&found) != "running" {
        return Err(Problem::precondition(format!(
            "the container is {}, not running",
            container::state_of(&found)
        ))
        .into());
    }
    let id = found.id.clone().unwrap_or_default();
    let options = CreateExecOptions::<String> {
        attach_stdin: Some(start.stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(start.tty),
        cmd: Some(start.command.clone()),
        ..Default::default()
    };
    let exec = call("creating the exec", client.create_exec(&id, options))
        .await?
        .id;
    let started = StartExecOptions {
        detach: false,
        tty: start.tty,
        output_capacity: Some(64 * 1024),
    };
    let StartExecResults::Attached { mut output, input } =
        call("starting the exec", client.start_exec(&exec, Some(started))).await?
    else {
        return Err(Status::internal("the engine started the exec detached"));
    };
    let mut input = Some(input);
    if let Some(size) = start.size {
        resize(client, &exec, size.rows, size.cols).await;
    }
    let deadline = (start.timeout_seconds > 0)
        .then(|| tokio::time::Instant::now() + Duration::from_secs(start.timeout_seconds.into()));
    let mut timed_out = false;
    let mut inputs_done = false;
    loop {
        tokio::select! {
            chunk = output.next() => match chunk {
                Some(Ok(LogOutput::StdErr { message })) => {
                    if !outputs.stderr(message.to_vec()).await { kill(client, &exec).await; }
                }
                Some(Ok(
                    LogOutput::StdOut { message } | LogOutput::Console { message },
                )) => {
                    if !outputs.stdout(message.to_vec()).await { kill(client, &exec).await; }
                }
                Some(Ok(LogOutput::StdIn { .. })) => {}
                Some(Err(_)) | None => break,
            },
            next = inputs.next(), if !inputs_done => match next {
                Some(ExecInput::Stdin(bytes)) => {
                    if let Some(writer) = input.as_mut()
                        && writer.write_all(&bytes).await.is_err()
                    {
                        input = None;
                    }
                }
                Some(ExecInput::CloseStdin) => {
                    match (start.tty, input.as_mut()) {
                        // A terminal's end of input is ^D, typed.
                        (true, Some(writer)) => { let _ = writer.write_all(&[4]).await; }
                        (false, Some(writer)) => { let _ = writer.shutdown().await; input = None; }
                        _ => {}
                    }
                }
                Some(ExecInput::Resize { rows, cols }) => resize(client, &exec, rows.into(), cols.into()).await,
                Some(ExecInput::HungUp) => {
                    inputs_done = true;
                    kill(client, &exec).await;
                }
                None => inputs_done = true,
            },
            () = sleep_until(deadline), if !timed_out => {
                timed_out = true;
                kill(client, &exec).await;
            }
        }
    }
    let inspected = call("reading the exec's status", client.inspect_exec(&exec)).await?;
    let code = inspected.exit_code.unwrap_or(-1);
    // A command killed by a signal exits 128 + its number (the engine's
    // init reports it so).
    let signal = (timed_out || code > 128)
        .then(|| {
            let number = if timed_out { 9 } else { code - 128 };
            nix::sys::signal::Signal::try_from(number as i32)
                .ok()
                .map(|s| s.as_str().to_owned())
        })
        .flatten()
        .unwrap_or_default();
    Ok(proto::ExecExit {
        code: if signal.is_empty() { code as i32 } else { -1 },
        signal,
        timed_out,
    })
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn resize(client: &Docker, exec: &str, rows: u32, cols: u32) {
    let options = bollard::query_parameters::ResizeExecOptions {
        h: rows as i32,
        w: cols as i32,
    };
    let _ = client.resize_exec(exec, options).await;
}

/// Kills the exec's process group (its pid as the host sees it).
async fn kill(client: &Docker, exec: &str) {
    let Ok(inspected) = client.inspect_exec(exec).await else {
        return;
    };
    if let Some(pid) = inspected.pid.filter(|pid| *pid > 0)
        && inspected.running == Some(true)
    {
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        // Its group only if it leads one: a command without a terminal may
        // share the container's.
        if nix::unistd::getpgid(Some(pid)) == Ok(pid) {
            let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        }
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
}
