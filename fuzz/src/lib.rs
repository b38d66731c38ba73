//! The checks each fuzz target runs on one input: the parser that takes outside
//! input, then properties of what it returns. Every function here must return
//! normally for every input; a panic is a bug in the parser (or a property that
//! does not hold).
//!
//! Shared by the fuzz targets (`fuzz/fuzz_targets/*.rs`) and by the main crate's
//! `tests/fuzz_corpus.rs`, which runs every corpus and regression file through
//! them on stable Rust in CI, so a crash once found stays fixed.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Component, Path};

use serde_json::{Value, json};

use corbel::deploy::blueprint::{self, Blueprint};
use corbel::deploy::template::{self, Context, Reference, TemplateError};
use corbel::provider::metadata;
use corbel::repository::{inventory, manifest};
use corbel::resolve::{Constraint, Op, Requirement, Version};

/// A target's check: it panics when a property does not hold.
pub type Check = fn(&[u8]);

/// The targets, by the name of their corpus directory.
pub const TARGETS: &[(&str, Check)] = &[
    ("version", version),
    ("constraint", constraint),
    ("inventory", inventory),
    ("manifest", manifest),
    ("blueprint", blueprint),
    ("template", template),
    ("provider_metadata", provider_metadata),
];

/// The manifest size limit used here: the server's default is 1 MiB.
const MANIFEST_MAX_BYTES: usize = 1 << 20;

fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

fn hash_of(v: &Version) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// A version that parses prints back exactly and reparses to an equal value;
/// two versions (the input split at its first newline) compare consistently.
pub fn version(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let (a, b) = text.split_once('\n').unwrap_or((text, ""));
    let parsed: Vec<Version> = [a, b].into_iter().filter_map(round_trip).collect();
    if let [x, y] = parsed.as_slice() {
        assert_eq!(x.cmp(y), y.cmp(x).reverse(), "{x} vs {y}");
        assert_eq!(x == y, x.cmp(y).is_eq(), "{x} vs {y}");
        if x == y {
            assert_eq!(hash_of(x), hash_of(y), "{x} == {y} hash alike");
        }
        // A release ranks above every suffixed version of the same core.
        let core = Version::new(x.major(), x.minor(), x.patch());
        assert_eq!(*x < core, !x.is_release(), "{x} vs its core");
        assert!(*x <= core, "{x} vs its core");
    }
}

/// Parses `s`; when it parses, checks its printed form.
fn round_trip(s: &str) -> Option<Version> {
    let v: Version = match s.parse() {
        Ok(v) => v,
        Err(e) => {
            // The error names the input and says why.
            let message = e.to_string();
            assert!(message.starts_with("Version `"), "{message}");
            assert_eq!(e.code(), "VERSION");
            return None;
        }
    };
    let shown = v.to_string();
    assert_eq!(shown, s, "a version prints back as written");
    let again: Version = shown.parse().expect("a printed version reparses");
    assert_eq!(again, v);
    assert_eq!(again.build(), v.build());
    Some(v)
}

/// Lines `key version` (`from_version 1.0.0`, `< 2.0.0`) make one requirement;
/// the lines after a blank line are candidate versions it is matched against.
pub fn constraint(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let (spec, candidates) = text.split_once("\n\n").unwrap_or((text, ""));
    let pairs: Vec<(&str, &str)> = spec
        .lines()
        .map(|line| line.split_once(' ').unwrap_or((line, "")))
        .collect();
    let requirement = match Requirement::from_keys("fuzz", "dep", pairs.iter().copied()) {
        Ok(r) => r,
        Err(e) => {
            assert!(
                matches!(e.code(), "VERSION" | "DEPENDENCY_CONSTRAINT_FORMAT"),
                "{e}"
            );
            assert!(e.to_string().contains("`dep`"), "{e}");
            return;
        }
    };
    assert_eq!(requirement.constraints.len(), pairs.len());
    // Each constraint prints as `<op><version>` and reads back the same.
    for c in &requirement.constraints {
        let shown = c.to_string();
        let symbol = c.op.symbol();
        let rest = shown
            .strip_prefix(symbol)
            .expect("starts with its operator");
        let op = Op::from_key(symbol).expect("a symbol is a key");
        let again = Constraint::new(op, rest.parse().expect("its version reparses"));
        assert_eq!(&again, c);
    }
    let _ = requirement.to_string();
    for line in candidates.lines() {
        let Ok(v) = line.parse::<Version>() else {
            continue;
        };
        let all = requirement.constraints.iter().all(|c| c.matches(&v));
        assert_eq!(requirement.matches(&v), all);
        for c in &requirement.constraints {
            let expected = match c.op {
                Op::Gt => v > c.version,
                Op::Ge => v >= c.version,
                Op::Lt => v < c.version,
                Op::Le => v <= c.version,
                Op::Eq => v == c.version,
            };
            assert_eq!(c.matches(&v), expected, "{v} against {c}");
        }
    }
}

/// The streaming `inventory.json` reader: every entry it hands over as valid
/// is, and every invalid one says where it is and what is wrong.
pub fn inventory(data: &[u8]) {
    let mut seen = 0u64;
    let result = inventory::parse(data, |parsed| {
        seen += 1;
        let entry = match parsed {
            Ok(entry) => entry,
            Err(invalid) => {
                assert!(invalid.path.starts_with("inventory.json#/elements/"));
                assert!(!invalid.message.is_empty());
                return Ok(());
            }
        };
        inventory::check_name(&entry.name).expect("an entry's name was checked");
        // The hash is a SHA-256 by its type (32 bytes).
        assert!(round_trip(&entry.version.to_string()).is_some());
        for artifact in &entry.artifacts {
            assert!(inventory::CATEGORIES.contains(&artifact.category.as_str()));
            inventory::check_file_name(&artifact.file_name).expect("a checked file name");
            assert!(!artifact.uuid.is_empty() && artifact.uuid.len() <= 64);
        }
        Ok(())
    });
    if let Ok(count) = result {
        assert_eq!(count, seen);
    }
}

/// An element manifest from YAML; a valid one checks again the same from its
/// JSON form (`editElement`), and its `resources` go through the blueprint checks.
pub fn manifest(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let Ok(m) = manifest::parse_yaml(text, MANIFEST_MAX_BYTES, "fuzz.yaml") else {
        return;
    };
    inventory::check_name(&m.name).expect("a manifest's name was checked");
    let again = manifest::check(m.document.clone(), "fuzz.json").expect("valid JSON again");
    assert_eq!(again, m);
    if let Some(resources) = m.document.get("resources")
        && let Ok(bp) = blueprint::parse_resources(resources)
    {
        use_blueprint(&bp);
    }
}

/// A blueprint: parse, then check; one that checks clean orders, binds its
/// defaults, counts its replicas and renders every config without panic.
pub fn blueprint(data: &[u8]) {
    let Some(text) = text(data) else { return };
    match blueprint::parse(text) {
        Ok(bp) => use_blueprint(&bp),
        Err(problems) => {
            assert!(!problems.0.is_empty());
            // At most so many listed, and one that counts the rest.
            assert!(problems.0.len() <= blueprint::MAX_PROBLEMS + 1);
        }
    }
    // As createBlueprint reads it: checked, each problem placed on its line
    // (one more read of the text, however many problems).
    if let Err(corbel::deploy::DeployError::Blueprint(problems)) =
        corbel::deploy::parse_checked(text)
    {
        assert!(problems.len() <= blueprint::MAX_PROBLEMS + 1);
    }
}

fn use_blueprint(bp: &Blueprint) {
    let problems = blueprint::check(bp);
    assert!(problems.len() <= blueprint::MAX_PROBLEMS + 1);
    if !problems.is_empty() {
        return;
    }
    let order = blueprint::order(bp).expect("a checked blueprint has an order");
    assert_eq!(order.len(), bp.resources.len());
    for r in &bp.resources {
        let _ = blueprint::dependents(bp, &r.key);
    }
    let Ok(variables) = blueprint::bind(bp, &serde_json::Map::new()) else {
        return;
    };
    // Every output any config refers to, so rendering has all it needs.
    let mut outputs: BTreeMap<String, Value> = BTreeMap::new();
    for r in &bp.resources {
        for (_, s) in template::strings(&r.config, "") {
            for reference in template::references(s).expect("checked templates") {
                if let Reference::Output { resource, field } = reference {
                    let entry = outputs.entry(resource).or_insert_with(|| json!({}));
                    entry[field] = json!("out");
                }
            }
        }
    }
    let ctx = Context {
        variables: &variables,
        outputs: &outputs,
    };
    for r in &bp.resources {
        let count = blueprint::replicas(r, &variables);
        let n = count.expect("a checked, bound blueprint has its replicas");
        assert!(n >= 0);
        if let Err(problem) = template::render(&r.config, &ctx) {
            assert!(
                problem.message.contains("over the limit") || problem.message.contains("deeper"),
                "a checked config renders: {problem}"
            );
        }
    }
    for d in &bp.data {
        let _ = template::render(&d.config, &ctx);
    }
}

/// One template string: its references agree with its whole-reference form,
/// each reference prints back as a template, and rendering with every
/// reference defined succeeds.
pub fn template(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let references = template::references(text);
    let whole = template::whole_reference(text);
    let references = match (references, whole) {
        (Ok(refs), Ok(whole)) => {
            if let Some(r) = &whole {
                assert_eq!(refs.as_slice(), std::slice::from_ref(r));
            }
            refs
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b);
            return;
        }
        (a, b) => panic!("references {a:?} but whole_reference {b:?}"),
    };
    let mut variables = BTreeMap::new();
    let mut outputs: BTreeMap<String, Value> = BTreeMap::new();
    for (i, r) in references.iter().enumerate() {
        let printed = format!("{{{{ {r} }}}}");
        assert_eq!(template::whole_reference(&printed), Ok(Some(r.clone())));
        // Values of every type, one per reference.
        let value = match i % 4 {
            0 => json!("x"),
            1 => json!(i),
            2 => json!([1, "two", null]),
            _ => json!({"k": [true]}),
        };
        match r {
            Reference::Variable(name) => {
                variables.insert(name.clone(), value);
            }
            Reference::Output { resource, field } => {
                let entry = outputs.entry(resource.clone()).or_insert_with(|| json!({}));
                entry[field] = value;
            }
        }
    }
    let ctx = Context {
        variables: &variables,
        outputs: &outputs,
    };
    match template::render_str(text, &ctx) {
        Ok(value) => {
            if references.is_empty() {
                assert_eq!(value, json!(text));
            }
        }
        Err(TemplateError::TooLarge) => {}
        Err(e) => panic!("{text:?} with every reference defined: {e}"),
    }
    // The same string inside a value renders the same way.
    let _ = template::render(&json!({"a": [text]}), &ctx);
}

/// `corbel-provider.yaml`, at most the size `load` reads.
pub fn provider_metadata(data: &[u8]) {
    if data.len() as u64 > metadata::MAX_SIZE {
        return;
    }
    let Some(text) = text(data) else { return };
    match metadata::parse(text) {
        Ok(m) => {
            assert!(!m.name.is_empty() && m.name.len() <= 64);
            assert!(m.name != "." && m.name != "..");
            assert!(!m.version.trim().is_empty());
            if let metadata::Runtime::Docker(spec) = &m.runtime {
                for path in [&spec.dockerfile, &spec.context] {
                    let outside = Path::new(path)
                        .components()
                        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
                    assert!(!outside, "{path} stays inside the checkout");
                }
                assert!(spec.memory.is_none_or(|m| m >= 6 << 20));
                assert!(spec.nano_cpus.is_none_or(|n| n > 0));
                assert!(spec.command.as_ref().is_none_or(|c| !c.is_empty()));
            }
            let _ = corbel::provider::ProviderMetadata::from(&m);
        }
        Err(e) => assert!(e.to_string().starts_with(metadata::FILE_NAME), "{e}"),
    }
}
