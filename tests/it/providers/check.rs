//! `corbel provider check`, the conformance run for provider authors, run as
//! the real binary against real provider processes: the shipped process
//! provider passes; providers that hang, speak another protocol version or
//! sit in a subdirectory not named are failed, each with its reason.

use std::path::Path;
use std::process::Command;

use crate::support::provider_repos::{ProviderRepo, fixture_metadata, workspace_bin};
use crate::support::{corbel_bin, joined, sandbox_read, sandbox_write};

struct Checked {
    success: bool,
    table: String,
    progress: String,
}

impl Checked {
    /// The result column of the row named `check`.
    fn outcome(&self, check: &str) -> Option<&str> {
        self.table.lines().find_map(|line| {
            let rest = line.strip_prefix(check)?;
            rest.starts_with("  ")
                .then(|| rest.split_whitespace().next())
                .flatten()
        })
    }

    fn row(&self, check: &str) -> &str {
        self.table
            .lines()
            .find(|line| line.starts_with(&format!("{check}  ")))
            .unwrap_or_else(|| panic!("no row `{check}` in\n{}", self.table))
    }
}

fn check(flags: &[&str], args: &[&str]) -> Checked {
    // A second of settling, not the default three: each check here pays it.
    let settle: &[&str] = if args.contains(&"--settle-ms") {
        &[]
    } else {
        &["--settle-ms", "1000"]
    };
    let out = Command::new(corbel_bin())
        .args(flags)
        .args(["provider", "check"])
        .args(settle)
        .args(args)
        .env_remove("CORBEL_CONFIG")
        .env("CORBEL_PROVIDER_SANDBOX_READ", joined(&sandbox_read()))
        .env("CORBEL_PROVIDER_SANDBOX_WRITE", joined(&sandbox_write()))
        .output()
        .expect("corbel runs");
    Checked {
        success: out.status.success(),
        table: String::from_utf8_lossy(&out.stdout).into_owned(),
        progress: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A shipped `corbel-provider.yaml` (`text`), its `shell:` made to run this
/// workspace's build of `binary`, so its `check:` samples are what is tested.
fn shipped_metadata(text: &str, binary: &Path) -> String {
    let mut out = String::new();
    let mut in_shell = false;
    for line in text.lines() {
        if line == "shell:" {
            in_shell = true;
            out.push_str(&format!("shell:\n  run: exec {}\n", binary.display()));
            continue;
        }
        if in_shell && line.starts_with("  ") {
            continue;
        }
        in_shell = false;
        out.push_str(line);
        out.push('\n');
    }
    assert!(out.contains("check:"), "no check samples in\n{out}");
    out
}

fn shipped_process_metadata(sample_arg: &str) -> String {
    let shipped = include_str!("../../../providers/process/corbel-provider.yaml");
    let out = shipped_metadata(shipped, &workspace_bin("corbel-provider-process"))
        .replace("\"300\"", &format!("\"{sample_arg}\""));
    assert!(
        out.contains(sample_arg),
        "the shipped sample changed:\n{out}"
    );
    out
}

/// Processes whose command line is exactly `argv`.
fn processes_running(argv: &[&str]) -> Vec<i32> {
    let wanted: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == wanted))
        .collect()
}

#[test]
fn the_shipped_process_provider_passes_and_leaves_nothing_running() {
    // A sample no other test runs, so what is left over is ours.
    let arg = format!("{}.{}", 300 + std::process::id() % 1000, std::process::id());
    let repo = ProviderRepo::new(&shipped_process_metadata(&arg), &[]);
    let checked = check(&[], &[&repo.url()]);
    assert!(checked.success, "{}\n{}", checked.table, checked.progress);
    for row in [
        "fetch",
        "corbel-provider.yaml",
        "handshake",
        "register",
        "resource types",
        "health (corbel.provider.v1.Provider)",
        "Configure",
        "Configure refuses bad JSON",
        "Configure refuses a non-object",
        "ListNodes",
        "deploy process.v1.service",
        "deploy process.v1.service again (same resource_id)",
        "Inspect process.v1.service",
        "destroy process.v1.service",
        "Inspect process.v1.service after destroy",
        "destroy process.v1.service again (already gone)",
        "lost deploy of process.v1.service: Inspect, retry",
        "deploy process.v1.job",
        "deploy process.v1.job again (same resource_id)",
        "Inspect process.v1.job",
        "destroy process.v1.job",
        "Inspect process.v1.job after destroy",
        "watch: first report",
        "watch: DOWN when killed",
        "survives an expired deadline",
        "exits 0 on SIGTERM",
        "Unregister on SIGTERM",
        "exits when the host goes away",
    ] {
        assert_eq!(checked.outcome(row), Some("PASS"), "{}", checked.table);
    }
    assert!(
        checked.table.contains(" 0 failed, 0 warnings"),
        "{}",
        checked.table
    );
    assert!(checked.progress.contains("deploying a process.v1.service"));
    // Killed by the pid its outputs name; the stream said so.
    let killed = checked.row("watch: DOWN when killed");
    assert!(
        killed.contains("after SIGKILL to pid") && killed.contains("DOWN \""),
        "{killed}"
    );
    assert_eq!(processes_running(&["sleep", &arg]), Vec::<i32>::new());
}

/// A sample with `sandbox: none` is a warning, not a failure; so is a `run:`
/// that starts the provider from a shell without `exec`, whose SIGTERM row
/// says that the shell is what the signal ended, and how to write it.
#[test]
fn a_sample_with_sandbox_none_is_a_warning_and_a_run_without_exec_is_explained() {
    let arg = format!("{}.{}", 301 + std::process::id() % 1000, std::process::id());
    let binary = workspace_bin("corbel-provider-process");
    let metadata = shipped_process_metadata(&arg)
        .replace(
            &format!("args: [\"{arg}\"] }}"),
            &format!("args: [\"{arg}\"], sandbox: none }}"),
        )
        .replace(
            &format!("run: exec {}", binary.display()),
            &format!("run: {} && true", binary.display()),
        );
    assert!(metadata.contains("sandbox: none"), "{metadata}");
    assert!(metadata.contains("&& true"), "{metadata}");
    let repo = ProviderRepo::new(&metadata, &[]);
    let checked = check(&[], &[&repo.url()]);
    // Warnings both: the check passes.
    assert!(checked.success, "{}\n{}", checked.table, checked.progress);
    let row = checked.row("sandbox process.v1.service");
    assert!(
        row.contains("WARN") && row.contains("sandbox: none"),
        "{}",
        checked.table
    );
    let row = checked.row("exits 0 on SIGTERM");
    assert!(
        row.contains("WARN") && row.contains("killed by SIGTERM") && row.contains("run: exec "),
        "{}",
        checked.table
    );
    assert_eq!(processes_running(&["sleep", &arg]), Vec::<i32>::new());
}

#[test]
fn a_provider_that_hangs_in_deploy_fails_with_the_reason() {
    let metadata = format!(
        "{}check:\n  resources:\n    fixture.v1.noop: {{}}\n",
        fixture_metadata("hang-deploy")
    );
    let repo = ProviderRepo::new(&metadata, &[]);
    let checked = check(&["--provider-call-timeout-ms", "1000"], &[&repo.url()]);
    assert!(!checked.success, "{}", checked.table);
    assert_eq!(
        checked.outcome("register"),
        Some("PASS"),
        "{}",
        checked.table
    );
    let row = checked.row("deploy fixture.v1.noop");
    assert!(
        row.contains("FAIL") && row.contains("did not answer DeployResource within 1000ms"),
        "{row}"
    );
    assert_eq!(
        checked.outcome("exits 0 on SIGTERM"),
        Some("PASS"),
        "{}",
        checked.table
    );
    assert!(checked.table.contains(" 1 failed"), "{}", checked.table);
}

#[test]
fn a_provider_of_another_protocol_version_is_failed_at_the_handshake() {
    let repo = ProviderRepo::new(&fixture_metadata("old-protocol"), &[]);
    let checked = check(&[], &[&repo.url()]);
    assert!(!checked.success);
    let handshake = checked.row("handshake");
    assert!(
        handshake.contains("FAIL") && handshake.contains("offered [99]"),
        "{handshake}"
    );
    let register = checked.row("register");
    assert!(
        register.contains("FAIL") && register.contains("exited (exit status 1) before registering"),
        "{register}"
    );
}

#[test]
fn a_provider_in_a_subdirectory_is_pointed_at_and_checked_with_path() {
    let metadata = format!(
        "{}check:\n  resources:\n    fixture.v1.noop: {{}}\n",
        fixture_metadata("normal")
    );
    let repo = ProviderRepo::with_files(&[("tools/noop/corbel-provider.yaml", &metadata)]);
    let checked = check(&[], &[&repo.url()]);
    assert!(!checked.success);
    let row = checked.row("corbel-provider.yaml");
    assert!(
        row.contains("FAIL")
            && row.contains("`tools/noop`")
            && row.contains("set the provider's `path`"),
        "{row}"
    );

    let checked = check(&[], &[&repo.url(), "--path", "tools/noop"]);
    assert!(checked.success, "{}\n{}", checked.table, checked.progress);
    assert_eq!(
        checked.outcome("survives an expired deadline"),
        Some("PASS"),
        "{}",
        checked.table
    );
    assert_eq!(
        checked.outcome("DescribeResources"),
        Some("PASS"),
        "{}",
        checked.table
    );
    // The fixture does not register "watch": Corbel polls it with Inspect.
    let watch = checked.row("watch");
    assert!(
        watch.contains("SKIP") && watch.contains("does not register `watch`"),
        "{watch}"
    );
}

#[test]
fn the_sdk_example_provider_passes() {
    let shipped = include_str!("../../../providers/sdk/corbel-provider.yaml");
    let hello = workspace_bin("corbel-provider-process").with_file_name("examples/hello");
    if !hello.exists() {
        let built = Command::new(env!("CARGO"))
            .args(["build", "-p", "corbel-provider-sdk", "--example", "hello"])
            .status()
            .expect("cargo runs");
        assert!(built.success(), "building the hello example failed");
    }
    assert!(hello.exists(), "{} is not built", hello.display());
    let repo = ProviderRepo::new(&shipped_metadata(shipped, &hello), &[]);
    let checked = check(&[], &[&repo.url()]);
    assert!(checked.success, "{}\n{}", checked.table, checked.progress);
    assert_eq!(
        checked.outcome("deploy hello.v1.greeting"),
        Some("PASS"),
        "{}",
        checked.table
    );
    assert!(checked.table.contains(" 0 failed"), "{}", checked.table);
}

/// The provider in another language: Python with grpcio, from the `.proto`
/// and the docs alone, checked straight from this repository.
#[test]
fn the_python_example_provider_passes() {
    let checked = check(
        &[],
        &[
            env!("CARGO_MANIFEST_DIR"),
            "--path",
            "providers/examples/python",
        ],
    );
    assert!(checked.success, "{}\n{}", checked.table, checked.progress);
    for row in [
        "handshake",
        "register",
        "Configure refuses bad JSON",
        "deploy example.v1.file",
        "lost deploy of example.v1.file: Inspect, retry",
        "watch: first report",
        "watch: DOWN when killed",
        "exits 0 on SIGTERM",
        "exits when the host goes away",
    ] {
        assert_eq!(checked.outcome(row), Some("PASS"), "{}", checked.table);
    }
    assert!(
        checked.table.contains(" 0 failed, 0 warnings"),
        "{}",
        checked.table
    );
}

/// A provider that registers `watch` but whose sample the check cannot kill
/// (its outputs name no `pid` nor a container `id`, and no `check.kill`
/// command is given): a warning naming why, not a failure.
#[test]
fn a_watch_whose_sample_cannot_be_killed_is_a_warning_naming_why() {
    let repo = super::python::example_repo_edited(
        |metadata| {
            let edited = metadata.replace(
                "  kill:\n    example.v1.file: rm \"$CORBEL_OUTPUT_PATH\"\n",
                "",
            );
            assert_ne!(edited, metadata, "the example's check.kill changed");
            edited
        },
        None,
        &[],
    );
    let checked = check(&[], &[&repo.url()]);
    assert!(checked.success, "{}\n{}", checked.table, checked.progress);
    let row = checked.row("watch");
    assert!(
        row.contains("WARN")
            && row.contains("example.v1.file: its outputs name no `pid` nor a container `id`")
            && row.contains("check.kill"),
        "{}",
        checked.table
    );
    assert_eq!(checked.outcome("watch: DOWN when killed"), None);
}

/// Protocol version 2: a sample updated in place to its `check.updates`
/// config, again to the same, and once it is gone (NOT_FOUND). An update
/// sample that changes a key the provider cannot update is the author's
/// mistake, named; a provider of version 1 is never sent UpdateResource.
#[test]
fn updates_in_place_are_checked_on_a_provider_that_speaks_them() {
    let with_updates = |run: &str, update: &str| {
        format!(
            "{run}check:\n  resources:\n    fixture.v1.noop: {{ label: a, size: 1 }}\n  \
             updates:\n    fixture.v1.noop: {update}\n"
        )
    };
    let repo = ProviderRepo::new(
        &with_updates(&fixture_metadata("normal"), "{ label: b, size: 1 }"),
        &[],
    );
    let checked = check(&[], &[&repo.url()]);
    assert!(checked.success, "{}\n{}", checked.table, checked.progress);
    for row in [
        "update fixture.v1.noop in place",
        "update fixture.v1.noop again (same config)",
        "update fixture.v1.noop of one gone (NOT_FOUND)",
    ] {
        assert_eq!(checked.outcome(row), Some("PASS"), "{}", checked.table);
    }
    assert!(
        checked
            .row("update fixture.v1.noop in place")
            .contains("[\"label\"] changed"),
        "{}",
        checked.table
    );
    assert!(
        checked
            .progress
            .contains("updating a fixture.v1.noop in place")
    );

    // `size` is not one the fixture describes as updatable.
    let repo = ProviderRepo::new(
        &with_updates(&fixture_metadata("normal"), "{ label: b, size: 2 }"),
        &[],
    );
    let checked = check(&[], &[&repo.url()]);
    assert!(!checked.success, "{}", checked.table);
    let row = checked.row("update fixture.v1.noop in place");
    assert!(
        row.contains("FAIL")
            && row.contains("changes `size`, which DescribeResources does not list"),
        "{row}"
    );

    // An old provider: UpdateResource is never sent.
    let old =
        fixture_metadata("normal").replace("FIXTURE_MODE=", "FIXTURE_PROTOCOL=1 FIXTURE_MODE=");
    assert!(old.contains("FIXTURE_PROTOCOL=1"), "{old}");
    let repo = ProviderRepo::new(&with_updates(&old, "{ label: b, size: 1 }"), &[]);
    let checked = check(&[], &[&repo.url()]);
    assert!(checked.success, "{}\n{}", checked.table, checked.progress);
    let row = checked.row("update fixture.v1.noop in place");
    assert!(
        row.contains("SKIP") && row.contains("protocol version 1"),
        "{row}"
    );
}

/// A provider that exits on its own after registering fails, saying so,
/// whatever else passed.
#[test]
fn a_provider_that_exits_after_registering_fails_runs_until_stopped() {
    let metadata = fixture_metadata("exit-after-register")
        .replace("FIXTURE_MODE=", "FIXTURE_EXIT_AFTER_MS=300 FIXTURE_MODE=");
    assert!(metadata.contains("FIXTURE_EXIT_AFTER_MS=300"), "{metadata}");
    let repo = ProviderRepo::new(&metadata, &[]);
    let checked = check(&[], &[&repo.url()]);
    assert!(!checked.success, "{}", checked.table);
    assert_eq!(
        checked.outcome("register"),
        Some("PASS"),
        "{}",
        checked.table
    );
    let row = checked.row("runs until stopped");
    assert!(
        row.contains("FAIL") && row.contains("exit status 3 on its own"),
        "{}",
        checked.table
    );
}

/// One that dies after the protocol's checks passed, within the settle
/// period (3 s, the default), fails too (healthy providers pass it: the
/// shipped ones' checks above).
#[test]
fn a_provider_that_dies_while_it_settles_fails_runs_until_stopped() {
    let metadata = fixture_metadata("exit-after-register")
        .replace("FIXTURE_MODE=", "FIXTURE_EXIT_AFTER_MS=2000 FIXTURE_MODE=");
    let repo = ProviderRepo::new(&metadata, &[]);
    let checked = check(&[], &[&repo.url(), "--settle-ms", "3000"]);
    let row = checked.row("runs until stopped");
    assert!(
        row.contains("FAIL") && row.contains("exit status 3 on its own, 2"),
        "{}",
        checked.table
    );
    assert_eq!(
        checked.outcome("survives an expired deadline"),
        Some("PASS"),
        "{}",
        checked.table
    );
}
