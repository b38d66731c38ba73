//! Files in and out of a running service (the "files" feature), by the
//! system's `tar` run as the service would run it: in a session of its own,
//! under the service's Landlock ruleset, so it writes only where the service
//! may (its `cwd` and `sandbox.write`) and reads only what it may. A
//! relative path is the service's `cwd`'s; without a `cwd`, give an absolute
//! one.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use corbel_provider_sdk::proto;
use corbel_provider_sdk::{FilesArchive, FilesSink, Status};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use crate::config::ServiceConfig;
use crate::exec::{confine, running_record};
use crate::state::StateDir;

/// How much of the archive one message carries at most.
const CHUNK: usize = 64 * 1024;
/// The system's tar (GNU or busybox: only `-c`, `-x`, `-f -` and `-C` are used).
const TAR: &str = "tar";

/// Extracts the archive into the directory `target.path`.
pub async fn put(
    state: &StateDir,
    target: proto::FilesTarget,
    mut archive: FilesArchive,
) -> Result<proto::PutFilesResponse, Status> {
    let (service, dir) = resolve(state, target.resource, &target.path).await?;
    let mut command = Command::new(TAR);
    command
        .args(["-x", "-f", "-", "--no-same-owner", "-C"])
        .arg(&dir);
    let mut child = spawn(command, &service, true)?;
    let mut stdin = child.stdin.take().expect("piped");
    let stderr = read_all(child.stderr.take().expect("piped"));
    let mut bytes = 0u64;
    let mut refused = None;
    while let Some(chunk) = archive.next().await {
        match chunk {
            Ok(chunk) => {
                bytes += chunk.len() as u64;
                if stdin.write_all(&chunk).await.is_err() {
                    break; // tar stopped: its message says why
                }
            }
            Err(status) => {
                refused = Some(status);
                break;
            }
        }
    }
    drop(stdin);
    if let Some(status) = refused {
        let _ = child.start_kill();
        let _ = child.wait().await;
        return Err(status);
    }
    let status = child
        .wait()
        .await
        .map_err(|e| Status::internal(format!("cannot wait for tar: {e}")))?;
    let said = stderr.await.unwrap_or_default();
    if !status.success() {
        return Err(tar_failed(&dir, &said));
    }
    Ok(proto::PutFilesResponse { bytes })
}

/// Sends `request.path` as an archive whose top entry is its last name.
pub async fn get(
    state: &StateDir,
    request: proto::GetFilesRequest,
    sink: FilesSink,
) -> Result<(), Status> {
    let (service, path) = resolve(state, request.resource, &request.path).await?;
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(Status::invalid_argument(format!(
            "path: {} names no file or directory",
            path.display()
        )));
    };
    // tar writes an (empty) archive even for a path that is not there:
    // asked first, so that the answer is NOT_FOUND rather than a broken one.
    if let Err(e) = tokio::fs::symlink_metadata(&path).await {
        return Err(tar_failed(&path, &e.to_string()));
    }
    let mut command = Command::new(TAR);
    command.args(["-c", "-f", "-", "-C"]).arg(parent).arg(name);
    let mut child = spawn(command, &service, false)?;
    let mut stdout = child.stdout.take().expect("piped");
    let stderr = read_all(child.stderr.take().expect("piped"));
    let mut buffer = vec![0u8; CHUNK];
    loop {
        let n = match stdout.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !sink.send(buffer[..n].to_vec()).await {
            let _ = child.start_kill();
            break;
        }
    }
    let status = child
        .wait()
        .await
        .map_err(|e| Status::internal(format!("cannot wait for tar: {e}")))?;
    let said = stderr.await.unwrap_or_default();
    if status.success() {
        Ok(())
    } else {
        Err(tar_failed(&path, &said))
    }
}

/// The running service and the path asked, made absolute.
async fn resolve(
    state: &StateDir,
    resource: Option<proto::Resource>,
    path: &str,
) -> Result<(ServiceConfig, PathBuf), Status> {
    let resource = resource.unwrap_or_default();
    let service = ServiceConfig::parse(&resource.config_json).map_err(Status::invalid_argument)?;
    running_record(state, resource.resource_id).await?;
    if path.is_empty() || Path::new(path).components().any(|c| c.as_os_str() == "..") {
        return Err(Status::invalid_argument(format!(
            "path: {path:?} must name a place in the service, without `..`"
        )));
    }
    let path = Path::new(path);
    let path = if path.is_absolute() {
        path.to_owned()
    } else {
        let Some(cwd) = &service.cwd else {
            return Err(Status::invalid_argument(format!(
                "path: {} is relative, and the service has no `cwd`: give an absolute path",
                path.display()
            )));
        };
        cwd.join(path)
    };
    Ok((service, path))
}

fn spawn(
    mut command: Command,
    service: &ServiceConfig,
    stdin: bool,
) -> Result<tokio::process::Child, Status> {
    command
        .env_clear()
        .env("PATH", crate::lifecycle::DEFAULT_PATH)
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(if stdin { Stdio::null() } else { Stdio::piped() })
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let confinement =
        crate::sandbox::Confinement::for_service(service).map_err(Status::internal)?;
    confine(&mut command, confinement);
    command
        .spawn()
        .map_err(|e| Status::failed_precondition(format!("cannot start tar: {e}")))
}

fn read_all(mut from: tokio::process::ChildStderr) -> tokio::task::JoinHandle<String> {
    tokio::spawn(async move {
        let mut text = String::new();
        let _ = from.read_to_string(&mut text).await;
        text
    })
}

/// tar's refusal as the protocol's answer: NOT_FOUND for a path that is not
/// there, FAILED_PRECONDITION otherwise (not allowed, not a directory).
fn tar_failed(path: &Path, said: &str) -> Status {
    let said = said.trim();
    let said = said.lines().take(5).collect::<Vec<_>>().join("; ");
    let message = format!("{}: {said}", path.display());
    if said.contains("No such file or directory") {
        Status::not_found(message)
    } else {
        Status::failed_precondition(message)
    }
}
