//! `corbel deploy` and `corbel destroy`: what the tour's scripts do with
//! `createBlueprint`/`updateBlueprint` and `deployBlueprint`, or
//! `destroyDeployment`, then (with `--wait`) the run followed to its end.

use std::path::PathBuf;

use serde_json::{Map, Value, json};

use super::Context;
use super::error::ClientError;
use super::follow;
use super::output::{cell, table};
use super::resolve;

#[derive(Debug, clap::Args)]
pub struct DeployArgs {
    /// The blueprint's YAML file.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// The blueprint's and the deployment's name [default: the file's name
    /// without its extension].
    #[arg(long)]
    pub name: Option<String>,
    /// The project (name or id) the blueprint goes in [default: `default`].
    #[arg(long)]
    pub project: Option<String>,
    /// A variable, `KEY=VALUE`; VALUE is read as JSON when it is JSON
    /// (`replicas=3`, `debug=true`), else as a string. Repeat for more.
    #[arg(long = "var", value_name = "KEY=VALUE")]
    pub vars: Vec<String>,
    /// Follow the run until it is COMPLETE (exit 0) or FAILED (exit 1).
    #[arg(long)]
    pub wait: bool,
}

pub async fn deploy(context: &Context, args: DeployArgs) -> Result<(), ClientError> {
    let api = context.signed_in().await?;
    let source = std::fs::read_to_string(&args.file)
        .map_err(|e| ClientError::Usage(format!("cannot read {}: {e}", args.file.display())))?;
    let name = match args.name {
        Some(name) => name,
        None => args
            .file
            .file_stem()
            .and_then(|s| s.to_str())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                ClientError::Usage(format!(
                    "{} gives no name: give --name",
                    args.file.display()
                ))
            })?
            .to_owned(),
    };
    let variables = variables(&args.vars)?;
    let project = args.project.as_deref().unwrap_or("default");
    let project = resolve::project(api, project).await?;

    let live: Vec<Value> = resolve::deployments_named(api, &name)
        .await?
        .into_iter()
        .filter(|d| d["state"] != "DESTROYED")
        .collect();
    if let Some(existing) = live.first() {
        return Err(ClientError::Conflict(format!(
            "a deployment named `{name}` exists ({}, {}): destroy it first \
             (`corbel destroy {name}`) or give another --name",
            cell(&existing["id"]),
            cell(&existing["state"])
        )));
    }

    let blueprint = store_blueprint(context, &name, &project, &source).await?;
    for warning in blueprint["warnings"].as_array().into_iter().flatten() {
        context.output.note(&format!("warning: {}", cell(warning)));
    }
    let blueprint_id = cell(&blueprint["id"]);
    let started: Value = api
        .get(
            &format!(
                "mutation($input: DeployBlueprintInput!) {{ deployBlueprint(input: $input) {{ {} }} }}",
                resolve::DEPLOYMENT
            ),
            json!({ "input": { "blueprintId": blueprint_id, "name": name, "variables": variables } }),
            "deployBlueprint",
        )
        .await?;
    let id = cell(&started["id"]);
    if !args.wait {
        return shown(context, &started, "started");
    }
    context.output.note(&format!(
        "Deploying `{name}` ({id}); Ctrl-C stops waiting, not the deploy."
    ));
    let ended = follow::wait(api, &id, 0, context.output).await?;
    settled(context, &ended, "COMPLETE")
}

#[derive(Debug, clap::Args)]
pub struct DestroyArgs {
    /// The deployment's name or id.
    pub deployment: String,
    /// Follow the run until it is DESTROYED (exit 0) or FAILED (exit 1).
    #[arg(long)]
    pub wait: bool,
}

pub async fn destroy(context: &Context, args: DestroyArgs) -> Result<(), ClientError> {
    let api = context.signed_in().await?;
    let deployment = resolve::deployment(api, &args.deployment).await?;
    let id = cell(&deployment["id"]);
    // Only this run's events count: the history may hold an earlier end.
    let after = if args.wait {
        follow::last_event_id(api, &id).await?
    } else {
        0
    };
    let started: Value = api
        .get(
            &format!(
                "mutation($id: ID!) {{ destroyDeployment(id: $id) {{ {} }} }}",
                resolve::DEPLOYMENT
            ),
            json!({ "id": id }),
            "destroyDeployment",
        )
        .await?;
    if !args.wait {
        return shown(context, &started, "destroying");
    }
    context.output.note(&format!(
        "Destroying `{}` ({id}); Ctrl-C stops waiting, not the destroy.",
        cell(&deployment["name"])
    ));
    let ended = follow::wait(api, &id, after, context.output).await?;
    settled(context, &ended, "DESTROYED")
}

/// The stored blueprint of that name in the project, its source replaced
/// when the file differs; made when there is none.
async fn store_blueprint(
    context: &Context,
    name: &str,
    project: &str,
    source: &str,
) -> Result<Value, ClientError> {
    let api = &context.api;
    const FIELDS: &str = "id name projectId source warnings";
    let existing = api
        .all("blueprints", None, FIELDS)
        .await?
        .into_iter()
        .find(|b| b["name"] == name && b["projectId"] == project);
    match existing {
        Some(blueprint) if blueprint["source"] == source => Ok(blueprint),
        Some(blueprint) => {
            context
                .output
                .note(&format!("Updating the blueprint `{name}` from the file."));
            api.get(
                &format!(
                    "mutation($id: ID!, $input: UpdateBlueprintInput!) {{ \
                     updateBlueprint(id: $id, input: $input) {{ {FIELDS} }} }}"
                ),
                json!({ "id": blueprint["id"], "input": { "source": source } }),
                "updateBlueprint",
            )
            .await
        }
        None => {
            api.get(
                &format!(
                    "mutation($input: CreateBlueprintInput!) {{ \
                     createBlueprint(input: $input) {{ {FIELDS} }} }}"
                ),
                json!({ "input": { "projectId": project, "name": name, "source": source } }),
                "createBlueprint",
            )
            .await
        }
    }
}

/// `--var k=v`s as a JSON object.
pub(super) fn variables(vars: &[String]) -> Result<Value, ClientError> {
    let mut object = Map::new();
    for var in vars {
        let Some((key, value)) = var.split_once('=') else {
            return Err(ClientError::Usage(format!(
                "--var `{var}` is not KEY=VALUE"
            )));
        };
        if key.is_empty() {
            return Err(ClientError::Usage(format!("--var `{var}` has no name")));
        }
        let value = serde_json::from_str(value).unwrap_or_else(|_| Value::from(value));
        object.insert(key.to_owned(), value);
    }
    Ok(Value::Object(object))
}

/// A deployment just started (`--wait` not given).
fn shown(context: &Context, deployment: &Value, what: &str) -> Result<(), ClientError> {
    if context.output.structured() {
        context.output.value(deployment);
    } else {
        println!(
            "Deployment `{}` ({}) {what}: {}. Follow it with `corbel events deployment {} --follow`.",
            cell(&deployment["name"]),
            cell(&deployment["id"]),
            cell(&deployment["state"]),
            cell(&deployment["name"]),
        );
    }
    Ok(())
}

/// A settled deployment: shown, and an error unless it is in `wanted`.
pub(super) fn settled(
    context: &Context,
    deployment: &Value,
    wanted: &str,
) -> Result<(), ClientError> {
    let state = cell(&deployment["state"]);
    if context.output.structured() {
        context.output.value(deployment);
    } else {
        println!(
            "Deployment `{}` ({}) is {state}.",
            cell(&deployment["name"]),
            cell(&deployment["id"])
        );
        let rows: Vec<Vec<String>> = deployment["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| {
                vec![
                    format!("{}[{}]", cell(&n["key"]), cell(&n["replica"])),
                    cell(&n["state"]),
                    cell(&n["node"]),
                    cell(&n["error"]),
                ]
            })
            .collect();
        if !rows.is_empty() {
            print!(
                "{}",
                table(&["NODE KEY", "STATE", "PLACED ON", "ERROR"], &rows)
            );
        }
    }
    if state == wanted {
        Ok(())
    } else {
        Err(ClientError::Failed(format!(
            "deployment `{}` is {state}: {}",
            cell(&deployment["name"]),
            deployment["error"].as_str().unwrap_or("no error recorded")
        )))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn variables_are_json_when_they_parse() {
        let vars = [
            "replicas=3",
            "greeting=hello",
            "on=true",
            "quoted=\"3\"",
            "eq=a=b",
        ]
        .map(String::from);
        assert_eq!(
            super::variables(&vars).unwrap(),
            json!({ "replicas": 3, "greeting": "hello", "on": true, "quoted": "3", "eq": "a=b" })
        );
        assert!(super::variables(&["nothing".to_owned()]).is_err());
        assert!(super::variables(&["=1".to_owned()]).is_err());
    }
}
