//! Dependency graph tests: cycle naming, order, dependents, provider-added
//! dependencies.

use serde_json::json;

use super::tests::assert_problem;
use super::*;

/// Resources `(key, depends_on)` in declaration order.
type Resources<'a> = &'a [(&'a str, &'a [&'a str])];

/// A blueprint of resources `(key, depends_on)` with no config.
pub(super) fn graph(resources: Resources<'_>) -> Blueprint {
    Blueprint {
        version: VERSION.to_owned(),
        variables: Vec::new(),
        resources: resources
            .iter()
            .map(|(key, deps)| Resource {
                key: (*key).to_owned(),
                resource_type: "t".to_owned(),
                provider: None,
                depends_on: deps.iter().map(|d| (*d).to_owned()).collect(),
                replicas: Replicas::Fixed(1),
                strategy: Strategy::Auto,
                restart: Restart::default(),
                config: json!({}),
            })
            .collect(),
        data: Vec::new(),
    }
}

#[test]
fn cycles_are_named_from_the_first_declared_member() {
    let bp = graph(&[
        ("x", &[]),
        ("c", &["a"]),
        ("a", &["b"]),
        ("b", &["c"]),
        ("y", &["x", "a"]),
    ]);
    let problems = check(&bp);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(problems[0].path, "resources.c.depends_on");
    assert_eq!(problems[0].message, "dependency cycle: c -> a -> b -> c");
    assert_eq!(
        order(&bp).unwrap_err().message,
        "dependency cycle: c -> a -> b -> c"
    );
    // Two separate cycles are both reported; the shortest way round is named.
    let bp = graph(&[
        ("a", &["b"]),
        ("b", &["c", "a"]),
        ("c", &["a"]),
        ("p", &["q"]),
        ("q", &["p"]),
    ]);
    let messages: Vec<String> = check(&bp).into_iter().map(|p| p.message).collect();
    assert_eq!(
        messages,
        [
            "dependency cycle: a -> b -> a",
            "dependency cycle: p -> q -> p"
        ]
    );
}

#[test]
fn order_puts_dependencies_first_and_breaks_ties_by_declaration() {
    #[rustfmt::skip]
    let cases: &[(Resources<'_>, &[&str])] = &[
        (&[], &[]),
        (&[("web", &["db"]), ("db", &[]), ("cache", &[])], &["db", "web", "cache"]),
        (&[("d", &["b", "c"]), ("c", &["a"]), ("b", &["a"]), ("a", &[])], &["a", "c", "b", "d"]),
        (&[("z", &[]), ("y", &["z"]), ("x", &[])], &["z", "y", "x"]),
    ];
    for (resources, expected) in cases {
        assert_eq!(
            order(&graph(resources)).unwrap(),
            *expected,
            "{resources:?}"
        );
    }
    let unknown = order(&graph(&[("a", &["ghost"])])).unwrap_err();
    assert_eq!(unknown.path, "resources.a.depends_on[0]");
    assert!(unknown.message.contains("`ghost`"));
    assert!(
        order(&graph(&[("a", &["a"])]))
            .unwrap_err()
            .message
            .contains("a -> a")
    );
}

#[test]
fn dependents_are_transitive_and_in_declaration_order() {
    let bp = graph(&[
        ("web", &["api"]),
        ("db", &[]),
        ("api", &["db"]),
        ("cron", &["db"]),
        ("lone", &[]),
    ]);
    assert_eq!(dependents(&bp, "db"), ["web", "api", "cron"]);
    assert_eq!(dependents(&bp, "api"), ["web"]);
    assert_eq!(dependents(&bp, "web"), Vec::<String>::new());
    assert_eq!(dependents(&bp, "ghost"), Vec::<String>::new());
}

#[test]
fn extra_dependencies_are_merged_and_rechecked() {
    let bp = graph(&[("a", &[]), ("b", &["a"]), ("c", &[])]);
    let extra = vec![
        ("c".to_owned(), vec!["b".to_owned(), "b".to_owned()]),
        ("b".to_owned(), vec!["a".to_owned()]),
    ];
    let merged = with_extra_dependencies(&bp, &extra).unwrap();
    assert_eq!(merged.resource("c").unwrap().depends_on, ["b"]);
    assert_eq!(merged.resource("b").unwrap().depends_on, ["a"]);
    assert_eq!(dependents(&merged, "a"), ["b", "c"]);
    #[rustfmt::skip]
    let cases = [
        (("ghost", "a"), "resources.ghost", "`ghost`"),
        (("a", "ghost"), "resources.a.depends_on", "`ghost`"),
        (("a", "a"), "resources.a.depends_on", "itself"),
        (("a", "b"), "resources.a.depends_on", "a -> b -> a"),
    ];
    for ((key, dep), path, needle) in cases {
        let extra = [(key.to_owned(), vec![dep.to_owned()])];
        let problems = with_extra_dependencies(&bp, &extra).unwrap_err().0;
        assert_problem(&problems, path, needle, &format!("{key} + {dep}"));
    }
}
