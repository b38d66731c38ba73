//! A provider's fetched checkout as its loaders (the supervisor and `corbel
//! provider check`) read it: fetch progress as a status message, the
//! provider's `path` resolved inside the checkout, and a missing
//! `corbel-provider.yaml` explained in the repository's terms.

use std::path::{Path, PathBuf};

use super::{metadata, source};

pub(super) fn describe_progress(progress: &source::Progress) -> String {
    match progress {
        source::Progress::Connecting => "connecting".to_owned(),
        source::Progress::Receiving {
            received_objects,
            total_objects,
            received_bytes,
        } => format!(
            "receiving objects {received_objects}/{total_objects} ({} KiB)",
            received_bytes / 1024
        ),
        source::Progress::Resolving {
            indexed_deltas,
            total_deltas,
        } => format!("resolving deltas {indexed_deltas}/{total_deltas}"),
        source::Progress::CheckingOut => "checking out".to_owned(),
    }
}

/// The directory of the checkout `path` names (the provider's `path`),
/// refused if it is missing or leads outside the checkout (a symlink).
pub(super) fn source_root(checkout: &Path, path: &str) -> Result<PathBuf, String> {
    if path.is_empty() {
        return Ok(checkout.to_owned());
    }
    let root = checkout.join(path);
    let outside = || format!("path `{path}` leads outside the repository (a symlink)");
    match (root.canonicalize(), checkout.canonicalize()) {
        (Ok(real), Ok(top)) if real.starts_with(&top) && real.is_dir() => Ok(root),
        (Ok(real), Ok(top)) if real.starts_with(&top) => Err(format!(
            "path `{path}` is not a directory in the repository"
        )),
        (Ok(_), Ok(_)) => Err(outside()),
        _ => Err(format!("path `{path}` does not exist in the repository")),
    }
}

/// Says where `corbel-provider.yaml` was looked for, in the repository's terms
/// (never the data directory's), and where the checkout has one.
pub(super) fn missing_metadata(checkout: &Path, path: &str, url: &str, commit: &str) -> String {
    let place = if path.is_empty() {
        "at the root of".to_owned()
    } else {
        format!("in `{path}` of")
    };
    let short = &commit[..commit.len().min(12)];
    let mut message = format!(
        "{} not found {place} {url} (commit {short})",
        metadata::FILE_NAME
    );
    let found = find_metadata(checkout);
    if !found.is_empty() {
        let listed: Vec<String> = found.iter().map(|p| format!("`{p}`")).collect();
        message.push_str(&format!(
            "; the repository has one in {}: set the provider's `path`",
            listed.join(", ")
        ));
    }
    message
}

/// Directories of the checkout holding `corbel-provider.yaml`, a few levels
/// deep and a few of them: a hint, not a search.
fn find_metadata(checkout: &Path) -> Vec<String> {
    const DEPTH: usize = 4;
    const LISTED: usize = 5;
    const VISITED: usize = 2_000;
    let mut found = Vec::new();
    let mut queue = std::collections::VecDeque::from([(checkout.to_owned(), 0)]);
    let mut visited = 0;
    while let Some((dir, depth)) = queue.pop_front() {
        visited += 1;
        if visited > VISITED || found.len() == LISTED {
            break;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut subdirs: Vec<PathBuf> = Vec::new();
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let name = entry.file_name();
            if kind.is_file() && name == metadata::FILE_NAME && depth > 0 {
                if let Ok(relative) = dir.strip_prefix(checkout) {
                    found.push(relative.to_string_lossy().into_owned());
                }
            } else if kind.is_dir() && depth < DEPTH && name != ".git" {
                subdirs.push(entry.path());
            }
        }
        subdirs.sort();
        queue.extend(subdirs.into_iter().map(|d| (d, depth + 1)));
    }
    found.sort();
    found
}
