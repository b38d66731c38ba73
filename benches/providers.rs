//! Provider figures (a benchmark, not a test: it prints, it does not assert).
//!
//! 1. Load 100 providers at once: the reference `corbel-provider-process`,
//!    prebuilt, through git and the shell runtime; time from the first
//!    `create` until every one is `CONNECTED`.
//! 2. A unary call (`ListNodes`) through Corbel's link against the same call on
//!    a raw tonic client over the provider's unix socket, in the same run.
//! 3. No-op `DeployResource` calls per second through the link
//!    (`corbel-provider-fixture`, whose deploy does nothing).
//!
//! Run with `cargo bench --profile dist --bench providers`. It builds the provider binaries in
//! release mode first.

#[path = "common/profile.rs"]
mod profile;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use corbel::config::Config;
use corbel::events::Bus;
use corbel::provider::{NewProvider, ProviderStatus, Providers, ResourceCall};
use corbel_proto::v1::provider_client::ProviderClient;
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PROVIDERS: usize = 100;
const CALLS: usize = 5_000;
const DEPLOYS: usize = 5_000;
const DEPLOY_CONCURRENCY: usize = 16;

fn main() {
    let bins = build_provider_binaries();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    profile::announce("providers");
    runtime.block_on(run(&bins));
}

/// `target/<profile>`, with both providers built in this bench's profile.
fn build_provider_binaries() -> PathBuf {
    profile::build(&[
        "-p",
        "corbel-provider-process",
        "-p",
        "corbel-provider-fixture",
    ])
}

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .args(["-c", "user.name=b", "-c", "user.email=b@example.com"])
        .args(["-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .status()
        .expect("git runs");
    assert!(status.success(), "git {args:?}");
}

/// A bare repository whose metadata runs `bin` with `env` set.
fn provider_repo(root: &Path, name: &str, bin: &Path, env: &str) -> String {
    let work = root.join(format!("{name}-work"));
    std::fs::create_dir_all(&work).expect("work dir");
    std::fs::write(
        work.join("corbel-provider.yaml"),
        format!(
            "name: {name}\nversion: 0.1.0\nruntime: shell\nshell:\n  run: {env} exec {}\nfeatures: [deploy, nodes]\nresource_types: [bench.v1]\n",
            bin.display()
        ),
    )
    .expect("metadata");
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
    format!("file://{}", bare.display())
}

async fn run(bins: &Path) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config::for_data_dir(dir.path().join("data"));
    config.provider.health_interval = std::time::Duration::from_secs(5);
    let db = corbel::store::connect(&config.database().expect("database"))
        .await
        .expect("store");
    corbel::store::migrate(&db).await.expect("migrations");
    let stopping = CancellationToken::new();
    let providers = Providers::new(
        db,
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

    let process_url = provider_repo(
        dir.path(),
        "process",
        &bins.join("corbel-provider-process"),
        "",
    );
    let fixture_url = provider_repo(
        dir.path(),
        "fixture",
        &bins.join("corbel-provider-fixture"),
        "FIXTURE_MODE=normal",
    );

    // 1. Load many at once.
    let started = Instant::now();
    let mut ids = Vec::new();
    for i in 0..PROVIDERS {
        let (p, _) = providers
            .create(NewProvider {
                name: format!("process-{i}"),
                git_url: process_url.clone(),
                git_ref: String::new(),
                path: String::new(),
                config: json!({}),
                secret_config: json!({}),
                auto_load: true,
                run_as: String::new(),
            })
            .await
            .expect("create");
        ids.push(p.id);
    }
    let created = started.elapsed();
    loop {
        let all = providers.list().await.expect("list");
        if let Some(failed) = all.iter().find(|p| p.status == ProviderStatus::Failed) {
            panic!("{} failed: {:?}", failed.name, failed.status_message);
        }
        if all.iter().all(|p| p.status == ProviderStatus::Connected) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "loading took too long"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let loaded = started.elapsed();
    println!(
        "load {PROVIDERS} providers at once: all CONNECTED after {:.2} s (creates took {:.2} s; aim < 5 s)",
        loaded.as_secs_f64(),
        created.as_secs_f64()
    );

    // 2. A unary call through the link against a raw tonic call.
    let id = ids[0];
    let socket = config
        .provider_settings()
        .expect("settings")
        .socket_dir()
        .join(format!("{id}.sock"));
    let mut raw = ProviderClient::new(
        tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))
            .expect("endpoint")
            .connect()
            .await
            .expect("raw connection"),
    );
    // Warm both.
    for _ in 0..200 {
        providers.nodes(id).await.expect("link call");
        raw.list_nodes(corbel_proto::v1::ListNodesRequest {})
            .await
            .expect("raw call");
    }
    let mut through_link = Vec::with_capacity(CALLS);
    let mut direct = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let t = Instant::now();
        providers.nodes(id).await.expect("link call");
        through_link.push(t.elapsed());
        let t = Instant::now();
        raw.list_nodes(corbel_proto::v1::ListNodesRequest {})
            .await
            .expect("raw call");
        direct.push(t.elapsed());
    }
    let (link_median, raw_median) = (median(&mut through_link), median(&mut direct));
    println!(
        "ListNodes median: through the link {:.1} µs, raw tonic {:.1} µs, ratio {:.2} (aim <= 1.2)",
        link_median.as_secs_f64() * 1e6,
        raw_median.as_secs_f64() * 1e6,
        link_median.as_secs_f64() / raw_median.as_secs_f64()
    );

    // Stop the hundred before measuring deploys.
    for id in &ids {
        providers.unload(*id).await.expect("unload");
    }

    // 3. No-op deploys through the link.
    let (fixture, _) = providers
        .create(NewProvider {
            name: "fixture".into(),
            git_url: fixture_url,
            git_ref: String::new(),
            path: String::new(),
            config: json!({}),
            secret_config: json!({}),
            auto_load: true,
            run_as: String::new(),
        })
        .await
        .expect("create fixture");
    let fixture = fixture.id;
    let wait = Instant::now();
    while providers.get(fixture).await.expect("get").status != ProviderStatus::Connected {
        assert!(
            wait.elapsed() < Duration::from_secs(60),
            "fixture did not connect"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let call = |n: usize| ResourceCall {
        key: "noop".into(),
        resource_type: "fixture.v1.noop".into(),
        config: json!({}),
        resource_id: format!("r{n}"),
        deployment_id: None,
        node: None,
        dependency_outputs: Vec::new(),
    };
    let started = Instant::now();
    for n in 0..DEPLOYS {
        providers
            .deploy(fixture, call(n), |_| {})
            .await
            .expect("deploy");
    }
    let sequential = DEPLOYS as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..DEPLOY_CONCURRENCY {
        let providers = providers.clone();
        workers.push(tokio::spawn(async move {
            for n in (w..DEPLOYS).step_by(DEPLOY_CONCURRENCY) {
                providers
                    .deploy(fixture, call(n), |_| {})
                    .await
                    .expect("deploy");
            }
        }));
    }
    for worker in workers {
        worker.await.expect("worker");
    }
    let concurrent = DEPLOYS as f64 / started.elapsed().as_secs_f64();
    println!(
        "no-op DeployResource through the link: {sequential:.0}/s one at a time, {concurrent:.0}/s with {DEPLOY_CONCURRENCY} in flight"
    );

    providers.shutdown().await;
    registry_stop.cancel();
    let _ = registry.await;
    stopping.cancel();
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}
