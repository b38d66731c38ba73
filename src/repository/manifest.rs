//! Element manifests: YAML (or JSON) with `name`, `version`, `resources`, and
//! optional `requirements`. Parsed with a size limit, through `crate::yaml`
//! (bounded in depth and in size after alias expansion).

use std::sync::atomic::AtomicBool;

use serde_json::Value;

use super::RepositoryError;
use crate::resolve::{Requirement, Version};

/// A checked manifest.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    pub name: String,
    pub version: Version,
    pub requirements: Vec<Requirement>,
    /// The whole document, as JSON.
    pub document: Value,
}

/// Parses YAML text (JSON is YAML too) and checks it. `origin` names the source
/// in errors (a file or a URL).
pub fn parse_yaml(text: &str, max_bytes: usize, origin: &str) -> Result<Manifest, RepositoryError> {
    parse_yaml_until(text, max_bytes, origin, &crate::cpu::NEVER)
}

/// [`parse_yaml`], giving up once `stop` is set (see `crate::cpu`).
pub fn parse_yaml_until(
    text: &str,
    max_bytes: usize,
    origin: &str,
    stop: &AtomicBool,
) -> Result<Manifest, RepositoryError> {
    if text.len() > max_bytes {
        return Err(RepositoryError::Manifest(format!(
            "{origin}: manifest is {} bytes, over the limit of {max_bytes}",
            text.len()
        )));
    }
    let document: Value = crate::yaml::from_str_until(text, origin, stop)
        .map_err(|e| RepositoryError::Manifest(e.to_string()))?;
    check(document, origin)
}

/// Checks a manifest given as JSON (`editElement`, uploads).
pub fn check(document: Value, origin: &str) -> Result<Manifest, RepositoryError> {
    let bad = |field: &str, problem: &str| {
        RepositoryError::Manifest(format!("{origin}: field `{field}`: {problem}"))
    };
    let Some(map) = document.as_object() else {
        return Err(RepositoryError::Manifest(format!(
            "{origin}: a manifest must be a mapping with name, version and resources"
        )));
    };
    let name = map
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("name", "missing or not a string"))?
        .to_owned();
    super::inventory::check_name(&name).map_err(|p| bad("name", &p))?;
    let (version_text, number) = match map.get("version") {
        Some(Value::String(s)) => (s.clone(), false),
        Some(Value::Number(n)) => (n.to_string(), true),
        _ => return Err(bad("version", "missing or not a string")),
    };
    let version: Version = version_text.parse().map_err(|e: crate::resolve::ResolveError| {
        if number {
            // `version: 1.0` is the YAML number 1.0, not a version.
            bad(
                "version",
                &format!("{e} (YAML read `{version_text}` as a number: write a MAJOR.MINOR.PATCH version, quoted if need be)"),
            )
        } else {
            bad("version", &e.to_string())
        }
    })?;
    match map.get("resources") {
        Some(Value::Object(_)) => {}
        Some(Value::Null) | None => {
            return Err(bad("resources", "missing (a mapping of resources)"));
        }
        Some(_) => return Err(bad("resources", "must be a mapping of resources")),
    }
    let requirements = requirements(&name, map.get("requirements"), origin)?;
    Ok(Manifest {
        name,
        version,
        requirements,
        document,
    })
}

/// `requirements: { dep: { from_version: "1.0.0", to_version: "2.0.0" } }`; a
/// dependency with no constraints (`dep: {}` or `dep: null`) accepts any version.
pub fn requirements(
    element: &str,
    value: Option<&Value>,
    origin: &str,
) -> Result<Vec<Requirement>, RepositoryError> {
    let map = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(map)) => map,
        Some(_) => {
            return Err(RepositoryError::Manifest(format!(
                "{origin}: field `requirements`: must be a mapping of element names"
            )));
        }
    };
    let mut out = Vec::with_capacity(map.len());
    for (dependency, constraints) in map {
        let pairs: Vec<(&str, String)> = match constraints {
            Value::Null => Vec::new(),
            Value::Object(keys) => keys
                .iter()
                .map(|(k, v)| {
                    let text = match v {
                        Value::String(s) => Ok(s.clone()),
                        Value::Number(n) => Ok(n.to_string()),
                        _ => Err(RepositoryError::Manifest(format!(
                            "{origin}: field `requirements.{dependency}.{k}`: must be a version string"
                        ))),
                    };
                    text.map(|t| (k.as_str(), t))
                })
                .collect::<Result<_, _>>()?,
            _ => {
                return Err(RepositoryError::Manifest(format!(
                    "{origin}: field `requirements.{dependency}`: must be a mapping of constraints"
                )));
            }
        };
        let requirement = Requirement::from_keys(
            element,
            dependency,
            pairs.iter().map(|(k, v)| (*k, v.as_str())),
        )
        .map_err(RepositoryError::Resolve)?;
        out.push(requirement);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_are_checked_field_by_field() {
        let good = "name: web\nversion: 1.2.0\nresources: {app: {type: process.v1.service}}\nrequirements:\n  core: {from_version: 0.1.0, to_version: 0.2.0}\n  db: {}\n";
        let m = parse_yaml(good, 1 << 20, "web.yaml").unwrap();
        assert_eq!(m.name, "web");
        assert_eq!(m.requirements.len(), 2);
        let cases = [
            ("- a\n- b\n", "must be a mapping"),
            ("name: web\nresources: {}\n", "field `version`"),
            (
                "name: web\nversion: 1.x\nresources: {}\n",
                "field `version`",
            ),
            ("name: web\nversion: 1.0.0\n", "field `resources`"),
            (
                "name: ../web\nversion: 1.0.0\nresources: {}\n",
                "field `name`",
            ),
            (
                "name: web\nversion: 1.0.0\nresources: {}\nrequirements: {core: {about: 1.0.0}}\n",
                "unknown key `about`",
            ),
            ("name: web\nversion: [\n", "not valid YAML"),
        ];
        for (text, hint) in cases {
            let err = parse_yaml(text, 1 << 20, "m.yaml").unwrap_err().to_string();
            assert!(err.contains(hint), "{text}: {err}");
        }
        assert!(
            parse_yaml(good, 10, "big.yaml")
                .unwrap_err()
                .to_string()
                .contains("over the limit")
        );
    }

    #[test]
    fn alias_bombs_are_refused() {
        let mut bomb = String::from(
            "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
        );
        let mut prev = 'a';
        for c in 'b'..='j' {
            bomb.push_str(&format!("{c}: &{c} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"));
            prev = c;
        }
        bomb.push_str("name: x\nversion: 1.0.0\nresources: {}\n");
        let err = parse_yaml(&bomb, 1 << 20, "bomb.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("bomb.yaml"), "{err}");
    }
}
