//! Deployment engine figures (a benchmark, not a test: it prints, it does not
//! assert).
//!
//! Through `corbel-provider-fixture` (no-op deploys), loaded from git like any
//! provider, with the engine in this process, on SQLite:
//! 1. a blueprint of 1,000 independent resources: resources per second;
//! 2. a 100-deep chain: resources per second, and the engine's overhead per
//!    resource against the bare provider call measured in the same run; and
//!    the cost of one more link (a 150-deep chain against a 50-deep one),
//!    which holds none of a deploy's fixed cost;
//! 3. a 10,000-resource DAG (layers of 50-150, each resource depending on up
//!    to three of the layer before): deploy and destroy times, and the peak
//!    RSS of this process over both;
//! 4. recovery of journals of 1,000 and 10,000 entries (the state a crash
//!    mid-deploy leaves: nodes `IN_PROGRESS` with their entries): time until
//!    the journal is empty and the deployment complete;
//! 5. one deployment of 1,000, 10,000 and 100,000 resources (`deploy/scale.rs`):
//!    time each way and peak RSS, the curve.
//!
//! Then again on PostgreSQL when `CORBEL_BENCH_POSTGRES_URL` names a server
//! (a fresh database is made on it).
//!
//! Run with `cargo bench --profile dist --bench deploy` (`DEPLOY_BENCH=deep`, `big` or
//! `recovery` for one part alone). It builds the fixture in release mode
//! first. Placement figures are in `cargo bench --profile dist --bench placement`.

use std::path::Path;
use std::time::{Duration, Instant};

use corbel::config::Config;
use corbel::deploy::{
    DeploySettings, DeploymentState, Deployments, NewDeployment, NodeState, OnFailure,
};
use corbel::events::Bus;
use corbel::provider::{NewProvider, ProviderStatus, Providers, ResourceCall};
use corbel::store::deployments as rows;
use corbel::store::entities::journal;
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[path = "common/fixture.rs"]
mod fixture;
#[path = "common/postgres.rs"]
mod postgres;
#[path = "common/profile.rs"]
mod profile;
#[path = "deploy/scale.rs"]
mod scale;

use postgres::fresh_postgres_database;

use fixture::{build_fixture, fixture_repo};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const WIDE: usize = 1_000;
const DEEP: usize = 100;
const JOURNAL: usize = 1_000;
const BIG: usize = 10_000;

fn main() {
    let bin = build_fixture();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    profile::announce("deploy");
    runtime.block_on(run(&bin));
}

/// A deployment made and destroyed by [`Bench::both_ways`].
struct BothWays {
    deployed: Duration,
    destroyed: Duration,
    rss_before_kib: u64,
    peak_kib: u64,
}

/// The engine on one database, with the fixture connected.
struct Bench {
    _dir: tempfile::TempDir,
    db: corbel::store::Db,
    providers: Providers,
    deployments: Deployments,
    fixture: Uuid,
    registry: tokio::task::JoinHandle<()>,
    registry_stop: CancellationToken,
    stopping: CancellationToken,
}

impl Bench {
    /// On SQLite in a temporary data dir, or on `postgres` (a fresh database).
    async fn start(bin: &Path, postgres: Option<String>) -> Bench {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config::for_data_dir(dir.path().join("data"));
        config.database_url = postgres.map(corbel::secret::Secret::new);
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
                run_as: String::new(),
            })
            .await
            .expect("create fixture");
        let fixture = fixture.id;
        let wait = Instant::now();
        while providers.get(fixture).await.expect("get").status != ProviderStatus::Connected {
            assert!(
                wait.elapsed() < Duration::from_secs(60),
                "fixture did not connect: {:?}",
                providers.get(fixture).await.expect("get")
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Bench {
            _dir: dir,
            db,
            providers,
            deployments,
            fixture,
            registry,
            registry_stop,
            stopping,
        }
    }

    /// Every part, or the one `DEPLOY_BENCH` names: `wide` the 1,000
    /// independent resources, `deep` the chains alone
    /// (for a profile), `big` the 10,000-resource DAG, `recovery` the journals,
    /// `scale` one deployment of 1k, 10k and 100k resources.
    async fn figures(&self, postgres: bool) {
        let only = std::env::var("DEPLOY_BENCH").unwrap_or_default();
        let bare = self.bare_call().await;
        if only.is_empty() || only == "wide" {
            self.wide().await;
        }
        if only.is_empty() || only == "deep" {
            self.deep(bare).await;
        }
        if only.is_empty() || only == "big" {
            self.big().await;
        }
        if only.is_empty() || only == "recovery" {
            self.recovery(JOURNAL).await;
            self.recovery(BIG).await;
        }
        if only.is_empty() || only == "scale" {
            self.scale(postgres).await;
        }
    }

    async fn stop(self) {
        self.deployments.shutdown(Duration::from_secs(10)).await;
        self.providers.shutdown().await;
        self.registry_stop.cancel();
        let _ = self.registry.await;
        self.stopping.cancel();
    }

    /// The bare provider call, for the overhead figure.
    async fn bare_call(&self) -> Duration {
        let calls = 2_000;
        let started = Instant::now();
        for n in 0..calls {
            self.providers
                .deploy(
                    self.fixture,
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
        started.elapsed() / calls
    }

    /// Part 1: wide. A warm-up deploy first (the pool's connections opened,
    /// the statements prepared, as in a server that has run a deploy), then
    /// three, each figure beside the median.
    async fn wide(&self) {
        let blueprint = |n: usize| {
            let mut source = String::from("resources:\n");
            for i in 0..n {
                source.push_str(&format!("  r{i}: {{ type: fixture.v1.noop }}\n"));
            }
            source
        };
        deploy_timed(&self.deployments, "wide-warm-up", &blueprint(100)).await;
        let wide = blueprint(WIDE);
        let mut rates = Vec::new();
        for run in 0..3 {
            let (time, _) = deploy_timed(&self.deployments, &format!("wide-{run}"), &wide).await;
            rates.push(WIDE as f64 / time.as_secs_f64());
        }
        let shown: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
        rates.sort_by(f64::total_cmp);
        println!(
            "{WIDE} independent no-op resources: median {:.0} resources/s ({} in three runs; 16 provider calls in flight)",
            rates[1],
            shown.join(", ")
        );
    }

    /// Part 2: deep. The whole deploy of a 100-deep chain, then the cost of one
    /// more link: chains of DEEP / 2 and DEEP * 3 / 2, whose difference holds
    /// no fixed cost (planning, the run's start and end).
    async fn deep(&self, bare: Duration) {
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
        let deployments = &self.deployments;
        let (deep_time, _) = deploy_timed(deployments, "deep", &chain(DEEP)).await;
        let per = deep_time / DEEP as u32;
        let (short, _) = deploy_timed(deployments, "deep-short", &chain(DEEP / 2)).await;
        let (long, _) = deploy_timed(deployments, "deep-long", &chain(DEEP * 3 / 2)).await;
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
    }

    /// Part 3: a mixed DAG of `BIG` resources: layers of varying width, each
    /// resource depending on up to three of the layer before (fan-in and
    /// fan-out), with independent ones among them. Deploy, then destroy; the
    /// process's peak RSS over both (the engine runs in this process).
    async fn big(&self) {
        let mut source = String::from("resources:\n");
        let mut previous: Vec<String> = Vec::new();
        let (mut made, mut layer) = (0, 0);
        while made < BIG {
            let width = (50 + (layer * 37) % 101).min(BIG - made);
            let mut this = Vec::with_capacity(width);
            for k in 0..width {
                let key = format!("l{layer}n{k}");
                let picks: Vec<&String> = match (previous.len(), k % 5) {
                    (0, _) | (_, 0) => Vec::new(),
                    (p, 1) => vec![&previous[k % p]],
                    (p, _) => {
                        let mut picks = vec![&previous[k % p], &previous[(k * 7 + 3) % p]];
                        if k % 3 == 0 {
                            picks.push(&previous[(k * 13 + 1) % p]);
                        }
                        picks.sort();
                        picks.dedup();
                        picks
                    }
                };
                let depends: Vec<&str> = picks.iter().map(|s| s.as_str()).collect();
                source.push_str(&format!(
                    "  {key}: {{ type: fixture.v1.noop, depends_on: [{}] }}\n",
                    depends.join(", ")
                ));
                this.push(key);
            }
            made += width;
            layer += 1;
            previous = this;
        }
        let run = self.both_ways("big", &source).await;
        println!(
            "{BIG}-resource DAG ({layer} layers, 0-3 dependencies each): deploy {:.2} s ({:.0} resources/s), destroy {:.2} s ({:.0} resources/s); RSS {:.0} MiB before, peak {:.0} MiB (this process: the engine and its database)",
            run.deployed.as_secs_f64(),
            BIG as f64 / run.deployed.as_secs_f64(),
            run.destroyed.as_secs_f64(),
            BIG as f64 / run.destroyed.as_secs_f64(),
            run.rss_before_kib as f64 / 1024.0,
            run.peak_kib as f64 / 1024.0,
        );
    }

    /// Deploys `source` as `name` and destroys it: both times, and this
    /// process's RSS before and at its peak over both.
    async fn both_ways(&self, name: &str, source: &str) -> BothWays {
        reset_peak_rss();
        let rss_before_kib = status_kib("VmRSS:");
        let (deployed, id) = deploy_timed(&self.deployments, name, source).await;
        let started = Instant::now();
        self.deployments.runs().destroy(id).await.expect("destroy");
        wait_for(&self.deployments, id, DeploymentState::Destroyed).await;
        BothWays {
            deployed,
            destroyed: started.elapsed(),
            rss_before_kib,
            peak_kib: status_kib("VmHWM:"),
        }
    }

    /// Part 4: recovery of a journal of `entries`: the state a crash mid-deploy
    /// leaves (every node announced IN_PROGRESS with its entry).
    async fn recovery(&self, entries: usize) {
        let mut source = String::from("resources:\n");
        for i in 0..entries {
            source.push_str(&format!("  j{i}: {{ type: fixture.v1.noop }}\n"));
        }
        let name = format!("journal-{entries}");
        let (_, id) = deploy_timed(&self.deployments, &name, &source).await;
        let db = &self.db;
        rows::change_deployment(
            db,
            id,
            rows::DeploymentChange {
                state: DeploymentState::InProgress,
                phase: Some("DEPLOY"),
                error: None,
                operation_id: None,
            },
        )
        .await
        .expect("state");
        let mut writes = Vec::with_capacity(entries);
        for node in rows::nodes_of(db, id).await.expect("nodes") {
            let call = rows::CallStart {
                entry: Uuid::now_v7(),
                deployment_id: node.deployment_id,
                node_id: node.id,
                provider_id: self.fixture,
                intent: "DEPLOY".into(),
                change: Some(rows::NodeChange::to(NodeState::InProgress)),
            };
            let event = rows::NewEvent {
                kind: "NODE".into(),
                node_key: Some(node.key.clone()),
                state: Some(NodeState::InProgress.into()),
                message: "deploying".into(),
            };
            writes.push(rows::GroupWrite::Begin {
                call,
                event: Some(event),
            });
        }
        // In groups the size of the engine's (SQLite takes at most 32,766
        // parameters a statement).
        for group in writes.chunks(256) {
            let group: Vec<_> = group.iter().collect();
            rows::commit_group(db, &group, None)
                .await
                .expect("journal entries");
        }
        let queries = self.deployments.queries();
        assert_eq!(
            queries.journal_len().await.expect("journal"),
            entries as u64
        );
        let started = Instant::now();
        let crash = chrono::Utc::now();
        self.deployments
            .recovery()
            .recover()
            .await
            .expect("recover");
        // Settled: every entry the crash left has ended (its node says what
        // is true); the run then deploys again what was cut short. Counted in
        // the database: reading the whole journal every 5 ms (10,000 rows)
        // took a share of the cores the engine was being measured on.
        let settled = loop {
            let left = journal::Entity::find()
                .filter(journal::Column::CreatedAt.lte(crash))
                .count(db)
                .await
                .expect("journal");
            if left == 0 {
                break started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "settling took too long"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        loop {
            // The journal is counted only once the deployment is complete.
            let state = queries.get(id).await.expect("deployment").state;
            if state == DeploymentState::Complete
                && queries.journal_len().await.expect("journal") == 0
            {
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
            "recover a journal of {entries} entries: settled in {:.2} s ({:.3} ms per entry); resumed to COMPLETE (each deploy made again) in {:.2} s",
            settled.as_secs_f64(),
            settled.as_secs_f64() * 1e3 / entries as f64,
            recovered.as_secs_f64(),
        );
    }
}

async fn run(bin: &Path) {
    let bench = Bench::start(bin, None).await;
    println!("on SQLite:");
    bench.figures(false).await;
    bench.stop().await;

    // PostgreSQL when a server is given (`scripts/test.sh` starts one).
    let Ok(server) = std::env::var("CORBEL_BENCH_POSTGRES_URL") else {
        println!(
            "(set CORBEL_BENCH_POSTGRES_URL=postgres://user:pass@host/db for the PostgreSQL figures)"
        );
        return;
    };
    let database = fresh_postgres_database(&server).await;
    let bench = Bench::start(bin, Some(database.url.clone())).await;
    println!("on PostgreSQL:");
    bench.figures(true).await;
    bench.stop().await;
}

/// Forgets the process's peak RSS, so `VmHWM` is the peak from here on.
fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS");
}

/// `field` of `/proc/self/status`, in KiB.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("proc status")
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc status"))
}

/// Polls until the deployment is in `state`.
async fn wait_for(deployments: &Deployments, id: Uuid, state: DeploymentState) {
    let started = Instant::now();
    loop {
        let now = deployments.queries().get(id).await.expect("deployment");
        if now.state == state {
            return;
        }
        assert!(
            now.state != DeploymentState::Failed,
            "failed: {:?}",
            now.error
        );
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "not {state:?} after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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
