//! `corbel get … -w`: after the list, each item again whenever it changes,
//! until Ctrl-C. The list is read again after each of its kind's
//! `serverEvents` (grouped: the events of a quarter second, one read) and
//! after a lost socket or missed events; an item is printed when its row
//! differs from the last one printed: as a table row in the first table's
//! columns, or with `-o json|yaml` as one object a line (a document).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::Context;
use super::error::ClientError;
use super::get::{GetCommand, Kind, fetch};
use super::output::{aligned, widths};
use super::ws::Subscription;

/// How long events are gathered before the list is read again.
const GATHER: Duration = Duration::from_millis(250);

/// Follows what `command` lists until Ctrl-C; `shown`: the items printed.
pub async fn follow(
    context: &Context,
    command: &GetCommand,
    shown: &[Value],
) -> Result<(), ClientError> {
    let api = context.signed_in().await?;
    let kind = Kind::of(command);
    let (header, first) = kind.table(shown);
    let widths = widths(header, &first);
    let mut last: HashMap<String, Vec<String>> =
        first.into_iter().map(|row| (id_of(&row), row)).collect();
    let watching = async {
        loop {
            let mut events = match Subscription::start(api, QUERY, json!({})).await {
                Ok(events) => events,
                Err(ClientError::Transport(_)) => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            // Read again once subscribed: nothing that changed meanwhile is missed.
            let mut stale = true;
            loop {
                if stale {
                    let (items, _) = fetch(api, command).await?;
                    print_changed(context, kind, &items, &mut last, &widths);
                    stale = false;
                }
                match events.next().await {
                    Ok(Some(data)) => {
                        let event = data["serverEvents"]["__typename"].as_str().unwrap_or("");
                        if event == "EventsMissed" || kind.events().contains(&event) {
                            stale = true;
                            tokio::time::sleep(GATHER).await;
                        }
                    }
                    // The socket went: subscribe again, then read again.
                    Ok(None) | Err(ClientError::Transport(_)) => break,
                    Err(e) => return Err(e),
                }
            }
        }
    };
    tokio::select! {
        followed = watching => followed,
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

const QUERY: &str = "subscription { serverEvents { __typename } }";

/// Prints the items whose row changed since `last` (and notes them there).
fn print_changed(
    context: &Context,
    kind: Kind,
    items: &[Value],
    last: &mut HashMap<String, Vec<String>>,
    widths: &[usize],
) {
    let (_, rows) = kind.table(items);
    for (item, row) in items.iter().zip(rows) {
        let id = id_of(&row);
        if last.get(&id) == Some(&row) {
            continue;
        }
        if context.output.structured() {
            context.output.line(item);
        } else {
            println!("{}", aligned(&row, widths));
        }
        last.insert(id, row);
    }
}

/// The item's id: its row's last cell.
fn id_of(row: &[String]) -> String {
    row.last().cloned().unwrap_or_default()
}
