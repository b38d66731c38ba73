//! Repositories and elements against a real nginx, local directories and the
//! migration driver.

use std::time::Duration;

use serde_json::json;

use crate::support::nginx::{Nginx, free_port};
use crate::support::repositories::{
    create, create_id, element_ids, labels, mutate, put_element, settled, write_inventory,
};
use crate::support::types::SyncProgress;
use crate::support::websocket::{connect, init, next_json, send};
use crate::support::{ADMIN_TOKEN, TestApp, TestStore, data, error_code, eventually};

#[tokio::test]
async fn http_repository_lazy_sync_install_upgrade_uninstall() {
    let served = tempfile::tempdir().unwrap();
    let root = served.path();
    let core_1 = put_element(
        root,
        "core",
        "1.0.0",
        json!({}),
        &[("images", "img-1", "core.qcow2")],
    );
    let core_11 = put_element(root, "core", "1.1.0", json!({}), &[]);
    let core_12 = put_element(root, "core", "1.2.0-dev+abc", json!({}), &[]);
    let core_2 = put_element(root, "core", "2.0.0", json!({}), &[]);
    let web = put_element(
        root,
        "web",
        "1.0.0",
        json!({"core": {"from_version": "1.0.0", "to_version": "2.0.0"}}),
        &[],
    );
    write_inventory(root, &[core_1, core_11, core_12, core_2, web]);
    let nginx = Nginx::start(root);
    let app = TestApp::spawn().await;

    let repo = create(
        &app,
        json!({"name": "main", "driver": {"http": {"url": nginx.url()}}, "syncMode": "LAZY"}),
    )
    .await;
    let id = repo.id;
    let repo = settled(&app, &id, "ACTIVE").await;
    let seen_and_stored = SyncProgress { seen: 5, stored: 5 };
    assert_eq!(repo.progress, Some(seen_and_stored), "{repo:?}");
    let ids = element_ids(&app, &id).await;
    assert_eq!(ids.len(), 5, "{ids:?}");

    // LAZY: the manifest and artifacts arrive on first access.
    let core = &ids["core 1.0.0"];
    let body = app
        .gql(
            "query($id: ID!) { element(id: $id) { manifest artifacts { urn fileName url } } }",
            json!({"id": core}),
        )
        .await;
    let element = &data(&body)["element"];
    assert_eq!(element["manifest"]["name"], "core");
    let body = app
        .gql(
            "query($id: ID!) { element(id: $id) { artifacts { urn fileName url } } }",
            json!({"id": core}),
        )
        .await;
    let artifacts = data(&body)["element"]["artifacts"].clone();
    assert_eq!(artifacts[0]["urn"], "images:img-1", "{artifacts}");
    let url = app.url(artifacts[0]["url"].as_str().unwrap());
    let download = app
        .client
        .get(&url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(download.status(), 200);
    assert_eq!(download.text().await.unwrap(), "contents of core.qcow2");
    assert_eq!(app.client.get(&url).send().await.unwrap().status(), 401);

    // The plan prefers a release over a higher suffixed build: core 1.1.0.
    let web_id = &ids["web 1.0.0"];
    let body = app
        .gql("query($id: ID!) { resolveElement(id: $id) { elements { alreadyInstalled element { name version } } } }", json!({"id": web_id}))
        .await;
    let plan = labels(&data(&body)["resolveElement"]["elements"], "element");
    assert_eq!(plan, ["core 1.1.0", "web 1.0.0"]);

    let installed = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": web_id}),
    )
    .await;
    assert_eq!(data(&installed)["installElement"]["installed"], true);
    assert_eq!(data(&installed)["installElement"]["status"], "ACTIVE");
    let again = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": web_id}),
    )
    .await;
    assert_eq!(error_code(&again), Some("ALREADY_INSTALLED"));
    let other_core = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": ids["core 1.0.0"]}),
    )
    .await;
    assert_eq!(
        error_code(&other_core),
        Some("ALREADY_INSTALLED"),
        "{other_core}"
    );

    let body = app
        .gql(
            "query($id: ID!) { element(id: $id) { dependents { name } } }",
            json!({"id": ids["core 1.1.0"]}),
        )
        .await;
    assert_eq!(
        data(&body)["element"]["dependents"],
        json!([{"name": "web"}])
    );
    let refused = mutate(
        &app,
        "uninstallElement(id: $id)",
        "($id: ID!)",
        json!({"id": ids["core 1.1.0"]}),
    )
    .await;
    assert_eq!(error_code(&refused), Some("HAS_DEPENDENTS"), "{refused}");
    assert_eq!(
        refused["errors"][0]["extensions"]["dependents"],
        json!(["web 1.0.0"])
    );
    let deleting = app
        .gql(
            "mutation($id: ID!) { deleteRepository(id: $id) }",
            json!({"id": id}),
        )
        .await;
    assert_eq!(error_code(&deleting), Some("CONFLICT"));

    // An upgrade that breaks a dependent's constraint is refused; one that keeps
    // it moves the binding.
    let breaking = mutate(
        &app,
        "upgradeElement(id: $a, toId: $b)",
        "($a: ID!, $b: ID!)",
        json!({"a": ids["core 1.1.0"], "b": ids["core 2.0.0"]}),
    )
    .await;
    assert_eq!(
        error_code(&breaking),
        Some("DEPENDENCY_CONSTRAINT"),
        "{breaking}"
    );
    assert!(
        breaking["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("web 1.0.0"),
        "{breaking}"
    );
    let upgraded = mutate(
        &app,
        "upgradeElement(id: $a, toId: $b)",
        "($a: ID!, $b: ID!)",
        json!({"a": ids["core 1.1.0"], "b": ids["core 1.0.0"]}),
    )
    .await;
    assert_eq!(data(&upgraded)["upgradeElement"]["installed"], true);
    let body = app
        .gql(
            "{ elements(filter: {installed: true}) { edges { node { name version } } } }",
            json!({}),
        )
        .await;
    let mut installed = labels(&data(&body)["elements"]["edges"], "node");
    installed.sort();
    assert_eq!(installed, ["core 1.0.0", "web 1.0.0"]);
    let body = app
        .gql(
            "query($id: ID!) { element(id: $id) { dependents { name } } }",
            json!({"id": ids["core 1.0.0"]}),
        )
        .await;
    assert_eq!(
        data(&body)["element"]["dependents"],
        json!([{"name": "web"}])
    );

    for name in ["web 1.0.0", "core 1.0.0"] {
        let gone = mutate(
            &app,
            "uninstallElement(id: $id)",
            "($id: ID!)",
            json!({"id": ids[name]}),
        )
        .await;
        assert_eq!(
            data(&gone)["uninstallElement"]["installed"],
            false,
            "{gone}"
        );
    }
    let deleted = app
        .gql(
            "mutation($id: ID!) { deleteRepository(id: $id) }",
            json!({"id": id}),
        )
        .await;
    assert_eq!(data(&deleted)["deleteRepository"], true);
}

#[tokio::test]
async fn refresh_adds_updates_and_removes_but_keeps_installed() {
    let served = tempfile::tempdir().unwrap();
    let root = served.path();
    let a = put_element(root, "a", "1.0.0", json!({}), &[]);
    let b = put_element(root, "b", "1.0.0", json!({}), &[]);
    let c = put_element(root, "c", "1.0.0", json!({}), &[]);
    write_inventory(root, &[a.clone(), b, c]);
    let nginx = Nginx::start(root);
    let app = TestApp::spawn().await;
    let id = create_id(
        &app,
        json!({"name": "r", "driver": {"http": {"url": nginx.url()}}, "syncMode": "COPY"}),
    )
    .await;
    let first = settled(&app, &id, "ACTIVE").await;
    let ids = element_ids(&app, &id).await;
    data(
        &mutate(
            &app,
            "installElement(id: $id)",
            "($id: ID!)",
            json!({"id": ids["b 1.0.0"]}),
        )
        .await,
    );

    // b and c leave the inventory, d arrives, a changes.
    let d = put_element(root, "d", "1.0.0", json!({}), &[]);
    let mut a2 = a.clone();
    a2["templates"] = json!(["t.j2"]);
    write_inventory(root, &[a2, d]);
    data(
        &app.gql(
            "mutation($id: ID!) { refreshRepository(id: $id) { id } }",
            json!({"id": id}),
        )
        .await,
    );
    eventually(Duration::from_secs(30), "the refresh", || async {
        let body = app
            .gql(
                "query($id: ID!) { repository(id: $id) { status lastSyncedAt } }",
                json!({"id": id}),
            )
            .await;
        let r = data(&body)["repository"].clone();
        (r["status"] == "ACTIVE" && r["lastSyncedAt"].as_str() != first.last_synced_at.as_deref())
            .then_some(())
    })
    .await;
    let after = element_ids(&app, &id).await;
    let names: Vec<&String> = after.keys().collect();
    assert_eq!(
        names,
        ["a 1.0.0", "b 1.0.0", "d 1.0.0"],
        "b stays: it is installed"
    );
    assert_eq!(after["a 1.0.0"], ids["a 1.0.0"], "a changed in place");
    // COPY stored d's manifest at sync time.
    let body = app
        .gql(
            "query($id: ID!) { element(id: $id) { manifest } }",
            json!({"id": after["d 1.0.0"]}),
        )
        .await;
    assert_eq!(data(&body)["element"]["manifest"]["name"], "d");
}

#[tokio::test]
async fn bad_sources_put_the_repository_in_error_and_keep_elements() {
    let served = tempfile::tempdir().unwrap();
    let root = served.path();
    let a = put_element(root, "a", "1.0.0", json!({}), &[]);
    write_inventory(root, &[a]);
    let nginx = Nginx::start(root);
    let app = TestApp::spawn().await;
    let id = create_id(
        &app,
        json!({"name": "r", "driver": {"http": {"url": nginx.url()}}}),
    )
    .await;
    settled(&app, &id, "ACTIVE").await;

    let cases: [(&str, &str); 5] = [
        ("{not json", "inventory.json"),
        (
            r#"{"elements": {"b": {"1.x.0": {}}}}"#,
            "element `b` 1.x.0, field `version`",
        ),
        (
            r#"{"elements": {"b": {"1.0.0": {"index": {"images": {"u": "../../etc/passwd"}}}}}}"#,
            "field `index.images`",
        ),
        (
            r#"{"elements": {"b": {"1.0.0": {"index": {"images": {"u": "/etc/passwd"}}}}}}"#,
            "not a plain file name",
        ),
        (r#"{"elements": []}"#, "inventory.json"),
    ];
    for (inventory, hint) in cases {
        std::fs::write(root.join("inventory.json"), inventory).unwrap();
        data(
            &app.gql(
                "mutation($id: ID!) { refreshRepository(id: $id) { id } }",
                json!({"id": id}),
            )
            .await,
        );
        let repo = settled(&app, &id, "ERROR").await;
        let message = repo.status_message.as_deref().unwrap();
        assert!(message.contains(hint), "{inventory}: {message}");
        let kept = element_ids(&app, &id).await;
        assert!(
            kept.contains_key("a 1.0.0"),
            "stored elements are kept: {kept:?}"
        );
        // Back to a good state before the next case.
        write_inventory(root, &[put_element(root, "a", "1.0.0", json!({}), &[])]);
        data(
            &app.gql(
                "mutation($id: ID!) { refreshRepository(id: $id) { id } }",
                json!({"id": id}),
            )
            .await,
        );
        settled(&app, &id, "ACTIVE").await;
    }

    // An HTTP error and an unreachable host.
    std::fs::remove_file(root.join("inventory.json")).unwrap();
    data(
        &app.gql(
            "mutation($id: ID!) { refreshRepository(id: $id) { id } }",
            json!({"id": id}),
        )
        .await,
    );
    let repo = settled(&app, &id, "ERROR").await;
    assert!(
        repo.status_message.as_deref().unwrap().contains("404"),
        "{repo:?}"
    );
    let closed = format!("http://127.0.0.1:{}", free_port());
    let unreachable = create_id(
        &app,
        json!({"name": "gone", "driver": {"http": {"url": closed}}}),
    )
    .await;
    let repo = settled(&app, &unreachable, "ERROR").await;
    assert!(
        repo.status_message
            .as_deref()
            .unwrap()
            .contains("cannot connect"),
        "{repo:?}"
    );

    // A too-large inventory, with a small limit.
    let store = std::sync::Arc::new(TestStore::fresh().await);
    let small = TestApp::spawn_with(store, |c| c.repo_max_inventory_bytes = 64).await;
    write_inventory(
        root,
        &[
            put_element(root, "a", "1.0.0", json!({}), &[]),
            put_element(root, "b", "1.0.0", json!({}), &[]),
        ],
    );
    let big = create_id(
        &small,
        json!({"name": "big", "driver": {"http": {"url": nginx.url()}}}),
    )
    .await;
    let repo = settled(&small, &big, "ERROR").await;
    assert!(
        repo.status_message
            .as_deref()
            .unwrap()
            .contains("over the limit of 64 bytes"),
        "{repo:?}"
    );
}

#[tokio::test]
async fn bad_repository_input_is_named() {
    let app = TestApp::spawn().await;
    let cases = [
        (
            json!({"name": "x", "driver": {"http": {"url": "ftp://h/x"}}}),
            "scheme `ftp`",
        ),
        (
            json!({"name": "x", "driver": {"http": {"url": "not a url"}}}),
            "driver.http.url",
        ),
        (
            json!({"name": "x", "driver": {"local": {"path": "relative/dir"}}}),
            "absolute path",
        ),
        (json!({"name": "", "driver": {"migration": {}}}), "name"),
        (
            json!({"name": "x", "driver": {"migration": {}}, "refreshIntervalSeconds": 0}),
            "refreshIntervalSeconds",
        ),
    ];
    for (input, hint) in cases {
        let body = app
            .gql(
                "mutation($i: CreateRepositoryInput!) { createRepository(input: $i) { id } }",
                json!({"i": input}),
            )
            .await;
        assert_eq!(error_code(&body), Some("VALIDATION"), "{body}");
        assert!(
            body["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains(hint),
            "{body}"
        );
    }
    let two_drivers = app
        .gql("mutation { createRepository(input: {name: \"x\", driver: {migration: {}, local: {path: \"/tmp\"}}}) { id } }", json!({}))
        .await;
    assert_eq!(
        error_code(&two_drivers),
        Some("INVALID_QUERY"),
        "{two_drivers}"
    );
    create(&app, json!({"name": "dup", "driver": {"migration": {}}})).await;
    let dup = app
        .gql(
            "mutation { createRepository(input: {name: \"dup\", driver: {migration: {}}}) { id } }",
            json!({}),
        )
        .await;
    assert_eq!(error_code(&dup), Some("CONFLICT"));
    let body = app.gql("{ repositories { totalCount } }", json!({})).await;
    assert_eq!(
        data(&body)["repositories"]["totalCount"],
        1,
        "nothing half-made"
    );
}

#[tokio::test]
async fn local_directories_and_uploads() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("base.yaml"),
        "name: base\nversion: 1.0.0\nresources: {}\n",
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("nested")).unwrap();
    std::fs::write(
        dir.path().join("nested/app.yml"),
        "name: app\nversion: 0.2.0\nresources: {}\nrequirements:\n  base: {\">=\": 1.0.0}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("notes.yaml"), "just: some yaml\n").unwrap();
    std::fs::write(dir.path().join("README.md"), "not yaml at all").unwrap();
    let app = TestApp::spawn().await;
    let id = create_id(
        &app,
        json!({"name": "local", "driver": {"local": {"path": dir.path()}}, "syncMode": "COPY"}),
    )
    .await;
    settled(&app, &id, "ACTIVE").await;
    let ids = element_ids(&app, &id).await;
    assert_eq!(ids.keys().collect::<Vec<_>>(), ["app 0.2.0", "base 1.0.0"]);
    let installed = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": ids["app 0.2.0"]}),
    )
    .await;
    assert_eq!(data(&installed)["installElement"]["installed"], true);

    // Upload writes a new manifest file into the directory.
    let yaml = "name: extra\nversion: 3.0.0\nresources: {}\n";
    let body = app
        .gql("mutation($r: ID!, $m: String!) { uploadElement(repositoryId: $r, manifest: $m) { name version } }", json!({"r": id, "m": yaml}))
        .await;
    assert_eq!(
        data(&body)["uploadElement"],
        json!({"name": "extra", "version": "3.0.0"})
    );
    assert!(dir.path().join("extra-3.0.0.yaml").exists());
    let again = app
        .gql("mutation($r: ID!, $m: String!) { uploadElement(repositoryId: $r, manifest: $m) { name } }", json!({"r": id, "m": yaml}))
        .await;
    assert_eq!(error_code(&again), Some("CONFLICT"));
    let bad = app
        .gql("mutation($r: ID!, $m: String!) { uploadElement(repositoryId: $r, manifest: $m) { name } }", json!({"r": id, "m": "name: x\nversion: 1.0\nresources: {}\n"}))
        .await;
    assert_eq!(error_code(&bad), Some("VALIDATION"), "{bad}");
    assert!(
        bad["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("field `version`"),
        "{bad}"
    );
}

#[tokio::test]
async fn dependency_errors_carry_their_codes() {
    let app = TestApp::spawn().await;
    let id = create_id(&app, json!({"name": "m", "driver": {"migration": {}}})).await;
    settled(&app, &id, "ACTIVE").await;
    let upload = |yaml: String| {
        let app = &app;
        let id = id.clone();
        async move {
            let body = app
                .gql("mutation($r: ID!, $m: String!) { uploadElement(repositoryId: $r, manifest: $m) { id } }", json!({"r": id, "m": yaml}))
                .await;
            data(&body)["uploadElement"]["id"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let element = |name: &str, requirements: &str| {
        format!("name: {name}\nversion: 1.0.0\nresources: {{}}\nrequirements: {requirements}\n")
    };
    let lonely = upload(element("lonely", "{missing: {}}")).await;
    let cyc_a = upload(element("cyc-a", "{cyc-b: {}}")).await;
    upload(element("cyc-b", "{cyc-a: {}}")).await;
    // A malformed constraint is refused before anything is stored.
    let odd = app
        .gql("mutation($r: ID!, $m: String!) { uploadElement(repositoryId: $r, manifest: $m) { id } }",
            json!({"r": id, "m": element("odd", "{lonely: {about: 1.0.0}}")}))
        .await;
    assert_eq!(
        error_code(&odd),
        Some("DEPENDENCY_CONSTRAINT_FORMAT"),
        "{odd}"
    );
    assert!(
        odd["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("`about`")
    );
    let picky = upload(element("picky", "{cyc-b: {from_version: 9.0.0}}")).await;
    for (element, code) in [
        (&lonely, "DEPENDENCY_NOT_FOUND"),
        (&cyc_a, "DEPENDENCY_CYCLE"),
        (&picky, "DEPENDENCY_NOT_FOUND"),
    ] {
        let body = mutate(
            &app,
            "installElement(id: $id)",
            "($id: ID!)",
            json!({"id": element}),
        )
        .await;
        assert_eq!(error_code(&body), Some(code), "{body}");
        let state = app
            .gql(
                "query($id: ID!) { element(id: $id) { installed status } }",
                json!({"id": element}),
            )
            .await;
        assert_eq!(
            data(&state)["element"],
            json!({"installed": false, "status": "NEW"}),
            "nothing changed"
        );
    }
    let cycle = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": cyc_a}),
    )
    .await;
    let message = cycle["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("cyc-a 1.0.0") && message.contains("cyc-b 1.0.0"),
        "{message}"
    );

    // editElement keeps name and version.
    let renamed = app
        .gql(
            "mutation($id: ID!, $m: JSON!) { editElement(id: $id, manifest: $m) { id } }",
            json!({"id": lonely, "m": {"name": "other", "version": "1.0.0", "resources": {}}}),
        )
        .await;
    assert_eq!(error_code(&renamed), Some("VALIDATION"), "{renamed}");
    let fixed = app
        .gql("mutation($id: ID!, $m: JSON!) { editElement(id: $id, manifest: $m) { manifest } }",
            json!({"id": lonely, "m": {"name": "lonely", "version": "1.0.0", "resources": {"r": {"type": "x"}}}}))
        .await;
    assert_eq!(
        data(&fixed)["editElement"]["manifest"]["resources"]["r"]["type"],
        "x"
    );
    // Its blueprint now has a resource nobody serves: the installation fails
    // and the element stays uninstalled.
    let refused = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": lonely}),
    )
    .await;
    assert_eq!(error_code(&refused), Some("DEPLOYMENT_FAILED"), "{refused}");
    let message = refused["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("lonely 1.0.0") && message.contains("`x`"),
        "{message}"
    );
    let emptied = app
        .gql("mutation($id: ID!, $m: JSON!) { editElement(id: $id, manifest: $m) { installed status } }",
            json!({"id": lonely, "m": {"name": "lonely", "version": "1.0.0", "resources": {}}}))
        .await;
    assert_eq!(data(&emptied)["editElement"]["installed"], false);
    assert_eq!(data(&emptied)["editElement"]["status"], "ERROR");
    let installed = mutate(
        &app,
        "installElement(id: $id)",
        "($id: ID!)",
        json!({"id": lonely}),
    )
    .await;
    assert_eq!(data(&installed)["installElement"]["installed"], true);
}

#[tokio::test]
async fn a_silent_source_times_out() {
    // Accepts connections and never answers: a fault we can cause for real.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().take(8) {
            held.push(stream);
        }
    });
    let store = std::sync::Arc::new(TestStore::fresh().await);
    let app = TestApp::spawn_with(store, |c| c.repo_http_timeout = Duration::from_secs(1)).await;
    let id = create_id(
        &app,
        json!({"name": "silent", "driver": {"http": {"url": format!("http://127.0.0.1:{port}")}}}),
    )
    .await;
    let repo = settled(&app, &id, "ERROR").await;
    assert!(
        repo.status_message
            .as_deref()
            .unwrap()
            .contains("timed out after 1s"),
        "{repo:?}"
    );
}

#[tokio::test]
async fn sync_progress_is_published_live() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..3 {
        std::fs::write(
            dir.path().join(format!("e{i}.yaml")),
            format!("name: e{i}\nversion: 1.0.0\nresources: {{}}\n"),
        )
        .unwrap();
    }
    let app = TestApp::spawn().await;
    let id = create_id(
        &app,
        json!({"name": "live", "driver": {"local": {"path": dir.path()}}}),
    )
    .await;
    settled(&app, &id, "ACTIVE").await;

    let mut ws = connect(app.addr, "graphql-transport-ws").await;
    init(&mut ws, json!({"token": ADMIN_TOKEN})).await;
    send(
        &mut ws,
        json!({"id": "r", "type": "subscribe", "payload": {
        "query": "subscription($id: ID!) { repositoryEvents(id: $id) { status seen stored } }",
        "variables": {"id": id}}}),
    )
    .await;
    // Refresh until the subscriber sees a whole sync: SYNCING, then ACTIVE.
    let mut statuses = Vec::new();
    for _ in 0..50 {
        data(
            &app.gql(
                "mutation($id: ID!) { refreshRepository(id: $id) { id } }",
                json!({"id": id}),
            )
            .await,
        );
        while let Ok(Some(message)) =
            tokio::time::timeout(Duration::from_millis(200), next_json(&mut ws)).await
        {
            let event = message["payload"]["data"]["repositoryEvents"].clone();
            statuses.push(event["status"].as_str().unwrap().to_owned());
            if event["status"] == "ACTIVE" && statuses.contains(&"SYNCING".to_owned()) {
                assert_eq!(event["stored"], 3, "{event}");
                return;
            }
        }
    }
    panic!("no complete sync seen: {statuses:?}");
}
