//! Building a provider's image: a cache hit when its tag exists with the same
//! build digest, else the checkout's context sent as a tar and the engine's
//! output followed into the provider's log, each step to its status message,
//! under the build deadline. A new image prunes the provider's others.

use std::collections::HashMap;
use std::io::{Seek, Write};
use std::path::Path;

use bollard::Docker;
use bollard::query_parameters::BuildImageOptions;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use super::super::logs::LogStream;
use super::super::metadata::DockerSpec;
use super::super::runtime::{Job, RuntimeError};
use super::engine::engine_message;
use super::{DockerRuntime, LABEL_BUILD, LABEL_INSTANCE, LABEL_PROVIDER, TAIL_LINES};

/// Where a Dockerfile from outside the context goes in the context's tar.
const OUTSIDE_DOCKERFILE: &str = ".corbel.Dockerfile";

/// How many of a build's steps the engine took from its cache.
struct Steps {
    steps: usize,
    cached: usize,
}

impl DockerRuntime {
    pub(super) async fn build_image(&self, job: &Job) -> Result<(), RuntimeError> {
        let client = self.engine.client()?;
        let image = self.image();
        let digest = self.build_digest();
        let short = &self.commit[..self.commit.len().min(12)];
        if self.already_built(&client, &image, &digest).await? {
            let note = format!(
                "image {image} is already built from commit {short}: cache hit, not rebuilt"
            );
            job.logs.line(LogStream::Corbel, &note);
            (job.progress)(&note);
            return Ok(());
        }

        job.logs.line(
            LogStream::Corbel,
            &format!("building image {image} from commit {short}"),
        );
        let context = job.source_dir.clone();
        let spec = self.spec.clone();
        let (tar, dockerfile) = tokio::task::spawn_blocking(move || context_tar(&context, &spec))
            .await
            .map_err(|e| RuntimeError::Docker(format!("packing the build context: {e}")))?
            .map_err(|e| RuntimeError::Docker(format!("packing the build context: {e}")))?;
        let labels = HashMap::from([
            (LABEL_INSTANCE.to_owned(), self.engine.instance.clone()),
            (LABEL_PROVIDER.to_owned(), self.provider.to_string()),
            (LABEL_BUILD.to_owned(), digest),
        ]);
        let options = BuildImageOptions {
            dockerfile,
            t: Some(image.clone()),
            rm: true,
            forcerm: true,
            buildargs: Some(self.spec.build_args.clone().into_iter().collect()),
            labels: Some(labels),
            ..Default::default()
        };
        let building = stream_build(&client, options, tar, job);
        match tokio::time::timeout(job.build_timeout, building).await {
            Ok(Ok(steps)) => {
                self.built(job, &image, steps).await;
                Ok(())
            }
            Ok(Err(message)) => Err(RuntimeError::ImageBuildFailed {
                image,
                message,
                tail: job.logs.tail(TAIL_LINES),
            }),
            Err(_) => Err(RuntimeError::BuildTimedOut {
                command: format!("docker build of {image}"),
                after: job.build_timeout,
                tail: job.logs.tail(TAIL_LINES),
            }),
        }
    }

    /// Whether `image` exists, built with the same `digest`.
    async fn already_built(
        &self,
        client: &Docker,
        image: &str,
        digest: &str,
    ) -> Result<bool, RuntimeError> {
        match self
            .engine
            .call("inspecting the image", client.inspect_image(image))
            .await
        {
            Ok(found) => {
                let built = found
                    .config
                    .and_then(|c| c.labels)
                    .and_then(|l| l.get(LABEL_BUILD).cloned());
                Ok(built.as_deref() == Some(digest))
            }
            Err(e) if e.status() == Some(404) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Says how much the engine's cache gave, and prunes the provider's
    /// images of other commits.
    async fn built(&self, job: &Job, image: &str, Steps { steps, cached }: Steps) {
        let how = if steps > 0 && cached == steps - 1 {
            "every step from the engine's cache".to_owned()
        } else {
            format!("{cached} of {steps} steps from the engine's cache")
        };
        job.logs
            .line(LogStream::Corbel, &format!("built image {image} ({how})"));
        let pruned = self.engine.prune_images(self.provider, Some(image)).await;
        if pruned > 0 {
            job.logs.line(
                LogStream::Corbel,
                &format!("removed the images of {pruned} earlier commit(s)"),
            );
        }
    }

    /// What the build read besides the commit, as a short digest: a change of
    /// `path` or of the section (both outside the commit's tree for the
    /// engine) means a different image.
    fn build_digest(&self) -> String {
        let mut hash = Sha256::new();
        for part in [&self.path, &self.spec.dockerfile, &self.spec.context] {
            hash.update(part.as_bytes());
            hash.update([0]);
        }
        for (name, value) in &self.spec.build_args {
            hash.update(name.as_bytes());
            hash.update([1]);
            hash.update(value.as_bytes());
            hash.update([0]);
        }
        hex::encode(&hash.finalize()[..8])
    }
}

/// Sends the build with the context `tar` and follows the engine's output
/// into the log, each step to the status message; the engine's error message
/// if the build failed.
async fn stream_build(
    client: &Docker,
    options: BuildImageOptions,
    tar: std::fs::File,
    job: &Job,
) -> Result<Steps, String> {
    let body = bollard::body_try_stream(tokio_util::io::ReaderStream::new(
        tokio::fs::File::from_std(tar),
    ));
    let mut counted = Steps {
        steps: 0,
        cached: 0,
    };
    let mut stream = std::pin::pin!(client.build_image(options, None, Some(body)));
    while let Some(item) = stream.next().await {
        let info = item.map_err(|e| engine_message(&e))?;
        for line in info.stream.iter().flat_map(|s| s.lines()) {
            let line = line.trim_end();
            if line.is_empty() {
                continue;
            }
            job.logs.line(LogStream::Build, line);
            if line.starts_with("Step ") {
                counted.steps += 1;
                (job.progress)(&format!("building image: {line}"));
            } else if line.trim_start().starts_with("---> Using cache") {
                counted.cached += 1;
            }
        }
        if let Some(status) = info.status.filter(|s| !s.trim().is_empty()) {
            job.logs.line(LogStream::Build, status.trim_end());
        }
        if let Some(message) = info.error_detail.and_then(|d| d.message) {
            return Err(message);
        }
    }
    Ok(counted)
}

/// The build context as a tar in an unnamed temporary file, rewound, and the
/// Dockerfile's path in it. Symlinks go in as links (the engine resolves them
/// inside the context); `.git` at the context's top is left out; the
/// context must be a directory of the checkout (a symlink may not lead out).
fn context_tar(checkout: &Path, spec: &DockerSpec) -> std::io::Result<(std::fs::File, String)> {
    let invalid = |message: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, message);
    let top = checkout.canonicalize()?;
    let context = checkout
        .join(&spec.context)
        .canonicalize()
        .map_err(|e| invalid(format!("docker.context `{}`: {e}", spec.context)))?;
    if !context.starts_with(&top) || !context.is_dir() {
        return Err(invalid(format!(
            "docker.context `{}` is not a directory of the repository",
            spec.context
        )));
    }
    let mut tar = tar::Builder::new(tempfile::tempfile()?);
    tar.follow_symlinks(false);
    for entry in std::fs::read_dir(&context)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == ".git" {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            tar.append_dir_all(&name, &path)?;
        } else {
            tar.append_path_with_name(&path, &name)?;
        }
    }
    // The Dockerfile: its path in the context, or a copy when it is outside.
    let dockerfile = checkout.join(&spec.dockerfile);
    let dockerfile = match dockerfile.strip_prefix(checkout.join(&spec.context)) {
        Ok(inside) if !spec.dockerfile.is_empty() && inside != Path::new("") => {
            inside.to_string_lossy().into_owned()
        }
        _ => {
            let meta = std::fs::symlink_metadata(&dockerfile)
                .map_err(|e| invalid(format!("docker.dockerfile `{}`: {e}", spec.dockerfile)))?;
            if !meta.is_file() {
                return Err(invalid(format!(
                    "docker.dockerfile `{}` is not a regular file",
                    spec.dockerfile
                )));
            }
            tar.append_path_with_name(&dockerfile, OUTSIDE_DOCKERFILE)?;
            OUTSIDE_DOCKERFILE.to_owned()
        }
    };
    let mut file = tar.into_inner()?;
    file.flush()?;
    file.rewind()?;
    Ok((file, dockerfile))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dockerfile: &str, context: &str) -> DockerSpec {
        DockerSpec {
            dockerfile: dockerfile.into(),
            context: context.into(),
            build_args: Default::default(),
            command: None,
            memory: None,
            nano_cpus: None,
        }
    }

    fn names(file: std::fs::File) -> Vec<String> {
        let mut archive = tar::Archive::new(file);
        let mut names: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_context_tar_keeps_links_as_links_and_leaves_git_out() {
        let checkout = tempfile::tempdir().unwrap();
        let root = checkout.path();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::write(root.join(".git/config"), "x").unwrap();
        std::fs::create_dir_all(root.join("app/bin")).unwrap();
        std::fs::write(root.join("app/Dockerfile"), "FROM scratch\n").unwrap();
        std::fs::write(root.join("app/bin/provider"), "binary").unwrap();
        let secret = tempfile::NamedTempFile::new().unwrap();
        std::os::unix::fs::symlink(secret.path(), root.join("app/link")).unwrap();

        let (file, dockerfile) = context_tar(root, &spec("app/Dockerfile", "app")).unwrap();
        assert_eq!(dockerfile, "Dockerfile");
        assert_eq!(names(file), ["Dockerfile", "bin/", "bin/provider", "link"]);
        let (file, _) = context_tar(root, &spec("Dockerfile", ".")).unwrap();
        assert!(!names(file).iter().any(|n| n.starts_with(".git")));

        // A Dockerfile outside the context travels under a name of its own.
        std::fs::write(root.join("Containerfile"), "FROM scratch\n").unwrap();
        let (file, dockerfile) = context_tar(root, &spec("Containerfile", "app")).unwrap();
        assert_eq!(dockerfile, OUTSIDE_DOCKERFILE);
        assert!(names(file).contains(&OUTSIDE_DOCKERFILE.to_owned()));

        // A context that is a symlink out of the checkout is refused.
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
        let refused = context_tar(root, &spec("Dockerfile", "out")).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("not a directory of the repository"),
            "{refused}"
        );
    }
}
