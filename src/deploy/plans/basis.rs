//! The deployment as a plan saw it (its operation, state, and each node's
//! state and config): stored with the plan, so an apply refuses a plan whose
//! basis is no longer the deployment's, naming what moved.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::deploy::{DeployError, NodeState};
use crate::store::deployments::{DeploymentRow, NodeRow};
use crate::store::plans::PlanRow;

/// What a plan saw of the deployment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Basis {
    operation: Option<Uuid>,
    state: String,
    /// Node id → `key[replica] STATE`, and its config.
    nodes: BTreeMap<Uuid, (String, Option<String>)>,
}

impl Basis {
    pub(super) fn of(deployment: &DeploymentRow, nodes: &[NodeRow]) -> Basis {
        Basis {
            operation: deployment.operation_id,
            state: deployment.state.as_str().to_owned(),
            nodes: nodes
                .iter()
                .filter(|n| !is_gone(n))
                .map(|n| {
                    (
                        n.id,
                        (
                            format!("{}[{}] {}", n.key, n.replica, n.state),
                            n.config.clone(),
                        ),
                    )
                })
                .collect(),
        }
    }

    /// What moved from `self` (the plan's) to `now`.
    fn moved(&self, now: &Basis) -> Vec<String> {
        let mut moved = Vec::new();
        if self.operation != now.operation {
            moved.push("another operation ran on the deployment since".to_owned());
        }
        if self.state != now.state {
            moved.push(format!(
                "its state went from {} to {}",
                self.state, now.state
            ));
        }
        for (id, (label, config)) in &self.nodes {
            match now.nodes.get(id) {
                None => moved.push(format!("{} is gone", node_name(label))),
                Some((now_label, _)) if now_label != label => {
                    moved.push(format!("{label} is now {}", state_of(now_label)));
                }
                Some((_, now_config)) if now_config != config => {
                    moved.push(format!("{}'s config changed", node_name(label)));
                }
                Some(_) => {}
            }
        }
        for (id, (label, _)) in &now.nodes {
            if !self.nodes.contains_key(id) {
                moved.push(format!("{label} was added"));
            }
        }
        moved
    }
}

/// Refuses `plan` (`CONFLICT`) when the deployment, now `row` with `nodes`,
/// moved since the plan was made: its blueprint, its variables, or its basis.
pub(super) fn refuse_moved(
    plan: &PlanRow,
    row: &DeploymentRow,
    nodes: &[NodeRow],
) -> Result<(), DeployError> {
    let then: Basis = serde_json::from_str(&plan.basis)
        .map_err(|e| DeployError::Corrupt(format!("plan basis: {e}")))?;
    let mut moved = then.moved(&Basis::of(row, nodes));
    if row.source != plan.base_source {
        moved.insert(0, "its blueprint changed".to_owned());
    }
    if row.variables != plan.base_variables {
        moved.insert(0, "its variables changed".to_owned());
    }
    if !moved.is_empty() {
        return Err(DeployError::Conflict(format!(
            "the deployment moved since plan {} was made: {}; plan again",
            plan.id,
            moved.join("; ")
        )));
    }
    Ok(())
}

fn node_name(label: &str) -> &str {
    label.split(' ').next().unwrap_or(label)
}

fn state_of(label: &str) -> &str {
    label.rsplit(' ').next().unwrap_or(label)
}

/// Rows that hold nothing and never will: destroyed or retired.
pub(super) fn is_gone(node: &NodeRow) -> bool {
    node.state == NodeState::Destroyed || node.state == NodeState::Retired
}
