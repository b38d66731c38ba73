//! `TestApp`: one real server with its own fresh database, the GraphQL client
//! helpers, and (in the submodules) every helper the tests share, by concern.
//! Tests import helpers from here only, never from each other.

pub mod attacks;
pub mod binary;
pub mod browser;
pub mod deployments;
pub mod docker;
pub mod git;
/// At `tests/it/nginx.rs`, where `benches/sync.rs` includes it too.
#[path = "../nginx.rs"]
pub mod nginx;
pub mod processes;
pub mod provider_repos;
pub mod providers;
pub mod repositories;
pub mod settings;
pub mod types;
pub mod websocket;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corbel::app::App;
use corbel::config::Config;
use corbel::secret::Secret;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Environment variable naming a PostgreSQL server URL (any database on it); when
/// set, every test gets a fresh database there instead of SQLite.
pub const POSTGRES_ENV: &str = "CORBEL_TEST_POSTGRES_URL";

/// The admin token every test server is bootstrapped with.
pub const ADMIN_TOKEN: &str = "cbl_test_admin_token_0123456789abcdef";

/// Where a test's data lives; kept across restarts of its servers.
pub struct TestStore {
    pub dir: TempDir,
    /// `None` for the default (SQLite in `dir`).
    pub database_url: Option<String>,
}

impl TestStore {
    pub async fn fresh() -> TestStore {
        let dir = tempfile::tempdir().expect("temp dir");
        let database_url = match std::env::var(POSTGRES_ENV) {
            Ok(server) if !server.is_empty() => Some(fresh_postgres_database(&server).await),
            _ => None,
        };
        TestStore { dir, database_url }
    }

    /// A fresh store whose data directory's path is `len` bytes long.
    pub async fn fresh_of_length(len: usize) -> TestStore {
        let mut store = Self::fresh().await;
        let tmp = std::env::temp_dir();
        let prefix = "d".repeat(len - tmp.as_os_str().len() - 1 - 6);
        store.dir = tempfile::Builder::new()
            .prefix(&prefix)
            .rand_bytes(6)
            .tempdir()
            .expect("temp dir");
        assert_eq!(store.dir.path().as_os_str().len(), len);
        store
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn config(&self) -> Config {
        let mut config = Config::for_data_dir(self.dir.path());
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.database_url = self.database_url.clone().map(Secret::new);
        config.admin_token = Some(Secret::new(ADMIN_TOKEN));
        config.shutdown_grace = Duration::from_secs(5);
        // A debug build hashes a password in seconds on a loaded machine; the
        // deadlines themselves are tested with their own values (`limits.rs`).
        config.graphql.request_timeout = Duration::from_secs(120);
        config.graphql.anonymous_request_timeout = Duration::from_secs(120);
        config.provider.sandbox_read = sandbox_read();
        config.provider.sandbox_write = sandbox_write();
        config
    }

    pub fn is_postgres(&self) -> bool {
        self.database_url.is_some()
    }
}

/// What the suite's providers may read beyond the system's directories: the
/// workspace's built binaries their run commands start (beside the `corbel`
/// binary, which a server run as that binary grants by itself, but not one
/// run in this test binary), and a Python installed under the home directory
/// (pyenv), for the Python provider.
pub fn sandbox_read() -> Vec<PathBuf> {
    let mut read = vec![corbel_bin().parent().unwrap().to_owned()];
    read.extend(
        std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".pyenv"))
            .filter(|pyenv| pyenv.is_dir()),
    );
    read
}

/// What the suite's providers may write beyond their own directories: the
/// temporary directory, where each test keeps its data directory, its
/// call logs and what its run commands note (`provider.pid` in the
/// checkout). So the suite's providers are confined, yet reach their test's
/// files; what the default confinement keeps out is `containment.rs`'s, whose
/// servers run without this.
pub fn sandbox_write() -> Vec<PathBuf> {
    vec![std::env::temp_dir()]
}

/// Paths as a comma-separated list (a `CORBEL_PROVIDER_SANDBOX_*` value).
pub fn joined(paths: &[PathBuf]) -> String {
    let paths: Vec<_> = paths.iter().map(|p| p.display().to_string()).collect();
    paths.join(",")
}

/// Creates `corbel_t_<random>` on the server and returns its URL.
async fn fresh_postgres_database(server: &str) -> String {
    use sea_orm::{ConnectionTrait, Database};
    let name = format!("corbel_t_{}", uuid::Uuid::new_v4().simple());
    let admin = Database::connect(server)
        .await
        .unwrap_or_else(|e| panic!("{POSTGRES_ENV} is set but unreachable: {e}"));
    admin
        .execute_unprepared(&format!("CREATE DATABASE \"{name}\""))
        .await
        .expect("create test database");
    admin.close().await.ok();
    let mut url = url::Url::parse(server).expect("postgres URL");
    url.set_path(&format!("/{name}"));
    url.to_string()
}

pub struct TestApp {
    pub addr: std::net::SocketAddr,
    pub store: Arc<TestStore>,
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    serving: Option<JoinHandle<anyhow::Result<()>>>,
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        Self::spawn_on(Arc::new(TestStore::fresh().await)).await
    }

    /// Starts a server on an existing store (restarts, replicas).
    pub async fn spawn_on(store: Arc<TestStore>) -> TestApp {
        Self::spawn_with(store, |_| {}).await
    }

    /// Starts a server configured by `adjust`. The server's log (and its
    /// providers' output) goes to the test's output, shown when it fails, at
    /// the levels `CORBEL_TEST_LOG` names (errors when unset), e.g.
    /// `CORBEL_TEST_LOG=corbel::deploy::health=debug`.
    pub async fn spawn_with(store: Arc<TestStore>, adjust: impl FnOnce(&mut Config)) -> TestApp {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("CORBEL_TEST_LOG"))
            .with_test_writer()
            .try_init();
        let mut config = store.config();
        adjust(&mut config);
        let app = App::build(&config).await.expect("server builds");
        let addr = app.local_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = tokio::spawn(app.run_until_stopped(async {
            let _ = stopped.await;
        }));
        TestApp {
            addr,
            store,
            client: reqwest::Client::new(),
            stop: Some(stop),
            serving: Some(serving),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The server's `/metrics` text (Prometheus format).
    pub async fn metrics(&self) -> String {
        let response = self.client.get(self.url("/metrics")).send().await;
        let response = response.expect("/metrics answers");
        assert_eq!(response.status(), 200, "/metrics responds 200");
        response.text().await.expect("a text body")
    }

    /// Runs a GraphQL request as the admin.
    pub async fn gql(&self, query: &str, variables: Value) -> Value {
        self.gql_as(Some(ADMIN_TOKEN), query, variables).await
    }

    /// Runs a GraphQL request with `token` (or none) and returns the JSON body.
    pub async fn gql_as(&self, token: Option<&str>, query: &str, variables: Value) -> Value {
        let mut request = self
            .client
            .post(self.url("/graphql"))
            .json(&json!({ "query": query, "variables": variables }));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("request is sent");
        assert_eq!(response.status(), 200, "GraphQL responds 200");
        response.json().await.expect("a JSON body")
    }

    /// Runs a GraphQL request as the admin, expects no errors, and reads the
    /// value at `path` in its `data` (dot-separated names, or indexes into
    /// lists: `"deployments.edges.0.node"`) as a `T`.
    #[track_caller]
    pub fn query_as<'a, T: serde::de::DeserializeOwned>(
        &'a self,
        query: &'a str,
        variables: Value,
        path: &'a str,
    ) -> impl std::future::Future<Output = T> + 'a {
        let caller = std::panic::Location::caller();
        async move {
            let body = self.gql(query, variables).await;
            at_path_as(&body, path)
                .unwrap_or_else(|e| panic!("{caller}: reading `{path}` of {body}: {e}"))
        }
    }

    /// Stops the server as a signal would and waits until it has returned:
    /// a server that has not within two minutes (every wait of its stop is
    /// bounded by a grace far shorter) fails the test saying so.
    pub async fn stop(mut self) -> Arc<TestStore> {
        const STOP_DEADLINE: Duration = Duration::from_secs(120);
        self.stop.take().expect("running").send(()).ok();
        let serving = self.serving.take().expect("running");
        tokio::time::timeout(STOP_DEADLINE, serving)
            .await
            .unwrap_or_else(|_| panic!("the server did not stop within {STOP_DEADLINE:?}"))
            .expect("server task")
            .expect("server stops cleanly");
        self.store
    }
}

/// The `extensions.code` of the first error, or `None` when there are none.
pub fn error_code(body: &Value) -> Option<&str> {
    body["errors"][0]["extensions"]["code"].as_str()
}

/// Panics with the body when it holds errors.
#[track_caller]
pub fn data(body: &Value) -> &Value {
    assert!(body.get("errors").is_none(), "unexpected errors: {body}");
    &body["data"]
}

/// The value at `path` in a body's `data` (see [`TestApp::query_as`]) as a
/// `T`; a body with errors is an `Err`.
pub fn at_path_as<T: serde::de::DeserializeOwned>(body: &Value, path: &str) -> Result<T, String> {
    if let Some(errors) = body.get("errors") {
        return Err(format!("unexpected errors: {errors}"));
    }
    let mut value = &body["data"];
    for step in path.split('.').filter(|s| !s.is_empty()) {
        value = match step.parse::<usize>() {
            Ok(index) => &value[index],
            Err(_) => &value[step],
        };
    }
    T::deserialize(value).map_err(|e| e.to_string())
}

/// Polls `check` until it yields a value or `limit` passes.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `look` until what it sees passes `check` or `limit` passes; the
/// panic at the deadline shows the last thing seen, which is what tells a
/// stall from a slow start.
pub async fn until_seen<T, F, Fut>(
    limit: Duration,
    what: &str,
    mut look: F,
    check: impl Fn(&T) -> bool,
) -> T
where
    T: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    let mut last = None;
    loop {
        if let Some(seen) = look().await {
            if check(&seen) {
                return seen;
            }
            last = Some(seen);
        }
        if Instant::now() >= deadline {
            match last {
                Some(seen) => panic!("timed out waiting for {what}; last seen: {seen:#}"),
                None => panic!("timed out waiting for {what}; nothing seen"),
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The built `corbel` binary.
pub fn corbel_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_corbel"))
}

/// The deployments of the journal's entries (one per entry), read straight
/// from the database while a server may be running on it.
pub async fn journal_deployments(store: &TestStore) -> Result<Vec<uuid::Uuid>, String> {
    use sea_orm::{ConnectionTrait, Database, Statement};
    let url = match &store.database_url {
        Some(url) => url.clone(),
        None => format!(
            "sqlite://{}?mode=ro",
            store.data_dir().join("corbel.db").display()
        ),
    };
    let db = Database::connect(&url).await.map_err(|e| e.to_string())?;
    let rows = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT deployment_id FROM journal",
        ))
        .await;
    db.close().await.ok();
    rows.map_err(|e| e.to_string())?
        .iter()
        .map(|row| row.try_get("", "deployment_id").map_err(|e| e.to_string()))
        .collect()
}

/// How many entries the journal holds.
pub async fn journal_len(store: &TestStore) -> usize {
    journal_deployments(store)
        .await
        .expect("the journal is readable")
        .len()
}
