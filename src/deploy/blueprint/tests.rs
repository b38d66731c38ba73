use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;

/// The example from DESIGN.md ("Blueprints and deployments").
const DESIGN_EXAMPLE: &str = r#"
version: "1"
variables:
  name: { type: string, default: demo }
  replicas: { type: int, default: 2 }
resources:
  db:
    type: process.v1.service          # the provider is found by resource type
    config: { command: "sleep 3600" }
  web:
    type: process.v1.service
    depends_on: [db]
    replicas: "{{ replicas }}"
    strategy: AUTO                     # AUTO | FILL | EACH | GLOBAL | DRAINED
    config: { command: "serve --db {{ resources.db.outputs.addr }}" }
data:
  image:
    type: docker.v1.image_lookup
    config: { name: alpine }
"#;

fn problems_of(yaml: &str) -> Vec<Problem> {
    match parse(yaml) {
        Ok(bp) => check(&bp),
        Err(problems) => problems.0,
    }
}

/// Asserts one of `problems` is at `path` and its message names `needle`.
pub(super) fn assert_problem(problems: &[Problem], path: &str, needle: &str, context: &str) {
    assert!(
        problems
            .iter()
            .any(|p| p.path == path && p.message.contains(needle)),
        "{context}\nexpected `{path}` naming `{needle}`, got: {problems:#?}"
    );
}

#[test]
fn the_design_example_parses_and_checks_clean() {
    let bp = parse(DESIGN_EXAMPLE).unwrap();
    assert_eq!(check(&bp), Vec::new());
    assert_eq!(bp.version, "1");
    let names: Vec<&str> = bp.variables.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["name", "replicas"]);
    assert_eq!(bp.variables[1].ty, VarType::Int);
    let web = bp.resource("web").unwrap();
    assert_eq!(web.depends_on, ["db"]);
    assert_eq!(
        web.replicas,
        Replicas::Template("{{ replicas }}".to_owned())
    );
    assert_eq!(web.strategy, Strategy::Auto);
    assert_eq!(bp.resource("db").unwrap().replicas, Replicas::Fixed(1));
    assert_eq!(bp.data[0].data_type, "docker.v1.image_lookup");
    assert_eq!(bp.data[0].config, json!({"name": "alpine"}));
    assert_eq!(order(&bp).unwrap(), ["db", "web"]);
    let vars = bind(&bp, &serde_json::Map::new()).unwrap();
    assert_eq!(replicas(web, &vars).unwrap(), 2);
}

#[test]
fn the_brief_example_with_every_field_parses() {
    let yaml = r#"
variables:
  name: { type: string, default: demo, description: "optional" }
  replicas: { type: int, default: 2 }
  debug: { type: bool }
resources:
  db:
    type: process.v1.service
    provider: process
    config: { command: "sleep 3600" }
  web:
    type: process.v1.service
    depends_on: [db]
    replicas: "{{ replicas }}"
    strategy: DRAINED
    config: { command: "serve --db {{ resources.db.outputs.addr }} --name {{ name }}" }
"#;
    let bp = parse(yaml).unwrap();
    assert_eq!(check(&bp), Vec::new());
    assert_eq!(bp.resources[0].provider.as_deref(), Some("process"));
    assert_eq!(bp.resources[1].strategy, Strategy::Drained);
    assert_eq!(bp.variables[0].description.as_deref(), Some("optional"));
    assert_eq!(bp.variables[2].default, None);
}

#[test]
fn declaration_order_is_kept() {
    let bp = parse("resources: {zeta: {type: t}, alpha: {type: t}, mid: {type: t}}").unwrap();
    let keys: Vec<&str> = bp.resources.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["zeta", "alpha", "mid"]);
    assert_eq!(order(&bp).unwrap(), ["zeta", "alpha", "mid"]);
}

#[test]
fn parse_problems_name_the_path() {
    #[rustfmt::skip]
    let cases = [
        ("", "", "mapping"),
        ("- a\n", "", "mapping"),
        ("resources: [\n", "", "not valid YAML"),
        ("resources: {a: {type: t}, a: {type: t}}", "", "duplicate"),
        ("version: \"2\"\nresources: {}", "version", "\"2\""),
        ("version: 1.5\nresources: {}", "version", "1.5"),
        ("variables: {}", "resources", "missing"),
        ("resources: {}\nextra: 1", "extra", "unknown key `extra`"),
        ("resources: []", "resources", "not a list"),
        ("resources: {web: 1}", "resources.web", "an integer"),
        ("resources: {web: {}}", "resources.web.type", "missing"),
        ("resources: {web: {type: 7}}", "resources.web.type", "string"),
        ("resources: {web: {type: t, dependson: [a]}}", "resources.web.dependson", "unknown key `dependson`"),
        ("resources: {web: {type: t, depends_on: db}}", "resources.web.depends_on", "list"),
        ("resources: {web: {type: t, depends_on: [db, 3]}}", "resources.web.depends_on[1]", "an integer"),
        ("resources: {web: {type: t, replicas: 1.5}}", "resources.web.replicas", "1.5"),
        ("resources: {web: {type: t, replicas: true}}", "resources.web.replicas", "true"),
        ("resources: {web: {type: t, strategy: auto}}", "resources.web.strategy", "`auto`"),
        ("resources: {web: {type: t, strategy: [FILL]}}", "resources.web.strategy", "a list"),
        ("resources: {web: {type: t, provider: \"\"}}", "resources.web.provider", "empty"),
        ("resources: {web: {type: t, config: [1]}}", "resources.web.config", "mapping"),
        ("resources: {web: {type: t, config: {a: [1, .nan]}}}", "resources.web.config.a[1]", "finite"),
        ("resources: {web: {type: t, config: {a: !custom 1}}}", "resources.web.config.a", "tags"),
        ("resources: {web: {type: t, config: {[1]: x}}}", "resources.web.config", "keys must be text"),
        ("resources: {}\nvariables: {x: {}}", "variables.x.type", "missing"),
        ("resources: {}\nvariables: {x: {type: integer}}", "variables.x.type", "`integer`"),
        ("resources: {}\nvariables: {x: {type: int, required: true}}", "variables.x.required", "unknown key `required`"),
        ("resources: {}\nvariables: {x: {type: int, description: 3}}", "variables.x.description", "string"),
        ("resources: {}\nvariables: [x]", "variables", "a list"),
        ("resources: {}\ndata: {img: {type: t, depends_on: [x]}}", "data.img.depends_on", "unknown key `depends_on`"),
        ("resources: {}\ndata: {img: {config: {}}}", "data.img.type", "missing"),
    ];
    for (yaml, path, needle) in cases {
        let problems = parse(yaml).expect_err(yaml).0;
        assert_problem(&problems, path, needle, yaml);
    }
}

#[test]
fn all_parse_problems_come_back_at_once() {
    let yaml = "resources: {a: {type: 1, bogus: 2}, b: {replicas: x, strategy: NONE}}\nfoo: 1";
    let problems = parse(yaml).unwrap_err().0;
    assert!(problems.len() >= 5, "{problems:#?}");
}

#[test]
fn merge_keys_apply_and_config_keeps_any_keys() {
    let yaml = "base: &base {type: t, strategy: FILL}\nresources:\n  a: {<<: *base, config: {anything: {goes: [1, true]}, 80: http}}\n";
    // `base` is an unknown top-level key, but the merge itself works.
    let problems = parse(yaml).unwrap_err().0;
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(problems[0].path, "base");
    let bp =
        parse("resources:\n  a: &a {type: t, strategy: FILL}\n  b: {<<: *a, config: {80: http}}\n")
            .unwrap();
    assert_eq!(bp.resources[1].strategy, Strategy::Fill);
    assert_eq!(bp.resources[1].config, json!({"80": "http"}));
}

#[test]
fn size_limits_and_alias_bombs_are_refused() {
    let big = format!("resources: {{}}\n#{}", "x".repeat(MAX_BYTES));
    assert!(
        parse(&big)
            .unwrap_err()
            .to_string()
            .contains("over the limit")
    );
    let mut bomb = String::from(
        "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    let mut prev = 'a';
    for c in 'b'..='j' {
        bomb.push_str(&format!(
            "{c}: &{c} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
        ));
        prev = c;
    }
    bomb.push_str("resources: {}\n");
    let problems = parse(&bomb).unwrap_err();
    assert!(problems.to_string().contains("YAML"), "{problems}");
    let deep = format!(
        "resources: {{a: {{type: t, config: {{x: {}{}}}}}}}",
        "[".repeat(300),
        "]".repeat(300)
    );
    assert!(parse(&deep).is_err());
}

#[test]
fn check_problems_name_the_path_and_the_thing() {
    let vars =
        "variables:\n  replicas: {type: int, default: 2}\n  name: {type: string, default: x}\n";
    #[rustfmt::skip]
    let cases = [
        ("resources: {web: {type: t, depends_on: [nope]}}", "resources.web.depends_on[0]", "`nope`"),
        ("resources: {web: {type: t, depends_on: [web]}}", "resources.web.depends_on[0]", "`web` depends on itself"),
        ("resources: {db: {type: t}, web: {type: t, depends_on: [db, db]}}", "resources.web.depends_on[1]", "`db` is listed twice"),
        ("resources: {a: {type: t, depends_on: [b]}, b: {type: t, depends_on: [a]}}", "resources.a.depends_on", "a -> b -> a"),
        ("resources: {web: {type: t, config: {c: \"{{ nope }}\"}}}", "resources.web.config.c", "`nope`"),
        ("resources: {web: {type: t, config: {c: [x, \"{{ nope\"]}}}", "resources.web.config.c[1]", "{{ nope"),
        ("resources: {web: {type: t, config: {c: \"{{ a | b }}\"}}}", "resources.web.config.c", "{{ a | b }}"),
        ("resources: {web: {type: t, config: {c: \"{{ resources.db.outputs.x }}\"}}}", "resources.web.config.c", "`db`, which is not a resource"),
        ("resources: {db: {type: t}, web: {type: t, config: {c: \"{{ resources.db.outputs.x }}\"}}}", "resources.web.config.c", "`db`, which `web` does not depend on"),
        ("resources: {web: {type: t, config: {c: \"{{ resources.web.outputs.x }}\"}}}", "resources.web.config.c", "`web` refers to its own outputs"),
        ("resources: {web: {type: t, replicas: -1}}", "resources.web.replicas", "-1"),
        ("resources: {web: {type: t, replicas: \"3\"}}", "resources.web.replicas", "`3` is not an integer"),
        ("resources: {web: {type: t, replicas: \"{{ nope }}\"}}", "resources.web.replicas", "`nope`"),
        ("resources: {web: {type: t, replicas: \"x{{ replicas }}\"}}", "resources.web.replicas", "x{{ replicas }}"),
        ("resources: {web: {type: t, replicas: \"{{ name }}\"}}", "resources.web.replicas", "`name`, which is string"),
        ("resources: {web: {type: t, replicas: \"{{ resources.db.outputs.n }}\"}}", "resources.web.replicas", "only to a variable"),
        ("variables: {n: {type: int, default: -2}}\nresources: {web: {type: t, replicas: \"{{ n }}\"}}", "resources.web.replicas", "`n` is -2"),
        ("variables: {n: {type: int, default: \"2\"}}\nresources: {}", "variables.n.default", "declared int but the value is string"),
        ("variables: {n: {type: int, default: 2.5}}\nresources: {}", "variables.n.default", "value is number"),
        ("variables: {n: {type: list, default: {}}}\nresources: {}", "variables.n.default", "declared list but the value is object"),
        ("variables: {n: {type: bool, default: 1}}\nresources: {}", "variables.n.default", "declared bool"),
        ("variables: {\"a b\": {type: int}}\nresources: {}", "variables.a b", "`a b`"),
        ("resources: {\"web.1\": {type: t}}", "resources.web.1", "`web.1`"),
        ("resources: {\"\": {type: t}}", "resources.", "1 to 64"),
        ("resources: {}\ndata: {\"x/y\": {type: t}}", "data.x/y", "`x/y`"),
        ("resources: {db: {type: t}}\ndata: {img: {type: t, config: {a: \"{{ resources.db.outputs.x }}\"}}}", "data.img.config.a", "`db`"),
        ("resources: {}\ndata: {img: {type: t, config: {a: \"{{ nope }}\"}}}", "data.img.config.a", "`nope`"),
    ];
    for (body, path, needle) in cases {
        let yaml = if body.starts_with("variables") {
            body.to_owned()
        } else {
            format!("{vars}{body}")
        };
        assert_problem(&problems_of(&yaml), path, needle, &yaml);
    }
    let long = format!("resources: {{{}: {{type: t}}}}", "k".repeat(65));
    assert_problem(
        &problems_of(&long),
        &format!("resources.{}", "k".repeat(65)),
        "1 to 64",
        "long key",
    );
}

#[test]
fn transitive_dependencies_may_be_referenced() {
    let yaml = "resources:\n  a: {type: t}\n  b: {type: t, depends_on: [a]}\n  c: {type: t, depends_on: [b], config: {x: \"{{ resources.a.outputs.addr }}\"}}\n";
    assert_eq!(problems_of(yaml), Vec::new());
}

#[test]
fn bind_applies_defaults_and_checks_types() {
    let bp = parse(
        "variables:\n  name: {type: string, default: demo}\n  replicas: {type: int, default: 2}\n  ratio: {type: number}\n  debug: {type: bool, default: false}\n  tags: {type: list, default: []}\n  labels: {type: object, default: {}}\nresources: {}\n",
    )
    .unwrap();
    let given = |v: Value| v.as_object().cloned().unwrap();
    let bound = bind(
        &bp,
        &given(json!({"ratio": 1, "replicas": 5, "name": null})),
    )
    .unwrap();
    let expected: BTreeMap<String, Value> = serde_json::from_value(json!({
        "name": "demo", "replicas": 5, "ratio": 1, "debug": false, "tags": [], "labels": {}
    }))
    .unwrap();
    assert_eq!(bound, expected);
    assert_eq!(
        bind(&bp, &given(json!({"ratio": 0.25}))).unwrap()["ratio"],
        json!(0.25)
    );
    #[rustfmt::skip]
    let cases = [
        (json!({}), "variables.ratio", "`ratio` (number) is required"),
        (json!({"ratio": 1, "replicas": 2.0}), "variables.replicas", "declared int but the value is number"),
        (json!({"ratio": 1, "replicas": "2"}), "variables.replicas", "declared int but the value is string"),
        (json!({"ratio": "1"}), "variables.ratio", "declared number but the value is string"),
        (json!({"ratio": 1, "debug": "true"}), "variables.debug", "declared bool but the value is string"),
        (json!({"ratio": 1, "tags": {}}), "variables.tags", "declared list but the value is object"),
        (json!({"ratio": 1, "labels": []}), "variables.labels", "declared object but the value is list"),
        (json!({"ratio": 1, "name": 7}), "variables.name", "declared string but the value is int"),
        (json!({"ratio": 1, "colour": "red"}), "variables.colour", "unknown variable `colour`"),
    ];
    for (given_value, path, needle) in cases {
        let problems = bind(&bp, &given(given_value.clone())).unwrap_err().0;
        assert_problem(&problems, path, needle, &given_value.to_string());
    }
    let problems = bind(&bp, &given(json!({"a": 1, "b": 2}))).unwrap_err().0;
    assert_eq!(
        problems.len(),
        3,
        "two unknown and one missing: {problems:#?}"
    );
}

#[test]
fn replicas_render_from_variables() {
    let resource = |replicas: Replicas| Resource {
        key: "web".to_owned(),
        resource_type: "t".to_owned(),
        provider: None,
        depends_on: Vec::new(),
        replicas,
        strategy: Strategy::Auto,
        restart: Restart::default(),
        config: json!({}),
    };
    let vars: BTreeMap<String, Value> =
        serde_json::from_value(json!({"n": 4, "neg": -1, "s": "3"})).unwrap();
    let template = |t: &str| resource(Replicas::Template(t.to_owned()));
    assert_eq!(replicas(&resource(Replicas::Fixed(0)), &vars).unwrap(), 0);
    assert_eq!(replicas(&template("{{ n }}"), &vars).unwrap(), 4);
    #[rustfmt::skip]
    let cases = [
        (resource(Replicas::Fixed(-3)), "-3"),
        (template("{{ neg }}"), "-1"),
        (template("{{ s }}"), "\"3\""),
        (template("{{ missing }}"), "`missing`"),
        (template("{{ n"), "unclosed"),
    ];
    for (r, needle) in cases {
        let problem = replicas(&r, &vars).unwrap_err();
        assert_eq!(problem.path, "resources.web.replicas");
        assert!(problem.message.contains(needle), "{problem}");
    }
}

/// Found by the blueprint fuzz target's property (a blueprint that checks
/// clean has its replicas): an int default above i64::MAX passed `check`, and
/// the deploy then failed on it.
#[test]
fn a_replicas_default_too_large_for_a_count_is_a_problem() {
    let yaml = "variables: {n: {type: int, default: 9223372036854775808}}\n\
                resources: {a: {type: t, replicas: \"{{ n }}\"}}\n";
    let bp = parse(yaml).unwrap();
    assert_problem(
        &check(&bp),
        "resources.a.replicas",
        "at most 9223372036854775807",
        yaml,
    );
    let fits = yaml.replace("9223372036854775808", "9223372036854775807");
    assert_eq!(check(&parse(&fits).unwrap()), Vec::new());
}

#[test]
fn a_manifest_resources_map_parses() {
    let resources = json!({
        "db": {"type": "process.v1.service", "config": {"command": "sleep 3600"}},
        "web": {"type": "process.v1.service", "depends_on": ["db"],
                "config": {"command": "serve --db {{ resources.db.outputs.addr }}"}},
    });
    let bp = parse_resources(&resources).unwrap();
    assert!(bp.variables.is_empty());
    assert_eq!(check(&bp), Vec::new());
    assert_eq!(order(&bp).unwrap(), ["db", "web"]);
    #[rustfmt::skip]
    let cases = [
        (json!([]), "resources", "a list"),
        (json!(null), "resources", "null"),
        (json!({"web": {"type": "t", "replicas": 1.5}}), "resources.web.replicas", "1.5"),
        (json!({"web": {"type": "t", "extra": 1}}), "resources.web.extra", "unknown key `extra`"),
    ];
    for (value, path, needle) in cases {
        let problems = parse_resources(&value).unwrap_err().0;
        assert_problem(&problems, path, needle, &value.to_string());
    }
    // Variables are not declared in a manifest, so templates naming one are flagged.
    let bp = parse_resources(&json!({"a": {"type": "t", "config": {"x": "{{ v }}"}}})).unwrap();
    assert_problem(
        &check(&bp),
        "resources.a.config.x",
        "`v`",
        "manifest variable",
    );
}

#[test]
fn problems_display_as_path_then_message() {
    let problems = Problems(vec![
        Problem::new("resources.a", "bad"),
        Problem::new("", "whole"),
    ]);
    assert_eq!(problems.to_string(), "resources.a: bad; whole");
}
