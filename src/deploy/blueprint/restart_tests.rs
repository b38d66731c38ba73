//! The `restart:` block: defaults, every key, each bad value's path and
//! message, and the same block in an element manifest's `resources`.

use std::time::Duration;

use serde_json::json;

use super::tests::assert_problem;
use super::*;

fn problems_of(yaml: &str) -> Vec<Problem> {
    match parse(yaml) {
        Ok(bp) => check(&bp),
        Err(problems) => problems.0,
    }
}

/// `web`'s restart block, parsed and checked clean.
fn restart_of(block: &str) -> Restart {
    let yaml = format!("resources:\n  web:\n    type: t\n    restart: {block}\n");
    let bp = parse(&yaml).unwrap_or_else(|p| panic!("{block}: {p}"));
    assert_eq!(check(&bp), Vec::new(), "{block}");
    bp.resource("web").unwrap().restart.clone()
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[test]
fn the_default_never_restarts() {
    let default = Restart::default();
    assert_eq!(
        default,
        Restart {
            policy: RestartPolicy::Never,
            attempts: 5,
            window: secs(600),
            delay: secs(1),
            max_delay: secs(300),
        }
    );
    let bp = parse("resources: {web: {type: t}}").unwrap();
    assert_eq!(bp.resource("web").unwrap().restart, default);
    assert_eq!(restart_of("null"), default);
    assert_eq!(restart_of("{}"), default);
    assert_eq!(
        restart_of("{policy: always}"),
        Restart {
            policy: RestartPolicy::Always,
            ..default
        }
    );
}

#[test]
fn every_key_is_read() {
    let restart =
        restart_of("{ policy: on-failure, attempts: 3, window: 1h, delay: 500ms, max_delay: 2m }");
    assert_eq!(
        restart,
        Restart {
            policy: RestartPolicy::OnFailure,
            attempts: 3,
            window: secs(3600),
            delay: Duration::from_millis(500),
            max_delay: secs(120),
        }
    );
    for policy in RestartPolicy::ALL {
        assert_eq!(restart_of(&format!("{{policy: {policy}}}")).policy, policy);
    }
    // A bare integer is seconds, as a number or as text.
    let bare = restart_of("{delay: 2, max_delay: \"30\", window: 600}");
    assert_eq!(
        (bare.delay, bare.max_delay, bare.window),
        (secs(2), secs(30), secs(600))
    );
    // The bounds themselves are fine.
    let edges = restart_of("{attempts: 1000, delay: 1ms, max_delay: 168h, window: 168h}");
    assert_eq!(edges.attempts, MAX_ATTEMPTS);
    assert_eq!(edges.max_delay, MAX_DURATION);
    assert_eq!(
        restart_of("{attempts: 1, delay: 10m, max_delay: 10m, window: 10m}").attempts,
        1
    );
}

#[test]
fn durations_read_and_refused() {
    for (text, millis) in [
        ("500ms", 500),
        ("1s", 1000),
        ("10m", 600_000),
        ("1h", 3_600_000),
        ("0s", 0),
        ("7", 7000),
        ("007s", 7000),
    ] {
        assert_eq!(
            parse_duration(text),
            Ok(Duration::from_millis(millis)),
            "{text}"
        );
    }
    for (text, needle) in [
        ("", "has no number"),
        ("s", "has no number"),
        ("1.5s", "is not a duration"),
        ("-1s", "is not a duration"),
        ("1d", "is not a duration"),
        ("1 s", "is not a duration"),
        ("1S", "is not a duration"),
        ("10mins", "is not a duration"),
        ("169h", "longer than the limit of 168h"),
        ("99999999999999999999999s", "longer than the limit"),
    ] {
        let message = parse_duration(text).unwrap_err();
        assert!(message.contains(needle), "{text:?}: {message}");
    }
}

#[test]
fn each_bad_value_is_named_at_its_path() {
    let base = "resources.web.restart";
    #[rustfmt::skip]
    let cases: &[(&str, &str, &str)] = &[
        ("[on-failure]", "", "must be a mapping of policy, attempts, window, delay and max_delay, not a list"),
        ("on-failure", "", "not a string"),
        ("{policy: sometimes}", "policy", "unknown policy `sometimes`; expected one of never, on-failure, always"),
        ("{policy: OnFailure}", "policy", "unknown policy `OnFailure`"),
        ("{policy: true}", "policy", "must be one of never, on-failure, always, not a boolean"),
        ("{attempts: -1}", "attempts", "must be an integer from 1 to 1000, not -1"),
        ("{attempts: 2.5}", "attempts", "not 2.5"),
        ("{attempts: \"5\"}", "attempts", "not \"5\""),
        ("{attempts: 4294967296}", "attempts", "not 4294967296"),
        ("{attempts: 0}", "attempts", "must be from 1 to 1000, not 0"),
        ("{attempts: 1001}", "attempts", "must be from 1 to 1000, not 1001"),
        ("{window: 10 minutes}", "window", "`10 minutes` is not a duration: write a whole number with a unit: ms, s, m or h"),
        ("{window: 1.5}", "window", "must be a duration, a whole number with a unit"),
        ("{window: -5}", "window", "not -5"),
        ("{window: [1s]}", "window", "not a list"),
        ("{window: 200h}", "window", "`200h` is longer than the limit of 168h"),
        ("{delay: 1d}", "delay", "`1d` is not a duration"),
        ("{delay: 0s}", "delay", "must be longer than 0"),
        ("{delay: 0}", "delay", "must be longer than 0"),
        ("{max_delay: ms}", "max_delay", "`ms` has no number"),
        ("{delay: 10s, max_delay: 5s}", "max_delay", "5s is shorter than delay (10s)"),
        ("{delay: 2m, window: 90s}", "window", "90s is shorter than delay (2m)"),
        ("{delay: 1500ms, window: 1s, max_delay: 1s}", "window", "1s is shorter than delay (1500ms)"),
    ];
    for (block, key, needle) in cases {
        let yaml = format!("resources:\n  web:\n    type: t\n    restart: {block}\n");
        let path = if key.is_empty() {
            base.to_owned()
        } else {
            format!("{base}.{key}")
        };
        assert_problem(&problems_of(&yaml), &path, needle, block);
    }
}

#[test]
fn unknown_keys_are_refused_with_the_known_ones() {
    let problems = problems_of("resources: {web: {type: t, restart: {policy: always, tries: 3}}}");
    assert_eq!(
        problems,
        [Problem::new(
            "resources.web.restart.tries",
            "unknown key `tries`; expected one of: policy, attempts, window, delay, max_delay"
        )]
    );
    // `restart` itself is a known key of a resource, listed with the others.
    let problems = problems_of("resources: {web: {type: t, restarts: {}}}");
    assert_problem(
        &problems,
        "resources.web.restarts",
        "strategy, restart, config",
        "restarts",
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let yaml = "resources:\n  web: {type: t, restart: {policy: x, attempts: -2, window: 1y, bogus: 1}}\n  \
                db: {type: t, restart: {delay: z}}\n";
    let problems = parse(yaml).unwrap_err().0;
    let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "resources.web.restart.bogus",
            "resources.web.restart.policy",
            "resources.web.restart.attempts",
            "resources.web.restart.window",
            "resources.db.restart.delay",
        ]
    );
    // Check's problems come together too, each at its own key.
    let yaml =
        "resources: {web: {type: t, restart: {attempts: 0, delay: 1m, max_delay: 1s, window: 2s}}}";
    let problems = problems_of(yaml);
    let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "resources.web.restart.attempts",
            "resources.web.restart.max_delay",
            "resources.web.restart.window",
        ]
    );
}

#[test]
fn a_manifest_resource_reads_restart_the_same() {
    let resources = json!({
        "app": {"type": "t", "restart": {"policy": "always", "attempts": 2, "window": "5m", "delay": 3}},
        "other": {"type": "t"},
    });
    let bp = parse_resources(&resources).unwrap();
    assert_eq!(check(&bp), Vec::new());
    assert_eq!(
        bp.resource("app").unwrap().restart,
        Restart {
            policy: RestartPolicy::Always,
            attempts: 2,
            window: secs(300),
            delay: secs(3),
            ..Restart::default()
        }
    );
    assert_eq!(bp.resource("other").unwrap().restart, Restart::default());
    let bad =
        json!({"app": {"type": "t", "restart": {"policy": "sometimes", "delay": "1w", "x": 1}}});
    let problems = parse_resources(&bad).unwrap_err().0;
    assert_problem(
        &problems,
        "resources.app.restart.policy",
        "unknown policy `sometimes`",
        "manifest",
    );
    assert_problem(
        &problems,
        "resources.app.restart.delay",
        "`1w` is not a duration",
        "manifest",
    );
    assert_problem(
        &problems,
        "resources.app.restart.x",
        "expected one of: policy,",
        "manifest",
    );
    let unsound = json!({"app": {"type": "t", "restart": {"delay": "1m", "max_delay": "1s"}}});
    let problems = check(&parse_resources(&unsound).unwrap());
    assert_problem(
        &problems,
        "resources.app.restart.max_delay",
        "shorter than delay (1m)",
        "manifest",
    );
}

#[test]
fn durations_are_shown_in_their_largest_whole_unit() {
    for (millis, shown) in [
        (0, "0s"),
        (1, "1ms"),
        (1500, "1500ms"),
        (2000, "2s"),
        (90_000, "90s"),
        (120_000, "2m"),
        (7_200_000, "2h"),
    ] {
        assert_eq!(show_duration(Duration::from_millis(millis)), shown);
    }
}
