//! The README's test of the README's example provider, kept compiling here.

#[allow(dead_code)]
#[path = "../examples/hello.rs"]
mod hello;

use corbel_provider_sdk::serde_json::json;
use corbel_provider_sdk::testing::{TestHost, TestRegistry, outcome, resource};
use hello::Hello;

#[tokio::test]
async fn greets_with_the_configured_salutation() {
    let registry = TestRegistry::builder()
        .initial_config(json!({ "salutation": "Hi" })) // sent during Register
        .start()
        .await;
    let host = TestHost::start_with(registry, Hello::default()).await;
    assert_eq!(host.registration().resource_types, ["hello.v1.greeting"]);

    let greeting = resource("hello.v1.greeting", "web", json!({ "name": "Ada" }));
    let events = host.deploy(greeting.clone()).await.unwrap();
    // `outcome` checks the stream ends with exactly one done or error.
    assert_eq!(outcome(&events).unwrap(), json!({ "greeting": "Hi, Ada!" }));
    assert!(host.inspect(greeting).await.unwrap().present);
}
