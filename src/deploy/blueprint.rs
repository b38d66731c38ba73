//! Blueprints: the YAML a deployment is made from (or the `resources` of an
//! element manifest), parsed into domain types, checked as a whole, and bound to
//! the variables a deploy is given. Pure code: no IO, no provider calls.
//!
//! The flow is `parse` (or `parse_resources`) → `check` → `bind` → `order`, with
//! `with_extra_dependencies` merging what providers add (`DescribeResources`) and
//! `replicas` reading a resource's count once variables are known. Every step
//! reports all the problems it finds, each with a dotted path into the document
//! (`resources.web.depends_on[0]`), so an author can fix them in one pass.
//!
//! Architecture invariant: parsing only builds the types and refuses malformed
//! input; whole-blueprint rules (graph, templates, defaults, key syntax) live in
//! `check`, which never stops at the first problem.

mod check;
mod convert;
mod graph;
mod parse;
mod restart;

#[cfg(test)]
mod graph_tests;
#[cfg(test)]
mod linear_tests;
#[cfg(test)]
mod props;
#[cfg(test)]
mod restart_tests;
#[cfg(test)]
mod tests;

use std::fmt;

use serde_json::Value;

use crate::text::text_enum;

/// Resources name their placement strategy with the planner's own type.
pub use super::strategy::Strategy;
pub use check::{bind, check, check_until, replicas};
pub use graph::{dependents, order, with_extra_dependencies};
pub use parse::{MAX_BYTES, MAX_PROBLEMS, MAX_UNKNOWN_KEYS, parse, parse_resources, parse_until};
pub use restart::{
    MAX_ATTEMPTS, MAX_DURATION, Restart, RestartPolicy, parse_duration, show_duration,
};

/// The only blueprint format version this server reads.
pub const VERSION: &str = "1";

/// A parsed blueprint. Lists keep declaration order, which breaks ties in
/// `order` and is the order problems are reported in.
#[derive(Clone, Debug, PartialEq)]
pub struct Blueprint {
    pub version: String,
    pub variables: Vec<Variable>,
    pub resources: Vec<Resource>,
    pub data: Vec<DataSource>,
}

impl Blueprint {
    pub fn resource(&self, key: &str) -> Option<&Resource> {
        self.resources.iter().find(|r| r.key == key)
    }

    pub fn variable(&self, name: &str) -> Option<&Variable> {
        self.variables.iter().find(|v| v.name == name)
    }
}

/// A declared variable. No default means the deploy must give a value.
#[derive(Clone, Debug, PartialEq)]
pub struct Variable {
    pub name: String,
    pub ty: VarType,
    /// `default: null` in YAML counts as no default.
    pub default: Option<Value>,
    pub description: Option<String>,
}

text_enum! {
    /// The type of a variable, checked at `check` (defaults) and `bind` (values).
    pub enum VarType {
        String = "string",
        /// JSON integers only: `2.0` is a number, not an int.
        Int = "int",
        /// Any JSON number.
        Number = "number",
        Bool = "bool",
        List = "list",
        Object = "object",
    }
}

impl VarType {
    /// Whether `value` is of this type.
    pub fn accepts(self, value: &Value) -> bool {
        match self {
            VarType::String => value.is_string(),
            VarType::Int => value.is_i64() || value.is_u64(),
            VarType::Number => value.is_number(),
            VarType::Bool => value.is_boolean(),
            VarType::List => value.is_array(),
            VarType::Object => value.is_object(),
        }
    }
}

/// The type name of a JSON value in the vocabulary of `VarType` (and `null`).
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_i64() || n.is_u64() => "int",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

/// A resource: one node of the deployment DAG.
#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    pub key: String,
    /// The provider is found by this type unless `provider` names one.
    pub resource_type: String,
    pub provider: Option<String>,
    /// Keys of resources that must be complete before this one starts.
    pub depends_on: Vec<String>,
    pub replicas: Replicas,
    /// `AUTO` when not given.
    pub strategy: Strategy,
    /// How the healer brings it back when it is DOWN; never, when not given.
    /// Not part of what a plan compares: changing it replaces nothing.
    pub restart: Restart,
    /// Provider configuration, a JSON object; strings may hold templates.
    pub config: Value,
}

/// How many instances to place; a template is read by `replicas()` once
/// variables are bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replicas {
    Fixed(i64),
    /// Must be a single `{{ variable }}` of type int (see `check`).
    Template(String),
}

impl Default for Replicas {
    fn default() -> Self {
        Replicas::Fixed(1)
    }
}

/// A data source: read through a provider (`RetrieveData`), never deployed.
#[derive(Clone, Debug, PartialEq)]
pub struct DataSource {
    pub key: String,
    pub data_type: String,
    pub provider: Option<String>,
    pub config: Value,
}

/// One thing wrong with a blueprint, at a dotted path into the document. An
/// empty path means the document as a whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl Problem {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for Problem {}

/// Every problem found, in document order. Never empty when returned as an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problems(pub Vec<Problem>);

impl Problems {
    pub fn iter(&self) -> std::slice::Iter<'_, Problem> {
        self.0.iter()
    }

    /// `Ok(value)` when `problems` is empty, else all of them.
    pub fn check<T>(problems: Vec<Problem>, value: T) -> Result<T, Problems> {
        if problems.is_empty() {
            Ok(value)
        } else {
            Err(Problems(problems))
        }
    }
}

impl From<Problem> for Problems {
    fn from(problem: Problem) -> Self {
        Problems(vec![problem])
    }
}

impl IntoIterator for Problems {
    type Item = Problem;
    type IntoIter = std::vec::IntoIter<Problem>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

/// Keys of variables, resources and data sources, and the names inside
/// templates: 1 to 64 of `A-Z a-z 0-9 _ -`.
pub fn is_key(text: &str) -> bool {
    (1..=64).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `base.key`, or `key` at the root.
fn join(base: &str, key: &str) -> String {
    if base.is_empty() {
        key.to_owned()
    } else {
        format!("{base}.{key}")
    }
}
