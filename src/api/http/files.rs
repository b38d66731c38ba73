//! `PUT` and `GET /files/{nodeId}?path=…`: files into and out of a deployed
//! resource as tar archives (`corbel cp`), through its provider's `files`
//! feature. Authenticated like `/exec` (a bearer token, or the console's
//! session from this origin), DEVELOPER in the resource's project, and in
//! the audit log (`putFiles`, `getFiles`: the node, the path, the bytes;
//! never the contents).
//!
//! An upload is checked whole before any of it is sent on ([`TarCheck`]:
//! regular files and directories only, no path climbing out) and is at most
//! `[api] max_upload_bytes`; it is kept meanwhile in a temporary file, never
//! whole in memory. A refused upload writes nothing in the resource. A
//! download streams as the provider reads it.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use uuid::Uuid;

use super::reach::{Done, Refusal, authorized, principal_of, record};
use super::tar_check::TarCheck;
use super::{HttpState, api_error_response, client_of};
use crate::api::{ApiError, ErrorCode};
use crate::auth::Principal;

#[derive(Deserialize)]
struct FilesQuery {
    path: Option<String>,
}

/// How much of a spooled upload one message to the provider carries.
const CHUNK: usize = 64 * 1024;

pub async fn put_files(
    State(state): State<HttpState>,
    Path(node): Path<String>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let client = client_of(&parts, &state.trusted_proxies);
    let principal = match principal_of(&state, &parts.headers).await {
        Ok(principal) => principal,
        Err(response) => return response,
    };
    let path = query_path(&parts.uri);
    let started = std::time::Instant::now();
    let mut facts = serde_json::Map::new();
    facts.insert("nodeId".into(), json!(node));
    facts.insert("path".into(), json!(path));
    let mut project = None;
    let length = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let outcome = upload(
        &state,
        &principal,
        &node,
        path,
        (length, body),
        &mut project,
    )
    .await;
    let response = match &outcome {
        Ok(bytes) => {
            facts.insert("bytes".into(), json!(bytes));
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                json!({ "bytes": bytes }).to_string(),
            )
                .into_response()
        }
        Err(Refusal(code, message)) => refusal_response(*code, message),
    };
    let failed = outcome.err();
    record(
        &state,
        &principal,
        client,
        Done {
            action: "putFiles",
            facts,
            project,
            failed,
            started,
        },
    )
    .await;
    response
}

async fn upload(
    state: &HttpState,
    principal: &Principal,
    node: &str,
    path: Option<String>,
    (content_length, body): (Option<u64>, Body),
    project: &mut Option<Uuid>,
) -> Result<u64, Refusal> {
    let node_id = parse_node(node)?;
    let path = path.ok_or_else(|| {
        Refusal(
            ErrorCode::Validation,
            "path: give the directory to extract into (`?path=…`)".to_owned(),
        )
    })?;
    *project = authorized(state, principal, node_id).await?;
    let max = state.api.max_upload_bytes;
    if let Some(length) = content_length
        && length > max
    {
        return Err(Refusal(
            ErrorCode::LimitExceeded,
            format!(
                "the upload is larger than `api.max_upload_bytes` ({max} bytes): nothing was written"
            ),
        ));
    }
    let spool = spool(body, max).await?;
    let chunks = futures_util::stream::unfold(spool, |mut spool| async move {
        let mut buffer = vec![0u8; CHUNK];
        match spool.read(&mut buffer).await {
            Ok(0) | Err(_) => None,
            Ok(n) => {
                buffer.truncate(n);
                Some((buffer, spool))
            }
        }
    });
    state
        .deployments
        .power()
        .put_files(node_id, &path, chunks)
        .await
        .map_err(|e| Refusal::from(ApiError::from(e)))
}

/// The upload kept in a temporary file (rewound) while it is checked and
/// counted: refused at its first fault, or past `max` bytes.
async fn spool(body: Body, max: u64) -> Result<tokio::fs::File, Refusal> {
    let spool = tempfile::tempfile()
        .map_err(|e| Refusal(ErrorCode::Internal, format!("cannot keep the upload: {e}")))?;
    let mut spool = tokio::fs::File::from_std(spool);
    let mut check = TarCheck::default();
    let mut received = 0u64;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| Refusal(ErrorCode::BadRequest, format!("the upload broke off: {e}")))?;
        received += chunk.len() as u64;
        if received > max {
            return Err(Refusal(
                ErrorCode::LimitExceeded,
                format!(
                    "the upload is larger than `api.max_upload_bytes` ({max} bytes): nothing was written"
                ),
            ));
        }
        check
            .feed(&chunk)
            .map_err(|e| Refusal(ErrorCode::Validation, format!("{e}: nothing was written")))?;
        spool
            .write_all(&chunk)
            .await
            .map_err(|e| Refusal(ErrorCode::Internal, format!("cannot keep the upload: {e}")))?;
    }
    check
        .finish()
        .map_err(|e| Refusal(ErrorCode::Validation, format!("{e}: nothing was written")))?;
    spool
        .flush()
        .await
        .map_err(|e| Refusal(ErrorCode::Internal, format!("cannot keep the upload: {e}")))?;
    spool
        .rewind()
        .await
        .map_err(|e| Refusal(ErrorCode::Internal, format!("cannot read the upload: {e}")))?;
    Ok(spool)
}

pub async fn get_files(
    State(state): State<HttpState>,
    Path(node): Path<String>,
    request: Request,
) -> Response {
    let (parts, _) = request.into_parts();
    let client = client_of(&parts, &state.trusted_proxies);
    let principal = match principal_of(&state, &parts.headers).await {
        Ok(principal) => principal,
        Err(response) => return response,
    };
    let path = query_path(&parts.uri);
    let started = std::time::Instant::now();
    let mut facts = serde_json::Map::new();
    facts.insert("nodeId".into(), json!(node));
    facts.insert("path".into(), json!(path));
    let mut project = None;
    let opened = download(&state, &principal, &node, path, &mut project).await;
    let (files, first) = match opened {
        Ok(opened) => opened,
        Err(refusal) => {
            let response = refusal_response(refusal.0, &refusal.1);
            record(
                &state,
                &principal,
                client,
                Done {
                    action: "getFiles",
                    facts,
                    project,
                    failed: Some(refusal),
                    started,
                },
            )
            .await;
            return response;
        }
    };
    // The rest streams as the client reads it; the audit entry is written
    // when it has all gone (or the client left), with the bytes sent.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let done = Done {
        action: "getFiles",
        facts,
        project,
        failed: None,
        started,
    };
    tokio::spawn(async move {
        let done = send_all(files, first, tx, done).await;
        record(&state, &principal, client, done).await;
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-tar")],
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
        .into_response()
}

/// Sends the archive's chunks, `first` first, until its end, an error or
/// the client leaving; `done` with the bytes sent (and the error).
async fn send_all(
    mut files: crate::provider::FilesOut,
    first: Vec<u8>,
    tx: tokio::sync::mpsc::Sender<Result<Vec<u8>, std::io::Error>>,
    mut done: Done,
) -> Done {
    let mut sent = first.len() as u64;
    if tx.send(Ok(first)).await.is_ok() {
        loop {
            match files.next().await {
                Ok(Some(chunk)) => {
                    sent += chunk.len() as u64;
                    if tx.send(Ok(chunk)).await.is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let e = ApiError::from(crate::deploy::DeployError::from(e));
                    let _ = tx.send(Err(std::io::Error::other(e.message.clone()))).await;
                    done.failed = Some(Refusal::from(e));
                    break;
                }
            }
        }
    }
    done.facts.insert("bytes".into(), json!(sent));
    done
}

/// The archive opened, with its first chunk (so that a refusal is an HTTP
/// error, not a broken archive).
async fn download(
    state: &HttpState,
    principal: &Principal,
    node: &str,
    path: Option<String>,
    project: &mut Option<Uuid>,
) -> Result<(crate::provider::FilesOut, Vec<u8>), Refusal> {
    let node_id = parse_node(node)?;
    let path = path.ok_or_else(|| {
        Refusal(
            ErrorCode::Validation,
            "path: give the file or directory to read (`?path=…`)".to_owned(),
        )
    })?;
    *project = authorized(state, principal, node_id).await?;
    let mut files = state
        .deployments
        .power()
        .get_files(node_id, &path)
        .await
        .map_err(|e| Refusal::from(ApiError::from(e)))?;
    let first = files
        .next()
        .await
        .map_err(|e| Refusal::from(ApiError::from(crate::deploy::DeployError::from(e))))?
        .unwrap_or_default();
    Ok((files, first))
}

fn query_path(uri: &axum::http::Uri) -> Option<String> {
    axum::extract::Query::<FilesQuery>::try_from_uri(uri)
        .ok()
        .and_then(|q| q.0.path)
        .filter(|p| !p.is_empty())
}

fn parse_node(node: &str) -> Result<Uuid, Refusal> {
    Uuid::parse_str(node)
        .map_err(|_| Refusal(ErrorCode::Validation, format!("nodeId: not an id: {node}")))
}

fn refusal_response(code: ErrorCode, message: &str) -> Response {
    let status = match code {
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::Forbidden => StatusCode::FORBIDDEN,
        ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorCode::LimitExceeded => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::Validation | ErrorCode::BadRequest => StatusCode::BAD_REQUEST,
        ErrorCode::Conflict => StatusCode::CONFLICT,
        ErrorCode::ProviderUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    api_error_response(status, ApiError::new(code, message))
}
