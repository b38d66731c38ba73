//! Stored-history figures (a benchmark, not a test: it prints, it does not
//! assert).
//!
//! The server in this process on SQLite (then on PostgreSQL when
//! `CORBEL_BENCH_POSTGRES_URL` names a server), with 100,000 deployments and
//! 10,000,000 events stored: the deployments spread over 60 days, in 4
//! projects and 10 blueprints, every state; their events written by
//! `INSERT … SELECT` in the database itself (the baseline: the store's own
//! pace at writing rows). Then, through GraphQL over HTTP as the admin, each
//! read 200 times (p50, p95, max against the goal, p95 < 20 ms):
//! - `deployments(first: 50)` alone and with each filter the API offers
//!   (`states`, `health`, `blueprintId`, `projectId`, `search`);
//! - a deployment's events page (`deployment(id) { events(first: 50) }`);
//!
//! then the database's size per stored event, and the writers while
//! `[deploy] event_retention_days` prunes: 1,000 one-event group commits
//! timed alone, then again while the events older than 30 days (half) are
//! deleted by the same function the setting runs.
//!
//! Run with `cargo bench --bench history` (`HISTORY_BENCH_DEPLOYMENTS`,
//! `HISTORY_BENCH_EVENTS_EACH` to make it smaller).

mod common;
#[path = "common/postgres.rs"]
mod postgres;

use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use common::api::Api;
use common::profile;
use corbel::app::App;
use corbel::config::Config;
use corbel::deploy::DeploymentState;
use corbel::store::deployments as rows;
use corbel::store::entities::deployment;
use sea_orm::{ConnectionTrait, EntityTrait, Set};
use serde_json::{Value, json};
use uuid::Uuid;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const READS: usize = 200;
const GOAL_P95_MS: f64 = 20.0;
const COMMITS: usize = 1_000;

fn main() {
    profile::announce("history");
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            run(None).await;
            match std::env::var("CORBEL_BENCH_POSTGRES_URL") {
                Ok(server) => {
                    let database = postgres::fresh_postgres_database(&server).await;
                    run(Some(database.url.clone())).await;
                }
                Err(_) => println!(
                    "(set CORBEL_BENCH_POSTGRES_URL=postgres://user:pass@host/db for the PostgreSQL figures)"
                ),
            }
        });
}

fn count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{var}: a number")))
        .unwrap_or(default)
}

async fn run(postgres: Option<String>) {
    let deployments = count("HISTORY_BENCH_DEPLOYMENTS", 100_000);
    let each = count("HISTORY_BENCH_EVENTS_EACH", 100);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config::for_data_dir(dir.path().join("data"));
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.log_filter = "warn".into();
    config.database_url = postgres.clone().map(corbel::secret::Secret::new);
    let app = App::build(&config).await.expect("app");
    let addr = app.local_addr().to_string();
    let token = app.new_admin_token().expect("admin token").to_owned();
    tokio::spawn(app.run_until_stopped(std::future::pending()));
    let api = Api::new(&addr, &token).await;
    println!(
        "on {}:",
        if postgres.is_some() {
            "PostgreSQL"
        } else {
            "SQLite"
        }
    );
    let db = corbel::store::connect(&config.database().expect("database"))
        .await
        .expect("store");
    let made = fill(&api, &db, deployments, each).await;
    reads(&api, &made).await;
    size(&db, postgres.is_some(), deployments * each, dir.path()).await;
    pruning(&db, &made).await;
}

/// What `fill` made: the ids the reads ask for.
struct Made {
    projects: Vec<String>,
    blueprints: Vec<String>,
    deployments: Vec<Uuid>,
}

/// 4 projects and 10 blueprints through the API, then the deployments and
/// their events straight into the store.
async fn fill(api: &Api, db: &corbel::store::Db, n: usize, each: usize) -> Made {
    let mut projects = Vec::new();
    for p in 0..4 {
        let made = api
            .gql(
                "mutation($name: String!) { createProject(input: {name: $name}) { id } }",
                json!({ "name": format!("history-{p}") }),
            )
            .await;
        projects.push(made["createProject"]["id"].as_str().unwrap().to_owned());
    }
    let mut blueprints = Vec::new();
    for b in 0..10 {
        let made = api
            .gql(
                "mutation($p: ID!, $name: String!) { createBlueprint(input: {projectId: $p, name: $name, source: \"resources:\\n  a: { type: t.v1.x }\\n\"}) { id } }",
                json!({ "p": projects[b % projects.len()], "name": format!("bp-{b}") }),
            )
            .await;
        blueprints.push(made["createBlueprint"]["id"].as_str().unwrap().to_owned());
    }
    let states = [
        DeploymentState::Complete,
        DeploymentState::Destroyed,
        DeploymentState::Failed,
        DeploymentState::Suspended,
    ];
    let healths = ["HEALTHY", "HEALTHY", "DEGRADED", "DOWN", "UNKNOWN"];
    let now = Utc::now();
    let span = TimeDelta::days(60);
    let started = Instant::now();
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        let rows = chunk.iter().map(|&i| {
            // Oldest first, so events written in this order have ids in time order.
            let at = now - span + span * i as i32 / n.max(1) as i32;
            let b = i % blueprints.len();
            let id = Uuid::now_v7();
            ids.push(id);
            deployment::ActiveModel {
                id: Set(id),
                name: Set(format!(
                    "svc-{i:06}-{}",
                    ["web", "db", "cache", "queue"][i % 4]
                )),
                blueprint_id: Set(Some(blueprints[b].parse().unwrap())),
                element_id: Set(None),
                source: Set("resources:\n  a: { type: t.v1.x }\n".into()),
                variables: Set("{}".into()),
                state: Set(states[i % states.len()]),
                on_failure: Set("ROLLBACK".into()),
                error: Set(None),
                expires_at: Set(None),
                created_at: Set(at),
                updated_at: Set(at),
                operation_id: Set(None),
                phase: Set(None),
                project_id: Set(Some(projects[b % projects.len()].parse().unwrap())),
                health: Set(healths[i % healths.len()].into()),
                health_changed_at: Set(None),
            }
        });
        deployment::Entity::insert_many(rows.collect::<Vec<_>>())
            .exec(db)
            .await
            .expect("deployments");
    }
    let deployments_took = started.elapsed();
    let started = Instant::now();
    write_events(db, &ids, each).await;
    let events_took = started.elapsed();
    println!(
        "  stored {n} deployments in {:.1} s, {} events in {:.1} s ({:.0} events/s: INSERT … SELECT, the baseline)",
        deployments_took.as_secs_f64(),
        n * each,
        events_took.as_secs_f64(),
        (n * each) as f64 / events_took.as_secs_f64(),
    );
    Made {
        projects,
        blueprints,
        deployments: ids,
    }
}

/// `each` events for every deployment, oldest deployment first, at its
/// creation time, 1,000 deployments a statement.
async fn write_events(db: &corbel::store::Db, ids: &[Uuid], each: usize) {
    let mut last_said = Instant::now();
    for (done, chunk) in ids.chunks(1_000).enumerate() {
        let (first, last) = (chunk[0], chunk[chunk.len() - 1]);
        let first = deployment::Entity::find_by_id(first)
            .one(db)
            .await
            .expect("deployment")
            .expect("stored");
        let last = deployment::Entity::find_by_id(last)
            .one(db)
            .await
            .expect("deployment")
            .expect("stored");
        let sql = format!(
            "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < {}) \
             INSERT INTO deployment_events (deployment_id, at, kind, node_key, state, message) \
             SELECT d.id, d.created_at, CASE WHEN s.i % 10 = 0 THEN 'STATE' ELSE 'NODE' END, \
                    CASE WHEN s.i % 10 = 0 THEN NULL ELSE 'web' END, \
                    CASE WHEN s.i % 2 = 0 THEN 'IN_PROGRESS' ELSE 'COMPLETE' END, \
                    'deployed: one of the events of a long history' \
             FROM deployments d CROSS JOIN s \
             WHERE d.created_at >= $1 AND d.created_at <= $2 AND d.name LIKE 'svc-%' \
             ORDER BY d.created_at, d.id, s.i",
            each.saturating_sub(1)
        );
        db.execute_raw(sea_orm::Statement::from_sql_and_values(
            db.get_database_backend(),
            sql,
            [first.created_at.into(), last.created_at.into()],
        ))
        .await
        .expect("events");
        if last_said.elapsed() > Duration::from_secs(10) {
            println!(
                "  … {} of {} deployments' events written",
                (done + 1) * 1_000,
                ids.len()
            );
            last_said = Instant::now();
        }
    }
}

/// Each read `READS` times: p50, p95, max.
async fn reads(api: &Api, made: &Made) {
    // The console's list asks for the page alone; `totalCount` is counted
    // only when asked, so it has cases of its own.
    let list = "query($f: DeploymentFilter!, $h: [ResourceHealth!]) { deployments(first: 50, filter: $f, health: $h) { pageInfo { hasNextPage } nodes { id name state health createdAt projectId } } }";
    let counted = "query($f: DeploymentFilter!, $h: [ResourceHealth!]) { deployments(first: 50, filter: $f, health: $h) { totalCount pageInfo { hasNextPage } nodes { id name state health createdAt projectId } } }";
    let cases: Vec<(&str, &str, Value)> = vec![
        ("deployments(first: 50)", list, json!({ "f": {} })),
        (
            "  states: [FAILED]",
            list,
            json!({ "f": { "states": ["FAILED"] } }),
        ),
        ("  health: [DOWN]", list, json!({ "f": {}, "h": ["DOWN"] })),
        (
            "  blueprintId",
            list,
            json!({ "f": { "blueprintId": made.blueprints[3] } }),
        ),
        (
            "  projectId",
            list,
            json!({ "f": { "projectId": made.projects[1] } }),
        ),
        (
            "  search: \"cache\"",
            list,
            json!({ "f": { "search": "cache" } }),
        ),
        (
            "  search: \"nothing\" (no match)",
            list,
            json!({ "f": { "search": "nothing" } }),
        ),
        (
            "  projectId + states + search",
            list,
            json!({ "f": { "projectId": made.projects[2], "states": ["COMPLETE"], "search": "web" } }),
        ),
        ("  with totalCount", counted, json!({ "f": {} })),
        (
            "  with totalCount, states: [FAILED]",
            counted,
            json!({ "f": { "states": ["FAILED"] } }),
        ),
        (
            "  with totalCount, search: \"cache\"",
            counted,
            json!({ "f": { "search": "cache" } }),
        ),
    ];
    for (what, query, variables) in cases {
        let mut took = Vec::with_capacity(READS);
        for _ in 0..READS {
            let started = Instant::now();
            let data = api.gql(query, variables.clone()).await;
            took.push(started.elapsed());
            assert!(data["deployments"]["nodes"].is_array());
        }
        print_timing(what, &mut took, true);
    }
    let page = "query($id: ID!) { deployment(id: $id) { events(first: 50) { id at kind nodeKey state message } } }";
    let mut took = Vec::with_capacity(READS);
    for i in 0..READS {
        let id = made.deployments[(i * 7_919) % made.deployments.len()];
        let started = Instant::now();
        let data = api.gql(page, json!({ "id": id.to_string() })).await;
        took.push(started.elapsed());
        assert!(data["deployment"]["events"].is_array());
    }
    print_timing("a deployment's events(first: 50)", &mut took, true);
}

/// p50, p95 and max of `took`, against the reads' goal when `goal`.
fn print_timing(what: &str, took: &mut [Duration], goal: bool) {
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    let p95 = at(0.95);
    let against = match (goal, p95 < GOAL_P95_MS) {
        (false, _) => String::new(),
        (true, true) => format!(" (goal p95 < {GOAL_P95_MS:.0} ms)"),
        (true, false) => format!(" (goal p95 < {GOAL_P95_MS:.0} ms: over)"),
    };
    println!(
        "  {what:<40} p50 {:>6.2} ms, p95 {p95:>6.2} ms, max {:>6.2} ms{against}",
        at(0.5),
        at(1.0),
    );
}

/// The database's size, per stored event.
async fn size(db: &corbel::store::Db, postgres: bool, events: usize, dir: &std::path::Path) {
    let (total, table) = if postgres {
        let one = |sql: &str| {
            let sql = sql.to_owned();
            async move {
                let row = db
                    .query_one_raw(sea_orm::Statement::from_string(
                        db.get_database_backend(),
                        sql,
                    ))
                    .await
                    .expect("size")
                    .expect("a row");
                row.try_get_by_index::<i64>(0).expect("bytes") as u64
            }
        };
        (
            one("SELECT pg_database_size(current_database())").await,
            one("SELECT pg_total_relation_size('deployment_events')").await,
        )
    } else {
        db.execute_unprepared("PRAGMA wal_checkpoint(TRUNCATE)")
            .await
            .expect("checkpoint");
        let mut total = 0;
        for entry in std::fs::read_dir(dir.join("data"))
            .expect("data dir")
            .flatten()
        {
            if entry.file_name().to_string_lossy().contains(".db") {
                total += entry.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
        (total, total)
    };
    println!(
        "  the database: {:.0} MiB, {:.0} bytes per stored event{}",
        total as f64 / 1048576.0,
        table as f64 / events as f64,
        if postgres {
            " (the events' table with its indexes)"
        } else {
            " (the whole file)"
        }
    );
}

/// One-event group commits, alone and while the oldest half is pruned.
async fn pruning(db: &corbel::store::Db, made: &Made) {
    let deployment = made.deployments[made.deployments.len() - 1];
    let commits = |n: usize| async move {
        let mut took = Vec::with_capacity(n);
        for _ in 0..n {
            let write = rows::GroupWrite::Event {
                deployment,
                event: rows::NewEvent {
                    kind: "NODE".into(),
                    node_key: Some("web".into()),
                    state: None,
                    message: "a writer's event".into(),
                },
            };
            let started = Instant::now();
            rows::commit_group(db, &[&write], None)
                .await
                .expect("commit");
            took.push(started.elapsed());
        }
        took
    };
    print_timing(
        "a one-event group commit",
        &mut commits(COMMITS).await,
        false,
    );
    let before = Utc::now() - TimeDelta::days(30);
    let pruner = {
        let db = db.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let pruned = rows::prune_events(&db, before).await.expect("prune");
            (pruned, started.elapsed())
        })
    };
    let mut during = Vec::new();
    while !pruner.is_finished() {
        during.extend(commits(50).await);
    }
    let (pruned, took) = pruner.await.expect("pruner");
    print_timing("  the same while pruning", &mut during, false);
    println!(
        "  pruned {pruned} events older than 30 days in {:.1} s ({:.0} events/s)",
        took.as_secs_f64(),
        pruned as f64 / took.as_secs_f64()
    );
}
