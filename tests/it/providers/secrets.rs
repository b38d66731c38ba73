//! `secretConfig` sealed at rest: the database row never holds the secret,
//! the provider still receives it, the key file is the server's own (0600),
//! a server with another key refuses to start, rows stored unsealed are
//! sealed at start, and `corbel secret-key rotate` works, interrupted too.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use corbel::app::App;
use corbel::seal::SecretKey;
use serde_json::json;

use crate::support::provider_repos::{ProviderRepo, process_metadata};
use crate::support::providers::{
    create_provider, nodes, provider, raw_secret_config, set_raw_secret_config, spawn_quick,
    wait_status,
};
use crate::support::settings::quick;
use crate::support::{TestApp, TestStore, corbel_bin, data};

fn key_file(store: &TestStore) -> std::path::PathBuf {
    store.data_dir().join("secret.key")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// `App::build` on `store` with `adjust`, expected to fail: its message.
async fn refused(store: &TestStore, adjust: impl FnOnce(&mut corbel::config::Config)) -> String {
    let mut config = store.config();
    adjust(&mut config);
    match App::build(&config).await {
        Ok(_) => panic!("the server started"),
        Err(e) => format!("{e:#}"),
    }
}

async fn load(app: &TestApp, id: &str) {
    let body = app
        .gql(
            "mutation($id: ID!) { loadProvider(id: $id) { status } }",
            json!({ "id": id }),
        )
        .await;
    assert!(body["errors"].is_null(), "{body}");
}

fn capacity(answer: &serde_json::Value) -> &serde_json::Value {
    &data(answer)["provider"]["nodes"][0]["capacity"]["process.v1.service"]
}

#[tokio::test]
async fn secret_config_is_sealed_at_rest_and_still_reaches_the_provider() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, _) = create_provider(
        &app,
        json!({
            "name": "sealed",
            "gitUrl": repo.url(),
            "config": {"capacity": 2},
            // A secret `capacity` overrides the plain one: the node's capacity
            // shows that the provider received the secret values.
            "secretConfig": {"capacity": 5, "apiKey": "s3cr3t-at-rest"},
        }),
    )
    .await;

    // The key file was made at first start, readable by its owner only.
    let path = key_file(&app.store);
    assert_eq!(mode(&path), 0o600);
    let key = SecretKey::load(&path).expect("the key file");

    let raw = raw_secret_config(&app.store, "sealed").await;
    assert!(
        !raw.contains("s3cr3t-at-rest") && !raw.contains("apiKey"),
        "{raw}"
    );
    assert!(
        raw.starts_with(&format!("sealed:v1:{}:", key.id())),
        "{raw}"
    );

    wait_status(&app, &id, "CONNECTED").await;
    assert_eq!(*capacity(&nodes(&app, &id).await), 5);

    // Configuring without secretConfig keeps the secret values, still sealed.
    let answer = app
        .gql(
            "mutation($id: ID!) { configureProvider(id: $id, config: {capacity: 2}) { secretConfigKeys } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(
        data(&answer)["configureProvider"]["secretConfigKeys"],
        json!(["apiKey", "capacity"])
    );
    assert!(!answer.to_string().contains("s3cr3t-at-rest"));
    assert_eq!(*capacity(&nodes(&app, &id).await), 5);
    let again = raw_secret_config(&app.store, "sealed").await;
    assert!(!again.contains("s3cr3t-at-rest"), "{again}");
    assert!(
        again.starts_with(&format!("sealed:v1:{}:", key.id())),
        "{again}"
    );
    assert_ne!(again, raw, "sealed again with a fresh nonce");

    // New secret values replace the old ones and reach the provider.
    let answer = app
        .gql(
            "mutation($id: ID!) { configureProvider(id: $id, config: {capacity: 2}, secretConfig: {capacity: 8}) { secretConfigKeys } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(
        data(&answer)["configureProvider"]["secretConfigKeys"],
        json!(["capacity"])
    );
    assert_eq!(*capacity(&nodes(&app, &id).await), 8);
    app.stop().await;
}

#[tokio::test]
async fn a_server_refuses_to_start_with_secrets_it_cannot_open() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let input = |name: &str, secret: &str| {
        json!({
            "name": name,
            "gitUrl": repo.url(),
            "autoLoad": false,
            "secretConfig": {"apiKey": secret},
        })
    };
    let (kept_id, _) = create_provider(&app, input("kept", "kept-secret-value")).await;
    create_provider(&app, input("other", "other-secret-value")).await;
    let store = app.stop().await;
    let ours = SecretKey::load(&key_file(&store)).unwrap();

    // Another key: refused, naming the provider and both key ids.
    let dir = tempfile::tempdir().unwrap();
    let theirs_path = dir.path().join("another.key");
    let theirs = SecretKey::generate();
    theirs.write_new(&theirs_path).unwrap();
    let message = refused(&store, |c| c.secret_key_file = Some(theirs_path.clone())).await;
    assert!(
        message.contains("`kept`")
            && message.contains(&kept_id)
            && message.contains("`other`")
            && message.contains(ours.id())
            && message.contains(theirs.id())
            && message.contains("--secret-key-file"),
        "{message}"
    );
    assert!(!message.contains("secret-value"), "{message}");

    // A key file named by flag must exist; it is not made.
    let missing = dir.path().join("missing.key");
    let message = refused(&store, |c| c.secret_key_file = Some(missing.clone())).await;
    assert!(message.contains("missing.key"), "{message}");
    assert!(!missing.exists());

    // A key file others may read: refused.
    let path = key_file(&store);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let message = refused(&store, |_| {}).await;
    assert!(
        message.contains("0644") && message.contains("chmod 600"),
        "{message}"
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();

    // A sealed value copied to another provider's row does not open there.
    let others = raw_secret_config(&store, "other").await;
    let kept = raw_secret_config(&store, "kept").await;
    set_raw_secret_config(&store, "other", &kept).await;
    let message = refused(&store, |_| {}).await;
    assert!(
        message.contains("`other`")
            && message.contains("does not open")
            && !message.contains("`kept`"),
        "{message}"
    );
    set_raw_secret_config(&store, "other", &others).await;

    // With its own key, nothing was lost.
    let app = TestApp::spawn_with(store, quick).await;
    assert_eq!(
        provider(&app, &kept_id).await.secret_config_keys,
        ["apiKey"]
    );
    app.stop().await;
}

#[tokio::test]
async fn rows_stored_unsealed_are_sealed_at_start() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, _) = create_provider(
        &app,
        json!({ "name": "old", "gitUrl": repo.url(), "autoLoad": false }),
    )
    .await;
    let store = app.stop().await;
    // As an earlier version stored it.
    set_raw_secret_config(&store, "old", r#"{"capacity":4,"token":"plain-old-value"}"#).await;

    let app = TestApp::spawn_with(store, quick).await;
    let sealed = raw_secret_config(&app.store, "old").await;
    assert!(sealed.starts_with("sealed:v1:"), "{sealed}");
    assert!(!sealed.contains("plain-old-value"), "{sealed}");
    assert_eq!(
        provider(&app, &id).await.secret_config_keys,
        ["capacity", "token"]
    );
    load(&app, &id).await;
    wait_status(&app, &id, "CONNECTED").await;
    assert_eq!(*capacity(&nodes(&app, &id).await), 4);
    let store = app.stop().await;

    // Idempotent: a second start changes nothing.
    let app = TestApp::spawn_with(store, quick).await;
    assert_eq!(raw_secret_config(&app.store, "old").await, sealed);
    app.stop().await;
}

/// `corbel secret-key rotate …` on `store`, as the real binary.
fn rotate(store: &TestStore, new_key: &Path) -> std::process::Output {
    let mut command = Command::new(corbel_bin());
    command
        .args(["secret-key", "rotate", "--new-key-file"])
        .arg(new_key)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CORBEL_DATA_DIR", store.data_dir());
    if let Some(url) = &store.database_url {
        command.env("CORBEL_DATABASE_URL", url);
    }
    command.output().expect("corbel runs")
}

#[tokio::test]
async fn the_secret_key_rotates_and_an_interrupted_rotation_finishes() {
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(&process_metadata(), &[]);
    let (id, _) = create_provider(
        &app,
        json!({
            "name": "rotated",
            "gitUrl": repo.url(),
            "autoLoad": false,
            "secretConfig": {"capacity": 6, "apiKey": "rotate-me"},
        }),
    )
    .await;
    // A repository's credentials rotate with the secretConfigs.
    let body = app
        .gql(
            "mutation { createRepository(input: { name: \"creds\", driver: { http: { url: \"http://u:hunter2@127.0.0.1:9/\" } } }) { id } }",
            json!({}),
        )
        .await;
    data(&body);
    let old = SecretKey::load(&key_file(&app.store)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let new_path = dir.path().join("new.key");

    // Not while a server runs: the server lock.
    let out = rotate(&app.store, &new_path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("in use by"),
        "{stderr}"
    );
    assert_eq!(
        SecretKey::load(&key_file(&app.store)).unwrap().id(),
        old.id()
    );
    let store = app.stop().await;

    // The new key file is made (0600), every row sealed under it, and the
    // new key installed in place of the old.
    let out = rotate(&store, &new_path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&new_path), 0o600);
    let new = SecretKey::load(&new_path).unwrap();
    assert!(
        stdout.contains(new.id()) && stdout.contains(old.id()),
        "{stdout}"
    );
    assert_eq!(SecretKey::load(&key_file(&store)).unwrap().id(), new.id());
    assert_eq!(mode(&key_file(&store)), 0o600);
    let raw = raw_secret_config(&store, "rotated").await;
    assert!(
        raw.starts_with(&format!("sealed:v1:{}:", new.id())),
        "{raw}"
    );
    assert!(!raw.contains("rotate-me"));
    let creds = crate::repositories::credentials::raw_spec(&store, "creds").await;
    assert!(
        creds.starts_with(&format!("sealed:v1:{}:", new.id())) && !creds.contains("hunter2"),
        "{creds}"
    );

    // A rotation interrupted after its commit, before the key was installed:
    // the rows are under the next key, the key file still holds the current.
    let next_path = dir.path().join("next.key");
    let next = SecretKey::generate();
    next.write_new(&next_path).unwrap();
    {
        let db = corbel::store::connect(&store.config().database().unwrap())
            .await
            .unwrap();
        corbel::provider::reseal(&db, &new, &next).await.unwrap();
        db.close().await.unwrap();
    }
    let message = refused(&store, |_| {}).await;
    assert!(
        message.contains(next.id())
            && message.contains(new.id())
            && message.contains("secret-key rotate"),
        "{message}"
    );
    // Running the rotation again finishes it.
    let out = rotate(&store, &next_path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 already under the new key"), "{stdout}");
    assert!(
        stdout.contains("1 repository credential(s) sealed again"),
        "{stdout}"
    );
    assert_eq!(SecretKey::load(&key_file(&store)).unwrap().id(), next.id());

    // The provider still gets its secret values.
    let app = TestApp::spawn_with(store, quick).await;
    load(&app, &id).await;
    wait_status(&app, &id, "CONNECTED").await;
    assert_eq!(*capacity(&nodes(&app, &id).await), 6);
    app.stop().await;
}

#[tokio::test]
async fn the_secret_key_id_is_printed_never_the_key() {
    let store = Arc::new(TestStore::fresh().await);
    let app = TestApp::spawn_on(store).await;
    let store = app.stop().await;
    let key = SecretKey::load(&key_file(&store)).unwrap();
    let out = Command::new(corbel_bin())
        .args(["secret-key", "id"])
        .env_clear()
        .env("CORBEL_DATA_DIR", store.data_dir())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), key.id());
    let text = std::fs::read_to_string(key_file(&store)).unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains(text.trim()));
}
