//! The Docker engine as this server talks to it: one client made at first
//! use, every call under the engine deadline, this server's labels, and the
//! containers and images of this instance (listed, swept, pruned, removed).

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::query_parameters::{
    ListContainersOptions, ListImagesOptions, RemoveContainerOptions, RemoveImageOptions,
};
use uuid::Uuid;

use super::super::runtime::RuntimeError;
use super::{LABEL_BOOT, LABEL_INSTANCE, LABEL_PROVIDER};

/// bollard's own deadline on a request's answer: far off, since every call
/// here has its own (bollard's default, 2 minutes, would cut a build whose
/// context takes longer to send).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// The Docker engine as this server uses it: one client, made at first use,
/// and this server's labels.
pub struct Engine {
    host: Option<String>,
    client: OnceLock<Result<Docker, String>>,
    pub(super) instance: String,
    boot: String,
    pub(super) call_timeout: Duration,
}

impl Engine {
    pub fn new(host: Option<String>, instance: String, call_timeout: Duration) -> Self {
        Self {
            host,
            client: OnceLock::new(),
            instance,
            boot: Uuid::new_v4().simple().to_string(),
            call_timeout,
        }
    }

    /// The client: `docker_host` if set, else bollard's defaults (`DOCKER_HOST`,
    /// `DOCKER_TLS_VERIFY`, `DOCKER_CERT_PATH`, else the local socket).
    pub(super) fn client(&self) -> Result<Docker, RuntimeError> {
        let made = self.client.get_or_init(|| {
            let client = match &self.host {
                Some(host) => Docker::connect_with_host(host),
                None => Docker::connect_with_defaults(),
            };
            client
                .map(|c| c.with_timeout(CLIENT_TIMEOUT))
                .map_err(|e| format!("cannot reach the Docker engine: {e}"))
        });
        made.clone().map_err(RuntimeError::Docker)
    }

    /// `call` under the engine deadline, its error saying `what` failed.
    pub(super) async fn call<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, DockerError>>,
    ) -> Result<T, CallError> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(CallError::Engine(what.to_owned(), e)),
            Err(_) => Err(CallError::TimedOut(what.to_owned(), self.call_timeout)),
        }
    }

    pub(super) fn labels(&self, provider: Uuid) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_INSTANCE.to_owned(), self.instance.clone()),
            (LABEL_PROVIDER.to_owned(), provider.to_string()),
            (LABEL_BOOT.to_owned(), self.boot.clone()),
        ])
    }

    /// Containers of this instance (of `provider` if given), running or not:
    /// their ids and boots.
    pub(super) async fn containers(
        &self,
        provider: Option<Uuid>,
    ) -> Result<Vec<(String, String)>, RuntimeError> {
        let client = self.client()?;
        let mut labels = vec![format!("{LABEL_INSTANCE}={}", self.instance)];
        if let Some(provider) = provider {
            labels.push(format!("{LABEL_PROVIDER}={provider}"));
        }
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([("label".to_owned(), labels)])),
            ..Default::default()
        };
        let listed = self
            .call("listing containers", client.list_containers(Some(options)))
            .await?;
        Ok(listed
            .into_iter()
            .filter_map(|c| {
                let boot = c.labels.as_ref()?.get(LABEL_BOOT).cloned();
                Some((c.id?, boot.unwrap_or_default()))
            })
            .collect())
    }

    /// Removes this instance's containers that another server process started
    /// (a crashed one's): at start, before any provider loads. How many.
    pub async fn sweep(&self) -> Result<usize, RuntimeError> {
        let mut removed = 0;
        for (id, boot) in self.containers(None).await? {
            if boot != self.boot {
                self.remove(&id).await?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes this instance's images of `provider` but the one tagged `keep`:
    /// a provider keeps the image of the commit it runs (the cache of its next
    /// load), and none once it is deleted. How many tags went. A failure is logged,
    /// not returned: it costs disk, not correctness (an image a container
    /// still uses stays).
    pub async fn prune_images(&self, provider: Uuid, keep: Option<&str>) -> usize {
        let Ok(client) = self.client() else { return 0 };
        let labels = vec![
            format!("{LABEL_INSTANCE}={}", self.instance),
            format!("{LABEL_PROVIDER}={provider}"),
        ];
        let options = ListImagesOptions {
            filters: Some(HashMap::from([("label".to_owned(), labels)])),
            ..Default::default()
        };
        let images = match self
            .call("listing images", client.list_images(Some(options)))
            .await
        {
            Ok(images) => images,
            Err(e) => {
                tracing::warn!(provider.id = %provider, error = %RuntimeError::from(e), "cannot list the provider's images");
                return 0;
            }
        };
        // By tag: an unchanged rebuild is the same image under a new tag, and
        // removing an image's last tag removes the image.
        let mut removed = 0;
        for image in images {
            let mut names: Vec<&str> = image
                .repo_tags
                .iter()
                .map(String::as_str)
                .filter(|t| Some(*t) != keep && *t != "<none>:<none>")
                .collect();
            if image.repo_tags.is_empty() {
                names.push(&image.id);
            }
            for name in names {
                let removing = client.remove_image(name, None::<RemoveImageOptions>, None);
                match self.call("removing an image", removing).await {
                    Ok(_) => removed += 1,
                    Err(e) if e.status() == Some(404) => {}
                    Err(e) => tracing::warn!(
                        provider.id = %provider,
                        error = %RuntimeError::from(e),
                        "cannot remove one of the provider's images"
                    ),
                }
            }
        }
        removed
    }

    /// Removes a container, running or not; one already gone is fine.
    pub(super) async fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        let client = self.client()?;
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            ..Default::default()
        };
        match self
            .call(
                "removing a container",
                client.remove_container(id, Some(options)),
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if e.status() == Some(404) => Ok(()),
            // Removal already under way (the exit follower's): wait for it.
            Err(e) if e.status() == Some(409) => {
                let deadline = tokio::time::Instant::now() + self.call_timeout;
                loop {
                    match client.inspect_container(id, None).await {
                        Err(e) if status(&e) == Some(404) => return Ok(()),
                        _ if tokio::time::Instant::now() > deadline => {
                            return Err(CallError::TimedOut(
                                "removing a container".into(),
                                self.call_timeout,
                            )
                            .into());
                        }
                        _ => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// An engine call that failed.
#[derive(Debug)]
pub(super) enum CallError {
    Engine(String, DockerError),
    TimedOut(String, Duration),
}

impl CallError {
    pub(super) fn status(&self) -> Option<u16> {
        match self {
            CallError::Engine(_, e) => status(e),
            CallError::TimedOut(..) => None,
        }
    }
}

impl From<CallError> for RuntimeError {
    fn from(e: CallError) -> Self {
        RuntimeError::Docker(match e {
            CallError::Engine(what, e) => format!("{what}: {}", engine_message(&e)),
            CallError::TimedOut(what, after) => {
                format!("{what}: no answer within {} ms", after.as_millis())
            }
        })
    }
}

pub(super) fn status(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// The engine's own message when it gave one.
pub(super) fn engine_message(e: &DockerError) -> String {
    match e {
        DockerError::DockerResponseServerError { message, .. } => message.trim().to_owned(),
        DockerError::DockerStreamError { error } => error.trim().to_owned(),
        e => e.to_string(),
    }
}
