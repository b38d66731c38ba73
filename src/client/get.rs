//! `corbel get deployments|providers|repositories [NAME]` and `corbel get
//! replicas`: a table, or with `-o json` the API's objects (an array, or the
//! one object named). One deployment named is followed by its resources'
//! table: state, health, restarts and why one is not healthy.

use serde_json::{Value, json};

use super::error::ClientError;
use super::output::{cell, table};
use super::resolve;
use super::{Api, Context};

#[derive(Debug, clap::Subcommand)]
pub enum GetCommand {
    /// Deployments: every one, or one by name or id.
    #[command(alias = "deployment")]
    Deployments { name: Option<String> },
    /// Providers: every one, or one by name.
    #[command(alias = "provider")]
    Providers { name: Option<String> },
    /// Repositories: every one, or one by name.
    #[command(alias = "repository")]
    Repositories { name: Option<String> },
    /// The servers that joined the database as replicas (server admins).
    #[command(alias = "replica")]
    Replicas,
}

const REPLICA: &str = "id advertiseUrl host pid version keyId state leader startedAt heartbeatAt";

/// Prints what `command` lists (for `-w`, the start of what is followed);
/// the items printed.
pub async fn get(
    context: &Context,
    command: &GetCommand,
    watch: bool,
) -> Result<Vec<Value>, ClientError> {
    let api = context.signed_in().await?;
    let kind = Kind::of(command);
    if watch && kind.events().is_empty() {
        return Err(ClientError::Usage(
            "-w follows deployments, providers and repositories; replicas have no events"
                .to_owned(),
        ));
    }
    let (items, one) = fetch(api, command).await?;
    if context.output.structured() {
        if watch {
            items.iter().for_each(|item| context.output.line(item));
        } else {
            match (one, items.first()) {
                (true, Some(item)) => context.output.value(item),
                _ => context.output.value(&Value::Array(items.clone())),
            }
        }
    } else {
        let (header, rows) = kind.table(&items);
        print!("{}", table(header, &rows));
        let one_deployment = one && kind == Kind::Deployments;
        if let (true, false, Some(deployment)) = (one_deployment, watch, items.first()) {
            println!();
            print!("{}", resources(deployment));
        }
    }
    Ok(items)
}

/// What `command` lists: the items, and whether one was named.
pub(super) async fn fetch(
    api: &Api,
    command: &GetCommand,
) -> Result<(Vec<Value>, bool), ClientError> {
    Ok(match command {
        GetCommand::Deployments { name: Some(name) } => {
            (vec![resolve::deployment(api, name).await?], true)
        }
        GetCommand::Deployments { name: None } => (
            api.all("deployments", None, resolve::DEPLOYMENT).await?,
            false,
        ),
        GetCommand::Providers { name: Some(name) } => {
            (vec![resolve::provider(api, name).await?], true)
        }
        GetCommand::Providers { name: None } => {
            (api.all("providers", None, resolve::PROVIDER).await?, false)
        }
        GetCommand::Repositories { name: Some(name) } => {
            (vec![resolve::repository(api, name).await?], true)
        }
        GetCommand::Repositories { name: None } => (
            api.all("repositories", None, resolve::REPOSITORY).await?,
            false,
        ),
        GetCommand::Replicas => (
            api.get(
                &format!("{{ replicas {{ {REPLICA} }} }}"),
                json!({}),
                "replicas",
            )
            .await?,
            false,
        ),
    })
}

/// What is listed, for its table and its events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Deployments,
    Providers,
    Repositories,
    Replicas,
}

impl Kind {
    pub(super) fn of(command: &GetCommand) -> Kind {
        match command {
            GetCommand::Deployments { .. } => Kind::Deployments,
            GetCommand::Providers { .. } => Kind::Providers,
            GetCommand::Repositories { .. } => Kind::Repositories,
            GetCommand::Replicas => Kind::Replicas,
        }
    }

    /// The `serverEvents` after which its items are read again.
    pub(super) fn events(self) -> &'static [&'static str] {
        match self {
            Kind::Deployments => &["DeploymentChanged", "DeploymentHealthChanged"],
            Kind::Providers => &["ProviderStatusChanged"],
            Kind::Repositories => &["RepositorySync"],
            Kind::Replicas => &[],
        }
    }

    /// Its table's header and a row per item; each row's last cell is the
    /// item's id.
    pub(super) fn table(self, items: &[Value]) -> (&'static [&'static str], Vec<Vec<String>>) {
        match self {
            Kind::Deployments => (
                &["NAME", "STATE", "HEALTH", "PHASE", "NODES", "UPDATED", "ID"],
                items.iter().map(deployment_row).collect(),
            ),
            Kind::Providers => (
                &["NAME", "STATUS", "RESOURCE TYPES", "RESTARTS", "ID"],
                items.iter().map(provider_row).collect(),
            ),
            Kind::Repositories => (
                &["NAME", "STATUS", "MODE", "ELEMENTS", "LAST SYNC", "ID"],
                items.iter().map(repository_row).collect(),
            ),
            Kind::Replicas => (
                &[
                    "ID",
                    "STATE",
                    "LEADER",
                    "ADVERTISE URL",
                    "HOST",
                    "PID",
                    "VERSION",
                    "KEY",
                    "HEARTBEAT",
                ],
                items.iter().map(replica_row).collect(),
            ),
        }
    }
}

/// A deployment's resources, one row per replica.
fn resources(d: &Value) -> String {
    let nodes = d["nodes"].as_array().map(Vec::as_slice).unwrap_or_default();
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            vec![
                format!("{}[{}]", cell(&n["key"]), cell(&n["replica"])),
                cell(&n["state"]),
                cell(&n["health"]),
                cell(&n["restarts"]),
                cell(&n["node"]),
                cell(&n["healthReason"]),
            ]
        })
        .collect();
    table(
        &["RESOURCE", "STATE", "HEALTH", "RESTARTS", "ON", "REASON"],
        &rows,
    )
}

fn deployment_row(d: &Value) -> Vec<String> {
    let nodes = d["nodes"].as_array().map(Vec::as_slice).unwrap_or_default();
    let complete = nodes.iter().filter(|n| n["state"] == "COMPLETE").count();
    vec![
        cell(&d["name"]),
        cell(&d["state"]),
        cell(&d["health"]),
        cell(&d["phase"]),
        format!("{complete}/{}", nodes.len()),
        cell(&d["updatedAt"]),
        cell(&d["id"]),
    ]
}

fn provider_row(p: &Value) -> Vec<String> {
    let types: Vec<String> = p["resourceTypes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(cell)
        .collect();
    vec![
        cell(&p["name"]),
        cell(&p["status"]),
        if types.is_empty() {
            "-".to_owned()
        } else {
            types.join(",")
        },
        cell(&p["restarts"]),
        cell(&p["id"]),
    ]
}

fn repository_row(r: &Value) -> Vec<String> {
    vec![
        cell(&r["name"]),
        cell(&r["status"]),
        cell(&r["syncMode"]),
        cell(&r["progress"]["stored"]),
        cell(&r["lastSyncedAt"]),
        cell(&r["id"]),
    ]
}

fn replica_row(r: &Value) -> Vec<String> {
    vec![
        cell(&r["id"]),
        cell(&r["state"]),
        if r["leader"] == true { "yes" } else { "-" }.to_owned(),
        cell(&r["advertiseUrl"]),
        cell(&r["host"]),
        cell(&r["pid"]),
        cell(&r["version"]),
        cell(&r["keyId"]),
        cell(&r["heartbeatAt"]),
    ]
}
