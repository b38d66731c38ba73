//! Whole-blueprint checks (keys, defaults, the dependency graph, templates,
//! replicas), binding deploy variables, and reading a resource's replicas.

use std::collections::{BTreeMap, HashSet};

use serde_json::Value;

use super::graph::{Graph, dependency_problems};
use super::{Blueprint, Problem, Problems, Replicas, Resource, VarType, is_key, json_kind};
use crate::deploy::template::{self, Context, Reference, snippet};

/// Every structural problem in `bp`, in a stable order: keys, variable
/// defaults, `depends_on` and cycles, then templates and replicas. Empty means
/// the blueprint can be bound and deployed.
pub fn check(bp: &Blueprint) -> Vec<Problem> {
    let mut problems = Vec::new();
    check_keys(bp, &mut problems);
    for v in &bp.variables {
        if let Some(default) = &v.default
            && !v.ty.accepts(default)
        {
            problems.push(wrong_type(
                &format!("variables.{}.default", v.name),
                &v.name,
                v.ty,
                default,
            ));
        }
    }
    problems.extend(dependency_problems(bp));
    check_templates(bp, &mut problems);
    problems
}

fn check_keys(bp: &Blueprint, problems: &mut Vec<Problem>) {
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
            let path = format!("{section}.{}", snippet(key));
            if !is_key(key) {
                let message = format!(
                    "key `{}` must be 1 to 64 characters of A-Z, a-z, 0-9, _ and -",
                    snippet(key)
                );
                problems.push(Problem::new(path, message));
            } else if !seen.insert(key) {
                problems.push(Problem::new(path, format!("`{key}` is declared twice")));
            }
        }
    }
}

fn check_templates(bp: &Blueprint, problems: &mut Vec<Problem>) {
    let graph = Graph::new(bp);
    for (i, r) in bp.resources.iter().enumerate() {
        check_replicas(bp, r, problems);
        // Computed on the first output reference only: most resources have none.
        let mut depends: Option<Vec<bool>> = None;
        let base = format!("resources.{}.config", r.key);
        each_reference(&r.config, &base, problems, |reference| match reference {
            Reference::Variable(name) => unknown_variable(bp, name),
            Reference::Output { resource, .. } if *resource == r.key => {
                Some(format!("`{}` refers to its own outputs", r.key))
            }
            Reference::Output { resource, .. } => match graph.index.get(resource.as_str()) {
                None => Some(format!(
                    "refers to outputs of `{resource}`, which is not a resource in this blueprint"
                )),
                Some(&j) if !depends.get_or_insert_with(|| graph.dependencies_of(i))[j] => {
                    Some(format!(
                        "refers to outputs of `{resource}`, which `{}` does not depend on \
                         (add it to depends_on)",
                        r.key
                    ))
                }
                Some(_) => None,
            },
        });
    }
    for d in &bp.data {
        let base = format!("data.{}.config", d.key);
        each_reference(&d.config, &base, problems, |reference| match reference {
            Reference::Variable(name) => unknown_variable(bp, name),
            Reference::Output { resource, .. } => Some(format!(
                "data sources are read before resources are deployed, \
                 so they cannot refer to outputs of `{resource}`"
            )),
        });
    }
}

/// Runs `judge` on every template reference in `value`'s strings; a syntax
/// error or a message from `judge` becomes a problem at that string.
fn each_reference(
    value: &Value,
    base: &str,
    problems: &mut Vec<Problem>,
    mut judge: impl FnMut(&Reference) -> Option<String>,
) {
    for (path, text) in template::strings(value, base) {
        match template::references(text) {
            Err(e) => problems.push(Problem::new(path, e.to_string())),
            Ok(refs) => {
                for reference in &refs {
                    if let Some(message) = judge(reference) {
                        problems.push(Problem::new(&path, message));
                    }
                }
            }
        }
    }
}

fn unknown_variable(bp: &Blueprint, name: &str) -> Option<String> {
    match bp.variable(name) {
        Some(_) => None,
        None => Some(format!("refers to unknown variable `{name}`")),
    }
}

/// Fixed counts must not be negative; a template must be exactly one
/// `{{ variable }}` of type int, so the count is known from variables alone.
fn check_replicas(bp: &Blueprint, r: &Resource, problems: &mut Vec<Problem>) {
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
            Ok(Some(Reference::Variable(name))) => match bp.variable(&name) {
                None => unknown_variable(bp, &name),
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
    problems.extend(message.map(|m| Problem::new(path, m)));
}

/// The variables for a deploy: `given` values, then defaults. An undeclared
/// name, a missing required variable, or a value of the wrong type is a
/// problem at `variables.<name>`. A given `null` counts as not given.
pub fn bind(
    bp: &Blueprint,
    given: &serde_json::Map<String, Value>,
) -> Result<BTreeMap<String, Value>, Problems> {
    let mut problems = Vec::new();
    for name in given.keys() {
        if bp.variable(name).is_none() {
            let declared: Vec<&str> = bp.variables.iter().map(|v| v.name.as_str()).collect();
            let declared = if declared.is_empty() {
                "none".to_owned()
            } else {
                declared.join(", ")
            };
            let message = format!("unknown variable `{}`; declared: {declared}", snippet(name));
            problems.push(Problem::new(
                format!("variables.{}", snippet(name)),
                message,
            ));
        }
    }
    let mut bound = BTreeMap::new();
    for v in &bp.variables {
        let path = format!("variables.{}", v.name);
        match (given.get(&v.name).filter(|g| !g.is_null()), &v.default) {
            (Some(value), _) if v.ty.accepts(value) => {
                bound.insert(v.name.clone(), value.clone());
            }
            (Some(value), _) => problems.push(wrong_type(&path, &v.name, v.ty, value)),
            (None, Some(default)) if v.ty.accepts(default) => {
                bound.insert(v.name.clone(), default.clone());
            }
            (None, Some(default)) => {
                problems.push(wrong_type(
                    &format!("{path}.default"),
                    &v.name,
                    v.ty,
                    default,
                ));
            }
            (None, None) => {
                let message = format!("`{}` ({}) is required and was not given", v.name, v.ty);
                problems.push(Problem::new(path, message));
            }
        }
    }
    Problems::check(problems, bound)
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
