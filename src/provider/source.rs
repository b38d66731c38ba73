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
//!
//! This file holds the settings, the outcome and error types and [`fetch`], the
//! deadline around the work; `url_policy` decides which URLs may be fetched and
//! how they are shown, `git` does one fetch's git2 work, `credentials` answers
//! a server that asks for them.

mod credentials;
mod git;
mod url_policy;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use url_policy::{check_local, check_url, display_url};

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
    url_policy::check_reference(reference)?;
    check_local(url)?;
    git::init_server_timeouts();

    let cancel = Arc::new(AtomicBool::new(false));
    let _cancel_on_drop = CancelOnDrop(cancel.clone());
    let job = git::Job {
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

#[cfg(test)]
mod tests;
