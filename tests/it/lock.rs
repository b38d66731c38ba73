//! One server per data directory and database, and socket paths checked at start.

use std::os::unix::fs::MetadataExt as _;
use std::sync::Arc;
use std::time::Duration;

use corbel::app::App;
use corbel::secret::Secret;
use serde_json::json;

use crate::support::binary::{Served, serve, serve_command, terminate};
use crate::support::{ADMIN_TOKEN, TestApp, TestStore, data, eventually};

const ADMIN: (&str, &str) = ("CORBEL_ADMIN_TOKEN", ADMIN_TOKEN);

async fn wait_ready(addr: std::net::SocketAddr) {
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/readyz");
    eventually(Duration::from_secs(20), "readiness", || async {
        let r = client.get(&url).send().await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
}

/// Runs `corbel serve` to its end (a refused one ends at once) and returns
/// whether it succeeded and its stderr.
async fn run_to_end(mut command: std::process::Command) -> (bool, String) {
    let output = tokio::task::spawn_blocking(move || command.output().expect("corbel runs"))
        .await
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn inode(path: &std::path::Path) -> u64 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .ino()
}

#[tokio::test]
async fn a_second_binary_on_one_data_dir_is_refused_and_the_first_is_untouched() {
    let store = TestStore::fresh().await;
    let mut first = serve(&store, &[ADMIN]);
    wait_ready(first.addr).await;
    let data_dir = std::path::absolute(store.data_dir()).unwrap();
    let socket = corbel::provider::socket_root_for(&data_dir).join("registry.sock");
    let before = inode(&socket);

    // On the first's own address (taken), and on another one.
    let taken = first.addr.to_string();
    for listen in [taken.as_str(), "127.0.0.1:0"] {
        let (ok, stderr) =
            run_to_end(serve_command(&store, &[ADMIN, ("CORBEL_LISTEN", listen)])).await;
        assert!(!ok, "the second server exits non-zero: {stderr}");
        assert!(
            stderr.contains(&format!("pid {}", first.child.id())),
            "names the holder: {stderr}"
        );
        assert!(
            stderr.contains(&format!("listening on {}", first.addr)),
            "{stderr}"
        );
        assert!(
            stderr.contains("stop it, or use another --data-dir"),
            "{stderr}"
        );
        assert_eq!(inode(&socket), before, "registry.sock is the first's");
        wait_ready(first.addr).await;
    }
    let status = tokio::task::spawn_blocking(move || terminate(&mut first.child))
        .await
        .unwrap();
    assert!(status.success(), "the first stops cleanly: {status:?}");
}

#[tokio::test]
async fn an_app_on_a_held_store_is_refused_until_the_first_stops() {
    let store = Arc::new(TestStore::fresh().await);
    let first = TestApp::spawn_on(store.clone()).await;
    let refused = App::build(&store.config())
        .await
        .err()
        .expect("a second server on the store is refused");
    let message = format!("{refused:#}");
    assert!(
        message.contains(&format!("pid {}", std::process::id())),
        "{message}"
    );
    assert!(message.contains(&first.addr.to_string()), "{message}");
    assert!(message.contains("corbel.lock"), "{message}");
    let info = first
        .gql_as(None, "{ serverInfo { version } }", json!({}))
        .await;
    data(&info);

    let store = first.stop().await;
    let again = TestApp::spawn_on(store).await;
    data(&again.gql("{ me { username } }", json!({})).await);
    let store = again.stop().await;

    // An App dropped without running lets go as well.
    let built = App::build(&store.config()).await.expect("builds");
    drop(built);
    let after = App::build(&store.config())
        .await
        .expect("a dropped App released the store");
    drop(after);
}

#[tokio::test]
async fn two_data_dirs_on_one_database_are_refused() {
    let store = Arc::new(TestStore::fresh().await);
    let first = serve(&store, &[ADMIN]);
    wait_ready(first.addr).await;
    let holder = first.child.id();
    let other = tempfile::tempdir().unwrap();
    let mut config = store.config();
    config.data_dir = other.path().to_owned();
    if !store.is_postgres() {
        // The same SQLite file through another data directory.
        let db = store.data_dir().join("corbel.db");
        config.database_url = Some(Secret::new(format!("sqlite://{}", db.display())));
    }

    let refused = App::build(&config).await.err().expect("refused");
    let message = format!("{refused:#}");
    assert!(
        message.contains(&format!("pid{}{holder}", pid_separator(&store))),
        "{message}"
    );
    assert!(message.contains("use another database"), "{message}");
    if store.is_postgres() {
        assert!(message.contains("advisory lock"), "{message}");
        lose_and_retake_the_postgres_lock(&store, &first).await;
        let refused = App::build(&config).await.err().expect("still refused");
        let message = format!("{refused:#}");
        assert!(message.contains(&format!("pid={holder}")), "{message}");
    }
    wait_ready(first.addr).await;
    let mut first = first;
    let status = tokio::task::spawn_blocking(move || terminate(&mut first.child))
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    // Once it is gone, the other data directory may have the database.
    let app = App::build(&config).await.expect("the database is free");
    drop(app);
}

/// How a holder's pid is written: `pid=N` in a PostgreSQL application name,
/// `pid N` in a lock file.
fn pid_separator(store: &TestStore) -> &'static str {
    if store.is_postgres() { "=" } else { " " }
}

/// Ends the server's lock session behind its back: the server says so at
/// error level, and takes the lock again on a new session.
async fn lose_and_retake_the_postgres_lock(store: &TestStore, served: &Served) {
    use sea_orm::{ConnectionTrait, Database, Statement};
    let db = Database::connect(store.database_url.as_deref().unwrap())
        .await
        .unwrap();
    let ended = db
        .query_one_raw(Statement::from_string(
            db.get_database_backend(),
            format!(
                "SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity \
                 WHERE datname = current_database() \
                   AND application_name LIKE 'corbel serve pid={} %'",
                served.child.id()
            ),
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        ended.try_get::<i64>("", "n").unwrap(),
        1,
        "one lock session"
    );
    db.close().await.ok();
    let logged = |level: &str, words: &str| {
        served.log.lock().unwrap().iter().any(|line| {
            let line: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
            line["level"] == level && line["message"].as_str().is_some_and(|m| m.contains(words))
        })
    };
    eventually(Duration::from_secs(30), "the loss logged", || async {
        logged(
            "ERROR",
            "lost the PostgreSQL session holding the server lock",
        )
        .then_some(())
    })
    .await;
    eventually(Duration::from_secs(30), "the lock taken again", || async {
        logged("INFO", "took the server lock again").then_some(())
    })
    .await;
}

/// A data directory of 200 bytes serves: the sockets are in a short
/// directory of their own (`socket_root_for`). A socket directory too long
/// (a long `XDG_RUNTIME_DIR`) is refused before anything is made.
#[tokio::test]
async fn a_long_data_dir_serves_and_a_socket_root_too_long_is_refused_before_anything_is_made() {
    let store = TestStore::fresh().await;
    let base = std::path::absolute(store.data_dir()).unwrap();
    let long = base.join("d".repeat(200 - base.as_os_str().len() - 1));
    assert_eq!(long.as_os_str().len(), 200);
    let mut served = serve(
        &store,
        &[ADMIN, ("CORBEL_DATA_DIR", long.to_str().unwrap())],
    );
    wait_ready(served.addr).await;
    let root = corbel::provider::socket_root_for(&long);
    assert!(root.join("registry.sock").exists(), "{}", root.display());
    assert!(root.as_os_str().len() <= 44, "{}", root.display());
    tokio::task::spawn_blocking(move || terminate(&mut served.child))
        .await
        .unwrap();

    // Another database, which the server above has not migrated.
    let store = TestStore::fresh().await;
    let dir = base.join("never-made");
    let runtime = base.join("r".repeat(80));
    std::fs::create_dir_all(&runtime).unwrap();
    let mut command = serve_command(&store, &[("CORBEL_DATA_DIR", dir.to_str().unwrap())]);
    command.env("XDG_RUNTIME_DIR", &runtime);
    let (ok, stderr) = run_to_end(command).await;
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("allow 107"), "{stderr}");
    assert!(
        stderr.contains("set XDG_RUNTIME_DIR to a shorter directory"),
        "{stderr}"
    );
    assert!(!dir.exists(), "nothing was made");
    if store.is_postgres() {
        use sea_orm::{ConnectionTrait, Database, Statement};
        let db = Database::connect(store.database_url.as_deref().unwrap())
            .await
            .unwrap();
        let tables = db
            .query_one_raw(Statement::from_string(
                db.get_database_backend(),
                "SELECT count(*) AS n FROM pg_tables WHERE schemaname = 'public'",
            ))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            tables.try_get::<i64>("", "n").unwrap(),
            0,
            "nothing migrated"
        );
        db.close().await.ok();
    }
}
