//! A complete provider: greetings as resources, kept in durable records so
//! they outlive the provider's own restarts.
//!
//! Run by Corbel (it sets the `CORBEL_*` environment); `cargo build --examples`
//! builds it.

use std::process::ExitCode;
use std::sync::Mutex;

use corbel_provider_sdk::records::Records;
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::{
    Events, Failure, Provider, ProviderInfo, Status, StepResult, async_trait, proto,
};

pub struct Hello {
    /// From `Configure`: the word to greet with.
    salutation: Mutex<String>,
    /// resource_id -> outputs of what was deployed, on disk.
    greetings: Records,
}

impl Hello {
    pub fn new(greetings: Records) -> Self {
        Hello {
            salutation: Mutex::new("Hello".to_string()),
            greetings,
        }
    }
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
        // Idempotent: a greeting that exists is returned, not made again.
        if let Some(outputs) = self.greetings.read(&resource.resource_id).map_err(retry)? {
            events.log("already deployed").await;
            return Ok(outputs);
        }
        let config: Value = serde_json_from(&resource.config_json)?;
        let Some(name) = config.get("name").and_then(Value::as_str) else {
            return Err(Failure::new("config.name: missing").into());
        };
        events.progress(50, format!("greeting {name}")).await;
        let salutation = self.salutation.lock().unwrap().clone();
        let outputs = json!({ "greeting": format!("{salutation}, {name}!") });
        // Here the record is the resource: this one durable write creates it.
        self.greetings
            .write(&resource.resource_id, &outputs)
            .map_err(retry)?;
        Ok(outputs)
    }

    async fn destroy_resource(
        &self,
        request: proto::DestroyResourceRequest,
        events: Events,
    ) -> StepResult {
        let id = request.resource.unwrap_or_default().resource_id;
        if self.greetings.read::<Value>(&id).map_err(retry)?.is_none() {
            events.log("nothing to destroy").await;
        }
        // Removing what is absent succeeds, as a destroy must.
        self.greetings.remove(&id).map_err(retry)?;
        Ok(json!({}))
    }

    async fn inspect(
        &self,
        request: proto::InspectRequest,
    ) -> Result<proto::InspectResponse, Status> {
        let id = request.resource.unwrap_or_default().resource_id;
        let found: Option<Value> = self
            .greetings
            .read(&id)
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(match found {
            Some(outputs) => proto::InspectResponse {
                present: true,
                outputs_json: outputs.to_string(),
                ..Default::default()
            },
            None => proto::InspectResponse::default(),
        })
    }
}

fn serde_json_from(text: &str) -> Result<Value, Failure> {
    corbel_provider_sdk::serde_json::from_str(text)
        .map_err(|e| Failure::new(format!("config is not JSON: {e}")))
}

/// A disk error may pass: the call can be tried again.
fn retry(error: std::io::Error) -> Failure {
    Failure::retryable(error.to_string())
}

fn main() -> ExitCode {
    // `run` takes Corbel's variables out of the environment before it starts
    // the runtime's threads, so nothing this provider starts inherits them.
    corbel_provider_sdk::run(|env| {
        // `$CORBEL_STATE_DIR/resources`, a directory Corbel keeps for this provider.
        let records = Records::in_state_dir(env.state_dir().unwrap_or_else(|| "./state".into()));
        corbel_provider_sdk::serve_env(env, Hello::new(records))
    })
}
