//! Power: a container stopped, started, paused, resumed and restarted,
//! each idempotently; a network has none.

use std::time::Duration;

use corbel_provider_docker::NETWORK;
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::testing::TestHost;
use corbel_provider_sdk::{Code, Status, proto};

use super::{Cleanup, container_status, deploy, destroy, host, resource, sleeper};

/// Waits, with a deadline, for `check` to hold.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn power(
    host: &TestHost,
    resource: &proto::Resource,
    action: proto::PowerAction,
) -> Result<(), Status> {
    host.client()
        .power(proto::PowerRequest {
            resource: Some(resource.clone()),
            action: action as i32,
        })
        .await
        .map(|_| ())
}

#[tokio::test]
async fn power_stops_starts_pauses_and_resumes_idempotently() {
    use proto::PowerAction as A;
    let host = host().await;
    host.configure(json!({ "stop_timeout_s": 1 }))
        .await
        .unwrap();
    let web = sleeper("power");
    let net = resource(NETWORK, "pnet", json!({}));
    let _cleanup = Cleanup::of(&[&web, &net]);
    let id = deploy(&host, &web).await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    for (action, want) in [
        (A::Stop, "exited"),
        (A::Stop, "exited"),
        (A::Start, "running"),
        (A::Start, "running"),
        (A::Pause, "paused"),
        (A::Pause, "paused"),
        (A::Resume, "running"),
        (A::Resume, "running"),
        (A::Pause, "paused"),
        (A::Start, "running"),
        (A::Restart, "running"),
        (A::Pause, "paused"),
        (A::Stop, "exited"),
    ] {
        power(&host, &web, action)
            .await
            .unwrap_or_else(|e| panic!("{action:?}: {e}"));
        eventually(&format!("{action:?} → {want}"), || {
            container_status(&id) == want
        })
        .await;
    }
    let outputs: Value =
        serde_json::from_str(&host.inspect(web.clone()).await.unwrap().outputs_json).unwrap();
    assert_eq!(outputs["state"], "exited");
    // Deploying a stopped container adopts it as it is.
    assert_eq!(deploy(&host, &web).await.unwrap()["id"], id.as_str());

    let refused = power(&host, &net, A::Stop).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains("docker.v1.network has no power"),
        "{refused:?}"
    );

    destroy(&host, &web).await.unwrap();
    let gone = power(&host, &web, A::Start).await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
}
