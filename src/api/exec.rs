//! `execResource`: a command run to its end in a deployed resource, its
//! output answered whole (for scripts). Interactive use, streaming and
//! terminals go over the `/exec` websocket (`http/exec.rs`); both need
//! DEVELOPER in the resource's project (a command runs code), and both are
//! in the audit log with the command and its exit status, never stdin.

use async_graphql::{Context, ID, Object, SimpleObject};

use super::audit_notes::note_fact;
use super::policy::require;
use super::{ApiError, ErrorCode, parse_id, state};
use crate::deploy::Deployments;
use crate::provider::{ExecIn, ExecOut, ExecStart};

/// Most bytes of stdout (and of stderr) `execResource` answers; the rest is
/// read and dropped (`stdoutTruncated`).
pub const MAX_EXEC_OUTPUT: usize = 1024 * 1024;
/// `execResource`'s `timeoutSeconds` when left out.
pub const DEFAULT_EXEC_TIMEOUT_SECONDS: u32 = 30;

/// How a command run by `execResource` ended, with its output.
#[derive(SimpleObject, Default)]
pub struct ExecResult {
    /// Its stdout, as UTF-8 (invalid bytes replaced), at most 1 MiB.
    stdout: String,
    stderr: String,
    /// Its exit status; -1 when a signal ended it.
    exit_code: i32,
    /// The signal that ended it (`SIGKILL`), if one did.
    signal: Option<String>,
    /// Whether `timeoutSeconds` passed and it was killed.
    timed_out: bool,
    stdout_truncated: bool,
    stderr_truncated: bool,
}

#[derive(Default)]
pub struct ExecMutation;

#[Object]
impl ExecMutation {
    /// Runs `command` (a program and its arguments, no shell: use
    /// `["sh", "-c", "…"]` for one) in the deployed resource `nodeId`, in its
    /// context (a process: its environment, working directory and sandbox; a
    /// container: inside it), with `stdin` as its input, and answers when it
    /// ends. It is killed, with what it started, after `timeoutSeconds`
    /// (default 30; the request's own deadline, `[graphql]
    /// request_timeout_ms`, also bounds it). The resource's provider needs
    /// the `exec` feature. For a stream or a terminal, use `/exec`.
    async fn exec_resource(
        &self,
        ctx: &Context<'_>,
        node_id: ID,
        command: Vec<String>,
        stdin: Option<String>,
        timeout_seconds: Option<i32>,
    ) -> Result<ExecResult, ApiError> {
        let id = parse_id(&node_id, "nodeId")?;
        let deployments = state::<Deployments>(ctx)?;
        let queries = deployments.queries();
        let node = queries.node(id).await?;
        let project = queries.get(node.deployment_id).await?.project_id;
        require(ctx, project, &format!("resource node {id}")).await?;
        if command.first().is_none_or(String::is_empty) {
            return Err(ApiError::validation("command: give the program to run"));
        }
        let timeout = match timeout_seconds {
            None => DEFAULT_EXEC_TIMEOUT_SECONDS,
            Some(t) if t >= 1 => t as u32,
            Some(t) => {
                return Err(ApiError::validation(format!(
                    "timeoutSeconds: expected 1 or more, got {t}"
                )));
            }
        };
        let start = ExecStart {
            command,
            tty: false,
            size: None,
            stdin: stdin.is_some(),
            timeout_seconds: timeout,
        };
        let mut exec = deployments.power().exec(id, start).await?;
        if let Some(text) = stdin {
            // Sent beside the reading below: a command may answer before it
            // has read all of it.
            let input = exec.input.clone();
            tokio::spawn(async move {
                for chunk in text.into_bytes().chunks(64 * 1024) {
                    if input.send(ExecIn::Stdin(chunk.to_vec())).await.is_err() {
                        return;
                    }
                }
                let _ = input.send(ExecIn::CloseStdin).await;
            });
        }
        let mut result = ExecResult::default();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut moved = 0u64;
        loop {
            match exec.next().await? {
                Some(ExecOut::Stdout(bytes)) => {
                    moved += bytes.len() as u64;
                    result.stdout_truncated |= keep(&mut out, &bytes);
                }
                Some(ExecOut::Stderr(bytes)) => {
                    moved += bytes.len() as u64;
                    result.stderr_truncated |= keep(&mut err, &bytes);
                }
                Some(ExecOut::Exit(exit)) => {
                    result.exit_code = exit.code;
                    result.signal = exit.signal;
                    result.timed_out = exit.timed_out;
                    break;
                }
                None => {
                    return Err(ApiError::new(
                        ErrorCode::ProviderUnavailable,
                        "the provider ended the exec without its exit status",
                    ));
                }
            }
        }
        result.stdout = String::from_utf8_lossy(&out).into_owned();
        result.stderr = String::from_utf8_lossy(&err).into_owned();
        note_fact(ctx, "exitCode", result.exit_code.into());
        note_fact(ctx, "outputBytes", moved.into());
        Ok(result)
    }
}

/// Keeps what fits of `bytes` in `into`; whether anything was dropped.
fn keep(into: &mut Vec<u8>, bytes: &[u8]) -> bool {
    let room = MAX_EXEC_OUTPUT.saturating_sub(into.len());
    into.extend_from_slice(&bytes[..bytes.len().min(room)]);
    bytes.len() > room
}
