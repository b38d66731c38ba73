//! Docker runtime figures (a benchmark, not a test: it prints, it does not
//! assert): the provider image build of `runtime: docker`, on the real engine.
//!
//! The provider is the reference `corbel-provider-process` (release, stripped)
//! with the libraries `ldd` lists, in an image `FROM scratch`. Each figure is
//! the time a provider spends `BUILDING` (from its status turning `BUILDING` to
//! it leaving it), and the load as a whole (until `CONNECTED`):
//!
//! 1. cold: a new provider whose files the engine has never seen (a random
//!    file in the copied tree), so every step is built;
//! 2. cached, same commit: the same provider loaded again: Corbel finds its
//!    tag built from the same section and sends nothing to the engine;
//! 3. new commit, same files: a commit that changes nothing the image copies,
//!    so Corbel sends the context and the engine answers every step from its
//!    cache.
//!
//! Run with `cargo bench --bench docker` (the engine must answer; it builds
//! the provider in release first). Everything it makes carries its providers'
//! labels and is removed at the end.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use corbel::config::Config;
use corbel::events::Bus;
use corbel::provider::{NewProvider, ProviderStatus, Providers};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs of each kind.
const RUNS: usize = 3;

const DOCKERFILE: &str = "FROM scratch\nCOPY rootfs/ /\n";
const METADATA: &str = "name: boxed\nversion: 0.1.0\nruntime: docker\n\
    docker:\n  command: [/corbel-provider-process]\n\
    features: [deploy, nodes]\nresource_types: [bench.v1]\n";

fn main() {
    let answer = Command::new("docker").args(["info"]).output();
    assert!(
        matches!(&answer, Ok(out) if out.status.success()),
        "the Docker engine does not answer (`docker info`)"
    );
    let bin = build_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "corbel docker runtime benchmark ({} cores)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    runtime.block_on(run(&bin));
}

/// `target/release/corbel-provider-process` (this bench runs from
/// `target/release/deps`).
fn build_provider() -> PathBuf {
    let status = Command::new(env!("CARGO"))
        .args(["build", "--release", "-p", "corbel-provider-process"])
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the process provider failed");
    std::env::current_exe()
        .expect("the bench's path")
        .parent()
        .and_then(Path::parent)
        .expect("target/release")
        .join("corbel-provider-process")
}

fn run_ok(command: &mut Command) -> String {
    let out = command.output().expect("runs");
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn git(dir: &Path, args: &[&str]) -> String {
    run_ok(
        Command::new("git")
            .args(["-c", "user.name=b", "-c", "user.email=b@example.com"])
            .args(["-c", "init.defaultBranch=main"])
            .args(args)
            .current_dir(dir),
    )
}

/// A work tree with the provider's files (and a random file, so the engine
/// has never seen this tree) and its bare clone's URL.
fn provider_repo(root: &Path, bin: &Path) -> (PathBuf, String) {
    let name = Uuid::new_v4().simple().to_string();
    let work = root.join(format!("{name}-work"));
    let rootfs = work.join("rootfs");
    std::fs::create_dir_all(&rootfs).expect("work dir");
    std::fs::write(work.join("corbel-provider.yaml"), METADATA).expect("metadata");
    std::fs::write(work.join("Dockerfile"), DOCKERFILE).expect("Dockerfile");
    std::fs::write(rootfs.join("nonce"), &name).expect("nonce");
    run_ok(
        Command::new("strip")
            .arg("-o")
            .arg(rootfs.join("corbel-provider-process"))
            .arg(bin),
    );
    let ldd = run_ok(Command::new("ldd").arg(bin));
    for line in ldd.lines() {
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            let copy = rootfs.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(copy.parent().expect("a parent")).expect("lib dir");
            std::fs::copy(path, copy).expect("a library");
        }
    }
    git(&work, &["init", "-q"]);
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "provider"]);
    let bare = root.join(format!("{name}.git"));
    git(
        root,
        &[
            "clone",
            "-q",
            "--bare",
            work.to_str().expect("utf-8 path"),
            bare.to_str().expect("utf-8 path"),
        ],
    );
    git(
        &work,
        &[
            "remote",
            "add",
            "origin",
            bare.to_str().expect("utf-8 path"),
        ],
    );
    (work, format!("file://{}", bare.display()))
}

/// Time spent `BUILDING`, and until `CONNECTED`, of a load started now.
async fn timed_load(providers: &Providers, id: Uuid) -> (Duration, Duration) {
    let started = Instant::now();
    providers.load(id).await.expect("load");
    let mut building: Option<Instant> = None;
    let mut built: Option<Instant> = None;
    loop {
        let p = providers.get(id).await.expect("get");
        let now = Instant::now();
        match p.status {
            ProviderStatus::Building => {
                building.get_or_insert(now);
            }
            ProviderStatus::Starting | ProviderStatus::Registering => {
                building.get_or_insert(now);
                built.get_or_insert(now);
            }
            ProviderStatus::Connected => {
                let built = built.unwrap_or(now);
                let building = building.unwrap_or(started);
                return (built - building, now - started);
            }
            ProviderStatus::Failed => panic!("the provider failed: {:?}", p.status_message),
            _ => {}
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "loading took too long"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64()
}

fn figures(what: &str, runs: Vec<(Duration, Duration)>) {
    let builds: Vec<Duration> = runs.iter().map(|r| r.0).collect();
    let loads: Vec<Duration> = runs.iter().map(|r| r.1).collect();
    let shown: Vec<String> = builds
        .iter()
        .map(|d| format!("{:.3}", d.as_secs_f64()))
        .collect();
    println!(
        "{what}: build median {:.3} s ({} s; status polled every 2 ms), load to CONNECTED median {:.3} s",
        median(builds),
        shown.join(", "),
        median(loads)
    );
}

async fn run(bin: &Path) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config::for_data_dir(dir.path().join("data"));
    config.provider.backoff_max = Duration::from_secs(1);
    let mut settings = config.provider_settings().expect("settings");
    settings.instance_id = format!("bench-{}", Uuid::new_v4().simple());
    let db = corbel::store::connect(&config.database().expect("database"))
        .await
        .expect("store");
    corbel::store::migrate(&db).await.expect("migrations");
    let stopping = CancellationToken::new();
    let providers = Providers::new(
        db,
        settings.clone(),
        corbel::seal::SecretKey::generate(),
        Bus::new(4096, stopping.clone()),
        stopping.clone(),
    );
    let registry_stop = CancellationToken::new();
    let registry = tokio::spawn(
        corbel::provider::serve_registry(providers.clone(), registry_stop.clone())
            .await
            .expect("registry"),
    );

    let context_bytes = {
        let (work, _) = provider_repo(dir.path(), bin);
        let size = run_ok(Command::new("du").args(["-sb"]).arg(work.join("rootfs")));
        size.split_whitespace().next().unwrap_or("?").to_owned()
    };
    println!("the image's files: {context_bytes} bytes (the stripped provider, its libraries)");

    let mut ids = Vec::new();
    let (mut cold, mut cached, mut recommit) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..RUNS {
        let (work, url) = provider_repo(dir.path(), bin);
        let (p, _) = providers
            .create(NewProvider {
                name: format!("boxed-{i}"),
                git_url: url,
                git_ref: "main".into(),
                path: String::new(),
                config: json!({}),
                secret_config: json!({}),
                auto_load: false,
            })
            .await
            .expect("create");
        ids.push(p.id);
        cold.push(timed_load(&providers, p.id).await);
        providers.unload(p.id).await.expect("unload");
        cached.push(timed_load(&providers, p.id).await);
        let log = providers.logs(p.id, 500).await.expect("logs");
        assert!(
            log.iter()
                .any(|l| l.line.contains("cache hit, not rebuilt")),
            "the second load is a cache hit"
        );
        providers.unload(p.id).await.expect("unload");
        std::fs::write(work.join("README"), "outside the copied tree\n").expect("README");
        git(&work, &["add", "-A"]);
        git(&work, &["commit", "-q", "-m", "readme"]);
        git(&work, &["push", "-q", "origin", "main"]);
        recommit.push(timed_load(&providers, p.id).await);
        providers.unload(p.id).await.expect("unload");
    }
    figures("cold build (new files)", cold);
    figures("same commit again (Corbel's tag cache)", cached);
    figures(
        "new commit, same files (the engine's layer cache)",
        recommit,
    );

    stopping.cancel();
    providers.shutdown().await;
    registry_stop.cancel();
    let _ = registry.await;
    for id in ids {
        let label = format!("label=io.corbel.provider={id}");
        for c in run_ok(Command::new("docker").args(["ps", "-aq", "--filter", &label])).lines() {
            let _ = Command::new("docker").args(["rm", "-f", c]).output();
        }
        for i in run_ok(Command::new("docker").args(["images", "-q", "--filter", &label])).lines() {
            let _ = Command::new("docker").args(["rmi", "-f", i]).output();
        }
    }
}
