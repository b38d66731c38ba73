//! Workloads and providers are contained (issue 38): the real `corbel serve`
//! run as `nobody` with a data directory `nobody` owns, the process provider
//! loaded from git, and a probe (a small Python program) that tries to read
//! `<data-dir>/secret.key` and `corbel.db`, the server's `/proc/<pid>/environ`
//! and `/proc/<pid>/mem`, and to `ptrace` it. What the probe reports, not what
//! the server says, is counted: run by the provider before it starts, and as a
//! `process.v1.service` workload, it is refused everything; with the
//! confinement off (`[provider] sandbox = false`, `sandbox: none`) the same
//! probe reads the files and reads and traces a dumpable process of the same
//! user (a bystander), so the test can fail; the server and the provider
//! (the SDK makes it non-dumpable, and zeroes its token in its environment),
//! stay closed even then.
//!
//! A provider's build is contained as well: a build that tries to read the
//! server's files and write beside its own directories fails, refused, while
//! what a build needs works; unconfined, the same build reads them.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};

use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::binary::{Served, admin_gql, serve_command, spawn_served, terminate};
use crate::support::provider_repos::{ProviderRepo, workspace_bin};
use crate::support::{ADMIN_TOKEN, TestStore, eventually};

const NOBODY: u32 = 65534;

/// The probe: `probe.py SERVER_PID DATA_DIR CONTROL_PID REPORT`. One line per
/// attempt, `<what>: read <n>` or `<what>: refused <errno name>`; the report
/// appears whole (written aside, then renamed).
const PROBE: &str = r#"
import ctypes, errno, os, sys
server, data, control, report = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
lines = []
def attempt(name, action):
    try:
        lines.append(f"{name}: read {len(action())}")
    except OSError as e:
        lines.append(f"{name}: refused {errno.errorcode.get(e.errno, e.errno)}")
def read(path):
    with open(path, "rb") as f:
        return f.read(64)
def memory(pid):
    with open(f"/proc/{pid}/mem", "rb") as mem:
        with open(f"/proc/{pid}/maps") as maps:
            start = int(maps.readline().split("-")[0], 16)
        mem.seek(start)
        return mem.read(16)
def trace(pid):
    # PTRACE_SEIZE in a child of its own: the tracee is not stopped, and is
    # let go when the child exits.
    child = os.fork()
    if child == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        failed = libc.ptrace(0x4206, pid, None, None) != 0
        os._exit(ctypes.get_errno() if failed else 0)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    if code:
        raise OSError(code, os.strerror(code))
    return b"seized"
attempt("secret.key", lambda: read(os.path.join(data, "secret.key")))
attempt("corbel.db", lambda: read(os.path.join(data, "corbel.db")))
for who, pid in (("server", server), ("control", control)):
    attempt(f"{who} environ", lambda: read(f"/proc/{pid}/environ"))
    attempt(f"{who} mem", lambda: memory(pid))
    attempt(f"{who} ptrace", lambda: trace(pid))
with open(report + ".partial", "w") as f:
    f.write("\n".join(lines) + "\n")
os.rename(report + ".partial", report)
"#;

/// What each attempt of a probe got: `read` or `refused <errno>`.
type Report = BTreeMap<String, String>;

/// The attempts the probe makes, in its order.
const ATTEMPTS: [&str; 8] = [
    "secret.key",
    "corbel.db",
    "server environ",
    "server mem",
    "server ptrace",
    "control environ",
    "control mem",
    "control ptrace",
];

/// A directory `nobody` owns (the server's data, the probe's reports).
fn nobody_dir() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    chown_nobody(dir.path());
    dir
}

fn chown_nobody(path: &Path) {
    let status = std::process::Command::new("chown")
        .args(["-R", &format!("{NOBODY}:{NOBODY}")])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "chown {}", path.display());
}

/// One contained (or not) server as `nobody`, the process provider loaded;
/// the provider runs the probe before it starts (its report in
/// `out/provider.txt`), its control a `sleep` of `nobody`'s started by the
/// test: dumpable, and outside any ruleset.
struct Scene {
    served: Served,
    data: TempDir,
    out: TempDir,
    repo: ProviderRepo,
    bystander: std::process::Child,
}

impl Drop for Scene {
    fn drop(&mut self) {
        let _ = self.bystander.kill();
        let _ = self.bystander.wait();
    }
}

/// How a scene's server runs its provider.
#[derive(Clone, Copy, PartialEq)]
enum Run {
    /// The server as `nobody`, its provider sandboxed or not.
    AsNobody { sandbox: bool },
    /// The server as root (its data directory root's), unsandboxed, its
    /// provider with `runAs: nobody`.
    ProviderAsNobody,
}

impl Scene {
    async fn start(run: Run) -> Scene {
        let (sandbox, as_nobody) = match run {
            Run::AsNobody { sandbox } => (sandbox, true),
            Run::ProviderAsNobody => (false, false),
        };
        let data = if as_nobody {
            nobody_dir()
        } else {
            tempfile::tempdir().unwrap()
        };
        let out = nobody_dir();
        std::fs::write(out.path().join("probe.py"), PROBE).unwrap();
        chown_nobody(out.path());
        let bystander = std::process::Command::new("sleep")
            .arg("600")
            .uid(NOBODY)
            .gid(NOBODY)
            .spawn()
            .unwrap();
        let run = format!(
            "/usr/bin/python3 {out}/probe.py $PPID {data} {bystander} {out}/provider.txt; exec {bin}",
            bystander = bystander.id(),
            out = out.path().display(),
            data = data.path().display(),
            bin = workspace_bin("corbel-provider-process").display()
        );
        let metadata = format!(
            "name: process\nversion: 0.1.0\nruntime: shell\nshell:\n  build: \"true\"\n  run: {run}\n\
             features: [deploy, destroy, inspect, nodes]\nresource_types: [process.v1.service]\n"
        );
        let repo = ProviderRepo::new(&metadata, &[]);
        if as_nobody {
            chown_nobody(repo.bare().parent().unwrap());
        }
        // The real binary, on SQLite (its file is what is probed).
        let store = TestStore {
            dir: data,
            database_url: None,
        };
        let out_text = out.path().display().to_string();
        let sandbox_text = sandbox.to_string();
        let mut command = serve_command(
            &store,
            &[
                ("CORBEL_ADMIN_TOKEN", ADMIN_TOKEN),
                ("CORBEL_PROVIDER_SANDBOX", &sandbox_text),
                // What an operator grants its providers: the workloads' place.
                ("CORBEL_PROVIDER_SANDBOX_WRITE", &out_text),
            ],
        );
        command.env_remove("CORBEL_PROVIDER_SANDBOX_READ");
        if as_nobody {
            command.uid(NOBODY).gid(NOBODY);
        }
        let served = spawn_served(command);
        let scene = Scene {
            served,
            data: store.dir,
            out,
            repo,
            bystander,
        };
        let created = scene
            .gql(
                "mutation($input: CreateProviderInput!) { createProvider(input: $input) { provider { id } } }",
                json!({ "input": {
                    "name": "process",
                    "gitUrl": scene.repo.url(),
                    "runAs": if as_nobody { "" } else { "nobody" },
                } }),
            )
            .await;
        let id = created["data"]["createProvider"]["provider"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{created}"))
            .to_owned();
        eventually(
            Duration::from_secs(60),
            "the provider to connect",
            || async {
                let body = scene
                    .gql(
                        "query($id: ID!) { provider(id: $id) { status statusMessage } }",
                        json!({ "id": id }),
                    )
                    .await;
                let status = &body["data"]["provider"]["status"];
                assert_ne!(status, "FAILED", "{body}");
                (status == "CONNECTED").then_some(())
            },
        )
        .await;
        scene
    }

    fn server_pid(&self) -> u32 {
        self.served.child.id()
    }

    async fn gql(&self, query: &str, variables: Value) -> Value {
        admin_gql(self.served.addr, query, variables)
            .await
            .expect("the server answers")
    }

    /// Deploys the probe as a workload (`sandbox` its config's key, if any)
    /// and returns its report. Its control is its provider (`$PPID` of the
    /// service's `sh`), a dumpable process of the same user.
    async fn workload_report(&self, sandbox: Option<Value>) -> (String, Report) {
        let script = format!(
            "echo $PPID > {out}/workload.ppid; \
             /usr/bin/python3 {out}/probe.py {server} {data} $PPID {out}/workload.txt; exec sleep 300",
            out = self.out.path().display(),
            server = self.server_pid(),
            data = self.data.path().display(),
        );
        let mut config = json!({
            "command": "/bin/sh",
            "args": ["-c", script],
            "cwd": self.out.path(),
        });
        if let Some(sandbox) = sandbox {
            config["sandbox"] = sandbox;
        }
        let source =
            format!("resources:\n  probe:\n    type: process.v1.service\n    config: {config}\n");
        let blueprint = self
            .gql(
                "mutation($input: CreateBlueprintInput!) { createBlueprint(input: $input) { id } }",
                json!({ "input": { "name": "probe", "source": source } }),
            )
            .await;
        let blueprint = &blueprint["data"]["createBlueprint"]["id"];
        let deployed = self
            .gql(
                "mutation($input: DeployBlueprintInput!) { deployBlueprint(input: $input) { id } }",
                json!({ "input": { "blueprintId": blueprint, "name": "probe" } }),
            )
            .await;
        let id = deployed["data"]["deployBlueprint"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{deployed}"))
            .to_owned();
        let report = report(&self.out.path().join("workload.txt")).await;
        self.settled(&id, "COMPLETE").await;
        (id, report)
    }

    /// Waits for deployment `id` to be in `state`.
    async fn settled(&self, id: &str, state: &str) {
        eventually(Duration::from_secs(60), state, || async {
            let body = self
                .gql(
                    "query($id: ID!) { deployment(id: $id) { state error } }",
                    json!({ "id": id }),
                )
                .await;
            let now = &body["data"]["deployment"]["state"];
            assert_ne!(now, "FAILED", "{body}");
            (now == state).then_some(())
        })
        .await;
    }

    /// Destroys deployment `id` (its service outlives the server otherwise),
    /// then stops the server.
    async fn stop(mut self, deployment: &str) {
        self.gql(
            "mutation($id: ID!) { destroyDeployment(id: $id) { id } }",
            json!({ "id": deployment }),
        )
        .await;
        self.settled(deployment, "DESTROYED").await;
        let status = terminate(&mut self.served.child);
        assert!(status.success(), "the server stops cleanly: {status}");
    }

    async fn provider_report(&self) -> Report {
        report(&self.out.path().join("provider.txt")).await
    }
}

/// The report at `path` once it is there, each attempt to what it got.
async fn report(path: &Path) -> Report {
    let path: PathBuf = path.to_owned();
    let text = eventually(Duration::from_secs(30), "the probe's report", || async {
        std::fs::read_to_string(&path).ok()
    })
    .await;
    let report: Report = text
        .lines()
        .filter_map(|line| line.split_once(": "))
        .map(|(what, got)| (what.to_owned(), got.to_owned()))
        .collect();
    assert_eq!(
        report.keys().collect::<Vec<_>>().len(),
        ATTEMPTS.len(),
        "every attempt reported: {text}"
    );
    report
}

/// The attempts refused for want of permission (not for a missing file or
/// process, which would prove nothing).
fn refused(report: &Report) -> Vec<&str> {
    ATTEMPTS
        .iter()
        .copied()
        .filter(|what| matches!(report[*what].as_str(), "refused EACCES" | "refused EPERM"))
        .collect()
}

#[tokio::test]
async fn a_workload_and_its_provider_are_refused_the_servers_secrets() {
    let scene = Scene::start(Run::AsNobody { sandbox: true }).await;
    // The server keeps no secret in its environment, even as root reads it.
    let environ = std::fs::read(format!("/proc/{}/environ", scene.server_pid())).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(!environ.contains(ADMIN_TOKEN), "{environ}");

    let provider = scene.provider_report().await;
    assert_eq!(refused(&provider), ATTEMPTS, "the provider: {provider:?}");
    let (deployment, workload) = scene.workload_report(None).await;
    assert_eq!(refused(&workload), ATTEMPTS, "the workload: {workload:?}");
    scene.stop(&deployment).await;
}

#[tokio::test]
async fn unconfined_the_same_probe_reads_the_files_and_traces_others() {
    let scene = Scene::start(Run::AsNobody { sandbox: false }).await;
    let provider = scene.provider_report().await;
    assert_eq!(
        refused(&provider),
        ["server environ", "server mem", "server ptrace"],
        "the provider reads the data directory and traces a bystander; \
         the server is not dumpable: {provider:?}"
    );
    let (deployment, workload) = scene.workload_report(Some(json!("none"))).await;
    assert_eq!(
        refused(&workload),
        [
            "server environ",
            "server mem",
            "server ptrace",
            "control environ",
            "control mem",
            "control ptrace"
        ],
        "the workload reads the data directory, not its provider (non-dumpable): {workload:?}"
    );
    // Its provider keeps no token in its environment, even as root reads it.
    let provider: u32 = std::fs::read_to_string(scene.out.path().join("workload.ppid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let environ = std::fs::read(format!("/proc/{provider}/environ")).unwrap();
    let entries: Vec<_> = environ.split(|b| *b == 0).collect();
    assert!(
        entries.contains(&&b"CORBEL_PROVIDER_TOKEN="[..])
            && !entries
                .iter()
                .any(|e| e.starts_with(b"CORBEL_PROVIDER_TOKEN=")
                    && e.len() > "CORBEL_PROVIDER_TOKEN=".len()),
        "the token's value is gone: {}",
        String::from_utf8_lossy(&environ)
    );
    scene.stop(&deployment).await;
}

#[tokio::test]
async fn a_provider_run_as_another_user_is_refused_the_servers_secrets_unsandboxed() {
    let scene = Scene::start(Run::ProviderAsNobody).await;
    // Its user's, not the server's: the ids, the files, the process.
    let provider = scene.provider_report().await;
    let servers = &ATTEMPTS[..5];
    let all_refused = |report: &Report| servers.iter().all(|w| refused(report).contains(w));
    assert!(all_refused(&provider), "the provider: {provider:?}");
    let (deployment, workload) = scene.workload_report(Some(json!("none"))).await;
    assert!(all_refused(&workload), "the workload: {workload:?}");
    let ppid = std::fs::read_to_string(scene.out.path().join("workload.ppid")).unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/status", ppid.trim())).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert_eq!(
        uid.split_whitespace().nth(1),
        Some(NOBODY.to_string().as_str()),
        "the provider runs as nobody: {uid}"
    );
    let listed = scene
        .gql("{ providers { nodes { runAs } } }", json!({}))
        .await;
    assert_eq!(
        listed["data"]["providers"]["nodes"][0]["runAs"], "nobody",
        "{listed}"
    );
    scene.stop(&deployment).await;
}

/// A provider's build (`build.sh DATA_DIR OUT`): one line per attempt,
/// `<what>: done` or `<what>: refused <error>`, shown in its output and
/// written to `OUT/build.txt`; it fails if anything was refused.
const BUILD: &str = r#"
data=$1 out=$2
attempt() { if err=$(sh -c "$2" 2>&1 >/dev/null); then echo "$1: done"; else echo "$1: refused $err"; fi; }
{
attempt "read secret.key" "cat $data/secret.key"
attempt "read corbel.db" "cat $data/corbel.db"
attempt "write the data dir" "echo x > $data/planted"
attempt "write /var/tmp" 'f=$(mktemp -p /var/tmp) && rm "$f"'
attempt "read the system" "cat /etc/passwd"
attempt "write its checkout" "echo x > built"
attempt "write its build dir" 'echo x > "$CORBEL_BUILD_DIR/built"'
attempt "write a temp file" 'f=$(mktemp) && rm "$f"'
} > "$out/build.partial"
cat "$out/build.partial"
mv "$out/build.partial" "$out/build.txt"
! grep -q refused "$out/build.txt"
"#;

/// A server run as `nobody`, contained or not, that loaded a provider built
/// by [`BUILD`]; what the build reported.
struct Built {
    report: Report,
    served: Served,
    provider: String,
    /// The data directory and the build's report's, kept while it runs.
    _dirs: (TempDir, TempDir),
}

async fn build_report(sandbox: bool) -> Built {
    let data = nobody_dir();
    let out = nobody_dir();
    let metadata = format!(
        "name: builder\nversion: 0.1.0\nruntime: shell\nshell:\n  build: sh build.sh {data} {out}\n  \
         run: exec sleep 600\n",
        data = data.path().display(),
        out = out.path().display(),
    );
    let repo = ProviderRepo::new(&metadata, &[("build.sh", BUILD)]);
    chown_nobody(repo.bare().parent().unwrap());
    let store = TestStore {
        dir: data,
        database_url: None,
    };
    let out_text = out.path().display().to_string();
    let mut command = serve_command(
        &store,
        &[
            ("CORBEL_ADMIN_TOKEN", ADMIN_TOKEN),
            ("CORBEL_PROVIDER_SANDBOX", &sandbox.to_string()),
            ("CORBEL_PROVIDER_SANDBOX_WRITE", &out_text),
        ],
    );
    command.uid(NOBODY).gid(NOBODY);
    let served = spawn_served(command);
    let created = admin_gql(
        served.addr,
        "mutation($input: CreateProviderInput!) { createProvider(input: $input) { provider { id } } }",
        json!({ "input": { "name": "builder", "gitUrl": repo.url() } }),
    )
    .await
    .unwrap();
    let id = created["data"]["createProvider"]["provider"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    let text = eventually(Duration::from_secs(60), "the build's report", || async {
        std::fs::read_to_string(out.path().join("build.txt")).ok()
    })
    .await;
    let report: Report = text
        .lines()
        .filter_map(|line| line.split_once(": "))
        .map(|(what, got)| (what.to_owned(), got.to_owned()))
        .collect();
    assert_eq!(report.len(), 8, "every attempt reported: {text}");
    Built {
        report,
        served,
        provider: id,
        _dirs: (store.dir, out),
    }
}

/// The attempts of a build report refused for want of permission.
fn build_refused(report: &Report) -> Vec<&str> {
    report
        .iter()
        .filter(|(_, got)| got.starts_with("refused") && got.contains("Permission denied"))
        .map(|(what, _)| what.as_str())
        .collect()
}

#[tokio::test]
async fn a_providers_build_is_refused_the_servers_secrets() {
    let Built {
        report,
        mut served,
        provider,
        _dirs,
    } = build_report(true).await;
    assert_eq!(
        build_refused(&report),
        [
            "read corbel.db",
            "read secret.key",
            "write /var/tmp",
            "write the data dir"
        ],
        "only what is not the build's is refused: {report:?}"
    );
    let message = eventually(Duration::from_secs(30), "the build to fail", || async {
        let body = admin_gql(
            served.addr,
            "query($id: ID!) { provider(id: $id) { status statusMessage } }",
            json!({ "id": provider }),
        )
        .await
        .unwrap();
        let provider = &body["data"]["provider"];
        (provider["status"] == "FAILED").then(|| provider["statusMessage"].to_string())
    })
    .await;
    assert!(
        message.contains("build command") && message.contains("read secret.key: refused"),
        "{message}"
    );
    assert!(terminate(&mut served.child).success());
}

#[tokio::test]
async fn unconfined_the_same_build_reads_the_servers_secrets() {
    let mut built = build_report(false).await;
    let report = &built.report;
    assert!(
        report.values().all(|got| got == "done"),
        "unconfined, the build reads and writes all: {report:?}"
    );
    assert!(terminate(&mut built.served.child).success());
}
