//! A deployed workload cannot take over its provider: it inherits none of the
//! provider's `CORBEL_*` variables (a clean, explicit environment), a
//! registration with the provider's launch token from any process but the one
//! Corbel launched is refused (the registry socket's peer credentials), and a
//! launch token serves one registration only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::support::deployments::{create_blueprint, deploy, destroy_and_wait, pids, settled};
use crate::support::provider_repos::{ProviderRepo, shell_metadata, workspace_bin};
use crate::support::providers::{create_provider, logs, nodes, provider, spawn_quick, wait_status};
use crate::support::{TestApp, data, eventually};

/// Reads `path` once it exists (the writers rename it into place complete).
async fn file(path: &Path) -> String {
    eventually(
        Duration::from_secs(30),
        &format!("{} to be written", path.display()),
        || async { std::fs::read_to_string(path).ok() },
    )
    .await
}

fn provider_src(app: &TestApp, id: &str) -> PathBuf {
    app.store.data_dir().join("providers").join(id).join("src")
}

/// The process provider, its run command exporting two variables (one passed
/// on through `pass_env`, one not) and keeping its launch token in
/// `launch-token`, as any process of its user could read it from
/// `/proc/<pid>/environ`.
async fn process_provider(app: &TestApp, secret: &str) -> (String, ProviderRepo) {
    let run = format!(
        "echo $$ > provider.pid; printf %s \"$CORBEL_PROVIDER_TOKEN\" > launch-token; PASSED_ON=yes KEPT_BACK=no exec {}",
        workspace_bin("corbel-provider-process").display()
    );
    let repo = ProviderRepo::new(
        &shell_metadata("process", "true", "sh run.sh"),
        &[("run.sh", &run)],
    );
    let (id, _) = create_provider(
        app,
        json!({
            "name": "process",
            "gitUrl": repo.url(),
            "config": { "pass_env": ["PASSED_ON"], "grace_ms": 500 },
            "secretConfig": { "password": secret },
        }),
    )
    .await;
    wait_status(app, &id, "CONNECTED").await;
    (id, repo)
}

/// One `process.v1.service` running `sh -c script` with `env`.
fn blueprint(script: &str, env: serde_json::Value) -> String {
    // Unconfined: these services write their findings where the test reads
    // them (what a confined one may touch is `containment.rs`'s).
    let config = json!({ "command": "/bin/sh", "args": ["-c", script], "env": env, "port": true, "sandbox": "none" });
    format!(
        "version: \"1\"\nresources:\n  svc:\n    type: process.v1.service\n    config: {config}\n"
    )
}

#[tokio::test]
async fn a_service_sees_only_the_base_environment_and_its_own() {
    let app = spawn_quick().await;
    let (_, _repo) = process_provider(&app, "hunter2-secret").await;
    let out = tempfile::tempdir().unwrap();
    let dump = out.path().join("env.txt");
    let script = format!(
        "env > {0}.partial && mv {0}.partial {0}; exec sleep 300",
        dump.display()
    );
    let bp = create_blueprint(&app, "env", &blueprint(&script, json!({ "OWN": "mine" }))).await;
    let id = deploy(&app, &bp, "env-1", json!({})).await;
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");

    let env: BTreeMap<String, String> = file(&dump)
        .await
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let corbel: Vec<_> = env
        .keys()
        .filter(|k| k.starts_with("CORBEL_") && *k != "CORBEL_RESOURCE_ID")
        .collect();
    assert!(corbel.is_empty(), "inherited {corbel:?}: {env:?}");
    assert_eq!(env["OWN"], "mine");
    assert_eq!(env["PASSED_ON"], "yes", "pass_env: {env:?}");
    assert!(env["PORT"].parse::<u16>().is_ok(), "{env:?}");
    assert!(env.contains_key("CORBEL_RESOURCE_ID"), "{env:?}");
    assert!(env.contains_key("PATH"), "{env:?}");
    // The documented base, what the service asked for, and `PWD`, which the
    // shell itself sets.
    let allowed = [
        "PATH",
        "HOME",
        "USER",
        "LANG",
        "LC_ALL",
        "TZ",
        "TMPDIR",
        "PASSED_ON",
        "OWN",
        "PORT",
        "CORBEL_RESOURCE_ID",
        "PWD",
    ];
    let extra: Vec<_> = env
        .keys()
        .filter(|k| !allowed.contains(&k.as_str()))
        .collect();
    assert!(extra.is_empty(), "not in the documented base: {extra:?}");
    destroy_and_wait(&app, &id, &pids(&done)).await;
    app.stop().await;
}

/// A service given the provider's launch token, registry and id outright (as
/// it could read them from the provider's `/proc/<pid>/environ`) registers as
/// the provider with the real SDK: the registry sees that the caller is not in
/// the launched process group and refuses, before any configuration is sent.
#[tokio::test]
async fn a_service_holding_the_launch_token_cannot_register_as_its_provider() {
    let app = spawn_quick().await;
    let secret = "hunter2-secret";
    let (id, _repo) = process_provider(&app, secret).await;
    let token = file(&provider_src(&app, &id).join("launch-token")).await;
    assert!(token.starts_with("cbp_"), "the launch token was recorded");

    let out = tempfile::tempdir().unwrap();
    let data_dir = app.store.data_dir();
    let script = format!(
        "{} > {1}/out 2>&1; echo $? > {1}/code.partial; mv {1}/code.partial {1}/code; exec sleep 300",
        workspace_bin("corbel-provider-fixture").display(),
        out.path().display()
    );
    let sockets = corbel::provider::socket_root_for(&std::path::absolute(data_dir).unwrap());
    let env = json!({
        "CORBEL_REGISTRY": format!("unix://{}", sockets.join("registry.sock").display()),
        "CORBEL_PROVIDER_ID": id,
        "CORBEL_PROVIDER_TOKEN": token,
        // Its own socket, so that the real provider's stays in place.
        "CORBEL_SOCKET_DIR": sockets.join("sockets").join("intruder").display().to_string(),
        "FIXTURE_CONFIG_DUMP": out.path().join("config.jsonl").display().to_string(),
    });
    let bp = create_blueprint(&app, "intruder", &blueprint(&script, env)).await;
    let deployment = deploy(&app, &bp, "intruder-1", json!({})).await;
    let done = settled(&app, &deployment, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");

    let code = file(&out.path().join("code")).await;
    let said = std::fs::read_to_string(out.path().join("out")).unwrap();
    assert_eq!(code.trim(), "1", "the intruder was refused: {said}");
    assert!(said.contains("PermissionDenied"), "{said}");
    assert!(said.contains("is not the launched provider"), "{said}");
    assert!(
        !out.path().join("config.jsonl").exists(),
        "no configuration reached the intruder"
    );

    let log = logs(&app, &id).await;
    assert!(
        log.contains("this launch's token came from another process"),
        "{log}"
    );
    assert!(!log.contains("registered again"), "{log}");
    assert!(!log.contains(secret) && !log.contains(&token), "{log}");
    // The real provider is still the one connected, and answers.
    assert_eq!(provider(&app, &id).await.status, "CONNECTED");
    let answer = nodes(&app, &id).await;
    assert!(
        data(&answer)["provider"]["nodes"][0]["name"].is_string(),
        "{answer}"
    );
    destroy_and_wait(&app, &deployment, &pids(&done)).await;
    app.stop().await;
}

/// Two instances of a provider in the launched process group: the first
/// registers with the launch token; the second, started with the same token
/// once the first is connected, is refused, and the refusal is in the log.
#[tokio::test]
async fn a_second_registration_with_a_spent_launch_token_is_refused_and_logged() {
    let app = spawn_quick().await;
    let fixture = workspace_bin("corbel-provider-fixture")
        .display()
        .to_string();
    let run = format!(
        "echo $$ > provider.pid\n\
         {fixture} &\n\
         while [ ! -e second ]; do sleep 0.05; done\n\
         CORBEL_SOCKET_DIR=\"$CORBEL_SOCKET_DIR/second\" FIXTURE_CONFIG_DUMP=\"$PWD/second-config\" {fixture}\n\
         echo \"second exited $?\"\n\
         wait\n"
    );
    let metadata = shell_metadata("twice", "true", "sh run.sh")
        .replace("process.v1.service", "fixture.v1.noop");
    let repo = ProviderRepo::new(&metadata, &[("run.sh", &run)]);
    let (id, _) = create_provider(
        &app,
        json!({ "name": "twice", "gitUrl": repo.url(), "secretConfig": { "password": "hunter2-secret" } }),
    )
    .await;
    wait_status(&app, &id, "CONNECTED").await;
    let src = provider_src(&app, &id);
    std::fs::write(src.join("second"), "").unwrap();

    let log = eventually(
        Duration::from_secs(30),
        "the second instance to be refused",
        || async {
            let log = logs(&app, &id).await;
            log.contains("second exited").then_some(log)
        },
    )
    .await;
    assert!(log.contains("second exited 1"), "{log}");
    assert!(
        log.contains("a second registration with this launch's token was refused"),
        "{log}"
    );
    assert!(!log.contains("registered again"), "{log}");
    assert!(!log.contains("hunter2-secret"), "{log}");
    assert!(
        !src.join("second-config").exists(),
        "no configuration reached the second instance"
    );
    let shown = provider(&app, &id).await;
    assert_eq!(shown.status, "CONNECTED", "{shown:?}");
    assert_eq!(shown.restarts, 0, "{shown:?}");
    let answer = nodes(&app, &id).await;
    assert_eq!(
        data(&answer)["provider"]["nodes"][0]["name"],
        "n1",
        "{answer}"
    );
    app.stop().await;
}
