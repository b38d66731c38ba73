//! What `/proc` says about a process: alive, which group, since when.
//!
//! A pid alone is not an identity: after a process exits its pid may be given
//! to another. A pid plus its start time (field 22 of `/proc/<pid>/stat`) is.

use std::fs;

/// The fields of `/proc/<pid>/stat` this provider uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// R, S, D, Z (zombie), X (dead), ...
    pub state: char,
    /// Field 5: the process group.
    pub pgrp: i32,
    /// Field 22: start time, in clock ticks after boot.
    pub start_time: u64,
}

impl Stat {
    fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parses a `/proc/<pid>/stat` line. The command name (field 2) is in
/// parentheses and may itself hold spaces and parentheses, so fields are
/// counted from the last `)`.
pub fn parse_stat(line: &str) -> Option<Stat> {
    let after_name = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // fields[0] is field 3 (state), so field N is fields[N - 3].
    Some(Stat {
        state: fields.first()?.chars().next()?,
        pgrp: fields.get(5 - 3)?.parse().ok()?,
        start_time: fields.get(22 - 3)?.parse().ok()?,
    })
}

/// The stat of `pid`, if such a process exists.
pub fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// What became of a process recorded as `pid` started at `start_time`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Running,
    /// Exited (possibly a zombie waiting to be reaped) or never existed.
    Gone,
    /// The pid now belongs to another process.
    Reused,
}

pub fn liveness(pid: i32, start_time: u64) -> Liveness {
    match stat(pid) {
        None => Liveness::Gone,
        Some(stat) if stat.start_time != start_time => Liveness::Reused,
        Some(stat) if stat.is_dead() => Liveness::Gone,
        Some(_) => Liveness::Running,
    }
}

/// Live (non-zombie) processes in process group `pgid`.
pub fn group_members(pgid: i32) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| stat(pid).is_some_and(|s| s.pgrp == pgid && !s.is_dead()))
        .collect()
}

/// This machine's name, for the one node the provider reports.
pub fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .ok()
        .filter(|name| !name.is_empty())
        .or_else(|| nix::unistd::gethostname().ok()?.into_string().ok())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_counted_after_the_last_parenthesis() {
        let line = "4242 (we(ird) name)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 200";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: 'S',
                pgrp: 4242,
                start_time: 987654
            })
        );
        assert_eq!(parse_stat("12 (short) S 1"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_is_running_and_a_wrong_start_time_is_a_reused_pid() {
        let me = std::process::id() as i32;
        let stat = stat(me).expect("our own stat");
        assert_eq!(liveness(me, stat.start_time), Liveness::Running);
        assert_eq!(liveness(me, stat.start_time + 1), Liveness::Reused);
        assert!(group_members(stat.pgrp).contains(&me));
        assert!(!hostname().is_empty());
    }
}
