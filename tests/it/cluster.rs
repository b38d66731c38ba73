//! Replicas (issue 18, first part): membership and leadership leases on the
//! real database, and the real binary's replicas across a SIGKILL, a clean
//! stop and a restart.

use std::time::Duration;

use corbel::cluster::{Cluster, ClusterError, ClusterSettings, Fenced, ReplicaState, Shared};
use sea_orm::{ConnectionTrait, Statement};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::support::binary::{admin_gql, serve, terminate};
use crate::support::{ADMIN_TOKEN, TestStore, eventually};

async fn database(store: &TestStore) -> corbel::store::Db {
    let location = store.config().database().unwrap();
    let db = corbel::store::connect(&location).await.unwrap();
    corbel::store::migrate(&db).await.unwrap();
    db
}

/// Marks every replica's host with `mark`: a write whose landing is easy to see.
fn mark_hosts(
    mark: &'static str,
) -> impl for<'t> FnOnce(
    &'t sea_orm::DatabaseTransaction,
) -> corbel::store::cluster::FencedWrite<'t, u64>
+ Send {
    move |txn| {
        Box::pin(async move {
            let backend = txn.get_database_backend();
            let done = txn
                .execute_raw(Statement::from_string(
                    backend,
                    format!("UPDATE replicas SET host = '{mark}'"),
                ))
                .await?;
            Ok(done.rows_affected())
        })
    }
}

async fn hosts(db: &corbel::store::Db) -> Vec<String> {
    let (rows, _) = corbel::store::cluster::replicas(db).await.unwrap();
    rows.into_iter().map(|r| r.host).collect()
}

/// Two replicas of one database: the first leads; paused (it stops renewing),
/// it keeps believing it leads, but the second takes over only once the
/// first's lease has run out by the database's clock, with the next epoch;
/// the first's writes as leader are then refused, and once it runs again it
/// steps down and stays a member.
#[tokio::test]
async fn leadership_moves_only_when_the_lease_runs_out_and_a_stale_leader_is_fenced() {
    let store = TestStore::fresh().await;
    let db = database(&store).await;
    let settings = ClusterSettings {
        enabled: false,
        advertise_url: None,
        heartbeat: Duration::from_millis(100),
        lease: Duration::from_millis(800),
    };
    let join = |url: &str, token: &CancellationToken| {
        Cluster::join(
            db.clone(),
            settings.clone(),
            url.to_owned(),
            Shared::default(),
            false,
            token.clone(),
        )
    };
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let a = join("http://a.example", &stop_a).await.unwrap();
    let first = a.leader_epoch().expect("the first replica leads");
    let b = join("http://b.example", &stop_b).await.unwrap();
    assert_eq!(b.leader_epoch(), None, "the lease is a's");
    let a_until = corbel::store::cluster::lease(&db, "leader")
        .await
        .unwrap()
        .unwrap()
        .until_ms;

    // Only b renews: a is paused.
    let b_running = tokio::spawn(b.clone().run());
    let epoch = eventually(Duration::from_secs(20), "b to lead", || async {
        let epoch = b.leader_epoch()?;
        let now = corbel::store::cluster::database_now(&db).await.ok()?;
        assert!(
            now >= a_until,
            "b leads at {now}, before a's lease ran out at {a_until}"
        );
        Some(epoch)
    })
    .await;
    assert_eq!(epoch, first + 1, "a new holder has the next epoch");

    // a still thinks it leads; the database refuses its writes.
    assert_eq!(a.leader_epoch(), Some(first));
    let refused = a.fenced(mark_hosts("written-by-a")).await;
    assert!(
        matches!(refused, Err(Fenced::Fenced { epoch, .. }) if epoch == first),
        "{refused:?}"
    );
    assert!(!hosts(&db).await.contains(&"written-by-a".to_owned()));
    assert_eq!(b.fenced(mark_hosts("written-by-b")).await.unwrap(), 2);
    assert_eq!(hosts(&db).await, ["written-by-b", "written-by-b"]);

    let listed = b.replicas().await.unwrap();
    let state_of = |url: &str| {
        let r = listed.iter().find(|r| r.advertise_url == url).unwrap();
        (r.state, r.leader)
    };
    assert_eq!(state_of("http://a.example"), (ReplicaState::Lost, false));
    assert_eq!(state_of("http://b.example"), (ReplicaState::Alive, true));

    // a wakes: it steps down and is a member again, not the leader.
    let a_running = tokio::spawn(a.clone().run());
    eventually(Duration::from_secs(20), "a to step down", || async {
        a.leader_epoch().is_none().then_some(())
    })
    .await;
    eventually(Duration::from_secs(20), "a alive again", || async {
        let listed = b.replicas().await.ok()?;
        let a = listed
            .iter()
            .find(|r| r.advertise_url == "http://a.example")?;
        (a.state == ReplicaState::Alive && !a.leader).then_some(())
    })
    .await;
    assert_eq!(b.leader_epoch(), Some(epoch), "b kept leading throughout");

    // Both leave: stopped, and the lease is free.
    stop_a.cancel();
    stop_b.cancel();
    a_running.await.unwrap();
    b_running.await.unwrap();
    let (rows, _) = corbel::store::cluster::replicas(&db).await.unwrap();
    assert!(rows.iter().all(|r| r.stopped_ms.is_some()), "{rows:?}");
    let lease = corbel::store::cluster::lease(&db, "leader")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lease.holder, None);
}

const INFO: &str = "{ serverInfo { replicaId advertiseUrl leader } \
                     replicas { id advertiseUrl state leader pid } }";

async fn info(addr: std::net::SocketAddr) -> Value {
    let body = admin_gql(addr, INFO, json!({})).await.unwrap();
    assert!(body.get("errors").is_none(), "{body}");
    body["data"].clone()
}

fn replica<'a>(data: &'a Value, id: &Value) -> &'a Value {
    data["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == *id)
        .unwrap_or_else(|| panic!("no replica {id} in {data}"))
}

/// The real binary: each start is a new replica that leads at once; one
/// SIGKILLed is LOST to the next, one stopped cleanly is STOPPED; the URL
/// advertised is the listener's unless given.
#[tokio::test]
async fn each_start_is_a_replica_and_the_dead_are_told_from_the_stopped() {
    let store = TestStore::fresh().await;
    let admin = ("CORBEL_ADMIN_TOKEN", ADMIN_TOKEN);
    let mut first = serve(&store, &[admin]);
    let seen = info(first.addr).await;
    let first_id = seen["serverInfo"]["replicaId"].clone();
    assert_eq!(seen["serverInfo"]["leader"], true);
    assert_eq!(
        seen["serverInfo"]["advertiseUrl"],
        format!("http://{}", first.addr)
    );
    assert_eq!(seen["replicas"].as_array().unwrap().len(), 1, "{seen}");
    let me = replica(&seen, &first_id);
    assert_eq!(
        (&me["state"], &me["leader"]),
        (&json!("ALIVE"), &json!(true))
    );
    assert_eq!(me["pid"], first.child.id());
    // Without a token the advertised URL (maybe an internal address) is not said.
    let anonymous: Value = reqwest::Client::new()
        .post(format!("http://{}/graphql", first.addr))
        .json(&json!({ "query": "{ serverInfo { replicaId advertiseUrl leader } }" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        anonymous["data"]["serverInfo"],
        json!({ "replicaId": first_id, "advertiseUrl": null, "leader": true }),
        "{anonymous}"
    );

    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let mut second = serve(
        &store,
        &[
            admin,
            ("CORBEL_ADVERTISE_URL", "http://corbel-2.example:8080"),
        ],
    );
    let seen = info(second.addr).await;
    let second_id = seen["serverInfo"]["replicaId"].clone();
    assert_ne!(second_id, first_id);
    assert_eq!(seen["serverInfo"]["leader"], true, "it leads at once");
    assert_eq!(
        seen["serverInfo"]["advertiseUrl"],
        "http://corbel-2.example:8080"
    );
    assert_eq!(replica(&seen, &first_id)["state"], "LOST", "{seen}");
    assert_eq!(replica(&seen, &first_id)["leader"], false);
    assert_eq!(replica(&seen, &second_id)["state"], "ALIVE");

    assert!(terminate(&mut second.child).success());
    let third = serve(&store, &[admin]);
    let seen = info(third.addr).await;
    assert_eq!(seen["replicas"].as_array().unwrap().len(), 3, "{seen}");
    assert_eq!(replica(&seen, &second_id)["state"], "STOPPED", "{seen}");
    assert_eq!(replica(&seen, &first_id)["state"], "LOST");
    let third_id = seen["serverInfo"]["replicaId"].clone();
    assert_eq!(replica(&seen, &third_id)["leader"], true);
}

/// A replica that joins with another secret key, or another provider state
/// directory, than one alive is refused, naming both, and leaves no row;
/// one that shares them joins.
#[tokio::test]
async fn a_replica_that_does_not_share_the_key_or_the_state_directory_is_refused() {
    let store = TestStore::fresh().await;
    let db = database(&store).await;
    let settings = ClusterSettings {
        enabled: false,
        advertise_url: None,
        heartbeat: Duration::from_millis(100),
        lease: Duration::from_secs(30),
    };
    let shared = |key: &str, dir: &str| Shared {
        key_id: key.to_owned(),
        state_dir: dir.to_owned(),
    };
    let stop = CancellationToken::new();
    let join = |url: &'static str, with: Shared| {
        Cluster::join(
            db.clone(),
            settings.clone(),
            url.to_owned(),
            with,
            false,
            stop.clone(),
        )
    };
    let _first = join("http://a.example", shared("k1", "/srv/state"))
        .await
        .unwrap();
    for (with, named) in [
        (
            shared("k2", "/srv/state"),
            ["secret key is k2", "runs with k1"],
        ),
        (
            shared("k1", "/elsewhere"),
            [
                "provider state directory is /elsewhere",
                "runs with /srv/state",
            ],
        ),
    ] {
        match join("http://b.example", with).await {
            Err(ClusterError::Unshared(message)) => {
                for part in named {
                    assert!(message.contains(part), "`{part}` not in: {message}");
                }
                assert!(message.contains("http://a.example"), "{message}");
            }
            Err(other) => panic!("refused for another reason: {other}"),
            Ok(_) => panic!("joined without sharing"),
        }
    }
    let (rows, _) = corbel::store::cluster::replicas(&db).await.unwrap();
    assert_eq!(rows.len(), 1, "a refused replica leaves no row");
    join("http://c.example", shared("k1", "/srv/state"))
        .await
        .unwrap();
}
