//! Conversions between the YAML tree the parser walks and the JSON values a
//! blueprint holds (`config`, defaults), reporting what JSON cannot carry (tags,
//! non-finite numbers, non-text keys) and refusing runaway nesting. Each
//! conversion stops at its first problem and returns it, for the parser to
//! add to the others it reports.

use serde_json::Value as Json;
use serde_yaml_ng::{Mapping, Value as Yaml};

use super::Problem;
use crate::deploy::template::{MAX_DEPTH, snippet};

/// YAML (at `path`, `depth` levels down) into JSON.
pub(super) fn yaml_to_json(value: &Yaml, path: &str, depth: usize) -> Result<Json, Problem> {
    to_json(value, &mut path.to_owned(), depth)
}

/// JSON into ordered YAML, so one walker serves both entry points.
pub(super) fn json_to_yaml(value: &Json, path: &str, depth: usize) -> Result<Yaml, Problem> {
    to_yaml(value, &mut path.to_owned(), depth)
}

/// Appends `.key` (or `key` at the root) to `path`, for one child.
fn push_key(path: &mut String, key: &str) {
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(key);
}

/// Appends `[i]` to `path`.
fn push_index(path: &mut String, i: usize) {
    use std::fmt::Write;
    let _ = write!(path, "[{i}]");
}

fn too_deep(path: &str) -> Problem {
    Problem::new(path, format!("nested deeper than {MAX_DEPTH} levels"))
}

// The path is one buffer, grown by a segment on the way down and cut back on
// the way up: building each node's path anew would cost its depth times its
// keys' length, quadratic for long keys nested deep.
fn to_json(value: &Yaml, path: &mut String, depth: usize) -> Result<Json, Problem> {
    if depth > MAX_DEPTH {
        return Err(too_deep(path));
    }
    Ok(match value {
        Yaml::Null => Json::Null,
        Yaml::Bool(b) => Json::Bool(*b),
        Yaml::Number(n) => {
            if let Some(i) = n.as_i64() {
                Json::from(i)
            } else if let Some(u) = n.as_u64() {
                Json::from(u)
            } else if let Some(f) = n.as_f64().and_then(serde_json::Number::from_f64) {
                Json::Number(f)
            } else {
                return Err(Problem::new(
                    path.as_str(),
                    format!("{n} is not a finite number"),
                ));
            }
        }
        Yaml::String(s) => Json::String(s.clone()),
        Yaml::Sequence(items) => {
            let mut out = Vec::with_capacity(items.len());
            let len = path.len();
            for (i, item) in items.iter().enumerate() {
                push_index(path, i);
                out.push(to_json(item, path, depth + 1)?);
                path.truncate(len);
            }
            Json::Array(out)
        }
        Yaml::Mapping(map) => {
            let mut out = serde_json::Map::new();
            let len = path.len();
            for (key, item) in map {
                let Some(key) = key_text(key) else {
                    return Err(Problem::new(
                        path.as_str(),
                        format!("keys must be text, not {}", kind(key)),
                    ));
                };
                push_key(path, &key);
                let item = to_json(item, path, depth + 1)?;
                path.truncate(len);
                out.insert(key, item);
            }
            Json::Object(out)
        }
        Yaml::Tagged(tagged) => {
            return Err(Problem::new(
                path.as_str(),
                format!("YAML tags are not supported (found {})", tagged.tag),
            ));
        }
    })
}

fn to_yaml(value: &Json, path: &mut String, depth: usize) -> Result<Yaml, Problem> {
    if depth > MAX_DEPTH {
        return Err(too_deep(path));
    }
    Ok(match value {
        Json::Null => Yaml::Null,
        Json::Bool(b) => Yaml::Bool(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Yaml::from(i),
            (None, Some(u), _) => Yaml::from(u),
            (None, None, Some(f)) => Yaml::from(f),
            (None, None, None) => Yaml::String(n.to_string()),
        },
        Json::String(s) => Yaml::String(s.clone()),
        Json::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            let len = path.len();
            for (i, item) in items.iter().enumerate() {
                push_index(path, i);
                out.push(to_yaml(item, path, depth + 1)?);
                path.truncate(len);
            }
            Yaml::Sequence(out)
        }
        Json::Object(map) => {
            let mut out = Mapping::with_capacity(map.len());
            let len = path.len();
            for (key, item) in map {
                push_key(path, key);
                let item = to_yaml(item, path, depth + 1)?;
                path.truncate(len);
                out.insert(Yaml::String(key.clone()), item);
            }
            Yaml::Mapping(out)
        }
    })
}

/// A mapping key as text: strings as they are, numbers and bools as written.
pub(super) fn key_text(key: &Yaml) -> Option<String> {
    match key {
        Yaml::String(s) => Some(s.clone()),
        Yaml::Number(n) => Some(n.to_string()),
        Yaml::Bool(b) => Some(b.to_string()),
        Yaml::Null | Yaml::Sequence(_) | Yaml::Mapping(_) | Yaml::Tagged(_) => None,
    }
}

pub(super) fn kind(value: &Yaml) -> &'static str {
    match value {
        Yaml::Null => "null",
        Yaml::Bool(_) => "a boolean",
        Yaml::Number(n) if n.is_f64() => "a non-integer number",
        Yaml::Number(_) => "an integer",
        Yaml::String(_) => "a string",
        Yaml::Sequence(_) => "a list",
        Yaml::Mapping(_) => "a mapping",
        Yaml::Tagged(_) => "a tagged value",
    }
}

/// A scalar shown with its value (`the string "2"`), anything else by kind.
pub(super) fn describe(value: &Yaml) -> String {
    match value {
        Yaml::String(s) => format!("\"{}\"", snippet(s)),
        Yaml::Number(n) => n.to_string(),
        Yaml::Bool(b) => b.to_string(),
        other => kind(other).to_owned(),
    }
}
