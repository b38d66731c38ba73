//! Taking Corbel's variables out of the process environment, so that nothing
//! the provider starts afterwards — by any means — inherits its registration
//! token, its registry's address or its directories.
//!
//! The rule: the variables are read once, and removed from the environment in
//! the same step, while the process runs a single thread. Removing a variable
//! (`std::env::remove_var`, `unsafe` since edition 2024) is only sound while no
//! other thread can read the environment at the same time; with one thread
//! there is no other thread, and none can appear unless this one makes it, so
//! the check ([`single_threaded`]) and the removal cannot be raced. [`run`]
//! takes the environment before it starts the tokio runtime, which is why it is
//! the entry point to use. A process that reaches [`ProviderEnv::take`] with
//! threads running (a `#[tokio::main]` calling [`serve`](crate::serve)) keeps
//! the values but cannot remove them: [`ProviderEnv::removed`] says so and
//! `serve` warns in its log.
//!
//! Removing a variable leaves the block the process started with as it was,
//! and that block is what `/proc/<pid>/environ` shows: the values are
//! overwritten with zero bytes where they lie first ([`scrub_block`]). And
//! the process is made non-dumpable (`PR_SET_DUMPABLE` 0, as the server makes
//! itself), so that no process of the same user — a workload it starts
//! first — can trace it or read its `/proc/<pid>/environ` or `mem`.
//!
//! Later calls of [`ProviderEnv::take`] (from `serve`, `Settings::from_env`,
//! `Records::from_env`) return the values taken the first time.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::OnceLock;

use crate::settings::{ENV_STATE_DIR, PROVIDER_ENV};
use crate::{SdkError, Settings};

/// Corbel's variables for this provider ([`PROVIDER_ENV`]), as they were when
/// first taken.
#[derive(Clone, PartialEq, Eq)]
pub struct ProviderEnv {
    values: BTreeMap<&'static str, String>,
    removed: bool,
}

static TAKEN: OnceLock<ProviderEnv> = OnceLock::new();

impl ProviderEnv {
    /// Makes the process non-dumpable, reads every variable of
    /// [`PROVIDER_ENV`] and, if the process runs one thread, removes them from
    /// its environment (their values zeroed in the starting block). Only the
    /// first call looks at the environment; later ones return what it took.
    pub fn take() -> ProviderEnv {
        TAKEN
            .get_or_init(|| {
                make_non_dumpable();
                let values = Self::read(|name| std::env::var(name).ok());
                let present = PROVIDER_ENV
                    .iter()
                    .any(|name| std::env::var_os(name).is_some());
                let removed = !present || (single_threaded() && remove_all());
                ProviderEnv { values, removed }
            })
            .clone()
    }

    /// The variables as `lookup` finds them, removing nothing (tests, and
    /// providers that get their values elsewhere).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> ProviderEnv {
        ProviderEnv {
            values: Self::read(lookup),
            removed: true,
        }
    }

    fn read(lookup: impl Fn(&str) -> Option<String>) -> BTreeMap<&'static str, String> {
        PROVIDER_ENV
            .iter()
            .filter_map(|name| {
                lookup(name)
                    .filter(|value| !value.is_empty())
                    .map(|value| (*name, value))
            })
            .collect()
    }

    /// One of the variables, if it was set and not empty.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Whether none of the variables is left in the process environment (the
    /// programs the provider starts cannot inherit them).
    pub fn removed(&self) -> bool {
        self.removed
    }

    /// The settings `serve` needs; a missing variable is an error naming it.
    pub fn settings(&self) -> Result<Settings, SdkError> {
        Settings::from_lookup(|name| self.get(name).map(str::to_owned))
    }

    /// `CORBEL_STATE_DIR`, if set.
    pub fn state_dir(&self) -> Option<PathBuf> {
        self.get(ENV_STATE_DIR).map(PathBuf::from)
    }
}

impl std::fmt::Debug for ProviderEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only: the token is one of the values.
        f.debug_struct("ProviderEnv")
            .field("set", &self.values.keys().collect::<Vec<_>>())
            .field("removed", &self.removed)
            .finish()
    }
}

/// A provider's whole `main`: takes Corbel's variables out of the environment
/// while the process still has one thread, then starts a multi-threaded tokio
/// runtime and runs `main` on it with them.
///
/// ```no_run
/// # use corbel_provider_sdk::{Provider, ProviderInfo, async_trait};
/// # struct Hello;
/// # #[async_trait] impl Provider for Hello {
/// #     fn info(&self) -> ProviderInfo { ProviderInfo::new("hello", "0.1.0") }
/// # }
/// fn main() -> std::process::ExitCode {
///     corbel_provider_sdk::run(|env| corbel_provider_sdk::serve_env(env, Hello))
/// }
/// ```
pub fn run<F, Fut>(main: F) -> ExitCode
where
    F: FnOnce(ProviderEnv) -> Fut,
    Fut: Future<Output = ExitCode>,
{
    let env = ProviderEnv::take();
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(main(env)),
        Err(error) => {
            eprintln!("cannot start the tokio runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Whether this process runs exactly one thread (the caller). Linux: the
/// entries of `/proc/self/task`; elsewhere, or if it cannot be read, `false`
/// (nothing is removed when it cannot be proved safe).
pub fn single_threaded() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|tasks| tasks.count() == 1)
}

/// Keeps other processes of the same user from tracing this one or reading
/// its `/proc/<pid>/environ`, `mem` and `fd` (only root can). What it starts
/// with `exec` is dumpable again, as any program. Said on standard error if
/// it fails, and the provider goes on.
fn make_non_dumpable() {
    #[cfg(target_os = "linux")]
    if let Err(error) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("cannot make the provider non-dumpable: {error}");
    }
}

/// Removes every variable of [`PROVIDER_ENV`], its value first zeroed in the
/// environment block. Called only by [`ProviderEnv::take`] after
/// [`single_threaded`] returned `true`.
fn remove_all() -> bool {
    // SAFETY: one thread, as for the removal below.
    unsafe { scrub_block() };
    for name in PROVIDER_ENV {
        // SAFETY: the process runs one thread (checked just before by the
        // caller, on this very thread), so nothing can read or write the
        // environment concurrently, and no thread can start in between.
        unsafe { std::env::remove_var(name) };
    }
    true
}

/// Overwrites the value of every [`PROVIDER_ENV`] entry of the environment
/// where it lies with zero bytes: `/proc/<pid>/environ` shows the block the
/// process started with, which removing a variable leaves as it was (root,
/// who can still read a non-dumpable process's, sees
/// `CORBEL_PROVIDER_TOKEN=` and nothing after it). The server does the same
/// with its own variables (`contain_self` in its `cli.rs`).
///
/// # Safety
/// Only while the process runs one thread: nothing else may read or change
/// the environment meanwhile.
unsafe fn scrub_block() {
    unsafe extern "C" {
        static environ: *const *mut std::ffi::c_char;
    }
    // SAFETY: `environ` is the C library's null-terminated array of
    // null-terminated strings; each is written only within its length.
    unsafe {
        let mut entry = environ;
        while !entry.is_null() && !(*entry).is_null() {
            let text = std::ffi::CStr::from_ptr(*entry).to_bytes();
            if let Some(equals) = text.iter().position(|b| *b == b'=')
                && PROVIDER_ENV
                    .iter()
                    .any(|name| name.as_bytes() == &text[..equals])
            {
                let value = (*entry).add(equals + 1);
                std::ptr::write_bytes(value, 0, text.len() - equals - 1);
            }
            entry = entry.add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{ENV_PROVIDER_ID, ENV_PROVIDER_TOKEN, ENV_REGISTRY, ENV_SOCKET_DIR};

    #[test]
    fn the_values_are_read_empty_ones_are_absent_and_the_token_stays_out_of_debug() {
        let env = ProviderEnv::from_lookup(|name| match name {
            ENV_REGISTRY => Some("unix:///run/r.sock".into()),
            ENV_PROVIDER_ID => Some("p1".into()),
            ENV_PROVIDER_TOKEN => Some("s3cret".into()),
            ENV_SOCKET_DIR => Some("/run/p".into()),
            ENV_STATE_DIR => Some(String::new()),
            _ => None,
        });
        assert_eq!(env.get(ENV_PROVIDER_TOKEN), Some("s3cret"));
        assert_eq!(env.state_dir(), None);
        assert_eq!(env.settings().unwrap().provider_id, "p1");
        assert!(!format!("{env:?}").contains("s3cret"), "{env:?}");
        let missing = ProviderEnv::from_lookup(|_| None).settings().unwrap_err();
        assert!(missing.to_string().contains(ENV_REGISTRY), "{missing}");
    }

    /// The test harness runs this test on a thread of its own, so the process
    /// is not single-threaded: the variables must be read but left in place.
    /// (Their removal in a one-thread process is tested with the real fixture
    /// binary in `providers/fixture/tests`.)
    #[test]
    fn with_other_threads_running_nothing_is_removed() {
        assert!(!single_threaded());
        let unique = "CORBEL_SOCKET_DIR";
        let before = std::env::var_os(unique);
        let taken = ProviderEnv::take();
        assert_eq!(std::env::var_os(unique), before);
        assert_eq!(taken.removed(), before.is_none() && !any_set());
        assert_eq!(
            ProviderEnv::take(),
            taken,
            "later calls return the first take"
        );
    }

    fn any_set() -> bool {
        PROVIDER_ENV.iter().any(|n| std::env::var_os(n).is_some())
    }
}
