//! One fetch's git2 work, on a blocking thread: open or make the repository,
//! fetch `origin`, resolve the reference, check it out detached, update
//! submodules. Every step looks at the cancel flag and the deadline that
//! [`super::fetch`] set, so an abandoned fetch stops at its next callback.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use git2::build::CheckoutBuilder;
use git2::{
    AutotagOption, Commit, ErrorCode, FetchOptions, FetchPrune, RemoteCallbacks, Repository,
    SubmoduleUpdateOptions,
};

use super::credentials::Credentials;
use super::url_policy::{check_url, sanitize};
use super::{Fetched, Progress, SourceError, SourceSettings};

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

/// Sets libgit2's process-global socket timeouts, once.
pub(super) fn init_server_timeouts() {
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

/// One fetch, run on a blocking thread.
pub(super) struct Job {
    pub(super) url: String,
    pub(super) shown_url: String,
    pub(super) reference: String,
    pub(super) dest: PathBuf,
    pub(super) settings: SourceSettings,
    /// `None` when the timeout is too large to add to now: no deadline then.
    pub(super) deadline: Option<Instant>,
    pub(super) cancel: Arc<AtomicBool>,
    pub(super) progress: Box<dyn Fn(Progress) + Send + Sync>,
}

impl Job {
    pub(super) fn run(self) -> Result<Fetched, SourceError> {
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
