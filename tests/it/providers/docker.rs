//! The docker runtime on the real engine: the process provider built into an
//! image `FROM scratch` from its git repository and run as a container; killed
//! and restarted; unloaded without a trace; rebuilt from the engine's cache;
//! and the orphan a SIGKILLed server leaves removed at its next start.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::binary::{Served, serve, terminate};
use crate::support::docker::{
    Cleanup, containers, docker, docker_provider_repo, images, instance_label, provider_label,
};
use crate::support::provider_repos::{ProviderRepo, workspace_bin};
use crate::support::providers::{create_provider, logs, nodes, provider, spawn_quick, wait_status};
use crate::support::settings::{QUICK_ENV, quick};
use crate::support::{ADMIN_TOKEN, TestApp, TestStore, data, eventually};

/// Waits until exactly one container carries `label`; its id.
async fn the_one_container(label: &str) -> String {
    eventually(Duration::from_secs(60), "one container", || async {
        let found = containers(label);
        (found.len() == 1).then(|| found[0].clone())
    })
    .await
}

async fn unload(app: &TestApp, id: &str) {
    let unloaded = app
        .gql(
            "mutation($id: ID!) { unloadProvider(id: $id) { status } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(
        data(&unloaded)["unloadProvider"]["status"],
        "UNLOADED",
        "{unloaded}"
    );
}

async fn load(app: &TestApp, id: &str) {
    let loaded = app
        .gql(
            "mutation($id: ID!) { loadProvider(id: $id) { status } }",
            json!({ "id": id }),
        )
        .await;
    assert!(loaded["errors"].is_null(), "{loaded}");
}

#[tokio::test]
async fn a_docker_provider_connects_is_restarted_when_killed_and_leaves_nothing() {
    let mut cleanup = Cleanup::new();
    // A data directory of 100 bytes: the sockets are in a short directory of
    // the server's own, whatever the data directory's length.
    let store = TestStore::fresh_of_length(100).await;
    let app = TestApp::spawn_with(Arc::new(store), quick).await;
    let repo = docker_provider_repo();
    let (id, _) = create_provider(
        &app,
        json!({ "name": "boxed", "gitUrl": repo.url(), "ref": "v1", "config": {"capacity": 3} }),
    )
    .await;
    let own = &id.replace('-', "")[20..];
    cleanup.label(provider_label(&id));

    let connected = wait_status(&app, &id, "CONNECTED").await;
    assert_eq!(connected.metadata.as_ref().unwrap().runtime, "docker");
    assert_eq!(connected.resolved_commit, Some(repo.head()));
    // The configuration reached the provider in its container.
    let answer = nodes(&app, &id).await;
    assert_eq!(
        data(&answer)["provider"]["nodes"][0]["capacity"]["process.v1.service"],
        3,
        "{answer}"
    );
    let log = logs(&app, &id).await;
    assert!(log.contains("[build] Step 1/7 : FROM scratch"), "{log}");
    assert!(
        log.contains("[corbel] built image corbel-provider-"),
        "{log}"
    );
    assert!(log.contains("[corbel] started container corbel-"), "{log}");
    assert!(
        !log.contains("not bound"),
        "the registration is bound: {log}"
    );
    assert!(
        log.contains(&format!("/sockets/{own}/{id}.sock")),
        "its own socket directory: {log}"
    );

    // One container, labelled, limited, with the registration's mounts.
    let first = the_one_container(&provider_label(&id)).await;
    let inspected: Value = serde_json::from_str(&docker(&["inspect", &first])).unwrap();
    let container = &inspected[0];
    assert_eq!(container["HostConfig"]["Memory"], 256 * 1024 * 1024);
    assert_eq!(container["HostConfig"]["NanoCpus"], 1_000_000_000i64);
    assert_eq!(container["HostConfig"]["RestartPolicy"]["Name"], "");
    let labels = &container["Config"]["Labels"];
    assert_eq!(labels["io.corbel.provider"], id.as_str());
    assert!(
        labels["io.corbel.instance"]
            .as_str()
            .is_some_and(|i| i.len() == 64)
    );
    assert_eq!(
        labels["io.corbel.test.provider"], "corbel-provider-process",
        "the build arg"
    );
    // Mounted: the registry socket, a socket directory of its own (never the
    // other providers' sockets), its state directory.
    let data_dir = app.store.data_dir();
    let sockets = corbel::provider::socket_root_for(&std::path::absolute(data_dir).unwrap());
    let mut sources: Vec<String> = container["Mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["Source"].as_str().unwrap().to_owned())
        .collect();
    sources.sort();
    let mut expected = [
        sockets.join("registry.sock"),
        sockets.join("sockets").join(own),
        data_dir.join("providers").join(&id).join("state"),
    ]
    .map(|p| p.display().to_string());
    expected.sort();
    assert_eq!(sources, expected);

    // The launch's token is bound to the container: the same variables in a
    // process outside it are refused (the binding is checked before the
    // token is found spent).
    let env: Vec<String> = serde_json::from_value(container["Config"]["Env"].clone()).unwrap();
    let var = |name: &str| {
        env.iter()
            .find_map(|e| e.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} in {env:?}"))
            .to_owned()
    };
    let elsewhere = tempfile::tempdir().unwrap();
    let outside = tokio::process::Command::new(workspace_bin("corbel-provider-process"))
        .env_clear()
        .env("CORBEL_REGISTRY", var("CORBEL_REGISTRY"))
        .env("CORBEL_PROVIDER_ID", var("CORBEL_PROVIDER_ID"))
        .env("CORBEL_PROVIDER_TOKEN", var("CORBEL_PROVIDER_TOKEN"))
        .env("CORBEL_SOCKET_DIR", elsewhere.path().join("sockets"))
        .env("CORBEL_STATE_DIR", elsewhere.path().join("state"))
        .kill_on_drop(true)
        .output();
    let outside = tokio::time::timeout(Duration::from_secs(30), outside)
        .await
        .expect("the outside provider gives up")
        .unwrap();
    assert!(!outside.status.success());
    let log = logs(&app, &id).await;
    assert!(
        log.contains("registration refused: this launch's token came from another process"),
        "{log}"
    );
    assert!(
        log.contains("is not in the launched provider's container"),
        "{log}"
    );
    assert_eq!(provider(&app, &id).await.status, "CONNECTED");

    // Killed: the supervisor restarts it, in a new container, and the old one
    // is gone.
    docker(&["kill", &first]);
    let restarted = eventually(Duration::from_secs(60), "a restart", || async {
        let p = provider(&app, &id).await;
        (p.status == "CONNECTED" && p.restarts >= 1).then_some(p)
    })
    .await;
    assert_eq!(restarted.restarts, 1);
    let second = the_one_container(&provider_label(&id)).await;
    assert_ne!(first, second);
    let log = logs(&app, &id).await;
    // Its exit is noted (the health check may have noticed first).
    let noted = format!("[corbel] container {} exited with status 137", &first[..12]);
    assert!(log.contains(&noted), "{log}");
    assert!(log.contains("restarting in"), "{log}");

    // Unloaded: no container left, the image kept for the next load.
    unload(&app, &id).await;
    assert_eq!(containers(&provider_label(&id)), Vec::<String>::new());
    let image = format!("corbel-provider-{id}:{}", repo.head());
    assert_eq!(docker(&["images", "-q", &image]).lines().count(), 1);
    app.stop().await;
}

#[tokio::test]
async fn a_rebuild_is_a_cache_hit_and_a_provider_keeps_one_image() {
    let mut cleanup = Cleanup::new();
    let app = spawn_quick().await;
    let repo = docker_provider_repo();
    let (id, _) = create_provider(&app, json!({ "name": "cached", "gitUrl": repo.url() })).await;
    cleanup.label(provider_label(&id));
    wait_status(&app, &id, "CONNECTED").await;
    unload(&app, &id).await;

    load(&app, &id).await;
    wait_status(&app, &id, "CONNECTED").await;
    let log = logs(&app, &id).await;
    let hit = format!(
        "[corbel] image corbel-provider-{id}:{} is already built from commit {}: cache hit, not rebuilt",
        repo.head(),
        &repo.head()[..12]
    );
    assert!(log.contains(&hit), "{log}");
    // Built once: the engine saw one build of it.
    assert_eq!(log.matches("[build] Step 1/7").count(), 1, "{log}");
    unload(&app, &id).await;
    assert_eq!(containers(&provider_label(&id)), Vec::<String>::new());

    // A new commit is a new image, and the provider keeps only that one.
    let second = repo.commit_files(&[("README", "a change the image does not copy\n")]);
    load(&app, &id).await;
    wait_status(&app, &id, "CONNECTED").await;
    let log = logs(&app, &id).await;
    assert!(
        log.contains(&format!("built image corbel-provider-{id}:{second}")),
        "{log}"
    );
    assert!(
        log.contains("removed the images of 1 earlier commit(s)"),
        "{log}"
    );
    // The same files make the same image: now under the new commit's tag only.
    assert_eq!(images(&provider_label(&id)).len(), 1);
    let tags = docker(&[
        "images",
        "--format",
        "{{.Tag}}",
        &format!("corbel-provider-{id}"),
    ]);
    assert_eq!(tags, second);
    unload(&app, &id).await;

    // Deleted: its image goes with it.
    let deleted = app
        .gql(
            "mutation($id: ID!) { deleteProvider(id: $id) }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(data(&deleted)["deleteProvider"], true, "{deleted}");
    assert_eq!(images(&provider_label(&id)), Vec::<String>::new());
    app.stop().await;
}

#[tokio::test]
async fn a_build_the_engine_refuses_fails_with_its_message() {
    let mut cleanup = Cleanup::new();
    let app = spawn_quick().await;
    let repo = ProviderRepo::new(
        "name: broken\nversion: 0.1.0\nruntime: docker\n",
        &[("Dockerfile", "FROM scratch\nCOPY missing-file /\n")],
    );
    let (id, _) = create_provider(&app, json!({ "name": "broken", "gitUrl": repo.url() })).await;
    cleanup.label(provider_label(&id));
    let failed = wait_status(&app, &id, "FAILED").await;
    let message = failed.status_message.unwrap();
    assert!(
        message.starts_with("building image corbel-provider-"),
        "{message}"
    );
    assert!(message.contains("missing-file"), "{message}");
    assert!(
        message.contains("Step 2/5 : COPY missing-file /"),
        "the log tail: {message}"
    );
    assert_eq!(containers(&provider_label(&id)), Vec::<String>::new());
    app.stop().await;
}

/// GraphQL against the real binary, as the admin.
async fn gql(served: &Served, query: &str, variables: Value) -> Value {
    reqwest::Client::new()
        .post(format!("http://{}/graphql", served.addr))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "query": query, "variables": variables }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn wait_connected(served: &Served, id: &str) {
    eventually(
        Duration::from_secs(90),
        "the provider to connect",
        || async {
            let body = gql(
                served,
                "query($id: ID!) { provider(id: $id) { status statusMessage } }",
                json!({ "id": id }),
            )
            .await;
            let status = &body["data"]["provider"]["status"];
            assert_ne!(status, "FAILED", "{body}");
            (status == "CONNECTED").then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_crashed_server_leaves_no_orphan_container_after_its_restart() {
    let mut cleanup = Cleanup::new();
    let store = TestStore::fresh().await;
    let repo = docker_provider_repo();
    let mut served = serve(&store, &QUICK_ENV);
    let info = gql(&served, "{ serverInfo { instanceId } }", json!({})).await;
    let instance = instance_label(info["data"]["serverInfo"]["instanceId"].as_str().unwrap());
    cleanup.label(instance.clone());
    let created = gql(
        &served,
        "mutation($input: CreateProviderInput!) { createProvider(input: $input) { provider { id } } }",
        json!({ "input": { "name": "boxed", "gitUrl": repo.url(), "ref": "v1" } }),
    )
    .await;
    let id = created["data"]["createProvider"]["provider"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    cleanup.label(provider_label(&id));
    wait_connected(&served, &id).await;
    let orphan = the_one_container(&instance).await;

    // SIGKILL: nothing of the server runs its cleanup; the container stays
    // (its provider exits when the registry goes, the container is left).
    served.child.kill().unwrap();
    served.child.wait().unwrap();
    assert_eq!(
        containers(&instance),
        std::slice::from_ref(&orphan),
        "the orphan is there"
    );

    // The next start removes it before the provider loads again in a new one.
    let mut again = serve(&store, &QUICK_ENV);
    wait_connected(&again, &id).await;
    let now = the_one_container(&instance).await;
    assert_ne!(now, orphan);
    assert_eq!(containers(&instance), [now], "exactly the live provider's");
    let log = again.log.lock().unwrap().join("\n");
    assert!(
        log.contains("removed containers left by an earlier run"),
        "{log}"
    );

    // A clean stop unloads it: nothing left with this instance's label.
    assert!(terminate(&mut again.child).success());
    assert_eq!(containers(&instance), Vec::<String>::new());
}
