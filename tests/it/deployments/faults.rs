//! Provider faults during a deploy or destroy: a call that never answers, a
//! provider that dies, a provider unloaded while its resources must go.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::support::deployments::{create_blueprint, deploy, deployment, destroy, settled};
use crate::support::processes::provider_pid;
use crate::support::provider_repos::{ProviderRepo, fixture_metadata};
use crate::support::providers::{create_provider, wait_status};
use crate::support::settings::quick;
use crate::support::{TestApp, TestStore, data, eventually, journal_len};

/// Loads a fixture provider in `mode` named `name`, and a blueprint of one
/// no-op resource on it. Returns the provider's and the blueprint's ids (and
/// the repository, which must outlive the test).
async fn fixture_with_blueprint(
    app: &TestApp,
    name: &str,
    mode: &str,
) -> (String, String, ProviderRepo) {
    let repo = ProviderRepo::new(&fixture_metadata(mode), &[]);
    let (provider, _) = create_provider(app, json!({ "name": name, "gitUrl": repo.url() })).await;
    wait_status(app, &provider, "CONNECTED").await;
    let blueprint = create_blueprint(
        app,
        &format!("noop-{name}"),
        &format!("resources:\n  n:\n    type: fixture.v1.noop\n    provider: {name}\n"),
    )
    .await;
    (provider, blueprint, repo)
}

/// Provider faults: a call that never answers, and a provider that is gone when
/// its resources must be destroyed.
#[tokio::test]
async fn provider_faults_fail_the_deployment_with_the_reason() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |config| {
        quick(config);
        config.provider.call_timeout = Duration::from_millis(3_000);
        config.deploy.provider_wait = Duration::from_millis(1_000);
    })
    .await;
    let (_, blueprint, _hang) = fixture_with_blueprint(&app, "hang", "hang-deploy").await;
    let id = deploy(&app, &blueprint, "hangs", json!({ "onFailure": "KEEP" })).await;
    let failed = settled(&app, &id, &["FAILED", "COMPLETE"]).await;
    assert_eq!(failed.state, "FAILED");
    let error = failed.error.as_deref().unwrap();
    assert!(
        error.contains("n[0]") && error.contains("did not answer DeployResource within 3000ms"),
        "{error}"
    );
    // The call's outcome was unknown; once settled (the resource is absent)
    // the journal is empty.
    eventually(Duration::from_secs(60), "the journal to drain", || async {
        (journal_len(&app.store).await == 0).then_some(())
    })
    .await;

    // A provider that dies in the middle of a deploy: the call fails at once,
    // and the call's journal entry is settled once the provider is back.
    let (dying_id, blueprint, _dying) = fixture_with_blueprint(&app, "dying", "hang-deploy").await;
    let id = deploy(&app, &blueprint, "dies", json!({ "onFailure": "KEEP" })).await;
    eventually(Duration::from_secs(30), "the deploy call", || async {
        let d = deployment(&app, &id).await;
        (d.nodes.first().is_some_and(|n| n.state == "IN_PROGRESS")).then_some(())
    })
    .await;
    let pid = provider_pid(&app.store, &dying_id);
    // SAFETY: killing the provider process this test started through Corbel.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let failed = settled(&app, &id, &["FAILED", "COMPLETE"]).await;
    assert_eq!(failed.state, "FAILED");
    assert!(
        failed.error.as_deref().unwrap().contains("n[0]"),
        "{failed:?}"
    );
    eventually(Duration::from_secs(60), "the journal to drain", || async {
        (journal_len(&app.store).await == 0).then_some(())
    })
    .await;

    // A provider that is unloaded when its resources must go.
    let (normal_id, blueprint, _normal) = fixture_with_blueprint(&app, "normal", "normal").await;
    let id = deploy(&app, &blueprint, "orphaned", json!({})).await;
    let done = settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    let body = app
        .gql(
            "mutation($id: ID!) { unloadProvider(id: $id) { status } }",
            json!({ "id": normal_id }),
        )
        .await;
    data(&body);
    destroy(&app, &id).await;
    let failed = settled(&app, &id, &["FAILED", "DESTROYED"]).await;
    assert_eq!(failed.state, "FAILED", "{failed:?}");
    let error = failed.error.as_deref().unwrap();
    assert!(
        error.contains("is not connected (UNLOADED; waited 1 s)"),
        "{error}"
    );
    app.stop().await;
}

/// A deploy that failed only because its provider was away (unloaded, not
/// connected) is resumed once the provider is back, under `onFailure: KEEP`;
/// one under `ROLLBACK` stays as it ended.
#[tokio::test]
async fn a_deploy_failed_while_its_provider_was_away_resumes_when_it_is_back() {
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |config| {
        quick(config);
        config.deploy.provider_wait = Duration::from_millis(500);
    })
    .await;
    let (provider, blueprint, _repo) = fixture_with_blueprint(&app, "away", "normal").await;
    let provider_mutation =
        |mutation: &str| format!("mutation($id: ID!) {{ {mutation}(id: $id) {{ status }} }}");
    data(
        &app.gql(
            &provider_mutation("unloadProvider"),
            json!({ "id": provider }),
        )
        .await,
    );
    wait_status(&app, &provider, "UNLOADED").await;
    let kept = deploy(&app, &blueprint, "kept", json!({ "onFailure": "KEEP" })).await;
    let rolled = deploy(
        &app,
        &blueprint,
        "rolled",
        json!({ "onFailure": "ROLLBACK" }),
    )
    .await;
    for id in [&kept, &rolled] {
        let failed = settled(&app, id, &["FAILED", "COMPLETE"]).await;
        assert_eq!(failed.state, "FAILED", "{failed:?}");
        assert!(
            failed
                .error
                .as_deref()
                .unwrap()
                .contains("is not connected"),
            "{failed:?}"
        );
    }

    data(
        &app.gql(
            &provider_mutation("loadProvider"),
            json!({ "id": provider }),
        )
        .await,
    );
    let resumed = eventually(
        Duration::from_secs(60),
        "the kept deploy to resume",
        || async {
            let d = deployment(&app, &kept).await;
            (d.state == "COMPLETE").then_some(d)
        },
    )
    .await;
    let events = app
        .gql(
            "query($id: ID!) { deployment(id: $id) { events(first: 100) { message } } }",
            json!({ "id": kept }),
        )
        .await;
    let said = data(&events)["deployment"]["events"].to_string();
    assert!(
        said.contains("resuming: the providers it failed for are back"),
        "{said}"
    );
    assert_eq!(resumed.node("n").state, "COMPLETE", "{resumed:?}");
    let rolled = deployment(&app, &rolled).await;
    assert_eq!(
        rolled.state, "FAILED",
        "a rolled-back deploy stays: {rolled:?}"
    );
    app.stop().await;
}

/// `[deploy] concurrency` bounds the provider calls in flight, while as many
/// steps again have their journal entry committed as they wait for a permit:
/// with a bound of 2 and deploys that never answer, the provider has received
/// 2 calls, no more, and 4 entries are committed; only the 2 nodes whose call
/// is in flight are `IN_PROGRESS`, the waiting ones still `TO_DEPLOY`.
#[tokio::test]
async fn calls_in_flight_stay_within_the_concurrency_bound() {
    calls_within_the_bound(Bounded::Deploy).await;
}

/// The same for a destroy, whose calls never answer: 2 nodes `DESTROYING`,
/// the waiting ones still `COMPLETE`.
#[tokio::test]
async fn destroy_calls_in_flight_stay_within_the_concurrency_bound() {
    calls_within_the_bound(Bounded::Destroy).await;
}

#[derive(Clone, Copy, PartialEq)]
enum Bounded {
    Deploy,
    Destroy,
}

async fn calls_within_the_bound(bounded: Bounded) {
    use crate::providers::protocol::{calls, loaded};

    let (mode, call, calling, waiting) = match bounded {
        Bounded::Deploy => ("hang-deploy", "deploy", "IN_PROGRESS", "TO_DEPLOY"),
        Bounded::Destroy => ("hang-destroy", "destroy", "DESTROYING", "COMPLETE"),
    };
    let app = TestApp::spawn_with(Arc::new(TestStore::fresh().await), |config| {
        quick(config);
        config.deploy.concurrency = 2;
        // The calls never answer: the stop waits this long for them.
        config.shutdown_grace = Duration::from_secs(1);
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let call_log = dir.path().join("calls.jsonl");
    let (_, _repo) = loaded(&app, &format!("FIXTURE_MODE={mode}"), &call_log).await;
    let mut source = String::from("resources:\n");
    for i in 0..8 {
        source.push_str(&format!("  r{i}: {{ type: fixture.v1.noop }}\n"));
    }
    let blueprint = create_blueprint(&app, "eight", &source).await;
    let id = deploy(&app, &blueprint, "bounded", json!({ "onFailure": "KEEP" })).await;
    if bounded == Bounded::Destroy {
        settled(&app, &id, &["COMPLETE"]).await;
        destroy(&app, &id).await;
    }
    let made = || {
        calls(&call_log)
            .into_iter()
            .filter(|(c, _)| c == call)
            .count()
    };
    let states = || async {
        let d = deployment(&app, &id).await;
        let count = |state: &str| d.nodes.iter().filter(|n| n.state == state).count();
        (count(calling), count(waiting))
    };
    // The journal is read once, at the end: a test polling it (a pool of
    // its own opened and closed each time) hung twice this way, its runtime
    // blocked, in ~35 runs.
    eventually(
        Duration::from_secs(30),
        "2 calls at the provider",
        || async { (made() >= 2).then_some(()) },
    )
    .await;
    eventually(Duration::from_secs(30), "2 nodes calling", || async {
        (states().await == (2, 6)).then_some(())
    })
    .await;
    // The two waiting steps' entries were committed with the first two's:
    // had they called without a permit, their calls would have come with
    // them, and their nodes would say so.
    assert_eq!(journal_len(&app.store).await, 4);
    assert_eq!(states().await, (2, 6));
    assert_eq!(made(), 2, "{:?}", calls(&call_log));
    app.stop().await;
}
