//! The websocket at `/exec`: a command run in a deployed resource, streamed
//! both ways (`corbel exec`, the console's "Run a command"). Authenticated
//! like `/graphql/ws` (a bearer token in the upgrade's headers, or the
//! console's session cookie from this origin), it needs DEVELOPER in the
//! resource's project, counts against `ws_max_sockets_per_address`, and is
//! in the audit log (`exec`: the node, the command, the exit code and bytes
//! moved, never stdin).
//!
//! The protocol (see README, "Exec"): the client's first message is a text
//! frame `{"type":"start","nodeId":…,"command":[…],"tty":false,"rows":24,
//! "cols":80,"stdin":true,"timeoutSeconds":0}`; the server answers
//! `{"type":"started"}`, then binary frames whose first byte is the stream
//! (1 stdout, 2 stderr) and the rest its bytes, then `{"type":"exit",
//! "code":0,"signal":null,"timedOut":false}` and a normal close. The client
//! sends stdin as binary frames starting with 0, `{"type":"resize","rows":…,
//! "cols":…}` and `{"type":"close-stdin"}`; closing the socket kills the
//! command. A refusal is `{"type":"error","code":"NOT_FOUND","message":…}`
//! and a close 1008. When the caller's session ends (signed out, token
//! revoked, user disabled, role lowered) the command is killed and the
//! socket closed (1008) at once.

use axum::extract::State;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

use super::HttpState;
use super::caller::client_of;
use super::reach::{Done, Refusal, authorized, principal_of, record};
use crate::api::{ApiError, ClientAddress, ErrorCode};
use crate::auth::{AuthEvent, Principal, ProjectRole};
use crate::events::Delivery;
use crate::provider::{ExecExit, ExecIn, ExecOut, ExecStart};

/// The stream bytes of a binary frame are for.
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;

/// Most bytes of one client message (a stdin chunk).
const MAX_MESSAGE: usize = 1024 * 1024;

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
enum ClientMessage {
    #[serde(rename_all = "camelCase")]
    Start {
        node_id: String,
        command: Vec<String>,
        #[serde(default)]
        tty: bool,
        rows: Option<u16>,
        cols: Option<u16>,
        #[serde(default)]
        stdin: bool,
        #[serde(default)]
        timeout_seconds: u32,
    },
    Resize {
        rows: u16,
        cols: u16,
    },
    CloseStdin,
}

pub async fn exec_ws(
    State(state): State<HttpState>,
    upgrade: WebSocketUpgrade,
    parts: axum::http::request::Parts,
) -> Response {
    let client = client_of(&parts, &state.trusted_proxies);
    let slot = match super::ws::socket_slot(&state, &client) {
        Ok(slot) => slot,
        Err(refused) => return *refused,
    };
    let principal = match principal_of(&state, &parts.headers).await {
        Ok(principal) => principal,
        Err(response) => return response,
    };
    let tasks = state.ws_tasks.clone();
    upgrade
        .max_message_size(MAX_MESSAGE + 1)
        .on_upgrade(move |socket| {
            tasks.track_future(async move {
                let _slot = slot;
                serve(state, principal, client, socket).await;
            })
        })
}

async fn serve(state: HttpState, principal: Principal, client: ClientAddress, socket: WebSocket) {
    let (mut sink, mut stream) = socket.split();
    let started = std::time::Instant::now();
    let mut audit = serde_json::Map::new();
    let mut project = None;
    let outcome = run(
        &state,
        &principal,
        (&mut sink, &mut stream),
        &mut audit,
        &mut project,
    )
    .await;
    let failed = outcome.err();
    if let Some(Refusal(code, message)) = &failed {
        let text = json!({ "type": "error", "code": code.as_str(), "message": message });
        let _ = sink.send(Message::Text(text.to_string().into())).await;
        let frame = CloseFrame {
            code: close_code::POLICY,
            reason: super::ws::close_reason(message.clone()).into(),
        };
        let _ = sink.send(Message::Close(Some(frame))).await;
    } else {
        let frame = CloseFrame {
            code: close_code::NORMAL,
            reason: "".into(),
        };
        let _ = sink.send(Message::Close(Some(frame))).await;
    }
    if audit.is_empty() {
        return; // nothing asked: not an exec
    }
    let done = Done {
        action: "exec",
        facts: audit,
        project,
        failed,
        started,
    };
    record(&state, &principal, client, done).await;
}

type Sink = futures_util::stream::SplitSink<WebSocket, Message>;
type Stream = futures_util::stream::SplitStream<WebSocket>;

/// The exec itself: the start, the access check, then both ways until the
/// exit, the client's leaving, the session's end or the server's shutdown.
// Long: one select over the four things an exec waits on (its output, the
// client, the session, the shutdown); each arm is a few lines, read in turn.
async fn run(
    state: &HttpState,
    principal: &Principal,
    (sink, stream): (&mut Sink, &mut Stream),
    audit: &mut serde_json::Map<String, serde_json::Value>,
    project: &mut Option<Uuid>,
) -> Result<(), Refusal> {
    let (node_id, start) = read_start(state, stream, audit).await?;
    *project = authorized(state, principal, node_id).await?;
    let what = format!("resource node {node_id}");
    let mut exec = state
        .deployments
        .power()
        .exec(node_id, start)
        .await
        .map_err(ApiError::from)?;
    let _ = sink
        .send(Message::Text(
            json!({ "type": "started" }).to_string().into(),
        ))
        .await;
    let mut ended = Box::pin(session_ended(state, principal, *project, what.clone()));
    let mut moved = 0u64;
    let exit: ExecExit = loop {
        tokio::select! {
            out = exec.next() => match out.map_err(|e| ApiError::from(crate::deploy::DeployError::from(e)))? {
                Some(ExecOut::Stdout(bytes)) => {
                    moved += bytes.len() as u64;
                    if send(sink, STDOUT, bytes).await.is_err() { break_gone(audit, moved); return Ok(()); }
                }
                Some(ExecOut::Stderr(bytes)) => {
                    moved += bytes.len() as u64;
                    if send(sink, STDERR, bytes).await.is_err() { break_gone(audit, moved); return Ok(()); }
                }
                Some(ExecOut::Exit(exit)) => break exit,
                None => {
                    return Err(Refusal(
                        ErrorCode::ProviderUnavailable,
                        "the provider ended the exec without its exit status".to_owned(),
                    ));
                }
            },
            message = stream.next() => match message {
                Some(Ok(Message::Binary(bytes))) if bytes.first() == Some(&STDIN) => {
                    moved += bytes.len() as u64 - 1;
                    let _ = exec.input.send(ExecIn::Stdin(bytes[1..].to_vec())).await;
                }
                Some(Ok(Message::Text(text))) => match serde_json::from_str::<ClientMessage>(&text) {
                    Ok(ClientMessage::Resize { rows, cols }) => {
                        let _ = exec.input.send(ExecIn::Resize { rows, cols }).await;
                    }
                    Ok(ClientMessage::CloseStdin) => {
                        let _ = exec.input.send(ExecIn::CloseStdin).await;
                    }
                    _ => {
                        return Err(Refusal(
                            ErrorCode::BadRequest,
                            format!("not a message of /exec: {}", crate::text::bounded(text.to_string(), 80, "…")),
                        ));
                    }
                },
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                // Gone, or closing: the command is killed as `exec` drops.
                None | Some(Err(_) | Ok(Message::Close(_))) => {
                    break_gone(audit, moved);
                    return Ok(());
                }
                Some(Ok(Message::Binary(_))) => {
                    return Err(Refusal(
                        ErrorCode::BadRequest,
                        "a binary frame from the client is stdin: its first byte must be 0".to_owned(),
                    ));
                }
            },
            why = &mut ended => return Err(Refusal(ErrorCode::Unauthenticated, why)),
            () = state.ws_close.cancelled() => {
                return Err(Refusal(ErrorCode::Unavailable, "the server is shutting down".to_owned()));
            }
        }
    };
    audit.insert("exitCode".into(), json!(exit.code));
    audit.insert("outputBytes".into(), json!(moved));
    let text = json!({
        "type": "exit",
        "code": exit.code,
        "signal": exit.signal,
        "timedOut": exit.timed_out,
    });
    let _ = sink.send(Message::Text(text.to_string().into())).await;
    Ok(())
}

/// The client's first message, `start`: the node and how to run the
/// command (noted for the audit log as it is read).
async fn read_start(
    state: &HttpState,
    stream: &mut Stream,
    audit: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<(Uuid, ExecStart), Refusal> {
    let first = tokio::time::timeout(state.limits.ws_init_timeout, stream.next())
        .await
        .map_err(|_| Refusal(ErrorCode::BadRequest, "no `start` in time".to_owned()))?;
    let Some(Ok(Message::Text(text))) = first else {
        return Err(Refusal(
            ErrorCode::BadRequest,
            "the first message must be a text frame `{\"type\":\"start\",…}`".to_owned(),
        ));
    };
    let Ok(ClientMessage::Start {
        node_id,
        command,
        tty,
        rows,
        cols,
        stdin,
        timeout_seconds,
    }) = serde_json::from_str::<ClientMessage>(&text)
    else {
        return Err(Refusal(
            ErrorCode::BadRequest,
            "the first message must be `{\"type\":\"start\",\"nodeId\":…,\"command\":[…]}`"
                .to_owned(),
        ));
    };
    audit.insert("nodeId".into(), json!(node_id));
    audit.insert("command".into(), crate::audit::hide_secrets(json!(command)));
    audit.insert("tty".into(), json!(tty));
    let node_id = Uuid::parse_str(&node_id).map_err(|_| {
        Refusal(
            ErrorCode::Validation,
            format!("nodeId: not an id: {node_id}"),
        )
    })?;
    if command.first().is_none_or(String::is_empty) {
        return Err(Refusal(
            ErrorCode::Validation,
            "command: give the program to run".to_owned(),
        ));
    }
    let start = ExecStart {
        command,
        tty,
        size: tty.then(|| (rows.unwrap_or(24), cols.unwrap_or(80))),
        stdin,
        timeout_seconds,
    };
    Ok((node_id, start))
}

/// Notes, for the audit log, an exec its client left before it ended.
fn break_gone(audit: &mut serde_json::Map<String, serde_json::Value>, moved: u64) {
    audit.insert("outputBytes".into(), json!(moved));
    audit.insert("exitCode".into(), serde_json::Value::Null);
    audit.insert("left".into(), json!("the client closed the socket"));
}

async fn send(sink: &mut Sink, stream: u8, bytes: Vec<u8>) -> Result<(), axum::Error> {
    let mut frame = Vec::with_capacity(bytes.len() + 1);
    frame.push(stream);
    frame.extend_from_slice(&bytes);
    sink.send(Message::Binary(frame.into())).await
}

/// Resolves, saying why, when the caller's session ends (signed out, its
/// token revoked) or they may no longer exec in `project` (disabled,
/// deleted, their role changed).
async fn session_ended(
    state: &HttpState,
    principal: &Principal,
    project: Option<Uuid>,
    what: String,
) -> String {
    let auth = state.auth.clone();
    let (who, token) = (principal.user.id, principal.token_id);
    let mut changes = Box::pin(auth.events().subscribe());
    loop {
        let Some(change) = changes.next().await else {
            return "the server is shutting down".to_owned();
        };
        let token_gone = match &change {
            Delivery::Event(e) => match e.as_ref() {
                AuthEvent::ApiTokenRevoked { token_id, .. }
                | AuthEvent::SessionEnded { token_id, .. } => *token_id == token,
                AuthEvent::AccessChanged { user_id } if user_id.is_none_or(|u| u == who) => false,
                _ => continue,
            },
            Delivery::Lagged(_) => false,
        };
        if token_gone {
            return "the session ended".to_owned();
        }
        let still = match auth.access_of(who).await {
            Ok(Some(access)) => access
                .require(project, ProjectRole::Developer, &what)
                .is_ok(),
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read an exec's caller's access; ending it");
                false
            }
        };
        if !still {
            return "the caller may no longer run commands here".to_owned();
        }
    }
}
