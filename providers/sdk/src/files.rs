//! The "files" feature's halves as an author sees them: [`FilesArchive`], the
//! tar archive `PutFiles` brings, chunk by chunk, and [`FilesSink`], where
//! `GetFiles` sends one.

use std::sync::Arc;

use tonic::Status;

use crate::proto;
use crate::provider::Sink;

/// The archive of a `PutFiles`, after its `target`.
pub struct FilesArchive {
    pub(crate) stream: tonic::Streaming<proto::FilesInput>,
}

impl FilesArchive {
    /// The next chunk of the archive; `None` at its end. An error means
    /// Corbel hung up: extract nothing more.
    pub async fn next(&mut self) -> Option<Result<Vec<u8>, Status>> {
        match self.stream.message().await {
            Ok(Some(proto::FilesInput {
                input: Some(proto::files_input::Input::Tar(bytes)),
            })) => Some(Ok(bytes)),
            Ok(Some(_)) => Some(Err(Status::invalid_argument(
                "a PutFiles has one `target`, first",
            ))),
            Ok(None) => None,
            Err(status) => Some(Err(status)),
        }
    }
}

/// Reads a `PutFiles`'s first input, its target.
pub(crate) async fn open_archive(
    mut stream: tonic::Streaming<proto::FilesInput>,
) -> Result<(proto::FilesTarget, FilesArchive), Status> {
    match stream.message().await? {
        Some(proto::FilesInput {
            input: Some(proto::files_input::Input::Target(target)),
        }) => Ok((target, FilesArchive { stream })),
        _ => Err(Status::invalid_argument(
            "a PutFiles's first input must be its `target`",
        )),
    }
}

/// Where `get_files` sends the archive.
#[derive(Clone)]
pub struct FilesSink {
    pub(crate) sink: Arc<Sink<proto::FilesChunk>>,
}

impl FilesSink {
    /// Sends a chunk of the archive; false once Corbel hung up.
    pub async fn send(&self, tar: Vec<u8>) -> bool {
        self.sink.send(proto::FilesChunk { tar }).await;
        !self.sink.is_closed().await
    }
}
