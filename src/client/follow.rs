//! Following one run of a deployment (a deploy or a destroy) over
//! `deploymentEvents` until it settles: an indicatif bar on a terminal, a
//! plain line per node state change otherwise, nothing in `json` mode.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Value, json};

use super::api::Api;
use super::error::ClientError;
use super::output::Output;
use super::resolve::DEPLOYMENT;
use super::ws::Subscription;

/// What `deploymentEvents` reads of an event.
pub const EVENT: &str = "id deploymentId at kind nodeKey state message";

/// The states a run ends in.
pub fn settled(state: &str) -> bool {
    matches!(state, "COMPLETE" | "FAILED" | "DESTROYED" | "SUSPENDED")
}

/// An event's id as a number (ids are decimal strings).
pub fn event_id(event: &Value) -> i64 {
    event["id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .unwrap_or(0)
}

/// The event as one line: time, kind, node (or `-`), state (or `-`), message.
pub fn event_line(event: &Value) -> String {
    let field = |name: &str| event[name].as_str().unwrap_or("-").to_owned();
    let message = event["message"].as_str().unwrap_or_default();
    format!(
        "{} {:<8} {} {} {}",
        field("at"),
        field("kind"),
        field("nodeKey"),
        field("state"),
        message
    )
    .trim_end()
    .to_owned()
}

/// The id of the deployment's last event so far (0 with none): a run
/// started after this call has only events past it.
pub async fn last_event_id(api: &Api, id: &str) -> Result<i64, ClientError> {
    let events: Vec<Value> = api
        .get::<Value>(
            "query($id: ID!) { deployment(id: $id) { events(first: 10000) { id } } }",
            json!({ "id": id }),
            "deployment",
        )
        .await?["events"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    Ok(events.iter().map(event_id).max().unwrap_or(0))
}

/// How long `wait` keeps trying to follow again after its socket was lost
/// (a replica failing over closes relayed sockets; the new leader takes a
/// few seconds).
const RESUME_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// Follows the run whose events come after `after` until the deployment
/// settles, and returns the deployment as it then is. A lost socket is
/// opened again, resuming past the last event seen (`after:`), so nothing is
/// shown twice or missed. Ctrl-C stops waiting (the run goes on).
pub async fn wait(api: &Api, id: &str, after: i64, output: Output) -> Result<Value, ClientError> {
    let query = format!(
        "subscription($id: ID!, $after: ID) {{ deploymentEvents(id: $id, after: $after) {{ {EVENT} }} }}"
    );
    let mut progress = Progress::new(output);
    let followed = async {
        let mut last = after;
        let mut lost: Option<(tokio::time::Instant, ClientError)> = None;
        loop {
            if let Some((since, _)) = &lost {
                if since.elapsed() > RESUME_WITHIN
                    && let Some((_, why)) = lost.take()
                {
                    return Err(why);
                }
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            let variables = json!({ "id": id, "after": last.to_string() });
            let mut subscription = match Subscription::start(api, &query, variables).await {
                Ok(subscription) => subscription,
                Err(e @ ClientError::Transport(_)) => {
                    // The first loss's time and the latest reason.
                    let since = lost.take().map_or_else(tokio::time::Instant::now, |l| l.0);
                    lost = Some((since, e));
                    continue;
                }
                Err(e) => return Err(e),
            };
            loop {
                match subscription.next().await {
                    Ok(Some(data)) => {
                        let event = &data["deploymentEvents"];
                        if event_id(event) <= last {
                            continue;
                        }
                        last = event_id(event);
                        progress.show(event);
                        let state = event["state"].as_str().unwrap_or_default();
                        if event["kind"] == "STATE" && settled(state) {
                            subscription.close().await;
                            return Ok(());
                        }
                    }
                    Ok(None) => {
                        return Err(ClientError::Transport(
                            "the server ended the deployment's events before the run settled"
                                .to_owned(),
                        ));
                    }
                    Err(ClientError::Transport(why)) => {
                        eprintln!("lost the server's events ({why}); following again…");
                        lost = Some((tokio::time::Instant::now(), ClientError::Transport(why)));
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    };
    let ended = tokio::select! {
        ended = followed => ended,
        _ = tokio::signal::ctrl_c() => Err(ClientError::Interrupted(format!(
            "stopped waiting; the run goes on: follow it with `corbel events deployment {id} --follow`"
        ))),
    };
    progress.finish();
    ended?;
    api.get(
        &format!("query($id: ID!) {{ deployment(id: $id) {{ {DEPLOYMENT} }} }}"),
        json!({ "id": id }),
        "deployment",
    )
    .await
}

/// What the user sees of a run while it goes.
struct Progress {
    bar: Option<ProgressBar>,
    /// Plain lines (no terminal): one per node state change.
    lines: bool,
    /// Each node's last state, `key[replica]` → state.
    nodes: BTreeMap<String, String>,
}

impl Progress {
    fn new(output: Output) -> Progress {
        let terminal = std::io::stderr().is_terminal();
        let bar = (terminal && !output.structured()).then(|| {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} nodes settled  {wide_msg}",
                )
                .expect("a valid template"),
            );
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
            bar
        });
        Progress {
            lines: !terminal && !output.structured(),
            bar,
            nodes: BTreeMap::new(),
        }
    }

    fn show(&mut self, event: &Value) {
        let state = event["state"].as_str().unwrap_or_default();
        let message = event["message"].as_str().unwrap_or_default();
        let line = match (event["kind"].as_str(), event["nodeKey"].as_str()) {
            (Some("NODE"), Some(node)) => {
                let changed = self.nodes.insert(node.to_owned(), state.to_owned());
                if changed.as_deref() == Some(state) {
                    None
                } else {
                    Some(with_message(&format!("{node} {state}"), message))
                }
            }
            (Some("STATE"), _) => Some(with_message(&format!("deployment {state}"), message)),
            _ => None,
        };
        if let Some(bar) = &self.bar {
            let settled = self
                .nodes
                .values()
                .filter(|s| matches!(s.as_str(), "COMPLETE" | "DESTROYED" | "FAILED" | "TAINTED"))
                .count();
            bar.set_length(self.nodes.len() as u64);
            bar.set_position(settled as u64);
            if let Some(line) = &line {
                bar.println(line);
                bar.set_message(line.clone());
            } else if !message.is_empty() {
                bar.set_message(message.to_owned());
            }
        } else if self.lines
            && let Some(line) = line
        {
            eprintln!("{line}");
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn with_message(head: &str, message: &str) -> String {
    if message.is_empty() {
        head.to_owned()
    } else {
        format!("{head}: {message}")
    }
}
