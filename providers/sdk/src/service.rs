//! The gRPC face of an author's [`Provider`]: turns the generated tonic trait's
//! requests into trait calls, and step results into event streams that end
//! with exactly one `done` or `error`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::exec::ExecOutputs;
use crate::files::FilesSink;
use crate::proto;
use crate::proto::resource_event::Event;
use crate::provider::{
    Events, Failure, InventorySink, Provider, Sink, StatusSink, StepError, StepResult,
};

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Room for events the caller has not read yet; a slow caller slows the step.
const STREAM_BUFFER: usize = 64;

pub(crate) struct ProviderService<P> {
    provider: Arc<P>,
    turns: Arc<Turns>,
}

impl<P> ProviderService<P> {
    pub(crate) fn new(provider: Arc<P>) -> Self {
        ProviderService {
            provider,
            turns: Arc::default(),
        }
    }
}

/// One deploy, update or destroy at a time per `resource_id`, in the order
/// they arrived. A step goes on after its caller hangs up (a lost outcome); the
/// retry, or the destroy, that follows must not overtake it, or a destroy
/// could finish before the lost deploy creates what it then leaves behind.
///
/// Each step, as it arrives, puts its own "finished" signal in the map and
/// takes out the one of the step before it, which it awaits.
#[derive(Default)]
struct Turns {
    last: Mutex<HashMap<String, (u64, oneshot::Receiver<()>)>>,
    arrivals: AtomicU64,
}

/// A step's turn on its resource: ends (and signals the next) when dropped.
struct Turn {
    turns: Arc<Turns>,
    id: String,
    arrival: u64,
    _finished: oneshot::Sender<()>,
}

impl Turns {
    /// Queues for `id` now, so arrival order is kept, and waits for the turn.
    fn take(self: &Arc<Self>, id: String) -> impl Future<Output = Turn> + Send + 'static {
        let arrival = self.arrivals.fetch_add(1, Ordering::Relaxed);
        let (finished, next_waits) = oneshot::channel();
        let before = self
            .last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(id.clone(), (arrival, next_waits));
        let turn = Turn {
            turns: self.clone(),
            id,
            arrival,
            _finished: finished,
        };
        async move {
            if let Some((_, before)) = before {
                // Sent or dropped: either way the step before is over.
                let _ = before.await;
            }
            turn
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut last = self
            .turns
            .last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Nobody came after this step: its entry goes with it.
        if last.get(&self.id).is_some_and(|(a, _)| *a == self.arrival) {
            last.remove(&self.id);
        }
    }
}

/// Waits for a step's turn; one that must wait says so first, so its caller
/// gets the stream's first event at once rather than silence until its turn.
async fn wait_turn(turn: impl Future<Output = Option<Turn>>, events: &Events) -> Option<Turn> {
    use futures_util::FutureExt as _;
    let mut turn = std::pin::pin!(turn);
    if let Some(ready) = (&mut turn).now_or_never() {
        return ready;
    }
    events
        .log("waiting for the call before it on this resource to end")
        .await;
    // No keep-alive while waiting: a step before this one that hangs must
    // make this one miss its deadline too, so the caller gives up on both.
    turn.await
}

impl<P> ProviderService<P> {
    /// The turn of a step on `resource` (none without a resource id).
    fn turn(
        &self,
        resource: Option<&proto::Resource>,
    ) -> impl Future<Output = Option<Turn>> + Send + 'static {
        let queued = resource
            .map(|r| r.resource_id.clone())
            .filter(|id| !id.is_empty())
            .map(|id| self.turns.take(id));
        async move {
            match queued {
                Some(queued) => Some(queued.await),
                None => None,
            }
        }
    }
}

#[tonic::async_trait]
impl<P: Provider> proto::provider_server::Provider for ProviderService<P> {
    async fn configure(
        &self,
        request: Request<proto::ConfigureRequest>,
    ) -> Result<Response<proto::ConfigureResponse>, Status> {
        let text = request.into_inner().config_json;
        let config = if text.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            // The config may hold secrets: the error names the position, never the text.
            serde_json::from_str(&text).map_err(|e| {
                Status::invalid_argument(format!("config_json is not valid JSON: {e}"))
            })?
        };
        self.provider.configure(config).await?;
        Ok(Response::new(proto::ConfigureResponse {}))
    }

    async fn describe_resources(
        &self,
        request: Request<proto::DescribeResourcesRequest>,
    ) -> Result<Response<proto::DescribeResourcesResponse>, Status> {
        let response = self
            .provider
            .describe_resources(request.into_inner())
            .await?;
        Ok(Response::new(response))
    }

    type DeployResourceStream = BoxStream<proto::ResourceEvent>;

    async fn deploy_resource(
        &self,
        request: Request<proto::DeployResourceRequest>,
    ) -> Result<Response<Self::DeployResourceStream>, Status> {
        let request = request.into_inner();
        let provider = self.provider.clone();
        let turn = self.turn(request.resource.as_ref());
        step("DeployResource", move |events| async move {
            let _turn = wait_turn(turn, &events).await;
            provider.deploy_resource(request, events).await
        })
        .await
    }

    type UpdateResourceStream = BoxStream<proto::ResourceEvent>;

    async fn update_resource(
        &self,
        request: Request<proto::UpdateResourceRequest>,
    ) -> Result<Response<Self::UpdateResourceStream>, Status> {
        let request = request.into_inner();
        let provider = self.provider.clone();
        let turn = self.turn(request.resource.as_ref());
        step("UpdateResource", move |events| async move {
            let _turn = wait_turn(turn, &events).await;
            provider.update_resource(request, events).await
        })
        .await
    }

    type DestroyResourceStream = BoxStream<proto::ResourceEvent>;

    async fn destroy_resource(
        &self,
        request: Request<proto::DestroyResourceRequest>,
    ) -> Result<Response<Self::DestroyResourceStream>, Status> {
        let request = request.into_inner();
        let provider = self.provider.clone();
        let turn = self.turn(request.resource.as_ref());
        step("DestroyResource", move |events| async move {
            let _turn = wait_turn(turn, &events).await;
            provider.destroy_resource(request, events).await
        })
        .await
    }

    async fn inspect(
        &self,
        request: Request<proto::InspectRequest>,
    ) -> Result<Response<proto::InspectResponse>, Status> {
        Ok(Response::new(
            self.provider.inspect(request.into_inner()).await?,
        ))
    }

    async fn list_nodes(
        &self,
        _request: Request<proto::ListNodesRequest>,
    ) -> Result<Response<proto::ListNodesResponse>, Status> {
        let nodes = self.provider.list_nodes().await?;
        Ok(Response::new(proto::ListNodesResponse { nodes }))
    }

    async fn retrieve_data(
        &self,
        request: Request<proto::RetrieveDataRequest>,
    ) -> Result<Response<proto::RetrieveDataResponse>, Status> {
        Ok(Response::new(
            self.provider.retrieve_data(request.into_inner()).await?,
        ))
    }

    async fn power(
        &self,
        request: Request<proto::PowerRequest>,
    ) -> Result<Response<proto::PowerResponse>, Status> {
        Ok(Response::new(
            self.provider.power(request.into_inner()).await?,
        ))
    }

    type WatchResourcesStream = BoxStream<proto::ResourceStatus>;

    async fn watch_resources(
        &self,
        request: Request<proto::WatchResourcesRequest>,
    ) -> Result<Response<Self::WatchResourcesStream>, Status> {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let sink = Sink::new(tx);
        let provider = self.provider.clone();
        let author_sink = StatusSink { sink: sink.clone() };
        let request = request.into_inner();
        let work =
            tokio::spawn(async move { provider.watch_resources(request, author_sink).await });
        tokio::spawn(async move {
            let result = work.await.unwrap_or_else(|_| {
                Err(Status::internal("the provider panicked in WatchResources"))
            });
            let (tx, _) = sink.close().await;
            if let (Some(tx), Err(status)) = (tx, result) {
                let _ = tx.send(Err(status)).await;
            }
        });
        open(rx).await.map(Response::new)
    }

    type ExecStream = BoxStream<proto::ExecOutput>;

    async fn exec(
        &self,
        request: Request<tonic::Streaming<proto::ExecInput>>,
    ) -> Result<Response<Self::ExecStream>, Status> {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let sink = Sink::new(tx);
        let outputs = ExecOutputs { sink: sink.clone() };
        let (start, inputs) =
            crate::exec::open_inputs(request.into_inner(), outputs.clone()).await?;
        let provider = self.provider.clone();
        let work = tokio::spawn(async move { provider.exec(start, inputs, outputs).await });
        tokio::spawn(async move {
            let result = work
                .await
                .unwrap_or_else(|_| Err(Status::internal("the provider panicked in Exec")));
            let (tx, _) = sink.close().await;
            if let Some(tx) = tx {
                let last = result.map(|exit| proto::ExecOutput {
                    output: Some(proto::exec_output::Output::Exit(exit)),
                });
                let _ = tx.send(last).await;
            }
        });
        // At once, not at the first output: a command may print nothing
        // until its stdin says something.
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn put_files(
        &self,
        request: Request<tonic::Streaming<proto::FilesInput>>,
    ) -> Result<Response<proto::PutFilesResponse>, Status> {
        let (target, archive) = crate::files::open_archive(request.into_inner()).await?;
        let provider = self.provider.clone();
        tokio::spawn(async move { provider.put_files(target, archive).await })
            .await
            .unwrap_or_else(|_| Err(Status::internal("the provider panicked in PutFiles")))
            .map(Response::new)
    }

    type GetFilesStream = BoxStream<proto::FilesChunk>;

    async fn get_files(
        &self,
        request: Request<proto::GetFilesRequest>,
    ) -> Result<Response<Self::GetFilesStream>, Status> {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let sink = Sink::new(tx);
        let provider = self.provider.clone();
        let author_sink = FilesSink { sink: sink.clone() };
        let request = request.into_inner();
        let work = tokio::spawn(async move { provider.get_files(request, author_sink).await });
        tokio::spawn(async move {
            let result = work
                .await
                .unwrap_or_else(|_| Err(Status::internal("the provider panicked in GetFiles")));
            let (tx, _) = sink.close().await;
            if let (Some(tx), Err(status)) = (tx, result) {
                let _ = tx.send(Err(status)).await;
            }
        });
        open(rx).await.map(Response::new)
    }

    type GetInventoryStream = BoxStream<proto::InventoryEntry>;

    async fn get_inventory(
        &self,
        _request: Request<proto::GetInventoryRequest>,
    ) -> Result<Response<Self::GetInventoryStream>, Status> {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let sink = Sink::new(tx);
        let provider = self.provider.clone();
        let author_sink = InventorySink { sink: sink.clone() };
        let work = tokio::spawn(async move { provider.get_inventory(author_sink).await });
        tokio::spawn(async move {
            let result = work
                .await
                .unwrap_or_else(|_| Err(Status::internal("the provider panicked in GetInventory")));
            let (tx, _) = sink.close().await;
            if let (Some(tx), Err(status)) = (tx, result) {
                let _ = tx.send(Err(status)).await;
            }
        });
        open(rx).await.map(Response::new)
    }

    async fn get_element(
        &self,
        request: Request<proto::GetElementRequest>,
    ) -> Result<Response<proto::GetElementResponse>, Status> {
        Ok(Response::new(
            self.provider.get_element(request.into_inner()).await?,
        ))
    }
}

/// Runs a deploy or destroy in its own task (so a caller hanging up does not
/// cancel it half-way) and streams its events, then its one terminal event.
async fn step<F, Fut>(
    method: &'static str,
    body: F,
) -> Result<Response<BoxStream<proto::ResourceEvent>>, Status>
where
    F: FnOnce(Events) -> Fut,
    Fut: Future<Output = StepResult> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let sink = Sink::new(tx);
    let work = tokio::spawn(body(Events { sink: sink.clone() }));
    tokio::spawn(async move {
        let result = work.await.unwrap_or_else(|_| {
            Err(Failure::new(format!("the provider panicked in {method}")).into())
        });
        let (tx, sent_any) = sink.close().await;
        let Some(tx) = tx else { return };
        let last = match result {
            Ok(outputs) => Ok(done(outputs, method)),
            Err(StepError::Failed(failure)) => Ok(error_event(failure)),
            Err(StepError::Rpc(status)) if sent_any => Ok(error_event(Failure::new(format!(
                "{:?}: {}",
                status.code(),
                status.message()
            )))),
            Err(StepError::Rpc(status)) => Err(status),
        };
        let _ = tx.send(last).await;
    });
    open(rx).await.map(Response::new)
}

fn done(outputs: Value, method: &str) -> proto::ResourceEvent {
    let outputs = match outputs {
        Value::Null => Value::Object(Default::default()),
        Value::Object(map) => Value::Object(map),
        other => {
            return error_event(Failure::new(format!(
                "{method} returned outputs that are not a JSON object: {other}"
            )));
        }
    };
    proto::ResourceEvent {
        event: Some(Event::Done(proto::Done {
            outputs_json: outputs.to_string(),
        })),
    }
}

fn error_event(failure: Failure) -> proto::ResourceEvent {
    proto::ResourceEvent {
        event: Some(Event::Error(proto::Failure {
            message: failure.message,
            retryable: failure.retryable,
        })),
    }
}

/// Waits for the first item or the end, so that a refusal before any item is
/// the call's own status (UNIMPLEMENTED, INVALID_ARGUMENT) and not a stream error.
async fn open<T: Send + 'static>(
    mut rx: mpsc::Receiver<Result<T, Status>>,
) -> Result<BoxStream<T>, Status> {
    match rx.recv().await {
        None => Ok(Box::pin(tokio_stream::empty())),
        Some(Err(status)) => Err(status),
        Some(Ok(first)) => Ok(Box::pin(
            tokio_stream::once(Ok(first)).chain(ReceiverStream::new(rx)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    #[tokio::test]
    async fn steps_on_one_resource_take_turns_in_arrival_order() {
        let turns = Arc::new(Turns::default());
        let first = turns
            .take("a".into())
            .now_or_never()
            .expect("the first step goes at once");
        let mut second = Box::pin(turns.take("a".into()));
        let mut third = Box::pin(turns.take("a".into()));
        // Another resource does not wait.
        let other = turns.take("b".into()).now_or_never();
        assert!(other.is_some());
        drop(other);
        assert!(
            (&mut second).now_or_never().is_none(),
            "waits for the first"
        );
        assert!((&mut third).now_or_never().is_none());
        drop(first);
        let second = (&mut second).now_or_never().expect("its turn came");
        assert!(
            (&mut third).now_or_never().is_none(),
            "waits for the second"
        );
        drop(second);
        let third = (&mut third).now_or_never().expect("its turn came");
        drop(third);
        assert!(turns.last.lock().unwrap().is_empty(), "nothing kept after");
    }
}
