//! YAML (or a manifest's JSON `resources`) into a `Blueprint`. Walks a
//! `serde_yaml_ng::Value` by hand rather than deriving, so that declaration
//! order survives (the YAML mapping is ordered), every unknown key and wrong
//! type is reported with its path, and all problems come back at once.

use serde_json::Value as Json;
use serde_yaml_ng::{Mapping, Value as Yaml};

use super::convert::{describe, json_to_yaml, key_text, kind, yaml_to_json};
use super::{
    Blueprint, DataSource, Problem, Problems, Replicas, Resource, Strategy, VERSION, VarType,
    Variable, join,
};
use crate::deploy::template::snippet;

/// Blueprint text over this size is refused before parsing.
pub const MAX_BYTES: usize = 1 << 20;

const TOP_KEYS: &[&str] = &["version", "variables", "resources", "data"];
const VARIABLE_KEYS: &[&str] = &["type", "default", "description"];
const RESOURCE_KEYS: &[&str] = &[
    "type",
    "provider",
    "depends_on",
    "replicas",
    "strategy",
    "config",
];
const DATA_KEYS: &[&str] = &["type", "provider", "config"];

/// Parses blueprint YAML (JSON is YAML too). Size, depth and size after alias
/// expansion are bounded by `crate::yaml` before anything is built, `<<` merge
/// keys are applied, and
/// unknown keys are errors everywhere but inside `config`.
pub fn parse(yaml: &str) -> Result<Blueprint, Problems> {
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
    let mut doc: Yaml =
        crate::yaml::from_str(yaml, "blueprint").map_err(|e| Problem::new("", e.to_string()))?;
    doc.apply_merge()
        .map_err(|e| Problem::new("", format!("bad YAML merge key (<<): {e}")))?;
    let mut reader = Reader::default();
    let blueprint = reader.blueprint(&doc);
    Problems::check(reader.problems, blueprint)
}

/// Parses the `resources` mapping of an element manifest: a blueprint with no
/// variables or data. Declaration order is the map's iteration order (sorted by
/// key unless serde_json's `preserve_order` is on). Paths start at `resources`.
pub fn parse_resources(value: &Json) -> Result<Blueprint, Problems> {
    let mut reader = Reader::default();
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
    Problems::check(reader.problems, blueprint)
}

#[derive(Default)]
struct Reader {
    problems: Vec<Problem>,
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

impl Reader {
    fn problem(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem::new(path, message));
    }

    /// A conversion's value; its problem, if it has one, is reported.
    fn reported<T>(&mut self, converted: Result<T, Problem>) -> Option<T> {
        converted.map_err(|p| self.problems.push(p)).ok()
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
            let config = self.config(fields.get("config"), &join(&path, "config"));
            out.push(Resource {
                key,
                resource_type: resource_type.unwrap_or_default(),
                provider,
                depends_on,
                replicas,
                strategy,
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

    /// Picks the `allowed` keys out of `map`; any other key is a problem.
    fn fields<'a>(&mut self, map: &'a Mapping, path: &str, allowed: &[&'static str]) -> Fields<'a> {
        let mut fields = Vec::new();
        for (key, value) in map {
            let text = key_text(key);
            match allowed.iter().find(|a| Some(**a) == text.as_deref()) {
                Some(name) => fields.push((*name, value)),
                None => {
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
