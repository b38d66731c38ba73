//! Exec figures (issue 39; a benchmark, not a test: it prints each figure
//! beside its goal, it does not assert).
//!
//! The real `corbel serve` binary, with the process provider built in the
//! bench's profile and loaded from git, runs one `process.v1.service`
//! (`sleep 3600`); every command below runs in it.
//!
//! 1. Round trip: 200 execs of `true`, from the `start` message sent to the
//!    `exit` message received over the `/exec` websocket (a new socket each,
//!    its upgrade not counted), and the same 200 as `execResource` over
//!    GraphQL HTTP (the whole request): median, p95, max.
//! 2. Stdout throughput: `head -c 1073741824 /dev/zero` through exec, read
//!    fully over `/exec` (from `start` sent to `exit` received), beside the
//!    same command run by the bench as a plain child process and its stdout
//!    read from the pipe in the same run. `head` of `/dev/zero` rather than
//!    `cat` of a 1 GiB file: no file to write first, and neither side pays
//!    for the page cache. With the server's RSS before and after (flat
//!    memory: nothing is held as it streams) and the CPU seconds of the
//!    server, the provider and the bench (the client) meanwhile.
//! 3. cp throughput: a tree of 8 files of 32 MiB (256 MiB) copied into the
//!    service's working directory and back out by the real `corbel cp`
//!    (timed whole, the CLI's start and sign-in included), beside the same
//!    tree copied by plain `tar -cf - | tar -xf -` in the same run; each copy
//!    checked byte for byte by size and a sample. With the server's RSS.
//!
//! Goals: stdout through exec ≥ 200 MiB/s on loopback with the process
//! provider, and cp ≥ 200 MiB/s each way.
//!
//! Run with `cargo bench --bench exec` (or `--profile dist`).

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use common::api::Api;
use common::{cpu_seconds, load, profile};

const TOKEN: &str = "cbl_bench_admin_token_0123456789abcdef";
const ROUND_TRIPS: usize = 200;
/// 1 GiB.
const BYTES: u64 = 1 << 30;
const GOAL_MIB_S: f64 = 200.0;

fn main() {
    let bins = profile::build(&["-p", "corbel-provider-process"]);
    profile::announce("exec");
    println!("load average: {}", load());
    let mark = uuid::Uuid::new_v4().to_string();
    let _leftovers = Leftovers(mark.clone());
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run(&bins, &mark));
}

async fn run(bins: &Path, mark: &str) {
    let root = tempfile::tempdir().expect("temp dir");
    let process = provider_repo(
        root.path(),
        &format!("exec {}", bins.join("corbel-provider-process").display()),
    );
    let data = root.path().join("data");
    // The service works (and cp writes) in a directory of the bench's,
    // which providers may write only when the operator says so.
    let work = root.path().join("work");
    std::fs::create_dir_all(&work).expect("the service's working directory");
    let server = common::serve(env!("CARGO_BIN_EXE_corbel"), &data, |command| {
        command
            .args(["--log-filter", "warn,corbel::cli=info"])
            .env("CORBEL_ADMIN_TOKEN", TOKEN)
            .env("CORBEL_PROVIDER_SANDBOX_WRITE", &work);
    });
    let api = Api::new(&server.addr, TOKEN).await;
    let provider = api
        .provider("process", &process, json!({ "grace_ms": 1000 }))
        .await;
    let provider_pid = child_of(server.child.id() as i32, "corbel-provider")
        .unwrap_or_else(|| panic!("no process provider ({provider}) under the server"));
    let node = deploy(&api, mark, &work).await;

    // 1. Round trip of `true`.
    for _ in 0..5 {
        ws_exec(&server.addr, &node, &["true"], |_| {}).await; // warm up
    }
    let mut ws = Vec::with_capacity(ROUND_TRIPS);
    for _ in 0..ROUND_TRIPS {
        ws.push(ws_exec(&server.addr, &node, &["true"], |_| {}).await.took);
    }
    let mut gql = Vec::with_capacity(ROUND_TRIPS);
    for _ in 0..ROUND_TRIPS {
        let asked = Instant::now();
        let d = api
            .gql(
                "mutation($node: ID!) { execResource(nodeId: $node, command: [\"true\"]) { exitCode } }",
                json!({ "node": node }),
            )
            .await;
        gql.push(asked.elapsed());
        assert_eq!(d["execResource"]["exitCode"], 0, "{d}");
    }
    println!("round trip of `true` ({ROUND_TRIPS} each, one after another):");
    for (how, samples) in [
        ("/exec websocket", &mut ws),
        ("execResource (HTTP)", &mut gql),
    ] {
        println!(
            "  {how:<20} median {:>6.2} ms  p95 {:>6.2} ms  max {:>6.2} ms",
            ms(quantile(samples, 0.5)),
            ms(quantile(samples, 0.95)),
            ms(quantile(samples, 1.0)),
        );
    }

    // 2. Stdout throughput.
    let size = BYTES.to_string();
    let command = ["head", "-c", size.as_str(), "/dev/zero"];
    let local = tokio::task::spawn_blocking(move || {
        plain(&["head", "-c", &BYTES.to_string(), "/dev/zero"])
    })
    .await
    .expect("the plain copy");
    let server_pid = server.child.id() as i32;
    let rss_before = server.status_kib("VmRSS:");
    let cpu = [server_pid, provider_pid, std::process::id() as i32].map(cpu_seconds);
    let mut frames = 0u64;
    let mut largest = 0usize;
    let through = ws_exec(&server.addr, &node, &command, |frame| {
        frames += 1;
        largest = largest.max(frame);
    })
    .await;
    let cpu_after = [server_pid, provider_pid, std::process::id() as i32].map(cpu_seconds);
    let rss_after = server.status_kib("VmRSS:");
    let hwm = server.status_kib("VmHWM:");
    assert_eq!(through.stdout, BYTES, "every byte through exec");
    let (exec_rate, local_rate) = (mib_s(BYTES, through.took), mib_s(BYTES, local));
    println!("stdout throughput, 1 GiB of `head -c {BYTES} /dev/zero`:");
    println!(
        "  plain child process, read from its pipe: {:>7.1} MiB/s ({:.2} s)",
        local_rate,
        local.as_secs_f64()
    );
    println!(
        "  through exec (/exec websocket):          {:>7.1} MiB/s ({:.2} s; {frames} frames, {:.1} KiB on average, largest {:.1} KiB)   goal ≥ {GOAL_MIB_S:.0} MiB/s",
        exec_rate,
        through.took.as_secs_f64(),
        BYTES as f64 / frames.max(1) as f64 / 1024.0,
        largest as f64 / 1024.0,
    );
    println!(
        "  exec / plain: {:.3} ({:.1}× slower)",
        exec_rate / local_rate,
        local_rate / exec_rate
    );
    println!(
        "  server RSS {:.1} → {:.1} MiB ({:+.1} MiB; peak over its life {:.1} MiB)",
        rss_before as f64 / 1024.0,
        rss_after as f64 / 1024.0,
        (rss_after as f64 - rss_before as f64) / 1024.0,
        hwm as f64 / 1024.0,
    );
    println!(
        "  CPU seconds meanwhile: server {:.2}, provider {:.2}, bench (the client) {:.2}",
        cpu_after[0] - cpu[0],
        cpu_after[1] - cpu[1],
        cpu_after[2] - cpu[2],
    );
    println!(
        "verdict: stdout through exec {exec_rate:.1} MiB/s: {} the goal of ≥ {GOAL_MIB_S:.0} MiB/s",
        if exec_rate >= GOAL_MIB_S {
            "meets"
        } else {
            "MISSES"
        }
    );

    // 3. cp.
    cp_throughput(root.path(), &server).await;
    server.stop();
    println!("load average: {}", load());
}

/// Files in a cp tree, and the size of each.
const CP_FILES: usize = 8;
const CP_FILE_BYTES: usize = 32 << 20;

/// Part 3: `corbel cp` into the service and out, beside plain tar.
async fn cp_throughput(root: &Path, server: &common::Server) {
    let total = (CP_FILES * CP_FILE_BYTES) as u64;
    let tree = root.join("tree");
    make_tree(&tree);
    let (plain_to, out_to) = (root.join("plain"), root.join("out"));
    for dir in [&plain_to, &out_to] {
        std::fs::create_dir_all(dir).expect("a destination");
    }
    let plain_pipe = format!(
        "tar -C '{}' -cf - tree | tar -C '{}' -xf -",
        root.display(),
        plain_to.display()
    );
    let plain = timed(Command::new("sh").args(["-c", &plain_pipe]));
    same_tree(&tree, &plain_to.join("tree"));
    let rss_before = server.status_kib("VmRSS:");
    let url = format!("http://{}", server.addr);
    let corbel = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_corbel"));
        command.env("CORBEL_URL", &url).env("CORBEL_TOKEN", TOKEN);
        command
    };
    let tree_arg = tree.display().to_string();
    let into = timed(corbel().args(["cp", &tree_arg, "exec:app:."]));
    same_tree(&tree, &root.join("work").join("tree"));
    let out_arg = out_to.display().to_string();
    let out = timed(corbel().args(["cp", "exec:app:tree", &out_arg]));
    same_tree(&tree, &out_to.join("tree"));
    let rss_after = server.status_kib("VmRSS:");
    let (into_rate, out_rate, plain_rate) =
        (mib_s(total, into), mib_s(total, out), mib_s(total, plain));
    println!(
        "cp throughput, a tree of {CP_FILES} files of {} MiB:",
        CP_FILE_BYTES >> 20
    );
    println!(
        "  plain `tar -cf - | tar -xf -`:      {plain_rate:>7.1} MiB/s ({:.2} s)",
        plain.as_secs_f64()
    );
    for (how, rate, took) in [("into", into_rate, into), ("out of", out_rate, out)] {
        println!(
            "  `corbel cp` {how:<7} the resource: {rate:>7.1} MiB/s ({:.2} s; {:.1}× plain)   goal ≥ {GOAL_MIB_S:.0} MiB/s",
            took.as_secs_f64(),
            plain_rate / rate,
        );
    }
    println!(
        "  server RSS {:.1} → {:.1} MiB ({:+.1} MiB)",
        rss_before as f64 / 1024.0,
        rss_after as f64 / 1024.0,
        (rss_after as f64 - rss_before as f64) / 1024.0,
    );
    let worst = into_rate.min(out_rate);
    println!(
        "verdict: cp {worst:.1} MiB/s the slower way: {} the goal of ≥ {GOAL_MIB_S:.0} MiB/s",
        if worst >= GOAL_MIB_S {
            "meets"
        } else {
            "MISSES"
        }
    );
}

/// `CP_FILES` files of `CP_FILE_BYTES`, half in a subdirectory, each of its
/// own bytes.
fn make_tree(tree: &Path) {
    std::fs::create_dir_all(tree.join("sub")).expect("the tree");
    for i in 0..CP_FILES {
        let bytes: Vec<u8> = (0..CP_FILE_BYTES)
            .map(|j| {
                (j as u64)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(i as u64) as u8
            })
            .collect();
        std::fs::write(tree_file(tree, i), bytes).expect("a file of the tree");
    }
}

fn tree_file(tree: &Path, i: usize) -> std::path::PathBuf {
    match i % 2 {
        0 => tree.join(format!("file-{i}")),
        _ => tree.join("sub").join(format!("file-{i}")),
    }
}

/// Each file of `copy` as long as in `tree`, and the same at a few places.
fn same_tree(tree: &Path, copy: &Path) {
    for i in 0..CP_FILES {
        let (a, b) = (tree_file(tree, i), tree_file(copy, i));
        let (a, b) = (
            std::fs::read(&a).expect("the original"),
            std::fs::read(&b).unwrap_or_else(|e| panic!("{}: {e}", b.display())),
        );
        assert_eq!(a.len(), b.len(), "file {i} copied whole");
        for at in [0, a.len() / 3, a.len() / 2, a.len() - 1] {
            assert_eq!(a[at], b[at], "file {i} at {at}");
        }
    }
}

/// Runs `command` to a successful end; how long it took.
fn timed(command: &mut Command) -> Duration {
    let started = Instant::now();
    let status = command.status().expect("the command starts");
    assert!(status.success(), "{command:?}: {status}");
    started.elapsed()
}

/// What one exec over `/exec` gave: the time from `start` sent to `exit`
/// received, and the stdout bytes.
struct Ran {
    took: Duration,
    stdout: u64,
}

/// Runs `command` in `node` over a new `/exec` socket; `frame` sees the
/// size of each stdout frame's bytes.
async fn ws_exec(addr: &str, node: &str, command: &[&str], mut frame: impl FnMut(usize)) -> Ran {
    let mut request = format!("ws://{addr}/exec")
        .into_client_request()
        .expect("request");
    request.headers_mut().insert(
        "Authorization",
        format!("Bearer {TOKEN}").parse().expect("a header"),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("websocket");
    let start = json!({
        "type": "start", "nodeId": node, "command": command,
        "tty": false, "stdin": false, "timeoutSeconds": 0,
    });
    let sent = Instant::now();
    ws.send(Message::Text(start.to_string().into()))
        .await
        .expect("start");
    let mut stdout = 0u64;
    let took = loop {
        match ws.next().await.expect("the exit").expect("a message") {
            Message::Binary(bytes) => {
                assert_eq!(bytes.first(), Some(&1), "stdout only");
                stdout += bytes.len() as u64 - 1;
                frame(bytes.len() - 1);
            }
            Message::Text(text) => {
                let message: Value = serde_json::from_str(&text).expect("json");
                match message["type"].as_str() {
                    Some("started") => {}
                    Some("exit") => {
                        assert_eq!(message["code"], 0, "{message}");
                        break sent.elapsed();
                    }
                    _ => panic!("{message}"),
                }
            }
            _ => {}
        }
    };
    // Its close, so that the sockets do not pile up.
    while let Some(Ok(_)) = ws.next().await {}
    Ran { took, stdout }
}

/// `command` as a plain child process, its stdout read to its end: the time.
fn plain(command: &[&str]) -> Duration {
    let started = Instant::now();
    let mut child = Command::new(command[0])
        .args(&command[1..])
        .stdout(Stdio::piped())
        .spawn()
        .expect("the command starts");
    let mut out = child.stdout.take().expect("piped");
    let mut buffer = vec![0u8; 64 * 1024];
    let mut read = 0u64;
    loop {
        match out.read(&mut buffer).expect("read") {
            0 => break,
            n => read += n as u64,
        }
    }
    assert!(child.wait().expect("wait").success());
    assert_eq!(read, BYTES);
    started.elapsed()
}

/// One `sleep 3600` service in `work`, marked for the clean-up, deployed;
/// its node's id.
async fn deploy(api: &Api, mark: &str, work: &Path) -> String {
    let source = format!(
        "resources:\n  app:\n    type: process.v1.service\n    config: {{ command: sleep, args: [\"3600\"], cwd: \"{}\", env: {{ EXEC_BENCH: \"{mark}\" }} }}\n",
        work.display()
    );
    let id = api.deploy("exec", &source).await;
    api.settled(&id, Duration::from_secs(120)).await;
    let query = "query($id: ID!) { deployment(id: $id) { nodes { id } } }";
    api.gql(query, json!({ "id": id })).await["deployment"]["nodes"][0]["id"]
        .as_str()
        .expect("a node")
        .to_owned()
}

/// A repository whose metadata runs `run` (the process provider); its URL.
fn provider_repo(root: &Path, run: &str) -> String {
    let work = root.join("process-work");
    std::fs::create_dir_all(&work).expect("work dir");
    std::fs::write(
        work.join("corbel-provider.yaml"),
        format!(
            "name: process\nversion: 0.1.0\nruntime: shell\nshell:\n  run: {run}\nresource_types: [process.v1.service]\n"
        ),
    )
    .expect("metadata");
    for args in [
        &["init", "-q"][..],
        &["add", "-A"],
        &["commit", "-q", "-m", "provider"],
    ] {
        let status = Command::new("git")
            .args(["-c", "user.name=b", "-c", "user.email=b@example.com"])
            .args(["-c", "init.defaultBranch=main"])
            .args(args)
            .current_dir(&work)
            .status()
            .expect("git runs");
        assert!(status.success(), "git {args:?}");
    }
    format!("file://{}", work.display())
}

/// A child of `parent` whose name (`comm`, 15 bytes at most) is `comm`.
fn child_of(parent: i32, comm: &str) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let (name, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
            let ppid: i32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent && name == comm).then_some(pid)
        })
}

fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort_unstable();
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mib_s(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / took.as_secs_f64()
}

/// The service (and anything left with the bench's mark) is killed at the
/// end, whatever happened.
struct Leftovers(String);

impl Drop for Leftovers {
    fn drop(&mut self) {
        let wanted = format!("EXEC_BENCH={}", self.0);
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let marked = std::fs::read(entry.path().join("environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == wanted.as_bytes()));
            if marked {
                // SAFETY: a signal to a workload this bench deployed.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}
