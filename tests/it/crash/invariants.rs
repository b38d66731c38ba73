//! The invariants of a settled world, and of what a redeploy or a fault must
//! have left untouched.

use std::collections::{BTreeMap, BTreeSet};

use super::chaos::{Chaos, Redeploy, Violation, violation};
use super::observe::{View, identities, records};
use super::world::{Proc, world};

impl Chaos {
    /// The invariants of a settled world: each deployment where its last
    /// request asked, each resource once, and the processes with the mark
    /// exactly those the COMPLETE nodes of live deployments name.
    pub(super) fn check(
        &self,
        views: &BTreeMap<String, View>,
        world: &BTreeMap<i32, Proc>,
    ) -> Vec<Violation> {
        let mut found = Vec::new();
        for t in &self.tracked {
            let Some(v) = views.get(&t.id) else {
                found.push(violation(format!("deployment {}", t.name), "is missing"));
                continue;
            };
            if v.state != t.want.state() {
                found.push(violation(
                    format!("deployment {} is {}", t.name, v.state),
                    format!(
                        "its last request asked for {} (error: {}); nodes {}",
                        t.want.state(),
                        v.error.as_deref().unwrap_or("none"),
                        v.histogram()
                    ),
                ));
            }
            let mut nodes: BTreeMap<(&str, i64), usize> = BTreeMap::new();
            for n in &v.nodes {
                *nodes.entry((&n.key, n.replica)).or_default() += 1;
            }
            for ((key, replica), count) in nodes.iter().filter(|(_, c)| **c > 1) {
                found.push(violation(
                    format!("{} node {key}[{replica}]", t.name),
                    format!("appears {count} times"),
                ));
            }
            let unlike: Vec<String> = v
                .nodes
                .iter()
                .filter(|n| match v.state.as_str() {
                    "COMPLETE" => n.state != "COMPLETE" || n.pid.is_none(),
                    "DESTROYED" => n.state != "DESTROYED",
                    _ => false,
                })
                .map(|n| {
                    format!(
                        "{} {} (pid {:?}, error {:?})",
                        n.key, n.state, n.pid, n.error
                    )
                })
                .collect();
            if !unlike.is_empty() {
                found.push(violation(
                    format!("{} nodes unlike their {} deployment", t.name, v.state),
                    format!("{}: {}", unlike.len(), unlike.join("; ")),
                ));
            }
            if v.state == "COMPLETE" {
                for key in self
                    .shape
                    .keys
                    .iter()
                    .filter(|k| !nodes.contains_key(&(k, 0)))
                {
                    found.push(violation(
                        format!("{} node {key}", t.name),
                        "is missing from a COMPLETE deployment",
                    ));
                }
            }
        }
        let recorded = records(views);
        for (pid, owners) in &recorded {
            if owners.len() > 1 {
                found.push(violation(
                    format!("pid {pid}"),
                    format!("is recorded by {} nodes: {owners:?}", owners.len()),
                ));
            }
            let (name, key) = &owners[0];
            match world.get(pid) {
                None => found.push(violation(
                    format!("{name} {key}: pid {pid}"),
                    "is recorded by a COMPLETE node, but not running",
                )),
                Some(p) if (&p.tag, &p.key) != (name, key) => found.push(violation(
                    format!("{name} {key}: pid {pid}"),
                    format!("is recorded for it, but runs {}/{}", p.tag, p.key),
                )),
                Some(_) => {}
            }
        }
        let mut running: BTreeMap<(&str, &str), Vec<i32>> = BTreeMap::new();
        for p in world.values() {
            running.entry((&p.tag, &p.key)).or_default().push(p.pid);
            if !recorded.contains_key(&p.pid) {
                found.push(violation(
                    format!("pid {} ({}/{})", p.pid, p.tag, p.key),
                    "runs with the mark, but no COMPLETE node records it",
                ));
            }
        }
        for ((tag, key), pids) in running.into_iter().filter(|(_, pids)| pids.len() > 1) {
            found.push(violation(
                format!("{tag} {key} runs {} times", pids.len()),
                format!("pids {pids:?}"),
            ));
        }
        found
    }

    /// After a settled redeploy: its key and the key's dependents run as new
    /// processes, every other resource as before.
    pub fn check_redeploy(&self, r: &Redeploy, views: &BTreeMap<String, View>) -> Vec<Violation> {
        let what = format!("{} redeploy of {}", r.name, r.key);
        self.check_replaced(&r.id, &what, &r.before, &r.affected, views)
    }

    /// Which resources of deployment `id` run as new processes since
    /// `before` (pid and start time): exactly those in `replaced`.
    pub fn check_replaced(
        &self,
        id: &str,
        what: &str,
        before: &BTreeMap<String, (i32, u64)>,
        replaced: &BTreeSet<String>,
        views: &BTreeMap<String, View>,
    ) -> Vec<Violation> {
        let Some(v) = views.get(id) else {
            return Vec::new();
        };
        let now = identities(v, &world(&self.mark));
        let mut found = Vec::new();
        for key in &self.shape.keys {
            let (was, is) = (before.get(key), now.get(key));
            let should = replaced.contains(key);
            if should == (was != is) {
                continue;
            }
            let detail = if should {
                format!("should run anew, but was not replaced (still {is:?})")
            } else {
                format!("should be untouched, but was replaced ({was:?} -> {is:?})")
            };
            found.push(violation(format!("{what}: {key}"), detail));
        }
        found
    }
}
