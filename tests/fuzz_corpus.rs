//! Every fuzz corpus and regression input (`fuzz/corpus/<target>/*`,
//! `fuzz/regressions/<target>/*`) through the same checks the fuzz targets run,
//! on stable Rust and without a fuzzer: a crash the fuzzer once found stays
//! fixed, and CI needs no nightly toolchain or libFuzzer.

#[path = "../fuzz/src/lib.rs"]
mod checks;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_and_regression_input_passes_its_checks() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut failures = Vec::new();
    for (target, check) in checks::TARGETS {
        let corpus = files_in(&fuzz.join("corpus").join(target));
        assert!(
            !corpus.is_empty(),
            "fuzz/corpus/{target} has no seed inputs"
        );
        let regressions = files_in(&fuzz.join("regressions").join(target));
        for file in corpus.iter().chain(&regressions) {
            let data = std::fs::read(file).expect("a readable input");
            if catch_unwind(AssertUnwindSafe(|| check(data.as_slice()))).is_err() {
                failures.push(
                    file.strip_prefix(&fuzz)
                        .unwrap_or(file)
                        .display()
                        .to_string(),
                );
            }
        }
    }
    assert!(
        failures.is_empty(),
        "inputs that panic (messages above): {failures:#?}"
    );
}

/// The directories the test reads are the fuzz targets' own: a target without
/// a corpus directory, or a directory without a target, is a mistake.
#[test]
fn corpus_directories_match_the_targets() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(dir)) else {
            continue;
        };
        for entry in entries {
            let name = entry.expect("a directory entry").file_name();
            let name = name.to_string_lossy();
            assert!(
                checks::TARGETS.iter().any(|(t, _)| *t == name),
                "fuzz/{dir}/{name} is not a fuzz target"
            );
        }
    }
    let targets = std::fs::read_to_string(fuzz.join("Cargo.toml")).expect("fuzz/Cargo.toml");
    for (target, _) in checks::TARGETS {
        assert!(
            targets.contains(&format!("path = \"fuzz_targets/{target}.rs\"")),
            "fuzz/Cargo.toml has no target {target}"
        );
    }
}
