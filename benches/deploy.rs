//! Deployment engine figures (a benchmark, not a test: it prints, it does not
//! assert).
//!
//! Through `corbel-provider-fixture` (no-op deploys), loaded from git like any
//! provider, on SQLite:
//! 1. a blueprint of 1,000 independent resources: resources per second;
//! 2. a 100-deep chain: resources per second, and the engine's overhead per
//!    resource against the bare provider call measured in the same run; and
//!    the cost of one more link (a 150-deep chain against a 50-deep one),
//!    which holds none of a deploy's fixed cost;
//! 3. recovery of a journal of 1,000 entries (the state a crash mid-deploy
//!    leaves: nodes `IN_PROGRESS` with their entries): time until the journal
//!    is empty and the deployment complete.
//!
//! Run with `cargo bench --bench deploy` (`DEPLOY_BENCH=deep` for the chains
//! alone). It builds the fixture in release mode first. Placement figures are in `cargo bench --bench placement`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use corbel::config::Config;
use corbel::deploy::{DeploySettings, DeploymentState, Deployments, NewDeployment, OnFailure};
use corbel::events::Bus;
use corbel::provider::{NewProvider, ProviderStatus, Providers, ResourceCall};
use corbel::store::deployments as rows;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const WIDE: usize = 1_000;
const DEEP: usize = 100;
const JOURNAL: usize = 1_000;

fn main() {
    let bin = build_fixture();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "corbel deploy benchmark ({} cores)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    runtime.block_on(run(&bin));
}

fn build_fixture() -> PathBuf {
    let status = Command::new(env!("CARGO"))
        .args(["build", "--release", "-p", "corbel-provider-fixture"])
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the fixture failed");
    std::env::current_exe()
        .expect("the bench's path")
        .parent()
        .and_then(Path::parent)
        .expect("target/release")
        .join("corbel-provider-fixture")
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

fn fixture_repo(root: &Path, bin: &Path) -> String {
    let work = root.join("fixture");
    std::fs::create_dir_all(&work).expect("work dir");
    std::fs::write(
        work.join("corbel-provider.yaml"),
        format!(
            "name: fixture\nversion: 0.1.0\nruntime: shell\nshell:\n  run: FIXTURE_MODE=normal exec {}\nresource_types: [fixture.v1.noop]\n",
            bin.display()
        ),
    )
    .expect("metadata");
    git(&work, &["init", "-q"]);
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "fixture"]);
    format!("file://{}", work.display())
}

async fn run(bin: &Path) {
    let dir = tempfile::tempdir().expect("temp dir");
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

    let (fixture, _) = providers
        .create(NewProvider {
            name: "fixture".into(),
            git_url: fixture_repo(dir.path(), bin),
            git_ref: String::new(),
            path: String::new(),
            config: json!({ "capacity": 1_000_000 }),
            secret_config: json!({}),
            auto_load: true,
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

    // The bare provider call, for the overhead figure.
    let calls = 2_000;
    let started = Instant::now();
    for n in 0..calls {
        providers
            .deploy(
                fixture,
                ResourceCall {
                    key: "r".into(),
                    resource_type: "fixture.v1.noop".into(),
                    config: json!({}),
                    resource_id: format!("bare-{n}"),
                    deployment_id: None,
                    node: Some("n1".into()),
                    dependency_outputs: Vec::new(),
                },
                |_| {},
            )
            .await
            .expect("bare deploy");
    }
    let bare = started.elapsed() / calls;

    // `DEPLOY_BENCH=deep` runs the chains alone (for a profile).
    let only_deep = std::env::var("DEPLOY_BENCH").as_deref() == Ok("deep");

    // 1. Wide.
    let mut wide = String::from("resources:\n");
    for i in 0..WIDE {
        wide.push_str(&format!("  r{i}: {{ type: fixture.v1.noop }}\n"));
    }
    let (wide_time, _) = if only_deep {
        (Duration::MAX, Uuid::nil())
    } else {
        deploy_timed(&deployments, "wide", &wide).await
    };
    println!(
        "{WIDE} independent no-op resources: {:.2} s, {:.0} resources/s (16 provider calls in flight)",
        wide_time.as_secs_f64(),
        WIDE as f64 / wide_time.as_secs_f64()
    );

    // 2. Deep. The whole deploy of a 100-deep chain, then the cost of one
    // more link: chains of DEEP / 2 and DEEP * 3 / 2, whose difference holds
    // no fixed cost (planning, the run's start and end).
    let chain = |n: usize| {
        let mut source = String::from("resources:\n  c0: { type: fixture.v1.noop }\n");
        for i in 1..n {
            source.push_str(&format!(
                "  c{i}: {{ type: fixture.v1.noop, depends_on: [c{}] }}\n",
                i - 1
            ));
        }
        source
    };
    let (deep_time, _) = deploy_timed(&deployments, "deep", &chain(DEEP)).await;
    let per = deep_time / DEEP as u32;
    let (short, _) = deploy_timed(&deployments, "deep-short", &chain(DEEP / 2)).await;
    let (long, _) = deploy_timed(&deployments, "deep-long", &chain(DEEP * 3 / 2)).await;
    let link = long.saturating_sub(short) / DEEP as u32;
    println!(
        "{DEEP}-deep chain: {:.2} s, {:.0} resources/s; {:.2} ms per resource against {:.3} ms for the bare provider call: engine overhead {:.2} ms per resource",
        deep_time.as_secs_f64(),
        DEEP as f64 / deep_time.as_secs_f64(),
        per.as_secs_f64() * 1e3,
        bare.as_secs_f64() * 1e3,
        (per.saturating_sub(bare)).as_secs_f64() * 1e3,
    );
    println!(
        "one more link of a chain ({} vs {} deep): {:.2} ms, engine overhead {:.2} ms per resource; the rest of the {DEEP}-deep figure is the deploy's fixed cost ({:.0} ms)",
        DEEP * 3 / 2,
        DEEP / 2,
        link.as_secs_f64() * 1e3,
        link.saturating_sub(bare).as_secs_f64() * 1e3,
        deep_time.saturating_sub(link * DEEP as u32).as_secs_f64() * 1e3,
    );

    if only_deep {
        return;
    }

    // 3. Recovery of a journal of 1,000 entries.
    let mut source = String::from("resources:\n");
    for i in 0..JOURNAL {
        source.push_str(&format!("  j{i}: {{ type: fixture.v1.noop }}\n"));
    }
    let (_, id) = deploy_timed(&deployments, "journal", &source).await;
    // What a crash leaves: every node announced IN_PROGRESS with its entry.
    rows::change_deployment(
        &db,
        id,
        rows::DeploymentChange {
            state: DeploymentState::InProgress.as_str(),
            phase: Some("DEPLOY"),
            error: None,
            operation_id: None,
        },
    )
    .await
    .expect("state");
    for node in rows::nodes_of(&db, id).await.expect("nodes") {
        let call = rows::CallStart {
            entry: Uuid::now_v7(),
            deployment_id: node.deployment_id,
            node_id: node.id,
            provider_id: fixture,
            intent: "DEPLOY".into(),
            change: rows::NodeChange {
                state: "IN_PROGRESS".into(),
                ..Default::default()
            },
        };
        let event = rows::NewEvent {
            kind: "NODE".into(),
            node_key: Some(node.key.clone()),
            state: Some("IN_PROGRESS".into()),
            message: "deploying".into(),
        };
        rows::begin_call_in(&db, &call, event)
            .await
            .expect("journal entry");
    }
    assert_eq!(
        deployments.queries().journal_len().await.expect("journal"),
        JOURNAL as u64
    );
    let started = Instant::now();
    deployments.recovery().recover().await.expect("recover");
    loop {
        let empty = deployments.queries().journal_len().await.expect("journal") == 0;
        let state = deployments
            .queries()
            .get(id)
            .await
            .expect("deployment")
            .state;
        if empty && state == DeploymentState::Complete {
            break;
        }
        assert!(state != DeploymentState::Failed, "recovery failed");
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "recovery took too long"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let recovered = started.elapsed();
    println!(
        "recover a journal of {JOURNAL} entries (each deploy made again, resumed): {:.2} s, {:.2} ms per entry",
        recovered.as_secs_f64(),
        recovered.as_secs_f64() * 1e3 / JOURNAL as f64
    );

    deployments.shutdown(Duration::from_secs(10)).await;
    providers.shutdown().await;
    registry_stop.cancel();
    let _ = registry.await;
    stopping.cancel();
}

/// Creates the blueprint, deploys it and waits until it is complete.
async fn deploy_timed(deployments: &Deployments, name: &str, source: &str) -> (Duration, Uuid) {
    let project = deployments
        .blueprints()
        .default_project()
        .await
        .expect("the default project");
    let blueprint = deployments
        .blueprints()
        .create(project, name.into(), None, source.into())
        .await
        .expect("blueprint");
    let started = Instant::now();
    let deployment = deployments
        .runs()
        .deploy(NewDeployment {
            blueprint_id: blueprint.id,
            name: name.into(),
            variables: serde_json::Map::new(),
            on_failure: OnFailure::Keep,
            expires_at: None,
        })
        .await
        .expect("deploy");
    loop {
        let state = deployments
            .queries()
            .get(deployment.id)
            .await
            .expect("deployment")
            .state;
        match state {
            DeploymentState::Complete => return (started.elapsed(), deployment.id),
            DeploymentState::Failed => panic!(
                "{name} failed: {:?}",
                deployments
                    .queries()
                    .get(deployment.id)
                    .await
                    .map(|d| d.error)
            ),
            _ => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}
