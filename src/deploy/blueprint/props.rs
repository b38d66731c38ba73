//! Properties: parsing never panics, `order` is a topological order, and
//! `check` finds a cycle exactly when a brute-force search does.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::strategy::Strategy as Gen;
use serde_json::{Value, json};

use crate::deploy::template::{Context, render};

use super::{
    Blueprint, Replicas, Resource, Restart, Strategy, VERSION, bind, check, dependents, order,
    parse, parse_resources, replicas, with_extra_dependencies,
};

/// Keys a blueprint uses, so random documents reach deep into the parser.
const WORDS: &[&str] = &[
    "version",
    "variables",
    "resources",
    "data",
    "type",
    "provider",
    "depends_on",
    "replicas",
    "strategy",
    "restart",
    "policy",
    "on-failure",
    "delay",
    "10m",
    "config",
    "default",
    "description",
    "a",
    "b",
    "web",
    "db",
    "int",
    "string",
    "AUTO",
    "FILL",
    "{{ a }}",
    "{{ resources.a.outputs.x }}",
    "{{",
    "1",
];

fn word() -> impl Gen<Value = String> {
    prop_oneof![
        3 => prop::sample::select(WORDS).prop_map(str::to_owned),
        1 => "[a-z{}. -]{0,6}",
    ]
}

/// YAML-ish documents: nested mappings and lists over blueprint words.
fn document() -> impl Gen<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-3i64..5).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-2.0f64..2.0).prop_map(Value::from),
        word().prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((word(), inner), 0..5)
                .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

/// Mostly well-formed blueprints with random dependencies, replicas and
/// templates, so checks, binding and rendering run on what parses.
fn blueprint_doc() -> impl Gen<Value = Value> {
    let key = prop::sample::select(&["a", "b", "web", "db", "x y"][..]);
    let text = prop_oneof![
        word(),
        Just("{{ a }}-{{ resources.db.outputs.addr }}".to_owned()),
        Just("{{ resources.a.outputs.x }}".to_owned()),
    ];
    let field = prop_oneof![
        text.clone()
            .prop_map(|t| ("config", json!({"c": t, "l": [t, 1]}))),
        prop::collection::vec(key.clone(), 0..3).prop_map(|d| ("depends_on", json!(d))),
        prop_oneof![
            (-2i64..4).prop_map(Value::from),
            text.prop_map(Value::String)
        ]
        .prop_map(|r| ("replicas", r)),
        prop::sample::select(&["AUTO", "EACH", "x"][..]).prop_map(|s| ("strategy", json!(s))),
        (
            prop::sample::select(&["never", "always", "on-failure", "x"][..]),
            prop::sample::select(&["0s", "1s", "500ms", "10m", "1h", "2", "x"][..]),
            prop::sample::select(&["1s", "5m", "200h", "30"][..]),
            0u32..3,
        )
            .prop_map(|(policy, delay, max_delay, attempts)| {
                let block = json!({"policy": policy, "delay": delay, "max_delay": max_delay,
                                   "attempts": attempts});
                ("restart", block)
            }),
        document().prop_map(|d| ("config", d)),
        (word(), document()).prop_map(|(_, d)| ("provider", d)),
    ];
    let resource = prop::collection::vec(field, 0..5).prop_map(|fields| {
        let mut map = serde_json::Map::from_iter([("type".to_owned(), json!("t"))]);
        map.extend(fields.into_iter().map(|(k, v)| (k.to_owned(), v)));
        Value::Object(map)
    });
    let variable = (
        prop::sample::select(&["int", "string", "list", "number"][..]),
        document(),
    )
        .prop_map(|(ty, default)| json!({"type": ty, "default": default}));
    (
        prop::collection::vec((key.clone(), resource), 0..5),
        prop::collection::vec((key, variable), 0..3),
    )
        .prop_map(|(resources, variables)| {
            let resources: serde_json::Map<String, Value> = resources
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
            let variables: serde_json::Map<String, Value> = variables
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
            json!({"variables": variables, "resources": resources})
        })
}

/// Everything downstream of parsing must not panic either.
fn exercise(bp: &Blueprint) {
    let _ = check(bp);
    let _ = order(bp);
    let vars = bind(bp, &serde_json::Map::new()).unwrap_or_default();
    for r in &bp.resources {
        let _ = replicas(r, &vars);
        let _ = dependents(bp, &r.key);
    }
    let extra: Vec<(String, Vec<String>)> = bp
        .resources
        .iter()
        .map(|r| (r.key.clone(), vec!["a".to_owned()]))
        .collect();
    let _ = with_extra_dependencies(bp, &extra);
    let outputs = BTreeMap::from([("db".to_owned(), json!({"addr": "h:1"}))]);
    let ctx = Context {
        variables: &vars,
        outputs: &outputs,
    };
    for r in &bp.resources {
        let _ = render(&r.config, &ctx);
    }
}

/// A blueprint of `n` resources named `r0..`, with an edge i → j when
/// `edges[i * n + j]`: resource i depends on j.
fn graph_blueprint(n: usize, edges: &[bool]) -> Blueprint {
    let resources = (0..n)
        .map(|i| Resource {
            key: format!("r{i}"),
            resource_type: "t".to_owned(),
            provider: None,
            depends_on: (0..n)
                .filter(|&j| edges[i * n + j])
                .map(|j| format!("r{j}"))
                .collect(),
            replicas: Replicas::Fixed(1),
            strategy: Strategy::Auto,
            restart: Restart::default(),
            config: json!({}),
        })
        .collect();
    Blueprint {
        version: VERSION.to_owned(),
        variables: Vec::new(),
        resources,
        data: Vec::new(),
    }
}

/// Brute force: is any resource reachable from itself?
fn has_cycle(n: usize, edges: &[bool]) -> bool {
    (0..n).any(|start| {
        let mut seen = vec![false; n];
        let mut stack = vec![start];
        while let Some(v) = stack.pop() {
            for w in (0..n).filter(|&w| edges[v * n + w]) {
                if w == start {
                    return true;
                }
                if !std::mem::replace(&mut seen[w], true) {
                    stack.push(w);
                }
            }
        }
        false
    })
}

fn small_graph() -> impl Gen<Value = (usize, Vec<bool>)> {
    (1usize..7).prop_flat_map(|n| {
        (
            Just(n),
            prop::collection::vec(prop::bool::weighted(0.25), n * n),
        )
    })
}

proptest! {
    #[test]
    fn parse_never_panics_on_text(text in any::<String>(), yamlish in "[a-z:{}\\[\\],&*!<| \n\"'-]{0,120}") {
        for input in [text, yamlish] {
            if let Ok(bp) = parse(&input) {
                exercise(&bp);
            }
        }
    }

    #[test]
    fn parse_never_panics_on_documents(doc in document()) {
        let yaml = serde_yaml_ng::to_string(&doc).unwrap();
        if let Ok(bp) = parse(&yaml) {
            exercise(&bp);
        }
        if let Ok(bp) = parse_resources(&doc) {
            exercise(&bp);
        }
        let wrapped = json!({"resources": doc});
        if let Ok(bp) = parse(&serde_yaml_ng::to_string(&wrapped).unwrap()) {
            exercise(&bp);
        }
    }

    #[test]
    fn parse_never_panics_on_blueprints(doc in blueprint_doc()) {
        let yaml = serde_yaml_ng::to_string(&doc).unwrap();
        if let Ok(bp) = parse(&yaml) {
            exercise(&bp);
        }
        if let Some(resources) = doc.get("resources") {
            let _ = parse_resources(resources).map(|bp| exercise(&bp));
        }
    }

    #[test]
    fn order_is_topological_for_acyclic_graphs(
        (n, edges, perm) in small_graph().prop_flat_map(|(n, edges)| {
            (Just(n), Just(edges), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
        })
    ) {
        // Keep only edges that go down a random ranking: acyclic, not sorted.
        let dag: Vec<bool> = (0..n * n).map(|k| edges[k] && perm[k / n] > perm[k % n]).collect();
        let bp = graph_blueprint(n, &dag);
        prop_assert_eq!(check(&bp), Vec::new());
        let order = order(&bp).unwrap();
        prop_assert_eq!(order.len(), n);
        let position = |key: &str| order.iter().position(|k| k == key).unwrap();
        for r in &bp.resources {
            for dep in &r.depends_on {
                prop_assert!(position(dep) < position(&r.key), "{} before {}", dep, r.key);
            }
        }
    }

    #[test]
    fn check_finds_a_cycle_exactly_when_one_exists((n, edges) in small_graph()) {
        let bp = graph_blueprint(n, &edges);
        let problems = check(&bp);
        let expected = has_cycle(n, &edges);
        let reported = problems
            .iter()
            .any(|p| p.message.starts_with("dependency cycle") || p.message.contains("depends on itself"));
        prop_assert_eq!(reported, expected, "{:?}", problems);
        prop_assert_eq!(order(&bp).is_err(), expected);
        // A named cycle is a real one: every step is an edge, and it closes.
        for p in problems.iter().filter(|p| p.message.starts_with("dependency cycle")) {
            let names: Vec<usize> = p.message["dependency cycle: ".len()..]
                .split(" -> ")
                .map(|k| k[1..].parse().unwrap())
                .collect();
            prop_assert!(names.len() >= 3 && names.first() == names.last());
            for step in names.windows(2) {
                prop_assert!(edges[step[0] * n + step[1]], "{} is not an edge path", p.message);
            }
        }
    }
}
