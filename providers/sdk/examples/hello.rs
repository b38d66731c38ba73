//! A complete provider: greetings as resources, kept in memory.
//!
//! Run by Corbel (it sets the `CORBEL_*` environment); `cargo build --examples`
//! builds it.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Mutex;

use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::{
    Events, Failure, Provider, ProviderInfo, Status, StepResult, async_trait, proto,
};

#[derive(Default)]
pub struct Hello {
    /// From `Configure`: the word to greet with.
    salutation: Mutex<String>,
    /// resource_id -> outputs of what was deployed.
    greetings: Mutex<HashMap<String, Value>>,
}

#[async_trait]
impl Provider for Hello {
    fn info(&self) -> ProviderInfo {
        ProviderInfo::new("hello", env!("CARGO_PKG_VERSION"))
            .features(["deploy", "destroy", "inspect"])
            .resource_types(["hello.v1.greeting"])
    }

    async fn configure(&self, config: Value) -> Result<(), Status> {
        let salutation = match config.get("salutation") {
            None => "Hello".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(Status::invalid_argument("salutation: expected a string")),
        };
        *self.salutation.lock().unwrap() = salutation;
        Ok(())
    }

    async fn deploy_resource(
        &self,
        request: proto::DeployResourceRequest,
        events: Events,
    ) -> StepResult {
        let resource = request.resource.unwrap_or_default();
        let config: Value = serde_json_from(&resource.config_json)?;
        let Some(name) = config.get("name").and_then(Value::as_str) else {
            return Err(Failure::new("config.name: missing").into());
        };
        events.progress(50, format!("greeting {name}")).await;
        let salutation = self.salutation.lock().unwrap().clone();
        let outputs = json!({ "greeting": format!("{salutation}, {name}!") });
        self.greetings
            .lock()
            .unwrap()
            .insert(resource.resource_id, outputs.clone());
        Ok(outputs)
    }

    async fn destroy_resource(
        &self,
        request: proto::DestroyResourceRequest,
        events: Events,
    ) -> StepResult {
        let resource = request.resource.unwrap_or_default();
        if self
            .greetings
            .lock()
            .unwrap()
            .remove(&resource.resource_id)
            .is_none()
        {
            events.log("nothing to destroy").await;
        }
        Ok(json!({}))
    }

    async fn inspect(
        &self,
        request: proto::InspectRequest,
    ) -> Result<proto::InspectResponse, Status> {
        let id = request.resource.unwrap_or_default().resource_id;
        Ok(match self.greetings.lock().unwrap().get(&id) {
            Some(outputs) => proto::InspectResponse {
                present: true,
                outputs_json: outputs.to_string(),
            },
            None => proto::InspectResponse::default(),
        })
    }
}

fn serde_json_from(text: &str) -> Result<Value, Failure> {
    corbel_provider_sdk::serde_json::from_str(text)
        .map_err(|e| Failure::new(format!("config is not JSON: {e}")))
}

#[tokio::main]
async fn main() -> ExitCode {
    corbel_provider_sdk::serve(Hello::default()).await
}
