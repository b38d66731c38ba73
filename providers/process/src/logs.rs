//! A service's output, kept bounded: one file of its stdout and stderr,
//! `logs/<id>.log`, and up to `log_files` rotated ones, `<id>.log.1` (the
//! newest) to `<id>.log.<log_files>`.
//!
//! The service outlives the provider, so it writes to its file itself: the
//! file is opened `O_APPEND` at spawn and handed over as stdout and stderr.
//! No pipe, no reader that could die with the provider. The provider keeps
//! the files small from outside: [`Logs::watch_dir`] follows writes to the
//! logs directory through inotify and rotates a file once it passes
//! `log_max_bytes`, by copy, then truncate ([`rotate_if_full`]): the last
//! `log_max_bytes` of it (from a line start) go to `<id>.log.1`, the older
//! rotated files move up one, and the file is truncated to 0; the service's
//! next append lands at its new end, 0.
//!
//! The race, and the bound. What the service appends between the copy and
//! the truncate (microseconds apart) is lost. A rotated file holds at most
//! `log_max_bytes`; the live file holds `log_max_bytes` plus what the
//! service writes before the provider reacts (an inotify wake-up: usually a
//! few KiB, more for a service writing megabytes a second on a busy host).
//! While no provider runs, nothing rotates: the next one rotates what grew
//! when it starts watching.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rustix::fs::inotify;
use tokio::task::AbortHandle;

use crate::config::MAX_LOG_FILES;

/// How large and how many: the provider's `log_max_bytes` and `log_files`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLimits {
    pub max_bytes: u64,
    pub files: u32,
}

/// The `n`th rotated file of `log` (`<log>.<n>`; 1 is the newest).
pub fn rotated(log: &Path, n: u32) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// Where a rotation writes `<log>.1` before renaming it in place.
fn rotating(log: &Path) -> PathBuf {
    let mut name = rotated(log, 1).into_os_string();
    name.push(".tmp");
    PathBuf::from(name)
}

/// Rotates `log` if it is over `limits.max_bytes`: its last `max_bytes` (from
/// the first line start in them) to `<log>.1`, the rotated files up one
/// (those past `limits.files` removed), then `log` truncated to 0. True if it
/// rotated. A missing `log` is not an error.
pub fn rotate_if_full(log: &Path, limits: LogLimits) -> io::Result<bool> {
    let mut file = match OpenOptions::new().read(true).write(true).open(log) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(named(log, error)),
    };
    let len = file.metadata().map_err(|e| named(log, e))?.len();
    if len <= limits.max_bytes {
        return Ok(false);
    }
    for n in (limits.files + 1)..=MAX_LOG_FILES {
        remove_if_there(&rotated(log, n))?;
    }
    if limits.files > 0 {
        for n in (1..limits.files).rev() {
            match fs::rename(rotated(log, n), rotated(log, n + 1)) {
                Err(error) if error.kind() != io::ErrorKind::NotFound => {
                    return Err(named(&rotated(log, n), error));
                }
                _ => {}
            }
        }
        let start = len - limits.max_bytes;
        let mut kept = Vec::with_capacity(limits.max_bytes as usize);
        file.seek(SeekFrom::Start(start))
            .map_err(|e| named(log, e))?;
        (&mut file)
            .take(limits.max_bytes)
            .read_to_end(&mut kept)
            .map_err(|e| named(log, e))?;
        // Not half a line: from the first line that starts in what is kept.
        let from = match kept.iter().position(|&b| b == b'\n') {
            Some(newline) if start > 0 && newline + 1 < kept.len() => newline + 1,
            _ => 0,
        };
        let tmp = rotating(log);
        File::create(&tmp)
            .and_then(|mut out| out.write_all(&kept[from..]))
            .map_err(|e| named(&tmp, e))?;
        fs::rename(&tmp, rotated(log, 1)).map_err(|e| named(&tmp, e))?;
    }
    // What the service appended since the copy is lost here (see above).
    file.set_len(0).map_err(|e| named(log, e))?;
    Ok(true)
}

/// Removes `log` and every rotated file of it; missing ones are fine.
pub fn remove_all(log: &Path) -> io::Result<()> {
    remove_if_there(log)?;
    remove_if_there(&rotating(log))?;
    for n in 1..=MAX_LOG_FILES {
        remove_if_there(&rotated(log, n))?;
    }
    Ok(())
}

/// The last `lines` lines of `log`, reaching into its rotated files (newest
/// first) when `log` holds fewer, reading at most `max_bytes` in all.
pub fn tail(log: &Path, lines: usize, max_bytes: u64) -> io::Result<String> {
    if lines == 0 {
        return Ok(String::new());
    }
    // Newest first: (bytes, whether they are the whole file).
    let mut chunks: Vec<(Vec<u8>, bool)> = Vec::new();
    let (mut budget, mut newlines) = (max_bytes, 0);
    for n in 0..=MAX_LOG_FILES {
        let path = if n == 0 {
            log.to_path_buf()
        } else {
            rotated(log, n)
        };
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound && n == 0 => continue,
            Err(error) if error.kind() == io::ErrorKind::NotFound => break,
            Err(error) => return Err(named(&path, error)),
        };
        let len = file.metadata().map_err(|e| named(&path, e))?.len();
        let take = len.min(budget);
        let mut bytes = Vec::with_capacity(take as usize);
        file.seek(SeekFrom::Start(len - take))
            .and_then(|_| file.take(take).read_to_end(&mut bytes))
            .map_err(|e| named(&path, e))?;
        budget -= take;
        newlines += bytes.iter().filter(|&&b| b == b'\n').count();
        chunks.push((bytes, take == len));
        if newlines > lines || budget == 0 {
            break;
        }
    }
    let mut text = Vec::new();
    for (i, (bytes, whole)) in chunks.iter().rev().enumerate() {
        // The oldest chunk read, if cut, starts mid-line: drop that part.
        let from = match bytes.iter().position(|&b| b == b'\n') {
            Some(newline) if i == 0 && !whole => newline + 1,
            _ => 0,
        };
        text.extend_from_slice(&bytes[from..]);
    }
    let text = String::from_utf8_lossy(&text);
    let all: Vec<&str> = text.lines().collect();
    Ok(all[all.len().saturating_sub(lines)..].join("\n"))
}

/// The rotation of every service's log under one provider.
pub struct Logs {
    limits: Mutex<LogLimits>,
    /// Held by a rotation and by a removal, so a destroyed service's files
    /// are not made again by a rotation in flight.
    files: Mutex<()>,
    /// The task following the logs directory, and which directory.
    rotator: Mutex<Option<(PathBuf, AbortHandle)>>,
}

impl Logs {
    pub fn new(limits: LogLimits) -> Self {
        Logs {
            limits: Mutex::new(limits),
            files: Mutex::new(()),
            rotator: Mutex::new(None),
        }
    }

    pub fn limits(&self) -> LogLimits {
        *lock(&self.limits)
    }

    /// New limits, for the next rotation.
    pub fn set_limits(&self, limits: LogLimits) {
        *lock(&self.limits) = limits;
    }

    /// Rotates `log` if it is full (blocking file work).
    pub fn rotate(&self, log: &Path) -> io::Result<bool> {
        let _files = lock(&self.files);
        rotate_if_full(log, self.limits())
    }

    /// Removes `log` and its rotated files (blocking file work).
    pub fn remove(&self, log: &Path) -> io::Result<()> {
        let _files = lock(&self.files);
        remove_all(log)
    }

    /// Rotates the logs of `dir` from now on, as they are written (and those
    /// that grew while nobody watched, at once). Another directory than the
    /// one followed so far replaces it; the same one changes nothing.
    pub fn watch_dir(self: &Arc<Self>, dir: PathBuf) {
        let mut rotator = lock(&self.rotator);
        if rotator.as_ref().is_some_and(|(watched, _)| *watched == dir) {
            return;
        }
        if let Some((_, task)) = rotator.take() {
            task.abort();
        }
        let logs = self.clone();
        let watched = dir.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = rotate_on_writes(&logs, &watched).await {
                tracing::error!(dir = %watched.display(), %error, "logs are no longer rotated");
            }
        });
        *rotator = Some((dir, task.abort_handle()));
    }
}

impl Logs {
    /// Stops rotating (the provider is going away).
    pub fn stop(&self) {
        if let Some((_, task)) = lock(&self.rotator).take() {
            task.abort();
        }
    }
}

/// Follows `dir` through inotify and rotates each `*.log` written to once it
/// is full; everything after a queue overflow.
async fn rotate_on_writes(logs: &Arc<Logs>, dir: &Path) -> io::Result<()> {
    let fd = inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC)?;
    inotify::add_watch(&fd, dir, inotify::WatchFlags::MODIFY)?;
    let fd = crate::lifecycle::readable_fd(fd)?;
    sweep(logs, dir).await;
    let mut buffer = vec![MaybeUninit::<u8>::uninit(); 16 * 1024];
    loop {
        let mut ready = fd.readable().await?;
        let mut written = BTreeSet::new();
        let mut overflow = false;
        let mut reader = inotify::Reader::new(ready.get_inner(), &mut buffer);
        loop {
            match reader.next() {
                Ok(event) => {
                    overflow |= event.events().contains(inotify::ReadFlags::QUEUE_OVERFLOW);
                    let name = event.file_name().map(|n| OsStr::from_bytes(n.to_bytes()));
                    if let Some(name) = name.filter(|n| n.as_bytes().ends_with(b".log")) {
                        written.insert(dir.join(name));
                    }
                }
                Err(rustix::io::Errno::AGAIN) => break,
                Err(error) => return Err(error.into()),
            }
        }
        ready.clear_ready();
        if overflow {
            sweep(logs, dir).await;
            continue;
        }
        let logs = logs.clone();
        crate::lifecycle::blocking(move || {
            for log in written {
                rotate_logged(&logs, &log);
            }
        })
        .await;
    }
}

/// Rotates every full `*.log` of `dir`.
async fn sweep(logs: &Arc<Logs>, dir: &Path) {
    let (logs, dir) = (logs.clone(), dir.to_path_buf());
    crate::lifecycle::blocking(move || {
        let Ok(entries) = fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension() == Some(OsStr::new("log")) {
                rotate_logged(&logs, &path);
            }
        }
    })
    .await;
}

fn rotate_logged(logs: &Logs, log: &Path) {
    if let Err(error) = logs.rotate(log) {
        tracing::warn!(%error, "cannot rotate a service's log");
    }
}

fn remove_if_there(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(named(path, error)),
        _ => Ok(()),
    }
}

fn named(path: &Path, error: io::Error) -> io::Error {
    io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_bytes: u64, files: u32) -> LogLimits {
        LogLimits { max_bytes, files }
    }

    fn lines(from: usize, to: usize) -> String {
        (from..=to).map(|i| format!("line {i:03}\n")).collect()
    }

    #[test]
    fn a_full_log_keeps_its_last_whole_lines_and_older_files_move_up() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("a.log");
        fs::write(&log, lines(1, 10)).unwrap(); // 9 bytes a line
        assert!(
            !rotate_if_full(&log, limits(100, 2)).unwrap(),
            "90 bytes fit"
        );
        fs::write(&log, lines(1, 20)).unwrap();
        assert!(rotate_if_full(&log, limits(40, 2)).unwrap());
        assert_eq!(fs::read_to_string(&log).unwrap(), "");
        // The last 40 bytes start mid-line: the lines kept are whole.
        assert_eq!(fs::read_to_string(rotated(&log, 1)).unwrap(), lines(17, 20));
        fs::write(&log, lines(21, 30)).unwrap();
        assert!(rotate_if_full(&log, limits(40, 2)).unwrap());
        assert_eq!(fs::read_to_string(rotated(&log, 1)).unwrap(), lines(27, 30));
        assert_eq!(fs::read_to_string(rotated(&log, 2)).unwrap(), lines(17, 20));

        // The tail reaches across the files, newest last.
        fs::write(&log, lines(31, 32)).unwrap();
        assert_eq!(
            tail(&log, 3, 1 << 20).unwrap(),
            "line 030\nline 031\nline 032"
        );
        // Lines 21 to 26 went at the second rotation: past the bound.
        let seven = format!("line 020\n{}", lines(27, 32));
        assert_eq!(tail(&log, 7, 1 << 20).unwrap(), seven.trim_end());
        assert_eq!(tail(&log, 0, 1 << 20).unwrap(), "");
        // Bounded by bytes: 30 bytes hold three whole lines and a part.
        assert_eq!(tail(&log, 100, 30).unwrap(), lines(30, 32).trim_end());

        // Fewer files kept: the extra ones go at the next rotation.
        fs::write(&log, lines(1, 20)).unwrap();
        assert!(rotate_if_full(&log, limits(40, 1)).unwrap());
        assert!(!rotated(&log, 2).exists());
        // None kept: the log is only emptied.
        fs::write(&log, lines(1, 20)).unwrap();
        assert!(rotate_if_full(&log, limits(40, 0)).unwrap());
        assert!(!rotated(&log, 1).exists());
        assert_eq!(fs::metadata(&log).unwrap().len(), 0);

        remove_all(&log).unwrap();
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        assert!(!rotate_if_full(&log, limits(40, 1)).unwrap(), "missing");
    }

    #[test]
    fn an_appender_keeps_appending_at_the_new_end_after_a_truncate() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("b.log");
        let mut appender = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        appender.write_all(lines(1, 20).as_bytes()).unwrap();
        assert!(rotate_if_full(&log, limits(64, 1)).unwrap());
        appender.write_all(b"after\n").unwrap();
        assert_eq!(fs::read_to_string(&log).unwrap(), "after\n", "no hole");
    }
}
