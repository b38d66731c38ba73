//! The "exec" feature's two halves as an author sees them: [`ExecInputs`],
//! what Corbel sends after `start` (stdin, resizes, end of stdin, hanging
//! up), and [`ExecOutputs`], where the command's output goes. The SDK sends
//! the `exit` the author's `exec` returns, last.

use std::sync::Arc;

use tokio::sync::mpsc;
use tonic::Status;

use crate::proto;
use crate::provider::Sink;

/// One input of an exec after its `start`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecInput {
    /// Bytes for the command's stdin.
    Stdin(Vec<u8>),
    /// The terminal's new size (with a terminal).
    Resize { rows: u16, cols: u16 },
    /// No more stdin: close the command's stdin.
    CloseStdin,
    /// Corbel hung up (its caller went away): kill the command.
    HungUp,
}

/// The inputs that follow `start`, in order; after [`ExecInput::HungUp`]
/// nothing more comes (and `next` keeps answering `None`).
pub struct ExecInputs {
    pub(crate) rx: mpsc::Receiver<ExecInput>,
}

impl ExecInputs {
    /// The next input; `None` once the caller's stream ended after
    /// `close_stdin` (there is nothing more to read, and the command runs on).
    pub async fn next(&mut self) -> Option<ExecInput> {
        self.rx.recv().await
    }
}

/// Where the command's output goes. Cheap to clone.
#[derive(Clone)]
pub struct ExecOutputs {
    pub(crate) sink: Arc<Sink<proto::ExecOutput>>,
}

impl ExecOutputs {
    /// Sends stdout bytes; false once Corbel hung up.
    pub async fn stdout(&self, bytes: Vec<u8>) -> bool {
        self.send(proto::exec_output::Output::Stdout(bytes)).await
    }

    /// Sends stderr bytes; false once Corbel hung up.
    pub async fn stderr(&self, bytes: Vec<u8>) -> bool {
        self.send(proto::exec_output::Output::Stderr(bytes)).await
    }

    async fn send(&self, output: proto::exec_output::Output) -> bool {
        self.sink
            .send(proto::ExecOutput {
                output: Some(output),
            })
            .await;
        !self.sink.is_closed().await
    }

    /// Resolves when Corbel hung up.
    pub async fn closed(&self) {
        self.sink.closed().await;
    }
}

/// Reads the caller's stream: the `start` first (or INVALID_ARGUMENT), then
/// forwards the rest to an [`ExecInputs`] until the stream ends, which is
/// [`ExecInput::HungUp`] unless `close_stdin` came before it; so is Corbel
/// cancelling the call (the output stream closing).
pub(crate) async fn open_inputs(
    mut stream: tonic::Streaming<proto::ExecInput>,
    outputs: ExecOutputs,
) -> Result<(proto::ExecStart, ExecInputs), Status> {
    use proto::exec_input::Input;
    let start = match stream.message().await? {
        Some(proto::ExecInput {
            input: Some(Input::Start(start)),
        }) => start,
        _ => {
            return Err(Status::invalid_argument(
                "an exec's first input must be `start`",
            ));
        }
    };
    if start.command.is_empty() || start.command[0].is_empty() {
        return Err(Status::invalid_argument("an exec needs a command"));
    }
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut closed = false;
        loop {
            let message = tokio::select! {
                message = stream.message() => message,
                // Corbel cancelled the call: it reads no more output.
                () = outputs.closed() => Err(Status::cancelled("hung up")),
            };
            let input = match message {
                Ok(Some(proto::ExecInput { input: Some(input) })) => input,
                Ok(Some(_)) => continue,
                Ok(None) if closed => return,
                Ok(None) | Err(_) => {
                    let _ = tx.send(ExecInput::HungUp).await;
                    return;
                }
            };
            let input = match input {
                Input::Start(_) => continue, // one start only
                Input::Stdin(bytes) => ExecInput::Stdin(bytes),
                Input::Resize(size) => ExecInput::Resize {
                    rows: clamp(size.rows),
                    cols: clamp(size.cols),
                },
                Input::CloseStdin(_) => {
                    closed = true;
                    ExecInput::CloseStdin
                }
            };
            if tx.send(input).await.is_err() {
                return; // the command ended
            }
        }
    });
    Ok((start, ExecInputs { rx }))
}

fn clamp(n: u32) -> u16 {
    n.clamp(1, u32::from(u16::MAX)) as u16
}
