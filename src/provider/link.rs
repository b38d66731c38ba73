//! The link: Corbel's client to one registered provider. Every call carries a
//! deadline, both as the gRPC timeout the provider sees and as a local timer, so
//! a provider that hangs costs its caller the deadline and a clear error, never
//! a stuck request. `DeployResource`, `UpdateResource` and `DestroyResource`
//! carry the longer resource deadline for the whole call, stream included; each
//! of their events must also come within the call deadline of the one before.
//! A link knows the protocol version its provider agreed on, so a call and the
//! version it depends on are always read together.
//!
//! It never knows about slots, statuses or the database: callers decide what a
//! failed call means.

use std::future::Future;
use std::time::Duration;

use corbel_proto::v1::provider_client::ProviderClient;
use corbel_proto::v1::{self as proto};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Why a call through the link failed, in words for the user.
#[derive(Clone, Debug, thiserror::Error)]
pub enum LinkError {
    #[error("provider did not answer {call} within {}ms", after.as_millis())]
    Deadline { call: &'static str, after: Duration },
    #[error("provider refused {call}: {message}")]
    Refused {
        call: &'static str,
        code: tonic::Code,
        message: String,
    },
    #[error("cannot reach the provider at {endpoint}: {message}")]
    Unreachable { endpoint: String, message: String },
}

/// A connected provider.
#[derive(Clone)]
pub struct Link {
    client: ProviderClient<Channel>,
    health: HealthClient<Channel>,
    deadline: Duration,
    /// Of a whole `DeployResource`, `UpdateResource` or `DestroyResource`,
    /// events included.
    resource_deadline: Duration,
    /// The version agreed in the handshake and named in `Register` (1 until
    /// the registration sets it): what the provider may be sent.
    protocol_version: u32,
}

impl Link {
    /// Dials `endpoint` (`unix:///…` or `http://127.0.0.1:…`).
    pub async fn dial(
        endpoint: &str,
        deadline: Duration,
        resource_deadline: Duration,
    ) -> Result<Link, LinkError> {
        Self::dial_with(endpoint, None, deadline, resource_deadline).await
    }

    /// Dials `endpoint`, over TLS when `tls` is given (a remote provider's
    /// `https://…`).
    pub async fn dial_with(
        endpoint: &str,
        tls: Option<ClientTlsConfig>,
        deadline: Duration,
        resource_deadline: Duration,
    ) -> Result<Link, LinkError> {
        let unreachable = |message: String| LinkError::Unreachable {
            endpoint: endpoint.to_owned(),
            message,
        };
        let mut dialled = Endpoint::from_shared(endpoint.to_owned())
            .map_err(|e| unreachable(e.to_string()))?
            .connect_timeout(deadline);
        if let Some(tls) = tls {
            dialled = dialled
                .tls_config(tls)
                .map_err(|e| unreachable(crate::error_chain(&e)))?;
        }
        let channel = dialled
            .connect()
            .await
            .map_err(|e| unreachable(crate::error_chain(&e)))?;
        Ok(Link {
            client: ProviderClient::new(channel.clone())
                .max_decoding_message_size(64 * 1024 * 1024),
            health: HealthClient::new(channel),
            deadline,
            resource_deadline,
            protocol_version: 1,
        })
    }

    /// The same link, for a provider that registered with `version`.
    pub fn with_protocol_version(mut self, version: u32) -> Link {
        self.protocol_version = version;
        self
    }

    /// The protocol version the provider registered with.
    pub fn protocol_version(&self) -> u32 {
        self.protocol_version
    }

    /// The same link with another deadline for its calls.
    pub fn with_deadline(mut self, deadline: Duration) -> Link {
        self.deadline = deadline;
        self
    }

    /// The provider's overall health (`grpc.health.v1`, service ""), asked
    /// with its own deadline (`within`; the link's when `None`).
    pub async fn check_health(&self, within: Option<Duration>) -> Result<(), LinkError> {
        self.check_service_health("", within).await
    }

    /// The health of one `service` of the provider's `grpc.health.v1`.
    pub async fn check_service_health(
        &self,
        service: &str,
        within: Option<Duration>,
    ) -> Result<(), LinkError> {
        let mut health = self.health.clone();
        let answer = self
            .call_within(
                "Health.Check",
                within.unwrap_or(self.deadline),
                |request| async move { health.check(request).await },
                HealthCheckRequest {
                    service: service.to_owned(),
                },
            )
            .await?;
        match answer.status() {
            ServingStatus::Serving => Ok(()),
            other => Err(LinkError::Refused {
                call: "Health.Check",
                code: tonic::Code::Unavailable,
                message: format!("health is {}", other.as_str_name()),
            }),
        }
    }

    /// Follows the provider's `grpc.health.v1` `Watch` (service ""), and
    /// returns what ended it once the provider stops `SERVING` or the stream
    /// breaks: the connection closed (the process died, even by SIGKILL,
    /// and its socket with it) or HTTP/2 keepalive found it dead. Never
    /// returns for a provider that does not serve `Watch`: its checks alone
    /// tell then.
    pub async fn health_lost(&self) -> String {
        let mut health = self.health.clone();
        let request = HealthCheckRequest {
            service: String::new(),
        };
        let mut stream = match health.watch(request).await {
            Ok(answer) => answer.into_inner(),
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                return std::future::pending().await;
            }
            Err(status) => return format!("the health watch failed: {}", status.message()),
        };
        loop {
            match stream.message().await {
                Ok(Some(answer)) if answer.status() == ServingStatus::Serving => {}
                Ok(Some(answer)) => {
                    return format!("the health watch says {}", answer.status().as_str_name());
                }
                Ok(None) => return "the health watch ended".to_owned(),
                Err(status) => return format!("the health watch broke: {}", status.message()),
            }
        }
    }

    pub async fn configure(&self, config_json: String) -> Result<(), LinkError> {
        let mut client = self.client.clone();
        self.call(
            "Configure",
            |request| async move { client.configure(request).await },
            proto::ConfigureRequest { config_json },
        )
        .await
        .map(drop)
    }

    pub async fn list_nodes(&self) -> Result<Vec<proto::Node>, LinkError> {
        let mut client = self.client.clone();
        self.call(
            "ListNodes",
            |request| async move { client.list_nodes(request).await },
            proto::ListNodesRequest {},
        )
        .await
        .map(|r| r.nodes)
    }

    pub async fn get_element(
        &self,
        name: &str,
        version: &str,
    ) -> Result<proto::GetElementResponse, LinkError> {
        let mut client = self.client.clone();
        self.call(
            "GetElement",
            |request| async move { client.get_element(request).await },
            proto::GetElementRequest {
                name: name.to_owned(),
                version: version.to_owned(),
            },
        )
        .await
    }

    /// Opens the inventory stream. The deadline covers opening it; each entry
    /// then has `deadline` to arrive (see [`Link::next`]).
    pub async fn get_inventory(
        &self,
    ) -> Result<tonic::Streaming<proto::InventoryEntry>, LinkError> {
        let mut client = self.client.clone();
        self.call(
            "GetInventory",
            |request| async move { client.get_inventory(request).await },
            proto::GetInventoryRequest {},
        )
        .await
    }

    /// Opens the health watch (protocol version 3). Opening has the call
    /// deadline; the stream has none: it lasts while both sides do.
    pub async fn watch_resources(
        &self,
        request: proto::WatchResourcesRequest,
    ) -> Result<tonic::Streaming<proto::ResourceStatus>, LinkError> {
        let mut client = self.client.clone();
        let open = client.watch_resources(tonic::Request::new(request));
        match tokio::time::timeout(self.deadline, open).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(refused("WatchResources", &status)),
            Err(_) => Err(LinkError::Deadline {
                call: "WatchResources",
                after: self.deadline,
            }),
        }
    }

    /// Opens an exec (the "exec" feature) with `inputs`, `start` first.
    /// Opening has the call deadline; the stream has none.
    pub async fn exec(
        &self,
        inputs: impl tokio_stream::Stream<Item = proto::ExecInput> + Send + 'static,
    ) -> Result<tonic::Streaming<proto::ExecOutput>, LinkError> {
        let mut client = self.client.clone();
        let open = client.exec(tonic::Request::new(inputs));
        match tokio::time::timeout(self.deadline, open).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(refused("Exec", &status)),
            Err(_) => Err(LinkError::Deadline {
                call: "Exec",
                after: self.deadline,
            }),
        }
    }

    /// `PutFiles` (the "files" feature) with `inputs`, `target` first: the
    /// whole upload has the resource deadline.
    pub async fn put_files(
        &self,
        inputs: impl tokio_stream::Stream<Item = proto::FilesInput> + Send + 'static,
    ) -> Result<proto::PutFilesResponse, LinkError> {
        let mut client = self.client.clone();
        let mut request = tonic::Request::new(inputs);
        request.set_timeout(self.resource_deadline);
        match tokio::time::timeout(self.resource_deadline, client.put_files(request)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(refused("PutFiles", &status)),
            Err(_) => Err(LinkError::Deadline {
                call: "PutFiles",
                after: self.resource_deadline,
            }),
        }
    }

    /// Opens `GetFiles` (the "files" feature): opening has the call
    /// deadline, the archive's stream none.
    pub async fn get_files(
        &self,
        request: proto::GetFilesRequest,
    ) -> Result<tonic::Streaming<proto::FilesChunk>, LinkError> {
        let mut client = self.client.clone();
        let open = client.get_files(tonic::Request::new(request));
        match tokio::time::timeout(self.deadline, open).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(refused("GetFiles", &status)),
            Err(_) => Err(LinkError::Deadline {
                call: "GetFiles",
                after: self.deadline,
            }),
        }
    }

    /// The deadline of a whole `DeployResource`, `UpdateResource` or
    /// `DestroyResource`.
    pub fn resource_deadline(&self) -> Duration {
        self.resource_deadline
    }

    /// Starts deploying one resource; its events follow on the stream.
    pub async fn deploy_resource(
        &self,
        request: proto::DeployResourceRequest,
    ) -> Result<tonic::Streaming<proto::ResourceEvent>, LinkError> {
        let mut client = self.client.clone();
        let request = self.resource_request(request);
        self.open_stream("DeployResource", client.deploy_resource(request))
            .await
    }

    /// Starts updating one resource in place (protocol version 2; the caller
    /// checks the version); its events follow on the stream.
    pub async fn update_resource(
        &self,
        request: proto::UpdateResourceRequest,
    ) -> Result<tonic::Streaming<proto::ResourceEvent>, LinkError> {
        let mut client = self.client.clone();
        let request = self.resource_request(request);
        self.open_stream("UpdateResource", client.update_resource(request))
            .await
    }

    /// Starts destroying one resource; its events follow on the stream.
    pub async fn destroy_resource(
        &self,
        request: proto::DestroyResourceRequest,
    ) -> Result<tonic::Streaming<proto::ResourceEvent>, LinkError> {
        let mut client = self.client.clone();
        let request = self.resource_request(request);
        self.open_stream("DestroyResource", client.destroy_resource(request))
            .await
    }

    /// The provider sees the resource deadline as the call's gRPC timeout: it
    /// bounds the whole step, so the provider can give up when Corbel will.
    fn resource_request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.resource_deadline);
        request
    }

    /// Opening a stream (the answer's headers) has the call deadline.
    async fn open_stream<T>(
        &self,
        call: &'static str,
        open: impl Future<Output = Result<tonic::Response<tonic::Streaming<T>>, tonic::Status>>,
    ) -> Result<tonic::Streaming<T>, LinkError> {
        let deadline = self.deadline.min(self.resource_deadline);
        match tokio::time::timeout(deadline, open).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) if is_deadline(&status) => Err(LinkError::Deadline {
                call,
                after: self.resource_deadline,
            }),
            Ok(Err(status)) => Err(refused(call, &status)),
            Err(_) => Err(LinkError::Deadline {
                call,
                after: deadline,
            }),
        }
    }

    pub async fn inspect(
        &self,
        resource: proto::Resource,
    ) -> Result<proto::InspectResponse, LinkError> {
        let mut client = self.client.clone();
        self.call(
            "Inspect",
            |request| async move { client.inspect(request).await },
            proto::InspectRequest {
                resource: Some(resource),
            },
        )
        .await
    }

    /// A power action on a deployed resource. Stopping a container takes its
    /// grace period, so the call gets the resource deadline, not the call one.
    pub async fn power(
        &self,
        resource: proto::Resource,
        action: proto::PowerAction,
    ) -> Result<(), LinkError> {
        let mut client = self.client.clone();
        self.call_within(
            "Power",
            self.resource_deadline,
            |request| async move { client.power(request).await },
            proto::PowerRequest {
                resource: Some(resource),
                action: action as i32,
            },
        )
        .await
        .map(drop)
    }

    /// Data the provider reads: of a deployed resource (`resource`), or of a
    /// data source's type.
    pub async fn retrieve_data(
        &self,
        r#type: &str,
        config_json: String,
        resource: Option<proto::Resource>,
    ) -> Result<String, LinkError> {
        let mut client = self.client.clone();
        self.call(
            "RetrieveData",
            |request| async move { client.retrieve_data(request).await },
            proto::RetrieveDataRequest {
                r#type: r#type.to_owned(),
                config_json,
                resource,
            },
        )
        .await
        .map(|r| r.data_json)
    }

    pub async fn describe_resources(
        &self,
        resources: Vec<proto::Resource>,
    ) -> Result<Vec<proto::ResourceDescription>, LinkError> {
        let mut client = self.client.clone();
        self.call(
            "DescribeResources",
            |request| async move { client.describe_resources(request).await },
            proto::DescribeResourcesRequest { resources },
        )
        .await
        .map(|r| r.descriptions)
    }

    /// The next message of a stream, bounded by the deadline.
    pub async fn next<T>(
        &self,
        call: &'static str,
        stream: &mut tonic::Streaming<T>,
    ) -> Result<Option<T>, LinkError> {
        match tokio::time::timeout(self.deadline, stream.message()).await {
            Ok(Ok(item)) => Ok(item),
            Ok(Err(status)) if is_deadline(&status) => Err(LinkError::Deadline {
                call,
                after: self.resource_deadline,
            }),
            Ok(Err(status)) => Err(refused(call, &status)),
            Err(_) => Err(LinkError::Deadline {
                call,
                after: self.deadline,
            }),
        }
    }

    /// One unary call with the deadline set on the request and enforced here.
    async fn call<Req, Resp, F, Fut>(
        &self,
        call: &'static str,
        send: F,
        message: Req,
    ) -> Result<Resp, LinkError>
    where
        F: FnOnce(tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        self.call_within(call, self.deadline, send, message).await
    }

    async fn call_within<Req, Resp, F, Fut>(
        &self,
        call: &'static str,
        deadline: Duration,
        send: F,
        message: Req,
    ) -> Result<Resp, LinkError>
    where
        F: FnOnce(tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let mut request = tonic::Request::new(message);
        request.set_timeout(deadline);
        let started = std::time::Instant::now();
        let result = self.finish(
            call,
            deadline,
            tokio::time::timeout(deadline, send(request)).await,
        );
        crate::telemetry::record_provider_call(
            call,
            outcome_of(&result),
            started.elapsed().as_secs_f64(),
        );
        result
    }

    fn finish<Resp>(
        &self,
        call: &'static str,
        deadline: Duration,
        answer: Result<Result<tonic::Response<Resp>, tonic::Status>, tokio::time::error::Elapsed>,
    ) -> Result<Resp, LinkError> {
        match answer {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) if is_deadline(&status) => Err(LinkError::Deadline {
                call,
                after: deadline,
            }),
            Ok(Err(status)) => Err(refused(call, &status)),
            Err(_) => Err(LinkError::Deadline {
                call,
                after: deadline,
            }),
        }
    }
}

/// The provider's side gave up at the deadline we sent: tonic answers
/// `CANCELLED "Timeout expired"`, other servers `DEADLINE_EXCEEDED`.
fn is_deadline(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::DeadlineExceeded
        || (status.code() == tonic::Code::Cancelled && status.message() == "Timeout expired")
}

impl LinkError {
    /// The provider's message when it refused the call as `INVALID_ARGUMENT`:
    /// the caller's input was wrong, not the provider's health.
    pub fn invalid_argument(&self) -> Option<&str> {
        match self {
            LinkError::Refused {
                code: tonic::Code::InvalidArgument,
                message,
                ..
            } => Some(message),
            _ => None,
        }
    }
}

/// The metrics label of a call's result.
pub fn outcome_of<T>(result: &Result<T, LinkError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(LinkError::Deadline { .. }) => "deadline",
        Err(LinkError::Refused { .. }) => "refused",
        Err(LinkError::Unreachable { .. }) => "unreachable",
    }
}

pub(super) fn refused(call: &'static str, status: &tonic::Status) -> LinkError {
    LinkError::Refused {
        call,
        code: status.code(),
        message: if status.message().is_empty() {
            format!("{:?}", status.code())
        } else {
            status.message().to_owned()
        },
    }
}
