//! Templates inside blueprint strings, and rendering them with variables and
//! dependency outputs. Two forms only:
//!
//! - `{{ name }}` — a variable;
//! - `{{ resources.<key>.outputs.<field> }}` — an output of a resource.
//!
//! Whitespace inside the braces is optional. Rendering is plain text
//! substitution and never HTML-escapes: `<&>"'` come out as they went in. A
//! string that is exactly one template (nothing before or after the braces)
//! becomes the referenced value with its JSON type, so `"{{ replicas }}"` gives
//! an int and a list stays a list. Inside a larger string, strings are inserted
//! as they are and anything else as compact JSON (`2`, `true`, `null`,
//! `["a","b"]`).
//!
//! There is no escaping syntax: every `{{` opens a template, and `\{{` is a
//! backslash followed by a template. A literal `{{` cannot be written in a
//! blueprint string; pass it in through a variable instead. An unclosed `{{`, an
//! empty `{{ }}` or anything else inside the braces (filters, spaces in names,
//! other paths) is an error naming the text. Object keys are never templates.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

use super::blueprint::{Problem, is_key};

/// Values nested deeper than this are refused rather than walked.
pub const MAX_DEPTH: usize = 128;
/// The most bytes one `render` call may produce (strings and copied values), so
/// a small blueprint cannot multiply a large variable into gigabytes.
pub const MAX_RENDERED_BYTES: usize = 16 << 20;

/// What a template refers to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reference {
    Variable(String),
    Output { resource: String, field: String },
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reference::Variable(name) => f.write_str(name),
            Reference::Output { resource, field } => {
                write!(f, "resources.{resource}.outputs.{field}")
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("unclosed `{{{{` in `{text}`")]
    Unclosed { text: String },
    #[error("empty template `{text}`")]
    Empty { text: String },
    #[error(
        "`{text}` is not a template: write {{{{ variable }}}} or {{{{ resources.<key>.outputs.<field> }}}}"
    )]
    Invalid { text: String },
    #[error("unknown variable `{0}`")]
    UnknownVariable(String),
    #[error("no outputs from resource `{0}`")]
    NoOutputs(String),
    #[error("resource `{resource}` has no output `{field}`")]
    MissingOutput { resource: String, field: String },
    #[error("value is nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("rendered value is over the limit of {MAX_RENDERED_BYTES} bytes")]
    TooLarge,
}

/// What `render` substitutes from.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    pub variables: &'a BTreeMap<String, Value>,
    /// Resource key → that resource's outputs object.
    pub outputs: &'a BTreeMap<String, Value>,
}

enum Segment<'a> {
    Text(&'a str),
    Ref(Reference),
}

/// The references in `text`, in order (repeats included).
pub fn references(text: &str) -> Result<Vec<Reference>, TemplateError> {
    Ok(segments(text)?
        .into_iter()
        .filter_map(|s| match s {
            Segment::Ref(r) => Some(r),
            Segment::Text(_) => None,
        })
        .collect())
}

/// The reference when `text` is exactly one template, which renders typed.
pub fn whole_reference(text: &str) -> Result<Option<Reference>, TemplateError> {
    let mut segments = segments(text)?;
    Ok(match (segments.pop(), segments.is_empty()) {
        (Some(Segment::Ref(r)), true) => Some(r),
        _ => None,
    })
}

/// Every string in `value` (not object keys) with its path below `base`
/// (`base.key`, `base[0]`), in document order. Walks iteratively, so depth is
/// no danger here.
pub fn strings<'v>(value: &'v Value, base: &str) -> Vec<(String, &'v str)> {
    let mut out = Vec::new();
    let mut stack = vec![(base.to_owned(), value)];
    while let Some((path, value)) = stack.pop() {
        match value {
            Value::String(s) => out.push((path, s.as_str())),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate().rev() {
                    stack.push((format!("{path}[{i}]"), item));
                }
            }
            Value::Object(map) => {
                for (key, item) in map.iter().rev() {
                    stack.push((child(&path, key), item));
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    out
}

/// Renders every string in `value`. A problem's path is relative to `value`
/// (empty for the value itself); callers prefix where the value lives.
pub fn render(value: &Value, ctx: &Context<'_>) -> Result<Value, Problem> {
    let mut budget = MAX_RENDERED_BYTES;
    let mut path = String::new();
    render_at(value, ctx, &mut path, 0, &mut budget)
        .map_err(|error| Problem::new(path, error.to_string()))
}

/// Renders one string, typed when it is exactly one template.
pub fn render_str(text: &str, ctx: &Context<'_>) -> Result<Value, TemplateError> {
    let mut budget = MAX_RENDERED_BYTES;
    render_text(text, ctx, &mut budget)
}

/// On error `path` is left pointing at the failing string.
fn render_at(
    value: &Value,
    ctx: &Context<'_>,
    path: &mut String,
    depth: usize,
    budget: &mut usize,
) -> Result<Value, TemplateError> {
    if depth > MAX_DEPTH {
        return Err(TemplateError::TooDeep);
    }
    match value {
        Value::String(text) => render_text(text, ctx, budget),
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                out.push(render_at(item, ctx, path, depth + 1, budget)?);
                path.truncate(len);
            }
            Ok(Value::Array(out))
        }
        Value::Object(map) => {
            let mut out = serde_json::Map::new();
            for (key, item) in map {
                let len = path.len();
                if len > 0 {
                    path.push('.');
                }
                path.push_str(key);
                out.insert(key.clone(), render_at(item, ctx, path, depth + 1, budget)?);
                path.truncate(len);
            }
            Ok(Value::Object(out))
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => Ok(value.clone()),
    }
}

fn render_text(text: &str, ctx: &Context<'_>, budget: &mut usize) -> Result<Value, TemplateError> {
    let segments = segments(text)?;
    if let [Segment::Ref(reference)] = segments.as_slice() {
        let value = lookup(reference, ctx)?;
        spend(budget, size_of_json(value))?;
        return Ok(value.clone());
    }
    let mut out = String::new();
    for segment in &segments {
        match segment {
            Segment::Text(t) => out.push_str(t),
            Segment::Ref(reference) => match lookup(reference, ctx)? {
                Value::String(s) => out.push_str(s),
                other => {
                    spend(budget, size_of_json(other))?;
                    out.push_str(&other.to_string());
                }
            },
        }
        if out.len() > *budget {
            return Err(TemplateError::TooLarge);
        }
    }
    spend(budget, out.len())?;
    Ok(Value::String(out))
}

fn lookup<'c>(reference: &Reference, ctx: &Context<'c>) -> Result<&'c Value, TemplateError> {
    match reference {
        Reference::Variable(name) => ctx
            .variables
            .get(name)
            .ok_or_else(|| TemplateError::UnknownVariable(name.clone())),
        Reference::Output { resource, field } => ctx
            .outputs
            .get(resource)
            .ok_or_else(|| TemplateError::NoOutputs(resource.clone()))?
            .get(field)
            .ok_or_else(|| TemplateError::MissingOutput {
                resource: resource.clone(),
                field: field.clone(),
            }),
    }
}

fn spend(budget: &mut usize, bytes: usize) -> Result<(), TemplateError> {
    *budget = budget.checked_sub(bytes).ok_or(TemplateError::TooLarge)?;
    Ok(())
}

/// Roughly the bytes of `value` as JSON; iterative, so any depth is safe.
fn size_of_json(value: &Value) -> usize {
    let mut size = 0usize;
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        size = size.saturating_add(match value {
            Value::Null | Value::Bool(_) | Value::Number(_) => 8,
            Value::String(s) => s.len() + 2,
            Value::Array(items) => {
                stack.extend(items);
                2 + items.len()
            }
            Value::Object(map) => {
                stack.extend(map.values());
                2 + map.keys().map(|k| k.len() + 4).sum::<usize>()
            }
        });
    }
    size
}

fn segments(text: &str) -> Result<Vec<Segment<'_>>, TemplateError> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        if open > 0 {
            out.push(Segment::Text(&rest[..open]));
        }
        let inner_start = open + 2;
        let Some(close) = rest[inner_start..].find("}}") else {
            return Err(TemplateError::Unclosed {
                text: snippet(&rest[open..]),
            });
        };
        let end = inner_start + close + 2;
        let inner = &rest[inner_start..inner_start + close];
        out.push(Segment::Ref(reference(inner, &rest[open..end])?));
        rest = &rest[end..];
    }
    if !rest.is_empty() {
        out.push(Segment::Text(rest));
    }
    Ok(out)
}

fn reference(inner: &str, whole: &str) -> Result<Reference, TemplateError> {
    let name = inner.trim();
    if name.is_empty() {
        return Err(TemplateError::Empty {
            text: snippet(whole),
        });
    }
    let parts: Vec<&str> = name.split('.').collect();
    match parts.as_slice() {
        [variable] if is_key(variable) => Ok(Reference::Variable((*variable).to_owned())),
        ["resources", resource, "outputs", field] if is_key(resource) && is_key(field) => {
            Ok(Reference::Output {
                resource: (*resource).to_owned(),
                field: (*field).to_owned(),
            })
        }
        _ => Err(TemplateError::Invalid {
            text: snippet(whole),
        }),
    }
}

/// At most 80 characters of `text`, for messages.
pub fn snippet(text: &str) -> String {
    const MAX: usize = 80;
    match text.char_indices().nth(MAX) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests;
