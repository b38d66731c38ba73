//! The world as `/proc` shows it, independently of what Corbel says: the
//! processes a test run started (by its mark), and what is left of them.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::support::processes::{signal, stat};

/// A live process with the run's mark.
pub struct Proc {
    pub pid: i32,
    /// Start time (clock ticks since boot): tells a new process from an old
    /// one that had the same pid.
    pub start: u64,
    /// Its deployment's name (`CHAOS_TAG`) and resource key (`CHAOS_KEY`).
    pub tag: String,
    pub key: String,
}

/// Every live (not zombie) process whose environment carries `mark`. Other
/// tests running at the same time have other marks.
pub fn world(mark: &str) -> BTreeMap<i32, Proc> {
    let wanted = format!("CHAOS_MARK={mark}");
    let mut found = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue; // gone meanwhile
        };
        let vars: Vec<String> = environ
            .split(|b| *b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        if !vars.contains(&wanted) {
            continue;
        }
        let Some((_, start)) = stat(pid).filter(|(state, _)| !matches!(state, 'Z' | 'X')) else {
            continue; // a zombie has exited
        };
        let var = |name: &str| {
            vars.iter()
                .find_map(|v| v.strip_prefix(name)?.strip_prefix('=').map(str::to_owned))
                .unwrap_or_default()
        };
        found.insert(
            pid,
            Proc {
                pid,
                start,
                tag: var("CHAOS_TAG"),
                key: var("CHAOS_KEY"),
            },
        );
    }
    found
}

/// Whatever happens to the test, nothing it made outlives it: on drop, each
/// provider it froze and that is still frozen is killed, and every process
/// with its mark is killed.
pub struct Leftovers {
    mark: String,
    frozen: Mutex<Vec<(i32, u64)>>,
}

impl Leftovers {
    pub fn new(mark: &str) -> Leftovers {
        Leftovers {
            mark: mark.to_owned(),
            frozen: Mutex::new(Vec::new()),
        }
    }

    /// Freezes `pid` (SIGSTOP) and remembers it; returns its start time.
    pub fn freeze(&self, pid: i32) -> Option<u64> {
        let (_, start) = stat(pid)?;
        self.frozen.lock().unwrap().push((pid, start));
        signal(pid, libc::SIGSTOP);
        Some(start)
    }

    /// Thaws `pid` (SIGCONT) if it is still the process that was frozen.
    pub fn thaw(&self, pid: i32, start: u64) {
        if stat(pid).is_some_and(|(_, s)| s == start) {
            signal(pid, libc::SIGCONT);
        }
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        let frozen = std::mem::take(&mut *self.frozen.lock().unwrap_or_else(|p| p.into_inner()));
        for (pid, start) in frozen {
            if stat(pid).is_some_and(|(state, s)| s == start && state == 'T') {
                signal(pid, libc::SIGKILL);
                signal(pid, libc::SIGCONT);
            }
        }
        for p in world(&self.mark).values() {
            signal(p.pid, libc::SIGKILL);
        }
    }
}
