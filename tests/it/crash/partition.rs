//! A network partition (issue 18): three `corbel serve --cluster` replicas
//! and their PostgreSQL, each in a Docker container on a private network.
//! The leader, mid-run (a chain of containers with fan-in), is cut off with
//! `docker network disconnect`: it must stop acting (exit 75, its provider
//! gone with it) before another replica takes over; the new leader finishes
//! the run; the old one, reconnected and started again, joins as a standby;
//! every container the run made exists once, exactly as Corbel records it;
//! and a standby cut off still stops when asked.
//!
//! There is no registry, so every container runs the test busybox image
//! (`FROM scratch`) with the host's `/usr` mounted read-only: PostgreSQL
//! from Debian's package, this build's `corbel` and docker provider, and the
//! libraries they link, all from the host's files. The resources are
//! containers on the host's engine (the docker provider reaches it through
//! the mounted socket), so they outlive the replica that made them and the
//! test counts them with the docker CLI.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::followers::{assert_followed, follow, stored_events};
use super::observe::Api;
use crate::support::ADMIN_TOKEN;
use crate::support::binary::admin_gql;
use crate::support::deployments::{create_blueprint, with_docker_provider};
use crate::support::docker::{
    DeploymentCleanup, LABEL_DEPLOYMENT, Net, busybox_image, containers, docker, ip,
};
use crate::support::settings::QUICK_ENV;
use crate::support::{POSTGRES_ENV, TestStore, corbel_bin, eventually};

/// Containers in the chain the run makes, one after another.
const CHAIN: usize = 12;
/// Where the leader is cut off: once this many of them are made.
const CUT_AFTER: usize = 3;
/// Timings: a lease of eight heartbeats.
const HEARTBEAT_MS: &str = "250";
const LEASE_MS: &str = "2000";

impl Net {
    /// PostgreSQL from the host's package, trusting the network; its address
    /// seen from the host.
    fn postgres(&self) -> String {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL's package is installed (scripts/test.sh does)")
            .flatten()
            .map(|v| v.path().join("bin"))
            .filter(|bin| bin.join("postgres").exists())
            .max()
            .expect("a PostgreSQL server binary under /usr/lib/postgresql");
        // initdb and postgres want their user to have a name.
        let passwd = self.files.path().join("passwd");
        let group = self.files.path().join("group");
        std::fs::write(&passwd, "postgres:x:999:999:postgres:/tmp:/bin/sh\n").unwrap();
        std::fs::write(&group, "postgres:x:999:\n").unwrap();
        let extra = [
            "--user".to_owned(),
            "999:999".to_owned(),
            "--tmpfs".to_owned(),
            "/tmp:mode=1777".to_owned(),
            "-v".to_owned(),
            format!("{}:/etc/passwd:ro", passwd.display()),
            "-v".to_owned(),
            format!("{}:/etc/group:ro", group.display()),
        ];
        let bin = bin.display();
        let container = self.run(
            "pg",
            &extra,
            &format!(
                "{bin}/initdb -D /tmp/pg -U corbel --auth=trust --no-locale -E UTF8 --no-sync \
                 >/tmp/initdb.log 2>&1 || {{ cat /tmp/initdb.log; exit 1; }}; \
                 echo 'host all all 0.0.0.0/0 trust' >> /tmp/pg/pg_hba.conf; \
                 exec {bin}/postgres -D /tmp/pg -c listen_addresses='*' \
                 -c unix_socket_directories=/tmp -c fsync=off -c max_connections=300"
            ),
        );
        ip(&container)
    }

    /// A replica: this build's `corbel serve --cluster` as pid 1, with the
    /// docker provider's binary, its git repository and the engine's socket.
    fn replica(&self, name: &str, repo: &Path, key: &Path) -> String {
        let bin_dir = corbel_bin().parent().unwrap().to_path_buf();
        let mut extra = Vec::new();
        let mounts = [
            format!("{0}:{0}:ro", bin_dir.display()),
            format!("{0}:{0}:ro", repo.display()),
            "/var/run/docker.sock:/var/run/docker.sock".to_owned(),
            format!("{}:/secret.key:ro", key.display()),
        ];
        for mount in mounts {
            extra.extend(["-v".to_owned(), mount]);
        }
        let advertise = format!("http://{}-{name}:8080", self.name);
        let database = format!("postgres://corbel@{}-pg:5432/postgres", self.name);
        let env = QUICK_ENV.iter().copied().chain([
            ("CORBEL_CLUSTER", "true"),
            ("CORBEL_CLUSTER_HEARTBEAT_MS", HEARTBEAT_MS),
            ("CORBEL_CLUSTER_LEASE_MS", LEASE_MS),
            ("CORBEL_LISTEN", "0.0.0.0:8080"),
            ("CORBEL_ADVERTISE_URL", &advertise),
            ("CORBEL_DATABASE_URL", &database),
            ("CORBEL_DATA_DIR", "/data"),
            ("CORBEL_SECRET_KEY_FILE", "/secret.key"),
            ("CORBEL_LOG_FORMAT", "json"),
            ("HOME", "/data"),
            ("PATH", "/bin"),
        ]);
        for (key, value) in env {
            extra.extend(["-e".to_owned(), format!("{key}={value}")]);
        }
        self.run(
            name,
            &extra,
            &format!(
                "mkdir -p /data /tmp && exec {} serve",
                corbel_bin().display()
            ),
        )
    }
}

fn api(container: &str) -> SocketAddr {
    format!("{}:8080", ip(container)).parse().unwrap()
}

/// The container's JSON log lines, all its runs.
fn log(container: &str) -> Vec<Value> {
    let out = Command::new("docker")
        .args(["logs", container])
        .output()
        .expect("docker logs runs");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    text.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// The roles its runs announced, in order.
fn roles(container: &str) -> Vec<String> {
    log(container)
        .iter()
        .filter(|line| line["url"].is_string())
        .map(|line| line["role"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// When its log first says it leads.
fn leading_since(container: &str) -> Option<DateTime<Utc>> {
    log(container).iter().find_map(|line| {
        line["message"]
            .as_str()?
            .starts_with("leading: singletons run here")
            .then(|| line["timestamp"].as_str()?.parse().ok())?
    })
}

/// The engine's word on a container: status, exit code, when it finished.
fn exited(container: &str) -> Option<(i64, DateTime<Utc>)> {
    let said = docker(&[
        "inspect",
        "-f",
        "{{.State.Status}} {{.State.ExitCode}} {{.State.FinishedAt}}",
        container,
    ]);
    let mut parts = said.split_whitespace();
    (parts.next()? == "exited").then_some(())?;
    let code = parts.next()?.parse().ok()?;
    let finished = parts.next()?.parse().ok()?;
    Some((code, finished))
}

async fn gql(addr: SocketAddr, query: &str, variables: Value) -> Option<Value> {
    let body = admin_gql(addr, query, variables).await?;
    body.get("errors").is_none().then(|| body["data"].clone())
}

/// The deployment's state and its nodes' (key, state, container id).
async fn nodes(addr: SocketAddr, id: &str) -> Option<(String, Vec<(String, String, String)>)> {
    let data = gql(
        addr,
        "query($id: ID!) { deployment(id: $id) { state nodes { key state outputs } } }",
        json!({ "id": id }),
    )
    .await?;
    let deployment = &data["deployment"];
    let nodes = deployment["nodes"]
        .as_array()?
        .iter()
        .map(|n| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (s(&n["key"]), s(&n["state"]), s(&n["outputs"]["id"]))
        })
        .collect();
    Some((deployment["state"].as_str()?.to_owned(), nodes))
}

/// The replicas as `replicas` shows them: advertised URL, state, leader.
async fn members(addr: SocketAddr) -> Option<Vec<(String, String, bool)>> {
    let data = gql(
        addr,
        "{ replicas { advertiseUrl state leader } }",
        json!({}),
    )
    .await?;
    Some(
        data["replicas"]
            .as_array()?
            .iter()
            .map(|r| {
                (
                    r["advertiseUrl"].as_str().unwrap_or_default().to_owned(),
                    r["state"].as_str().unwrap_or_default().to_owned(),
                    r["leader"].as_bool().unwrap_or_default(),
                )
            })
            .collect(),
    )
}

/// A container the engine has for a deployment.
#[derive(Debug)]
struct Made {
    id: String,
    key: String,
    status: String,
}

/// The containers the engine has for `deployment`.
fn engine_containers(deployment: &str) -> Vec<Made> {
    containers(&format!("{LABEL_DEPLOYMENT}={deployment}"))
        .into_iter()
        .map(|id| {
            let said = docker(&[
                "inspect",
                "-f",
                "{{index .Config.Labels \"io.corbel.key\"}} {{.State.Status}}",
                &id,
            ]);
            let (key, status) = said.split_once(' ').unwrap_or((&said, ""));
            Made {
                key: key.to_owned(),
                status: status.to_owned(),
                id,
            }
        })
        .collect()
}

/// A chain of containers, each made after the one before, with fan-in:
/// from the third on, each waits for the two before it.
fn chain_blueprint() -> String {
    let mut source = String::from("version: \"1\"\nresources:\n");
    for i in 0..CHAIN {
        let before: Vec<String> = (i.saturating_sub(2)..i)
            .map(|j| format!("c{j:02}"))
            .collect();
        source.push_str(&format!("  c{i:02}:\n    type: docker.v1.container\n"));
        if !before.is_empty() {
            source.push_str(&format!("    depends_on: [{}]\n", before.join(", ")));
        }
        source.push_str(&format!(
            "    config:\n      image: {}\n      \
             command: \"trap 'exit 0' TERM; sleep 3600 & wait\"\n",
            busybox_image()
        ));
    }
    source
}

#[tokio::test]
async fn a_leader_cut_off_from_the_database_stops_before_another_takes_over() {
    if std::env::var(POSTGRES_ENV).is_err() {
        // Replicas need PostgreSQL; this test brings its own, in a
        // container, and runs in the suite's PostgreSQL pass.
        println!("partition: runs in the PostgreSQL pass ({POSTGRES_ENV} set)");
        return;
    }
    let net = Net::new("corbel-part");
    let pg = net.postgres();
    let host_store = TestStore {
        dir: tempfile::tempdir().unwrap(),
        database_url: Some(format!("postgres://corbel@{pg}:5432/postgres")),
    };
    let location = host_store.config().database().unwrap();
    eventually(
        Duration::from_secs(30),
        "PostgreSQL in its container",
        || async { corbel::store::connect(&location).await.ok() },
    )
    .await;

    // The provider and the blueprint, made by a server on the host; then
    // the replicas take the database over.
    let (app, _provider, repo) = with_docker_provider(Arc::new(host_store)).await;
    let blueprint = create_blueprint(&app, "chain", &chain_blueprint()).await;
    let host_store = Arc::into_inner(app.stop().await).expect("the store is ours again");
    let key = net.files.path().join("secret.key");
    std::fs::copy(host_store.data_dir().join("secret.key"), &key).unwrap();
    let repo_dir: PathBuf = repo.bare();

    let mut names = Vec::new();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        let container = net.replica(name, &repo_dir, &key);
        let role = eventually(Duration::from_secs(30), "a replica's announcement", || {
            let container = container.clone();
            async move { roles(&container).first().cloned() }
        })
        .await;
        assert_eq!(role, if i == 0 { "leader" } else { "standby" }, "{name}");
        names.push(container);
    }
    let [a, b, c] = [&names[0], &names[1], &names[2]];
    let a_url = format!("http://{a}:8080");
    eventually(
        Duration::from_secs(30),
        "three replicas, a leading",
        || async {
            let seen = members(api(c)).await?;
            let alive = seen.iter().filter(|m| m.1 == "ALIVE").count();
            let leaders: Vec<&String> = seen.iter().filter(|m| m.2).map(|m| &m.0).collect();
            (alive == 3 && leaders == [&a_url]).then_some(())
        },
    )
    .await;

    // The run, asked through a standby.
    let deployed = gql(
        api(b),
        "mutation($input: DeployBlueprintInput!) { deployBlueprint(input: $input) { id } }",
        json!({ "input": { "blueprintId": blueprint, "name": "chain" } }),
    )
    .await
    .expect("deployed through a standby");
    let id = deployed["deployBlueprint"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let _leftovers = DeploymentCleanup(id.clone());
    // Followed on a standby, which serves it from the leader's events as
    // the database tells them: the cut-off leader's, then its successor's,
    // on the one socket.
    let follower =
        corbel::client::Api::new(&format!("http://{}", api(c)), Some(ADMIN_TOKEN.to_owned()))
            .unwrap();
    let sockets = Arc::new(AtomicUsize::new(0));
    let following = tokio::spawn(follow(follower, id.clone(), sockets.clone()));
    let made = eventually(Duration::from_secs(60), "the run under way", || async {
        let (_, nodes) = nodes(api(c), &id).await?;
        let made = nodes.iter().filter(|n| n.1 == "COMPLETE").count();
        (made >= CUT_AFTER).then_some(made)
    })
    .await;
    assert!(made < CHAIN, "cut off mid-run, not after it");

    // Cut off: the leader loses the database and the other replicas.
    docker(&["network", "disconnect", &net.name, a]);
    println!("partition: {a} cut off with {made} of {CHAIN} containers made");
    let (code, stopped) = eventually(
        Duration::from_secs(30),
        "the cut-off leader to stop",
        || async move { exited(a) },
    )
    .await;
    assert_eq!(code, 75, "a leader that lost its lease exits with 75");
    let db = corbel::store::connect(&location).await.unwrap();
    let new_leader = eventually(Duration::from_secs(30), "another leader", || async {
        let (_, url) = corbel::store::cluster::holder_url(&db, "leader")
            .await
            .ok()??;
        (url != a_url).then_some(url)
    })
    .await;
    let successor = [b, c]
        .into_iter()
        .find(|n| new_leader == format!("http://{n}:8080"))
        .expect("the new leader is b or c");
    let took_over = leading_since(successor).expect("the new leader logs when it leads");
    println!(
        "partition: {a} stopped at {stopped}, {successor} leads from {took_over} ({} ms later)",
        (took_over - stopped).num_milliseconds()
    );
    assert!(
        stopped < took_over,
        "the cut-off leader stopped ({stopped}) before {successor} led ({took_over})"
    );

    // The survivors finish the run while the old leader is still cut off.
    let (state, recorded) = eventually(Duration::from_secs(120), "the run to end", || async {
        let (state, nodes) = nodes(api(c), &id).await?;
        matches!(state.as_str(), "COMPLETE" | "FAILED").then_some((state, nodes))
    })
    .await;
    assert_eq!(state, "COMPLETE", "the run finished: {recorded:?}");
    let seen = tokio::time::timeout(Duration::from_secs(30), following)
        .await
        .expect("the follower sees the run's end")
        .unwrap()
        .expect("followed to the end");
    let sockets = sockets.load(Ordering::SeqCst);
    assert_eq!(
        sockets, 1,
        "the follower's socket was closed at the failover"
    );
    assert_followed(&seen, &stored_events(&Api::at(api(b), 0), &id).await);
    println!(
        "partition: the follower on {c} saw {} events on {sockets} socket",
        seen.len()
    );

    // Reconnected and started again, the old leader joins as a standby.
    docker(&["network", "connect", &net.name, a]);
    docker(&["start", a]);
    let again = eventually(
        Duration::from_secs(30),
        "the old leader back",
        || async move {
            let roles = roles(a);
            (roles.len() == 2).then_some(roles)
        },
    )
    .await;
    assert_eq!(again, ["leader", "standby"], "it comes back as a standby");

    // Every container the run made exists once, as recorded.
    let engine = engine_containers(&id);
    let recorded_ids: BTreeSet<&str> = recorded.iter().map(|n| n.2.as_str()).collect();
    let engine_ids: BTreeSet<&str> = engine.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(
        recorded_ids, engine_ids,
        "the containers running are those Corbel records: {engine:?}"
    );
    let keys: BTreeSet<&str> = engine.iter().map(|m| m.key.as_str()).collect();
    let recorded_keys: BTreeSet<&str> = recorded.iter().map(|n| n.0.as_str()).collect();
    assert_eq!(
        engine.len(),
        CHAIN,
        "one container per resource: {engine:?}"
    );
    assert_eq!(keys, recorded_keys, "no resource made twice: {engine:?}");
    assert!(
        engine.iter().all(|m| m.status == "running"),
        "all running: {engine:?}"
    );

    // Three alive again; the cut-off incarnation is lost, never stopped
    // cleanly (it could not reach the database to say goodbye).
    let seen = eventually(
        Duration::from_secs(30),
        "three replicas alive again",
        || async {
            let seen = members(api(a)).await?;
            (seen.iter().filter(|m| m.1 == "ALIVE").count() == 3).then_some(seen)
        },
    )
    .await;
    let lost: Vec<&(String, String, bool)> = seen.iter().filter(|m| m.1 == "LOST").collect();
    assert!(
        lost.len() == 1 && lost[0].0 == a_url,
        "the cut-off incarnation is lost: {seen:?}"
    );

    // Destroyed through the old leader, now a standby: nothing left.
    gql(
        api(a),
        "mutation($id: ID!) { destroyDeployment(id: $id) { id } }",
        json!({ "id": id }),
    )
    .await
    .expect("destroy asked");
    eventually(Duration::from_secs(60), "the run destroyed", || async {
        let (state, _) = nodes(api(b), &id).await?;
        (state == "DESTROYED" && engine_containers(&id).is_empty()).then_some(())
    })
    .await;

    // A standby cut off from the database still stops when asked (SIGTERM),
    // on its own: its lease runs out instead of being given up.
    let standby = if successor == c { b } else { c };
    docker(&["network", "disconnect", &net.name, standby]);
    let asked = std::time::Instant::now();
    docker(&["stop", "-t", "20", standby]);
    let (code, _) = exited(standby).expect("stopped");
    println!(
        "partition: {standby}, cut off, stopped {} ms after SIGTERM",
        asked.elapsed().as_millis()
    );
    assert_eq!(code, 0, "a cut-off standby stops by itself (not killed)");
}
