//! The house rules below the modules: files that a reader holds in one sitting.
//!
//! - No two files import each other, and no longer cycle runs through files
//!   either (a module and its own submodules aside: `mod.rs` declaring a child
//!   that uses its parent is how modules are made). Two files that need each
//!   other are one idea split in the wrong place: move the shared piece down
//!   into a file of its own, or merge them.
//! - A source file is at most 800 lines and a test file at most 600: past that
//!   a file does two jobs; name the second one and give it its file.
//! - A function of production code is at most 80 lines, or says why it is
//!   longer in a `// Long: …` line just above it (among its doc comments and
//!   attributes). Test scenarios are stories, and exempt.
//! - Every file of `src/` is named in ARCHITECTURE.md's code map (its unit
//!   tests aside: they sit beside what they test).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::files::{file_graph, find_cycle, paths_in, resolve};
use crate::{root, rust_files};

const SOURCE_LINES: usize = 800;
const TEST_LINES: usize = 600;
const FUNCTION_LINES: usize = 80;

/// Every Rust file of the workspace (the fuzz workspace aside), relative to
/// its root.
fn workspace_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in [
        "src",
        "tests",
        "benches",
        "providers",
        "proto",
        "migrations",
    ] {
        rust_files(&root().join(dir), &mut files);
    }
    files
        .into_iter()
        .map(|f| f.strip_prefix(root()).unwrap().to_owned())
        .collect()
}

/// Test code: the test targets, benches, examples, and `tests.rs`-style files.
fn is_test_file(file: &Path) -> bool {
    let shown = file.to_string_lossy();
    let name = file.file_name().unwrap().to_string_lossy();
    shown.starts_with("tests/")
        || shown.starts_with("benches/")
        || shown.contains("/tests/")
        || shown.contains("/examples/")
        || name == "tests.rs"
        || name.ends_with("_tests.rs")
}

/// The lines of `text` before its `#[cfg(test)]` module, if it has one.
pub(crate) fn production_lines(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let is_mod = |line: &str| {
        let line = line.trim_start();
        let line = line.strip_prefix("pub(crate) ").unwrap_or(line);
        let line = line.strip_prefix("pub ").unwrap_or(line);
        line.starts_with("mod ")
    };
    for (i, pair) in lines.windows(2).enumerate() {
        if pair[0].trim() == "#[cfg(test)]" && is_mod(pair[1]) {
            return lines[..i].to_vec();
        }
    }
    lines
}

/// A line without its `//` comment and with its string and char literals
/// emptied, for counting braces.
fn code_of_line(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                out.push('"');
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
                out.push('"');
            }
            '\'' => {
                // A char literal ('x', '\n', '{'), or a lifetime ('a).
                let rest: String = chars.clone().take(3).collect();
                let literal = rest.starts_with('\\') || rest.chars().nth(1) == Some('\'');
                if literal {
                    for c in chars.by_ref() {
                        if c == '\'' {
                            break;
                        }
                    }
                    out.push_str("''");
                } else {
                    out.push('\'');
                }
            }
            '/' if chars.peek() == Some(&'/') => break,
            _ => out.push(c),
        }
    }
    out
}

/// `fn` items of `lines`: (name, first line number, length in lines,
/// excused by a `// Long:` line above it).
fn functions(lines: &[&str]) -> Vec<(String, usize, usize, bool)> {
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else {
            continue;
        };
        let mut depth = 0i64;
        let mut opened = false;
        let mut end = None;
        for (i, line) in lines.iter().enumerate().skip(start) {
            let code = code_of_line(line);
            if !opened && code.contains(';') && !code.contains('{') {
                break; // a declaration without a body
            }
            for c in code.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if opened && depth <= 0 {
                end = Some(i);
                break;
            }
        }
        let Some(end) = end else {
            continue;
        };
        let excused = lines[..start]
            .iter()
            .rev()
            .map(|l| l.trim())
            .take_while(|l| l.starts_with("//") || l.starts_with("#["))
            .any(|l| l.starts_with("// Long:"));
        found.push((name, start + 1, end - start + 1, excused));
    }
    found
}

/// The name of the function whose `fn` line this is.
fn fn_name(line: &str) -> Option<String> {
    let code = code_of_line(line);
    let mut words = code.split_whitespace().peekable();
    while let Some(word) = words.next() {
        let qualifier = word.starts_with("pub")
            || matches!(
                word,
                "const" | "async" | "unsafe" | "extern" | "\"C\"" | "default"
            );
        if word == "fn" {
            let name = words.next()?;
            let name: String = name
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            return (!name.is_empty()).then_some(name);
        }
        if !qualifier {
            return None;
        }
    }
    None
}

#[test]
fn files_stay_short() {
    let mut long = Vec::new();
    for file in workspace_files() {
        let lines = std::fs::read_to_string(root().join(&file))
            .unwrap()
            .lines()
            .count();
        let limit = if is_test_file(&file) {
            TEST_LINES
        } else {
            SOURCE_LINES
        };
        if lines > limit {
            long.push(format!(
                "{} has {lines} lines (at most {limit})",
                file.display()
            ));
        }
    }
    assert!(
        long.is_empty(),
        "files past what a reader holds: split each by what its parts do, each named \
         for its job:\n{}",
        long.join("\n")
    );
}

#[test]
fn long_functions_say_why() {
    let mut long = Vec::new();
    for file in workspace_files() {
        if is_test_file(&file) {
            continue;
        }
        let text = std::fs::read_to_string(root().join(&file)).unwrap();
        for (name, line, length, excused) in functions(&production_lines(&text)) {
            if length > FUNCTION_LINES && !excused {
                long.push(format!(
                    "{}:{line} `{name}` is {length} lines",
                    file.display()
                ));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {FUNCTION_LINES} lines: split each into named steps, or say why it \
         stays whole in a `// Long: …` line above it:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_function_rule_reads_bodies_and_reasons() {
    let code = "fn short() {\n    let s = \"}\";\n}\n\n/// Docs.\n// Long: a table.\n#[inline]\n\
                fn excused() {\n    x('{');\n}\nfn decl();\npub(crate) async fn f<'a>(x: &'a str) {\n}\n";
    let lines: Vec<&str> = code.lines().collect();
    let found = functions(&lines);
    let want = vec![
        ("short".to_owned(), 1, 3, false),
        ("excused".to_owned(), 8, 3, true),
        ("f".to_owned(), 12, 2, false),
    ];
    assert_eq!(found, want);
    let module = "fn a() {}\n#[cfg(test)]\nmod tests {\n    fn b() {}\n}\n";
    assert_eq!(production_lines(module), ["fn a() {}"]);
}

#[test]
fn no_files_import_each_other() {
    let graph = file_graph();
    assert!(graph.len() > 100, "{} files read", graph.len());
    let mutual: Vec<String> = graph
        .iter()
        .flat_map(|(a, targets)| targets.iter().map(move |b| (a, b)))
        .filter(|(a, b)| a < b && graph[*b].contains(*a))
        .map(|(a, b)| format!("{a} ↔ {b}"))
        .collect();
    assert!(
        mutual.is_empty(),
        "files that import each other (move the shared piece down into a file of its own, \
         or merge them):\n{}",
        mutual.join("\n")
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("a cycle through files: {}", cycle.join(" → "));
    }
}

#[test]
fn the_file_graph_reads_groups_nesting_and_super() {
    let code = "use super::{plan::Plan, runs::{Runs, Run}};\nuse crate::store::deployments as d;\n\
                fn f() { self::x::y(); super::super::api::z(); }\n";
    let found = paths_in(code);
    let want: Vec<Vec<String>> = [
        &["super", "plan", "Plan"][..],
        &["super", "runs", "Runs"],
        &["super", "runs", "Run"],
        &["crate", "store", "deployments"],
        &["self", "x", "y"],
        &["super", "super", "api", "z"],
    ]
    .iter()
    .map(|p| p.iter().map(|s| s.to_string()).collect())
    .collect();
    assert_eq!(found, want);
    let modules: BTreeMap<Vec<String>, String> = [
        (vec!["deploy".to_owned()], "deploy/mod.rs".to_owned()),
        (
            vec!["deploy".into(), "plan".into()],
            "deploy/plan.rs".into(),
        ),
    ]
    .into();
    let from = vec!["deploy".to_owned(), "runs".to_owned()];
    assert_eq!(
        resolve(&from, &found[0], &modules).as_deref(),
        Some("deploy/plan.rs")
    );
    let cycle: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_owned(), ["b".to_owned()].into()),
        ("b".to_owned(), ["c".to_owned()].into()),
        ("c".to_owned(), ["a".to_owned()].into()),
    ]
    .into();
    assert_eq!(find_cycle(&cycle).unwrap(), ["a", "b", "c", "a"]);
}

/// The rows of ARCHITECTURE.md's code map: the paths in a row's first cell
/// (in backticks), and the row's whole text.
fn code_map() -> Vec<(Vec<String>, String)> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let start = text
        .find("## Code map")
        .expect("ARCHITECTURE.md has a code map");
    let section = &text[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |e| e + 3);
    section[..end]
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|row| {
            let first = row.split(" | ").next().unwrap_or(row);
            let paths = first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect();
            (paths, row.to_owned())
        })
        .collect()
}

#[test]
fn every_source_file_is_on_the_code_map() {
    let map = code_map();
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut missing = Vec::new();
    for file in files {
        let shown = file.strip_prefix(root()).unwrap().display().to_string();
        if is_test_file(Path::new(&shown)) {
            continue; // unit tests sit beside what they test
        }
        // Named by its own row, or by its path from a row's directory
        // (`blueprint/parse.rs` in the `src/deploy/` row, `deployments/nodes.rs`
        // in the `src/store/deployments.rs` row); a `mod.rs` by its
        // directory's row.
        let named = map.iter().any(|(paths, row)| {
            paths.iter().any(|p| {
                if *p == shown || shown.strip_prefix(p.as_str()) == Some("mod.rs") {
                    return true;
                }
                let base = match p.rfind('/') {
                    Some(at) => &p[..=at],
                    None => return false,
                };
                shown
                    .strip_prefix(base)
                    .is_some_and(|below| row.contains(&format!("`{below}`")))
            })
        });
        if !named {
            missing.push(shown);
        }
    }
    assert!(
        missing.is_empty(),
        "files ARCHITECTURE.md's code map does not name (in their directory's row, by \
         their path from it):\n{}",
        missing.join("\n")
    );
}
