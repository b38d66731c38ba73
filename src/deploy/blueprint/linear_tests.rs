//! Worst-case shapes read in time proportional to their size: the problems
//! they make are capped and counted, and what used to be asked per pair or
//! per problem is answered in one pass. (Times are in `benches/parse.rs`.)

use std::sync::atomic::AtomicBool;

use super::*;

fn problems_of(yaml: &str) -> Vec<Problem> {
    match parse(yaml) {
        Ok(bp) => check(&bp),
        Err(problems) => problems.0,
    }
}

#[test]
fn fifteen_thousand_unknown_keys_are_ten_problems_and_a_count() {
    let mut yaml = String::from("version: \"1\"\nresources: {}\n");
    for i in 0..15_000 {
        yaml.push_str(&format!("unknown_key_{i}: {i}\n"));
    }
    let problems = problems_of(&yaml);
    assert_eq!(problems.len(), MAX_UNKNOWN_KEYS + 1, "{problems:#?}");
    assert_eq!(problems[0].path, "unknown_key_0");
    assert!(
        problems[0]
            .message
            .starts_with("unknown key `unknown_key_0`")
    );
    let last = problems.last().unwrap();
    assert_eq!(last.path, "");
    assert!(
        last.message
            .starts_with("14990 more unknown keys are not listed"),
        "{last:?}"
    );
}

#[test]
fn problems_past_the_limit_are_counted_not_listed() {
    let mut yaml = String::from("resources:\n");
    for i in 0..300 {
        // Each resource: a wrong strategy, and a missing type.
        yaml.push_str(&format!("  r{i}: {{strategy: NOPE}}\n"));
    }
    let problems = problems_of(&yaml);
    assert_eq!(problems.len(), MAX_PROBLEMS + 1);
    assert_eq!(problems[0].path, "resources.r0.type");
    assert_eq!(
        problems[MAX_PROBLEMS].message,
        "500 more problems are not listed (the first 100 are)"
    );
    // The same cap holds for what `check` finds.
    let mut yaml = String::from("resources:\n");
    for i in 0..300 {
        yaml.push_str(&format!(
            "  r{i}: {{type: t, depends_on: [nowhere, r{i}]}}\n"
        ));
    }
    let problems = problems_of(&yaml);
    assert_eq!(problems.len(), MAX_PROBLEMS + 1);
    assert!(
        problems[MAX_PROBLEMS]
            .message
            .starts_with("500 more problems")
    );
}

#[test]
fn outputs_of_a_transitive_dependency_are_answered_for_every_resource_at_once() {
    // A chain of 3,000, each referring to the first one's outputs (a walk
    // per resource was quadratic); one also refers to a resource it does
    // not depend on, and a cycle still lets its members refer to each other.
    let mut yaml = String::from("resources:\n  r0: {type: t}\n");
    for i in 1..3_000 {
        yaml.push_str(&format!(
            "  r{i}: {{type: t, depends_on: [r{}], config: {{a: \"{{{{ resources.r0.outputs.x }}}}\"}}}}\n",
            i - 1
        ));
    }
    yaml.push_str("  late: {type: t, config: {a: \"{{ resources.r2999.outputs.x }}\"}}\n");
    yaml.push_str(
        "  c1: {type: t, depends_on: [c2, r5], config: {a: \"{{ resources.r0.outputs.x }}\"}}\n",
    );
    yaml.push_str(
        "  c2: {type: t, depends_on: [c1], config: {a: \"{{ resources.c1.outputs.x }}\"}}\n",
    );
    let problems = problems_of(&yaml);
    let about: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        about,
        ["resources.c1.depends_on", "resources.late.config.a"],
        "{problems:#?}"
    );
    assert!(
        problems[0]
            .message
            .starts_with("dependency cycle: c1 -> c2 -> c1")
    );
    assert!(
        problems[1]
            .message
            .contains("which `late` does not depend on")
    );
}

#[test]
fn long_keys_nested_deep_are_named_in_full_only_where_a_problem_is() {
    // Forty levels of 1,000-byte keys (YAML's most for a plain key) over
    // 2,000 strings: building every string's path would copy 80 MB.
    let key = "k".repeat(1000);
    let mut config = String::new();
    for _ in 0..40 {
        config.push_str(&format!("{{{key}: "));
    }
    let items: Vec<String> = (0..2_000).map(|i| format!("\"{{{{ v }}}}-{i}\"")).collect();
    config.push_str(&format!("[{}, \"{{{{ nope }}}}\"]", items.join(", ")));
    config.push_str(&"}".repeat(40));
    let yaml = format!(
        "variables: {{v: {{type: string}}}}\nresources:\n  a: {{type: t, config: {config}}}\n"
    );
    let problems = problems_of(&yaml);
    assert_eq!(problems.len(), 1, "{}", problems.len());
    let want = format!(
        "resources.a.config.{}[2000]",
        vec![key.as_str(); 40].join(".")
    );
    assert_eq!(problems[0].path, want);
    assert_eq!(problems[0].message, "refers to unknown variable `nope`");
}

#[test]
fn a_set_stop_flag_stops_parse_and_check() {
    let stop = AtomicBool::new(true);
    let yaml = "resources: {a: {type: t}}\n";
    let problems = parse_until(yaml, &stop).unwrap_err();
    assert!(
        problems.0[0].message.contains("its time ran out"),
        "{problems}"
    );
    let bp = parse(yaml).unwrap();
    assert_eq!(check_until(&bp, &stop)[0].message, parse::STOPPED);
    assert_eq!(check(&bp), Vec::new());
}
