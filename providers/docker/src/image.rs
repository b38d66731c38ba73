//! A container's image: one on the engine (pulled if it can be), or built
//! from a directory of the provider's host, tagged by a digest of its inputs.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::{BuildImageOptions, CreateImageOptions};
use corbel_provider_sdk::{Events, proto};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use crate::config::ImageSource;
use crate::engine::{self, Problem, status};

/// How long a pull or a build may take.
const BUILD_TIMEOUT: Duration = Duration::from_secs(1800);
/// The digest of a built image's inputs.
pub const LABEL_BUILD: &str = "io.corbel.build";

/// The image reference to create the container from, there on the engine.
pub async fn ensure(
    client: &Docker,
    resource: &proto::Resource,
    source: &ImageSource,
    events: &Events,
) -> Result<String, Problem> {
    match source {
        ImageSource::Reference(reference) => {
            match client.inspect_image(reference).await {
                Ok(_) => return Ok(reference.clone()),
                Err(e) if status(&e) == Some(404) => {}
                Err(e) => return Err(Problem::engine("inspecting the image", &e)),
            }
            events
                .progress(
                    20,
                    format!("image {reference} is not on the engine: pulling it"),
                )
                .await;
            pull(client, reference).await.map_err(|why| {
                Problem::precondition(format!(
                    "image {reference} is not on the engine and cannot be pulled: {why}"
                ))
            })?;
            Ok(reference.clone())
        }
        ImageSource::Build {
            context,
            dockerfile,
            args,
        } => build(client, resource, context, dockerfile, args, events).await,
    }
}

async fn pull(client: &Docker, reference: &str) -> Result<(), String> {
    let options = CreateImageOptions {
        from_image: Some(reference.to_string()),
        ..Default::default()
    };
    let pulling = async {
        let mut stream = std::pin::pin!(client.create_image(Some(options), None, None));
        while let Some(item) = stream.next().await {
            let info = item.map_err(|e| engine::message(&e))?;
            if let Some(message) = info.error_detail.and_then(|d| d.message) {
                return Err(message);
            }
        }
        Ok(())
    };
    tokio::time::timeout(BUILD_TIMEOUT, pulling)
        .await
        .map_err(|_| format!("no answer within {} s", BUILD_TIMEOUT.as_secs()))?
}

async fn build(
    client: &Docker,
    resource: &proto::Resource,
    context: &Path,
    dockerfile: &str,
    args: &BTreeMap<String, String>,
    events: &Events,
) -> Result<String, Problem> {
    let (dir, file, build_args) = (context.to_path_buf(), dockerfile.to_string(), args.clone());
    let (tar, digest) = tokio::task::spawn_blocking(move || pack(&dir, &file, &build_args))
        .await
        .map_err(|e| {
            Problem::new(
                engine::Kind::Internal,
                format!("packing the build context: {e}"),
            )
        })?
        .map_err(Problem::invalid)?;
    let tag = format!("corbel-resource-{}", &digest[..12]);
    if built_from(client, &tag, &digest).await? {
        events
            .log(format!("image {tag} is already built from these inputs"))
            .await;
        return Ok(tag);
    }
    events
        .progress(
            20,
            format!("building image {tag} from {}", context.display()),
        )
        .await;
    let mut labels = engine::labels(resource, &BTreeMap::new());
    labels.insert(LABEL_BUILD.into(), digest.clone());
    let options = BuildImageOptions {
        dockerfile: dockerfile.to_string(),
        t: Some(tag.clone()),
        rm: true,
        forcerm: true,
        buildargs: Some(
            args.iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<HashMap<_, _>>(),
        ),
        labels: Some(labels),
        ..Default::default()
    };
    match tokio::time::timeout(BUILD_TIMEOUT, run_build(client, options, tar, events)).await {
        Ok(Ok(())) => Ok(tag),
        Ok(Err(message)) => Err(Problem::precondition(format!(
            "building image {tag} failed: {message}"
        ))),
        Err(_) => Err(Problem::unavailable(format!(
            "building image {tag}: not done within {} s",
            BUILD_TIMEOUT.as_secs()
        ))),
    }
}

/// Whether the image `tag` is on the engine, built from the inputs whose
/// digest is `digest`.
async fn built_from(client: &Docker, tag: &str, digest: &str) -> Result<bool, Problem> {
    match client.inspect_image(tag).await {
        Ok(found) => {
            let built = found
                .config
                .and_then(|c| c.labels)
                .and_then(|l| l.get(LABEL_BUILD).cloned());
            Ok(built.as_deref() == Some(digest))
        }
        Err(e) if status(&e) == Some(404) => Ok(false),
        Err(e) => Err(Problem::engine("inspecting the image", &e)),
    }
}

/// Builds from the packed context `tar`, logging the build's output; the
/// error with its last lines.
async fn run_build(
    client: &Docker,
    options: BuildImageOptions,
    tar: Vec<u8>,
    events: &Events,
) -> Result<(), String> {
    let body = bollard::body_full(tar.into());
    let mut stream = std::pin::pin!(client.build_image(options, None, Some(body)));
    let mut tail: Vec<String> = Vec::new();
    while let Some(item) = stream.next().await {
        let info = item.map_err(|e| engine::message(&e))?;
        for line in info.stream.iter().flat_map(|s| s.lines()) {
            let line = line.trim_end();
            if line.is_empty() {
                continue;
            }
            events.log(line.to_string()).await;
            tail.push(line.to_string());
            if tail.len() > 10 {
                tail.remove(0);
            }
        }
        if let Some(message) = info.error_detail.and_then(|d| d.message) {
            return Err(format!("{message} (last lines: {})", tail.join(" | ")));
        }
    }
    Ok(())
}

/// The context as a tar, and the hex sha256 of what the build reads: every
/// entry's path, kind and contents (not times or owners), the Dockerfile's
/// path and the build args.
pub fn pack(
    context: &Path,
    dockerfile: &str,
    args: &BTreeMap<String, String>,
) -> Result<(Vec<u8>, String), String> {
    let meta = std::fs::metadata(context)
        .map_err(|e| format!("build.context {}: {e}", context.display()))?;
    if !meta.is_dir() {
        return Err(format!(
            "build.context {}: not a directory",
            context.display()
        ));
    }
    if !context.join(dockerfile).is_file() {
        return Err(format!(
            "build.dockerfile: {dockerfile} is not a file of {}",
            context.display()
        ));
    }
    let mut entries = Vec::new();
    walk(context, PathBuf::new(), &mut entries)
        .map_err(|e| format!("build.context {}: {e}", context.display()))?;
    entries.sort();
    let mut hash = Sha256::new();
    let mut tar = tar::Builder::new(Vec::new());
    tar.follow_symlinks(false);
    let io = |e: std::io::Error| format!("build.context {}: {e}", context.display());
    for relative in &entries {
        let path = context.join(relative);
        let meta = std::fs::symlink_metadata(&path).map_err(io)?;
        let name = relative.to_string_lossy();
        hash.update((name.len() as u64).to_le_bytes());
        hash.update(name.as_bytes());
        if meta.is_dir() {
            hash.update(b"d");
            tar.append_dir(relative, &path).map_err(io)?;
        } else if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&path).map_err(io)?;
            hash.update(b"l");
            hash.update(target.to_string_lossy().as_bytes());
            tar.append_path_with_name(&path, relative).map_err(io)?;
        } else if meta.is_file() {
            let mut contents = Vec::new();
            std::fs::File::open(&path)
                .and_then(|mut f| f.read_to_end(&mut contents))
                .map_err(io)?;
            hash.update(b"f");
            // The executable bit matters to a COPY.
            use std::os::unix::fs::PermissionsExt;
            hash.update((meta.permissions().mode() & 0o111).to_le_bytes());
            hash.update((contents.len() as u64).to_le_bytes());
            hash.update(&contents);
            tar.append_path_with_name(&path, relative).map_err(io)?;
        }
    }
    hash.update(b"\0dockerfile\0");
    hash.update(dockerfile.as_bytes());
    for (k, v) in args {
        hash.update(b"\0arg\0");
        hash.update(k.as_bytes());
        hash.update(b"=");
        hash.update(v.as_bytes());
    }
    let tar = tar.into_inner().map_err(io)?;
    Ok((tar, hex::encode(hash.finalize())))
}

fn walk(root: &Path, relative: PathBuf, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(root.join(&relative))? {
        let entry = entry?;
        let path = relative.join(entry.file_name());
        let kind = entry.file_type()?;
        out.push(path.clone());
        if kind.is_dir() {
            walk(root, path, out)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_follows_contents_dockerfile_and_args_not_times() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Dockerfile"), "FROM scratch\n").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a"), "a").unwrap();
        let none = BTreeMap::new();
        let (_, first) = pack(dir.path(), "Dockerfile", &none).unwrap();
        let (_, again) = pack(dir.path(), "Dockerfile", &none).unwrap();
        assert_eq!(first, again);
        std::fs::write(dir.path().join("sub/a"), "b").unwrap();
        let (_, changed) = pack(dir.path(), "Dockerfile", &none).unwrap();
        assert_ne!(first, changed);
        let args = BTreeMap::from([("A".to_string(), "1".to_string())]);
        let (_, with_args) = pack(dir.path(), "Dockerfile", &args).unwrap();
        assert_ne!(changed, with_args);
        let missing = pack(dir.path(), "Other", &none).unwrap_err();
        assert!(missing.starts_with("build.dockerfile"), "{missing}");
        let gone = pack(&dir.path().join("nope"), "Dockerfile", &none).unwrap_err();
        assert!(gone.starts_with("build.context"), "{gone}");
    }
}
