//! Replicas (issue 18) as real processes: three `corbel serve --cluster` on
//! one PostgreSQL, each with its own data directory, sharing the secret key
//! and the providers' state directory. The leader, which runs the provider
//! and the deployment, is SIGKILLed mid-run; a standby takes over, relaunches
//! the provider and finishes the run; the processes running are then exactly
//! those Corbel records, each once. The standbys answer queries themselves
//! (the leader's request count does not move), also while the leader is
//! down; `deploymentEvents` and `serverEvents` held on both standbys see no
//! close, and every event once, in order, to the run's end.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use corbel::client::Api as ClientApi;
use corbel::client::Subscription;
use futures_util::FutureExt as _;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::followers::{ServerEvents, assert_followed, follow, requests, stored_events};
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

/// The live provider processes among the replicas' pid files.
fn provider_processes(replicas: &[Replica], provider: &str) -> Vec<i32> {
    replicas
        .iter()
        .filter_map(|r| provider_process(&r.store, provider))
        .map(|(pid, _)| pid)
        .collect()
}

/// Queries sent to a standby are answered there: its own count of GraphQL
/// requests grows by them, the leader's does not move; what needs a
/// provider's link, and mutations (here over the standby's websocket), go
/// to the leader.
async fn reads_stay_on_the_standby(replicas: &[Replica]) {
    let leader = replicas[0].served().addr;
    let standby = replicas[1].served().addr;
    let (leader_before, standby_before) = (requests(leader).await, requests(standby).await);
    let api = replicas[1].api_for(0);
    for _ in 0..20 {
        api.gql(
            "{ serverInfo { version } deployments(first: 5) { nodes { id } } }",
            json!({}),
        )
        .await
        .expect("a standby answers queries");
    }
    let (leader_after, standby_after) = (requests(leader).await, requests(standby).await);
    assert_eq!(
        leader_after, leader_before,
        "the leader counted reads sent to a standby"
    );
    assert!(
        standby_after >= standby_before + 20.0,
        "the standby answered them: {standby_before} -> {standby_after}"
    );

    // What needs a provider's link is the leader's to answer.
    let nodes = api
        .gql("{ providers { nodes { name nodes { name } } } }", json!({}))
        .await
        .expect("a provider's nodes asked of a standby");
    assert!(
        nodes["providers"]["nodes"][0]["nodes"][0]["name"].is_string(),
        "{nodes}"
    );
    // A mutation over a standby's websocket is made by the leader, and its
    // audit entry reaches the other standby's `auditEvents`.
    let mut audited = Subscription::start(
        &replicas[2].client(),
        "subscription { auditEvents { action outcome } }",
        json!({}),
    )
    .await
    .expect("auditEvents on a standby");
    let mut made = Subscription::start(
        &replicas[1].client(),
        "mutation { createProject(input: { name: \"over-a-standby-socket\" }) { name } }",
        json!({}),
    )
    .await
    .expect("a standby's websocket");
    let answer = made.next().await.expect("an answer");
    assert_eq!(
        answer.as_ref().map(|a| &a["createProject"]["name"]),
        Some(&json!("over-a-standby-socket")),
        "{answer:?}"
    );
    made.close().await;
    let entry = tokio::time::timeout(Duration::from_secs(10), audited.next())
        .await
        .expect("the audit entry within 10 s");
    assert_eq!(
        entry
            .as_ref()
            .ok()
            .and_then(|e| e.as_ref())
            .map(|e| e["auditEvents"].clone()),
        Some(json!({ "action": "createProject", "outcome": "OK" })),
        "{entry:?}"
    );
    audited.close().await;
    assert!(
        requests(leader).await >= leader_after + 2.0,
        "the leader made the mutation and answered the nodes"
    );
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
    reads_stay_on_the_standby(&replicas).await;

    // The run, asked through a standby and followed on both.
    let api = replicas[2].api_for(leader);
    let id = chaos.deploy(&api, &blueprint).await.expect("deployed");
    let sockets = [(); 2].map(|()| Arc::new(AtomicUsize::new(0)));
    let following = [1, 2].map(|r| {
        let (client, id, sockets) = (replicas[r].client(), id.clone(), sockets[r - 1].clone());
        tokio::spawn(follow(client, id, sockets))
    });
    let mut server_events = Vec::new();
    for r in [1, 2] {
        server_events.push(ServerEvents::follow(replicas[r].client(), &id).await);
    }
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
    // Read on a standby at once, while no replica leads (a lease is 2 s):
    // answered from the database, not waiting for a leader.
    let read = tokio::time::timeout(
        Duration::from_millis(1500),
        replicas[2].api_for(0).gql(
            "query($id: ID!) { deployment(id: $id) { state } }",
            json!({ "id": id }),
        ),
    )
    .await;
    let read_after = killed.elapsed();
    assert!(
        matches!(&read, Ok(Ok(data)) if data["deployment"]["state"].is_string()),
        "a standby answers a query while the leader is down: {read:?}"
    );
    println!(
        "replicas: a standby answered a query {} ms after the leader went",
        read_after.as_millis()
    );

    // A standby takes over; the run goes on. A change sent to a standby
    // meanwhile waits for the new leader, and is made once.
    let api_b = replicas[1].api_for(0);
    let during = tokio::spawn({
        let api_b = replicas[1].api_for(0);
        async move {
            api_b
                .gql(
                    "mutation { createProject(input: { name: \"during-failover\" }) { id } }",
                    json!({}),
                )
                .await
        }
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
        // Another leads while the old one is still paused, its connections
        // open. (The run itself waits for the paused leader's provider to
        // end: its successor shares the state directory's lock.)
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
    // Sent to a leader killed, it was not taken, and goes to the next one;
    // sent to a paused one, whether it took it is not known, which the
    // client is told (that leader, fenced, never makes it).
    let during = during.await.unwrap();
    match struck {
        Struck::Killed => assert!(
            during.is_ok(),
            "a change asked during the failover is made: {during:?}"
        ),
        Struck::Paused => assert!(
            during.as_ref().is_ok() || during.as_ref().is_err_and(|e| e.contains("is not known")),
            "{during:?}"
        ),
    }
    let projects = api_b
        .gql("{ projects { name } }", json!({}))
        .await
        .expect("projects");
    let made = projects["projects"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["name"] == "during-failover")
        .count();
    let once = if struck == Struck::Killed {
        1
    } else {
        usize::from(during.is_ok())
    };
    assert_eq!(
        made, once,
        "the change made once, or not at all: {projects}"
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

    // Each follower saw every stored event once, in order, to the end, on
    // the one socket it opened.
    let stored = stored_events(&api, &id).await;
    for (following, sockets) in following.into_iter().zip(&sockets) {
        let seen = following.await.unwrap().expect("followed to the end");
        assert_followed(&seen, &stored);
        assert_eq!(seen.first(), stored.first(), "the whole history");
        assert_eq!(
            sockets.load(Ordering::SeqCst),
            1,
            "a standby's subscription is never closed by a failover"
        );
        println!(
            "replicas: a follower on a standby saw {} events on one socket",
            seen.len()
        );
    }
    for events in server_events {
        events.finish().await;
    }

    // Cleaned up through the survivors.
    chaos.destroy(&api, 0).await.expect("destroy asked");
    chaos
        .settle_and_check(&api, &replicas[index].store, &provider, "after destroying")
        .await
        .expect("settled after destroying");
    chaos.finish();
}
