//! The checks of a provider's resources, per type with a sample: the
//! lifecycle (deploy twice, Inspect, destroy twice, a lost deploy found and
//! retried) and, from protocol version 2, an update in place.

use corbel_proto::v1 as proto;
use uuid::Uuid;

use super::super::link::Link;
use super::calls::{deploy, deploy_request, destroy, inspect, resource, update_call, update_gone};
use super::{Check, Outcome};

/// What `check_update` goes by.
pub(super) struct Update<'a> {
    /// The version the provider registered with.
    pub(super) version: u32,
    /// The keys DescribeResources listed for the type, if it described it.
    pub(super) updatable: Option<&'a [String]>,
    /// `check.updates` for the type.
    pub(super) to: Option<&'a serde_json::Value>,
}

/// The top-level keys whose values differ between two configs.
fn changed_keys(before: &serde_json::Value, after: &serde_json::Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let before = before.as_object().unwrap_or(&empty);
    let after = after.as_object().unwrap_or(&empty);
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .cloned()
        .collect()
}

/// What an update in place goes to, and the keys it changes; or, when it
/// cannot be checked, the row saying why.
fn update_plan<'a>(
    kind: &str,
    sample: &serde_json::Value,
    update: &Update<'a>,
) -> Result<(&'a serde_json::Value, Vec<String>), (Outcome, String)> {
    if update.version < corbel_proto::UPDATE_VERSION {
        return Err((
            Outcome::Skip,
            format!(
                "protocol version {}: never sent UpdateResource, a changed {kind} is replaced",
                update.version
            ),
        ));
    }
    let updatable = update.updatable.unwrap_or_default();
    if updatable.is_empty() {
        return Err((
            Outcome::Skip,
            format!("DescribeResources lists no updatable_keys: a changed {kind} is replaced"),
        ));
    }
    let Some(to) = update.to else {
        return Err((
            Outcome::Skip,
            format!(
                "{updatable:?} may change in place, but there is no config to update the \
                 sample to: add one under `check.updates` in corbel-provider.yaml"
            ),
        ));
    };
    let changed = changed_keys(sample, to);
    if changed.is_empty() {
        return Err((
            Outcome::Fail,
            format!("check.updates.{kind} is the sample as it is: change an updatable key"),
        ));
    }
    if let Some(key) = changed.iter().find(|k| !updatable.contains(k)) {
        return Err((
            Outcome::Fail,
            format!(
                "check.updates.{kind} changes `{key}`, which DescribeResources does not list \
                 as updatable ({updatable:?})"
            ),
        ));
    }
    Ok((to, changed))
}

/// Updates the deployed sample to `after`, and Inspect must then show the
/// outputs the update answered.
async fn update_and_inspect(
    link: &Link,
    after: &proto::Resource,
    sample: &serde_json::Value,
    deployed: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    let outputs = update_call(link, after, sample, deployed).await?;
    match inspect(link, after).await? {
        Some(seen) if seen == outputs => {}
        Some(seen) => {
            return Err(format!(
                "Inspect says {seen} after the update, which answered {outputs}"
            ));
        }
        None => return Err("Inspect says absent after the update".to_owned()),
    }
    Ok(outputs)
}

impl Check {
    /// Protocol version 2: a sample updated in place to its `check.updates`
    /// config, which Inspect then shows; the same update again changes
    /// nothing; an update of a resource that is gone is NOT_FOUND.
    pub(super) async fn check_update(
        &mut self,
        link: &Link,
        kind: &str,
        sample: &serde_json::Value,
        update: Update<'_>,
        node: &str,
    ) {
        let row = format!("update {kind} in place");
        let (to, changed) = match update_plan(kind, sample, &update) {
            Ok(plan) => plan,
            Err((outcome, detail)) => {
                self.report.add(row, outcome, detail);
                return;
            }
        };
        (self.say)(&format!("updating a {kind} in place"));
        let id = Uuid::new_v4().to_string();
        let before = resource("check-update", kind, sample, &id, node);
        let after = resource("check-update", kind, to, &id, node);
        let deployed = match deploy(link, &before).await {
            Ok(outputs) => outputs,
            Err(e) => {
                self.report
                    .add(row, Outcome::Fail, format!("deploying the sample: {e}"));
                return;
            }
        };
        let result = update_and_inspect(link, &after, sample, &deployed).await;
        let updated = result.is_ok();
        self.report.result(
            row,
            result
                .as_ref()
                .map(|o| format!("{changed:?} changed; outputs {o}"))
                .map_err(Clone::clone),
        );
        let outputs = result.unwrap_or(deployed);
        if updated {
            let again = update_call(link, &after, to, &outputs)
                .await
                .and_then(|second| {
                    if second == outputs {
                        Ok("the same outputs, nothing new".to_owned())
                    } else {
                        Err(format!("outputs differ: first {outputs}, then {second}"))
                    }
                });
            self.report
                .result(format!("update {kind} again (same config)"), again);
        }
        self.check_update_gone(link, kind, &after, to, &outputs)
            .await;
    }

    /// The updated sample destroyed, then updated: the protocol asks for
    /// NOT_FOUND.
    async fn check_update_gone(
        &mut self,
        link: &Link,
        kind: &str,
        after: &proto::Resource,
        to: &serde_json::Value,
        outputs: &serde_json::Value,
    ) {
        if let Err(e) = destroy(link, after, outputs).await {
            self.report.add(
                format!("update {kind} of one gone (NOT_FOUND)"),
                Outcome::Fail,
                format!("destroying the updated sample: {e}"),
            );
            return;
        }
        let gone = update_gone(link, after, to, outputs).await;
        let (outcome, detail) = match gone {
            Ok(()) => (
                Outcome::Fail,
                "succeeded, though the resource was destroyed: answer NOT_FOUND".to_owned(),
            ),
            Err((Some(tonic::Code::NotFound), message)) => (Outcome::Pass, message),
            Err((_, message)) => (
                Outcome::Warn,
                format!("{message}; the protocol asks for NOT_FOUND when the resource is gone"),
            ),
        };
        self.report.add(
            format!("update {kind} of one gone (NOT_FOUND)"),
            outcome,
            detail,
        );
    }

    /// Deploy, deploy again, inspect, destroy, inspect, destroy again; then
    /// a deploy whose answer is lost, found by Inspect and finished by a retry.
    pub(super) async fn check_lifecycle(
        &mut self,
        link: &Link,
        kind: &str,
        sample: &serde_json::Value,
        node: &str,
    ) {
        if sample.get("sandbox").and_then(|s| s.as_str()) == Some("none") {
            self.report.add(
                format!("sandbox {kind}"),
                Outcome::Warn,
                "the sample opts out of its sandbox (`sandbox: none`): such a workload \
                 may touch all its provider can"
                    .to_owned(),
            );
        }
        let id = Uuid::new_v4().to_string();
        let res = resource("check", kind, sample, &id, node);
        (self.say)(&format!("deploying a {kind}"));
        let first = deploy(link, &res).await;
        let Ok(outputs) = first.clone() else {
            self.report
                .result(format!("deploy {kind}"), first.map(|v| v.to_string()));
            return;
        };
        self.report.add(
            format!("deploy {kind}"),
            Outcome::Pass,
            format!("outputs {outputs}"),
        );
        let again = deploy(link, &res).await.and_then(|second| {
            if second == outputs {
                Ok("the same resource's outputs, nothing new".to_owned())
            } else {
                Err(format!("outputs differ: first {outputs}, then {second}"))
            }
        });
        self.report
            .result(format!("deploy {kind} again (same resource_id)"), again);
        let seen = inspect(link, &res).await.and_then(|found| match found {
            Some(found) if found == outputs => Ok("present, same outputs".to_owned()),
            Some(found) => Err(format!(
                "present, but outputs {found} differ from {outputs}"
            )),
            None => Err("says absent after a deploy".to_owned()),
        });
        self.report.result(format!("Inspect {kind}"), seen);
        self.destroy_and_verify(link, kind, &res, &outputs).await;

        // A deploy whose caller hangs up before any answer: the outcome is
        // lost, as when the server is killed mid-call.
        let lost_id = Uuid::new_v4().to_string();
        let lost = resource("check-lost", kind, sample, &lost_id, node);
        let result = async {
            drop(link.deploy_resource(deploy_request(&lost)).await);
            let found = inspect(link, &lost).await?;
            let retried = deploy(link, &lost).await?;
            match inspect(link, &lost).await? {
                Some(now) if now == retried => {}
                Some(now) => return Err(format!("Inspect says {now}, the retry said {retried}")),
                None => return Err("absent after the retried deploy".to_owned()),
            }
            destroy(link, &lost, &retried).await?;
            if inspect(link, &lost).await?.is_some() {
                return Err("still present after destroy".to_owned());
            }
            Ok(format!(
                "Inspect found it {} after the lost call; the retry converged and it was destroyed",
                if found.is_some() { "present" } else { "absent" }
            ))
        }
        .await;
        self.report
            .result(format!("lost deploy of {kind}: Inspect, retry"), result);
    }

    async fn destroy_and_verify(
        &mut self,
        link: &Link,
        kind: &str,
        res: &proto::Resource,
        outputs: &serde_json::Value,
    ) {
        let destroyed = destroy(link, res, outputs).await;
        let ok = destroyed.is_ok();
        self.report.result(format!("destroy {kind}"), destroyed);
        if !ok {
            return;
        }
        let gone = inspect(link, res).await.and_then(|found| match found {
            None => Ok("absent".to_owned()),
            Some(found) => Err(format!("still present: {found}")),
        });
        self.report
            .result(format!("Inspect {kind} after destroy"), gone);
        let twice = destroy(link, res, outputs).await;
        self.report
            .result(format!("destroy {kind} again (already gone)"), twice);
    }
}
