//! Files in and out of a resource's container (the "files" feature), through
//! the engine's archive API (as `docker cp` does): an archive extracted into
//! a directory of the container, a file or directory read out as one.

use bollard::Docker;
use bollard::query_parameters::{DownloadFromContainerOptions, UploadToContainerOptions};
use corbel_provider_sdk::proto;
use corbel_provider_sdk::{FilesArchive, FilesSink, Status};
use futures_util::StreamExt;

use crate::container;
use crate::engine::{Problem, status};

/// Extracts the archive into the directory `target.path` of the container.
pub async fn put(
    client: &Docker,
    target: proto::FilesTarget,
    archive: FilesArchive,
) -> Result<proto::PutFilesResponse, Status> {
    let id = container_of(client, target.resource.unwrap_or_default()).await?;
    let path = absolute(&target.path)?;
    let counted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = counted.clone();
    // The archive as the engine's request body; a hang-up ends it early.
    let chunks = futures_util::stream::unfold(archive, |mut archive| async move {
        match archive.next().await {
            Some(Ok(chunk)) => Some((bytes::Bytes::from(chunk), archive)),
            Some(Err(_)) | None => None,
        }
    })
    .inspect(move |chunk| {
        count.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
    });
    let options = UploadToContainerOptions {
        path: path.clone(),
        ..Default::default()
    };
    match client
        .upload_to_container(&id, Some(options), bollard::body_stream(chunks))
        .await
    {
        Ok(()) => Ok(proto::PutFilesResponse {
            bytes: counted.load(std::sync::atomic::Ordering::Relaxed),
        }),
        Err(e) => Err(refused(&path, &e)),
    }
}

/// Sends `request.path` of the container as an archive.
pub async fn get(
    client: &Docker,
    request: proto::GetFilesRequest,
    sink: FilesSink,
) -> Result<(), Status> {
    let id = container_of(client, request.resource.unwrap_or_default()).await?;
    let path = absolute(&request.path)?;
    let options = DownloadFromContainerOptions { path: path.clone() };
    let mut archive = client.download_from_container(&id, Some(options));
    while let Some(chunk) = archive.next().await {
        let chunk = chunk.map_err(|e| refused(&path, &e))?;
        if !sink.send(chunk.to_vec()).await {
            break;
        }
    }
    Ok(())
}

async fn container_of(client: &Docker, resource: proto::Resource) -> Result<String, Status> {
    match container::find(client, &resource).await? {
        Some(found) => Ok(found.id.unwrap_or_default()),
        None => Err(Problem::not_found(format!(
            "no container of resource {}",
            resource.resource_id
        ))
        .into()),
    }
}

/// A path in a container is absolute, without `..`.
fn absolute(path: &str) -> Result<String, Status> {
    if !path.starts_with('/') || path.split('/').any(|part| part == "..") {
        return Err(Status::invalid_argument(format!(
            "path: {path:?} must be absolute in the container, without `..`"
        )));
    }
    Ok(path.to_owned())
}

fn refused(path: &str, e: &bollard::errors::Error) -> Status {
    let problem = Problem::engine(path, e);
    match status(e) {
        Some(404) => Status::not_found(problem.message),
        Some(400 | 403 | 409) => Status::failed_precondition(problem.message),
        _ => problem.into(),
    }
}
