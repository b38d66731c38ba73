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
//! Then containers as resources, through `providers/docker` (loaded from git
//! like any provider, in release): a blueprint of 50 independent containers
//! of one image deployed and destroyed through the engine (`Deployments`,
//! 16 calls in flight), against 50 `docker run -d` and 50 `docker rm -f` of
//! the same image in the same run, one after another and 16 at a time. The
//! figure is the ratio of wall times. The image is Debian's static busybox on
//! nothing (`/bin/busybox`, from busybox-static).
//!
//! Run with `cargo bench --profile dist --bench docker` (the engine must answer; it builds
//! the providers in release first). Everything it makes carries its
//! providers' or its deployment's labels and is removed at the end.

#[path = "common/profile.rs"]
mod profile;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use corbel::config::Config;
use corbel::deploy::{DeploySettings, DeploymentState, Deployments, NewDeployment, OnFailure};
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
    let bin = build_release("corbel-provider-process");
    let docker_provider = build_release("corbel-provider-docker");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    profile::announce("docker runtime");
    runtime.block_on(run(&bin));
    runtime.block_on(containers(&docker_provider));
}

/// `target/<profile>/<package>`, built in this bench's profile.
fn build_release(package: &str) -> PathBuf {
    profile::build(&["-p", package]).join(package)
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
                run_as: String::new(),
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

/// Containers in the benchmark's blueprint and `docker run` loops.
const CONTAINERS: usize = 50;
/// The busybox image the containers run.
const BUSYBOX: &str = "corbel-bench-busybox:1";

/// 50 containers through Corbel against 50 `docker run`s.
async fn containers(provider_bin: &Path) {
    let dir = tempfile::tempdir().expect("temp dir");
    busybox_image(dir.path());
    let config = Config::for_data_dir(dir.path().join("data"));
    let db = corbel::store::connect(&config.database().expect("database"))
        .await
        .expect("store");
    corbel::store::migrate(&db).await.expect("migrations");
    let stopping = CancellationToken::new();
    let providers = Providers::new(
        db.clone(),
        config.provider_settings().expect("settings"),
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
    let deployments = Deployments::new(
        db.clone(),
        providers.clone(),
        Bus::new(65_536, stopping.clone()),
        DeploySettings::default(),
        stopping.clone(),
    );
    let work = dir.path().join("docker-provider");
    std::fs::create_dir_all(&work).expect("work dir");
    std::fs::write(
        work.join("corbel-provider.yaml"),
        format!(
            "name: docker\nversion: 0.1.0\nruntime: shell\nshell:\n  run: exec {}\n\
             features: [deploy, destroy, inspect, nodes, data, power]\n\
             resource_types: [docker.v1.container, docker.v1.network, docker.v1.volume]\n",
            provider_bin.display()
        ),
    )
    .expect("metadata");
    git(&work, &["init", "-q"]);
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "docker provider"]);
    let (provider, _) = providers
        .create(NewProvider {
            name: "docker".into(),
            git_url: format!("file://{}", work.display()),
            git_ref: String::new(),
            path: String::new(),
            // A stop waits for nothing, as `docker rm -f` does.
            config: json!({ "capacity": 1000, "stop_timeout_s": 0 }),
            secret_config: json!({}),
            auto_load: true,
            run_as: String::new(),
        })
        .await
        .expect("create the docker provider");
    let wait = Instant::now();
    while providers.get(provider.id).await.expect("get").status != ProviderStatus::Connected {
        assert!(
            wait.elapsed() < Duration::from_secs(60),
            "the docker provider did not connect"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let mut source = String::from("resources:\n");
    for i in 0..CONTAINERS {
        source.push_str(&format!(
            "  c{i}: {{ type: docker.v1.container, config: {{ image: \"{BUSYBOX}\", command: \"exec sleep 3600\" }} }}\n"
        ));
    }
    let blueprint = deployments
        .blueprints()
        .create(
            deployments
                .blueprints()
                .default_project()
                .await
                .expect("project"),
            "containers".into(),
            None,
            source,
        )
        .await
        .expect("blueprint");
    let started = Instant::now();
    let deployment = deployments
        .runs()
        .deploy(NewDeployment {
            blueprint_id: blueprint.id,
            name: "containers".into(),
            variables: serde_json::Map::new(),
            on_failure: OnFailure::Keep,
            expires_at: None,
        })
        .await
        .expect("deploy");
    settle(&deployments, deployment.id, DeploymentState::Complete).await;
    let corbel_up = started.elapsed();
    let label = format!("label=io.corbel.deployment={}", deployment.id);
    let made = run_ok(Command::new("docker").args(["ps", "-q", "--filter", &label]));
    assert_eq!(made.lines().count(), CONTAINERS, "every container runs");
    let started = Instant::now();
    deployments
        .runs()
        .destroy(deployment.id)
        .await
        .expect("destroy");
    settle(&deployments, deployment.id, DeploymentState::Destroyed).await;
    let corbel_down = started.elapsed();

    let (serial_up, serial_down) = docker_runs(1);
    let (parallel_up, parallel_down) = docker_runs(16);
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "{CONTAINERS} containers through Corbel (16 calls in flight): up {:.2} s, destroyed {:.2} s",
        corbel_up.as_secs_f64(),
        corbel_down.as_secs_f64()
    );
    println!(
        "{CONTAINERS} `docker run -d`, one at a time: {:.2} s, `docker rm -f` {:.2} s; Corbel ÷ docker: up {:.2}, down {:.2}",
        serial_up.as_secs_f64(),
        serial_down.as_secs_f64(),
        ratio(corbel_up, serial_up),
        ratio(corbel_down, serial_down)
    );
    println!(
        "{CONTAINERS} `docker run -d`, 16 at a time: {:.2} s, `docker rm -f` {:.2} s; Corbel ÷ docker: up {:.2}, down {:.2}",
        parallel_up.as_secs_f64(),
        parallel_down.as_secs_f64(),
        ratio(corbel_up, parallel_up),
        ratio(corbel_down, parallel_down)
    );

    stopping.cancel();
    providers.shutdown().await;
    registry_stop.cancel();
    let _ = registry.await;
}

/// Waits for a deployment to reach `state` (panics if it fails).
async fn settle(deployments: &Deployments, id: Uuid, state: DeploymentState) {
    let started = Instant::now();
    loop {
        let now = deployments.queries().get(id).await.expect("deployment");
        if now.state == state {
            return;
        }
        assert!(
            now.state != DeploymentState::Failed,
            "the deployment failed: {:?}",
            now.error
        );
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the deployment took too long"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// 50 `docker run -d` of the busybox image, `parallel` at a time, then 50
/// `docker rm -f`: the wall time of each.
fn docker_runs(parallel: usize) -> (Duration, Duration) {
    let label = format!("io.corbel.bench={}", Uuid::new_v4().simple());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let ids = std::sync::Mutex::new(Vec::new());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..parallel {
            scope.spawn(|| {
                while next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < CONTAINERS {
                    let id = run_ok(Command::new("docker").args([
                        "run",
                        "-d",
                        "--label",
                        &label,
                        BUSYBOX,
                        "sh",
                        "-c",
                        "exec sleep 3600",
                    ]));
                    ids.lock().expect("ids").push(id);
                }
            });
        }
    });
    let up = started.elapsed();
    let ids = ids.into_inner().expect("ids");
    let next = std::sync::atomic::AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..parallel {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(id) = ids.get(i) else { break };
                    run_ok(Command::new("docker").args(["rm", "-f", id]));
                }
            });
        }
    });
    (up, started.elapsed())
}

/// Builds [`BUSYBOX`]: `/bin/busybox` on nothing, its applets in `/bin`.
fn busybox_image(dir: &Path) {
    let context = dir.join("busybox-image");
    std::fs::create_dir_all(&context).expect("context dir");
    std::fs::copy("/bin/busybox", context.join("busybox"))
        .expect("/bin/busybox (Debian's busybox-static)");
    std::fs::write(
        context.join("Dockerfile"),
        "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n",
    )
    .expect("Dockerfile");
    run_ok(
        Command::new("docker")
            .args(["build", "-q", "-t", BUSYBOX])
            .arg(&context),
    );
}
