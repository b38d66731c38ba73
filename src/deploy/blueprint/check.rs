//! Whole-blueprint checks (keys, defaults, the dependency graph, templates,
//! replicas, restart blocks), binding deploy variables, and reading a
//! resource's replicas.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::AtomicBool;

use serde_json::Value;

use super::graph::{Graph, dependency_problems_into};
use super::parse::{Listed, STOPPED};
use super::{
    Blueprint, Problem, Problems, Replicas, Resource, VarType, Variable, is_key, json_kind,
};
use crate::cpu::{NEVER, stopped};
use crate::deploy::template::{self, Context, MAX_DEPTH, Reference, snippet};

/// Declared variables by name.
type Variables<'b> = HashMap<&'b str, &'b Variable>;

/// Every structural problem in `bp`, in a stable order: keys, variable
/// defaults, `depends_on` and cycles, then templates and replicas, then
/// restart blocks. Empty means the blueprint can be bound and deployed. At
/// most `MAX_PROBLEMS` are listed, and the rest counted.
pub fn check(bp: &Blueprint) -> Vec<Problem> {
    check_until(bp, &NEVER)
}

/// [`check`], giving up once `stop` is set (between steps and resources).
/// Linear in the blueprint: lookups by map, paths built only for problems
/// that are listed, and one pass for every "depends on" question.
pub fn check_until(bp: &Blueprint, stop: &AtomicBool) -> Vec<Problem> {
    let mut listed = Listed::default();
    let variables: Variables<'_> = bp.variables.iter().map(|v| (v.name.as_str(), v)).collect();
    check_keys(bp, &mut listed);
    for v in &bp.variables {
        if let Some(default) = &v.default
            && !v.ty.accepts(default)
        {
            listed.add(|| {
                wrong_type(
                    &format!("variables.{}.default", snippet(&v.name)),
                    &v.name,
                    v.ty,
                    default,
                )
            });
        }
    }
    if !stopped(stop) {
        dependency_problems_into(bp, &mut listed);
    }
    if !stopped(stop) {
        check_templates(bp, &variables, &mut listed, stop);
    }
    for r in &bp.resources {
        let mut found = Vec::new();
        super::restart::check(r, &mut found);
        found.into_iter().for_each(|p| listed.push(p));
    }
    if stopped(stop) {
        return vec![Problem::new("", STOPPED)];
    }
    listed.into_vec()
}

fn check_keys(bp: &Blueprint, listed: &mut Listed) {
    let sections = [
        (
            "variables",
            bp.variables
                .iter()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>(),
        ),
        (
            "resources",
            bp.resources.iter().map(|r| r.key.as_str()).collect(),
        ),
        ("data", bp.data.iter().map(|d| d.key.as_str()).collect()),
    ];
    for (section, keys) in sections {
        let mut seen = HashSet::new();
        for key in keys {
            let path = || format!("{section}.{}", snippet(key));
            if !is_key(key) {
                let message = format!(
                    "key `{}` must be 1 to 64 characters of A-Z, a-z, 0-9, _ and -",
                    snippet(key)
                );
                listed.add(|| Problem::new(path(), message));
            } else if !seen.insert(key) {
                listed.add(|| Problem::new(path(), format!("`{key}` is declared twice")));
            }
        }
    }
}

fn check_templates(
    bp: &Blueprint,
    variables: &Variables<'_>,
    listed: &mut Listed,
    stop: &AtomicBool,
) {
    let graph = Graph::new(bp);
    // First every output reference to another resource, to ask the graph
    // once whether each is depended on; then the problems, with paths.
    let mut pairs = Vec::new();
    for (i, r) in bp.resources.iter().enumerate() {
        each_template(&r.config, &mut String::new(), 0, &mut |_, text| {
            for reference in template::references(text).unwrap_or_default() {
                if let Reference::Output { resource, .. } = reference
                    && let Some(&j) = graph.index.get(resource.as_str())
                    && j != i
                {
                    pairs.push((i, j));
                }
            }
        });
        if stopped(stop) {
            return;
        }
    }
    let answers = graph.depends(&pairs);
    let depended: HashSet<(usize, usize)> = pairs
        .into_iter()
        .zip(answers)
        .filter_map(|(pair, yes)| yes.then_some(pair))
        .collect();
    for (i, r) in bp.resources.iter().enumerate() {
        check_replicas(variables, r, listed);
        let mut path = format!("resources.{}.config", r.key);
        each_reference(&r.config, &mut path, listed, |reference| match reference {
            Reference::Variable(name) => unknown_variable(variables, name),
            Reference::Output { resource, .. } if *resource == r.key => {
                Some(format!("`{}` refers to its own outputs", r.key))
            }
            Reference::Output { resource, .. } => match graph.index.get(resource.as_str()) {
                None => Some(format!(
                    "refers to outputs of `{resource}`, which is not a resource in this blueprint"
                )),
                Some(&j) if !depended.contains(&(i, j)) => Some(format!(
                    "refers to outputs of `{resource}`, which `{}` does not depend on \
                     (add it to depends_on)",
                    r.key
                )),
                Some(_) => None,
            },
        });
        if stopped(stop) {
            return;
        }
    }
    for d in &bp.data {
        let mut path = format!("data.{}.config", d.key);
        each_reference(&d.config, &mut path, listed, |reference| match reference {
            Reference::Variable(name) => unknown_variable(variables, name),
            Reference::Output { resource, .. } => Some(format!(
                "data sources are read before resources are deployed, \
                 so they cannot refer to outputs of `{resource}`"
            )),
        });
    }
}

/// Calls `each(path, text)` for every string in `value` that holds a
/// template (`{{`), with its path below `path`. The path is one buffer,
/// grown on the way down and cut back on the way up, so a walk costs the
/// value's size, not its depth times its keys' length for every string.
/// Values deeper than `MAX_DEPTH` (which the parser refuses) are not walked.
fn each_template(value: &Value, path: &mut String, depth: usize, each: &mut dyn FnMut(&str, &str)) {
    if depth > MAX_DEPTH {
        return;
    }
    let len = path.len();
    match value {
        Value::String(text) if text.contains("{{") => each(path, text),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                use std::fmt::Write;
                let _ = write!(path, "[{i}]");
                each_template(item, path, depth + 1, each);
                path.truncate(len);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                each_template(item, path, depth + 1, each);
                path.truncate(len);
            }
        }
        Value::String(_) | Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// Runs `judge` on every template reference in `value`'s strings; a syntax
/// error or a message from `judge` becomes a problem at that string.
fn each_reference(
    value: &Value,
    base: &mut String,
    listed: &mut Listed,
    mut judge: impl FnMut(&Reference) -> Option<String>,
) {
    each_template(
        value,
        base,
        0,
        &mut |path, text| match template::references(text) {
            Err(e) => listed.add(|| Problem::new(path, e.to_string())),
            Ok(refs) => {
                for reference in &refs {
                    if let Some(message) = judge(reference) {
                        listed.add(|| Problem::new(path, message));
                    }
                }
            }
        },
    );
}

fn unknown_variable(variables: &Variables<'_>, name: &str) -> Option<String> {
    match variables.get(name) {
        Some(_) => None,
        None => Some(format!("refers to unknown variable `{name}`")),
    }
}

/// Fixed counts must not be negative; a template must be exactly one
/// `{{ variable }}` of type int, so the count is known from variables alone.
fn check_replicas(variables: &Variables<'_>, r: &Resource, listed: &mut Listed) {
    let path = format!("resources.{}.replicas", r.key);
    let message = match &r.replicas {
        Replicas::Fixed(n) if *n < 0 => Some(format!("must not be negative, not {n}")),
        Replicas::Fixed(_) => None,
        Replicas::Template(text) => match template::whole_reference(text) {
            Err(e) => Some(e.to_string()),
            Ok(None) => Some(format!(
                "`{}` is not an integer: write a number or one template such as \"{{{{ replicas }}}}\"",
                snippet(text)
            )),
            Ok(Some(Reference::Output { .. })) => {
                Some("replicas can refer only to a variable, not to resource outputs".to_owned())
            }
            Ok(Some(Reference::Variable(name))) => match variables.get(name.as_str()) {
                None => unknown_variable(variables, &name),
                Some(v) if v.ty != VarType::Int => Some(format!(
                    "refers to `{name}`, which is {}; replicas needs an int variable",
                    v.ty
                )),
                Some(v) => match v.default.as_ref() {
                    Some(d) if d.as_i64().is_some_and(|n| n < 0) => Some(format!(
                        "the default of `{name}` is {d}; replicas must not be negative"
                    )),
                    // An int above i64::MAX passes the type check but is no count.
                    Some(d) if d.is_u64() && d.as_i64().is_none() => Some(format!(
                        "the default of `{name}` is {d}; replicas must be at most {}",
                        i64::MAX
                    )),
                    _ => None,
                },
            },
        },
    };
    if let Some(message) = message {
        listed.add(|| Problem::new(path, message));
    }
}

/// The variables for a deploy: `given` values, then defaults. An undeclared
/// name, a missing required variable, or a value of the wrong type is a
/// problem at `variables.<name>`. A given `null` counts as not given.
pub fn bind(
    bp: &Blueprint,
    given: &serde_json::Map<String, Value>,
) -> Result<BTreeMap<String, Value>, Problems> {
    let mut listed = Listed::default();
    let variables: Variables<'_> = bp.variables.iter().map(|v| (v.name.as_str(), v)).collect();
    let mut declared: Option<String> = None;
    for name in given.keys() {
        if !variables.contains_key(name.as_str()) {
            let declared = declared.get_or_insert_with(|| {
                let names: Vec<&str> = bp.variables.iter().map(|v| v.name.as_str()).collect();
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    snippet(&names.join(", "))
                }
            });
            let message = format!("unknown variable `{}`; declared: {declared}", snippet(name));
            listed.add(|| Problem::new(format!("variables.{}", snippet(name)), message));
        }
    }
    let mut bound = BTreeMap::new();
    for v in &bp.variables {
        let path = format!("variables.{}", v.name);
        match (given.get(&v.name).filter(|g| !g.is_null()), &v.default) {
            (Some(value), _) if v.ty.accepts(value) => {
                bound.insert(v.name.clone(), value.clone());
            }
            (Some(value), _) => listed.push(wrong_type(&path, &v.name, v.ty, value)),
            (None, Some(default)) if v.ty.accepts(default) => {
                bound.insert(v.name.clone(), default.clone());
            }
            (None, Some(default)) => {
                listed.push(wrong_type(
                    &format!("{path}.default"),
                    &v.name,
                    v.ty,
                    default,
                ));
            }
            (None, None) => {
                let message = format!("`{}` ({}) is required and was not given", v.name, v.ty);
                listed.push(Problem::new(path, message));
            }
        }
    }
    Problems::check(listed.into_vec(), bound)
}

fn wrong_type(path: &str, name: &str, ty: VarType, value: &Value) -> Problem {
    let message = format!(
        "`{name}` is declared {ty} but the value is {}",
        json_kind(value)
    );
    Problem::new(path, message)
}

/// The replica count of `resource` with bound `variables`: a fixed count, or
/// its template rendered to an integer ≥ 0.
pub fn replicas(resource: &Resource, variables: &BTreeMap<String, Value>) -> Result<i64, Problem> {
    let path = format!("resources.{}.replicas", resource.key);
    let text = match &resource.replicas {
        Replicas::Fixed(n) if *n >= 0 => return Ok(*n),
        Replicas::Fixed(n) => {
            return Err(Problem::new(path, format!("must not be negative, not {n}")));
        }
        Replicas::Template(text) => text,
    };
    let outputs = BTreeMap::new();
    let ctx = Context {
        variables,
        outputs: &outputs,
    };
    let value = template::render_str(text, &ctx).map_err(|e| Problem::new(&path, e.to_string()))?;
    match value.as_i64() {
        Some(n) if n >= 0 => Ok(n),
        _ => Err(Problem::new(
            path,
            format!(
                "`{}` renders to {}, not an integer ≥ 0",
                snippet(text),
                snippet(&value.to_string())
            ),
        )),
    }
}
