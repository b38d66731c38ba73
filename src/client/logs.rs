//! `corbel logs provider NAME` and `corbel events deployment NAME_OR_ID`:
//! what is stored (the provider's last lines, the deployment's history),
//! then with `--follow` what happens live, over the subscription the schema
//! offers for it. Text: one line each; `-o json`: one JSON object a line.

use std::collections::HashSet;

use serde_json::{Value, json};

use super::Context;
use super::error::ClientError;
use super::follow::{self, EVENT, event_id, event_line};
use super::resolve;
use super::ws::Subscription;

#[derive(Debug, clap::Subcommand)]
pub enum LogsCommand {
    /// A provider's build and run output (and Corbel's notes on it).
    Provider {
        name: String,
        /// Then follow new lines until Ctrl-C (or the server stops).
        #[arg(short, long)]
        follow: bool,
        /// How many of the last stored lines to show first.
        #[arg(long, default_value_t = 100)]
        tail: u32,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum EventsCommand {
    /// A deployment's history.
    Deployment {
        /// The deployment's name or id.
        deployment: String,
        /// Then, while a run goes on, its events live until it settles
        /// (or Ctrl-C).
        #[arg(short, long)]
        follow: bool,
    },
}

const LOG_LINE: &str = "at stream line";

pub async fn logs(context: &Context, command: LogsCommand) -> Result<(), ClientError> {
    let LogsCommand::Provider { name, follow, tail } = command;
    let api = context.signed_in().await?;
    let id = resolve::provider(api, &name).await?["id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // Subscribed before the stored lines are read, so none falls between;
    // a line in both is shown once.
    let mut live = if follow {
        Some(
            Subscription::start(
                api,
                &format!(
                    "subscription($id: ID!) {{ providerEvents(id: $id) \
                     {{ status message missed log {{ {LOG_LINE} }} }} }}"
                ),
                json!({ "id": id }),
            )
            .await?,
        )
    } else {
        None
    };
    let stored: Value = api
        .get(
            &format!("query($id: ID!, $last: Int!) {{ provider(id: $id) {{ logs(last: $last) {{ {LOG_LINE} }} }} }}"),
            json!({ "id": id, "last": tail }),
            "provider",
        )
        .await?;
    let stored = stored["logs"].as_array().cloned().unwrap_or_default();
    for line in &stored {
        show_log_line(context, line);
    }
    let Some(mut live) = live.take() else {
        return Ok(());
    };
    let last_at = stored.last().map(|l| l["at"].clone());
    let shown: HashSet<String> = stored
        .iter()
        .filter(|l| Some(&l["at"]) == last_at.as_ref())
        .map(Value::to_string)
        .collect();
    let followed = async {
        while let Some(data) = live.next().await? {
            let event = &data["providerEvents"];
            if let Some(missed) = event["missed"].as_i64() {
                context
                    .output
                    .note(&format!("({missed} lines missed: this client fell behind)"));
            } else if event["log"].is_object() {
                let line = &event["log"];
                let at = line["at"].as_str().unwrap_or_default();
                let before = last_at
                    .as_ref()
                    .and_then(Value::as_str)
                    .is_some_and(|last| at < last);
                if before || shown.contains(&line.to_string()) {
                    continue;
                }
                show_log_line(context, line);
            } else if let Some(status) = event["status"].as_str() {
                let message = event["message"].as_str().unwrap_or_default();
                context.output.note(&format!("-- {status} {message}"));
            }
        }
        Ok(())
    };
    let ended = tokio::select! {
        ended = followed => ended,
        _ = tokio::signal::ctrl_c() => Ok(()),
    };
    live.close().await;
    ended
}

fn show_log_line(context: &Context, line: &Value) {
    if context.output.structured() {
        context.output.line(line);
    } else {
        println!(
            "{} {:<6} {}",
            line["at"].as_str().unwrap_or_default(),
            line["stream"].as_str().unwrap_or_default(),
            line["line"].as_str().unwrap_or_default()
        );
    }
}

pub async fn events(context: &Context, command: EventsCommand) -> Result<(), ClientError> {
    let EventsCommand::Deployment { deployment, follow } = command;
    let api = context.signed_in().await?;
    let found = resolve::deployment(api, &deployment).await?;
    let id = found["id"].as_str().unwrap_or_default().to_owned();
    let stored: Value = api
        .get(
            &format!("query($id: ID!) {{ deployment(id: $id) {{ state events(first: 10000) {{ {EVENT} }} }} }}"),
            json!({ "id": id }),
            "deployment",
        )
        .await?;
    let history = stored["events"].as_array().cloned().unwrap_or_default();
    for event in &history {
        show_event(context, event);
    }
    let state = stored["state"].as_str().unwrap_or_default();
    if !follow || follow::settled(state) {
        return Ok(());
    }
    let mut last = history.iter().map(event_id).max().unwrap_or(0);
    let mut live = Subscription::start(
        api,
        &format!("subscription($id: ID!) {{ deploymentEvents(id: $id) {{ {EVENT} }} }}"),
        json!({ "id": id }),
    )
    .await?;
    let followed = async {
        while let Some(data) = live.next().await? {
            let event = &data["deploymentEvents"];
            if event_id(event) <= last {
                continue; // the replay of what is shown already
            }
            last = event_id(event);
            show_event(context, event);
            let state = event["state"].as_str().unwrap_or_default();
            if event["kind"] == "STATE" && follow::settled(state) {
                return Ok(());
            }
        }
        Err(ClientError::Transport(
            "the server ended the deployment's events before the run settled".to_owned(),
        ))
    };
    let ended = tokio::select! {
        ended = followed => ended,
        _ = tokio::signal::ctrl_c() => Ok(()),
    };
    live.close().await;
    ended
}

fn show_event(context: &Context, event: &Value) {
    if context.output.structured() {
        context.output.line(event);
    } else {
        println!("{}", event_line(event));
    }
}
