//! The README's test of the README's example provider, kept compiling here.

#[allow(dead_code)]
#[path = "../examples/hello.rs"]
mod hello;

use corbel_provider_sdk::records::Records;
use corbel_provider_sdk::serde_json::json;
use corbel_provider_sdk::testing::{TestHost, TestRegistry, messages, outcome, resource};
use hello::Hello;

#[tokio::test]
async fn greets_with_the_configured_salutation() {
    let state = tempfile::tempdir().unwrap();
    let registry = TestRegistry::builder()
        .initial_config(json!({ "salutation": "Hi" })) // sent during Register
        .start()
        .await;
    let host = TestHost::start_with(registry, Hello::new(Records::open(state.path()))).await;
    assert_eq!(host.registration().resource_types, ["hello.v1.greeting"]);

    let greeting = resource("hello.v1.greeting", "web", json!({ "name": "Ada" }));
    let events = host.deploy(greeting.clone()).await.unwrap();
    // `outcome` checks the stream ends with exactly one done or error.
    assert_eq!(outcome(&events).unwrap(), json!({ "greeting": "Hi, Ada!" }));
    assert!(host.inspect(greeting).await.unwrap().present);
}

#[tokio::test]
async fn greetings_outlive_the_provider_and_are_made_once() {
    let state = tempfile::tempdir().unwrap();
    let greeting = resource("hello.v1.greeting", "web", json!({ "name": "Ada" }));
    let mut first = TestHost::start(Hello::new(Records::open(state.path()))).await;
    let outputs = outcome(&first.deploy(greeting.clone()).await.unwrap()).unwrap();
    assert_eq!(outputs, json!({ "greeting": "Hello, Ada!" }));
    first.stop().await.unwrap();
    drop(first);

    // A restarted provider, configured differently, still has the greeting:
    // deploying it again returns it as it was made.
    let registry = TestRegistry::builder()
        .initial_config(json!({ "salutation": "Hi" }))
        .start()
        .await;
    let second = TestHost::start_with(registry, Hello::new(Records::open(state.path()))).await;
    let inspected = second.inspect(greeting.clone()).await.unwrap();
    assert!(inspected.present);
    assert_eq!(inspected.outputs_json, outputs.to_string());
    let events = second.deploy(greeting.clone()).await.unwrap();
    assert_eq!(outcome(&events).unwrap(), outputs);
    assert!(messages(&events).contains(&"already deployed".to_string()));

    outcome(
        &second
            .destroy(greeting.clone(), outputs.clone())
            .await
            .unwrap(),
    )
    .unwrap();
    assert!(!second.inspect(greeting.clone()).await.unwrap().present);
    // Destroying it again succeeds.
    let events = second.destroy(greeting, outputs).await.unwrap();
    outcome(&events).unwrap();
    assert!(messages(&events).contains(&"nothing to destroy".to_string()));
}
