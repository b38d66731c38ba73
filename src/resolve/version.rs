//! `MAJOR.MINOR.PATCH[-suffix][+build]` versions ordered by SemVer precedence.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use super::ResolveError;

/// One dot-separated identifier of a suffix (SemVer pre-release).
///
/// The variant order is the precedence: numeric identifiers rank below
/// alphanumeric ones, so the derived `Ord` is the SemVer rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Ident {
    Numeric(u64),
    Alpha(String),
}

/// A parsed version. The only way in is [`Version::new`] or [`str::parse`], so
/// every value round-trips through `Display`.
///
/// Build metadata (after `+`) is kept for display but ignored by `Eq`, `Ord`
/// and `Hash`: `1.0.0+a == 1.0.0+b`.
#[derive(Debug, Clone)]
pub struct Version {
    major: u64,
    minor: u64,
    patch: u64,
    suffix: Vec<Ident>,
    /// Without the leading `+`; empty when absent.
    build: String,
}

impl Version {
    /// A release version `major.minor.patch`.
    pub fn new(major: u64, minor: u64, patch: u64) -> Self {
        Version {
            major,
            minor,
            patch,
            suffix: Vec::new(),
            build: String::new(),
        }
    }

    pub fn major(&self) -> u64 {
        self.major
    }

    pub fn minor(&self) -> u64 {
        self.minor
    }

    pub fn patch(&self) -> u64 {
        self.patch
    }

    /// True when the version has no `-suffix` (build metadata does not count).
    pub fn is_release(&self) -> bool {
        self.suffix.is_empty()
    }

    /// The build metadata after `+`, if any.
    pub fn build(&self) -> Option<&str> {
        (!self.build.is_empty()).then_some(self.build.as_str())
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Version {}

impl Hash for Version {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self.major, self.minor, self.patch, &self.suffix).hash(state);
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (self.suffix.is_empty(), other.suffix.is_empty()) {
                (true, true) => Ordering::Equal,
                // A release ranks above any suffixed build of the same base.
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => self.suffix.cmp(&other.suffix),
            })
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        for (i, ident) in self.suffix.iter().enumerate() {
            f.write_str(if i == 0 { "-" } else { "." })?;
            match ident {
                Ident::Numeric(n) => write!(f, "{n}")?,
                Ident::Alpha(s) => f.write_str(s)?,
            }
        }
        if !self.build.is_empty() {
            write!(f, "+{}", self.build)?;
        }
        Ok(())
    }
}

impl FromStr for Version {
    type Err = ResolveError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        parse(input).map_err(|problem| ResolveError::Version {
            input: input.to_string(),
            problem,
        })
    }
}

/// Parses `input`, or says what is wrong with it (a lower-case clause).
fn parse(input: &str) -> Result<Version, String> {
    if input.is_empty() {
        return Err("it is empty".to_string());
    }
    let (rest, build) = match input.split_once('+') {
        Some((rest, build)) => {
            check_identifiers("build metadata", build)?;
            (rest, build)
        }
        None => (input, ""),
    };
    let (core, suffix) = match rest.split_once('-') {
        Some((core, suffix)) => {
            check_identifiers("suffix", suffix)?;
            (core, suffix_identifiers(suffix)?)
        }
        None => (rest, Vec::new()),
    };
    let parts: Vec<&str> = core.split('.').collect();
    let [major, minor, patch] = parts.as_slice() else {
        return Err(format!(
            "it has {} dot-separated part{} before any suffix, expected three (MAJOR.MINOR.PATCH)",
            parts.len(),
            if parts.len() == 1 { "" } else { "s" }
        ));
    };
    Ok(Version {
        major: number("major part", major)?,
        minor: number("minor part", minor)?,
        patch: number("patch part", patch)?,
        suffix,
        build: build.to_string(),
    })
}

fn number(what: &str, text: &str) -> Result<u64, String> {
    if text.is_empty() {
        return Err(format!("the {what} is empty"));
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("the {what} `{text}` is not a number"));
    }
    if text.len() > 1 && text.starts_with('0') {
        return Err(format!("the {what} `{text}` has a leading zero"));
    }
    text.parse()
        .map_err(|_| format!("the {what} `{text}` is too large"))
}

fn check_identifiers(what: &str, text: &str) -> Result<(), String> {
    for ident in text.split('.') {
        if ident.is_empty() {
            return Err(format!("the {what} `{text}` has an empty identifier"));
        }
        if let Some(bad) = ident
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
        {
            return Err(format!(
                "the {what} `{text}` contains `{bad}`; only ASCII letters, digits, `-` and `.` are allowed"
            ));
        }
    }
    Ok(())
}

fn suffix_identifiers(text: &str) -> Result<Vec<Ident>, String> {
    text.split('.')
        .map(|ident| {
            if ident.bytes().all(|b| b.is_ascii_digit()) {
                number("suffix identifier", ident).map(Ident::Numeric)
            } else {
                Ok(Ident::Alpha(ident.to_string()))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v(s: &str) -> Version {
        match s.parse() {
            Ok(v) => v,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    #[test]
    fn parses_and_round_trips() {
        for s in [
            "0.0.0",
            "1.2.3",
            "0.1.12-dev+abc123",
            "1.0.0-alpha.1",
            "1.0.0-0.3.7",
            "1.0.0-x-y-z.--",
            "1.0.0+build.1-a",
            "18446744073709551615.0.0",
        ] {
            assert_eq!(v(s).to_string(), s);
        }
        assert!(v("1.2.3").is_release());
        assert!(v("1.2.3+b").is_release());
        assert!(!v("1.2.3-rc.1").is_release());
        assert_eq!(v("1.2.3+b").build(), Some("b"));
    }

    #[test]
    fn rejects_with_reasons() {
        for (input, message) in [
            ("", "Version `` is invalid: it is empty."),
            (
                "1.x.3",
                "Version `1.x.3` is invalid: the minor part `x` is not a number.",
            ),
            (
                "1.2",
                "Version `1.2` is invalid: it has 2 dot-separated parts before any suffix, expected three (MAJOR.MINOR.PATCH).",
            ),
            (
                "1..3",
                "Version `1..3` is invalid: the minor part is empty.",
            ),
            (
                "01.2.3",
                "Version `01.2.3` is invalid: the major part `01` has a leading zero.",
            ),
            (
                "1.2.3-",
                "Version `1.2.3-` is invalid: the suffix `` has an empty identifier.",
            ),
            (
                "1.2.3-a..b",
                "Version `1.2.3-a..b` is invalid: the suffix `a..b` has an empty identifier.",
            ),
            (
                "1.2.3-01",
                "Version `1.2.3-01` is invalid: the suffix identifier `01` has a leading zero.",
            ),
            (
                "1.2.3+a_b",
                "Version `1.2.3+a_b` is invalid: the build metadata `a_b` contains `_`; only ASCII letters, digits, `-` and `.` are allowed.",
            ),
            (
                "99999999999999999999.0.0",
                "Version `99999999999999999999.0.0` is invalid: the major part `99999999999999999999` is too large.",
            ),
            (
                " 1.2.3",
                "Version ` 1.2.3` is invalid: the major part ` 1` is not a number.",
            ),
        ] {
            match input.parse::<Version>() {
                Ok(parsed) => panic!("{input} parsed as {parsed}"),
                Err(e) => {
                    assert_eq!(e.to_string(), message);
                    assert_eq!(e.code(), "VERSION");
                }
            }
        }
    }

    #[test]
    fn orders_by_precedence() {
        // Each is strictly less than the next (the SemVer 2.0 example, plus ours).
        let chain = [
            "0.1.12-dev",
            "0.1.12",
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-alpha.beta",
            "1.0.0-beta",
            "1.0.0-beta.2",
            "1.0.0-beta.11",
            "1.0.0-rc.1",
            "1.0.0",
            "1.0.1",
            "1.1.0",
            "1.10.0",
            "2.0.0",
        ];
        for pair in chain.windows(2) {
            assert!(v(pair[0]) < v(pair[1]), "{} < {}", pair[0], pair[1]);
        }
        assert_eq!(v("1.0.0+a"), v("1.0.0+b"));
        assert_eq!(v("1.0.0+a").cmp(&v("1.0.0")), Ordering::Equal);
        assert!(v("1.0.0-1") < v("1.0.0-a"));
    }

    fn version_strategy() -> impl Strategy<Value = String> {
        let ident = prop_oneof!["[0-9]{1,3}", "[a-z][a-z0-9-]{0,3}"].prop_map(|s: String| {
            let trimmed = s.trim_start_matches('0');
            if s.bytes().all(|b| b.is_ascii_digit()) {
                if trimmed.is_empty() {
                    "0".to_string()
                } else {
                    trimmed.to_string()
                }
            } else {
                s
            }
        });
        (
            0u64..4,
            0u64..4,
            0u64..4,
            proptest::collection::vec(ident, 0..3),
            proptest::option::of("[a-z0-9]{1,4}"),
        )
            .prop_map(|(a, b, c, suffix, build)| {
                let mut s = format!("{a}.{b}.{c}");
                if !suffix.is_empty() {
                    s.push('-');
                    s.push_str(&suffix.join("."));
                }
                if let Some(build) = build {
                    s.push('+');
                    s.push_str(&build);
                }
                s
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn display_round_trips(s in version_strategy()) {
            prop_assert_eq!(v(&s).to_string(), s);
        }

        #[test]
        fn eq_hash_and_ord_agree(a in version_strategy(), b in version_strategy()) {
            use std::collections::hash_map::DefaultHasher;
            let (a, b) = (v(&a), v(&b));
            let hash = |x: &Version| { let mut h = DefaultHasher::new(); x.hash(&mut h); h.finish() };
            prop_assert_eq!(a == b, a.cmp(&b) == Ordering::Equal);
            if a == b { prop_assert_eq!(hash(&a), hash(&b)); }
            prop_assert_eq!(a.cmp(&b), b.cmp(&a).reverse());
        }
    }
}
