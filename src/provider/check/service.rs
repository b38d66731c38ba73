//! The checks of a registered provider's own calls, before any resource:
//! the handshake and registration it made, health, `Configure` (and its
//! refusals), `ListNodes`, `DescribeResources`, and surviving a call whose
//! deadline passed.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use corbel_proto::v1 as proto;

use super::super::check_host::CheckHost;
use super::super::link::{Link, LinkError};
use super::super::metadata;
use super::calls::resource;
use super::{Check, Outcome};

/// The service name a provider's `grpc.health.v1` must report SERVING.
const PROVIDER_SERVICE: &str = "corbel.provider.v1.Provider";

impl Check {
    pub(super) fn check_handshake(&mut self, host: &CheckHost) {
        match host.seen().handshakes.first() {
            Some((theirs, Ok(chosen))) => self.report.add(
                "handshake",
                Outcome::Pass,
                format!("offered {theirs:?}, agreed on {chosen}"),
            ),
            Some((theirs, Err(e))) => self.report.add(
                "handshake",
                Outcome::Fail,
                format!("offered {theirs:?}: {e}"),
            ),
            None => self.report.add(
                "handshake",
                Outcome::Warn,
                "Registry.Handshake was not called",
            ),
        }
    }

    pub(super) fn check_registration(&mut self, host: &CheckHost, meta: &metadata::Metadata) {
        let seen = host.seen();
        let Some((request, _)) = seen.registrations.first() else {
            return;
        };
        let said: HashSet<&String> = request.resource_types.iter().collect();
        let written: HashSet<&String> = meta.resource_types.iter().collect();
        if said == written {
            self.report.add(
                "resource types",
                Outcome::Pass,
                "as corbel-provider.yaml says",
            );
        } else {
            self.report.add(
                "resource types",
                Outcome::Fail,
                format!(
                    "Register says {:?}, corbel-provider.yaml says {:?}",
                    request.resource_types, meta.resource_types
                ),
            );
        }
        let said: HashSet<&String> = request.features.iter().collect();
        let written: HashSet<&String> = meta.features.iter().collect();
        if said != written {
            self.report.add(
                "features",
                Outcome::Warn,
                format!(
                    "Register says {:?}, corbel-provider.yaml says {:?}",
                    request.features, meta.features
                ),
            );
        }
    }

    pub(super) async fn check_health(&mut self, link: &Link) {
        for service in ["", PROVIDER_SERVICE] {
            let shown = if service.is_empty() {
                "health (\"\")".to_owned()
            } else {
                format!("health ({service})")
            };
            let result = link
                .check_service_health(service, None)
                .await
                .map(|()| "SERVING".to_owned())
                .map_err(|e| e.to_string());
            self.report.result(shown, result);
        }
    }

    pub(super) async fn check_configure(&mut self, link: &Link, good: &str) {
        let result = link.configure(good.to_owned()).await;
        self.report.result(
            "Configure",
            result
                .map(|()| format!("accepted {good}"))
                .map_err(|e| e.to_string()),
        );
        let bad = link.configure("{ not json".to_owned()).await;
        let result = match bad {
            Err(LinkError::Refused {
                code: tonic::Code::InvalidArgument,
                message,
                ..
            }) => Ok(format!("INVALID_ARGUMENT: {message}")),
            Err(e) => Err(format!("expected INVALID_ARGUMENT, got: {e}")),
            Ok(()) => Err("accepted a config_json that is not JSON".to_owned()),
        };
        self.report.result("Configure refuses bad JSON", result);
        match link.configure("[1, 2]".to_owned()).await {
            Err(LinkError::Refused {
                code: tonic::Code::InvalidArgument,
                ..
            }) => self.report.add(
                "Configure refuses a non-object",
                Outcome::Pass,
                "INVALID_ARGUMENT",
            ),
            Ok(()) => self.report.add(
                "Configure refuses a non-object",
                Outcome::Warn,
                "accepted `[1, 2]`: config_json is always a JSON object",
            ),
            Err(e) => self.report.add(
                "Configure refuses a non-object",
                Outcome::Fail,
                format!("expected INVALID_ARGUMENT, got: {e}"),
            ),
        }
        let again = link.configure(good.to_owned()).await;
        self.report.result(
            "Configure after a refusal",
            again
                .map(|()| "accepted".to_owned())
                .map_err(|e| e.to_string()),
        );
    }

    /// The first node's name, to place samples on, when it has nodes.
    pub(super) async fn check_nodes(&mut self, link: &Link, meta: &metadata::Metadata) -> String {
        let offered = meta.features.iter().any(|f| f == "nodes");
        match link.list_nodes().await {
            Ok(nodes) => {
                let mut names = HashSet::new();
                let problem = if offered && nodes.is_empty() {
                    Some("no nodes, though the `nodes` feature is offered".to_owned())
                } else {
                    nodes.iter().find_map(|n| {
                        if n.name.is_empty() {
                            Some("a node without a name".to_owned())
                        } else if !names.insert(n.name.clone()) {
                            Some(format!("node `{}` listed twice", n.name))
                        } else {
                            None
                        }
                    })
                };
                let listed: Vec<String> = nodes
                    .iter()
                    .map(|n| {
                        let mut capacity: Vec<String> =
                            n.capacity.iter().map(|(k, v)| format!("{k}={v}")).collect();
                        capacity.sort();
                        format!("{} ({})", n.name, capacity.join(", "))
                    })
                    .collect();
                self.report.result(
                    "ListNodes",
                    match problem {
                        Some(problem) => Err(problem),
                        None => Ok(format!("{} node(s): {}", nodes.len(), listed.join("; "))),
                    },
                );
                nodes.first().map(|n| n.name.clone()).unwrap_or_default()
            }
            Err(LinkError::Refused {
                code: tonic::Code::Unimplemented,
                ..
            }) if !offered => {
                self.report
                    .add("ListNodes", Outcome::Pass, "not offered (UNIMPLEMENTED)");
                String::new()
            }
            Err(e) => {
                self.report.add("ListNodes", Outcome::Fail, e.to_string());
                String::new()
            }
        }
    }

    /// DescribeResources of the samples; the keys each sample's type says
    /// may change in place.
    pub(super) async fn check_describe(
        &mut self,
        link: &Link,
        meta: &metadata::Metadata,
    ) -> HashMap<String, Vec<String>> {
        let mut updatable = HashMap::new();
        let resources: Vec<proto::Resource> = meta
            .check
            .resources
            .iter()
            .enumerate()
            .map(|(i, (kind, sample))| resource(&format!("sample-{i}"), kind, sample, "", ""))
            .collect();
        if resources.is_empty() {
            self.report.add(
                "DescribeResources",
                Outcome::Skip,
                "no samples under `check.resources`",
            );
            return updatable;
        }
        let kinds: HashMap<String, String> = resources
            .iter()
            .map(|r| (r.key.clone(), r.r#type.clone()))
            .collect();
        match link.describe_resources(resources).await {
            Ok(descriptions) => {
                let stray = descriptions.iter().find(|d| !kinds.contains_key(&d.key));
                self.report.result(
                    "DescribeResources",
                    match stray {
                        Some(d) => Err(format!("describes `{}`, which was not asked", d.key)),
                        None => Ok(format!("{} description(s)", descriptions.len())),
                    },
                );
                for description in descriptions {
                    if let Some(kind) = kinds.get(&description.key) {
                        updatable.insert(kind.clone(), description.updatable_keys);
                    }
                }
            }
            Err(LinkError::Refused {
                code: tonic::Code::Unimplemented,
                ..
            }) => self.report.add(
                "DescribeResources",
                Outcome::Pass,
                "not offered (UNIMPLEMENTED): nothing is described",
            ),
            Err(e) => self
                .report
                .add("DescribeResources", Outcome::Fail, e.to_string()),
        }
        updatable
    }

    /// A call whose deadline passes before the provider answers must leave it
    /// serving (the server gives up on calls all the time).
    pub(super) async fn check_expired_deadline(&mut self, link: &Link) {
        let hurried = link.clone().with_deadline(Duration::from_micros(1));
        let expired = matches!(hurried.list_nodes().await, Err(LinkError::Deadline { .. }));
        let result = link
            .check_health(None)
            .await
            .map(|()| {
                if expired {
                    "still SERVING after a ListNodes whose deadline passed".to_owned()
                } else {
                    "still SERVING (ListNodes beat a 1 µs deadline)".to_owned()
                }
            })
            .map_err(|e| e.to_string());
        self.report.result("survives an expired deadline", result);
    }
}
