//! Plans, applies, revisions and rollback.
//!
//! `plan` compares what runs with what is asked (a blueprint and variables)
//! through [`changes`](super::changes), previews where new replicas would go,
//! and stores the result with the state it saw (its `basis`); nothing runs.
//! `apply` refuses a plan the deployment moved away from (`CONFLICT`, naming
//! what moved), else places the new nodes, marks the others and opens a
//! revision in one transaction (under the run lock and the placing lock), and
//! hands the run to `executor::run_apply`. Every deploy and apply is a revision;
//! `rollback` plans and applies back to one.
//!
//! Never calls a provider's resources itself nor runs a DAG.

mod basis;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use super::blueprint::Blueprint;
use super::changes::{self, Action, Draft, NodeView};
use super::describe::{Described, describe};
use super::{
    DEPLOYED, DeployError, Deployment, DeploymentState, Deployments, EventKind, NodeState, Phase,
    blueprint,
};
use crate::store::deployments::{self as rows, DeploymentChange, NewNode, NodeRow};
use crate::store::plans::{self as stored, AddedNode, ApplyStart, NewRevision, NodeMark};
use basis::{Basis, is_gone};

/// Whether a plan was applied, as its column holds it (see `store::states`).
pub use crate::store::states::PlanState;

/// A stored plan.
#[derive(Clone, Debug)]
pub struct StoredPlan {
    pub id: Uuid,
    pub deployment_id: Uuid,
    pub created_at: DateTime<Utc>,
    pub created_by: Option<String>,
    pub blueprint_id: Option<Uuid>,
    pub source: String,
    pub variables: Value,
    pub draft: Draft,
    pub state: PlanState,
    pub applied_at: Option<DateTime<Utc>>,
}

/// One revision of a deployment.
#[derive(Clone, Debug)]
pub struct Revision {
    pub number: i32,
    pub kind: String,
    pub source: String,
    pub variables: Value,
    pub blueprint_id: Option<Uuid>,
    pub plan_id: Option<Uuid>,
    pub created_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub outcome: String,
    pub error: Option<String>,
}

/// What a plan is asked to reach. With neither a blueprint nor a source, the
/// deployment's blueprint as it is stored now; without variables, the
/// deployment's own (those the blueprint still declares).
#[derive(Clone, Debug, Default)]
pub struct Ask {
    pub blueprint_id: Option<Uuid>,
    pub source: Option<String>,
    pub variables: Option<serde_json::Map<String, Value>>,
}

/// The plans part of [`Deployments`].
#[derive(Clone, Copy)]
pub struct Plans<'a>(pub(super) &'a Deployments);

impl Plans<'_> {
    /// Computes and stores a plan; nothing runs.
    pub async fn plan(
        &self,
        id: Uuid,
        ask: Ask,
        by: Option<String>,
    ) -> Result<StoredPlan, DeployError> {
        let db = &self.0.inner.db;
        let deployment = self.settled(id, "plan").await?;
        let row = rows::find_deployment(db, id)
            .await?
            .ok_or_else(|| DeployError::NotFound(format!("deployment {id} not found")))?;
        let (blueprint_id, source) = self
            .asked_source(&deployment, ask.blueprint_id, ask.source)
            .await?;
        let (source, parsed) = super::blueprints::parse_off_workers(source).await?;
        let given = ask
            .variables
            .unwrap_or_else(|| still_declared(&deployment.variables, &parsed));
        let variables =
            blueprint::bind(&parsed, &given).map_err(|p| DeployError::Invalid(p.to_string()))?;
        let described = describe(self.0, &parsed)
            .await
            .map_err(DeployError::Invalid)?;
        let old = blueprint::parse(&row.source).map_err(|p| DeployError::Corrupt(p.to_string()))?;
        let nodes = rows::nodes_of(db, id).await?;
        // A drifted resource is compared as its provider sees it: the plan
        // puts it back (an update, or a replacement).
        let drift = self.0.health().drift_of(id, &nodes).await?;
        let views: Vec<NodeView> = nodes
            .iter()
            .filter(|n| !is_gone(n))
            .map(|n| seen_as(view(n), drift.get(&n.id)))
            .collect();
        let mut draft = changes::compute(&changes::Input {
            old: &old,
            new: &described.blueprint,
            variables: &variables,
            nodes: &views,
            capabilities: &described.capabilities,
        })
        .map_err(|p| DeployError::Invalid(p.to_string()))?;
        self.0
            .planner()
            .preview(&described.blueprint, &mut draft)
            .await?;
        let plan = stored::PlanRow {
            id: Uuid::now_v7(),
            deployment_id: id,
            created_at: Utc::now(),
            created_by: by,
            blueprint_id,
            source,
            variables: json_text(&variables)?,
            base_source: row.source.clone(),
            base_variables: row.variables.clone(),
            basis: json_text(&Basis::of(&row, &nodes))?,
            changes: json_text(&draft)?,
            state: PlanState::Pending,
            applied_at: None,
        };
        stored::insert_plan(db, plan.clone()).await?;
        to_plan(plan)
    }

    /// The blueprint a plan is asked to reach: its id (if it has one) and
    /// its source.
    async fn asked_source(
        &self,
        deployment: &Deployment,
        blueprint_id: Option<Uuid>,
        source: Option<String>,
    ) -> Result<(Option<Uuid>, String), DeployError> {
        match (blueprint_id, source) {
            (Some(_), Some(_)) => Err(DeployError::Invalid(
                "give a blueprintId or a blueprint source, not both".into(),
            )),
            (Some(bid), None) => {
                let stored = self.0.blueprints().get(bid).await?;
                if stored.project_id != deployment.project_id {
                    return Err(DeployError::Invalid(format!(
                        "blueprintId: blueprint `{}` is not in the deployment's project",
                        stored.name
                    )));
                }
                Ok((Some(stored.id), stored.source))
            }
            (None, Some(source)) => Ok((deployment.blueprint_id, source)),
            (None, None) => match deployment.blueprint_id {
                Some(bid) => Ok((Some(bid), self.0.blueprints().get(bid).await?.source)),
                None => Err(DeployError::Invalid(format!(
                    "deployment `{}` has no blueprint of its own: give a blueprint",
                    deployment.name
                ))),
            },
        }
    }

    pub async fn get(&self, plan_id: Uuid) -> Result<StoredPlan, DeployError> {
        let row = stored::find_plan(&self.0.inner.db, plan_id)
            .await?
            .ok_or_else(|| DeployError::NotFound(format!("plan {plan_id} not found")))?;
        to_plan(row)
    }

    /// Applies a plan in the background; refuses one the deployment moved
    /// away from.
    pub async fn apply(
        &self,
        plan_id: Uuid,
        by: Option<String>,
    ) -> Result<Deployment, DeployError> {
        self.apply_as(plan_id, by, "APPLY").await
    }

    /// Plans back to revision `number` and applies that plan.
    pub async fn rollback(
        &self,
        id: Uuid,
        number: i32,
        by: Option<String>,
    ) -> Result<(StoredPlan, Deployment), DeployError> {
        if number < 1 {
            return Err(DeployError::Invalid(format!(
                "revision: revisions are numbered from 1, not {number}"
            )));
        }
        let deployment = self.0.queries().get(id).await?;
        let revision = stored::find_revision(&self.0.inner.db, id, number)
            .await?
            .ok_or_else(|| {
                DeployError::NotFound(format!(
                    "deployment `{}` has no revision {number}",
                    deployment.name
                ))
            })?;
        let variables: serde_json::Map<String, Value> =
            serde_json::from_str(&revision.variables)
                .map_err(|e| DeployError::Corrupt(format!("revision {number}'s variables: {e}")))?;
        let plan = self
            .plan(
                id,
                Ask {
                    blueprint_id: None,
                    source: Some(revision.source),
                    variables: Some(variables),
                },
                by.clone(),
            )
            .await?;
        let deployment = self.apply_as(plan.id, by, "ROLLBACK").await?;
        Ok((self.get(plan.id).await?, deployment))
    }

    pub async fn revisions(&self, id: Uuid) -> Result<Vec<Revision>, DeployError> {
        stored::revisions_of(&self.0.inner.db, id)
            .await?
            .into_iter()
            .map(|r| {
                Ok(Revision {
                    number: r.number,
                    kind: r.kind,
                    variables: serde_json::from_str(&r.variables)
                        .map_err(|e| DeployError::Corrupt(format!("revision variables: {e}")))?,
                    source: r.source,
                    blueprint_id: r.blueprint_id,
                    plan_id: r.plan_id,
                    created_by: r.created_by,
                    created_at: r.created_at,
                    outcome: r.outcome,
                    error: r.error,
                })
            })
            .collect()
    }

    /// The deployment, when it is settled enough to plan or apply.
    async fn settled(&self, id: Uuid, doing: &str) -> Result<Deployment, DeployError> {
        let deployment = self.0.queries().get(id).await?;
        match deployment.state {
            DeploymentState::Destroying | DeploymentState::Destroyed => {
                Err(DeployError::Conflict(format!(
                    "deployment `{}` is {}; deploy the blueprint again instead",
                    deployment.name,
                    deployment.state.as_str()
                )))
            }
            DeploymentState::Pending | DeploymentState::InProgress => {
                Err(DeployError::Conflict(format!(
                    "deployment `{}` is {}; {doing} once it settles",
                    deployment.name,
                    deployment.state.as_str()
                )))
            }
            _ => Ok(deployment),
        }
    }

    async fn apply_as(
        &self,
        plan_id: Uuid,
        by: Option<String>,
        kind: &str,
    ) -> Result<Deployment, DeployError> {
        let db = &self.0.inner.db;
        let plan = self.pending(plan_id).await?;
        let id = plan.deployment_id;
        let deployment = self.settled(id, "apply").await?;
        let lock = self
            .0
            .runs()
            .lock_for_request(id, deployment.state, "apply")
            .await?;
        let row = rows::find_deployment(db, id)
            .await?
            .ok_or_else(|| DeployError::NotFound(format!("deployment {id} not found")))?;
        let nodes = rows::nodes_of(db, id).await?;
        basis::refuse_moved(&plan, &row, &nodes)?;
        let draft: Draft = serde_json::from_str(&plan.changes)
            .map_err(|e| DeployError::Corrupt(format!("plan changes: {e}")))?;
        let parsed =
            blueprint::parse(&plan.source).map_err(|p| DeployError::Corrupt(p.to_string()))?;
        let described = describe(self.0, &parsed)
            .await
            .map_err(DeployError::Invalid)?;
        let marked = Marked::of(plan_id, &draft, &described, &nodes)?;
        let summary = summary(&draft);
        let revision = revision(&plan, kind, by);
        let number = self
            .start_apply(&plan, &parsed, &described, &nodes, marked, revision)
            .await?;
        self.0
            .runs()
            .record(
                id,
                EventKind::State,
                None,
                Some(DeploymentState::InProgress.into()),
                format!("applying plan {plan_id} as revision {number}: {summary}"),
            )
            .await;
        let this = self.0.clone();
        self.0.inner.tasks.spawn(async move {
            this.executor().run_apply(&lock).await;
        });
        self.0.queries().get(id).await
    }

    /// The plan, while it is still pending.
    async fn pending(&self, plan_id: Uuid) -> Result<stored::PlanRow, DeployError> {
        let plan = stored::find_plan(&self.0.inner.db, plan_id)
            .await?
            .ok_or_else(|| DeployError::NotFound(format!("plan {plan_id} not found")))?;
        if plan.state != PlanState::Pending {
            return Err(DeployError::Conflict(format!(
                "plan {plan_id} was applied already{}",
                plan.applied_at
                    .map(|at| format!(" (at {})", at.to_rfc3339()))
                    .unwrap_or_default()
            )));
        }
        Ok(plan)
    }

    /// Places the plan's new nodes and starts the apply in one transaction
    /// (the marks, the new nodes, the revision, the deployment
    /// `IN_PROGRESS`), under the placing lock: no other plan takes their
    /// room between. Returns the revision's number.
    async fn start_apply(
        &self,
        plan: &stored::PlanRow,
        parsed: &Blueprint,
        described: &Described,
        nodes: &[NodeRow],
        marked: Marked,
        revision: NewRevision,
    ) -> Result<i32, DeployError> {
        let plan_id = plan.id;
        let _placing = self.0.inner.placing.lock().await;
        let placed = self
            .0
            .planner()
            .place_new(plan.deployment_id, described, &marked.wanted)
            .await
            .map_err(|e| {
                DeployError::Conflict(format!(
                    "plan {plan_id} cannot be placed now: {e}; plan again"
                ))
            })?;
        let added = added_nodes(placed, nodes, parsed, described);
        let number = stored::begin_apply(
            &self.0.inner.db,
            ApplyStart {
                deployment_id: plan.deployment_id,
                plan_id,
                source: plan.source.clone(),
                variables: plan.variables.clone(),
                blueprint_id: plan.blueprint_id,
                change: DeploymentChange {
                    state: DeploymentState::InProgress,
                    phase: Some(Phase::Apply.as_str()),
                    error: None,
                    operation_id: Some(plan_id),
                },
                marks: marked.marks,
                added,
                node_state: NodeState::ToDeploy,
                plan_state: PlanState::Applied,
                revision,
                remove_states: &[NodeState::Retired],
            },
        )
        .await?;
        Ok(number)
    }
}

/// What an apply does to the nodes there are, and the new nodes it places.
struct Marked {
    marks: Vec<NodeMark>,
    /// New nodes, as `(key, replica)`.
    wanted: Vec<(String, i32)>,
}

impl Marked {
    /// Each change of `draft` as a mark on its node or a new node; refuses
    /// (`CONFLICT`) a change whose node is gone.
    fn of(
        plan_id: Uuid,
        draft: &Draft,
        described: &Described,
        nodes: &[NodeRow],
    ) -> Result<Marked, DeployError> {
        let by_id: BTreeMap<Uuid, &NodeRow> = nodes.iter().map(|n| (n.id, n)).collect();
        let mut marks = Vec::new();
        let mut wanted: Vec<(String, i32)> = Vec::new();
        for change in &draft.changes {
            let node = change.node_id.and_then(|n| by_id.get(&n).copied());
            let capability = described.capabilities.get(&change.key);
            let quota = || {
                described
                    .quantities
                    .get(&change.key)
                    .map(|q| serde_json::to_string(q).unwrap_or_default())
            };
            match (change.action(), node) {
                (Action::Keep, _) => {}
                (Action::Update, Some(node)) => marks.push(mark(node.id, NodeState::ToUpdate)),
                (Action::Destroy, Some(node)) => {
                    marks.push(mark(node.id, NodeState::ToRetire));
                }
                (Action::Create, Some(node)) => marks.push(NodeMark {
                    resource_type: Some(change.resource_type.clone()),
                    provider_id: capability.map(|c| c.provider_id),
                    quota: Some(quota()),
                    ..mark(node.id, NodeState::ToDeploy)
                }),
                (Action::Replace, Some(node)) if !change.create_before_destroy => {
                    marks.push(NodeMark {
                        resource_type: Some(change.resource_type.clone()),
                        provider_id: capability.map(|c| c.provider_id),
                        quota: Some(quota()),
                        ..mark(node.id, NodeState::ToDestroy)
                    });
                }
                (Action::Replace, Some(node)) => {
                    marks.push(mark(node.id, NodeState::ToRetire));
                    wanted.push((change.key.clone(), change.replica));
                }
                (Action::Create, None) => wanted.push((change.key.clone(), change.replica)),
                (_, None) => {
                    return Err(DeployError::Conflict(format!(
                        "plan {plan_id}: {}[{}]'s node is gone; plan again",
                        change.key, change.replica
                    )));
                }
            }
        }
        Ok(Marked { marks, wanted })
    }
}

/// What a plan changes, counted by action (`2 to create, 1 to update`), for
/// its apply's event.
fn summary(draft: &Draft) -> String {
    let counts = draft.changes.iter().fold(BTreeMap::new(), |mut m, c| {
        *m.entry(c.action.as_str()).or_insert(0) += 1;
        m
    });
    let summary = counts
        .iter()
        .filter(|(a, _)| **a != Action::Keep.as_str())
        .map(|(a, n)| format!("{n} to {}", a.to_lowercase()))
        .collect::<Vec<_>>()
        .join(", ");
    if summary.is_empty() {
        "nothing to change".to_owned()
    } else {
        summary
    }
}

/// The revision an apply of `plan` opens, as `kind` (`APPLY`, `ROLLBACK`).
fn revision(plan: &stored::PlanRow, kind: &str, by: Option<String>) -> NewRevision {
    NewRevision {
        kind: kind.to_owned(),
        source: plan.source.clone(),
        variables: plan.variables.clone(),
        blueprint_id: plan.blueprint_id,
        plan_id: Some(plan.id),
        operation_id: Some(plan.id),
        created_by: by,
        outcome: "IN_PROGRESS".to_owned(),
    }
}

/// The rows of the nodes placed for an apply (`(key, replica, provider,
/// node)`), each a generation past the newest row of its replica.
fn added_nodes(
    placed: Vec<(String, i32, Uuid, Option<String>)>,
    nodes: &[NodeRow],
    parsed: &Blueprint,
    described: &Described,
) -> Vec<AddedNode> {
    let mut generation: BTreeMap<(String, i32), i32> = BTreeMap::new();
    for n in nodes {
        let g = generation.entry((n.key.clone(), n.replica)).or_insert(0);
        *g = (*g).max(n.generation + 1);
    }
    placed
        .into_iter()
        .map(|(key, replica, provider_id, node)| {
            let generation = generation
                .get(&(key.clone(), replica))
                .copied()
                .unwrap_or(0);
            AddedNode {
                node: NewNode {
                    resource_type: parsed
                        .resource(&key)
                        .map(|r| r.resource_type.clone())
                        .unwrap_or_default(),
                    quota: described
                        .quantities
                        .get(&key)
                        .map(|q| serde_json::to_string(q).unwrap_or_default()),
                    key,
                    replica,
                    provider_id: Some(provider_id),
                    node,
                },
                generation,
            }
        })
        .collect()
}

fn mark(id: Uuid, state: NodeState) -> NodeMark {
    NodeMark {
        id,
        state,
        resource_type: None,
        provider_id: None,
        node: None,
        quota: None,
    }
}

fn view(n: &NodeRow) -> NodeView {
    NodeView {
        id: n.id,
        key: n.key.clone(),
        replica: n.replica,
        generation: n.generation,
        resource_type: n.resource_type.clone(),
        provider_id: n.provider_id,
        node: n.node.clone(),
        deployed: DEPLOYED.contains(&n.state),
        state: n.state,
        config: n
            .config
            .as_deref()
            .and_then(|c| serde_json::from_str(c).ok()),
        outputs: n
            .outputs
            .as_deref()
            .and_then(|c| serde_json::from_str(c).ok()),
    }
}

/// A node's view with the values its provider sees for its drifted keys.
fn seen_as(mut view: NodeView, drift: Option<&serde_json::Map<String, Value>>) -> NodeView {
    if let (Some(Value::Object(config)), Some(drift)) = (view.config.as_mut(), drift) {
        for (key, seen) in drift {
            config.insert(key.clone(), seen.clone());
        }
    }
    view
}

/// The deployment's variables its new blueprint still declares: a plan's
/// variables when none are given.
fn still_declared(current: &Value, parsed: &Blueprint) -> serde_json::Map<String, Value> {
    match current {
        Value::Object(current) => current
            .iter()
            .filter(|(k, _)| parsed.variable(k).is_some())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        _ => serde_json::Map::new(),
    }
}

fn json_text<T: Serialize>(value: &T) -> Result<String, DeployError> {
    serde_json::to_string(value).map_err(|e| DeployError::Invalid(format!("cannot store: {e}")))
}

fn to_plan(row: stored::PlanRow) -> Result<StoredPlan, DeployError> {
    Ok(StoredPlan {
        id: row.id,
        deployment_id: row.deployment_id,
        created_at: row.created_at,
        created_by: row.created_by,
        blueprint_id: row.blueprint_id,
        variables: serde_json::from_str(&row.variables)
            .map_err(|e| DeployError::Corrupt(format!("plan variables: {e}")))?,
        draft: serde_json::from_str(&row.changes)
            .map_err(|e| DeployError::Corrupt(format!("plan changes: {e}")))?,
        source: row.source,
        state: row.state,
        applied_at: row.applied_at,
    })
}
