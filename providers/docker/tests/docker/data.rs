//! Data retrieved from the engine: a container's inspection with its
//! environment's values hidden, an image looked up, and refusals.

use corbel_provider_docker::{CONTAINER, IMAGE_LOOKUP};
use corbel_provider_sdk::Code;
use corbel_provider_sdk::serde_json::json;

use super::{Cleanup, IMAGE, deploy, destroy, host, resource, retrieve};

#[tokio::test]
async fn retrieve_data_inspect_hides_env_values_and_looks_images_up() {
    let host = host().await;
    let web = resource(
        CONTAINER,
        "secret",
        json!({ "image": IMAGE, "command": ["sleep", "300"], "env": { "API_TOKEN": "hunter2-very-secret" } }),
    );
    let _cleanup = Cleanup::of(&[&web]);
    let outputs = deploy(&host, &web).await.unwrap();

    let inspected = retrieve(&host, "inspect", json!({}), Some(&web))
        .await
        .unwrap();
    assert_eq!(inspected["Id"], outputs["id"]);
    let env = inspected["Config"]["Env"].as_array().unwrap();
    assert!(env.contains(&json!("API_TOKEN")), "{env:?}");
    assert!(
        !inspected.to_string().contains("hunter2"),
        "a secret leaked"
    );

    let image = retrieve(&host, IMAGE_LOOKUP, json!({ "name": IMAGE }), None)
        .await
        .unwrap();
    assert!(
        image["id"].as_str().unwrap().starts_with("sha256:"),
        "{image}"
    );
    assert!(image["tags"].as_array().unwrap().contains(&json!(IMAGE)));
    assert!(image["size"].as_i64().unwrap() > 0);
    let missing = retrieve(
        &host,
        IMAGE_LOOKUP,
        json!({ "name": "corbel-no-such-image:0" }),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    let unknown = retrieve(&host, "docker.v1.nope", json!({}), None)
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::InvalidArgument);
    let bad_tail = retrieve(&host, "logs", json!({ "tail": 0 }), Some(&web))
        .await
        .unwrap_err();
    assert_eq!(bad_tail.code(), Code::InvalidArgument);
    assert!(bad_tail.message().contains("tail"));

    destroy(&host, &web).await.unwrap();
    let gone = retrieve(&host, "logs", json!({}), Some(&web))
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
}
