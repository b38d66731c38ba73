//! A service's output, kept bounded: one file of its stdout and stderr,
//! `logs/<id>.log`, and up to `log_files` rotated ones, `<id>.log.1` (the
//! newest) to `<id>.log.<log_files>`.
//!
//! The service outlives the provider, so it writes to its file itself: the
//! file is opened `O_APPEND` at spawn and handed over as stdout and stderr.
//! No pipe, no reader that could die with the provider. The provider keeps
//! the files small from outside: [`Logs::watch_dir`] follows writes to the
//! logs directory through inotify and rotates a file once it passes
//! `log_max_bytes` ([`rotate_if_full`]): its front is cut off, the last
//! `log_max_bytes` of what was cut (from a line start) go to `<id>.log.1`,
//! the older rotated files move up one; the service's next append lands at
//! the file's new end.
//!
//! The race, and the bound. On ext4 and XFS the front is cut in whole blocks
//! by the file system, atomically with the service's appends: nothing is
//! lost, and under a block stays in the live file. Elsewhere the file is
//! copied, then truncated, and what the service appends between the two
//! (a few microseconds) is lost. A rotated file holds at most
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

/// Rotates `log` if it is over `limits.max_bytes`: its front cut off
/// ([`cut_front`]), the last `max_bytes` of what was cut (from the first line
/// start in them) to `<log>.1`, the rotated files up one (those past
/// `limits.files` removed). True if it rotated. A missing `log` is not an
/// error.
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
    let keep = if limits.files > 0 {
        limits.max_bytes
    } else {
        0
    };
    let cut = cut_front(&mut file, len, keep).map_err(|e| named(log, e))?;
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
        // Not half a line: from the first line that starts in what is kept.
        let from = match cut.bytes.iter().position(|&b| b == b'\n') {
            Some(newline) if cut.partial && newline + 1 < cut.bytes.len() => newline + 1,
            _ => 0,
        };
        let tmp = rotating(log);
        File::create(&tmp)
            .and_then(|mut out| out.write_all(&cut.bytes[from..]))
            .map_err(|e| named(&tmp, e))?;
        fs::rename(&tmp, rotated(log, 1)).map_err(|e| named(&tmp, e))?;
    }
    Ok(true)
}

/// What [`cut_front`] took off a log: its last bytes, and whether they are
/// only part of it (so may start mid-line).
struct Cut {
    bytes: Vec<u8>,
    partial: bool,
}

/// Takes the front off `file` (`len` bytes long when looked at) and gives
/// back its last `keep` bytes, while the service may be appending.
///
/// Whole blocks go with `fallocate(FALLOC_FL_COLLAPSE_RANGE)` (ext4, XFS):
/// the file system does it under the same lock as an append, so nothing the
/// service writes is lost; the rest of the last block, under one block,
/// stays in the log. Where that cannot be done (another file system, or a
/// log under one block) the log is copied, then truncated: what the service
/// appends between the last read and the truncate is lost.
fn cut_front(file: &mut File, len: u64, keep: u64) -> io::Result<Cut> {
    use std::os::unix::fs::MetadataExt;
    let block = file.metadata()?.blksize().max(1);
    let whole = (len - 1) / block * block;
    if whole > 0 {
        let start = whole.saturating_sub(keep);
        let mut bytes = Vec::with_capacity((whole - start) as usize);
        file.seek(SeekFrom::Start(start))?;
        (&mut *file).take(whole - start).read_to_end(&mut bytes)?;
        let collapse = rustix::fs::FallocateFlags::COLLAPSE_RANGE;
        match rustix::fs::fallocate(&*file, collapse, 0, whole) {
            Ok(()) => {
                let partial = start > 0;
                return Ok(Cut { bytes, partial });
            }
            // Not this file system, or not this alignment: copy, then truncate.
            Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::INVAL) => {}
            Err(error) => return Err(error.into()),
        }
    }
    let start = len.saturating_sub(keep);
    let mut bytes = Vec::new();
    file.seek(SeekFrom::Start(start))?;
    file.read_to_end(&mut bytes)?;
    // As soon as the last read is done: the window of loss is these two calls.
    file.set_len(0)?;
    let over = bytes.len().saturating_sub(keep as usize);
    bytes.drain(..over);
    let partial = start > 0 || over > 0;
    Ok(Cut { bytes, partial })
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

    /// Whether this file system cuts whole blocks off a file's front.
    fn collapses(dir: &Path) -> bool {
        let probe = dir.join("probe");
        fs::write(&probe, vec![b'x'; 3 * 4096]).unwrap();
        let file = OpenOptions::new().write(true).open(&probe).unwrap();
        let flags = rustix::fs::FallocateFlags::COLLAPSE_RANGE;
        let block = std::os::unix::fs::MetadataExt::blksize(&file.metadata().unwrap());
        let collapsed = rustix::fs::fallocate(&file, flags, 0, block).is_ok();
        fs::remove_file(&probe).unwrap();
        collapsed
    }

    #[test]
    fn a_log_cut_while_its_service_appends_loses_no_line() {
        let dir = tempfile::tempdir().unwrap();
        if !collapses(dir.path()) {
            eprintln!("{}: no FALLOC_FL_COLLAPSE_RANGE here", dir.path().display());
            return;
        }
        let log = dir.path().join("c.log");
        let mut appender = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        const LINES: usize = 200_000;
        let writer = std::thread::spawn(move || {
            for i in 1..=LINES {
                appender
                    .write_all(format!("line {i}\n").as_bytes())
                    .unwrap();
            }
        });
        // Everything each cut took, in order, then what is left.
        let mut seen = Vec::new();
        let mut cuts = 0;
        let mut reader = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&log)
            .unwrap();
        while !writer.is_finished() {
            let len = reader.metadata().unwrap().len();
            if len > 8192 {
                let cut = cut_front(&mut reader, len, u64::MAX).unwrap();
                assert!(!cut.partial);
                seen.extend_from_slice(&cut.bytes);
                cuts += 1;
            }
        }
        writer.join().unwrap();
        seen.extend_from_slice(&fs::read(&log).unwrap());
        let seen = String::from_utf8(seen).unwrap();
        let numbers = seen
            .lines()
            .map(|l| l["line ".len()..].parse::<usize>().unwrap());
        assert!(
            numbers.eq(1..=LINES),
            "a line lost or doubled in {cuts} cuts"
        );
        assert!(cuts > 10, "only {cuts} cuts: the race was not run");
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
