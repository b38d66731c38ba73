//! Exec through a provider with the "exec" feature: the protocol's `Exec`
//! stream as the engine and the API see it, [`ExecStart`] to open it, then
//! [`ExecIn`] in and [`ExecOut`] out. The stream has no deadline (a shell
//! lasts as long as its user); the command's own `timeout_seconds` and the
//! caller hanging up end it. Files in and out (`PutFiles`, `GetFiles`, the
//! `files` feature) are tar archives, chunk by chunk.

use corbel_proto::v1 as proto;
use corbel_proto::v1::exec_input::Input;
use corbel_proto::v1::exec_output::Output;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use uuid::Uuid;

use super::calls::ResourceCall;
use super::link;
use super::{ProviderError, Providers};

/// How to start a command in a resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecStart {
    /// The program and its arguments (no shell).
    pub command: Vec<String>,
    /// On a terminal of `size` (rows, columns).
    pub tty: bool,
    pub size: Option<(u16, u16)>,
    /// Whether stdin follows; without it the command reads nothing.
    pub stdin: bool,
    /// 0: no limit.
    pub timeout_seconds: u32,
}

/// What goes to a running exec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecIn {
    Stdin(Vec<u8>),
    Resize { rows: u16, cols: u16 },
    CloseStdin,
}

/// What comes from it: output, then one exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecOut {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(ExecExit),
}

/// How an exec's command ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecExit {
    /// Its status; -1 when a signal ended it.
    pub code: i32,
    /// The signal's name when one did.
    pub signal: Option<String>,
    pub timed_out: bool,
}

/// An exec under way. Dropping it (or `input`) hangs up: the provider kills
/// the command.
pub struct Exec {
    pub input: mpsc::Sender<ExecIn>,
    output: tonic::Streaming<proto::ExecOutput>,
}

impl Exec {
    /// The next output; `None` after the exit (or when the provider's stream
    /// ended without one, which is an error).
    pub async fn next(&mut self) -> Result<Option<ExecOut>, ProviderError> {
        let message = self
            .output
            .message()
            .await
            .map_err(|status| super::calls::refused(link::refused("Exec", &status)))?;
        Ok(message.and_then(|m| m.output).map(|output| match output {
            Output::Stdout(bytes) => ExecOut::Stdout(bytes),
            Output::Stderr(bytes) => ExecOut::Stderr(bytes),
            Output::Exit(exit) => ExecOut::Exit(ExecExit {
                code: exit.code,
                signal: (!exit.signal.is_empty()).then_some(exit.signal),
                timed_out: exit.timed_out,
            }),
        }))
    }
}

impl Providers {
    /// Starts `start` in `resource` through the provider `id`, which needs the
    /// `exec` feature.
    pub async fn exec(
        &self,
        id: Uuid,
        resource: &ResourceCall,
        start: ExecStart,
    ) -> Result<Exec, ProviderError> {
        let link = self.inner.calls.featured(id, "exec").await?;
        let (input, mut from_caller) = mpsc::channel::<ExecIn>(16);
        let (to_provider, stream) = mpsc::channel::<proto::ExecInput>(16);
        let first = proto::ExecInput {
            input: Some(Input::Start(proto::ExecStart {
                resource: Some(resource.resource()),
                command: start.command,
                tty: start.tty,
                size: start.size.map(|(rows, cols)| proto::TerminalSize {
                    rows: rows.into(),
                    cols: cols.into(),
                }),
                stdin: start.stdin,
                timeout_seconds: start.timeout_seconds,
            })),
        };
        to_provider
            .send(first)
            .await
            .expect("the receiver is held below");
        // The caller's inputs, forwarded: when the caller drops its sender
        // without closing stdin, the stream to the provider ends, which the
        // provider takes as a hang-up.
        tokio::spawn(async move {
            while let Some(input) = from_caller.recv().await {
                let input = match input {
                    ExecIn::Stdin(bytes) => Input::Stdin(bytes),
                    ExecIn::Resize { rows, cols } => Input::Resize(proto::TerminalSize {
                        rows: rows.into(),
                        cols: cols.into(),
                    }),
                    ExecIn::CloseStdin => Input::CloseStdin(true),
                };
                let message = proto::ExecInput { input: Some(input) };
                if to_provider.send(message).await.is_err() {
                    return;
                }
            }
        });
        let output = link
            .exec(ReceiverStream::new(stream))
            .await
            .map_err(super::calls::refused)?;
        Ok(Exec { input, output })
    }
}

/// A file or directory of a resource as a tar archive, chunk by chunk.
pub struct FilesOut(tonic::Streaming<proto::FilesChunk>);

impl FilesOut {
    /// The next chunk; `None` at the archive's end.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, ProviderError> {
        let chunk = self
            .0
            .message()
            .await
            .map_err(|status| super::calls::refused(link::refused("GetFiles", &status)))?;
        Ok(chunk.map(|c| c.tar))
    }
}

impl Providers {
    /// Extracts the tar archive `archive` yields into the directory `path` of
    /// `resource`, through the provider `id` (the `files` feature); the bytes
    /// it extracted.
    pub async fn put_files(
        &self,
        id: Uuid,
        resource: &ResourceCall,
        path: &str,
        archive: impl tokio_stream::Stream<Item = Vec<u8>> + Send + 'static,
    ) -> Result<u64, ProviderError> {
        use tokio_stream::StreamExt;
        let link = self.inner.calls.featured(id, "files").await?;
        let target = proto::FilesInput {
            input: Some(proto::files_input::Input::Target(proto::FilesTarget {
                resource: Some(resource.resource()),
                path: path.to_owned(),
            })),
        };
        let inputs = tokio_stream::once(target).chain(archive.map(|tar| proto::FilesInput {
            input: Some(proto::files_input::Input::Tar(tar)),
        }));
        let answer = link
            .put_files(inputs)
            .await
            .map_err(super::calls::refused)?;
        Ok(answer.bytes)
    }

    /// `path` of `resource` as a tar archive, through the provider `id`.
    pub async fn get_files(
        &self,
        id: Uuid,
        resource: &ResourceCall,
        path: &str,
    ) -> Result<FilesOut, ProviderError> {
        let link = self.inner.calls.featured(id, "files").await?;
        let request = proto::GetFilesRequest {
            resource: Some(resource.resource()),
            path: path.to_owned(),
        };
        let stream = link
            .get_files(request)
            .await
            .map_err(super::calls::refused)?;
        Ok(FilesOut(stream))
    }
}
