//! `corbel plan`, `corbel apply`, `corbel rollback` and `corbel revisions`:
//! `planDeployment` shown as a diff, `applyPlan` (with `--wait`, the run
//! followed to its end), `rollbackDeployment`, and `Deployment.revisions`.

use std::path::PathBuf;

use serde_json::{Value, json};

use super::Context;
use super::deploy::{settled, variables};
use super::error::ClientError;
use super::follow;
use super::output::{cell, table};
use super::resolve;

const PLAN: &str = "id deploymentId state summary { create update replace destroy keep } \
    changes { key replica action reason ripplesFrom createBeforeDestroy placement \
    config { key before after known secret } } notes";

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// The deployment's name or id.
    pub deployment: String,
    /// A blueprint's YAML file to move to [default: the deployment's
    /// blueprint as it is stored now].
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// A variable, `KEY=VALUE` (JSON when it parses), over the deployment's
    /// own. Repeat for more.
    #[arg(long = "var", value_name = "KEY=VALUE")]
    pub vars: Vec<String>,
}

pub async fn plan(context: &Context, args: PlanArgs) -> Result<(), ClientError> {
    let api = context.signed_in().await?;
    let deployment = resolve::deployment(api, &args.deployment).await?;
    let mut input = json!({ "deploymentId": deployment["id"] });
    if let Some(file) = &args.file {
        let source = std::fs::read_to_string(file)
            .map_err(|e| ClientError::Usage(format!("cannot read {}: {e}", file.display())))?;
        input["blueprintSource"] = json!(source);
    }
    if !args.vars.is_empty() {
        let mut merged = deployment["variables"].clone();
        if !merged.is_object() {
            merged = json!({});
        }
        if let (Some(merged), Value::Object(given)) =
            (merged.as_object_mut(), variables(&args.vars)?)
        {
            merged.extend(given);
        }
        input["variables"] = merged;
    }
    let planned: Value = api
        .get(
            &format!(
                "mutation($input: PlanDeploymentInput!) {{ planDeployment(input: $input) {{ {PLAN} }} }}"
            ),
            json!({ "input": input }),
            "planDeployment",
        )
        .await?;
    if context.output.structured() {
        context.output.value(&planned);
        return Ok(());
    }
    print!("{}", render(&planned));
    println!(
        "Plan {} for `{}`. Apply it with `corbel apply {}`.",
        cell(&planned["id"]),
        cell(&deployment["name"]),
        cell(&planned["id"])
    );
    Ok(())
}

/// A plan as a diff: one line per change that does something, its config
/// keys under it.
fn render(plan: &Value) -> String {
    let mut out = String::new();
    for change in plan["changes"].as_array().into_iter().flatten() {
        let sign = match change["action"].as_str().unwrap_or_default() {
            "CREATE" => "+",
            "UPDATE" => "~",
            "REPLACE" => "-/+",
            "DESTROY" => "-",
            _ => continue,
        };
        out.push_str(&format!(
            "{sign} {}[{}] {}",
            cell(&change["key"]),
            cell(&change["replica"]),
            cell(&change["action"]).to_lowercase()
        ));
        if let Some(reason) = change["reason"].as_str() {
            out.push_str(&format!(" ({reason})"));
        }
        if change["action"] == "REPLACE" && change["createBeforeDestroy"] == true {
            out.push_str(" [new one first]");
        }
        out.push('\n');
        for diff in change["config"].as_array().into_iter().flatten() {
            let after = if diff["known"] == false {
                "(known after apply)".to_owned()
            } else {
                shown(&diff["after"])
            };
            out.push_str(&format!(
                "      {}: {} → {after}\n",
                cell(&diff["key"]),
                shown(&diff["before"])
            ));
        }
    }
    for note in plan["notes"].as_array().into_iter().flatten() {
        out.push_str(&format!("note: {}\n", cell(note)));
    }
    let s = &plan["summary"];
    out.push_str(&format!(
        "{} to create, {} to update, {} to replace, {} to destroy, {} unchanged.\n",
        cell(&s["create"]),
        cell(&s["update"]),
        cell(&s["replace"]),
        cell(&s["destroy"]),
        cell(&s["keep"])
    ));
    out
}

fn shown(value: &Value) -> String {
    if value.is_null() {
        "(unset)".to_owned()
    } else {
        value.to_string()
    }
}

#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// The plan's id (`corbel plan` prints it).
    pub plan: String,
    /// Follow the run until it is COMPLETE (exit 0) or FAILED (exit 1).
    #[arg(long)]
    pub wait: bool,
}

pub async fn apply(context: &Context, args: ApplyArgs) -> Result<(), ClientError> {
    let api = context.signed_in().await?;
    let found: Value = api
        .get(
            "query($id: ID!) { plan(id: $id) { deploymentId } }",
            json!({ "id": args.plan }),
            "plan",
        )
        .await?;
    let id = cell(&found["deploymentId"]);
    let after = follow::last_event_id(api, &id).await?;
    let started: Value = api
        .get(
            &format!(
                "mutation($id: ID!) {{ applyPlan(id: $id) {{ {} }} }}",
                resolve::DEPLOYMENT
            ),
            json!({ "id": args.plan }),
            "applyPlan",
        )
        .await?;
    follow_or_show(context, &started, after, args.wait, "applying").await
}

#[derive(Debug, clap::Args)]
pub struct RollbackArgs {
    /// The deployment's name or id.
    pub deployment: String,
    /// The revision to go back to (`corbel revisions` lists them).
    pub revision: i32,
    /// Follow the run until it is COMPLETE (exit 0) or FAILED (exit 1).
    #[arg(long)]
    pub wait: bool,
}

pub async fn rollback(context: &Context, args: RollbackArgs) -> Result<(), ClientError> {
    let api = context.signed_in().await?;
    let deployment = resolve::deployment(api, &args.deployment).await?;
    let id = cell(&deployment["id"]);
    let after = follow::last_event_id(api, &id).await?;
    let answer: Value = api
        .get(
            &format!(
                "mutation($id: ID!, $revision: Int!) {{ rollbackDeployment(id: $id, revision: $revision) \
                 {{ plan {{ {PLAN} }} deployment {{ {} }} }} }}",
                resolve::DEPLOYMENT
            ),
            json!({ "id": id, "revision": args.revision }),
            "rollbackDeployment",
        )
        .await?;
    if !context.output.structured() {
        print!("{}", render(&answer["plan"]));
    }
    follow_or_show(
        context,
        &answer["deployment"],
        after,
        args.wait,
        "rolling back",
    )
    .await
}

async fn follow_or_show(
    context: &Context,
    started: &Value,
    after: i64,
    wait: bool,
    what: &str,
) -> Result<(), ClientError> {
    let id = cell(&started["id"]);
    if !wait {
        if context.output.structured() {
            context.output.value(started);
        } else {
            println!(
                "Deployment `{}` ({id}) is {what}. Follow it with `corbel events deployment {} --follow`.",
                cell(&started["name"]),
                cell(&started["name"])
            );
        }
        return Ok(());
    }
    context.output.note(&format!(
        "Deployment `{}` ({id}) is {what}; Ctrl-C stops waiting, not the run.",
        cell(&started["name"])
    ));
    let api = context.signed_in().await?;
    let ended = follow::wait(api, &id, after, context.output).await?;
    settled(context, &ended, "COMPLETE")
}

#[derive(Debug, clap::Args)]
pub struct RevisionsArgs {
    /// The deployment's name or id.
    pub deployment: String,
}

pub async fn revisions(context: &Context, args: RevisionsArgs) -> Result<(), ClientError> {
    let api = context.signed_in().await?;
    let deployment = resolve::deployment(api, &args.deployment).await?;
    let found: Value = api
        .get(
            "query($id: ID!) { deployment(id: $id) { revisions { number kind outcome createdBy createdAt planId variables error } } }",
            json!({ "id": deployment["id"] }),
            "deployment",
        )
        .await?;
    let revisions = &found["revisions"];
    if context.output.structured() {
        context.output.value(revisions);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = revisions
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            vec![
                cell(&r["number"]),
                cell(&r["kind"]),
                cell(&r["outcome"]),
                cell(&r["createdBy"]),
                cell(&r["createdAt"]),
                r["variables"].to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &["REVISION", "KIND", "OUTCOME", "BY", "AT", "VARIABLES"],
            &rows
        )
    );
    Ok(())
}
