use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

fn vars() -> BTreeMap<String, Value> {
    let v = json!({
        "name": "demo",
        "replicas": 3,
        "ratio": 0.5,
        "debug": true,
        "nothing": null,
        "tags": ["a", "b"],
        "labels": {"tier": "web"},
        "html": "<a href=\"x\">&'</a>",
    });
    serde_json::from_value(v).unwrap()
}

fn outputs() -> BTreeMap<String, Value> {
    serde_json::from_value(json!({"db": {"addr": "127.0.0.1:5432", "port": 5432}})).unwrap()
}

fn render_with(value: Value) -> Result<Value, Problem> {
    let (variables, outputs) = (vars(), outputs());
    render(
        &value,
        &Context {
            variables: &variables,
            outputs: &outputs,
        },
    )
}

#[test]
fn references_are_read_in_order() {
    let var = |n: &str| Reference::Variable(n.to_owned());
    let out = |r: &str, f: &str| Reference::Output {
        resource: r.to_owned(),
        field: f.to_owned(),
    };
    #[rustfmt::skip]
    let cases: Vec<(&str, Vec<Reference>)> = vec![
        ("plain text", vec![]),
        ("", vec![]),
        ("{{name}}", vec![var("name")]),
        ("{{   name\t}}", vec![var("name")]),
        ("a {{ x-1 }} b {{ y_2 }}", vec![var("x-1"), var("y_2")]),
        ("{{ resources.db.outputs.addr }}", vec![out("db", "addr")]),
        ("}} stray close {", vec![]),
        ("\\{{ name }}", vec![var("name")]),
        ("{{ a }}}", vec![var("a")]),
        // `resources` alone is an ordinary variable name.
        ("{{ resources }}", vec![var("resources")]),
    ];
    for (text, expected) in cases {
        assert_eq!(references(text).unwrap(), expected, "{text}");
    }
}

#[test]
fn malformed_templates_are_errors_naming_the_text() {
    #[rustfmt::skip]
    let cases = [
        ("x {{ name", "unclosed", "{{ name"),
        ("{{", "unclosed", "{{"),
        ("{{ }}", "empty", "{{ }}"),
        ("{{}}", "empty", "{{}}"),
        ("{{ name | upper }}", "not a template", "{{ name | upper }}"),
        ("{{ first name }}", "not a template", "{{ first name }}"),
        ("{{ resources.db.addr }}", "not a template", "resources.db.addr"),
        ("{{ resources.db.outputs }}", "not a template", "resources.db.outputs"),
        ("{{ data.image.outputs.id }}", "not a template", "data.image"),
        ("{{ resources.d b.outputs.x }}", "not a template", "d b"),
        ("{{ {x} }}", "not a template", "{x}"),
        ("{{{ x }}}", "not a template", "{ x"),
        ("{{ é }}", "not a template", "é"),
    ];
    for (text, kind, named) in cases {
        let message = references(text).unwrap_err().to_string();
        assert!(message.contains(kind), "{text}: {message}");
        assert!(message.contains(named), "{text}: {message}");
    }
    let long = format!("{{{{ {} }}}}", "x".repeat(500));
    let message = references(&long).unwrap_err().to_string();
    assert!(message.len() < 300, "long text is shortened: {message}");
}

#[test]
fn a_whole_template_keeps_the_json_type() {
    #[rustfmt::skip]
    let cases = [
        ("{{ replicas }}", json!(3)),
        ("{{replicas}}", json!(3)),
        ("{{ ratio }}", json!(0.5)),
        ("{{ debug }}", json!(true)),
        ("{{ nothing }}", json!(null)),
        ("{{ tags }}", json!(["a", "b"])),
        ("{{ labels }}", json!({"tier": "web"})),
        ("{{ resources.db.outputs.port }}", json!(5432)),
    ];
    for (text, expected) in cases {
        assert_eq!(render_with(json!(text)).unwrap(), expected, "{text}");
        assert!(whole_reference(text).unwrap().is_some(), "{text}");
    }
    assert_eq!(whole_reference(" {{ replicas }}").unwrap(), None);
}

#[test]
fn text_templates_insert_raw_text_and_compact_json() {
    #[rustfmt::skip]
    let cases = [
        ("n={{ replicas }}", "n=3"),
        ("{{ name }}-{{ replicas }}", "demo-3"),
        (" {{ replicas }} ", " 3 "),
        ("r={{ ratio }} d={{ debug }} z={{ nothing }}", "r=0.5 d=true z=null"),
        ("tags={{ tags }}", "tags=[\"a\",\"b\"]"),
        ("l={{ labels }}", "l={\"tier\":\"web\"}"),
        ("h={{ html }}", "h=<a href=\"x\">&'</a>"),
        ("serve --db {{ resources.db.outputs.addr }}", "serve --db 127.0.0.1:5432"),
        ("\\{{ name }}", "\\demo"),
        ("}} {", "}} {"),
    ];
    for (text, expected) in cases {
        assert_eq!(render_with(json!(text)).unwrap(), json!(expected), "{text}");
    }
}

#[test]
fn render_walks_nested_json_but_not_keys() {
    let value = json!({
        "command": "serve --name {{ name }}",
        "{{ name }}": "key stays",
        "args": ["--replicas", "{{ replicas }}", {"deep": ["{{ tags }}", 7, null, false]}],
        "plain": 1.5,
    });
    let expected = json!({
        "command": "serve --name demo",
        "{{ name }}": "key stays",
        "args": ["--replicas", 3, {"deep": [["a", "b"], 7, null, false]}],
        "plain": 1.5,
    });
    assert_eq!(render_with(value).unwrap(), expected);
}

#[test]
fn render_errors_name_the_reference_and_the_path() {
    #[rustfmt::skip]
    let cases = [
        (json!({"a": ["x", "{{ missing }}"]}), "a[1]", "unknown variable `missing`"),
        (json!({"b": "{{ resources.web.outputs.url }}"}), "b", "no outputs from resource `web`"),
        (json!({"c": {"d": "x{{ resources.db.outputs.user }}"}}), "c.d", "no output `user`"),
        (json!("{{ oops"), "", "unclosed"),
    ];
    for (value, path, needle) in cases {
        let problem = render_with(value).unwrap_err();
        assert_eq!(problem.path, path);
        assert!(problem.message.contains(needle), "{problem}");
    }
}

#[test]
fn render_refuses_runaway_sizes_and_depths() {
    let big: BTreeMap<String, Value> = [("big".to_owned(), json!("x".repeat(1 << 20)))].into();
    let outputs = BTreeMap::new();
    let ctx = Context {
        variables: &big,
        outputs: &outputs,
    };
    let many = Value::Array(vec![json!("{{ big }}{{ big }}"); 20]);
    assert!(
        render(&many, &ctx)
            .unwrap_err()
            .message
            .contains("over the limit")
    );
    let mut deep = json!("x");
    for _ in 0..200 {
        deep = json!([deep]);
    }
    assert!(render(&deep, &ctx).unwrap_err().message.contains("deeper"));
}

#[test]
fn strings_lists_every_string_with_its_path() {
    let value = json!({"a": "1", "b": [2, "3", {"c": "4"}]});
    let found: Vec<(String, &str)> = strings(&value, "resources.x.config");
    let expected = [
        ("resources.x.config.a", "1"),
        ("resources.x.config.b[1]", "3"),
        ("resources.x.config.b[2].c", "4"),
    ];
    let found: Vec<(&str, &str)> = found.iter().map(|(p, s)| (p.as_str(), *s)).collect();
    assert_eq!(found, expected);
}

/// JSON values whose strings hold no `{{`.
fn plain_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        any::<String>().prop_map(|s| Value::String(s.replace('{', "{ "))),
        "[{}a ]{0,8}".prop_map(|s| Value::String(s.replace('{', "{ "))),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn rendering_a_template_free_value_is_the_identity(value in plain_json()) {
        prop_assert_eq!(render_with(value.clone()).unwrap(), value);
    }

    #[test]
    fn references_never_panic(text in any::<String>(), braces in "[{} a.]{0,20}") {
        let _ = references(&text);
        let _ = references(&braces);
        let _ = render_with(Value::String(braces));
    }
}
