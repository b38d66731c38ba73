//! A container's power and logs from its node's panel, with the docker
//! provider on the real engine.

use serde_json::json;

use super::node;
use crate::support::browser::Browser;
use crate::support::deployments::{create_blueprint, deploy};

/// A container of the docker provider powered off and on from its node's
/// panel: the node in the graph and the deployment's badge go SUSPENDED and
/// back live, the engine agrees, and its logs are read in the panel. A
/// resource whose provider has no power shows no power buttons.
#[tokio::test]
async fn a_container_is_powered_off_and_on_and_its_logs_read_in_the_browser() {
    use crate::support::docker::{DeploymentCleanup, busybox_image, container_state};
    let image = busybox_image();
    let store = std::sync::Arc::new(crate::support::TestStore::fresh().await);
    let (app, _provider, _repo) = crate::support::deployments::with_docker_provider(store).await;
    let source = format!(
        "resources:\n  box:\n    type: docker.v1.container\n    config:\n      image: {image}\n      \
         command: \"echo ready-to-serve; exec sleep 3600\"\n"
    );
    let blueprint = create_blueprint(&app, "box", &source).await;
    let id = deploy(&app, &blueprint, "box", json!({})).await;
    let _cleanup = DeploymentCleanup(id.clone());
    let done = crate::support::deployments::settled(&app, &id, &["COMPLETE", "FAILED"]).await;
    assert_eq!(done.state, "COMPLETE", "{done:?}");
    let container = done.node("box").outputs["id"].as_str().unwrap().to_owned();

    let browser = Browser::sign_in(&app).await;
    browser.goto(&format!("/deployments/{id}")).await;
    browser.click(&node("box[0]")).await;
    browser.wait_text("#node-panel h2", "box[0]").await;

    browser.click("#power-stop").await;
    browser
        .wait_attr(&node("box[0]"), "data-state", "SUSPENDED")
        .await;
    browser.wait_text("#deployment-state", "SUSPENDED").await;
    // The panel read again: the health of a powered-off resource.
    browser.wait_text("#node-health", "powered off").await;
    assert_eq!(container_state(&container), "exited");
    browser.click("#power-start").await;
    browser
        .wait_attr(&node("box[0]"), "data-state", "COMPLETE")
        .await;
    browser.wait_text("#deployment-state", "COMPLETE").await;
    // Running again, as its provider says: the panel drawn for the last time.
    browser.wait_text("#node-health", "HEALTHY").await;
    assert_eq!(container_state(&container), "running");

    browser.click("#read-logs").await;
    browser.wait_text("#node-logs", "ready-to-serve").await;
    browser.screenshot("deployment-power").await;
    browser.close().await;
}
