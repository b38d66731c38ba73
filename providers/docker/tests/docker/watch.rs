//! "watch": the health board, filled from the engine and kept current from
//! its events, read over `WatchResources` (and Inspect's health fields).

use std::time::Duration;

use corbel_provider_docker::CONTAINER;
use corbel_provider_sdk::proto::{Health, ResourceStatus};
use corbel_provider_sdk::serde_json::json;
use tonic::Streaming;

use super::{Cleanup, deploy, destroy, docker, host, resource, sleeper, test_image};

const DEADLINE: Duration = Duration::from_secs(20);

/// The next status of the stream, within [`DEADLINE`].
async fn next(stream: &mut Streaming<ResourceStatus>) -> ResourceStatus {
    tokio::time::timeout(DEADLINE, stream.message())
        .await
        .expect("a status within the deadline")
        .expect("the stream goes on")
        .expect("the stream is open")
}

/// The first report, up to and without its `synced` mark.
async fn first_report(stream: &mut Streaming<ResourceStatus>) -> Vec<ResourceStatus> {
    let mut report = Vec::new();
    loop {
        let status = next(stream).await;
        if status.synced {
            return report;
        }
        report.push(status);
    }
}

/// The first report's status of `id`, which must be there.
fn reported<'a>(report: &'a [ResourceStatus], id: &str) -> &'a ResourceStatus {
    report
        .iter()
        .find(|s| s.resource_id == id)
        .unwrap_or_else(|| panic!("no status of {id} in {report:?}"))
}

/// The first status of `id` that is `health`.
async fn until(stream: &mut Streaming<ResourceStatus>, id: &str, health: Health) -> ResourceStatus {
    loop {
        let status = next(stream).await;
        if status.resource_id == id && status.health() == health {
            return status;
        }
    }
}

fn container_id(outputs: &corbel_provider_sdk::serde_json::Value) -> String {
    outputs["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_killed_container_turns_down_over_an_open_watch() {
    let host = host().await;
    let web = sleeper("wkill");
    let _cleanup = Cleanup::of(&[&web]);
    let id = container_id(&deploy(&host, &web).await.unwrap());

    let mut stream = host.watch(vec![web.clone()]).await.unwrap();
    let report = first_report(&mut stream).await;
    assert_eq!(report.len(), 1, "{report:?}");
    assert_eq!(
        reported(&report, &web.resource_id).health(),
        Health::Healthy
    );

    let (ok, out) = docker(&["kill", &id]);
    assert!(ok, "{out}");
    let down = until(&mut stream, &web.resource_id, Health::Down).await;
    assert_eq!(down.reason, "exited with status 137 (SIGKILL)");
    assert_eq!(down.exit_code, Some(137));
    assert!(down.changed_at_unix_ms > 0);

    // Inspect says the same (version 3's fields).
    let inspected = host.inspect(web.clone()).await.unwrap();
    assert!(inspected.present);
    assert_eq!(inspected.health(), Health::Down);
    assert_eq!(inspected.reason, "exited with status 137 (SIGKILL)");
}

/// An image whose HEALTHCHECK fails at once, saying why.
fn failing_check_image() -> &'static str {
    const IMAGE: &str = "corbel-test-unhealthy:1";
    test_image();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("Dockerfile"),
        format!(
            "FROM {}\nHEALTHCHECK --interval=1s --timeout=2s --retries=1 \
             CMD [\"sh\", \"-c\", \"echo checking; echo no answer on port 80; exit 1\"]\n",
            super::IMAGE
        ),
    )
    .unwrap();
    let (ok, out) = docker(&[
        "build",
        "-q",
        "-t",
        IMAGE,
        "--label",
        "io.corbel.test=corbel-provider-docker",
        dir.path().to_str().unwrap(),
    ]);
    assert!(ok, "building {IMAGE}: {out}");
    IMAGE
}

#[tokio::test]
async fn a_failing_healthcheck_turns_degraded_with_its_output() {
    let image = failing_check_image();
    let host = host().await;
    let web = resource(
        CONTAINER,
        "wcheck",
        json!({ "image": image, "command": ["sleep", "300"] }),
    );
    let _cleanup = Cleanup::of(&[&web]);
    deploy(&host, &web).await.unwrap();

    let mut stream = host.watch(vec![web.clone()]).await.unwrap();
    let report = first_report(&mut stream).await;
    let first = reported(&report, &web.resource_id);
    let degraded = if first.health() == Health::Degraded {
        first.clone()
    } else {
        // Running, its check still starting: HEALTHY until the check fails.
        assert_eq!(first.health(), Health::Healthy, "{first:?}");
        until(&mut stream, &web.resource_id, Health::Degraded).await
    };
    assert_eq!(
        degraded.reason,
        "health check failing: no answer on port 80"
    );
    assert_eq!(degraded.exit_code, None);

    let inspected = host.inspect(web.clone()).await.unwrap();
    assert_eq!(inspected.health(), Health::Degraded);
}

#[tokio::test]
async fn a_resource_removed_behind_the_providers_back_is_down() {
    let host = host().await;
    let web = sleeper("wgone");
    let _cleanup = Cleanup::of(&[&web]);
    let id = container_id(&deploy(&host, &web).await.unwrap());
    let mut stream = host.watch(vec![web.clone()]).await.unwrap();
    first_report(&mut stream).await;

    let (ok, out) = docker(&["rm", "-f", &id]);
    assert!(ok, "{out}");
    // Killed first (DOWN, exited with 137), then removed.
    let removed = loop {
        let down = until(&mut stream, &web.resource_id, Health::Down).await;
        if down.reason != "exited with status 137 (SIGKILL)" {
            break down;
        }
    };
    assert_eq!(removed.reason, "removed behind the provider's back");
    let mut again = host.watch(vec![web.clone()]).await.unwrap();
    let report = first_report(&mut again).await;
    let first = reported(&report, &web.resource_id);
    assert_eq!(
        (first.health(), first.reason.as_str()),
        (Health::Down, "removed behind the provider's back")
    );

    // A provider started after it went: DOWN in its first report too.
    drop(host);
    let fresh = super::host().await;
    let mut stream = fresh.watch(vec![web.clone()]).await.unwrap();
    let report = first_report(&mut stream).await;
    assert_eq!(reported(&report, &web.resource_id).health(), Health::Down);
}

#[tokio::test]
async fn a_destroy_through_the_provider_sends_no_down() {
    let host = host().await;
    // `sleep` ignores SIGTERM as pid 1: no waiting for it.
    host.configure(json!({ "stop_timeout_s": 0 }))
        .await
        .unwrap();
    let web = sleeper("wdestroy");
    let sentinel = sleeper("wsentinel");
    let _cleanup = Cleanup::of(&[&web, &sentinel]);
    deploy(&host, &web).await.unwrap();
    let sentinel_id = container_id(&deploy(&host, &sentinel).await.unwrap());
    let mut stream = host
        .watch(vec![web.clone(), sentinel.clone()])
        .await
        .unwrap();
    let report = first_report(&mut stream).await;
    for r in [&web, &sentinel] {
        assert_eq!(reported(&report, &r.resource_id).health(), Health::Healthy);
    }

    destroy(&host, &web).await.unwrap();
    // The sentinel's death comes after the destroy's events on the engine's
    // stream: once it is reported, every status of the destroy would have been.
    let (ok, out) = docker(&["kill", &sentinel_id]);
    assert!(ok, "{out}");
    let mut seen = Vec::new();
    loop {
        let status = next(&mut stream).await;
        if status.resource_id == sentinel.resource_id && status.health() == Health::Down {
            break;
        }
        seen.push(status);
    }
    let of_web: Vec<&ResourceStatus> = seen
        .iter()
        .filter(|s| s.resource_id == web.resource_id)
        .collect();
    assert!(
        of_web.is_empty(),
        "the destroyed resource was reported: {of_web:?}"
    );
    // Forgotten: a new watch finds it no more.
    let mut again = host.watch(vec![web.clone()]).await.unwrap();
    let report = first_report(&mut again).await;
    assert_eq!(
        reported(&report, &web.resource_id).reason,
        "the provider holds no such resource"
    );
}

#[tokio::test]
async fn a_network_removed_behind_the_providers_back_is_down() {
    let host = host().await;
    let net = resource(corbel_provider_docker::NETWORK, "wnet", json!({}));
    let _cleanup = Cleanup::of(&[&net]);
    let id = deploy(&host, &net).await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut stream = host.watch(vec![net.clone()]).await.unwrap();
    let report = first_report(&mut stream).await;
    assert_eq!(
        reported(&report, &net.resource_id).health(),
        Health::Healthy
    );

    let (ok, out) = docker(&["network", "rm", &id]);
    assert!(ok, "{out}");
    let down = until(&mut stream, &net.resource_id, Health::Down).await;
    assert_eq!(down.reason, "removed behind the provider's back");
}
