//! The `http` driver: a static file server in the nginx layout:
//! `{url}/inventory.json`, `{url}/{name}/{version}/manifests/{name}.yaml`,
//! `{url}/{name}/{version}/inventory.json`, and artifacts at
//! `{url}/{name}/{version}/{category}/{file}`.
//!
//! The inventory is spooled to a temporary file as it arrives (bounded by the
//! size limit) and parsed from there as a stream, so memory holds neither the
//! body nor a second copy of it.

use std::io::Write;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use tokio::sync::mpsc;

use super::{ByteStream, Driver, FetchedElement, Listed};
use crate::repository::inventory::{self, ArtifactRef};
use crate::repository::manifest::{self, Manifest};
use crate::repository::{RepositoryError, RepositorySettings};
use crate::resolve::Version;

pub struct HttpDriver {
    base: String,
    client: reqwest::Client,
    timeout: Duration,
    max_inventory_bytes: u64,
    max_manifest_bytes: usize,
}

pub fn validate_url(url: &str) -> Result<(), RepositoryError> {
    let parsed = url::Url::parse(url).map_err(|e| {
        RepositoryError::Invalid(format!("driver.http.url: `{url}` is not a URL ({e})"))
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(RepositoryError::Invalid(format!(
            "driver.http.url: scheme `{}` is not http or https",
            parsed.scheme()
        )));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(RepositoryError::Invalid(format!(
            "driver.http.url: `{url}` has no host"
        )));
    }
    Ok(())
}

impl HttpDriver {
    pub fn new(url: &str, settings: &RepositorySettings) -> Result<Self, RepositoryError> {
        validate_url(url)?;
        let client = reqwest::Client::builder()
            .connect_timeout(settings.http_timeout)
            .read_timeout(settings.http_timeout)
            .build()
            .map_err(|e| RepositoryError::Source(format!("HTTP client: {e}")))?;
        Ok(Self {
            base: url.trim_end_matches('/').to_owned(),
            client,
            timeout: settings.http_timeout,
            max_inventory_bytes: settings.max_inventory_bytes,
            max_manifest_bytes: settings.max_manifest_bytes,
        })
    }

    fn element_url(&self, name: &str, version: &Version, rest: &str) -> String {
        format!("{}/{}/{}/{}", self.base, name, version, rest)
    }

    /// GETs `url`; any status but success is an error naming it.
    async fn get(&self, url: &str) -> Result<reqwest::Response, RepositoryError> {
        self.get_if_present(url)
            .await?
            .ok_or_else(|| RepositoryError::Source(format!("GET {url}: HTTP 404 Not Found")))
    }

    /// GETs `url`; `Ok(None)` on 404.
    async fn get_if_present(
        &self,
        url: &str,
    ) -> Result<Option<reqwest::Response>, RepositoryError> {
        let response = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|e| describe(url, &e, self.timeout))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(RepositoryError::Source(format!("GET {url}: HTTP {status}")));
        }
        Ok(Some(response))
    }

    /// Reads a small body whole, refusing more than `limit` bytes.
    async fn small_body(
        &self,
        url: &str,
        response: reqwest::Response,
        limit: usize,
    ) -> Result<String, RepositoryError> {
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| describe(url, &e, self.timeout))?;
            if body.len() + chunk.len() > limit {
                return Err(RepositoryError::Manifest(format!(
                    "GET {url}: body is over the limit of {limit} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        String::from_utf8(body)
            .map_err(|_| RepositoryError::Manifest(format!("GET {url}: body is not UTF-8")))
    }
}

fn describe(url: &str, e: &reqwest::Error, timeout: Duration) -> RepositoryError {
    let what = if e.is_timeout() {
        format!("timed out after {}s", timeout.as_secs_f32())
    } else if e.is_connect() {
        "cannot connect".to_owned()
    } else {
        e.to_string()
    };
    RepositoryError::Source(format!("GET {url}: {what}"))
}

#[async_trait::async_trait]
impl Driver for HttpDriver {
    async fn inventory(&self, out: mpsc::Sender<Listed>) -> Result<(), RepositoryError> {
        let url = format!("{}/inventory.json", self.base);
        let response = self.get(&url).await?;
        let spool = tempfile::tempfile()
            .map_err(|e| RepositoryError::Source(format!("cannot make a spool file: {e}")))?;
        let mut writer = std::io::BufWriter::new(spool);
        let mut received: u64 = 0;
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| describe(&url, &e, self.timeout))?;
            received += chunk.len() as u64;
            if received > self.max_inventory_bytes {
                return Err(RepositoryError::Inventory(format!(
                    "GET {url}: inventory is over the limit of {} bytes",
                    self.max_inventory_bytes
                )));
            }
            writer
                .write_all(&chunk)
                .map_err(|e| RepositoryError::Source(format!("spooling {url}: {e}")))?;
        }
        let mut spool = writer
            .into_inner()
            .map_err(|e| RepositoryError::Source(format!("spooling {url}: {e}")))?;
        tokio::task::spawn_blocking(move || {
            use std::io::Seek;
            spool
                .rewind()
                .map_err(|e| RepositoryError::Source(format!("reading the spool: {e}")))?;
            inventory::parse(spool, |entry| {
                out.blocking_send(Listed {
                    entry,
                    manifest: None,
                })
                .map_err(|_| RepositoryError::Source("sync stopped".into()))
            })
            .map(drop)
        })
        .await
        .map_err(|e| RepositoryError::Source(format!("parsing failed: {e}")))?
    }

    async fn element(
        &self,
        name: &str,
        version: &Version,
    ) -> Result<FetchedElement, RepositoryError> {
        let url = self.element_url(name, version, &format!("manifests/{name}.yaml"));
        let response = self.get(&url).await?;
        let text = self
            .small_body(&url, response, self.max_manifest_bytes)
            .await?;
        let manifest = manifest::parse_yaml(&text, self.max_manifest_bytes, &url)?;
        if manifest.name != name || manifest.version != *version {
            return Err(RepositoryError::Manifest(format!(
                "{url}: manifest is {} {}, not {name} {version}",
                manifest.name, manifest.version
            )));
        }
        let listing_url = self.element_url(name, version, "inventory.json");
        let artifacts = match self.get_if_present(&listing_url).await? {
            None => None,
            Some(response) => {
                let text = self
                    .small_body(&listing_url, response, self.max_manifest_bytes)
                    .await?;
                Some(inventory::entry_from_json(name, &version.to_string(), &text)?.artifacts)
            }
        };
        Ok(FetchedElement {
            manifest,
            artifacts,
        })
    }

    async fn artifact(
        &self,
        name: &str,
        version: &Version,
        artifact: &ArtifactRef,
    ) -> Result<ByteStream, RepositoryError> {
        inventory::check_file_name(&artifact.file_name).map_err(RepositoryError::Invalid)?;
        let url = self.element_url(
            name,
            version,
            &format!("{}/{}", artifact.category, artifact.file_name),
        );
        let response = self
            .get_if_present(&url)
            .await?
            .ok_or_else(|| RepositoryError::NotFound(format!("GET {url}: not found")))?;
        Ok(Box::pin(
            response.bytes_stream().map_err(std::io::Error::other),
        ))
    }

    async fn upload(&self, _manifest: &Manifest, _yaml: &str) -> Result<(), RepositoryError> {
        Err(RepositoryError::Invalid(
            "the http driver is read-only: it cannot take uploads".into(),
        ))
    }
}
