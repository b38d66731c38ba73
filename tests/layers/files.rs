//! The file graph of `src/`: which files each file imports, from the paths
//! it names (`use crate::…`, `super::…`, `use` groups expanded), resolved to
//! the file of the longest module prefix; a module's own ancestors and
//! descendants left out (a `mod.rs` and its children belong together).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::house::production_lines;
use crate::{code_of, matching_brace, root, rust_files, split_top_level};

/// `api/plans.rs` → `["api", "plans"]`; `deploy/mod.rs` → `["deploy"]`.
pub(crate) fn module_path(file: &Path) -> Vec<String> {
    let mut parts: Vec<String> = file
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts == ["lib"] || parts == ["main"] {
        parts.clear();
    }
    parts
}

/// The code of a file without `//` comments and without its test module.
fn import_code(text: &str) -> String {
    code_of(&production_lines(text).join("\n"))
}

/// Every path starting at `crate`, `super` or `self` in `code`, with `use`
/// groups expanded: `use super::{a::B, c}` → `[super, a, B]`, `[super, c]`.
pub(crate) fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let at_word = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        let rest = &code[i..];
        if at_word
            && ["crate::", "super::", "self::"]
                .iter()
                .any(|p| rest.starts_with(p))
        {
            let (path, used) = path_at(rest);
            found.extend(path);
            i += used.max(1);
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
        }
    }
    found
}

/// The paths of the path expression at the start of `text`, and how many
/// bytes it spans.
fn path_at(text: &str) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    let mut at = 0;
    loop {
        let ident: String = text[at..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        at += ident.len();
        if !ident.is_empty() {
            prefix.push(ident);
        }
        let rest = &text[at..];
        let trimmed = rest.trim_start();
        if let Some(after) = trimmed.strip_prefix("::") {
            at += rest.len() - trimmed.len() + 2;
            let after_trim = after.trim_start();
            at += after.len() - after_trim.len();
            if let Some(group) = after_trim.strip_prefix('{') {
                let end = matching_brace(group);
                let mut paths = Vec::new();
                for item in split_top_level(&group[..end]) {
                    let item = item.trim();
                    if item.is_empty() {
                        continue;
                    }
                    let item = item.split(" as ").next().unwrap_or(item).trim();
                    let (inner, _) = path_at(item);
                    for mut tail in inner {
                        let mut full = prefix.clone();
                        full.append(&mut tail);
                        paths.push(full);
                    }
                    if item == "self" {
                        paths.push(prefix.clone());
                    }
                }
                return (paths, at + end + 2);
            }
            continue;
        }
        return (vec![prefix], at);
    }
}

/// The file a path from module `from` lands in: the longest prefix of the
/// absolute path that is a file module.
pub(crate) fn resolve(
    from: &[String],
    path: &[String],
    modules: &BTreeMap<Vec<String>, String>,
) -> Option<String> {
    let mut full: Vec<String> = Vec::new();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => rest = &path[1..],
        _ => {
            full = from.to_vec();
            while let Some(head) = rest.first() {
                match head.as_str() {
                    "super" => {
                        full.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
    }
    full.extend(rest.iter().cloned());
    (0..=full.len())
        .rev()
        .find_map(|n| modules.get(&full[..n]).cloned())
}

/// File → the files of `src/` it imports, a module's own ancestors and
/// descendants left out.
pub(crate) fn file_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|f| {
            let relative = f.strip_prefix(&src).unwrap();
            (module_path(relative), relative.display().to_string())
        })
        .collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let from = module_path(relative);
        let shown = relative.display().to_string();
        let code = import_code(&std::fs::read_to_string(file).unwrap());
        let mut targets = BTreeSet::new();
        for path in paths_in(&code) {
            let Some(target) = resolve(&from, &path, &modules) else {
                continue;
            };
            let to = module_path(Path::new(&target));
            let nested = to.starts_with(&from) || from.starts_with(&to);
            if !nested {
                targets.insert(target);
            }
        }
        graph.insert(shown, targets);
    }
    graph
}

/// A cycle in `graph`, if there is one.
pub(crate) fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}
