//! Replicas (issue 18) as real processes: three `corbel serve --cluster` on
//! one PostgreSQL, each with its own data directory, sharing the secret key
//! and the providers' state directory. The leader, which runs the provider
//! and the deployment, is SIGKILLed mid-run; a standby takes over, relaunches
//! the provider and finishes the run; the processes running are then exactly
//! those Corbel records, each once; a `deploymentEvents` subscription held on
//! a surviving replica sees every event once, in order, to the run's end.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use corbel::client::Api as ClientApi;
use corbel::client::Subscription;
use futures_util::FutureExt as _;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::*;
use crate::support::binary::serve_command;
use crate::support::eventually;
use crate::support::processes::parent;

/// Fast leases, so a failover takes a few seconds; a lease of ten
/// heartbeats, so a debug build on a loaded machine renews in time.
const CLUSTER_ENV: [(&str, &str); 3] = [
    ("CORBEL_CLUSTER", "true"),
    ("CORBEL_CLUSTER_HEARTBEAT_MS", "200"),
    ("CORBEL_CLUSTER_LEASE_MS", "2000"),
];

struct Replica {
    store: TestStore,
    server: Server,
}

impl Replica {
    fn start(store: TestStore, key: &Path, state: &Path) -> Replica {
        let key = key.display().to_string();
        let state = state.display().to_string();
        let mut env: Vec<(&str, &str)> = CLUSTER_ENV.to_vec();
        env.push(("CORBEL_SECRET_KEY_FILE", &key));
        env.push(("CORBEL_PROVIDER_STATE_DIR", &state));
        let server = Server::start_with(&store, &env);
        Replica { store, server }
    }

    fn served(&self) -> &Served {
        self.server.served.as_ref().expect("running")
    }

    fn pid(&self) -> u32 {
        self.served().child.id()
    }

    /// What its first announcement said it was: `leader` or `standby`.
    fn role(&self) -> String {
        let log = self.served().log.lock().unwrap();
        log.iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|line| line["url"].is_string())
            .map(|line| line["role"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_default()
    }

    /// Its API, as if `server` ran the provider (for the settle checks).
    fn api_for(&self, server: u32) -> Api {
        Api::at(self.served().addr, server)
    }

    fn client(&self) -> ClientApi {
        ClientApi::new(
            &format!("http://{}", self.served().addr),
            Some(crate::support::ADMIN_TOKEN.to_owned()),
        )
        .unwrap()
    }
}

/// The replicas as `replicas` shows them: pid, state, leader.
async fn members(api: &Api) -> Result<Vec<(u32, String, bool)>, String> {
    let data = api
        .gql("{ replicas { pid state leader } }", json!({}))
        .await?;
    Ok(data["replicas"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|r| {
            (
                r["pid"].as_u64().unwrap_or_default() as u32,
                r["state"].as_str().unwrap_or_default().to_owned(),
                r["leader"].as_bool().unwrap_or_default(),
            )
        })
        .collect())
}

/// The ids of the deployment's stored events.
pub(super) async fn stored_events(api: &Api, id: &str) -> Vec<i64> {
    let data = api
        .gql(
            "query($id: ID!) { deployment(id: $id) { events(first: 10000) { id } } }",
            json!({ "id": id }),
        )
        .await
        .expect("the history reads");
    data["deployment"]["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| e["id"].as_str().unwrap().parse().unwrap())
        .collect()
}

/// Follows `id` as a client would across a failover: subscribes, and when
/// the socket ends subscribes again with `after:` the last event seen, until
/// the run's end. Every event id received, in order; `sockets` counts the
/// subscriptions made so far.
pub(super) async fn follow(
    api: ClientApi,
    id: String,
    sockets: Arc<AtomicUsize>,
) -> Result<Vec<i64>, String> {
    const QUERY: &str = "subscription($id: ID!, $after: ID) { \
        deploymentEvents(id: $id, after: $after) { id kind state } }";
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut seen: Vec<i64> = Vec::new();
    while Instant::now() < deadline {
        let after = seen.last().map(|last| last.to_string());
        let mut subscription =
            match Subscription::start(&api, QUERY, json!({ "id": id, "after": after })).await {
                Ok(s) => s,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
        sockets.fetch_add(1, Ordering::SeqCst);
        while let Ok(Some(event)) = subscription.next().await {
            let event = &event["deploymentEvents"];
            seen.push(event["id"].as_str().unwrap_or("0").parse().unwrap_or(0));
            if event["kind"] == "STATE" && event["state"] == "COMPLETE" {
                subscription.close().await;
                return Ok(seen);
            }
        }
    }
    Err(format!(
        "no COMPLETE within 180 s; {} events seen on {} sockets",
        seen.len(),
        sockets.load(Ordering::SeqCst)
    ))
}

/// Each replica's state and what it logged about leading: why a failover
/// went wrong.
fn told(replicas: &mut [Replica]) -> String {
    let mut told = String::new();
    for replica in replicas {
        let Some(served) = replica.server.served.as_mut() else {
            continue;
        };
        let status = served.child.try_wait();
        told.push_str(&format!("replica pid {}: {status:?}\n", served.child.id()));
        for line in served.log.lock().unwrap().iter() {
            if ["lead", "renew", "stopping", "WARN", "ERROR"]
                .iter()
                .any(|word| line.contains(word))
            {
                told.push_str(&format!("  {line}\n"));
            }
        }
    }
    told
}

/// `seen` (what a follower received, to the run's end) is every `stored`
/// event up to its last, once, in order.
pub(super) fn assert_followed(seen: &[i64], stored: &[i64]) {
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "events in order, none twice: {seen:?}"
    );
    let seen_set: BTreeSet<i64> = seen.iter().copied().collect();
    let last = seen.last().copied().unwrap_or_default();
    let missed: Vec<&i64> = stored
        .iter()
        .filter(|e| **e <= last && !seen_set.contains(e))
        .collect();
    assert!(
        missed.is_empty(),
        "events missed across the failover: {missed:?}"
    );
}

/// The live provider processes among the replicas' pid files.
fn provider_processes(replicas: &[Replica], provider: &str) -> Vec<i32> {
    replicas
        .iter()
        .filter_map(|r| provider_process(&r.store, provider))
        .map(|(pid, _)| pid)
        .collect()
}

/// What befalls the leader mid-run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Struck {
    /// SIGKILL.
    Killed,
    /// SIGSTOP until another leads, then SIGCONT: a stale leader, which
    /// must stop without acting (exit code 75).
    Paused,
}

#[tokio::test]
async fn three_replicas_finish_the_run_of_a_leader_killed_mid_run() {
    leader_struck_mid_run(
        "three_replicas_finish_the_run_of_a_leader_killed_mid_run",
        Struck::Killed,
    )
    .await;
}

#[tokio::test]
async fn a_leader_paused_mid_run_stops_without_acting_when_it_runs_again() {
    leader_struck_mid_run(
        "a_leader_paused_mid_run_stops_without_acting_when_it_runs_again",
        Struck::Paused,
    )
    .await;
}

/// A fourth replica started with a key of its own (its data directory's,
/// made at its start), or with another provider state directory, exits at
/// start naming both values.
fn refused_unshared(store: TestStore, key: &Path, state: &Path) {
    let cluster_key = corbel::seal::SecretKey::load(key).unwrap();
    let elsewhere = store.dir.path().join("elsewhere");
    let (key, state_text) = (key.display().to_string(), state.display().to_string());
    let elsewhere_text = elsewhere.display().to_string();
    let tries: [(&[(&str, &str)], &str); 2] = [
        (&[("CORBEL_PROVIDER_STATE_DIR", &state_text)], "secret key"),
        (
            &[
                ("CORBEL_SECRET_KEY_FILE", &key),
                ("CORBEL_PROVIDER_STATE_DIR", &elsewhere_text),
            ],
            "provider state directory",
        ),
    ];
    for (extra, what) in tries {
        let env: Vec<(&str, &str)> = CLUSTER_ENV.iter().chain(extra).copied().collect();
        let out = serve_command(&store, &env).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "joined with another {what}: {said}");
        let (ours, theirs) = match what {
            "secret key" => {
                let made = corbel::seal::SecretKey::load(&store.data_dir().join("secret.key"));
                (made.unwrap().id().to_owned(), cluster_key.id().to_owned())
            }
            _ => (elsewhere_text.clone(), state_text.clone()),
        };
        for part in [
            format!("this replica's {what} is {ours}"),
            format!("runs with {theirs}"),
        ] {
            assert!(said.contains(&part), "`{part}` not in: {said}");
        }
    }
}

/// A replica that would migrate the schema while others are alive exits at
/// start naming both versions. No older Corbel is at hand, so the database
/// is made to look one migration behind (its last migration's record taken
/// away, then put back): a fake of the one fault we cannot cause here.
async fn refused_migration(store: TestStore, key: &Path, state: &Path) {
    use sea_orm::{ConnectionTrait, Database, Statement};
    let url = store.database_url.clone().expect("PostgreSQL");
    let db = Database::connect(&url).await.unwrap();
    let backend = db.get_database_backend();
    let last = corbel::store::schema_version();
    let sql = |sql: &str, values: Vec<sea_orm::Value>| {
        Statement::from_sql_and_values(backend, sql, values)
    };
    let row = db
        .query_one_raw(sql(
            "SELECT applied_at FROM seaql_migrations WHERE version = $1",
            vec![last.clone().into()],
        ))
        .await
        .unwrap()
        .expect("the last migration is applied");
    let applied: i64 = row.try_get("", "applied_at").unwrap();
    db.execute_raw(sql(
        "DELETE FROM seaql_migrations WHERE version = $1",
        vec![last.clone().into()],
    ))
    .await
    .unwrap();
    let (key, state) = (key.display().to_string(), state.display().to_string());
    let extra = [
        ("CORBEL_SECRET_KEY_FILE", key.as_str()),
        ("CORBEL_PROVIDER_STATE_DIR", state.as_str()),
    ];
    let env: Vec<(&str, &str)> = CLUSTER_ENV.iter().chain(&extra).copied().collect();
    let out = serve_command(&store, &env).output().unwrap();
    db.execute_raw(sql(
        "INSERT INTO seaql_migrations (version, applied_at) VALUES ($1, $2)",
        vec![last.clone().into(), applied.into()],
    ))
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "migrated under live replicas: {said}"
    );
    for part in [
        "would migrate the database's schema from m20".to_owned(),
        format!(" to {last}, but replica"),
        "(alive) runs Corbel".to_owned(),
    ] {
        assert!(said.contains(&part), "`{part}` not in: {said}");
    }
}

async fn leader_struck_mid_run(test: &'static str, struck: Struck) {
    let first = TestStore::fresh().await;
    if !first.is_postgres() {
        // SQLite keeps one server: `--cluster` is refused, saying why.
        let out = serve_command(&first, &[("CORBEL_CLUSTER", "true")])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{said}");
        assert!(
            said.contains("replicas share one PostgreSQL database"),
            "{said}"
        );
        return;
    }
    let knobs = Knobs::from_env(0x5eed_0018, 1);
    let mut chaos = Chaos::new(test, knobs);
    let _leftovers = Leftovers::new(&chaos.mark);
    let app = TestApp::spawn_with(Arc::new(first), quick).await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (provider, blueprint) = prepare(&app, &repo, &chaos.shape).await;
    let first = Arc::into_inner(app.stop().await).expect("the store is ours again");
    let database_url = first.database_url.clone();
    let shared = tempfile::tempdir().unwrap();
    let key = shared.path().join("secret.key");
    std::fs::copy(first.data_dir().join("secret.key"), &key).unwrap();
    let state = shared.path().join("provider-state");
    let other = || TestStore {
        dir: tempfile::tempdir().unwrap(),
        database_url: database_url.clone(),
    };

    let mut replicas = vec![Replica::start(first, &key, &state)];
    assert_eq!(replicas[0].role(), "leader", "the first replica leads");
    for _ in 0..2 {
        let replica = Replica::start(other(), &key, &state);
        assert_eq!(replica.role(), "standby");
        replicas.push(replica);
    }
    let leader = replicas[0].pid();
    // Any replica answers, the standbys by forwarding to the leader.
    for replica in &replicas {
        let api = replica.api_for(leader);
        let seen = eventually(Duration::from_secs(20), "three replicas alive", || async {
            members(&api)
                .await
                .ok()
                .filter(|m| m.iter().filter(|(_, s, _)| s == "ALIVE").count() == 3)
        })
        .await;
        let leaders: Vec<u32> = seen.iter().filter(|m| m.2).map(|m| m.0).collect();
        assert_eq!(leaders, vec![leader], "one leader, the first: {seen:?}");
    }

    if matches!(struck, Struck::Killed) {
        refused_unshared(other(), &key, &state);
        refused_migration(other(), &key, &state).await;
    }

    // The run, asked through a standby and followed on the other.
    let api = replicas[2].api_for(leader);
    let id = chaos.deploy(&api, &blueprint).await.expect("deployed");
    let sockets = Arc::new(AtomicUsize::new(0));
    let following = tokio::spawn(follow(replicas[1].client(), id.clone(), sockets.clone()));
    let (when, under_way) = moment(&api, &id, &Progress::Deploy, 8, Duration::ZERO).await;
    let before = stored_events(&api, &id).await.last().copied().unwrap_or(0);
    let leader_pid = i32::try_from(leader).unwrap();
    match struck {
        Struck::Killed => replicas[0].server.kill(),
        Struck::Paused => signal(leader_pid, libc::SIGSTOP),
    }
    let killed = Instant::now();
    chaos.struck(under_way);
    println!("replicas: the leader (pid {leader}) {struck:?} at {when}");

    // A standby takes over; the run goes on. A request sent to a standby
    // meanwhile is answered by the new leader: it waits for it, and a read
    // that reached a paused leader is sent on once another leads.
    let api_b = replicas[1].api_for(0);
    let during = tokio::spawn({
        let api_b = replicas[1].api_for(0);
        async move { members(&api_b).await }
    });
    // Read from the database: a request relayed to a paused leader would
    // wait for it.
    let db = corbel::store::connect(&replicas[1].store.config().database().unwrap())
        .await
        .unwrap();
    let new_leader = eventually(Duration::from_secs(20), "a new leader", || async {
        let (id, _) = corbel::store::cluster::holder_url(&db, "leader")
            .await
            .ok()??;
        let row = corbel::store::cluster::replica(&db, id).await.ok()??;
        let pid = u32::try_from(row.pid).ok()?;
        (pid != leader).then_some(pid)
    })
    .await;
    if struck == Struck::Paused {
        // The old leader still paused, its connections open: the follower's
        // relayed socket was closed once another led, and it subscribed
        // again. (The run itself waits for the paused leader's provider to
        // end: its successor shares the state directory's lock.)
        eventually(
            Duration::from_secs(20),
            "the follower to subscribe again",
            || {
                let sockets = sockets.load(Ordering::SeqCst);
                async move { (sockets >= 2).then_some(()) }
            },
        )
        .await;
        signal(leader_pid, libc::SIGCONT);
        let stale = &mut replicas[0].server.served.as_mut().unwrap().child;
        let status = eventually(Duration::from_secs(20), "the stale leader to stop", || {
            let status = stale.try_wait().unwrap();
            async move { status }
        })
        .await;
        assert_eq!(status.code(), Some(75), "a stale leader exits with 75");
        replicas[0].server.kill();
    }
    // Never answered by the old leader as the leader.
    let during = during
        .await
        .unwrap()
        .expect("a request during the failover is answered");
    assert!(
        during
            .iter()
            .any(|(pid, state, leads)| *leads && state == "ALIVE" && *pid != leader),
        "answered by a new leader: {during:?}"
    );
    let took_over = killed.elapsed();
    let continued = eventually(Duration::from_secs(30), "the run to go on", || async {
        let last = stored_events(&api_b, &id)
            .await
            .last()
            .copied()
            .unwrap_or(0);
        (last > before).then(Instant::now)
    })
    .await;
    println!(
        "replicas: failover: leader {struck:?} -> new leader (pid {new_leader}) serving in {} ms \
         -> the run continued in {} ms",
        took_over.as_millis(),
        (continued - killed).as_millis()
    );
    let index = replicas
        .iter()
        .position(|r| r.server.served.is_some() && r.pid() == new_leader)
        .expect("the new leader is one of ours");
    let api = replicas[if index == 1 { 2 } else { 1 }].api_for(new_leader);
    let settled = std::panic::AssertUnwindSafe(chaos.settle_and_check(
        &api,
        &replicas[index].store,
        &provider,
        "after the failover",
    ))
    .catch_unwind()
    .await;
    let views = match settled {
        Ok(Some(views)) => views,
        Ok(None) => panic!("not settled after the failover\n{}", told(&mut replicas)),
        Err(failed) => {
            println!("{}", told(&mut replicas));
            std::panic::resume_unwind(failed)
        }
    };
    // One failover, not two: the new leader still runs.
    assert!(
        matches!(
            replicas[index]
                .server
                .served
                .as_mut()
                .map(|s| s.child.try_wait()),
            Some(Ok(None))
        ),
        "the new leader stopped\n{}",
        told(&mut replicas)
    );
    assert_eq!(views[&id].state, "COMPLETE", "the run finished");
    // One provider process, the new leader's child; the old one is gone.
    let running = eventually(Duration::from_secs(20), "one provider process", || async {
        let pids = provider_processes(&replicas, &provider);
        (pids.len() == 1).then_some(pids)
    })
    .await;
    assert_eq!(parent(running[0]), Some(new_leader as i32));

    // The follower saw every stored event once, in order, to the end.
    let seen = following.await.unwrap().expect("followed to the end");
    assert_followed(&seen, &stored_events(&api, &id).await);
    println!(
        "replicas: the follower saw {} events on {} socket(s)",
        seen.len(),
        sockets.load(Ordering::SeqCst)
    );

    // Cleaned up through the survivors.
    chaos.destroy(&api, 0).await.expect("destroy asked");
    chaos
        .settle_and_check(&api, &replicas[index].store, &provider, "after destroying")
        .await
        .expect("settled after destroying");
    chaos.finish();
}
