//! The trait a provider author implements, and the small types around it:
//! what the provider announces, how a deploy reports progress, and how a step
//! fails.
//!
//! Requests and responses are the protocol's prost messages (re-exported as
//! [`proto`](crate::proto)); configurations and outputs are `serde_json::Value`
//! so an author never handles JSON strings.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::{Mutex, mpsc};
use tonic::Status;

use crate::exec::{ExecInputs, ExecOutputs};
use crate::files::{FilesArchive, FilesSink};
use crate::proto;

/// What a provider announces when it registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderInfo {
    /// The provider's own name, e.g. "process" (informational).
    pub name: String,
    /// The provider's own version, e.g. `env!("CARGO_PKG_VERSION")` (informational).
    pub version: String,
    /// What it can do: "deploy", "destroy", "inspect", "nodes", "data", "power",
    /// "repository". Corbel ignores names it does not know.
    pub features: Vec<String>,
    /// Resource types it handles, e.g. "process.v1.service".
    pub resource_types: Vec<String>,
}

impl ProviderInfo {
    /// An info with no features and no resource types yet.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        ProviderInfo {
            name: name.into(),
            version: version.into(),
            features: Vec::new(),
            resource_types: Vec::new(),
        }
    }

    /// Adds features.
    pub fn features<I: IntoIterator<Item = S>, S: Into<String>>(mut self, features: I) -> Self {
        self.features.extend(features.into_iter().map(Into::into));
        self
    }

    /// Adds resource types.
    pub fn resource_types<I: IntoIterator<Item = S>, S: Into<String>>(mut self, types: I) -> Self {
        self.resource_types
            .extend(types.into_iter().map(Into::into));
        self
    }
}

/// The registration Corbel accepted, given to [`Provider::registered`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub provider_id: String,
    pub session: String,
    pub protocol_version: u32,
    /// `unix://<absolute socket path>`.
    pub endpoint: String,
}

/// A deploy, update or destroy that did not succeed: sent as the stream's
/// `error` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub message: String,
    /// Whether trying again may succeed (a busy port, a timeout) or not (a bad config).
    pub retryable: bool,
}

impl Failure {
    /// A failure a retry will not fix.
    pub fn new(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            retryable: false,
        }
    }

    /// A failure a retry may fix.
    pub fn retryable(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            retryable: true,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// How a deploy or destroy ends when it does not return outputs.
///
/// `Failed` is the normal case: the stream ends with an `error` event. `Rpc`
/// refuses the call itself with a gRPC status (e.g. UNIMPLEMENTED) when it
/// comes before any event; after events were sent it becomes an `error` event
/// too, so a stream always ends with exactly one `done` or `error`.
#[derive(Debug)]
pub enum StepError {
    Failed(Failure),
    Rpc(Status),
}

impl From<Failure> for StepError {
    fn from(failure: Failure) -> Self {
        StepError::Failed(failure)
    }
}

impl From<Status> for StepError {
    fn from(status: Status) -> Self {
        StepError::Rpc(status)
    }
}

/// A deploy's or destroy's result: its outputs (a JSON object) or why not.
pub type StepResult = Result<Value, StepError>;

/// A provider: one method per `Provider` RPC, each answering UNIMPLEMENTED
/// (naming the method) unless overridden — except `configure`, which accepts
/// any configuration, because Corbel configures every provider it registers.
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// Name, version, features and resource types announced in `Register`.
    fn info(&self) -> ProviderInfo;

    /// Called once Corbel accepted the registration (after its `Configure`).
    async fn registered(&self, _registration: &Registration) {}

    /// The provider's configuration (a JSON object), sent after registration and
    /// again whenever it changes. It may hold secrets: do not log it. Answer
    /// INVALID_ARGUMENT naming the key for a value of the wrong type.
    async fn configure(&self, _config: Value) -> Result<(), Status> {
        Ok(())
    }

    async fn describe_resources(
        &self,
        _request: proto::DescribeResourcesRequest,
    ) -> Result<proto::DescribeResourcesResponse, Status> {
        Err(unimplemented("DescribeResources"))
    }

    /// Creates one resource. Report steps through `events`; return the outputs.
    async fn deploy_resource(
        &self,
        _request: proto::DeployResourceRequest,
        _events: Events,
    ) -> StepResult {
        Err(unimplemented("DeployResource").into())
    }

    /// Protocol version 2: changes one deployed resource in place to
    /// `request.resource`'s config, from `request.previous_config_json`;
    /// returns its new outputs. Corbel calls it only when every top-level key
    /// that changed is one `describe_resources` listed in `updatable_keys`.
    /// Idempotent: updating to the config the resource already has succeeds
    /// with its outputs. Answer NOT_FOUND when the resource is gone. Like a
    /// deploy, it takes its turn on the resource after any deploy, update or
    /// destroy of the same `resource_id` that arrived before it.
    async fn update_resource(
        &self,
        _request: proto::UpdateResourceRequest,
        _events: Events,
    ) -> StepResult {
        Err(unimplemented("UpdateResource").into())
    }

    /// Destroys one resource. Destroying something already gone should succeed.
    async fn destroy_resource(
        &self,
        _request: proto::DestroyResourceRequest,
        _events: Events,
    ) -> StepResult {
        Err(unimplemented("DestroyResource").into())
    }

    async fn inspect(
        &self,
        _request: proto::InspectRequest,
    ) -> Result<proto::InspectResponse, Status> {
        Err(unimplemented("Inspect"))
    }

    async fn list_nodes(&self) -> Result<Vec<proto::Node>, Status> {
        Err(unimplemented("ListNodes"))
    }

    async fn retrieve_data(
        &self,
        _request: proto::RetrieveDataRequest,
    ) -> Result<proto::RetrieveDataResponse, Status> {
        Err(unimplemented("RetrieveData"))
    }

    async fn power(&self, _request: proto::PowerRequest) -> Result<proto::PowerResponse, Status> {
        Err(unimplemented("Power"))
    }

    /// Protocol version 3, for the "watch" feature: report the health of
    /// every resource of `request` into `sink`, then a `synced` status, then
    /// every change of any resource this provider manages, until the sink
    /// closes (Corbel hung up). A [`HealthBoard`](crate::HealthBoard) does
    /// all of it: `self.board.serve(request, sink).await`.
    async fn watch_resources(
        &self,
        _request: proto::WatchResourcesRequest,
        _sink: StatusSink,
    ) -> Result<(), Status> {
        Err(unimplemented("WatchResources"))
    }

    /// For the "exec" feature: runs `start.command` in the context of the
    /// resource `start.resource` (its environment, working directory and
    /// confinement, or inside its container) and answers its exit. Output
    /// goes to `outputs` as it comes; `inputs` brings stdin, resizes and
    /// [`ExecInput::HungUp`](crate::ExecInput::HungUp), after which the
    /// command must be killed, with what it started. Kill it too after
    /// `start.timeout_seconds` (when not 0), answering `timed_out`.
    /// NOT_FOUND when the resource is gone, FAILED_PRECONDITION when it does
    /// not run.
    async fn exec(
        &self,
        _start: proto::ExecStart,
        _inputs: ExecInputs,
        _outputs: ExecOutputs,
    ) -> Result<proto::ExecExit, Status> {
        Err(unimplemented("Exec"))
    }

    /// For the "files" feature: extracts the tar archive `archive` brings
    /// into the directory `target.path` of `target.resource`, as the resource
    /// would write it, and answers the bytes extracted. Corbel has checked
    /// the archive (regular files and directories, no path climbing out).
    async fn put_files(
        &self,
        _target: proto::FilesTarget,
        _archive: FilesArchive,
    ) -> Result<proto::PutFilesResponse, Status> {
        Err(unimplemented("PutFiles"))
    }

    /// For the "files" feature: sends `request.path` of `request.resource`
    /// into `sink` as one tar archive whose top entry is the path's last name.
    async fn get_files(
        &self,
        _request: proto::GetFilesRequest,
        _sink: FilesSink,
    ) -> Result<(), Status> {
        Err(unimplemented("GetFiles"))
    }

    /// For the "repository" feature: send every element version into `sink`.
    async fn get_inventory(&self, _sink: InventorySink) -> Result<(), Status> {
        Err(unimplemented("GetInventory"))
    }

    async fn get_element(
        &self,
        _request: proto::GetElementRequest,
    ) -> Result<proto::GetElementResponse, Status> {
        Err(unimplemented("GetElement"))
    }
}

fn unimplemented(method: &str) -> Status {
    Status::unimplemented(format!("this provider does not implement {method}"))
}

/// The sending half of a response stream, shared by an author's clones and
/// closed by the SDK before it sends the last item, so nothing can follow it.
pub(crate) struct Sink<T> {
    tx: Mutex<Option<mpsc::Sender<Result<T, Status>>>>,
    sent_any: AtomicBool,
}

impl<T> Sink<T> {
    pub(crate) fn new(tx: mpsc::Sender<Result<T, Status>>) -> Arc<Self> {
        Arc::new(Sink {
            tx: Mutex::new(Some(tx)),
            sent_any: AtomicBool::new(false),
        })
    }

    /// Sends one item; a closed stream (the caller went away) swallows it.
    pub(crate) async fn send(&self, item: T) {
        if let Some(tx) = self.tx.lock().await.as_ref()
            && tx.send(Ok(item)).await.is_ok()
        {
            self.sent_any.store(true, Ordering::SeqCst);
        }
    }

    /// Whether the caller hung up (or the step ended).
    pub(crate) async fn is_closed(&self) -> bool {
        match self.tx.lock().await.as_ref() {
            Some(tx) => tx.is_closed(),
            None => true,
        }
    }

    /// Resolves when the caller hung up (or the step ended).
    pub(crate) async fn closed(&self) {
        let tx = self.tx.lock().await.clone();
        if let Some(tx) = tx {
            tx.closed().await;
        }
    }

    /// Closes the stream for the author and hands back the sender for the end.
    pub(crate) async fn close(&self) -> (Option<mpsc::Sender<Result<T, Status>>>, bool) {
        let tx = self.tx.lock().await.take();
        (tx, self.sent_any.load(Ordering::SeqCst))
    }
}

/// Progress and log lines of a running deploy or destroy. Cheap to clone;
/// events sent after the step returned are dropped.
#[derive(Clone)]
pub struct Events {
    pub(crate) sink: Arc<Sink<proto::ResourceEvent>>,
}

impl Events {
    /// A progress event; `percent` is capped at 100.
    pub async fn progress(&self, percent: u32, message: impl Into<String>) {
        self.send(proto::resource_event::Event::Progress(proto::Progress {
            percent: percent.min(100),
            message: message.into(),
        }))
        .await;
    }

    /// Says the step is still going, with nothing for Corbel to record: a
    /// progress event with an empty message. A step that may stay silent
    /// longer than Corbel's `call_timeout_ms` (a job running to its end)
    /// sends one every few seconds, since Corbel gives up on a stream that
    /// long silent.
    pub async fn keep_alive(&self) {
        self.send(proto::resource_event::Event::Progress(proto::Progress {
            percent: 0,
            message: String::new(),
        }))
        .await;
    }

    /// A log line.
    pub async fn log(&self, line: impl Into<String>) {
        self.send(proto::resource_event::Event::Log(proto::Log {
            line: line.into(),
        }))
        .await;
    }

    async fn send(&self, event: proto::resource_event::Event) {
        self.sink
            .send(proto::ResourceEvent { event: Some(event) })
            .await;
    }
}

/// Where `get_inventory` sends its entries.
#[derive(Clone)]
pub struct InventorySink {
    pub(crate) sink: Arc<Sink<proto::InventoryEntry>>,
}

impl InventorySink {
    pub async fn send(&self, entry: proto::InventoryEntry) {
        self.sink.send(entry).await;
    }
}

/// Where `watch_resources` sends statuses.
#[derive(Clone)]
pub struct StatusSink {
    pub(crate) sink: Arc<Sink<proto::ResourceStatus>>,
}

impl StatusSink {
    /// Sends one status; false once Corbel hung up (stop watching then).
    pub async fn send(&self, status: proto::ResourceStatus) -> bool {
        self.sink.send(status).await;
        !self.sink.is_closed().await
    }

    /// Resolves when Corbel hung up.
    pub async fn closed(&self) {
        self.sink.closed().await;
    }
}
