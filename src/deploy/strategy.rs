//! Placement strategies: how many replicas of one resource land on which node.
//!
//! This module owns the pure part of planning a deployment (DESIGN.md, "Blueprints and
//! deployments"): given each candidate node's spare capacity, the replicas of this
//! resource already on it (deployed plus in flight), and its resource usage, a strategy
//! decides how many replicas to add where. No IO and no clock; the caller gathers the
//! inputs under the placement lock and stores the plan in the same transaction as the
//! journal entry.
//!
//! The semantics follow eru core's `strategy` package, with the differences written on
//! each strategy below:
//!
//! | strategy  | `need` means            | rule |
//! |-----------|-------------------------|------|
//! | `AUTO`    | replicas to add         | one at a time to the node with the fewest replicas that still has room; ties: more room left, then name |
//! | `FILL`    | replicas wanted per node | every node is topped up to `need`; a node that cannot reach it fails the plan |
//! | `EACH`    | replicas to add per node | `need` more on every node; a node without room for `need` fails the plan |
//! | `GLOBAL`  | replicas to add         | one at a time to the node whose usage after taking it is lowest; ties: fewer replicas, then name |
//! | `DRAINED` | replicas to add         | nodes with the least room first, each filled to its capacity before the next |
//!
//! Every node passed in is a candidate. eru's caller drops nodes with no capacity before
//! any strategy runs; with `FILL` and `EACH` that decides whether a full node is skipped
//! or fails the plan, so that choice is left to our caller too.
//!
//! Architecture invariant: nothing here is O(replicas). `AUTO` and `GLOBAL` are
//! specified as "one replica at a time" greedy loops, but are computed by water-filling
//! (a binary search for the level the greedy loop would stop at), so a plan costs
//! O(nodes · log(range)) and `replicas: 1000000000000` is as cheap as `replicas: 3`.
//! The tests check both against the literal greedy loop.

use std::cmp::Reverse;

use serde::{Deserialize, Serialize};

use crate::text::text_enum;

text_enum! {
    /// How the replicas of one resource are spread over its provider's nodes.
    /// The texts are the names used in blueprints and the API; parsing takes
    /// exact, upper-case names only, as in blueprints and as serde reads them.
    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "UPPERCASE")]
    pub enum Strategy {
        /// Even out the per-node replica count (eru's "communism" plan).
        Auto = "AUTO",
        /// Top every node up to N replicas in total.
        Fill = "FILL",
        /// Add N replicas on every node (eru's "average" plan).
        Each = "EACH",
        /// Keep node resource usage as even as possible.
        Global = "GLOBAL",
        /// Fill the nodes with the least room first.
        Drained = "DRAINED",
    }
}

/// What the planner knows about one candidate node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInput {
    /// Node name, unique among the inputs; it orders the output and breaks ties.
    pub name: String,
    /// How many more replicas of this resource the node can take (>= 0).
    pub capacity: i64,
    /// Replicas of this resource already on the node: deployed plus in flight (>= 0).
    pub count: i64,
    /// The node's current resource usage as a ratio: 0.0 idle, 1.0 full, above 1.0
    /// overcommitted. Finite and >= 0. Read by `GLOBAL`, and by `DRAINED` to break ties.
    pub usage: f64,
    /// How much `usage` one more replica adds (the request over the node's total, eru's
    /// `Rate`). Finite and >= 0. Read by `GLOBAL` only; 0.0 means "unknown", and
    /// `GLOBAL` then spreads by replica count among nodes of equal usage.
    pub rate: f64,
}

impl NodeInput {
    /// A node with no usage figures, enough for every strategy but `GLOBAL`.
    pub fn new(name: impl Into<String>, capacity: i64, count: i64) -> Self {
        NodeInput {
            name: name.into(),
            capacity,
            count,
            usage: 0.0,
            rate: 0.0,
        }
    }

    /// The same node with its usage ratio and per-replica usage increment.
    pub fn with_usage(mut self, usage: f64, rate: f64) -> Self {
        self.usage = usage;
        self.rate = rate;
        self
    }
}

/// The outcome of a strategy: how many replicas to add on which node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Node name and replicas to add there, sorted by node name, without zeros.
    pub placements: Vec<(String, i64)>,
    /// The sum of `placements`.
    pub total: i64,
}

impl Plan {
    /// Replicas this plan adds on `node` (0 if none).
    pub fn get(&self, node: &str) -> i64 {
        self.placements
            .binary_search_by(|(name, _)| name.as_str().cmp(node))
            .map_or(0, |i| self.placements[i].1)
    }

    /// True when the plan adds nothing.
    pub fn is_empty(&self) -> bool {
        self.placements.is_empty()
    }
}

/// Why no plan could be made. Messages are written for the user who asked for replicas.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StrategyError {
    /// The nodes lack room. `need` and `available` count replicas over all nodes; for
    /// `FILL` and `EACH`, `available` is how much of `need` would fit, and `short_node`
    /// names the first node (by name) without room for its share.
    #[error(
        "{strategy} placement needs room for {need} more replicas, but the nodes have room for only {available}{}",
        short_node_hint(.short_node.as_deref())
    )]
    NotEnoughCapacity {
        strategy: Strategy,
        need: i64,
        available: i64,
        short_node: Option<String>,
    },
    /// The provider offered no node at all.
    #[error("{strategy} placement has no nodes to place replicas on")]
    NoNodes { strategy: Strategy },
    /// A node's figures are unusable (negative, NaN, a duplicate name...).
    #[error("invalid node `{node}`: {reason}")]
    InvalidInput { node: String, reason: String },
    /// The requested replica count is negative, or the plan's total would not fit in i64.
    #[error("{strategy} placement cannot place {need} replicas: {reason}")]
    InvalidNeed {
        strategy: Strategy,
        need: i64,
        reason: &'static str,
    },
}

fn short_node_hint(node: Option<&str>) -> String {
    node.map(|n| format!(" (node `{n}` is short of room for its share)"))
        .unwrap_or_default()
}

/// Places `need` replicas with `strategy` (for `FILL`, `need` is the per-node target; for
/// `EACH`, the per-node increment). `need == 0` gives an empty plan.
pub fn plan(strategy: Strategy, nodes: &[NodeInput], need: i64) -> Result<Plan, StrategyError> {
    if need < 0 {
        return Err(StrategyError::InvalidNeed {
            strategy,
            need,
            reason: "the replica count is negative",
        });
    }
    if nodes.is_empty() {
        return Err(StrategyError::NoNodes { strategy });
    }
    let nodes = prepare(nodes)?;
    if need == 0 {
        return Ok(Plan::default());
    }
    let alloc = match strategy {
        Strategy::Auto => auto(&nodes, need)?,
        Strategy::Fill => fill(&nodes, need)?,
        Strategy::Each => each(&nodes, need)?,
        Strategy::Global => global(&nodes, need)?,
        Strategy::Drained => drained(&nodes, need)?,
    };
    finish(strategy, need, &nodes, &alloc)
}

/// Each node's raw capacity, sorted by name (eru's `DUMMY` strategy, used by
/// `calculateCapacity` without a strategy). Negative capacities read as 0; nothing else
/// is validated, so duplicates are kept in input order.
pub fn raw_capacity(nodes: &[NodeInput]) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = nodes
        .iter()
        .map(|n| (n.name.clone(), n.capacity.max(0)))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// A validated node, in name order; its index in that order is its tie-break rank.
struct Node<'a> {
    name: &'a str,
    cap: i128,
    count: i128,
    usage: f64,
    /// `usage` and `rate` in units of 1e-9, so `GLOBAL` compares exact integers and the
    /// greedy definition and the water-filling computation cannot disagree on rounding.
    usage_q: i128,
    rate_q: i128,
}

fn prepare(nodes: &[NodeInput]) -> Result<Vec<Node<'_>>, StrategyError> {
    let invalid = |n: &NodeInput, reason: String| StrategyError::InvalidInput {
        node: n.name.clone(),
        reason,
    };
    let mut out = Vec::with_capacity(nodes.len());
    for n in nodes {
        if n.name.is_empty() {
            return Err(invalid(n, "the node name is empty".into()));
        }
        if n.capacity < 0 {
            return Err(invalid(n, format!("capacity {} is negative", n.capacity)));
        }
        if n.count < 0 {
            return Err(invalid(n, format!("replica count {} is negative", n.count)));
        }
        for (what, value) in [("usage", n.usage), ("rate", n.rate)] {
            if !value.is_finite() || value < 0.0 {
                return Err(invalid(
                    n,
                    format!("{what} {value} is not a finite number >= 0"),
                ));
            }
        }
        out.push(Node {
            name: &n.name,
            cap: i128::from(n.capacity),
            count: i128::from(n.count),
            usage: n.usage,
            usage_q: quantize(n.usage),
            rate_q: quantize(n.rate),
        });
    }
    out.sort_unstable_by(|a, b| a.name.cmp(b.name));
    if let Some(pair) = out.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(StrategyError::InvalidInput {
            node: pair[0].name.to_owned(),
            reason: "the node name appears more than once".into(),
        });
    }
    Ok(out)
}

/// Fixed point with 1e-9 resolution, capped at 2^62 so keys stay far inside i128.
fn quantize(ratio: f64) -> i128 {
    const CAP: f64 = (1u64 << 62) as f64;
    // Finite and >= 0 by validation; `as` saturates, and the clamp keeps the bound.
    (ratio * 1e9).round().clamp(0.0, CAP) as i128
}

fn finish(
    strategy: Strategy,
    need: i64,
    nodes: &[Node<'_>],
    alloc: &[i128],
) -> Result<Plan, StrategyError> {
    let too_large = StrategyError::InvalidNeed {
        strategy,
        need,
        reason: "the plan's total does not fit in a 64-bit count",
    };
    let mut placements = Vec::new();
    let mut total: i64 = 0;
    for (node, &n) in nodes.iter().zip(alloc) {
        if n > 0 {
            let n = i64::try_from(n).map_err(|_| too_large.clone())?;
            total = total.checked_add(n).ok_or_else(|| too_large.clone())?;
            placements.push((node.name.to_owned(), n));
        }
    }
    Ok(Plan { placements, total })
}

fn saturate(n: i128) -> i64 {
    i64::try_from(n).unwrap_or(if n < 0 { i64::MIN } else { i64::MAX })
}

fn total_capacity(nodes: &[Node<'_>]) -> i128 {
    nodes.iter().map(|n| n.cap).sum()
}

fn not_enough(strategy: Strategy, need: i128, available: i128) -> StrategyError {
    StrategyError::NotEnoughCapacity {
        strategy,
        need: saturate(need),
        available: saturate(available),
        short_node: None,
    }
}

/// The smallest `level` in `lo..=hi` with `filled(level) >= need`, for a non-decreasing
/// `filled` with `filled(hi) >= need`.
fn lowest_level(mut lo: i128, mut hi: i128, need: i128, filled: impl Fn(i128) -> i128) -> i128 {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if filled(mid) >= need {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// Water-filling over items that each own the slots `start+1 ..= start+room`: takes the
/// `need` lowest slots, leaving ties at the last level to the caller. Returns that level
/// and, per item, the slots taken strictly below it; the caller gives one more to
/// `need - sum` of the items with `start < level <= start + room`. Requires
/// `1 <= need <= sum(room)`.
fn water_fill(items: &[(i128, i128)], need: i128) -> (i128, Vec<i128>) {
    let below = |level: i128, &(start, room): &(i128, i128)| (level - start).max(0).min(room);
    let hi = items.iter().map(|&(s, r)| s + r).max().unwrap_or(0);
    let level = lowest_level(0, hi, need, |l| items.iter().map(|it| below(l, it)).sum());
    let taken = items.iter().map(|it| below(level - 1, it)).collect();
    (level, taken)
}

fn ties_at(level: i128, start: i128, room: i128) -> bool {
    start < level && level <= start + room
}

/// AUTO (eru `CommunismPlan`): the literal rule is "repeat `need` times: give one replica
/// to the node with the lowest count that has room, preferring more room left, then the
/// lower name". That greedy loop raises the lowest counts level by level, so it equals
/// water-filling the counts up to a level L, plus one more on some nodes that reach L;
/// those are the ones with the most room left at L — i.e. the largest count + capacity —
/// then by name. Differences from eru: its heap breaks full ties arbitrarily, we use the
/// name; eru's `nodes_limit` (a per-node ceiling) is not offered.
fn auto(nodes: &[Node<'_>], need: i64) -> Result<Vec<i128>, StrategyError> {
    let need = i128::from(need);
    let total = total_capacity(nodes);
    if total < need {
        return Err(not_enough(Strategy::Auto, need, total));
    }
    let items: Vec<(i128, i128)> = nodes.iter().map(|n| (n.count, n.cap)).collect();
    let (level, mut alloc) = water_fill(&items, need);
    let rest = need - alloc.iter().sum::<i128>();
    let mut tied: Vec<usize> = (0..items.len())
        .filter(|&i| ties_at(level, items[i].0, items[i].1))
        .collect();
    tied.sort_unstable_by_key(|&i| (Reverse(items[i].0 + items[i].1), i));
    let rest = usize::try_from(rest).unwrap_or(usize::MAX);
    for &i in tied.iter().take(rest) {
        alloc[i] += 1;
    }
    Ok(alloc)
}

/// FILL (eru `FillPlan` without a node limit): every node ends with at least `target`
/// replicas; a node below it gets `target - count`, a node at or above it gets nothing.
/// Like eru, one node that cannot reach `target` fails the whole plan rather than being
/// skipped. Difference: when no node needs anything eru returns `ErrAlreadyFilled`; we
/// return an empty plan, so re-running an unchanged FILL deployment is a no-op.
fn fill(nodes: &[Node<'_>], target: i64) -> Result<Vec<i128>, StrategyError> {
    let target = i128::from(target);
    let deficits: Vec<i128> = nodes.iter().map(|n| (target - n.count).max(0)).collect();
    per_node_shares(Strategy::Fill, nodes, deficits)
}

/// EACH (eru `AveragePlan` without a node limit): `per_node` more on every node, and a
/// node without room for `per_node` fails the plan.
fn each(nodes: &[Node<'_>], per_node: i64) -> Result<Vec<i128>, StrategyError> {
    let shares = vec![i128::from(per_node); nodes.len()];
    per_node_shares(Strategy::Each, nodes, shares)
}

fn per_node_shares(
    strategy: Strategy,
    nodes: &[Node<'_>],
    shares: Vec<i128>,
) -> Result<Vec<i128>, StrategyError> {
    let short = nodes.iter().zip(&shares).position(|(n, &s)| s > n.cap);
    if let Some(first) = short {
        let need = shares.iter().sum::<i128>();
        let available = nodes.iter().zip(&shares).map(|(n, &s)| s.min(n.cap)).sum();
        return Err(StrategyError::NotEnoughCapacity {
            strategy,
            need: saturate(need),
            available: saturate(available),
            short_node: Some(nodes[first].name.to_owned()),
        });
    }
    Ok(shares)
}

/// GLOBAL (eru `GlobalPlan`): the literal rule is "repeat `need` times: give one replica
/// to the node with room whose usage after taking it, `usage + k·rate` for its k-th new
/// replica, is lowest". Each node's k-th replica is a slot with that key; the plan takes
/// the `need` smallest slots in the order (key, count after placement, name). Found by a
/// binary search for the key level, then a water-fill by count among the slots tied at
/// that level. Differences from eru: usage and rate are compared at 1e-9 resolution;
/// eru's heap breaks ties arbitrarily, we prefer the node with fewer replicas, then the
/// lower name (which also spreads replicas when rates are unknown, i.e. 0).
fn global(nodes: &[Node<'_>], need: i64) -> Result<Vec<i128>, StrategyError> {
    let need = i128::from(need);
    let total = total_capacity(nodes);
    if total < need {
        return Err(not_enough(Strategy::Global, need, total));
    }
    // Slots of `n` whose key is <= `key`.
    let slots_upto = |n: &Node<'_>, key: i128| -> i128 {
        if n.cap == 0 {
            0
        } else if n.rate_q == 0 {
            if n.usage_q <= key { n.cap } else { 0 }
        } else {
            let headroom = key - n.usage_q;
            if headroom < n.rate_q {
                0
            } else {
                (headroom / n.rate_q).min(n.cap)
            }
        }
    };
    let hi = nodes
        .iter()
        .filter(|n| n.cap > 0)
        .map(|n| n.usage_q + n.cap * n.rate_q)
        .max()
        .unwrap_or(0);
    let key = lowest_level(0, hi, need, |k| {
        nodes.iter().map(|n| slots_upto(n, k)).sum()
    });
    let base: Vec<i128> = nodes.iter().map(|n| slots_upto(n, key - 1)).collect();
    let tied_need = need - base.iter().sum::<i128>();
    // Slots exactly at `key`: one per node with rate > 0, all of them with rate 0.
    let items: Vec<(i128, i128)> = nodes
        .iter()
        .zip(&base)
        .map(|(n, &b)| (n.count + b, slots_upto(n, key) - b))
        .collect();
    let (level, extra) = water_fill(&items, tied_need);
    let mut rest = tied_need - extra.iter().sum::<i128>();
    let mut alloc: Vec<i128> = base.iter().zip(&extra).map(|(b, e)| b + e).collect();
    for (i, &(start, room)) in items.iter().enumerate() {
        if rest == 0 {
            break;
        }
        if ties_at(level, start, room) {
            alloc[i] += 1;
            rest -= 1;
        }
    }
    Ok(alloc)
}

/// DRAINED (eru `DrainedPlan`): nodes in order of least capacity first, then higher
/// usage, then name; each takes all it can until `need` is met. Zero-capacity nodes come
/// first and take nothing (eru's caller drops them before the strategy runs).
fn drained(nodes: &[Node<'_>], need: i64) -> Result<Vec<i128>, StrategyError> {
    let need = i128::from(need);
    let total = total_capacity(nodes);
    if total < need {
        return Err(not_enough(Strategy::Drained, need, total));
    }
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_unstable_by(|&a, &b| {
        let (x, y) = (&nodes[a], &nodes[b]);
        x.cap
            .cmp(&y.cap)
            .then(y.usage.total_cmp(&x.usage))
            .then(a.cmp(&b))
    });
    let mut alloc = vec![0; nodes.len()];
    let mut left = need;
    for i in order {
        if left == 0 {
            break;
        }
        let take = left.min(nodes[i].cap);
        alloc[i] = take;
        left -= take;
    }
    Ok(alloc)
}

#[cfg(test)]
mod tests;
