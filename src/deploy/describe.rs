//! A blueprint as its providers describe it (`DescribeResources`): the
//! dependencies they add, what each resource counts against named quotas,
//! and each key's provider with the config keys it can update in place. A
//! deploy runs the described blueprint; a plan compares against it and an
//! apply places by it.
//!
//! Asks providers only to describe; never makes, changes or places anything.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use uuid::Uuid;

use super::Deployments;
use super::blueprint::{self, Blueprint};
use super::changes::Capability;
use super::quotas::Quantities;
use crate::provider::{Provider, ResourceCall, ResourceDescription};

/// The capabilities a plan needs of each key's provider.
pub(super) struct Described {
    pub blueprint: Blueprint,
    pub capabilities: BTreeMap<String, Capability>,
    pub quantities: Quantities,
}

/// Describes `bp`, waiting for providers that are still loading or
/// restarting. Every resource's provider is found before any is asked.
pub(super) async fn describe(
    deployments: &Deployments,
    bp: &Blueprint,
) -> Result<Described, String> {
    let mut answers = Answers::default();
    for (provider, calls) in calls_by_provider(deployments, bp).await? {
        answers.ask(deployments, provider, &calls).await?;
    }
    let blueprint = if answers.extra.is_empty() {
        bp.clone()
    } else {
        blueprint::with_extra_dependencies(bp, &answers.extra).map_err(|p| p.to_string())?
    };
    Ok(Described {
        blueprint,
        capabilities: answers.capabilities,
        quantities: answers.quantities,
    })
}

/// The providers `bp`'s resources are served by that are not connected now
/// (those of its types that resolve).
pub(super) async fn providers_away(deployments: &Deployments, bp: &Blueprint) -> BTreeSet<Uuid> {
    let Ok(by_provider) = calls_by_provider(deployments, bp).await else {
        return BTreeSet::new();
    };
    let providers = &deployments.inner.providers;
    by_provider
        .into_keys()
        .filter(|provider| !providers.is_connected(*provider))
        .collect()
}

/// The keys a provider may update in place, by its protocol version: none
/// before version 2 (it cannot update at all).
fn updatable(keys: Vec<String>, version: Option<u32>) -> Option<BTreeSet<String>> {
    (version.unwrap_or(1) >= 2).then(|| keys.into_iter().collect())
}

/// Each resource of `bp` as a call to describe it, grouped by the provider
/// that serves its type.
async fn calls_by_provider(
    deployments: &Deployments,
    bp: &Blueprint,
) -> Result<BTreeMap<Uuid, Vec<ResourceCall>>, String> {
    let mut by_provider: BTreeMap<Uuid, Vec<ResourceCall>> = BTreeMap::new();
    let mut known: HashMap<(&str, Option<&str>), Uuid> = HashMap::new();
    for resource in &bp.resources {
        let asked = (
            resource.resource_type.as_str(),
            resource.provider.as_deref(),
        );
        let provider = match known.get(&asked) {
            Some(id) => *id,
            None => {
                let id = deployments
                    .inner
                    .providers
                    .for_resource_type(asked.0, asked.1)
                    .await
                    .map_err(|e| format!("resources.{}.type: {e}", resource.key))?;
                known.insert(asked, id);
                id
            }
        };
        by_provider.entry(provider).or_default().push(ResourceCall {
            key: resource.key.clone(),
            resource_type: resource.resource_type.clone(),
            config: resource.config.clone(),
            resource_id: String::new(),
            deployment_id: None,
            node: None,
            dependency_outputs: Vec::new(),
        });
    }
    Ok(by_provider)
}

/// What the providers answered so far.
#[derive(Default)]
struct Answers {
    /// Dependencies providers add, by key.
    extra: Vec<(String, Vec<String>)>,
    quantities: Quantities,
    capabilities: BTreeMap<String, Capability>,
}

impl Answers {
    /// Asks one provider to describe its `calls`.
    async fn ask(
        &mut self,
        deployments: &Deployments,
        provider: Uuid,
        calls: &[ResourceCall],
    ) -> Result<(), String> {
        let providers = &deployments.inner.providers;
        let described = deployments
            .steps()
            .ask_provider(provider, || providers.describe(provider, calls))
            .await
            .map_err(|e| e.to_string())?;
        let has = providers.get(provider).await.map_err(|e| e.to_string())?;
        let version = providers.protocol_version(provider);
        for call in calls {
            self.capabilities.insert(
                call.key.clone(),
                Capability {
                    provider_id: provider,
                    provider_name: has.name.clone(),
                    updatable: updatable(Vec::new(), version),
                    destroy_first: false,
                },
            );
        }
        for d in described {
            self.take(d, &has, version)?;
        }
        Ok(())
    }

    /// One resource's description, from provider `has`.
    fn take(
        &mut self,
        d: ResourceDescription,
        has: &Provider,
        version: Option<u32>,
    ) -> Result<(), String> {
        // A feature the resource needs and its provider lacks fails the
        // deploy before anything is made.
        if let Some(missing) = d.features.iter().find(|f| !has.features.contains(f)) {
            return Err(format!(
                "resources.{}: needs the `{missing}` feature, which provider `{}` does not have",
                d.key, has.name
            ));
        }
        if let Some(capability) = self.capabilities.get_mut(&d.key) {
            capability.updatable = updatable(d.updatable_keys, version);
            capability.destroy_first = d.replace_destroys_first;
        }
        if !d.quota.is_empty() {
            self.quantities
                .insert(d.key.clone(), d.quota.into_iter().collect());
        }
        if !d.depends_on.is_empty() {
            self.extra.push((d.key, d.depends_on));
        }
        Ok(())
    }
}
