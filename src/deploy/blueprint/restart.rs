//! A resource's `restart:` block: when the healer deploys a DOWN resource
//! again, how fast, and when it gives up. Durations are read here (`500ms`,
//! `1s`, `10m`, `1h`, or a bare integer of seconds); the parser refuses what
//! cannot be read, and `check` what can be read but makes no sense (no
//! attempts, no delay, a window shorter than one delay).

use std::time::Duration;

use super::{Problem, Resource};
use crate::deploy::template::snippet;
use crate::text::text_enum;

text_enum! {
    /// When the healer deploys a DOWN resource again.
    pub enum RestartPolicy {
        /// Never: a DOWN resource stays DOWN (the default).
        Never = "never",
        /// When it went DOWN with a failure, not a clean exit 0.
        OnFailure = "on-failure",
        /// Whenever it is DOWN.
        Always = "always",
    }
}

/// How a resource is healed. More than `attempts` restarts within `window`
/// is a crash loop: healing stops and the resource stays DOWN. Each restart
/// waits `delay`, doubled after each one up to `max_delay`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restart {
    pub policy: RestartPolicy,
    pub attempts: u32,
    pub window: Duration,
    pub delay: Duration,
    pub max_delay: Duration,
}

impl Default for Restart {
    fn default() -> Self {
        Restart {
            policy: RestartPolicy::Never,
            attempts: 5,
            window: Duration::from_secs(10 * 60),
            delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(5 * 60),
        }
    }
}

/// The keys of a `restart:` mapping, in the order they are documented.
pub(super) const KEYS: &[&str] = &["policy", "attempts", "window", "delay", "max_delay"];

/// `attempts` is at most this: more restarts than that is no longer healing.
pub const MAX_ATTEMPTS: u32 = 1000;

/// No duration of a `restart:` block may be longer (7 days).
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// What a duration looks like, for messages.
pub(super) const DURATION_FORM: &str =
    "a whole number with a unit: ms, s, m or h (500ms, 1s, 10m, 1h), or a bare integer of seconds";

/// Reads `500ms`, `1s`, `10m`, `1h`, or digits alone as seconds. The error
/// says what was wrong with `text`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let millis_per: u64 = match unit {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => {
            return Err(format!(
                "`{}` is not a duration: write {DURATION_FORM}",
                snippet(text)
            ));
        }
    };
    if number.is_empty() {
        return Err(format!(
            "`{}` has no number: write {DURATION_FORM}",
            snippet(text)
        ));
    }
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(millis_per))
        .map(Duration::from_millis)
        .filter(|d| *d <= MAX_DURATION)
        .ok_or_else(|| {
            format!(
                "`{}` is longer than the limit of {}",
                snippet(text),
                show_duration(MAX_DURATION)
            )
        })
}

/// A duration in the largest unit that writes it whole: `10m`, `1500ms`.
pub fn show_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    match ms {
        0 => "0s".to_owned(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

/// What is unsound in `resource`'s restart block, each at its key's path.
/// (The parser has refused what could not be read.)
pub(super) fn check(resource: &Resource, problems: &mut Vec<Problem>) {
    let r = &resource.restart;
    let path = |key: &str| format!("resources.{}.restart.{key}", resource.key);
    if !(1..=MAX_ATTEMPTS).contains(&r.attempts) {
        problems.push(Problem::new(
            path("attempts"),
            format!("must be from 1 to {MAX_ATTEMPTS}, not {}", r.attempts),
        ));
    }
    for (key, value) in [
        ("window", r.window),
        ("delay", r.delay),
        ("max_delay", r.max_delay),
    ] {
        if value > MAX_DURATION {
            problems.push(Problem::new(
                path(key),
                format!(
                    "{} is longer than the limit of {}",
                    show_duration(value),
                    show_duration(MAX_DURATION)
                ),
            ));
        }
    }
    if r.delay.is_zero() {
        problems.push(Problem::new(path("delay"), "must be longer than 0"));
        return;
    }
    if r.max_delay < r.delay {
        problems.push(Problem::new(
            path("max_delay"),
            format!(
                "{} is shorter than delay ({}): the backoff starts at delay and doubles up to max_delay",
                show_duration(r.max_delay),
                show_duration(r.delay)
            ),
        ));
    }
    if r.window < r.delay {
        problems.push(Problem::new(
            path("window"),
            format!(
                "{} is shorter than delay ({}): restarts are counted within the window",
                show_duration(r.window),
                show_duration(r.delay)
            ),
        ));
    }
}
