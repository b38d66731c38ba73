//! The `http` driver: a static file server in the nginx layout:
//! `{url}/inventory.json`, `{url}/{name}/{version}/manifests/{name}.yaml`,
//! `{url}/{name}/{version}/inventory.json`, and artifacts at
//! `{url}/{name}/{version}/{category}/{file}`.
//!
//! A query string on the URL (`?access_token=…`) is kept on every request.
//! Each request has an idle deadline (`http_timeout`: connecting, and each wait
//! for more of a body) and a total one (`sync_deadline`, body included), and
//! every message shows URLs through `crate::redact`.
//!
//! The inventory is spooled to a temporary file as it arrives (bounded by the
//! size limit) and parsed from there as a stream, so memory holds neither the
//! body nor a second copy of it.

use std::io::Write;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::pace::Pace;
use super::{ByteStream, Driver, FetchedElement, Found, Listed};
use crate::redact;
use crate::repository::invalid::entry_path;
use crate::repository::inventory::{self, ArtifactRef};
use crate::repository::manifest::{self, Manifest};
use crate::repository::{RepositoryError, RepositorySettings};
use crate::resolve::Version;

pub struct HttpDriver {
    /// The URL up to its path, without a trailing `/`.
    base: String,
    /// The URL's query (`?…`), or empty: added to every request.
    query: String,
    /// The URL as given: what its secrets are hidden from in messages.
    given: String,
    client: reqwest::Client,
    /// Idle deadline.
    timeout: Duration,
    /// Total deadline of one request.
    deadline: Duration,
    max_inventory_bytes: u64,
    max_manifest_bytes: usize,
    /// The pace every body must keep (`min_bytes_per_second` over
    /// `stall_timeout`).
    min_bytes_per_second: u64,
    stall_timeout: Duration,
}

pub fn validate_url(url: &str) -> Result<(), RepositoryError> {
    let parsed = url::Url::parse(url).map_err(|e| {
        RepositoryError::Invalid(format!(
            "driver.http.url: `{}` is not a URL ({e})",
            redact::url(url)
        ))
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(RepositoryError::Invalid(format!(
            "driver.http.url: scheme `{}` is not http or https",
            parsed.scheme()
        )));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(RepositoryError::Invalid(format!(
            "driver.http.url: `{}` has no host",
            redact::url(url)
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
            .timeout(settings.sync_deadline)
            .build()
            .map_err(|e| RepositoryError::Source(format!("HTTP client: {e}")))?;
        // A fragment is never sent; a query is sent with every request.
        let without_fragment = url.split_once('#').map_or(url, |(before, _)| before);
        let (path, query) = match without_fragment.split_once('?') {
            Some((path, query)) => (path, format!("?{query}")),
            None => (without_fragment, String::new()),
        };
        Ok(Self {
            base: path.trim_end_matches('/').to_owned(),
            query,
            given: url.to_owned(),
            client,
            timeout: settings.http_timeout,
            deadline: settings.sync_deadline,
            max_inventory_bytes: settings.max_inventory_bytes,
            max_manifest_bytes: settings.max_manifest_bytes,
            min_bytes_per_second: settings.min_bytes_per_second,
            stall_timeout: settings.stall_timeout,
        })
    }

    fn pace(&self) -> Pace {
        Pace::new(self.min_bytes_per_second, self.stall_timeout)
    }

    /// Why a body stopped: too slow a pace, named with its URL.
    fn too_slow(&self, url: &str, reason: String) -> RepositoryError {
        RepositoryError::Source(format!("GET {}: {reason}", self.shown(url)))
    }

    /// `{base}/{path}{query}`.
    fn url_for(&self, path: &str) -> String {
        format!("{}/{path}{}", self.base, self.query)
    }

    fn element_url(&self, name: &str, version: &Version, rest: &str) -> String {
        self.url_for(&format!("{name}/{version}/{rest}"))
    }

    /// GETs `url`; any status but success is an error naming it.
    async fn get(&self, url: &str) -> Result<reqwest::Response, RepositoryError> {
        self.get_if_present(url).await?.ok_or_else(|| {
            RepositoryError::Source(format!("GET {}: HTTP 404 Not Found", self.shown(url)))
        })
    }

    /// GETs `url`; `Ok(None)` on 404.
    async fn get_if_present(
        &self,
        url: &str,
    ) -> Result<Option<reqwest::Response>, RepositoryError> {
        let started = Instant::now();
        let response = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|e| self.describe(url, &e, started))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(RepositoryError::Source(format!(
                "GET {}: HTTP {status}",
                self.shown(url)
            )));
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
        let started = Instant::now();
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        let mut pace = self.pace();
        while let Some(chunk) = pace
            .next(&mut stream)
            .await
            .map_err(|reason| self.too_slow(url, reason))?
        {
            let chunk = chunk.map_err(|e| self.describe(url, &e, started))?;
            if body.len() + chunk.len() > limit {
                return Err(RepositoryError::Manifest(format!(
                    "GET {}: body is over the limit of {limit} bytes",
                    self.shown(url)
                )));
            }
            body.extend_from_slice(&chunk);
        }
        String::from_utf8(body).map_err(|_| {
            RepositoryError::Manifest(format!("GET {}: body is not UTF-8", self.shown(url)))
        })
    }

    /// GETs the inventory into an unnamed temporary file, refusing more
    /// than the size limit; the file and the bytes it holds.
    async fn spool_inventory(&self) -> Result<(std::fs::File, u64), RepositoryError> {
        let url = self.url_for("inventory.json");
        let started = Instant::now();
        let response = self.get(&url).await?;
        let spool = tempfile::tempfile()
            .map_err(|e| RepositoryError::Source(format!("cannot make a spool file: {e}")))?;
        let mut writer = std::io::BufWriter::new(spool);
        let mut received: u64 = 0;
        let mut stream = response.bytes_stream();
        let mut pace = self.pace();
        while let Some(chunk) = pace
            .next(&mut stream)
            .await
            .map_err(|reason| self.too_slow(&url, reason))?
        {
            let chunk = chunk.map_err(|e| self.describe(&url, &e, started))?;
            received += chunk.len() as u64;
            if received > self.max_inventory_bytes {
                return Err(RepositoryError::Inventory(format!(
                    "GET {}: inventory is over the limit of {} bytes",
                    self.shown(&url),
                    self.max_inventory_bytes
                )));
            }
            writer.write_all(&chunk).map_err(|e| {
                RepositoryError::Source(format!("spooling {}: {e}", self.shown(&url)))
            })?;
        }
        let spool = writer
            .into_inner()
            .map_err(|e| RepositoryError::Source(format!("spooling {}: {e}", self.shown(&url))))?;
        Ok((spool, received))
    }

    /// A URL of this repository as it may be shown.
    fn shown(&self, url: &str) -> String {
        redact::url(url)
    }

    /// Why a request failed, naming its URL (redacted) and which deadline ran
    /// out, if one did.
    fn describe(&self, url: &str, e: &reqwest::Error, started: Instant) -> RepositoryError {
        let what = if e.is_timeout() && started.elapsed() >= self.deadline {
            format!(
                "passed its total deadline of {}s (sync_deadline_seconds)",
                self.deadline.as_secs_f32()
            )
        } else if e.is_timeout() {
            format!("timed out after {}s", self.timeout.as_secs_f32())
        } else if e.is_connect() {
            "cannot connect".to_owned()
        } else {
            redact::message(&redact::message(&e.to_string(), url), &self.given)
        };
        RepositoryError::Source(format!("GET {}: {what}", self.shown(url)))
    }
}

/// Known entries handed over at once, at most.
const KNOWN_RUN: usize = 1024;

/// Read bytes of a mapped inventory handed back at a time (a multiple of any
/// page size).
const RELEASE_BYTES: usize = 4 * 1024 * 1024;

/// Parses the spooled inventory (`received` bytes) and sends what it finds
/// to `out`, in order. Blocking.
fn parse_spool(
    spool: &std::fs::File,
    received: u64,
    out: &mpsc::Sender<Found>,
    holding: &(dyn inventory::Known + Send + Sync),
) -> Result<(), RepositoryError> {
    let reading = |e: std::io::Error| RepositoryError::Source(format!("reading the spool: {e}"));
    // Mapped, the text is parsed where it lies (serde_json's fast path
    // for a slice, no copy); read pages are handed back as the parse
    // moves on, so the mapping never holds much of a large inventory.
    let map = if received == 0 {
        None
    } else {
        // SAFETY: the spool is an unnamed temporary file that only this
        // function holds; nothing can change or truncate it while mapped.
        Some(unsafe { memmap2::Mmap::map(spool) }.map_err(reading)?)
    };
    let text: &[u8] = map.as_deref().unwrap_or_default();
    if let Some(map) = &map {
        let _ = map.advise(memmap2::Advice::Sequential);
    }
    let mut released = 0;
    let release = |at: usize| release_read(map.as_ref(), &mut released, at);
    let mut runs = KnownRuns {
        out,
        known: Vec::new(),
    };
    inventory::parse_with(text, release, holding, |read| runs.hand_over(read))?;
    runs.flush()
}

/// Hands the pages of `map` read before `at` back, in whole
/// [`RELEASE_BYTES`], from `released` (how far it was handed back) on.
fn release_read(map: Option<&memmap2::Mmap>, released: &mut usize, at: usize) {
    let Some(map) = map else { return };
    let end = at - at % RELEASE_BYTES;
    if end > *released {
        // SAFETY: the pages are a read-only mapping of a file
        // nothing writes: dropped, they read back the same.
        let _ = unsafe {
            map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                *released,
                end - *released,
            )
        };
        *released = end;
    }
}

/// Sends what the parse reads: known entries go in runs, a run sent before
/// the next entry that is not known, so the order stays the inventory's.
struct KnownRuns<'a> {
    out: &'a mpsc::Sender<Found>,
    known: Vec<u32>,
}

impl KnownRuns<'_> {
    fn hand_over(&mut self, read: inventory::Read) -> Result<(), RepositoryError> {
        let found = match read {
            inventory::Read::Known(index) => {
                self.known.push(index);
                if self.known.len() >= KNOWN_RUN {
                    self.send_run()?;
                }
                return Ok(());
            }
            inventory::Read::Entry(Ok(entry)) => Found::Element(Listed {
                path: entry_path(&entry.name, &entry.version.to_string()),
                entry,
                manifest: None,
            }),
            inventory::Read::Entry(Err(invalid)) => Found::Invalid(invalid),
        };
        self.flush()?;
        self.send(found)
    }

    /// Sends the run of known entries, if there is one.
    fn flush(&mut self) -> Result<(), RepositoryError> {
        if self.known.is_empty() {
            return Ok(());
        }
        self.send_run()
    }

    fn send_run(&mut self) -> Result<(), RepositoryError> {
        let run = std::mem::take(&mut self.known);
        self.send(Found::Known(run))
    }

    fn send(&self, found: Found) -> Result<(), RepositoryError> {
        self.out
            .blocking_send(found)
            .map_err(|_| RepositoryError::Source("sync stopped".into()))
    }
}

#[async_trait::async_trait]
impl Driver for HttpDriver {
    async fn inventory(
        &self,
        out: mpsc::Sender<Found>,
        holding: super::Holding,
    ) -> Result<(), RepositoryError> {
        let (spool, received) = self.spool_inventory().await?;
        tokio::task::spawn_blocking(move || parse_spool(&spool, received, &out, &*holding))
            .await
            .map_err(|e| RepositoryError::Source(format!("parsing failed: {e}")))?
    }

    async fn element(
        &self,
        name: &str,
        version: &Version,
    ) -> Result<FetchedElement, RepositoryError> {
        let url = self.element_url(name, version, &format!("manifests/{name}.yaml"));
        // Listed but absent: a problem of this element, not of the source.
        let response = self.get_if_present(&url).await?.ok_or_else(|| {
            RepositoryError::Manifest(format!(
                "GET {}: HTTP 404 Not Found: the inventory lists {name} {version}, but its manifest is not there",
                self.shown(&url)
            ))
        })?;
        let text = self
            .small_body(&url, response, self.max_manifest_bytes)
            .await?;
        let shown = self.shown(&url);
        let manifest = manifest::parse_yaml(&text, self.max_manifest_bytes, &shown)?;
        if manifest.name != name || manifest.version != *version {
            return Err(RepositoryError::Manifest(format!(
                "{shown}: manifest is {} {}, not {name} {version}",
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

    fn element_path(&self, name: &str, version: &Version) -> String {
        format!("{name}/{version}/manifests/{name}.yaml")
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
        let response = self.get_if_present(&url).await?.ok_or_else(|| {
            RepositoryError::NotFound(format!("GET {}: not found", self.shown(&url)))
        })?;
        let given = self.given.clone();
        let shown = self.shown(&url);
        let body = Box::pin(response.bytes_stream());
        let paced = futures_util::stream::unfold(
            (body, self.pace(), false),
            move |(mut body, mut pace, done)| {
                let (given, shown) = (given.clone(), shown.clone());
                async move {
                    if done {
                        return None;
                    }
                    match pace.next(&mut body).await {
                        Ok(None) => None,
                        Ok(Some(Ok(chunk))) => Some((Ok(chunk), (body, pace, false))),
                        Ok(Some(Err(e))) => Some((
                            Err(std::io::Error::other(redact::message(
                                &e.to_string(),
                                &given,
                            ))),
                            (body, pace, true),
                        )),
                        Err(reason) => Some((
                            Err(std::io::Error::other(format!("GET {shown}: {reason}"))),
                            (body, pace, true),
                        )),
                    }
                }
            },
        );
        Ok(Box::pin(paced))
    }

    async fn upload(&self, _manifest: &Manifest, _yaml: &str) -> Result<(), RepositoryError> {
        Err(RepositoryError::Invalid(
            "the http driver is read-only: it cannot take uploads".into(),
        ))
    }
}
