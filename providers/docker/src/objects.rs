//! `docker.v1.network` and `docker.v1.volume`.

use bollard::Docker;
use bollard::models::{NetworkCreateRequest, VolumeCreateRequest};
use bollard::query_parameters::RemoveVolumeOptions;
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::{Events, proto};

use crate::config::{NetworkConfig, VolumeConfig};
use crate::engine::{self, Problem, call, carries, default_name, networks_of, status, volumes_of};

/// How long after creating a network the duplicates are looked for.
const DUPLICATE_SETTLE: std::time::Duration = std::time::Duration::from_millis(200);

/// Creates the network, or returns the one labelled with the resource id, or
/// adopts the one of its name if that one is labelled so.
///
/// The engine allows two networks of one name (API 1.41's `CheckDuplicate`
/// is gone from bollard 0.21's request), so the name is looked up first, and
/// a duplicate made by a racing call is removed after: the oldest stays.
pub async fn deploy_network(
    client: &Docker,
    resource: &proto::Resource,
    config: &NetworkConfig,
    events: &Events,
) -> Result<Value, Problem> {
    let id = &resource.resource_id;
    if let Some((net, name)) = networks_of(client, id).await?.into_iter().next() {
        events
            .log(format!("network {name} already exists: adopting it"))
            .await;
        return Ok(json!({"id": net, "name": name}));
    }
    let name = config
        .name
        .clone()
        .unwrap_or_else(|| default_name(resource));
    match client.inspect_network(&name, None).await {
        Ok(found) if carries(found.labels.as_ref(), id) => {
            return Ok(json!({"id": found.id, "name": found.name}));
        }
        Ok(found) => {
            return Err(Problem::precondition(format!(
                "the name {name} is held by network {} which is not this resource's \
                 (no label {}={id}); remove it or give the resource another `name`",
                found
                    .id
                    .as_deref()
                    .map(crate::container::short)
                    .unwrap_or("?"),
                engine::LABEL_RESOURCE
            )));
        }
        Err(e) if status(&e) == Some(404) => {}
        Err(e) => return Err(Problem::engine("inspecting the network", &e)),
    }
    events
        .progress(50, format!("creating network {name}"))
        .await;
    let request = NetworkCreateRequest {
        name: name.clone(),
        driver: Some(config.driver.clone()),
        internal: Some(config.internal),
        labels: Some(engine::labels(resource, &config.labels)),
        ..Default::default()
    };
    call(
        &format!("creating network {name}"),
        client.create_network(request),
    )
    .await?;
    // A racing call's network made a moment before may be listed by its
    // time before it is listed at all: both calls look once both are seen,
    // so that both keep the same one.
    tokio::time::sleep(DUPLICATE_SETTLE).await;
    let mut found = networks_of(client, id).await?;
    if found.is_empty() {
        return Err(Problem::unavailable(format!(
            "network {name} was created but is not found by its label"
        )));
    }
    let (keep, keep_name) = found.remove(0);
    for (extra, _) in found {
        events
            .log(format!(
                "removing duplicate network {}",
                crate::container::short(&extra)
            ))
            .await;
        let _ = client.remove_network(&extra).await;
    }
    Ok(json!({"id": keep, "name": keep_name}))
}

pub async fn inspect_network(client: &Docker, resource_id: &str) -> Result<Option<Value>, Problem> {
    Ok(networks_of(client, resource_id)
        .await?
        .into_iter()
        .next()
        .map(|(id, name)| json!({"id": id, "name": name})))
}

/// Removes the resource's networks; one still in use is a retryable failure.
pub async fn destroy_network(
    client: &Docker,
    resource: &proto::Resource,
    events: &Events,
) -> Result<Value, Problem> {
    let found = networks_of(client, &resource.resource_id).await?;
    if found.is_empty() {
        events.log("no network to destroy").await;
    }
    for (id, name) in found {
        events
            .progress(50, format!("removing network {name}"))
            .await;
        match client.remove_network(&id).await {
            Ok(()) => {}
            Err(e) if status(&e) == Some(404) => {}
            Err(e) if matches!(status(&e), Some(403 | 409)) => {
                return Err(Problem::unavailable(format!(
                    "network {name} is still in use (containers are attached to it): {}",
                    engine::message(&e)
                )));
            }
            Err(e) => return Err(Problem::engine(&format!("removing network {name}"), &e)),
        }
    }
    Ok(json!({}))
}

/// Creates the volume, or returns the one labelled with the resource id. The
/// engine answers a create of an existing name with that volume, so a
/// volume of that name not labelled as this resource's is refused first.
pub async fn deploy_volume(
    client: &Docker,
    resource: &proto::Resource,
    config: &VolumeConfig,
    events: &Events,
) -> Result<Value, Problem> {
    let id = &resource.resource_id;
    if let Some((name, mountpoint)) = volumes_of(client, id).await?.into_iter().next() {
        events
            .log(format!("volume {name} already exists: adopting it"))
            .await;
        return Ok(json!({"name": name, "mountpoint": mountpoint}));
    }
    let name = config
        .name
        .clone()
        .unwrap_or_else(|| default_name(resource));
    match client.inspect_volume(&name).await {
        Ok(found) if carries(Some(&found.labels), id) => {
            return Ok(json!({"name": found.name, "mountpoint": found.mountpoint}));
        }
        Ok(_) => return Err(foreign_volume(&name, id)),
        Err(e) if status(&e) == Some(404) => {}
        Err(e) => return Err(Problem::engine("inspecting the volume", &e)),
    }
    events.progress(50, format!("creating volume {name}")).await;
    let request = VolumeCreateRequest {
        name: Some(name.clone()),
        driver: Some(config.driver.clone()),
        labels: Some(engine::labels(resource, &config.labels)),
        ..Default::default()
    };
    let made = call(
        &format!("creating volume {name}"),
        client.create_volume(request),
    )
    .await?;
    if !carries(Some(&made.labels), id) {
        return Err(foreign_volume(&name, id));
    }
    Ok(json!({"name": made.name, "mountpoint": made.mountpoint}))
}

fn foreign_volume(name: &str, id: &str) -> Problem {
    Problem::precondition(format!(
        "the name {name} is held by a volume which is not this resource's (no label {}={id}); \
         remove it or give the resource another `name`",
        engine::LABEL_RESOURCE
    ))
}

pub async fn inspect_volume(client: &Docker, resource_id: &str) -> Result<Option<Value>, Problem> {
    Ok(volumes_of(client, resource_id)
        .await?
        .into_iter()
        .next()
        .map(|(name, mountpoint)| json!({"name": name, "mountpoint": mountpoint})))
}

/// Removes the resource's volumes; one still in use is a retryable failure.
pub async fn destroy_volume(
    client: &Docker,
    resource: &proto::Resource,
    events: &Events,
) -> Result<Value, Problem> {
    let found = volumes_of(client, &resource.resource_id).await?;
    if found.is_empty() {
        events.log("no volume to destroy").await;
    }
    for (name, _) in found {
        events.progress(50, format!("removing volume {name}")).await;
        match client
            .remove_volume(&name, Some(RemoveVolumeOptions { force: false }))
            .await
        {
            Ok(()) => {}
            Err(e) if status(&e) == Some(404) => {}
            Err(e) if status(&e) == Some(409) => {
                return Err(Problem::unavailable(format!(
                    "volume {name} is still in use by a container: {}",
                    engine::message(&e)
                )));
            }
            Err(e) => return Err(Problem::engine(&format!("removing volume {name}"), &e)),
        }
    }
    Ok(json!({}))
}
