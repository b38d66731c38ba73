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
