//! What the benchmarks that run the real `corbel serve` binary share: starting
//! it on a random port and reading its address, stopping it, and reading its
//! memory and CPU time from `/proc`.

// Each bench uses the part it needs.
#![allow(dead_code)]

pub mod api;
pub mod profile;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};

/// A running `corbel serve`.
pub struct Server {
    pub child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
}

/// Starts `bin serve` on `127.0.0.1:0` with JSON logs and `data_dir`, after
/// `more` has added its flags and variables, and waits for the line that
/// announces the address. The rest of its log is read and dropped.
pub fn serve(bin: impl AsRef<OsStr>, data_dir: &Path, more: impl FnOnce(&mut Command)) -> Server {
    let mut command = Command::new(bin);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
        .arg("--data-dir")
        .arg(data_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    more(&mut command);
    let mut child = command.spawn().expect("corbel starts");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let addr = loop {
        let line = lines.next().expect("an address line").expect("utf-8");
        let log: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if let Some(url) = log["url"].as_str() {
            break url
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Server { child, addr }
}

impl Server {
    /// `field` of `/proc/<pid>/status` (`"VmRSS:"`, `"VmHWM:"`), in KiB.
    pub fn status_kib(&self, field: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("proc status")
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc status"))
    }

    /// Its user and system CPU time so far, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.child.id() as i32)
    }

    /// Starts its peak RSS (`VmHWM:`) again from its RSS now, so that the
    /// next reading is the peak since.
    pub fn reset_peak(&self) {
        // "5": reset the peak resident set size (proc(5), `clear_refs`).
        std::fs::write(format!("/proc/{}/clear_refs", self.child.id()), "5")
            .expect("proc clear_refs");
    }

    /// SIGTERM, then its exit.
    pub fn stop(mut self) -> ExitStatus {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().expect("wait")
    }
}

/// User and system CPU time of `pid` so far, in seconds.
pub fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("comm")
        .1
        .split_whitespace()
        .collect();
    // utime and stime: fields 14 and 15 of stat(5), 12 and 13 after the comm.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf reads a constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks as f64 / per_second
}

/// `/proc/loadavg`: the machine may be busy with more than the bench.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A bench that panics does not leave its server running.
impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
