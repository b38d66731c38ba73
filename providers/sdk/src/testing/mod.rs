//! Test a provider without Corbel.
//!
//! [`TestRegistry`] is a minimal `Registry` on a temporary unix socket, run on
//! its own runtime so that [`TestRegistry::kill`] closes every connection at
//! once, as a SIGKILLed Corbel would. Like Corbel, it handles `Register` by
//! dialing the provider's endpoint, checking its health and sending
//! `Configure`, and it serves `grpc.health.v1` with
//! [`REGISTRY_HEALTH_SERVICE`] SERVING for the provider's watchdog.
//!
//! [`TestHost`] runs the real [`serve_with`] for a provider against a
//! `TestRegistry` and hands out a ready client and typed helpers:
//!
//! ```no_run
//! # use corbel_provider_sdk::{Provider, ProviderInfo, async_trait};
//! # struct Hello;
//! # #[async_trait] impl Provider for Hello { fn info(&self) -> ProviderInfo { ProviderInfo::new("hello", "0") } }
//! use corbel_provider_sdk::testing::{TestHost, outcome, resource};
//! # async fn example() {
//! let host = TestHost::start(Hello).await;
//! let events = host.deploy(resource("hello.v1.greeting", "web", serde_json::json!({}))).await;
//! let outputs = outcome(&events.unwrap()).unwrap();
//! # }
//! ```

mod registry;

use std::time::Duration;

use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Status, Streaming};

pub use registry::{Registered, TestRegistry, TestRegistryBuilder};

use crate::proto::provider_client::ProviderClient;
use crate::proto::resource_event::Event;
use crate::serve::{call, request};
use crate::{SdkError, Stopped, connect, proto, serve_with};

/// The token a [`TestRegistry`] accepts unless told otherwise.
pub const TEST_TOKEN: &str = "test-token";
/// The provider id [`TestHost`] registers as.
pub const TEST_PROVIDER_ID: &str = "test-provider";
/// How long the helpers wait for anything before failing the test.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A provider served by the real [`serve_with`] against a [`TestRegistry`].
/// Dropping it stops the provider.
pub struct TestHost {
    registry: TestRegistry,
    registered: Registered,
    client: ProviderClient<Channel>,
    /// Dropping or sending stops the provider, as SIGTERM does under `serve`.
    stop: Option<oneshot::Sender<()>>,
    provider: Option<JoinHandle<Result<Stopped, SdkError>>>,
}

impl TestHost {
    /// Starts `provider` against a fresh [`TestRegistry`] and waits until it is
    /// registered and configured. Panics with the reason if it is not.
    pub async fn start<P: crate::Provider>(provider: P) -> TestHost {
        Self::start_with(TestRegistry::start().await, provider).await
    }

    /// Like [`start`](Self::start) with a registry built by the test.
    pub async fn start_with<P: crate::Provider>(registry: TestRegistry, provider: P) -> TestHost {
        let before = registry.registrations().len();
        let (stop, stopped) = oneshot::channel::<()>();
        let settings = registry.settings(TEST_PROVIDER_ID);
        let mut task = tokio::spawn(serve_with(settings, provider, async move {
            let _ = stopped.await;
        }));
        let registered = tokio::select! {
            list = registry.wait_for_registrations(before + 1, DEADLINE) => {
                let list = list.unwrap_or_else(|| panic!("the provider did not register within {DEADLINE:?}"));
                list[before].clone()
            }
            result = &mut task => panic!("the provider stopped before it registered: {result:?}"),
        };
        let channel = connect(&registered.request.endpoint, DEADLINE)
            .await
            .unwrap_or_else(|e| panic!("cannot dial the provider: {e}"));
        TestHost {
            registry,
            registered,
            client: ProviderClient::new(channel),
            stop: Some(stop),
            provider: Some(task),
        }
    }

    /// A client connected to the provider's endpoint.
    pub fn client(&self) -> ProviderClient<Channel> {
        self.client.clone()
    }

    /// The `RegisterRequest` the registry accepted (token blanked).
    pub fn registration(&self) -> &proto::RegisterRequest {
        &self.registered.request
    }

    /// The session the registry gave the provider.
    pub fn session(&self) -> &str {
        &self.registered.session
    }

    pub fn registry(&self) -> &TestRegistry {
        &self.registry
    }

    pub async fn configure(&self, config: Value) -> Result<(), Status> {
        let message = proto::ConfigureRequest {
            config_json: config.to_string(),
        };
        call(
            DEADLINE,
            self.client().configure(request(message, DEADLINE)),
        )
        .await?;
        Ok(())
    }

    /// Deploys `resource` (no dependency outputs) and collects every event.
    pub async fn deploy(
        &self,
        resource: proto::Resource,
    ) -> Result<Vec<proto::ResourceEvent>, Status> {
        let message = proto::DeployResourceRequest {
            resource: Some(resource),
            dependency_outputs_json: Default::default(),
        };
        let stream = call(
            DEADLINE,
            self.client().deploy_resource(request(message, DEADLINE)),
        )
        .await?;
        collect(stream).await
    }

    /// Updates `resource` (its new config) in place from `previous_config`,
    /// with the `outputs` recorded for it (no dependency outputs), and
    /// collects every event.
    pub async fn update(
        &self,
        resource: proto::Resource,
        previous_config: Value,
        outputs: Value,
    ) -> Result<Vec<proto::ResourceEvent>, Status> {
        let message = proto::UpdateResourceRequest {
            resource: Some(resource),
            previous_config_json: previous_config.to_string(),
            outputs_json: outputs.to_string(),
            dependency_outputs_json: Default::default(),
        };
        let stream = call(
            DEADLINE,
            self.client().update_resource(request(message, DEADLINE)),
        )
        .await?;
        collect(stream).await
    }

    /// Destroys `resource`, deployed with `outputs`, and collects every event.
    pub async fn destroy(
        &self,
        resource: proto::Resource,
        outputs: Value,
    ) -> Result<Vec<proto::ResourceEvent>, Status> {
        let message = proto::DestroyResourceRequest {
            resource: Some(resource),
            outputs_json: outputs.to_string(),
        };
        let stream = call(
            DEADLINE,
            self.client().destroy_resource(request(message, DEADLINE)),
        )
        .await?;
        collect(stream).await
    }

    pub async fn inspect(
        &self,
        resource: proto::Resource,
    ) -> Result<proto::InspectResponse, Status> {
        let message = proto::InspectRequest {
            resource: Some(resource),
        };
        call(DEADLINE, self.client().inspect(request(message, DEADLINE))).await
    }

    pub async fn list_nodes(&self) -> Result<Vec<proto::Node>, Status> {
        let message = proto::ListNodesRequest {};
        let response = call(
            DEADLINE,
            self.client().list_nodes(request(message, DEADLINE)),
        )
        .await?;
        Ok(response.nodes)
    }

    /// Opens `WatchResources` on `resources`: the stream, to read with
    /// `message().await` (no deadline: it lasts until dropped).
    pub async fn watch(
        &self,
        resources: Vec<proto::Resource>,
    ) -> Result<tonic::Streaming<proto::ResourceStatus>, Status> {
        let message = proto::WatchResourcesRequest { resources };
        call(DEADLINE, self.client().watch_resources(message)).await
    }

    pub async fn inventory(&self) -> Result<Vec<proto::InventoryEntry>, Status> {
        let message = proto::GetInventoryRequest {};
        let stream = call(
            DEADLINE,
            self.client().get_inventory(request(message, DEADLINE)),
        )
        .await?;
        collect(stream).await
    }

    /// The manifest of `name@version`.
    pub async fn get_element(&self, name: &str, version: &str) -> Result<String, Status> {
        let message = proto::GetElementRequest {
            name: name.to_string(),
            version: version.to_string(),
        };
        let response = call(
            DEADLINE,
            self.client().get_element(request(message, DEADLINE)),
        )
        .await?;
        Ok(response.manifest_yaml)
    }

    /// Stops the provider as SIGTERM would (it unregisters) and returns how
    /// `serve_with` ended. The registry stays up for inspection.
    pub async fn stop(&mut self) -> Result<Stopped, SdkError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.wait_stopped(DEADLINE)
            .await
            .unwrap_or_else(|| panic!("the provider did not stop within {DEADLINE:?}"))
    }

    /// Waits for the provider to stop on its own (e.g. its watchdog); `None`
    /// if it is still running after `timeout`.
    pub async fn wait_stopped(&mut self, timeout: Duration) -> Option<Result<Stopped, SdkError>> {
        let task = self.provider.as_mut()?;
        let joined = tokio::time::timeout(timeout, task).await.ok()?;
        self.provider = None;
        Some(joined.unwrap_or_else(|e| panic!("the provider task failed: {e}")))
    }
}

async fn collect<T>(mut stream: Streaming<T>) -> Result<Vec<T>, Status> {
    let mut items = Vec::new();
    loop {
        match tokio::time::timeout(DEADLINE, stream.message()).await {
            Ok(Ok(Some(item))) => items.push(item),
            Ok(Ok(None)) => return Ok(items),
            Ok(Err(status)) => return Err(status),
            Err(_) => return Err(Status::deadline_exceeded("the stream stalled")),
        }
    }
}

/// A resource whose `resource_id` is its key.
pub fn resource(kind: &str, key: &str, config: Value) -> proto::Resource {
    proto::Resource {
        key: key.to_string(),
        r#type: kind.to_string(),
        config_json: config.to_string(),
        resource_id: key.to_string(),
        node: String::new(),
        deployment_id: String::new(),
    }
}

/// The outputs of a deploy or destroy stream, or its failure. Panics unless
/// the stream ends with exactly one `done` or `error`.
pub fn outcome(events: &[proto::ResourceEvent]) -> Result<Value, proto::Failure> {
    let terminal =
        |e: &proto::ResourceEvent| matches!(e.event, Some(Event::Done(_) | Event::Error(_)));
    let count = events.iter().filter(|e| terminal(e)).count();
    assert_eq!(
        count, 1,
        "expected exactly one done or error event: {events:?}"
    );
    match events.last().and_then(|e| e.event.clone()) {
        Some(Event::Done(done)) => Ok(serde_json::from_str(&done.outputs_json)
            .unwrap_or_else(|e| panic!("outputs are not JSON ({e}): {}", done.outputs_json))),
        Some(Event::Error(failure)) => Err(failure),
        _ => panic!("the done or error event is not the last one: {events:?}"),
    }
}

/// The progress messages and log lines of a stream, in order.
pub fn messages(events: &[proto::ResourceEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Some(Event::Progress(p)) => Some(p.message.clone()),
            Some(Event::Log(l)) => Some(l.line.clone()),
            _ => None,
        })
        .collect()
}
