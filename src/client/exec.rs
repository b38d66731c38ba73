//! `corbel exec DEPLOYMENT KEY[/REPLICA] -- COMMAND ARGS…`: a command run in
//! a deployed resource over the server's `/exec` websocket, its stdout and
//! stderr written as they come, the CLI's exit status the command's. `-i`
//! forwards stdin (its end closes the command's); `-t` runs it on a terminal:
//! this one is put in raw mode for the while, its size sent, and sent again
//! when the window changes.

use std::io::Write as _;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::Context;
use super::error::ClientError;
use super::resolve;

#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// The deployment's name or id.
    pub deployment: String,
    /// The resource's key, `/REPLICA` for a replica other than 0 (`web/2`).
    pub resource: String,
    /// Forward stdin to the command.
    #[arg(short, long)]
    pub interactive: bool,
    /// Run the command on a terminal (with `-i`, an interactive shell).
    #[arg(short, long)]
    pub tty: bool,
    /// Kill the command after this many seconds (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub timeout: u32,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Runs the command; answers its exit status (128 + the signal's number
/// when a signal ended it, as a shell says).
pub async fn exec(context: &Context, args: ExecArgs) -> Result<u8, ClientError> {
    let api = context.signed_in().await?;
    let node = node_of(api, &args.deployment, &args.resource).await?;
    let (mut sink, mut stream, url) = connect(api).await?;
    let tty = args.tty && std::io::IsTerminal::is_terminal(&std::io::stdin());
    let size = if tty { terminal_size() } else { None };
    let start = json!({
        "type": "start",
        "nodeId": node["id"],
        "command": args.command,
        "tty": args.tty,
        "rows": size.map(|s| s.0),
        "cols": size.map(|s| s.1),
        "stdin": args.interactive,
        "timeoutSeconds": args.timeout,
    });
    sink.send(Message::Text(start.to_string().into()))
        .await
        .map_err(|e| ClientError::Transport(format!("{url}: {e}")))?;
    let _raw = if tty { RawMode::enter() } else { None };
    let (input, mut inputs) = tokio::sync::mpsc::channel::<Message>(8);
    if args.interactive {
        tokio::spawn(read_stdin(input.clone()));
    }
    if tty {
        tokio::spawn(watch_window(input.clone()));
    }
    drop(input);
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    loop {
        tokio::select! {
            message = stream.next() => match message {
                Some(Ok(Message::Binary(bytes))) => match bytes.split_first() {
                    Some((1, rest)) => { let _ = stdout.write_all(rest); let _ = stdout.flush(); }
                    Some((2, rest)) => { let _ = stderr.write_all(rest); let _ = stderr.flush(); }
                    _ => {}
                },
                Some(Ok(Message::Text(text))) => {
                    let message: Value = serde_json::from_str(&text).unwrap_or_default();
                    match message["type"].as_str() {
                        Some("exit") => return Ok(status_of(&message)),
                        Some("error") => {
                            return Err(ClientError::Api {
                                code: message["code"].as_str().unwrap_or("INTERNAL").to_owned(),
                                message: message["message"].as_str().unwrap_or_default().to_owned(),
                            });
                        }
                        _ => {}
                    }
                }
                Some(Ok(_)) => {}
                None | Some(Err(_)) => {
                    return Err(ClientError::Transport(format!(
                        "{url} closed the connection before the command's exit"
                    )));
                }
            },
            Some(message) = inputs.recv() => {
                if sink.send(message).await.is_err() {
                    return Err(ClientError::Transport(format!("{url} went away")));
                }
            }
        }
    }
}

/// The node of `args.resource` in `args.deployment`.
pub(super) async fn node_of(
    api: &super::api::Api,
    deployment: &str,
    resource: &str,
) -> Result<Value, ClientError> {
    let deployment = resolve::deployment(api, deployment).await?;
    let (key, replica) = match resource.split_once('/') {
        Some((key, replica)) => (
            key.to_owned(),
            replica.parse::<i64>().map_err(|_| {
                ClientError::Usage(format!("{resource}: the replica must be a number"))
            })?,
        ),
        None => (resource.to_owned(), 0),
    };
    let nodes: Value = api
        .get(
            "query($id: ID!) { deployment(id: $id) { nodes { id key replica } } }",
            json!({ "id": deployment["id"] }),
            "deployment",
        )
        .await?;
    let node = nodes["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["key"] == key.as_str() && n["replica"] == replica)
        .ok_or_else(|| {
            ClientError::NotFound(format!(
                "deployment `{}` has no resource `{key}[{replica}]`",
                deployment["name"].as_str().unwrap_or_default()
            ))
        })?;
    Ok(node.clone())
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// `/exec` opened with the API's token.
async fn connect(
    api: &super::api::Api,
) -> Result<
    (
        futures_util::stream::SplitSink<Socket, Message>,
        futures_util::stream::SplitStream<Socket>,
        String,
    ),
    ClientError,
> {
    let url = super::ws::websocket_url(&api.server, "/exec");
    let mut request = url
        .as_str()
        .into_client_request()
        .map_err(|e| ClientError::Transport(format!("{url}: {e}")))?;
    if let Some(token) = api.token() {
        let value = http::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| ClientError::Usage("the token is not a valid header value".into()))?;
        request.headers_mut().insert("Authorization", value);
    }
    let (socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .map_err(|e| {
            ClientError::Transport(format!("cannot open {url}: {}", super::error_chain(&e)))
        })?;
    let (sink, stream) = socket.split();
    Ok((sink, stream, url))
}

/// The exit status a shell would give: the command's, or 128 + the signal.
fn status_of(exit: &Value) -> u8 {
    if let Some(signal) = exit["signal"].as_str()
        && let Ok(signal) = signal.parse::<nix::sys::signal::Signal>()
    {
        return 128u8.saturating_add(signal as u8);
    }
    exit["code"].as_i64().map_or(1, |c| (c & 0xff) as u8)
}

/// Sends stdin as it comes, then `close-stdin` at its end.
async fn read_stdin(input: tokio::sync::mpsc::Sender<Message>) {
    let mut stdin = tokio::io::stdin();
    let mut buffer = vec![0u8; 32 * 1024];
    loop {
        match stdin.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let mut frame = Vec::with_capacity(n + 1);
                frame.push(0);
                frame.extend_from_slice(&buffer[..n]);
                if input.send(Message::Binary(frame.into())).await.is_err() {
                    return;
                }
            }
        }
    }
    let close = json!({ "type": "close-stdin" }).to_string();
    let _ = input.send(Message::Text(close.into())).await;
}

/// Sends the terminal's size each time the window changes (SIGWINCH).
async fn watch_window(input: tokio::sync::mpsc::Sender<Message>) {
    let Ok(mut changes) =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
    else {
        return;
    };
    while changes.recv().await.is_some() {
        if let Some((rows, cols)) = terminal_size() {
            let resize = json!({ "type": "resize", "rows": rows, "cols": cols }).to_string();
            if input.send(Message::Text(resize.into())).await.is_err() {
                return;
            }
        }
    }
}

/// This terminal's (rows, columns).
fn terminal_size() -> Option<(u16, u16)> {
    let mut size = nix::libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into `size`.
    let read = unsafe { nix::libc::ioctl(0, nix::libc::TIOCGWINSZ, &mut size) };
    (read == 0 && size.ws_row > 0).then_some((size.ws_row, size.ws_col))
}

/// The terminal in raw mode until dropped (then as it was).
struct RawMode(nix::sys::termios::Termios);

impl RawMode {
    fn enter() -> Option<RawMode> {
        use nix::sys::termios::{SetArg, cfmakeraw, tcgetattr, tcsetattr};
        let stdin = std::io::stdin();
        let before = tcgetattr(&stdin).ok()?;
        let mut raw = before.clone();
        cfmakeraw(&mut raw);
        tcsetattr(&stdin, SetArg::TCSANOW, &raw).ok()?;
        Some(RawMode(before))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        use nix::sys::termios::{SetArg, tcsetattr};
        let _ = tcsetattr(std::io::stdin(), SetArg::TCSANOW, &self.0);
    }
}
