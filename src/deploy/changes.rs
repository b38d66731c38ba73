//! What applying a blueprint and variables to a running deployment would do,
//! per resource and replica: create, update in place, replace, destroy or
//! keep. Pure: the caller reads the nodes and asks the providers what they
//! can update; nothing here calls anything.
//!
//! The rules:
//! - a key only the new blueprint has is created; one only the running
//!   deployment has is destroyed; replicas past the new count are destroyed,
//!   and the ones added are created;
//! - a replica whose type or provider changes is replaced;
//! - otherwise its stored config (as rendered when it was deployed) is
//!   compared, top-level key by key, with the new config rendered with the
//!   new variables and the outputs running now. A key whose template reads
//!   the outputs of a resource this plan creates, updates or replaces cannot
//!   be known before the apply: it counts as changed, and the plan names the
//!   resources it ripples from;
//! - no key changed: kept. Every changed key one the provider declared
//!   updatable (protocol version 2): updated in place. Else replaced, saying
//!   which keys and why;
//! - a node that is not running (failed, tainted, never deployed) is created
//!   again in its row; rows an interrupted replacement left beside the one
//!   that runs are destroyed.
//!
//! Values under a key that looks like a credential (`password`, `token`, …)
//! are never shown: the diff says only that they changed.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::NodeState;
use super::blueprint::{self, Blueprint, Problem};
use super::template;
use crate::text::text_enum;

text_enum! {
    pub enum Action {
        Create = "CREATE",
        Update = "UPDATE",
        Replace = "REPLACE",
        Destroy = "DESTROY",
        Keep = "KEEP",
    }
}

/// Shown in place of a credential's value.
pub const MASK: &str = "(secret)";

/// One top-level config key that changes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfigChange {
    pub key: String,
    /// `None`: the key was not set.
    pub before: Option<Value>,
    /// `None`: the key is no longer set, or (`known` false) not known
    /// before the apply.
    pub after: Option<Value>,
    /// False when the new value reads outputs that change with this plan.
    pub known: bool,
    /// The values are masked.
    pub secret: bool,
}

/// What the plan does to one replica of one resource.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub key: String,
    pub replica: i32,
    pub action: String,
    pub resource_type: String,
    /// The running (or failed) node it acts on; `None` for a new one.
    pub node_id: Option<Uuid>,
    /// Why: for a replace, the keys the provider cannot update; for a
    /// create in a running key, what the node was.
    pub reason: Option<String>,
    pub config: Vec<ConfigChange>,
    /// Resources whose changing outputs reach this one through templates.
    pub ripples_from: Vec<String>,
    /// A replace: the new one is made before the old one goes.
    pub create_before_destroy: bool,
    /// The provider node it runs on now.
    pub placement_before: Option<String>,
    /// The provider node a new one would go on, as placement sees it now.
    pub placement: Option<String>,
}

impl Change {
    pub fn action(&self) -> Action {
        self.action.parse().unwrap_or(Action::Keep)
    }
}

/// A node of the running deployment, as the plan needs it.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub id: Uuid,
    pub key: String,
    pub replica: i32,
    pub generation: i32,
    pub resource_type: String,
    pub provider_id: Option<Uuid>,
    pub node: Option<String>,
    /// `COMPLETE` or `SUSPENDED`: it holds a running resource.
    pub deployed: bool,
    pub state: NodeState,
    pub config: Option<Value>,
    pub outputs: Option<Value>,
}

/// What the new blueprint's provider for a key can do.
#[derive(Clone, Debug)]
pub struct Capability {
    pub provider_id: Uuid,
    pub provider_name: String,
    /// The keys it can update in place; `None` when it cannot update at all
    /// (protocol version 1).
    pub updatable: Option<BTreeSet<String>>,
    /// The resource and its replacement cannot exist at once: a replacement
    /// destroys the old one first.
    pub destroy_first: bool,
}

pub struct Input<'a> {
    pub old: &'a Blueprint,
    /// The new blueprint, with the dependencies its providers add.
    pub new: &'a Blueprint,
    pub variables: &'a BTreeMap<String, Value>,
    /// The deployment's nodes that are not destroyed or retired.
    pub nodes: &'a [NodeView],
    /// By the new blueprint's keys.
    pub capabilities: &'a BTreeMap<String, Capability>,
}

/// The changes, in the new blueprint's dependency order (dependencies first),
/// then the keys no longer asked for; and notes on what a plan does not
/// change (placement of running replicas).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Draft {
    pub changes: Vec<Change>,
    pub notes: Vec<String>,
}

/// Computes the changes. A config that cannot be rendered (an output a
/// running dependency does not have) is a problem naming it.
pub fn compute(input: &Input<'_>) -> Result<Draft, Problem> {
    let order = blueprint::order(input.new)?;
    let mut by_key: BTreeMap<&str, Vec<&NodeView>> = BTreeMap::new();
    for node in input.nodes {
        by_key.entry(node.key.as_str()).or_default().push(node);
    }
    let outputs = lasting_outputs(input.nodes);
    let mut changing: BTreeSet<String> = BTreeSet::new();
    let mut draft = Draft::default();
    for key in &order {
        let resource = input
            .new
            .resource(key)
            .expect("order names the blueprint's keys");
        let running = by_key.remove(key.as_str()).unwrap_or_default();
        let keyed = Keyed {
            input,
            resource,
            running: &running,
        };
        if keyed.changes(&outputs, &changing, &mut draft)? {
            changing.insert(key.clone());
        }
    }
    destroy_removed(input.old, &by_key, &mut draft);
    Ok(draft)
}

/// Outputs that hold through the apply: replica 0 of each running key.
fn lasting_outputs(nodes: &[NodeView]) -> BTreeMap<String, Value> {
    let mut outputs: BTreeMap<String, Value> = BTreeMap::new();
    for node in nodes {
        if node.replica == 0
            && node.deployed
            && let Some(o) = &node.outputs
        {
            outputs.insert(node.key.clone(), o.clone());
        }
    }
    outputs
}

/// One key of the new blueprint, and the nodes that run it now.
struct Keyed<'a> {
    input: &'a Input<'a>,
    resource: &'a blueprint::Resource,
    running: &'a [&'a NodeView],
}

impl Keyed<'_> {
    /// Adds the key's changes to `draft`, its config rendered with `outputs`
    /// save what reads the `changing` keys. Returns whether its outputs
    /// change with the plan (its replica 0 is created, updated or replaced).
    fn changes(
        &self,
        outputs: &BTreeMap<String, Value>,
        changing: &BTreeSet<String>,
        draft: &mut Draft,
    ) -> Result<bool, Problem> {
        let (input, resource) = (self.input, self.resource);
        let key = &resource.key;
        let count = blueprint::replicas(resource, input.variables)?;
        let count = i32::try_from(count).unwrap_or(i32::MAX);
        let capability = input.capabilities.get(key.as_str());
        if let Some(old) = input.old.resource(key)
            && old.strategy != resource.strategy
            && !self.running.is_empty()
        {
            draft.notes.push(format!(
                "resources.{key}: strategy {} → {}: replicas added are placed by the new one; \
                 running ones stay where they are",
                old.strategy.as_str(),
                resource.strategy.as_str()
            ));
        }
        let rendered = render_keys(resource, input.variables, outputs, changing)?;
        let (chosen, extra) = choose(self.running);
        for node in extra {
            draft.changes.push(destroy(
                node,
                Some("left beside the running one by an interrupted replacement".into()),
            ));
        }
        let mut outputs_change = false;
        for replica in 0..count.max(chosen.keys().next_back().map_or(0, |r| r + 1)) {
            let node = chosen.get(&replica).copied();
            let change = match node {
                Some(node) if replica >= count => destroy(node, None),
                None => create(resource, replica, None),
                Some(node) if !node.deployed => create(resource, replica, Some(node)),
                Some(node) => compare(node, resource, capability, &rendered),
            };
            if replica == 0
                && matches!(
                    change.action(),
                    Action::Create | Action::Update | Action::Replace
                )
            {
                outputs_change = true;
            }
            draft.changes.push(change);
        }
        Ok(outputs_change)
    }
}

/// Destroys the keys no longer asked for, dependents first (the old
/// blueprint's order, reversed).
fn destroy_removed(old: &Blueprint, by_key: &BTreeMap<&str, Vec<&NodeView>>, draft: &mut Draft) {
    let old_order = blueprint::order(old).unwrap_or_default();
    let mut removed: Vec<&str> = old_order
        .iter()
        .rev()
        .map(String::as_str)
        .filter(|k| by_key.contains_key(k))
        .collect();
    removed.extend(
        by_key
            .keys()
            .copied()
            .filter(|k| !old_order.iter().any(|o| o == k)),
    );
    for key in removed {
        for node in by_key.get(key).into_iter().flatten() {
            draft.changes.push(destroy(node, None));
        }
    }
}

/// Creates `replica` of `resource`: new, or again in the row of `node`,
/// which is not running.
fn create(resource: &blueprint::Resource, replica: i32, node: Option<&NodeView>) -> Change {
    Change {
        key: resource.key.clone(),
        replica,
        action: Action::Create.as_str().to_owned(),
        resource_type: resource.resource_type.clone(),
        node_id: node.map(|n| n.id),
        reason: node.map(|n| format!("not running ({})", n.state)),
        config: Vec::new(),
        ripples_from: Vec::new(),
        create_before_destroy: false,
        placement_before: node.and_then(|n| n.node.clone()),
        placement: node.and_then(|n| n.node.clone()),
    }
}

/// For each replica, the node that speaks for it (running before not, then
/// the newest generation); the others.
fn choose<'a>(nodes: &[&'a NodeView]) -> (BTreeMap<i32, &'a NodeView>, Vec<&'a NodeView>) {
    let mut chosen: BTreeMap<i32, &NodeView> = BTreeMap::new();
    let mut extra = Vec::new();
    for node in nodes {
        match chosen.get(&node.replica) {
            None => {
                chosen.insert(node.replica, node);
            }
            Some(held) => {
                let better = (node.deployed, node.generation) > (held.deployed, held.generation);
                if better {
                    extra.push(*held);
                    chosen.insert(node.replica, node);
                } else {
                    extra.push(*node);
                }
            }
        }
    }
    (chosen, extra)
}

fn destroy(node: &NodeView, reason: Option<String>) -> Change {
    Change {
        key: node.key.clone(),
        replica: node.replica,
        action: Action::Destroy.as_str().to_owned(),
        resource_type: node.resource_type.clone(),
        node_id: Some(node.id),
        reason,
        config: Vec::new(),
        ripples_from: Vec::new(),
        create_before_destroy: false,
        placement_before: node.node.clone(),
        placement: None,
    }
}

/// A top-level key's new value: rendered, or unknown until the apply since
/// it reads outputs of these (changing) resources.
enum NewValue {
    Known(Value),
    After(Vec<String>),
}

/// The new config's top-level keys.
fn render_keys(
    resource: &blueprint::Resource,
    variables: &BTreeMap<String, Value>,
    outputs: &BTreeMap<String, Value>,
    changing: &BTreeSet<String>,
) -> Result<BTreeMap<String, NewValue>, Problem> {
    let mut keys = BTreeMap::new();
    let Value::Object(config) = &resource.config else {
        return Ok(keys);
    };
    let ctx = template::Context { variables, outputs };
    for (name, value) in config {
        let path = format!("resources.{}.config.{name}", resource.key);
        let mut from = BTreeSet::new();
        for (_, text) in template::strings(value, "") {
            for reference in template::references(text).unwrap_or_default() {
                if let template::Reference::Output { resource: r, .. } = reference
                    && changing.contains(&r)
                {
                    from.insert(r);
                }
            }
        }
        let new = if from.is_empty() {
            let rendered = template::render(value, &ctx).map_err(|p| {
                Problem::new(
                    if p.path.is_empty() {
                        path.clone()
                    } else {
                        format!("{path}.{}", p.path)
                    },
                    p.message,
                )
            })?;
            NewValue::Known(rendered)
        } else {
            NewValue::After(from.into_iter().collect())
        };
        keys.insert(name.clone(), new);
    }
    Ok(keys)
}

/// A running replica against the new config.
fn compare(
    node: &NodeView,
    resource: &blueprint::Resource,
    capability: Option<&Capability>,
    rendered: &BTreeMap<String, NewValue>,
) -> Change {
    let (config, ripples) = config_changes(node, rendered);
    let mut change = Change {
        key: node.key.clone(),
        replica: node.replica,
        action: Action::Keep.as_str().to_owned(),
        resource_type: resource.resource_type.clone(),
        node_id: Some(node.id),
        reason: None,
        config,
        ripples_from: ripples.into_iter().collect(),
        create_before_destroy: false,
        placement_before: node.node.clone(),
        placement: node.node.clone(),
    };
    let moved = match capability {
        Some(c) if node.provider_id.is_some_and(|p| p != c.provider_id) => {
            Some(format!("its provider changes to `{}`", c.provider_name))
        }
        _ if node.resource_type != resource.resource_type => Some(format!(
            "its type changes from `{}` to `{}`",
            node.resource_type, resource.resource_type
        )),
        _ => None,
    };
    if let Some(moved) = moved {
        replaced(&mut change, capability, moved);
        return change;
    }
    if !change.config.is_empty() {
        update_or_replace(&mut change, capability);
    }
    change
}

/// The top-level keys whose value changes from the node's stored config to
/// the `rendered` one (credentials masked), and the resources whose
/// changing outputs the unknown ones read.
fn config_changes(
    node: &NodeView,
    rendered: &BTreeMap<String, NewValue>,
) -> (Vec<ConfigChange>, BTreeSet<String>) {
    let empty = serde_json::Map::new();
    let before = match &node.config {
        Some(Value::Object(map)) => map,
        _ => &empty,
    };
    let mut changes = Vec::new();
    let mut ripples = BTreeSet::new();
    let names: BTreeSet<&String> = before.keys().chain(rendered.keys()).collect();
    for name in names {
        let secret = crate::redact::is_credential_name(name);
        let old = before.get(name.as_str());
        let (after, known) = match rendered.get(name.as_str()) {
            None => (None, true),
            Some(NewValue::Known(v)) => {
                if old == Some(v) {
                    continue;
                }
                (Some(v.clone()), true)
            }
            Some(NewValue::After(from)) => {
                ripples.extend(from.iter().cloned());
                (None, false)
            }
        };
        let mask =
            |v: Option<&Value>| v.map(|v| if secret { Value::from(MASK) } else { v.clone() });
        changes.push(ConfigChange {
            key: name.clone(),
            before: mask(old),
            after: mask(after.as_ref()),
            known,
            secret,
        });
    }
    (changes, ripples)
}

/// A replica whose config changes, on the same provider and type: updated
/// in place when its provider can update every changed key, else replaced,
/// saying which keys and why.
fn update_or_replace(change: &mut Change, capability: Option<&Capability>) {
    let changed: Vec<&str> = change.config.iter().map(|c| c.key.as_str()).collect();
    let quoted = |keys: &[&str]| {
        keys.iter()
            .map(|k| format!("`{k}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let name = capability.map_or("?", |c| c.provider_name.as_str());
    let reason = match capability.and_then(|c| c.updatable.as_ref()) {
        Some(updatable) if changed.iter().all(|k| updatable.contains(*k)) => None,
        Some(updatable) => {
            let fixed: Vec<&str> = changed
                .iter()
                .copied()
                .filter(|k| !updatable.contains(*k))
                .collect();
            Some(format!(
                "{} changed, and provider `{name}` cannot update {} in place",
                quoted(&changed),
                if fixed.len() == changed.len() {
                    "them".to_owned()
                } else {
                    quoted(&fixed)
                }
            ))
        }
        None => Some(format!(
            "{} changed, and provider `{name}` cannot update in place (it speaks protocol \
             version 1)",
            quoted(&changed)
        )),
    };
    match reason {
        None => change.action = Action::Update.as_str().to_owned(),
        Some(reason) => replaced(change, capability, reason),
    }
}

/// Makes `change` a replacement for `reason`: the new one first, unless its
/// provider says the two cannot exist at once (placement may still make it
/// destroy-first, for want of room).
fn replaced(change: &mut Change, capability: Option<&Capability>, reason: String) {
    change.action = Action::Replace.as_str().to_owned();
    if let Some(c) = capability.filter(|c| c.destroy_first) {
        change.create_before_destroy = false;
        change.placement = change.placement_before.clone();
        change.reason = Some(format!(
            "{reason}; destroyed before it is made again: provider `{}` says the old and the \
             new cannot exist at once",
            c.provider_name
        ));
    } else {
        change.create_before_destroy = true;
        change.placement = None;
        change.reason = Some(reason);
    }
}

#[cfg(test)]
mod tests;
