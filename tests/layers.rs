//! The house rules, checked from the code's own imports: the modules of
//! `src/` form layers that only point down, with no cycle among them, and only
//! `store` knows sea-orm. A new `use crate::…` that breaks a rule fails here,
//! naming the file.
//!
//! The layers, bottom first (a module may use modules of lower layers, and
//! modules of its own layer as long as no cycle forms):
//!
//! 0. leaves: `seal`, `secret`, `settings`, `events`, `telemetry`, `text`, `yaml`, `redact`, `cpu`: import nothing of
//!    the crate;
//! 1. `store` (the database), `resolve` (pure dependency resolution);
//! 2. `auth`, `audit`, `cluster`, `repository`: areas on the store;
//! 3. `provider`: uses `repository` (it serves repositories through providers);
//! 4. `deploy`: uses `provider` and `repository`;
//! 5. `api`, `web`: the edge, over the areas; `api` never touches `store`;
//! 6. `config` (assembles the areas' settings), `app` (wires everything),
//!    `standby` (a replica until it leads),
//!    `cli`; and `client`, the command line client, which speaks only the
//!    API over HTTP and imports nothing of the crate (`cli` runs it).

#[path = "layers/builds.rs"]
mod builds;
#[path = "layers/files.rs"]
mod files;
#[path = "layers/house.rs"]
mod house;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const LAYERS: &[&[&str]] = &[
    &[
        "seal",
        "secret",
        "settings",
        "events",
        "telemetry",
        "text",
        "yaml",
        "redact",
        "cpu",
    ],
    &["store", "resolve"],
    &["auth", "audit", "cluster", "repository"],
    &["provider"],
    &["deploy"],
    &["api", "web"],
    &["config", "app", "standby", "cli", "client"],
];

/// Imports that skip layers on purpose are fine, but these never are.
const FORBIDDEN: &[(&str, &str, &str)] = &[(
    "api",
    "store",
    "the API reaches the database only through the areas",
)];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The workspace's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `.rs` files under `dir` (none if it is missing), build output aside.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code without `//` comments (doc comments mention modules freely).
fn code_of(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every top-level module named after `crate::`, in `use crate::{a, b::c}`
/// groups as well as in paths.
fn crate_references(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = matching_brace(group);
            for item in split_top_level(&group[..end]) {
                if let Some(name) = leading_ident(item.trim()) {
                    found.insert(name);
                }
            }
        } else if let Some(name) = leading_ident(rest) {
            found.insert(name);
        }
    }
    found
}

fn matching_brace(text: &str) -> usize {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    text.len()
}

fn split_top_level(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn leading_ident(text: &str) -> Option<String> {
    let name: String = text
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// `src/deploy/step.rs` → `deploy`; `src/config.rs` → `config`.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.trim_end_matches(".rs");
    (!matches!(name, "lib" | "main")).then(|| name.to_owned())
}

struct Graph {
    /// module → module it imports → the files that do.
    edges: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    sea_orm_users: BTreeSet<String>,
}

fn graph() -> Graph {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph = Graph {
        edges: BTreeMap::new(),
        sea_orm_users: BTreeSet::new(),
    };
    for file in files {
        let Some(module) = module_of(&src, &file) else {
            continue;
        };
        let code = code_of(&std::fs::read_to_string(&file).expect("a source file"));
        let shown = file.strip_prefix(&src).unwrap().display().to_string();
        if module != "store" && code.contains("sea_orm") {
            graph.sea_orm_users.insert(shown.clone());
        }
        for target in crate_references(&code) {
            if target != module && layer_of(&target).is_some() {
                graph
                    .edges
                    .entry(module.clone())
                    .or_default()
                    .entry(target)
                    .or_default()
                    .insert(shown.clone());
            }
        }
    }
    graph
}

#[test]
fn every_module_has_a_layer() {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let unplaced: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_of(&src, f))
        .filter(|m| layer_of(m).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules with no layer in tests/layers.rs: {unplaced:?}"
    );
}

#[test]
fn imports_only_point_down() {
    let graph = graph();
    let mut wrong = Vec::new();
    for (from, targets) in &graph.edges {
        for (to, files) in targets {
            let (Some(a), Some(b)) = (layer_of(from), layer_of(to)) else {
                continue;
            };
            if b > a {
                wrong.push(format!(
                    "{from} (layer {a}) imports {to} (layer {b}) in {files:?}"
                ));
            }
            if a == 0 {
                wrong.push(format!("{from} is a leaf but imports {to} in {files:?}"));
            }
            if let Some((_, _, why)) = FORBIDDEN.iter().find(|(f, t, _)| f == from && t == to) {
                wrong.push(format!("{from} imports {to} in {files:?}: {why}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

/// The client is a client of the API like any other: no server type (store,
/// area, API object, configuration) reaches it, not even a leaf's.
#[test]
fn the_client_imports_no_area() {
    let graph = graph();
    let imported = graph.edges.get("client").cloned().unwrap_or_default();
    assert!(
        imported.is_empty(),
        "the client speaks the API only, yet imports {:?}",
        imported
    );
    // And it is there to be checked: a module of its own under `src/`.
    let src = root().join("src");
    assert!(src.join("client").join("mod.rs").is_file());
}

#[test]
fn no_import_cycles() {
    let modules: BTreeMap<String, BTreeSet<String>> = graph()
        .edges
        .into_iter()
        .map(|(module, targets)| (module, targets.into_keys().collect()))
        .collect();
    if let Some(cycle) = files::find_cycle(&modules) {
        panic!("an import cycle: {}", cycle.join(" → "));
    }
}

#[test]
fn only_the_store_knows_sea_orm() {
    let graph = graph();
    assert!(
        graph.sea_orm_users.is_empty(),
        "sea_orm named outside src/store/: {:?}",
        graph.sea_orm_users
    );
}

#[test]
fn the_checker_sees_grouped_and_nested_imports() {
    let code = "use crate::{a::B, b, c::{d, e}};\nfn f() { crate::x::y(); }\n// crate::z\n";
    let found = crate_references(&code_of(code));
    let want: BTreeSet<String> = ["a", "b", "c", "x"].map(String::from).into();
    assert_eq!(found, want);
}
