//! YAML (or a manifest's JSON `resources`) into a `Blueprint`. Walks a
//! `serde_yaml_ng::Value` by hand rather than deriving, so that declaration
//! order survives (the YAML mapping is ordered), every unknown key and wrong
//! type is reported with its path, and all problems come back at once.

use std::sync::atomic::AtomicBool;

use serde_json::Value as Json;
use serde_yaml_ng::{Mapping, Value as Yaml};

use super::convert::{describe, json_to_yaml, key_text, kind, yaml_to_json};
use super::restart::{self, DURATION_FORM, MAX_ATTEMPTS};
use super::{
    Blueprint, DataSource, Problem, Problems, Replicas, Resource, Restart, RestartPolicy, Strategy,
    VERSION, VarType, Variable, join,
};
use crate::cpu::{NEVER, stopped};
use crate::deploy::template::snippet;

/// Blueprint text over this size is refused before parsing.
pub const MAX_BYTES: usize = 1 << 20;

/// At most this many problems are listed (by the parser, and again by
/// `check`); the rest are counted in one last problem. An author fixes the
/// first ones first, and a list of 15,000 would cost more than the document.
pub const MAX_PROBLEMS: usize = 100;

/// At most this many unknown keys of one mapping are listed; the rest are
/// counted in one problem at the mapping.
pub const MAX_UNKNOWN_KEYS: usize = 10;

/// What a parse or a check stopped by its caller answers.
pub(super) const STOPPED: &str = "stopped before the end: its time ran out";

const TOP_KEYS: &[&str] = &["version", "variables", "resources", "data"];
const VARIABLE_KEYS: &[&str] = &["type", "default", "description"];
const RESOURCE_KEYS: &[&str] = &[
    "type",
    "provider",
    "depends_on",
    "replicas",
    "strategy",
    "restart",
    "config",
];
const DATA_KEYS: &[&str] = &["type", "provider", "config"];

/// Parses blueprint YAML (JSON is YAML too). Size, depth and size after alias
/// expansion are bounded by `crate::yaml` before anything is built, `<<` merge
/// keys are applied, and
/// unknown keys are errors everywhere but inside `config`.
pub fn parse(yaml: &str) -> Result<Blueprint, Problems> {
    parse_until(yaml, &NEVER)
}

/// [`parse`], giving up once `stop` is set (its caller stopped waiting):
/// the flag is read as the text and each entry are read. Linear in the
/// text: every step reads each node a bounded number of times.
pub fn parse_until(yaml: &str, stop: &AtomicBool) -> Result<Blueprint, Problems> {
    if yaml.len() > MAX_BYTES {
        return Err(Problem::new(
            "",
            format!(
                "blueprint is {} bytes, over the limit of {MAX_BYTES}",
                yaml.len()
            ),
        )
        .into());
    }
    let mut doc: Yaml = crate::yaml::from_str_until(yaml, "blueprint", stop)
        .map_err(|e| Problem::new("", e.to_string()))?;
    doc.apply_merge()
        .map_err(|e| Problem::new("", format!("bad YAML merge key (<<): {e}")))?;
    let mut reader = Reader::new(stop);
    let blueprint = reader.blueprint(&doc);
    reader.finish(blueprint)
}

/// Parses the `resources` mapping of an element manifest: a blueprint with no
/// variables or data. Declaration order is the map's iteration order (sorted by
/// key unless serde_json's `preserve_order` is on). Paths start at `resources`.
pub fn parse_resources(value: &Json) -> Result<Blueprint, Problems> {
    let mut reader = Reader::new(&NEVER);
    let yaml = reader.reported(json_to_yaml(value, "resources", 0));
    let resources = match yaml {
        Some(yaml) => reader.resources(Some(&yaml)),
        None => Vec::new(),
    };
    let blueprint = Blueprint {
        version: VERSION.to_owned(),
        variables: Vec::new(),
        resources,
        data: Vec::new(),
    };
    reader.finish(blueprint)
}

/// Problems, at most [`MAX_PROBLEMS`] of them listed and the rest counted.
#[derive(Default)]
pub(super) struct Listed {
    pub(super) problems: Vec<Problem>,
    pub(super) more: usize,
}

impl Listed {
    pub(super) fn push(&mut self, problem: Problem) {
        self.add(|| problem);
    }

    /// Lists the problem `make` makes, or only counts it when the list is
    /// full (so a long path is never built for a problem not shown).
    pub(super) fn add(&mut self, make: impl FnOnce() -> Problem) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(make());
        } else {
            self.more += 1;
        }
    }

    /// The listed problems, and one that counts the others.
    pub(super) fn into_vec(mut self) -> Vec<Problem> {
        if self.more > 0 {
            let message = format!(
                "{} more problems are not listed (the first {MAX_PROBLEMS} are)",
                self.more
            );
            self.problems.push(Problem::new("", message));
        }
        self.problems
    }
}

struct Reader<'s> {
    listed: Listed,
    stop: &'s AtomicBool,
}

/// The known keys of one mapping, in the order of the `allowed` list.
struct Fields<'a>(Vec<(&'static str, &'a Yaml)>);

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a Yaml> {
        self.0
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .filter(|v| !v.is_null())
    }
}

impl<'s> Reader<'s> {
    fn new(stop: &'s AtomicBool) -> Reader<'s> {
        Reader {
            listed: Listed::default(),
            stop,
        }
    }

    fn problem(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.listed.push(Problem::new(path, message));
    }

    /// A conversion's value; its problem, if it has one, is reported.
    fn reported<T>(&mut self, converted: Result<T, Problem>) -> Option<T> {
        converted.map_err(|p| self.listed.push(p)).ok()
    }

    /// `value` if nothing was wrong (and the reading was not stopped).
    fn finish<T>(self, value: T) -> Result<T, Problems> {
        if stopped(self.stop) {
            return Err(Problem::new("", STOPPED).into());
        }
        Problems::check(self.listed.into_vec(), value)
    }

    fn blueprint(&mut self, doc: &Yaml) -> Blueprint {
        let mut blueprint = Blueprint {
            version: VERSION.to_owned(),
            variables: Vec::new(),
            resources: Vec::new(),
            data: Vec::new(),
        };
        let Some(map) = self.mapping(
            doc,
            "",
            "a mapping of version, variables, resources and data",
        ) else {
            return blueprint;
        };
        let fields = self.fields(map, "", TOP_KEYS);
        match fields.get("version") {
            None => {}
            Some(Yaml::String(v)) if v == VERSION => {}
            Some(Yaml::Number(n)) if n.as_u64() == Some(1) => {}
            Some(other) => self.problem(
                "version",
                format!(
                    "unsupported blueprint version {}; this server reads version \"{VERSION}\"",
                    describe(other)
                ),
            ),
        }
        blueprint.variables = self.variables(fields.get("variables"));
        blueprint.resources = self.resources(fields.get("resources"));
        blueprint.data = self.data(fields.get("data"));
        blueprint
    }

    fn variables(&mut self, value: Option<&Yaml>) -> Vec<Variable> {
        let mut out = Vec::new();
        for (name, path, map) in self.entries(value, "variables", "variable") {
            let fields = self.fields(map, &path, VARIABLE_KEYS);
            let type_path = join(&path, "type");
            let names = VarType::ALL.map(VarType::as_str).join(", ");
            let ty = match fields.get("type") {
                None => Err(format!("missing: one of {names}")),
                Some(Yaml::String(t)) => t
                    .parse::<VarType>()
                    .map_err(|_| format!("unknown type `{}`; expected one of {names}", snippet(t))),
                Some(other) => Err(format!("must be one of {names}, not {}", kind(other))),
            };
            let ty = ty.map_err(|message| self.problem(&type_path, message)).ok();
            let default = fields
                .get("default")
                .and_then(|d| self.reported(yaml_to_json(d, &join(&path, "default"), 0)));
            let description = self.string(fields.get("description"), &join(&path, "description"));
            if let Some(ty) = ty {
                out.push(Variable {
                    name,
                    ty,
                    default,
                    description,
                });
            }
        }
        out
    }

    pub(super) fn resources(&mut self, value: Option<&Yaml>) -> Vec<Resource> {
        if value.is_none() {
            self.problem(
                "resources",
                "missing: a blueprint needs a mapping of resources",
            );
        }
        let mut out = Vec::new();
        for (key, path, map) in self.entries(value, "resources", "resource") {
            let fields = self.fields(map, &path, RESOURCE_KEYS);
            let resource_type = self.required_string(fields.get("type"), &join(&path, "type"));
            let provider = self.string(fields.get("provider"), &join(&path, "provider"));
            let depends_on = self.depends_on(fields.get("depends_on"), &join(&path, "depends_on"));
            let replicas = self.replicas(fields.get("replicas"), &join(&path, "replicas"));
            let strategy = self.strategy(fields.get("strategy"), &join(&path, "strategy"));
            let restart = self.restart(fields.get("restart"), &join(&path, "restart"));
            let config = self.config(fields.get("config"), &join(&path, "config"));
            out.push(Resource {
                key,
                resource_type: resource_type.unwrap_or_default(),
                provider,
                depends_on,
                replicas,
                strategy,
                restart,
                config,
            });
        }
        out
    }

    fn data(&mut self, value: Option<&Yaml>) -> Vec<DataSource> {
        let mut out = Vec::new();
        for (key, path, map) in self.entries(value, "data", "data source") {
            let fields = self.fields(map, &path, DATA_KEYS);
            let data_type = self.required_string(fields.get("type"), &join(&path, "type"));
            let provider = self.string(fields.get("provider"), &join(&path, "provider"));
            let config = self.config(fields.get("config"), &join(&path, "config"));
            out.push(DataSource {
                key,
                data_type: data_type.unwrap_or_default(),
                provider,
                config,
            });
        }
        out
    }

    /// The entries of a keyed section (`variables`, `resources`, `data`), each
    /// of which must itself be a mapping. Null or absent is an empty section.
    fn entries<'a>(
        &mut self,
        value: Option<&'a Yaml>,
        section: &str,
        what: &str,
    ) -> Vec<(String, String, &'a Mapping)> {
        let Some(value) = value else {
            return Vec::new();
        };
        let Some(map) = self.mapping(value, section, &format!("a mapping of {what}s")) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (key, item) in map {
            if stopped(self.stop) {
                break;
            }
            let Some(key) = key_text(key) else {
                self.problem(
                    section,
                    format!("{what} keys must be text, not {}", kind(key)),
                );
                continue;
            };
            let path = join(section, &key);
            if let Some(item) =
                self.mapping(item, &path, &format!("a mapping (the {what}'s settings)"))
            {
                out.push((key, path, item));
            }
        }
        out
    }

    fn mapping<'a>(&mut self, value: &'a Yaml, path: &str, what: &str) -> Option<&'a Mapping> {
        match value {
            Yaml::Mapping(map) => Some(map),
            other => {
                self.problem(path, format!("must be {what}, not {}", kind(other)));
                None
            }
        }
    }

    /// Picks the `allowed` keys out of `map`; any other key is a problem,
    /// the first [`MAX_UNKNOWN_KEYS`] named and the rest counted.
    fn fields<'a>(&mut self, map: &'a Mapping, path: &str, allowed: &[&'static str]) -> Fields<'a> {
        let mut fields = Vec::new();
        let mut unknown = 0usize;
        for (key, value) in map {
            let known = match key {
                Yaml::String(text) => allowed.iter().find(|a| **a == text.as_str()),
                _ => None,
            };
            match known {
                Some(name) => fields.push((*name, value)),
                None if unknown >= MAX_UNKNOWN_KEYS => unknown += 1,
                None => {
                    unknown += 1;
                    let text = key_text(key);
                    let shown = text.unwrap_or_else(|| kind(key).to_owned());
                    let shown = snippet(&shown);
                    self.problem(
                        join(path, &shown),
                        format!(
                            "unknown key `{shown}`; expected one of: {}",
                            allowed.join(", ")
                        ),
                    );
                }
            }
        }
        if unknown > MAX_UNKNOWN_KEYS {
            self.problem(
                path,
                format!(
                    "{} more unknown keys are not listed (the first {MAX_UNKNOWN_KEYS} are); expected one of: {}",
                    unknown - MAX_UNKNOWN_KEYS,
                    allowed.join(", ")
                ),
            );
        }
        Fields(fields)
    }

    fn string(&mut self, value: Option<&Yaml>, path: &str) -> Option<String> {
        match value? {
            Yaml::String(s) if !s.is_empty() => Some(s.clone()),
            Yaml::String(_) => {
                self.problem(path, "must not be empty");
                None
            }
            other => {
                self.problem(path, format!("must be a string, not {}", kind(other)));
                None
            }
        }
    }

    fn required_string(&mut self, value: Option<&Yaml>, path: &str) -> Option<String> {
        if value.is_none() {
            self.problem(path, "missing");
        }
        self.string(value, path)
    }

    fn depends_on(&mut self, value: Option<&Yaml>, path: &str) -> Vec<String> {
        match value {
            None => Vec::new(),
            Some(Yaml::Sequence(items)) => items
                .iter()
                .enumerate()
                .filter_map(|(i, item)| match item {
                    Yaml::String(s) => Some(s.clone()),
                    other => {
                        let message = format!("must be a resource key, not {}", kind(other));
                        self.problem(format!("{path}[{i}]"), message);
                        None
                    }
                })
                .collect(),
            Some(other) => {
                let message = format!("must be a list of resource keys, not {}", kind(other));
                self.problem(path, message);
                Vec::new()
            }
        }
    }

    fn replicas(&mut self, value: Option<&Yaml>, path: &str) -> Replicas {
        match value {
            None => Replicas::default(),
            Some(Yaml::Number(n)) if n.as_i64().is_some() => {
                Replicas::Fixed(n.as_i64().unwrap_or_default())
            }
            Some(Yaml::String(s)) => Replicas::Template(s.clone()),
            Some(other) => {
                let message = format!(
                    "must be an integer or a template such as \"{{{{ replicas }}}}\", not {}",
                    describe(other)
                );
                self.problem(path, message);
                Replicas::default()
            }
        }
    }

    fn strategy(&mut self, value: Option<&Yaml>, path: &str) -> Strategy {
        let names = || Strategy::ALL.map(Strategy::as_str).join(", ");
        match value {
            None => Strategy::Auto,
            Some(Yaml::String(s)) => s.parse::<Strategy>().unwrap_or_else(|_| {
                let shown = snippet(s);
                self.problem(
                    path,
                    format!("unknown strategy `{shown}`; expected one of {}", names()),
                );
                Strategy::Auto
            }),
            Some(other) => {
                self.problem(
                    path,
                    format!("must be one of {}, not {}", names(), kind(other)),
                );
                Strategy::Auto
            }
        }
    }

    /// A `restart:` mapping; null or absent is the default (never restart).
    /// Each key left out keeps its default.
    fn restart(&mut self, value: Option<&Yaml>, path: &str) -> Restart {
        let mut restart = Restart::default();
        let Some(value) = value else {
            return restart;
        };
        let what = "a mapping of policy, attempts, window, delay and max_delay";
        let Some(map) = self.mapping(value, path, what) else {
            return restart;
        };
        let fields = self.fields(map, path, restart::KEYS);
        if let Some(policy) = self.policy(fields.get("policy"), &join(path, "policy")) {
            restart.policy = policy;
        }
        if let Some(value) = fields.get("attempts") {
            let count = match value {
                Yaml::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
                _ => None,
            };
            match count {
                Some(count) => restart.attempts = count,
                None => self.problem(
                    join(path, "attempts"),
                    format!(
                        "must be an integer from 1 to {MAX_ATTEMPTS}, not {}",
                        describe(value)
                    ),
                ),
            }
        }
        for (key, slot) in [
            ("window", &mut restart.window),
            ("delay", &mut restart.delay),
            ("max_delay", &mut restart.max_delay),
        ] {
            if let Some(value) = fields.get(key) {
                let read = match value {
                    Yaml::String(text) => restart::parse_duration(text),
                    Yaml::Number(n) if n.as_u64().is_some() => {
                        restart::parse_duration(&n.to_string())
                    }
                    other => Err(format!(
                        "must be a duration, {DURATION_FORM}; not {}",
                        describe(other)
                    )),
                };
                match read {
                    Ok(duration) => *slot = duration,
                    Err(message) => self.problem(join(path, key), message),
                }
            }
        }
        restart
    }

    fn policy(&mut self, value: Option<&Yaml>, path: &str) -> Option<RestartPolicy> {
        let names = || RestartPolicy::ALL.map(RestartPolicy::as_str).join(", ");
        let message = match value? {
            Yaml::String(s) => match s.parse::<RestartPolicy>() {
                Ok(policy) => return Some(policy),
                Err(_) => format!(
                    "unknown policy `{}`; expected one of {}",
                    snippet(s),
                    names()
                ),
            },
            other => format!("must be one of {}, not {}", names(), kind(other)),
        };
        self.problem(path, message);
        None
    }

    /// A `config` mapping as JSON; null or absent is `{}`.
    fn config(&mut self, value: Option<&Yaml>, path: &str) -> Json {
        match value {
            None => Json::Object(serde_json::Map::new()),
            Some(value @ Yaml::Mapping(_)) => self
                .reported(yaml_to_json(value, path, 0))
                .unwrap_or_else(|| Json::Object(serde_json::Map::new())),
            Some(other) => {
                self.problem(path, format!("must be a mapping, not {}", kind(other)));
                Json::Object(serde_json::Map::new())
            }
        }
    }
}
