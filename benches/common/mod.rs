//! What the benchmarks that run the real `corbel serve` binary share: starting
//! it on a random port and reading its address, stopping it, and reading its
//! memory from `/proc`.

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

    /// SIGTERM, then its exit.
    pub fn stop(mut self) -> ExitStatus {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().expect("wait")
    }
}
