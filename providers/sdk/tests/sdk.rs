//! The SDK end to end: a real registry socket, the real `serve_with`, a real
//! client on the provider's socket.

use std::sync::Mutex;
use std::time::Duration;

use corbel_provider_sdk::proto::resource_event::Event;
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::testing::{
    DEADLINE, TEST_PROVIDER_ID, TestHost, TestRegistry, messages, outcome, resource,
};
use corbel_provider_sdk::{
    Code, Events, Failure, Provider, ProviderInfo, SdkError, Status, StepResult, Stopped,
    async_trait, proto, serve_with,
};

/// Greets with the configured word; fails on request.
#[derive(Default)]
struct Echo {
    greeting: Mutex<String>,
}

#[async_trait]
impl Provider for Echo {
    fn info(&self) -> ProviderInfo {
        ProviderInfo::new("echo", "1.2.3")
            .features(["deploy", "teleport"])
            .resource_types(["echo.v1.thing"])
    }

    async fn configure(&self, config: Value) -> Result<(), Status> {
        let greeting = config["greeting"].as_str().unwrap_or("none").to_string();
        *self.greeting.lock().unwrap() = greeting;
        Ok(())
    }

    async fn deploy_resource(
        &self,
        request: proto::DeployResourceRequest,
        events: Events,
    ) -> StepResult {
        let resource = request.resource.unwrap();
        events.progress(10, "starting").await;
        events.log(format!("deploying {}", resource.key)).await;
        let config: Value = serde_json::from_str(&resource.config_json).unwrap();
        if config["fail"] == json!(true) {
            return Err(Failure::retryable("asked to fail").into());
        }
        if config["refuse_late"] == json!(true) {
            return Err(Status::unavailable("gave up").into());
        }
        let greeting = self.greeting.lock().unwrap().clone();
        events.progress(100, "done").await;
        Ok(json!({ "greeting": greeting, "key": resource.key }))
    }

    /// Answers what it was given, so a test sees every field arrive.
    async fn update_resource(
        &self,
        request: proto::UpdateResourceRequest,
        events: Events,
    ) -> StepResult {
        let resource = request.resource.unwrap();
        events.log(format!("updating {}", resource.key)).await;
        let parse = |text: &str| serde_json::from_str::<Value>(text).unwrap();
        Ok(json!({
            "config": parse(&resource.config_json),
            "previous": parse(&request.previous_config_json),
            "outputs": parse(&request.outputs_json),
        }))
    }
}

/// Implements nothing but `info`.
struct Bare;

#[async_trait]
impl Provider for Bare {
    fn info(&self) -> ProviderInfo {
        ProviderInfo::new("bare", "0.0.1")
    }
}

#[tokio::test]
async fn registers_configures_and_deploys_with_exactly_one_done() {
    let registry = TestRegistry::builder()
        .initial_config(json!({ "greeting": "hi" }))
        .start()
        .await;
    // A socket left behind by a killed predecessor is replaced.
    std::fs::create_dir_all(registry.socket_dir()).unwrap();
    let stale = registry
        .socket_dir()
        .join(format!("{TEST_PROVIDER_ID}.sock"));
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());

    let host = TestHost::start_with(registry, Echo::default()).await;
    let registration = host.registration();
    assert_eq!(registration.id, TEST_PROVIDER_ID);
    assert_eq!(registration.name, "echo");
    assert_eq!(registration.version, "1.2.3");
    // The highest version both sides speak: 3, with UpdateResource and
    // WatchResources.
    assert_eq!(registration.protocol_version, 3);
    assert_eq!(registration.features, ["deploy", "teleport"]);
    assert_eq!(registration.resource_types, ["echo.v1.thing"]);
    assert_eq!(
        registration.endpoint,
        format!("unix://{}", stale.canonicalize().unwrap().display())
    );
    assert!(registration.token.is_empty(), "the host keeps no token");

    // The Configure sent during Register arrived.
    let events = host
        .deploy(resource("echo.v1.thing", "web", json!({})))
        .await
        .unwrap();
    assert_eq!(
        outcome(&events).unwrap(),
        json!({ "greeting": "hi", "key": "web" })
    );
    assert_eq!(messages(&events), ["starting", "deploying web", "done"]);
    assert!(matches!(events[0].event, Some(Event::Progress(ref p)) if p.percent == 10));

    host.configure(json!({ "greeting": "yo" })).await.unwrap();
    let events = host
        .deploy(resource("echo.v1.thing", "api", json!({})))
        .await
        .unwrap();
    assert_eq!(outcome(&events).unwrap()["greeting"], "yo");

    let events = host
        .deploy(resource("echo.v1.thing", "x", json!({ "fail": true })))
        .await
        .unwrap();
    let failure = outcome(&events).unwrap_err();
    assert_eq!(
        (failure.message.as_str(), failure.retryable),
        ("asked to fail", true)
    );

    // A status after events still ends the stream with one error event.
    let events = host
        .deploy(resource(
            "echo.v1.thing",
            "x",
            json!({ "refuse_late": true }),
        ))
        .await
        .unwrap();
    let failure = outcome(&events).unwrap_err();
    assert!(failure.message.contains("gave up"), "{failure:?}");

    let refused = host
        .client()
        .configure(proto::ConfigureRequest {
            config_json: "{not json".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);

    let events = host
        .update(
            resource("echo.v1.thing", "web", json!({ "label": "new" })),
            json!({ "label": "old" }),
            json!({ "greeting": "hi", "key": "web" }),
        )
        .await
        .unwrap();
    assert_eq!(messages(&events), ["updating web"]);
    assert_eq!(
        outcome(&events).unwrap(),
        json!({
            "config": { "label": "new" },
            "previous": { "label": "old" },
            "outputs": { "greeting": "hi", "key": "web" },
        })
    );
}

#[tokio::test]
async fn a_provider_offering_only_version_1_registers_with_1() {
    let registry = TestRegistry::start().await;
    let mut settings = registry.settings("old");
    settings.protocol_versions = vec![1];
    let task = tokio::spawn(serve_with(settings, Bare, std::future::pending()));
    let registered = registry
        .wait_for_registrations(1, DEADLINE)
        .await
        .expect("the provider registered");
    assert_eq!(registered[0].request.protocol_version, 1);
    task.abort();
}

#[tokio::test]
async fn a_registry_of_version_1_gets_version_1() {
    let registry = TestRegistry::builder().versions(&[1]).start().await;
    let host = TestHost::start_with(registry, Bare).await;
    assert_eq!(host.registration().protocol_version, 1);
}

#[tokio::test]
async fn unimplemented_methods_answer_unimplemented_naming_the_method() {
    let host = TestHost::start(Bare).await;
    let inspect = host
        .inspect(resource("t", "k", json!({})))
        .await
        .unwrap_err();
    assert_eq!(inspect.code(), Code::Unimplemented);
    assert!(
        inspect.message().contains("Inspect"),
        "{}",
        inspect.message()
    );

    let deploy = host
        .deploy(resource("t", "k", json!({})))
        .await
        .unwrap_err();
    assert_eq!(deploy.code(), Code::Unimplemented);
    assert!(
        deploy.message().contains("DeployResource"),
        "{}",
        deploy.message()
    );

    let inventory = host.inventory().await.unwrap_err();
    assert_eq!(inventory.code(), Code::Unimplemented);
    assert!(inventory.message().contains("GetInventory"));

    // Version 2's call: refused the same way unless implemented.
    let update = host
        .update(resource("t", "k", json!({})), json!({}), json!({}))
        .await
        .unwrap_err();
    assert_eq!(update.code(), Code::Unimplemented);
    assert!(
        update.message().contains("UpdateResource"),
        "{}",
        update.message()
    );

    let nodes = host.list_nodes().await.unwrap_err();
    assert!(nodes.message().contains("ListNodes"));
    // Configure is accepted by default: Corbel configures every provider.
    host.configure(json!({ "anything": 1 })).await.unwrap();
}

#[tokio::test]
async fn the_watchdog_stops_the_provider_when_the_registry_says_goodbye() {
    let mut host = TestHost::start(Bare).await;
    let socket = host
        .registration()
        .endpoint
        .trim_start_matches("unix://")
        .to_string();
    assert!(
        host.wait_stopped(Duration::from_millis(100))
            .await
            .is_none()
    );

    host.registry().set_serving(false).await;
    let stopped = host
        .wait_stopped(DEADLINE)
        .await
        .expect("the provider outlived its registry");
    assert!(
        matches!(stopped, Ok(Stopped::RegistryGone(ref why)) if why.contains("NOT_SERVING")),
        "{stopped:?}"
    );
    assert!(
        !std::path::Path::new(&socket).exists(),
        "the socket file is removed"
    );
    assert!(host.registry().unregistrations().is_empty());
}

#[tokio::test]
async fn the_watchdog_stops_the_provider_when_the_registry_dies() {
    let mut host = TestHost::start(Bare).await;
    host.registry().kill();
    let stopped = host
        .wait_stopped(DEADLINE)
        .await
        .expect("the provider outlived its registry");
    assert!(
        matches!(stopped, Ok(Stopped::RegistryGone(_))),
        "{stopped:?}"
    );
}

#[tokio::test]
async fn a_requested_stop_unregisters() {
    let mut host = TestHost::start(Bare).await;
    let socket = host
        .registration()
        .endpoint
        .trim_start_matches("unix://")
        .to_string();
    assert!(host.registry().unregistrations().is_empty());

    assert_eq!(host.stop().await.unwrap(), Stopped::Requested);
    let received = host.registry().unregistrations();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].id, TEST_PROVIDER_ID);
    assert_eq!(received[0].session, host.session());
    assert!(
        !std::path::Path::new(&socket).exists(),
        "the socket file is removed"
    );
}

#[tokio::test]
async fn a_registry_with_no_common_version_is_refused_naming_both_lists() {
    let registry = TestRegistry::builder().versions(&[99]).start().await;
    let result = serve_with(registry.settings("p1"), Bare, std::future::pending()).await;
    let Err(error @ SdkError::HandshakeRefused { code, .. }) = result else {
        panic!("expected a refused handshake, got {result:?}");
    };
    assert_eq!(code, Code::FailedPrecondition);
    let text = error.to_string();
    assert!(
        text.contains("[99]") && text.contains("[1, 2, 3]"),
        "{text}"
    );
    assert_eq!(error.exit_code(), 1);
    assert!(registry.registrations().is_empty());
}

#[tokio::test]
async fn a_wrong_token_is_refused_with_the_registry_message() {
    let registry = TestRegistry::builder().token("right").start().await;
    let mut settings = registry.settings("p1");
    settings.token = "wrong".into();
    let socket = settings.socket_path();
    let result = serve_with(settings, Bare, std::future::pending()).await;
    let Err(SdkError::RegisterRefused { code, message }) = result else {
        panic!("expected a refused registration, got {result:?}");
    };
    assert_eq!(code, Code::PermissionDenied);
    assert!(message.contains("wrong token"), "{message}");
    assert!(!socket.exists(), "the socket is cleaned up");
}
