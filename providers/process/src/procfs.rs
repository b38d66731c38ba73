//! What `/proc` says about a process: alive, which group, since when, and
//! which resource it was started for.
//!
//! A pid alone is not an identity: after a process exits its pid may be given
//! to another. A pid plus its start time (field 22 of `/proc/<pid>/stat`) is.
//! Every service is started with a tag in its environment, `name=value`, which
//! `/proc/<pid>/environ` shows (for processes of our own user), so a service
//! can be found even when no record names its pid.

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

/// The environment `pid` was started with: `NAME=value` entries, each ended
/// by a NUL. `None` if the process is gone or not ours to read.
pub fn environ(pid: i32) -> Option<Vec<u8>> {
    fs::read(format!("/proc/{pid}/environ")).ok()
}

/// Whether an environment block holds exactly the entry `name=value`.
pub fn environ_has(environ: &[u8], name: &str, value: &str) -> bool {
    let entry = format!("{name}={value}");
    environ
        .split(|&byte| byte == 0)
        .any(|found| found == entry.as_bytes())
}

/// A live process carrying a tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tagged {
    pub pid: i32,
    pub stat: Stat,
}

impl Tagged {
    /// Whether it leads its process group, as a spawned service does.
    pub fn leads_its_group(&self) -> bool {
        self.pid == self.stat.pgrp
    }
}

/// Live (non-zombie) processes, this one excepted, started with the
/// environment entry `name=value`; by pid.
pub fn tagged(name: &str, value: &str) -> Vec<Tagged> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id() as i32;
    let mut found: Vec<Tagged> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter(|&pid| environ(pid).is_some_and(|env| environ_has(&env, name, value)))
        .filter_map(|pid| {
            let stat = stat(pid).filter(|s| !s.is_dead())?;
            Some(Tagged { pid, stat })
        })
        .collect();
    found.sort_by_key(|t| t.pid);
    found
}

/// The process-group leader started with `name=value`: the service itself,
/// not one of its children. The earliest started if a child made itself a
/// leader too.
pub fn tagged_leader(name: &str, value: &str) -> Option<Tagged> {
    tagged(name, value)
        .into_iter()
        .filter(Tagged::leads_its_group)
        .min_by_key(|t| (t.stat.start_time, t.pid))
}

/// What a process has used, from `/proc/<pid>/stat` and `/proc/<pid>/status`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// Resident memory (`VmRSS`); `None` for a zombie, which has none.
    pub rss_bytes: Option<u64>,
    /// User plus system CPU time (fields 14 and 15 of `stat`).
    pub cpu_seconds: f64,
}

/// Fields 14 and 15 of a `stat` line: user and system time, in clock ticks.
pub fn parse_cpu_ticks(line: &str) -> Option<u64> {
    let after_name = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}

/// The `VmRSS` line of a `status` file, in bytes.
pub fn parse_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line["VmRSS:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// What `pid` has used, if it exists.
pub fn usage(pid: i32) -> Option<Usage> {
    let ticks = parse_cpu_ticks(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)?;
    let rss_bytes = fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| parse_rss_bytes(&status));
    Some(Usage {
        rss_bytes,
        cpu_seconds: ticks as f64 / clock_ticks() as f64,
    })
}

/// When a process that started `start_time` ticks after boot started, in
/// seconds since the Unix epoch (to the second: the boot time is).
pub fn started_at(start_time: u64) -> Option<u64> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let boot: u64 = stat
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(boot + start_time / clock_ticks())
}

/// Clock ticks a second (`USER_HZ`), the unit of `stat`'s times.
fn clock_ticks() -> u64 {
    // SAFETY: sysconf reads a constant of the C library; it touches no memory of ours.
    let hz = unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&hz| hz > 0).unwrap_or(100)
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
    fn cpu_time_and_resident_memory_are_read_from_their_fields() {
        let line =
            "4242 (a) b) S 1 4242 4242 0 -1 4194560 100 0 0 0 150 25 0 0 20 0 1 0 987654 1000 200";
        assert_eq!(parse_cpu_ticks(line), Some(175));
        assert_eq!(parse_cpu_ticks("1 (x) S 1"), None);
        let status = "Name:\tsleep\nVmPeak:\t   8000 kB\nVmRSS:\t    1536 kB\nThreads:\t1\n";
        assert_eq!(parse_rss_bytes(status), Some(1536 * 1024));
        assert_eq!(parse_rss_bytes("Name:\tzombie\n"), None);

        let me = std::process::id() as i32;
        let usage = usage(me).expect("our own usage");
        assert!(usage.rss_bytes.is_some_and(|rss| rss > 0), "{usage:?}");
        let started = started_at(stat(me).unwrap().start_time).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(
            started <= now + 1 && started + 3600 > now,
            "{started} vs {now}"
        );
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

    #[test]
    fn an_environment_entry_matches_only_whole() {
        let env = b"A=1\0CORBEL_RESOURCE_ID=web\0PATH=/bin\0";
        assert!(environ_has(env, "CORBEL_RESOURCE_ID", "web"));
        assert!(environ_has(env, "A", "1"));
        assert!(!environ_has(env, "CORBEL_RESOURCE_ID", "we"));
        assert!(!environ_has(env, "CORBEL_RESOURCE_ID", "web2"));
        assert!(!environ_has(env, "RESOURCE_ID", "web"));
        assert!(!environ_has(b"", "A", "1"));
    }

    /// A child killed and reaped when dropped, even if the test fails.
    struct Child(std::process::Child);

    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn sleeper(tag: &str, own_group: bool) -> Child {
        use std::os::unix::process::CommandExt;
        let mut command = std::process::Command::new("sleep");
        command.arg("30").env("CORBEL_TEST_TAG", tag);
        if own_group {
            command.process_group(0);
        }
        Child(command.spawn().expect("sleep starts"))
    }

    /// Polls `check` until it holds, for up to ten seconds.
    fn eventually(what: &str, check: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !check() {
            assert!(std::time::Instant::now() < deadline, "timed out: {what}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    #[test]
    fn a_tagged_child_is_found_by_its_tag_and_only_leaders_lead() {
        let tag = format!("procfs-test-{}", std::process::id());
        let leader = sleeper(&tag, true);
        let member = sleeper(&tag, false);
        let other = sleeper(&format!("{tag}-other"), true);
        let (leader_pid, member_pid) = (leader.0.id() as i32, member.0.id() as i32);
        // Until it has exec'd, a child shows its parent's environment.
        eventually("both children to show the tag", || {
            tagged("CORBEL_TEST_TAG", &tag).len() == 2
        });
        let found: Vec<i32> = tagged("CORBEL_TEST_TAG", &tag)
            .iter()
            .map(|t| t.pid)
            .collect();
        let mut expected = vec![leader_pid, member_pid];
        expected.sort();
        assert_eq!(found, expected);
        let lead = tagged_leader("CORBEL_TEST_TAG", &tag).expect("the leader");
        assert_eq!(lead.pid, leader_pid);
        assert_eq!(lead.stat.pgrp, leader_pid);
        assert!(tagged("CORBEL_TEST_TAG", &tag[..tag.len() - 1]).is_empty());

        // A killed one is no longer found, even before it is reaped.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(leader_pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        eventually("the killed leader to be gone", || {
            tagged_leader("CORBEL_TEST_TAG", &tag).is_none()
        });
        assert_eq!(
            tagged("CORBEL_TEST_TAG", &tag)
                .iter()
                .map(|t| t.pid)
                .collect::<Vec<_>>(),
            [member_pid]
        );
        drop((leader, member, other));
        assert!(tagged("CORBEL_TEST_TAG", &tag).is_empty());
    }
}
