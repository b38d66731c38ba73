//! Fetching a provider's source: a git repository cloned (or fetched again) into the
//! provider's cache directory and checked out, detached, at the requested reference.
//!
//! This module owns URL policy (which schemes may be fetched at all; transport helpers
//! such as `ext::` never), the git2 work itself, and the deadline around it. It does
//! not know about providers' states or the database: the caller records the outcome.
//!
//! Every error message names the URL redacted by `crate::redact` (userinfo, the scp
//! form's password, credential query parameters), so a token put in a URL
//! (`https://TOKEN@host/repo`) never reaches a status message or a log.
//!
//! Architecture invariant: the transport is libgit2 only. No `git` process is started
//! and no transport helper is reachable, so a URL cannot run a command on the server.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use git2::build::CheckoutBuilder;
use git2::{
    AutotagOption, Commit, ErrorCode, FetchOptions, FetchPrune, RemoteCallbacks, Repository,
    SubmoduleUpdateOptions,
};

use crate::redact;

/// Refspecs fetched every time, so that both branches and tags can be asked for.
const REFSPECS: [&str; 2] = [
    "+refs/heads/*:refs/remotes/origin/*",
    "+refs/tags/*:refs/tags/*",
];
/// libgit2's socket timeouts. They are process-global, so they are not the caller's
/// `timeout` (which differs per call): they only make sure that a thread abandoned by
/// [`fetch`]'s deadline does not stay blocked on a silent server for ever.
const SERVER_CONNECT_TIMEOUT_MS: i32 = 15_000;
const SERVER_IO_TIMEOUT_MS: i32 = 60_000;
/// How often, at most, receiving progress is reported.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);
/// Submodules of submodules of ... stop here, so a cycle cannot recurse for ever.
const MAX_SUBMODULE_DEPTH: usize = 8;
/// How many branch and tag names a `RefNotFound` error lists.
const LISTED_REFS: usize = 8;

/// What may be fetched, and for how long.
#[derive(Debug, Clone)]
pub struct SourceSettings {
    /// Allowed URL schemes, compared without case, e.g. `["https", "git", "file"]`.
    /// Plain local paths count as `file`, scp-like `user@host:path` as `ssh`.
    /// Transport helpers (`ext::`, `fd::`, any `name::`) are refused whatever this says.
    pub allowed_schemes: Vec<String>,
    /// Bound on the whole fetch: connect, download, checkout and submodules.
    pub timeout: Duration,
    /// Whether submodules are initialised and updated (recursively). Off by default:
    /// a submodule is a second URL the operator has not vetted.
    pub submodules: bool,
}

impl Default for SourceSettings {
    fn default() -> Self {
        Self {
            allowed_schemes: ["https", "http", "git", "ssh", "file"]
                .map(String::from)
                .to_vec(),
            timeout: Duration::from_secs(300),
            submodules: false,
        }
    }
}

/// The outcome of a successful [`fetch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The checked-out commit, full hex.
    pub commit: String,
    /// What the reference resolved to, for people: `tag v1.0`, `branch dev`,
    /// `default branch main`, `commit 1f2e…`.
    pub reference: String,
}

/// Where a fetch is, for a status message such as "receiving objects 120/450".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    Connecting,
    Receiving {
        received_objects: usize,
        total_objects: usize,
        received_bytes: usize,
    },
    Resolving {
        indexed_deltas: usize,
        total_deltas: usize,
    },
    CheckingOut,
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("invalid git URL `{url}`: {reason}")]
    InvalidUrl { url: String, reason: &'static str },
    #[error("git URL scheme `{scheme}` is not allowed (allowed: {})", list_or_none(.allowed))]
    SchemeRefused {
        scheme: String,
        allowed: Vec<String>,
    },
    #[error("invalid git reference `{reference}`: {reason}")]
    InvalidReference {
        reference: String,
        reason: &'static str,
    },
    #[error("reference `{reference}` not found in {url}{}", available(.branches, .tags))]
    RefNotFound {
        reference: String,
        url: String,
        branches: Vec<String>,
        tags: Vec<String>,
    },
    #[error("abbreviated commit `{reference}` is ambiguous in {url}; give more hex digits")]
    AmbiguousCommit { reference: String, url: String },
    #[error("could not fetch from {url}: {message}")]
    Unreachable { url: String, message: String },
    #[error("fetching {url} timed out after {after:?}")]
    Timeout { url: String, after: Duration },
    #[error("git {action} failed for {url}: {message}")]
    Git {
        url: String,
        action: &'static str,
        message: String,
    },
    #[error("submodule `{name}` of {url}: {message}")]
    Submodule {
        url: String,
        name: String,
        message: String,
    },
    #[error("could not prepare the source directory {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("fetching {url} stopped unexpectedly")]
    Interrupted { url: String },
    #[error(
        "no git repository at `{}`: {reason} (a local path is read on the server, relative \
         paths from its working directory; a remote needs a URL such as https://…)",
        .path.display()
    )]
    NoLocalRepository { path: PathBuf, reason: String },
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.join(", ")
    }
}

fn available(branches: &[String], tags: &[String]) -> String {
    let part = |what: &str, names: &[String]| {
        let more = if names.len() > LISTED_REFS {
            ", …"
        } else {
            ""
        };
        let shown: Vec<&str> = names.iter().take(LISTED_REFS).map(String::as_str).collect();
        format!("{what}: {}{more}", shown.join(", "))
    };
    match (branches.is_empty(), tags.is_empty()) {
        (true, true) => " (it has no branches or tags)".to_owned(),
        (false, true) => format!(" ({})", part("branches", branches)),
        (true, false) => format!(" ({})", part("tags", tags)),
        (false, false) => format!(" ({}; {})", part("branches", branches), part("tags", tags)),
    }
}

/// How git would read a URL, following git's own rules (`transport.c`, `connect.c`).
#[derive(Debug, PartialEq, Eq)]
enum UrlForm<'a> {
    /// `name::address`: a remote helper, e.g. `ext::sh -c …`.
    Helper(&'a str),
    /// `scheme://…`
    Scheme(&'a str),
    /// `[user@]host:path`
    ScpLike,
    /// An absolute or relative path.
    LocalPath,
}

fn url_form(url: &str) -> UrlForm<'_> {
    let scheme_len = url
        .char_indices()
        .take_while(|&(i, c)| {
            c.is_ascii_alphabetic() || (i > 0 && (c.is_ascii_digit() || "+.-".contains(c)))
        })
        .count();
    let (scheme, rest) = url.split_at(scheme_len);
    if scheme_len > 0 && rest.starts_with("::") {
        return UrlForm::Helper(scheme);
    }
    if scheme_len > 0 && rest.starts_with("://") {
        return UrlForm::Scheme(scheme);
    }
    match (url.find(':'), url.find('/')) {
        (None, _) => UrlForm::LocalPath,
        (Some(colon), Some(slash)) if slash < colon => UrlForm::LocalPath,
        _ => UrlForm::ScpLike,
    }
}

/// A `scheme://` URL cut around its userinfo: `(scheme, userinfo, everything after)`.
fn split_userinfo(url: &str) -> Option<(&str, Option<&str>, &str)> {
    let UrlForm::Scheme(scheme) = url_form(url) else {
        return None;
    };
    let rest = &url[scheme.len() + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    Some(match rest[..authority_end].rfind('@') {
        Some(at) => (scheme, Some(&rest[..at]), &rest[at + 1..]),
        None => (scheme, None, rest),
    })
}

/// `url` as it may be shown: credentials hidden (`crate::redact`), control
/// characters escaped.
pub fn display_url(url: &str) -> String {
    escape_controls(&redact::url(url))
}

/// Escapes control characters only, so paths and hosts stay readable.
fn escape_controls(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A message from libgit2 made safe to show: it may quote the URL with its userinfo.
fn sanitize(message: &str, url: &str) -> String {
    escape_controls(&redact::message(message, url))
}

/// Checks that `url` may be fetched under `settings`, without any IO.
pub fn check_url(url: &str, settings: &SourceSettings) -> Result<(), SourceError> {
    let invalid = |reason| SourceError::InvalidUrl {
        url: display_url(url),
        reason,
    };
    if url.trim().is_empty() {
        return Err(invalid("it is empty"));
    }
    if url.chars().any(char::is_control) {
        return Err(invalid("it contains control characters"));
    }
    if url.starts_with('-') {
        return Err(invalid("it starts with `-`"));
    }
    let scheme = match url_form(url) {
        UrlForm::Helper(helper) => {
            // Never allowed, so never listed as allowed either.
            let allowed = settings
                .allowed_schemes
                .iter()
                .filter(|s| !s.eq_ignore_ascii_case(helper))
                .cloned()
                .collect();
            return Err(SourceError::SchemeRefused {
                scheme: helper.to_owned(),
                allowed,
            });
        }
        UrlForm::Scheme(scheme) => {
            let parsed = url::Url::parse(url).map_err(|_| invalid("it is not a valid URL"))?;
            let scheme = scheme.to_ascii_lowercase();
            // `url` would read `https:///a` as host `a`; git reads no host.
            let host = split_userinfo(url).map_or("", |(_, _, after)| {
                &after[..after.find(['/', '?', '#']).unwrap_or(after.len())]
            });
            if scheme != "file" && (host.is_empty() || parsed.host_str().is_none_or(str::is_empty))
            {
                return Err(invalid("it has no host"));
            }
            match scheme.as_str() {
                "git+ssh" | "ssh+git" => "ssh".to_owned(),
                _ => scheme,
            }
        }
        UrlForm::ScpLike => "ssh".to_owned(),
        UrlForm::LocalPath => "file".to_owned(),
    };
    if settings
        .allowed_schemes
        .iter()
        .any(|s| s.eq_ignore_ascii_case(&scheme))
    {
        Ok(())
    } else {
        Err(SourceError::SchemeRefused {
            scheme,
            allowed: settings.allowed_schemes.clone(),
        })
    }
}

/// The directory a local path or `file://` URL names, if `url` is one.
fn local_path(url: &str) -> Option<PathBuf> {
    match url_form(url) {
        UrlForm::LocalPath => Some(PathBuf::from(url)),
        UrlForm::Scheme(scheme) if scheme.eq_ignore_ascii_case("file") => {
            url::Url::parse(url).ok()?.to_file_path().ok()
        }
        _ => None,
    }
}

/// A local source must be a directory that exists: libgit2 would otherwise
/// answer "unsupported URL protocol". Remote URLs pass unchecked.
pub fn check_local(url: &str) -> Result<(), SourceError> {
    let Some(path) = local_path(url) else {
        return Ok(());
    };
    let reason = match std::fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(_) => "it is not a directory".to_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "it does not exist".to_owned(),
        Err(e) => format!("it cannot be read: {e}"),
    };
    Err(SourceError::NoLocalRepository { path, reason })
}

fn check_reference(reference: &str) -> Result<(), SourceError> {
    let invalid = |reason| SourceError::InvalidReference {
        reference: escape_controls(reference),
        reason,
    };
    if reference
        .chars()
        .any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(invalid("it contains whitespace or control characters"));
    }
    if reference.starts_with('-') {
        return Err(invalid("it starts with `-`"));
    }
    if reference.len() > 255 {
        return Err(invalid("it is longer than 255 bytes"));
    }
    Ok(())
}

/// Sets libgit2's process-global socket timeouts, once.
fn init_server_timeouts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: these write two plain ints that libgit2 reads when it opens a socket.
        // Every libgit2 network operation of this process goes through `fetch`, which
        // calls this first; `Once` makes the writes happen-before all of those reads.
        let result = unsafe {
            git2::opts::set_server_connect_timeout_in_milliseconds(SERVER_CONNECT_TIMEOUT_MS)
                .and_then(|()| git2::opts::set_server_timeout_in_milliseconds(SERVER_IO_TIMEOUT_MS))
        };
        if let Err(error) = result {
            tracing::warn!(%error, "could not set libgit2's server timeouts");
        }
    });
}

/// Fetches `url` into `dest` and checks out `reference` detached, discarding local
/// changes and untracked (but not ignored) files, so build outputs survive.
///
/// `reference` is empty (the remote's default branch), a tag, a branch, a full
/// refname (`refs/tags/v1`) or a commit id of at least 7 hex digits, tried in that
/// order. `dest` is reused when it holds a repository; anything else there is
/// removed. Two fetches into the same `dest` at once are the caller's to prevent.
///
/// The whole call is bounded by `settings.timeout`. When it expires, or when the
/// returned future is dropped, the git work is told to stop at its next callback;
/// a thread stuck in a socket read ends at libgit2's I/O timeout.
pub async fn fetch(
    url: &str,
    reference: &str,
    dest: &Path,
    settings: &SourceSettings,
    progress: impl Fn(Progress) + Send + Sync + 'static,
) -> Result<Fetched, SourceError> {
    check_url(url, settings)?;
    check_reference(reference)?;
    check_local(url)?;
    init_server_timeouts();

    let cancel = Arc::new(AtomicBool::new(false));
    let _cancel_on_drop = CancelOnDrop(cancel.clone());
    let job = Job {
        url: url.to_owned(),
        shown_url: display_url(url),
        reference: reference.to_owned(),
        dest: dest.to_owned(),
        settings: settings.clone(),
        deadline: Instant::now().checked_add(settings.timeout),
        cancel,
        progress: Box::new(progress),
    };
    let span = tracing::Span::current();
    let task = tokio::task::spawn_blocking(move || span.in_scope(|| job.run()));
    match tokio::time::timeout(settings.timeout, task).await {
        Ok(Ok(result)) => result,
        Ok(Err(join)) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Ok(Err(_)) => Err(SourceError::Interrupted {
            url: display_url(url),
        }),
        // `_cancel_on_drop` flags the abandoned thread as this returns.
        Err(_elapsed) => Err(SourceError::Timeout {
            url: display_url(url),
            after: settings.timeout,
        }),
    }
}

struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// One fetch, run on a blocking thread.
struct Job {
    url: String,
    shown_url: String,
    reference: String,
    dest: PathBuf,
    settings: SourceSettings,
    /// `None` when the timeout is too large to add to now: no deadline then.
    deadline: Option<Instant>,
    cancel: Arc<AtomicBool>,
    progress: Box<dyn Fn(Progress) + Send + Sync>,
}

impl Job {
    fn run(self) -> Result<Fetched, SourceError> {
        tracing::debug!(git.url = %self.shown_url, git.reference = %self.reference, "fetching source");
        let repo = self.open_or_init()?;
        let default_branch = self.fetch_origin(&repo)?;
        let (commit, described) = self.resolve(&repo, default_branch.as_deref())?;
        if self.cancelled() {
            return Err(self.timeout());
        }
        (self.progress)(Progress::CheckingOut);
        repo.checkout_tree(commit.as_object(), Some(&mut force_checkout()))
            .and_then(|()| repo.set_head_detached(commit.id()))
            .map_err(|e| self.git_error("checkout", &e))?;
        if self.settings.submodules {
            self.update_submodules(&repo, 0)?;
        }
        let commit = commit.id().to_string();
        tracing::debug!(git.url = %self.shown_url, git.commit = %commit, "source checked out");
        Ok(Fetched {
            commit,
            reference: described,
        })
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst) || self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    fn timeout(&self) -> SourceError {
        SourceError::Timeout {
            url: self.shown_url.clone(),
            after: self.settings.timeout,
        }
    }

    fn git_error(&self, action: &'static str, error: &git2::Error) -> SourceError {
        if self.cancelled() {
            return self.timeout();
        }
        SourceError::Git {
            url: self.shown_url.clone(),
            action,
            message: sanitize(error.message(), &self.url),
        }
    }

    /// Opens the repository at `dest`, or makes a fresh one there.
    fn open_or_init(&self) -> Result<Repository, SourceError> {
        let io = |source| SourceError::Io {
            path: self.dest.clone(),
            source,
        };
        if let Ok(repo) = Repository::open(&self.dest) {
            let same_dir = match (repo.workdir(), self.dest.canonicalize()) {
                (Some(workdir), Ok(dest)) => workdir.canonicalize().is_ok_and(|w| w == dest),
                _ => false,
            };
            if same_dir {
                return Ok(repo);
            }
        }
        // A half-made clone, or something else: start again.
        match std::fs::symlink_metadata(&self.dest) {
            Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&self.dest).map_err(io)?,
            Ok(_) => std::fs::remove_file(&self.dest).map_err(io)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        std::fs::create_dir_all(&self.dest).map_err(io)?;
        Repository::init(&self.dest).map_err(|e| self.git_error("init", &e))
    }

    /// Points `origin` at the URL and fetches; returns the remote's default branch.
    fn fetch_origin(&self, repo: &Repository) -> Result<Option<String>, SourceError> {
        let configured = match repo.find_remote("origin") {
            Ok(_) => repo.remote_set_url("origin", &self.url),
            Err(_) => repo
                .remote_with_fetch("origin", &self.url, REFSPECS[0])
                .and_then(|_| repo.remote_add_fetch("origin", REFSPECS[1])),
        };
        configured.map_err(|e| self.git_error("remote setup", &e))?;
        let mut remote = repo
            .find_remote("origin")
            .map_err(|e| self.git_error("remote setup", &e))?;

        (self.progress)(Progress::Connecting);
        remote
            .fetch(&REFSPECS, Some(&mut self.fetch_options()), None)
            .map_err(|e| {
                if self.cancelled() {
                    self.timeout()
                } else {
                    SourceError::Unreachable {
                        url: self.shown_url.clone(),
                        message: sanitize(e.message(), &self.url),
                    }
                }
            })?;
        // Available after the fetch's connection has closed, per libgit2's docs.
        let default_branch = remote
            .default_branch()
            .ok()
            .and_then(|b| b.as_str().ok().map(str::to_owned))
            .and_then(|b| b.strip_prefix("refs/heads/").map(str::to_owned));
        Ok(default_branch)
    }

    /// Callbacks that report progress and abort the transfer once cancelled.
    fn fetch_options(&self) -> FetchOptions<'_> {
        let mut last_report: Option<(Instant, Progress)> = None;
        let mut callbacks = RemoteCallbacks::new();
        callbacks.transfer_progress(move |stats| {
            if self.cancelled() {
                return false;
            }
            let (received, total) = (stats.received_objects(), stats.total_objects());
            let (indexed_deltas, total_deltas) = (stats.indexed_deltas(), stats.total_deltas());
            let current = if total > 0 && received == total && total_deltas > 0 {
                Progress::Resolving {
                    indexed_deltas,
                    total_deltas,
                }
            } else {
                Progress::Receiving {
                    received_objects: received,
                    total_objects: total,
                    received_bytes: stats.received_bytes(),
                }
            };
            let finished = received == total && indexed_deltas == total_deltas;
            let now = Instant::now();
            let due = match &last_report {
                None => true,
                Some((at, previous)) => {
                    now.duration_since(*at) >= PROGRESS_EVERY || (finished && *previous != current)
                }
            };
            if total > 0 && due {
                (self.progress)(current.clone());
                last_report = Some((now, current));
            }
            true
        });
        callbacks.sideband_progress(|_| !self.cancelled());
        let mut credentials = Credentials::default();
        callbacks
            .credentials(move |url, username, allowed| credentials.next(url, username, allowed));
        let mut options = FetchOptions::new();
        options
            .remote_callbacks(callbacks)
            .prune(FetchPrune::On)
            .download_tags(AutotagOption::None);
        options
    }

    /// Resolves the reference: tag, then branch, then commit id.
    fn resolve<'r>(
        &self,
        repo: &'r Repository,
        default_branch: Option<&str>,
    ) -> Result<(Commit<'r>, String), SourceError> {
        let r = self.reference.as_str();
        let candidates: Vec<(String, String)> = if r.is_empty() {
            default_branch
                .into_iter()
                .chain(["main", "master"])
                .map(|b| {
                    (
                        format!("refs/remotes/origin/{b}"),
                        format!("default branch {b}"),
                    )
                })
                .collect()
        } else if let Some(tag) = r.strip_prefix("refs/tags/") {
            vec![(r.to_owned(), format!("tag {tag}"))]
        } else if let Some(branch) = r.strip_prefix("refs/heads/") {
            vec![(
                format!("refs/remotes/origin/{branch}"),
                format!("branch {branch}"),
            )]
        } else if r.starts_with("refs/") {
            vec![(r.to_owned(), r.to_owned())]
        } else {
            vec![
                (format!("refs/tags/{r}"), format!("tag {r}")),
                (format!("refs/remotes/origin/{r}"), format!("branch {r}")),
            ]
        };
        for (name, described) in candidates {
            if let Ok(reference) = repo.find_reference(&name) {
                let commit = reference
                    .peel_to_commit()
                    .map_err(|e| self.git_error("resolve reference", &e))?;
                return Ok((commit, described));
            }
        }
        if r.len() >= 7 && r.chars().all(|c| c.is_ascii_hexdigit()) {
            match repo.find_commit_by_prefix(r) {
                Ok(commit) => {
                    let described = format!("commit {}", commit.id());
                    return Ok((commit, described));
                }
                Err(e) if e.code() == ErrorCode::Ambiguous => {
                    return Err(SourceError::AmbiguousCommit {
                        reference: r.to_owned(),
                        url: self.shown_url.clone(),
                    });
                }
                Err(_) => {}
            }
        }
        Err(SourceError::RefNotFound {
            reference: if r.is_empty() { "HEAD" } else { r }.to_owned(),
            url: self.shown_url.clone(),
            branches: ref_names(repo, "refs/remotes/origin/"),
            tags: ref_names(repo, "refs/tags/"),
        })
    }

    /// `git submodule update --init --recursive`, with each URL checked like the first.
    fn update_submodules(&self, repo: &Repository, depth: usize) -> Result<(), SourceError> {
        let submodules = repo
            .submodules()
            .map_err(|e| self.git_error("submodule listing", &e))?;
        for mut submodule in submodules {
            let name = String::from_utf8_lossy(submodule.name_bytes()).into_owned();
            let error = |message: String| SourceError::Submodule {
                url: self.shown_url.clone(),
                name: name.clone(),
                message,
            };
            if depth >= MAX_SUBMODULE_DEPTH {
                return Err(error(format!(
                    "submodules nest deeper than {MAX_SUBMODULE_DEPTH} levels"
                )));
            }
            let url =
                String::from_utf8_lossy(submodule.opt_url_bytes().unwrap_or_default()).into_owned();
            // Relative URLs resolve against the parent's, which was checked already.
            if !url.starts_with("./") && !url.starts_with("../") {
                check_url(&url, &self.settings).map_err(|e| error(e.to_string()))?;
            }
            let git = |e: git2::Error| {
                if self.cancelled() {
                    self.timeout()
                } else {
                    error(sanitize(e.message(), &url))
                }
            };
            submodule.init(true).map_err(git)?;
            submodule.sync().map_err(git)?;
            let mut options = SubmoduleUpdateOptions::new();
            options
                .fetch(self.fetch_options())
                .checkout(force_checkout())
                .allow_fetch(true);
            submodule.update(true, Some(&mut options)).map_err(git)?;
            let nested = submodule.open().map_err(git)?;
            self.update_submodules(&nested, depth + 1)?;
        }
        Ok(())
    }
}

fn force_checkout() -> CheckoutBuilder<'static> {
    let mut builder = CheckoutBuilder::new();
    builder.force().remove_untracked(true);
    builder
}

/// Short names of the references under `prefix`, sorted, without `HEAD`.
fn ref_names(repo: &Repository, prefix: &str) -> Vec<String> {
    let Ok(mut references) = repo.references_glob(&format!("{prefix}*")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = references
        .names()
        .filter_map(Result::ok)
        .filter_map(|n| n.strip_prefix(prefix))
        .filter(|n| *n != "HEAD")
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

/// Credentials offered to a server that asks, each tried once: a user name and
/// password in the URL (https), then the SSH agent, then the user's default SSH
/// keys. libgit2 asks again after each refusal, so every offer is counted.
#[derive(Default)]
struct Credentials {
    userpass_tried: bool,
    agent_tried: bool,
    keys_tried: usize,
}

impl Credentials {
    const KEYS: [&'static str; 3] = ["id_ed25519", "id_ecdsa", "id_rsa"];

    fn next(
        &mut self,
        url: &str,
        username: Option<&str>,
        allowed: git2::CredentialType,
    ) -> Result<git2::Cred, git2::Error> {
        use git2::{Cred, CredentialType};
        if allowed.contains(CredentialType::USER_PASS_PLAINTEXT) && !self.userpass_tried {
            self.userpass_tried = true;
            if let Ok(parsed) = url::Url::parse(url)
                && let Some(password) = parsed.password()
            {
                return Cred::userpass_plaintext(parsed.username(), password);
            }
        }
        let user = username.unwrap_or("git");
        if allowed.contains(CredentialType::SSH_KEY) {
            if !self.agent_tried {
                self.agent_tried = true;
                if std::env::var_os("SSH_AUTH_SOCK").is_some() {
                    return Cred::ssh_key_from_agent(user);
                }
            }
            let home = std::env::var_os("HOME").map(PathBuf::from);
            while let Some(home) = &home
                && self.keys_tried < Self::KEYS.len()
            {
                let key = home.join(".ssh").join(Self::KEYS[self.keys_tried]);
                self.keys_tried += 1;
                if key.is_file() {
                    return Cred::ssh_key(user, None, &key, None);
                }
            }
        }
        if allowed.contains(CredentialType::USERNAME) {
            return Cred::username(user);
        }
        Err(git2::Error::from_str(
            "the server wants credentials and none were accepted (tried: URL user and password, SSH agent, ~/.ssh keys)",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::process::{Child, Command, Stdio};
    use std::sync::Mutex;

    /// Runs the git CLI in `dir` with a fixed identity and no user or system config.
    fn git(dir: &Path, args: &[&str]) -> String {
        let output = Command::new("git")
            .args([
                "-c",
                "user.name=Corbel Test",
                "-c",
                "user.email=test@corbel.invalid",
            ])
            .args([
                "-c",
                "init.defaultBranch=main",
                "-c",
                "protocol.file.allow=always",
            ])
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .expect("git runs");
        assert!(
            output.status.success(),
            "git {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// A bare repository `origin.git`: `main` (two commits, annotated tag `v1.0` on the
    /// second, lightweight `v0.9` on the first) and `dev` (one commit on top of the first).
    struct Fixture {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        work: PathBuf,
        bare: PathBuf,
    }

    impl Fixture {
        fn new() -> Self {
            let tmp = tempfile::tempdir().expect("tempdir");
            let root = tmp.path().to_owned();
            let (work, bare) = (root.join("work"), root.join("origin.git"));
            git(&root, &["init", "-q", "work"]);
            let fixture = Self {
                _tmp: tmp,
                root,
                work,
                bare,
            };
            fixture.commit("README", "one");
            git(&fixture.work, &["tag", "v0.9"]);
            git(&fixture.work, &["checkout", "-q", "-b", "dev"]);
            fixture.commit("dev.txt", "dev");
            git(&fixture.work, &["checkout", "-q", "main"]);
            fixture.commit("README", "two");
            git(&fixture.work, &["tag", "-a", "v1.0", "-m", "release 1.0"]);
            git(&fixture.root, &["init", "-q", "--bare", "origin.git"]);
            fixture.push();
            fixture
        }

        fn commit(&self, file: &str, content: &str) {
            std::fs::write(self.work.join(file), content).expect("write");
            git(&self.work, &["add", "-A"]);
            git(&self.work, &["commit", "-q", "-m", content]);
        }

        fn push(&self) {
            let bare = self.bare.to_str().expect("utf-8 path");
            let refs = ["refs/heads/*:refs/heads/*", "refs/tags/*:refs/tags/*"];
            git(&self.work, &["push", "-q", "-f", bare, refs[0], refs[1]]);
        }

        fn rev(&self, spec: &str) -> String {
            git(&self.bare, &["rev-parse", &format!("{spec}^{{commit}}")])
        }

        fn url(&self) -> String {
            format!("file://{}", self.bare.display())
        }

        fn dest(&self, name: &str) -> PathBuf {
            self.root.join("providers").join(name).join("src")
        }
    }

    fn settings() -> SourceSettings {
        SourceSettings {
            timeout: Duration::from_secs(60),
            ..SourceSettings::default()
        }
    }

    async fn fetch_ok(url: &str, reference: &str, dest: &Path) -> Fetched {
        match fetch(url, reference, dest, &settings(), |_| {}).await {
            Ok(fetched) => fetched,
            Err(e) => panic!("fetch {url} at `{reference}` failed: {e}"),
        }
    }

    /// Asserts that `dest` has `commit` checked out, detached, with a clean tree.
    fn assert_checked_out(dest: &Path, commit: &str) {
        assert_eq!(git(dest, &["rev-parse", "HEAD"]), commit);
        let symbolic = Command::new("git")
            .arg("-C")
            .arg(dest)
            .args(["symbolic-ref", "-q", "HEAD"])
            .status()
            .expect("git runs");
        assert!(!symbolic.success(), "HEAD should be detached");
        assert_eq!(git(dest, &["status", "--porcelain"]), "");
    }

    fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::yield_now();
        }
    }

    fn closed_port() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    }

    #[tokio::test]
    async fn clones_tags_branches_commits_and_the_default_branch() {
        let f = Fixture::new();
        let main = f.rev("main");
        let dev = f.rev("dev");
        let cases = [
            ("v1.0", f.rev("v1.0"), "tag v1.0".to_owned()),
            ("v0.9", f.rev("v0.9"), "tag v0.9".to_owned()),
            ("refs/tags/v1.0", f.rev("v1.0"), "tag v1.0".to_owned()),
            ("dev", dev.clone(), "branch dev".to_owned()),
            ("refs/heads/dev", dev.clone(), "branch dev".to_owned()),
            (main.as_str(), main.clone(), format!("commit {main}")),
            (&dev[..8], dev.clone(), format!("commit {dev}")),
            ("", main.clone(), "default branch main".to_owned()),
        ];
        for (i, (reference, commit, described)) in cases.into_iter().enumerate() {
            let dest = f.dest(&format!("case{i}"));
            let fetched = fetch_ok(&f.url(), reference, &dest).await;
            assert_eq!(fetched.commit, commit, "reference `{reference}`");
            assert_eq!(fetched.reference, described);
            assert_checked_out(&dest, &commit);
        }
        // The default branch is the remote's HEAD, not a guess.
        git(&f.bare, &["symbolic-ref", "HEAD", "refs/heads/dev"]);
        let fetched = fetch_ok(&f.url(), "", &f.dest("default-dev")).await;
        assert_eq!(fetched.commit, dev);
        assert_eq!(fetched.reference, "default branch dev");
    }

    #[tokio::test]
    async fn fetches_again_into_the_same_directory() {
        let f = Fixture::new();
        let dest = f.dest("again");
        // A half-made directory that is not a repository is replaced.
        std::fs::create_dir_all(&dest).expect("mkdir");
        std::fs::write(dest.join("junk"), "x").expect("write");

        let first = fetch_ok(&f.url(), "main", &dest).await;
        assert_eq!(first.commit, f.rev("main"));
        assert!(!dest.join("junk").exists());

        f.commit("README", "three");
        f.push();
        std::fs::write(dest.join("README"), "local edit").expect("write");
        std::fs::write(dest.join("stray.txt"), "untracked").expect("write");
        let second = fetch_ok(&f.url(), "main", &dest).await;
        assert_eq!(second.commit, f.rev("main"));
        assert_ne!(second.commit, first.commit);
        assert_checked_out(&dest, &second.commit);
        assert_eq!(
            std::fs::read_to_string(dest.join("README")).ok().as_deref(),
            Some("three")
        );
        assert!(!dest.join("stray.txt").exists());

        let tag = fetch_ok(&f.url(), "v1.0", &dest).await;
        assert_eq!(tag.commit, f.rev("v1.0"));
        let branch = fetch_ok(&f.url(), "dev", &dest).await;
        assert_eq!(branch.commit, f.rev("dev"));
        assert_checked_out(&dest, &branch.commit);
        assert!(dest.join("dev.txt").exists());

        // A plain path (the same repository) works too, as does a moved branch.
        let plain = f.bare.to_str().expect("utf-8 path");
        let again = fetch_ok(plain, "refs/tags/v0.9", &dest).await;
        assert_eq!(again.commit, f.rev("v0.9"));
        assert!(!dest.join("dev.txt").exists());
    }

    #[tokio::test]
    async fn missing_reference_is_named_with_what_exists() {
        let f = Fixture::new();
        for reference in ["nope", "refs/tags/v9", "deadbeef00"] {
            let error = fetch(&f.url(), reference, &f.dest("missing"), &settings(), |_| {})
                .await
                .expect_err("missing ref");
            let SourceError::RefNotFound {
                reference: named,
                branches,
                tags,
                ..
            } = &error
            else {
                panic!("expected RefNotFound, got {error:?}");
            };
            assert_eq!(named, reference);
            assert_eq!(branches, &["dev", "main"]);
            assert_eq!(tags, &["v0.9", "v1.0"]);
            let message = error.to_string();
            assert!(message.contains(&format!("`{reference}`")), "{message}");
            assert!(
                message.contains("branches: dev, main; tags: v0.9, v1.0"),
                "{message}"
            );
        }
        let error = fetch(&f.url(), "-x", &f.dest("m2"), &settings(), |_| {}).await;
        assert!(matches!(error, Err(SourceError::InvalidReference { .. })));
    }

    struct Daemon(Child);

    impl Drop for Daemon {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[tokio::test]
    async fn git_daemon_on_loopback_with_progress() {
        let f = Fixture::new();
        let port = closed_port();
        let root = f.root.to_str().expect("utf-8 path");
        let child = Command::new("git")
            .arg("daemon")
            .args(["--reuseaddr", "--export-all", "--listen=127.0.0.1"])
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={root}"))
            .arg(root)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("git daemon starts");
        let _daemon = Daemon(child);
        wait_until("git daemon", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });

        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorder = seen.clone();
        let url = format!("git://127.0.0.1:{port}/origin.git");
        let fetched = fetch(&url, "v1.0", &f.dest("daemon"), &settings(), move |p| {
            recorder.lock().expect("lock").push(p);
        })
        .await
        .expect("fetch over git://");
        assert_eq!(fetched.commit, f.rev("v1.0"));

        let seen = seen.lock().expect("lock");
        assert_eq!(seen.first(), Some(&Progress::Connecting));
        assert_eq!(seen.last(), Some(&Progress::CheckingOut));
        let last_receiving = seen.iter().rev().find_map(|p| match p {
            Progress::Receiving {
                received_objects,
                total_objects,
                received_bytes,
            } => Some((*received_objects, *total_objects, *received_bytes)),
            _ => None,
        });
        let (received, total, bytes) = last_receiving.expect("receiving progress reported");
        assert!(total > 0 && received == total && bytes > 0, "{seen:?}");
    }

    #[tokio::test]
    async fn closed_port_is_unreachable() {
        let dest = tempfile::tempdir().expect("tempdir");
        let url = format!("git://127.0.0.1:{}/x", closed_port());
        let error = fetch(&url, "", &dest.path().join("src"), &settings(), |_| {})
            .await
            .expect_err("nothing listens");
        assert!(
            matches!(error, SourceError::Unreachable { .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains(&url), "{error}");

        // A missing local repository is named as such, before libgit2 would
        // call it an unsupported protocol: as a URL and as a path.
        let missing = dest.path().join("none.git");
        for url in [
            format!("file://{}", missing.display()),
            missing.display().to_string(),
        ] {
            let error = fetch(&url, "", &dest.path().join("src"), &settings(), |_| {})
                .await
                .expect_err("no repository");
            assert!(
                matches!(&error, SourceError::NoLocalRepository { path, .. } if *path == missing),
                "{error:?}"
            );
            assert!(error.to_string().contains("it does not exist"), "{error}");
        }
    }

    #[tokio::test]
    async fn silent_server_times_out_promptly() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (release, released) = std::sync::mpsc::channel::<()>();
        // Accepts, never answers, and hangs up only when told to.
        std::thread::spawn(move || {
            let connection = listener.accept();
            let _ = released.recv_timeout(Duration::from_secs(60));
            drop(connection);
        });

        let dest = tempfile::tempdir().expect("tempdir");
        let url = format!("git://127.0.0.1:{port}/x");
        let quick = SourceSettings {
            timeout: Duration::from_secs(2),
            ..SourceSettings::default()
        };
        let started = Instant::now();
        let result = fetch(&url, "", &dest.path().join("src"), &quick, |_| {}).await;
        let elapsed = started.elapsed();
        // Lets the abandoned git thread see EOF, so the runtime can shut down.
        let _ = release.send(());
        let error = result.expect_err("the server never answers");
        assert!(
            matches!(&error, SourceError::Timeout { after, .. } if *after == quick.timeout),
            "{error:?}"
        );
        assert!(elapsed < Duration::from_secs(4), "took {elapsed:?}");
        assert_eq!(
            error.to_string(),
            format!("fetching {url} timed out after 2s")
        );
    }

    #[test]
    fn schemes_are_checked() {
        let all = SourceSettings::default();
        for ok in [
            "https://example.com/a.git",
            "http://example.com/a.git",
            "git://127.0.0.1:9418/a",
            "ssh://git@example.com/a.git",
            "git+ssh://example.com/a.git",
            "git@example.com:org/a.git",
            "file:///srv/a.git",
            "/srv/a.git",
            "../a.git",
            "a.git",
        ] {
            assert!(check_url(ok, &all).is_ok(), "{ok} should be allowed");
        }
        for (url, scheme) in [
            ("ext::sh -c touch% /tmp/pwned", "ext"),
            ("fd::3", "fd"),
            ("ftp://example.com/a.git", "ftp"),
            ("transport+x::whatever", "transport+x"),
        ] {
            match check_url(url, &all) {
                Err(SourceError::SchemeRefused { scheme: s, .. }) => assert_eq!(s, scheme),
                other => panic!("{url}: expected SchemeRefused, got {other:?}"),
            }
        }
        // Helpers stay refused even when listed.
        let listed = SourceSettings {
            allowed_schemes: vec!["ext".into(), "git".into()],
            ..SourceSettings::default()
        };
        let error = check_url("ext::sh -c id", &listed).expect_err("helper");
        assert_eq!(
            error.to_string(),
            "git URL scheme `ext` is not allowed (allowed: git)"
        );

        let no_https = SourceSettings {
            allowed_schemes: vec!["git".into(), "file".into()],
            ..SourceSettings::default()
        };
        let error = check_url("https://user:hunter22@example.com/a.git", &no_https)
            .expect_err("https not listed");
        assert_eq!(
            error.to_string(),
            "git URL scheme `https` is not allowed (allowed: git, file)"
        );
        assert!(check_url("git@example.com:a.git", &no_https).is_err());

        for bad in [
            "",
            "  ",
            "https://exa\nmple.com/a",
            "-oProxyCommand=x",
            "https:///a",
        ] {
            assert!(
                matches!(check_url(bad, &all), Err(SourceError::InvalidUrl { .. })),
                "{bad:?} should be invalid"
            );
        }
    }

    #[tokio::test]
    async fn refused_scheme_is_refused_before_any_io() {
        let dest = tempfile::tempdir().expect("tempdir");
        let target = dest.path().join("src");
        let error = fetch(
            "ext::sh -c touch% /tmp/pwned",
            "",
            &target,
            &settings(),
            |_| {},
        )
        .await
        .expect_err("refused");
        assert!(matches!(error, SourceError::SchemeRefused { .. }));
        assert!(!target.exists());
    }

    #[test]
    fn urls_are_shown_without_credentials() {
        assert_eq!(
            display_url("https://user:hunter22@example.com/a.git"),
            "https://***@example.com/a.git"
        );
        assert_eq!(
            display_url("https://TOKEN@example.com/a@b.git"),
            "https://***@example.com/a@b.git"
        );
        assert_eq!(
            display_url("git@example.com:org/a.git"),
            "git@example.com:org/a.git"
        );
        assert_eq!(
            display_url("git:pw1234@example.com:org/a.git"),
            "git:***@example.com:org/a.git"
        );
        assert_eq!(display_url("/srv/a@b/repo"), "/srv/a@b/repo");
        assert_eq!(display_url("https://x\n/a"), "https://x\\n/a");
        let url = "https://user:hunter22@example.com/a.git";
        let message = sanitize(&format!("failed to reach {url} as user:hunter22"), url);
        assert!(!message.contains("hunter22"), "{message}");
    }

    #[tokio::test]
    async fn submodules_only_when_asked() {
        let f = Fixture::new();
        let lib = f.root.join("lib-work");
        git(&f.root, &["init", "-q", "lib-work"]);
        std::fs::write(lib.join("lib.txt"), "lib").expect("write");
        git(&lib, &["add", "-A"]);
        git(&lib, &["commit", "-q", "-m", "lib"]);
        git(&f.work, &["checkout", "-q", "-b", "with-lib"]);
        let lib_path = lib.to_str().expect("utf-8 path");
        git(&f.work, &["submodule", "add", "-q", lib_path, "lib"]);
        git(&f.work, &["commit", "-q", "-m", "add lib"]);
        f.push();

        let without = f.dest("without");
        fetch_ok(&f.url(), "with-lib", &without).await;
        assert!(!without.join("lib/lib.txt").exists());

        let with = f.dest("with");
        let enabled = SourceSettings {
            submodules: true,
            ..settings()
        };
        fetch(&f.url(), "with-lib", &with, &enabled, |_| {})
            .await
            .expect("fetch with submodules");
        assert_eq!(
            std::fs::read_to_string(with.join("lib/lib.txt"))
                .ok()
                .as_deref(),
            Some("lib")
        );

        // A submodule URL is held to the same scheme list.
        let no_file = SourceSettings {
            allowed_schemes: vec!["file".into()],
            submodules: true,
            ..settings()
        };
        git(
            &f.work,
            &[
                "config",
                "-f",
                ".gitmodules",
                "submodule.lib.url",
                "ext::sh -c id",
            ],
        );
        git(&f.work, &["commit", "-q", "-am", "evil"]);
        f.push();
        let error = fetch(&f.url(), "with-lib", &f.dest("evil"), &no_file, |_| {})
            .await
            .expect_err("ext:: submodule");
        assert!(matches!(error, SourceError::Submodule { .. }), "{error:?}");
        assert!(
            error.to_string().contains("`ext` is not allowed"),
            "{error}"
        );
    }
}
