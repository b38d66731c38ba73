//! `corbel cp SRC DST`: files into or out of a deployed resource, one side
//! local, the other `DEPLOYMENT:KEY[/REPLICA]:PATH`, as a tar archive
//! streamed over `PUT`/`GET /files/{nodeId}` (never whole in memory).
//!
//! Into a resource, the local file or directory lands in the directory PATH
//! under its own name; out of one, PATH (a file or directory) lands in the
//! local directory DST (made if missing) under its own name. Only regular
//! files and directories are copied.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;

use super::Context;
use super::error::ClientError;
use super::exec::node_of;

#[derive(Debug, clap::Args)]
pub struct CpArgs {
    /// A local path, or DEPLOYMENT:KEY[/REPLICA]:PATH.
    pub from: String,
    /// A local directory, or DEPLOYMENT:KEY[/REPLICA]:PATH (a directory).
    pub to: String,
}

/// One side of a copy in a resource.
struct Remote {
    deployment: String,
    resource: String,
    path: String,
}

fn remote(spec: &str) -> Option<Remote> {
    let (deployment, rest) = spec.split_once(':')?;
    let (resource, path) = rest.split_once(':')?;
    // `C:\…` or `./a:b` are local paths.
    if deployment.is_empty() || deployment.contains('/') || resource.is_empty() {
        return None;
    }
    Some(Remote {
        deployment: deployment.to_owned(),
        resource: resource.to_owned(),
        path: path.to_owned(),
    })
}

pub async fn cp(context: &Context, args: CpArgs) -> Result<(), ClientError> {
    let api = context.signed_in().await?;
    let (bytes, verb) = match (remote(&args.from), remote(&args.to)) {
        (None, Some(to)) => {
            let node = node_of(api, &to.deployment, &to.resource).await?;
            (
                upload(api, &node, Path::new(&args.from), &to.path).await?,
                "copied into",
            )
        }
        (Some(from), None) => {
            let node = node_of(api, &from.deployment, &from.resource).await?;
            (
                download(api, &node, &from.path, Path::new(&args.to)).await?,
                "copied from",
            )
        }
        _ => {
            return Err(ClientError::Usage(
                "one side of `corbel cp` is local, the other DEPLOYMENT:KEY[/REPLICA]:PATH".into(),
            ));
        }
    };
    eprintln!("{bytes} bytes {verb} the resource");
    Ok(())
}

fn client() -> Result<reqwest::Client, ClientError> {
    reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(15))
        .user_agent(concat!("corbel-cli/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ClientError::Transport(format!("cannot make an HTTP client: {e}")))
}

fn files_url(api: &super::api::Api, node: &Value, path: &str) -> Result<reqwest::Url, ClientError> {
    let id = node["id"].as_str().unwrap_or_default();
    reqwest::Url::parse_with_params(&format!("{}/files/{id}", api.server), [("path", path)])
        .map_err(|e| ClientError::Usage(format!("{path}: {e}")))
}

/// The local `from` as an archive, sent into the directory `path`.
async fn upload(
    api: &super::api::Api,
    node: &Value,
    from: &Path,
    path: &str,
) -> Result<u64, ClientError> {
    let meta = std::fs::metadata(from)
        .map_err(|e| ClientError::Local(format!("{}: {e}", from.display())))?;
    let name = from
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(PathBuf::from))
        .ok_or_else(|| ClientError::Usage(format!("{}: names no file", from.display())))?;
    // The archive is written on a thread into a channel the request reads.
    let (tx, rx) = mpsc::channel::<Result<Vec<u8>, std::io::Error>>(8);
    let source = from.to_owned();
    let writer = tokio::task::spawn_blocking(move || {
        let out = std::io::BufWriter::with_capacity(64 * 1024, ChannelWriter(tx.clone()));
        let mut builder = tar::Builder::new(out);
        builder.follow_symlinks(false);
        let made = if meta.is_dir() {
            builder.append_dir_all(&name, &source)
        } else {
            builder.append_path_with_name(&source, &name)
        }
        .and_then(|()| builder.into_inner())
        .and_then(|mut out| out.flush());
        if let Err(e) = made {
            let _ = tx.blocking_send(Err(e));
        }
    });
    let body = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut request = client()?.put(files_url(api, node, path)?).body(body);
    if let Some(token) = api.token() {
        request = request.bearer_auth(token);
    }
    let answer = request
        .send()
        .await
        .map_err(|e| ClientError::Transport(super::error_chain(&e)))?;
    let _ = writer.await;
    let answer = refused(answer).await?;
    let said: Value = answer
        .json()
        .await
        .map_err(|e| ClientError::Transport(format!("the server's answer: {e}")))?;
    Ok(said["bytes"].as_u64().unwrap_or_default())
}

/// `path` of the resource, extracted into the local directory `to`.
async fn download(
    api: &super::api::Api,
    node: &Value,
    path: &str,
    to: &Path,
) -> Result<u64, ClientError> {
    let mut request = client()?.get(files_url(api, node, path)?);
    if let Some(token) = api.token() {
        request = request.bearer_auth(token);
    }
    let answer = request
        .send()
        .await
        .map_err(|e| ClientError::Transport(super::error_chain(&e)))?;
    let answer = refused(answer).await?;
    std::fs::create_dir_all(to)
        .map_err(|e| ClientError::Local(format!("{}: {e}", to.display())))?;
    let (tx, rx) = mpsc::channel::<Vec<u8>>(8);
    let dest = to.to_owned();
    let extract = tokio::task::spawn_blocking(move || unpack(ChannelReader::new(rx), &dest));
    let mut stream = answer.bytes_stream();
    let mut bytes = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ClientError::Transport(super::error_chain(&e)))?;
        bytes += chunk.len() as u64;
        if tx.send(chunk.to_vec()).await.is_err() {
            break; // the extraction stopped: its error says why
        }
    }
    drop(tx);
    extract
        .await
        .map_err(|e| ClientError::Local(format!("extracting: {e}")))??;
    Ok(bytes)
}

/// Extracts regular files and directories only, each within `dest`.
fn unpack(reader: impl Read, dest: &Path) -> Result<(), ClientError> {
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| ClientError::Local(format!("reading the archive: {e}")))?;
    for entry in entries {
        let mut entry =
            entry.map_err(|e| ClientError::Local(format!("reading the archive: {e}")))?;
        let kind = entry.header().entry_type();
        let name = entry
            .path()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        if !(kind.is_file() || kind.is_dir()) {
            eprintln!("corbel: {name}: not a file or a directory, left out");
            continue;
        }
        let unpacked = entry
            .unpack_in(dest)
            .map_err(|e| ClientError::Local(format!("{name}: {e}")))?;
        if !unpacked {
            return Err(ClientError::Local(format!(
                "{name}: climbs out of {}",
                dest.display()
            )));
        }
    }
    Ok(())
}

/// The server's refusal as the client's error.
async fn refused(answer: reqwest::Response) -> Result<reqwest::Response, ClientError> {
    if answer.status().is_success() {
        return Ok(answer);
    }
    let body: Value = answer.json().await.unwrap_or_default();
    let error = &body["errors"][0];
    Err(ClientError::Api {
        code: error["extensions"]["code"]
            .as_str()
            .unwrap_or("INTERNAL")
            .to_owned(),
        message: error["message"].as_str().unwrap_or_default().to_owned(),
    })
}

/// Writes into a channel, a chunk per write (the archive's blocks).
struct ChannelWriter(mpsc::Sender<Result<Vec<u8>, std::io::Error>>);

impl Write for ChannelWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Ok(bytes.to_vec()))
            .map_err(|_| std::io::Error::other("the upload stopped"))?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Reads what a channel brings, in order, until it closes.
struct ChannelReader {
    rx: mpsc::Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    at: usize,
}

impl ChannelReader {
    fn new(rx: mpsc::Receiver<Vec<u8>>) -> Self {
        ChannelReader {
            rx,
            chunk: Vec::new(),
            at: 0,
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.chunk.len() {
            // On the extraction's blocking thread: waiting here is its job.
            match self.rx.blocking_recv() {
                Some(chunk) => {
                    self.chunk = chunk;
                    self.at = 0;
                }
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.chunk.len() - self.at);
        out[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}
