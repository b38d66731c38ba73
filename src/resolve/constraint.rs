//! Constraints on a dependency's version, as written in a manifest's `requirements`.

use std::fmt;

use super::ResolveError;
use super::version::Version;

/// A comparison operator of a [`Constraint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
}

impl Op {
    /// The manifest key for this operator, if `key` is one: `from_version` is
    /// `>=`, `to_version` is `<`, `version` is `==`, and the operators
    /// themselves are accepted as keys too.
    pub fn from_key(key: &str) -> Option<Op> {
        match key {
            "from_version" | ">=" => Some(Op::Ge),
            "to_version" | "<" => Some(Op::Lt),
            "version" | "==" => Some(Op::Eq),
            ">" => Some(Op::Gt),
            "<=" => Some(Op::Le),
            _ => None,
        }
    }

    pub fn symbol(self) -> &'static str {
        match self {
            Op::Gt => ">",
            Op::Ge => ">=",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Eq => "==",
        }
    }
}

/// One bound on a version, such as `>=0.1.0`.
///
/// Suffixed builds are compared like any other version (no special SemVer
/// pre-release exclusion): `<2.0.0` matches `2.0.0-rc.1`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Constraint {
    pub op: Op,
    pub version: Version,
}

impl Constraint {
    pub fn new(op: Op, version: Version) -> Self {
        Constraint { op, version }
    }

    pub fn matches(&self, candidate: &Version) -> bool {
        match self.op {
            Op::Gt => candidate > &self.version,
            Op::Ge => candidate >= &self.version,
            Op::Lt => candidate < &self.version,
            Op::Le => candidate <= &self.version,
            Op::Eq => candidate == &self.version,
        }
    }
}

impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.op.symbol(), self.version)
    }
}

/// A dependency on `name`, holding when all its constraints hold (none: any version).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    pub name: String,
    pub constraints: Vec<Constraint>,
}

impl Requirement {
    /// A requirement on `name` that any version satisfies.
    pub fn any(name: impl Into<String>) -> Self {
        Requirement {
            name: name.into(),
            constraints: Vec::new(),
        }
    }

    /// Builds the requirement of `element` on `dependency` from the key/version
    /// pairs of its manifest entry, e.g. `[("from_version", "0.1.0"),
    /// ("to_version", "0.2.0")]`.
    ///
    /// An unknown key is `DEPENDENCY_CONSTRAINT_FORMAT`; a malformed version is
    /// `VERSION`. Both name the element, the dependency and the key.
    pub fn from_keys<'a>(
        element: &str,
        dependency: &str,
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, ResolveError> {
        let constraints = pairs
            .into_iter()
            .map(|(key, text)| {
                let op = Op::from_key(key).ok_or_else(|| ResolveError::ConstraintFormat {
                    element: element.to_string(),
                    dependency: dependency.to_string(),
                    key: key.to_string(),
                })?;
                let version = text.parse::<Version>().map_err(|e| match e {
                    ResolveError::Version { input, problem } => ResolveError::RequirementVersion {
                        element: element.to_string(),
                        dependency: dependency.to_string(),
                        key: key.to_string(),
                        input,
                        problem,
                    },
                    other => other,
                })?;
                Ok(Constraint::new(op, version))
            })
            .collect::<Result<Vec<_>, ResolveError>>()?;
        Ok(Requirement {
            name: dependency.to_string(),
            constraints,
        })
    }

    pub fn matches(&self, version: &Version) -> bool {
        self.constraints.iter().all(|c| c.matches(version))
    }

    /// The constraints alone, e.g. `>=0.1.0, <0.2.0` (or `any version`).
    pub fn constraints_text(&self) -> String {
        if self.constraints.is_empty() {
            return "any version".to_string();
        }
        let parts: Vec<String> = self.constraints.iter().map(|c| c.to_string()).collect();
        parts.join(", ")
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.constraints.is_empty() {
            write!(f, "{} (any version)", self.name)
        } else {
            write!(f, "{} {}", self.name, self.constraints_text())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        match s.parse() {
            Ok(v) => v,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    fn req(pairs: &[(&str, &str)]) -> Requirement {
        match Requirement::from_keys("app", "core", pairs.iter().copied()) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn keys_map_to_operators() {
        let r = req(&[("from_version", "0.1.0"), ("to_version", "0.2.0")]);
        assert_eq!(r.to_string(), "core >=0.1.0, <0.2.0");
        assert_eq!(req(&[("version", "1.0.0")]).to_string(), "core ==1.0.0");
        assert_eq!(
            req(&[
                (">", "1.0.0"),
                ("<=", "2.0.0"),
                (">=", "1.0.1"),
                ("<", "3.0.0"),
                ("==", "1.5.0")
            ])
            .to_string(),
            "core >1.0.0, <=2.0.0, >=1.0.1, <3.0.0, ==1.5.0"
        );
        assert_eq!(req(&[]).to_string(), "core (any version)");
    }

    #[test]
    fn matching_table() {
        type Pairs = &'static [(&'static str, &'static str)];
        let table: &[(Pairs, &str, bool)] = &[
            (
                &[("from_version", "0.1.0"), ("to_version", "0.2.0")],
                "0.1.0",
                true,
            ),
            (
                &[("from_version", "0.1.0"), ("to_version", "0.2.0")],
                "0.1.9",
                true,
            ),
            (
                &[("from_version", "0.1.0"), ("to_version", "0.2.0")],
                "0.2.0",
                false,
            ),
            (
                &[("from_version", "0.1.0"), ("to_version", "0.2.0")],
                "0.2.0-rc.1",
                true,
            ),
            (&[("from_version", "0.1.0")], "0.1.0-dev", false),
            (&[("version", "1.0.0")], "1.0.0+build", true),
            (&[("version", "1.0.0")], "1.0.1", false),
            (&[(">", "1.0.0")], "1.0.0", false),
            (&[(">", "1.0.0")], "1.0.1-a", true),
            (&[("<=", "1.0.0")], "1.0.0", true),
            (&[("<=", "1.0.0")], "1.0.1", false),
            (&[], "9.9.9", true),
        ];
        for (pairs, version, expected) in table {
            assert_eq!(
                req(pairs).matches(&v(version)),
                *expected,
                "{pairs:?} {version}"
            );
        }
    }

    #[test]
    fn unknown_key_names_element_dependency_and_key() {
        let err = Requirement::from_keys("app", "core", [("min_version", "1.0.0")]);
        match err {
            Ok(r) => panic!("accepted {r}"),
            Err(e) => {
                assert_eq!(e.code(), "DEPENDENCY_CONSTRAINT_FORMAT");
                assert_eq!(
                    e.to_string(),
                    "Element `app` declares an unknown key `min_version` in its requirement on `core`; \
                     the accepted keys are from_version, to_version, version, >, >=, <, <= and ==."
                );
            }
        }
    }

    #[test]
    fn bad_version_names_element_dependency_and_key() {
        match Requirement::from_keys("app", "core", [("to_version", "0.x.0")]) {
            Ok(r) => panic!("accepted {r}"),
            Err(e) => {
                assert_eq!(e.code(), "VERSION");
                assert_eq!(
                    e.to_string(),
                    "Element `app` requires `core` with to_version `0.x.0`, which is not a valid version: \
                     the minor part `x` is not a number."
                );
            }
        }
    }
}
