//! `docker.v1.container`: create or adopt, outputs, destroy, power, logs.

use std::collections::HashMap;

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerUpdateBody, EndpointSettings,
    HostConfig, Mount, MountType, NetworkingConfig, PortBinding, PortMap, RestartPolicy,
    RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptions, LogsOptions, RemoveContainerOptions, RestartContainerOptions,
    StopContainerOptions,
};
use corbel_provider_sdk::serde_json::{Value, json};
use corbel_provider_sdk::{Events, proto};
use futures_util::StreamExt;

use crate::config::{ContainerConfig, MountSource, Restart};
use crate::engine::{self, Problem, call, carries, containers_of, default_name, status};
use crate::image;

/// Networks a container joins without a network-scoped alias.
fn is_builtin_network(network: &str) -> bool {
    matches!(network, "bridge" | "host" | "none" | "default") || network.starts_with("container:")
}

/// Deploys one container: adopts the one labelled with the resource id, or
/// the one holding its name if that is labelled so, else creates and starts it.
pub async fn deploy(
    client: &Docker,
    resource: &proto::Resource,
    config: &ContainerConfig,
    events: &Events,
) -> Result<Value, Problem> {
    let id = &resource.resource_id;
    if let Some(found) = containers_of(client, id).await?.into_iter().next() {
        events
            .log(format!(
                "container {} already exists: adopting it",
                short(&found)
            ))
            .await;
        return adopt(client, &found, events).await;
    }
    let image = image::ensure(client, resource, &config.image, events).await?;
    let name = config
        .name
        .clone()
        .unwrap_or_else(|| default_name(resource));
    events
        .progress(60, format!("creating container {name} from {image}"))
        .await;
    let options = CreateContainerOptions {
        name: Some(name.clone()),
        ..Default::default()
    };
    let body = create_body(resource, config, &image);
    match client.create_container(Some(options), body).await {
        Ok(created) => {
            events
                .log(format!("created container {name} ({})", short(&created.id)))
                .await;
            adopt(client, &created.id, events).await
        }
        Err(e) if status(&e) == Some(409) => {
            // The name is taken: by this resource's own container (a lost
            // call made it, the list above raced it), or by another.
            let holder = call(
                "inspecting the container",
                client.inspect_container(&name, None),
            )
            .await?;
            let labels = holder.config.as_ref().and_then(|c| c.labels.as_ref());
            if carries(labels, id) {
                events
                    .log(format!("container {name} is this resource's: adopting it"))
                    .await;
                adopt(client, holder.id.as_deref().unwrap_or(&name), events).await
            } else {
                Err(Problem::precondition(format!(
                    "the name {name} is held by container {} which is not this resource's \
                     (no label {}={id}); remove it or give the resource another `name`",
                    short(holder.id.as_deref().unwrap_or("?")),
                    engine::LABEL_RESOURCE
                )))
            }
        }
        Err(e) => Err(Problem::engine(&format!("creating container {name}"), &e)),
    }
}

/// Starts the container if it was created but never started (a lost call
/// died in between); its outputs.
async fn adopt(client: &Docker, id: &str, events: &Events) -> Result<Value, Problem> {
    let inspected = call(
        "inspecting the container",
        client.inspect_container(id, None),
    )
    .await?;
    let state = state_of(&inspected);
    if state == "created" {
        events
            .progress(80, format!("starting container {}", short(id)))
            .await;
        match client.start_container(id, None).await {
            Ok(()) => {}
            Err(e) if status(&e) == Some(304) => {}
            Err(e) => return Err(Problem::engine("starting the container", &e)),
        }
        let inspected = call(
            "inspecting the container",
            client.inspect_container(id, None),
        )
        .await?;
        return Ok(outputs(&inspected));
    }
    Ok(outputs(&inspected))
}

fn create_body(
    resource: &proto::Resource,
    config: &ContainerConfig,
    image: &str,
) -> ContainerCreateBody {
    let (exposed, bindings) = port_bindings(config);
    let mounts = mounts(config);
    let restart = config.restart.as_ref().map(restart_policy);
    let networking = config
        .network
        .as_ref()
        .map(|network| networking(resource, config, network));
    ContainerCreateBody {
        image: Some(image.to_string()),
        cmd: config.command.clone(),
        entrypoint: config.entrypoint.clone(),
        env: Some(config.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        labels: Some(engine::labels(resource, &config.labels)),
        exposed_ports: (!exposed.is_empty()).then_some(exposed),
        host_config: Some(HostConfig {
            port_bindings: (!bindings.is_empty()).then_some(bindings),
            mounts: (!mounts.is_empty()).then_some(mounts),
            network_mode: config.network.clone(),
            restart_policy: restart,
            memory: config.memory,
            nano_cpus: config.nano_cpus,
            ..Default::default()
        }),
        networking_config: networking,
        ..Default::default()
    }
}

/// The ports exposed (`port/protocol`), and their bindings on the host (an
/// empty host port: the engine picks one).
fn port_bindings(config: &ContainerConfig) -> (Vec<String>, PortMap) {
    let mut exposed = Vec::new();
    let mut bindings: PortMap = HashMap::new();
    for port in &config.ports {
        let key = format!("{}/{}", port.container, port.protocol);
        exposed.push(key.clone());
        let host_port = if port.host == 0 {
            String::new()
        } else {
            port.host.to_string()
        };
        bindings.insert(
            key,
            Some(vec![PortBinding {
                host_ip: None,
                host_port: Some(host_port),
            }]),
        );
    }
    (exposed, bindings)
}

fn mounts(config: &ContainerConfig) -> Vec<Mount> {
    config
        .mounts
        .iter()
        .map(|m| {
            let (typ, source) = match &m.source {
                MountSource::Volume(v) => (MountType::VOLUME, v.clone()),
                MountSource::Bind(b) => (MountType::BIND, b.clone()),
            };
            Mount {
                target: Some(m.target.clone()),
                source: Some(source),
                typ: Some(typ),
                read_only: Some(m.read_only),
                ..Default::default()
            }
        })
        .collect()
}

/// The container's endpoint on `network`: on any but a built-in network, it
/// is reachable by the resource's key and its aliases.
fn networking(
    resource: &proto::Resource,
    config: &ContainerConfig,
    network: &str,
) -> NetworkingConfig {
    let mut aliases = Vec::new();
    if !is_builtin_network(network) {
        aliases.push(resource.key.clone());
        for alias in &config.aliases {
            if !aliases.contains(alias) {
                aliases.push(alias.clone());
            }
        }
    }
    NetworkingConfig {
        endpoints_config: Some(HashMap::from([(
            network.to_owned(),
            EndpointSettings {
                aliases: (!aliases.is_empty()).then_some(aliases),
                ..Default::default()
            },
        )])),
    }
}

fn restart_policy(restart: &Restart) -> RestartPolicy {
    RestartPolicy {
        name: Some(match restart.name.as_str() {
            "always" => RestartPolicyNameEnum::ALWAYS,
            "unless-stopped" => RestartPolicyNameEnum::UNLESS_STOPPED,
            "on-failure" => RestartPolicyNameEnum::ON_FAILURE,
            _ => RestartPolicyNameEnum::NO,
        }),
        maximum_retry_count: restart.max_retries,
    }
}

/// The config keys a container changes in place (`docker update`); any
/// other change replaces it.
pub const UPDATABLE_KEYS: [&str; 2] = ["limits", "restart"];

/// Changes the running container of `resource` to `config`'s limits and
/// restart policy, in place: same container, same id, its processes keep
/// running. The engine cannot clear a limit on a container, so a limit the
/// config no longer has is raised to the host's size (memory: the engine's
/// total; CPUs: its count), which is no limit in effect. Idempotent.
pub async fn update(
    client: &Docker,
    resource: &proto::Resource,
    previous_config_json: &str,
    config: &ContainerConfig,
    events: &Events,
) -> Result<Value, Problem> {
    if let Some(key) = changed_key_not_updatable(previous_config_json, &resource.config_json) {
        return Err(Problem::precondition(format!(
            "`{key}` changed, and a container changes only {UPDATABLE_KEYS:?} in place: it must be \
             replaced"
        )));
    }
    let Some(found) = find(client, resource).await? else {
        return Err(Problem::not_found(format!(
            "no container of resource {}",
            resource.resource_id
        )));
    };
    let id = found.id.clone().unwrap_or_default();
    let has = found.host_config.clone().unwrap_or_default();
    let mut body = ContainerUpdateBody {
        restart_policy: Some(restart_policy(config.restart.as_ref().unwrap_or(
            &Restart {
                name: "no".into(),
                max_retries: None,
            },
        ))),
        ..Default::default()
    };
    let limited = |n: Option<i64>| n.is_some_and(|n| n > 0);
    let host = if (config.memory.is_none() && limited(has.memory))
        || (config.nano_cpus.is_none() && limited(has.nano_cpus))
    {
        Some(call("reading the engine's info", client.info()).await?)
    } else {
        None
    };
    match (config.memory, host.as_ref().and_then(|h| h.mem_total)) {
        // Swap as `docker run -m` sets it: as much again.
        (Some(bytes), _) => {
            body.memory = Some(bytes);
            body.memory_swap = Some(bytes.saturating_mul(2));
        }
        (None, Some(total)) if limited(has.memory) => {
            events
                .log(format!(
                    "the engine cannot clear a memory limit: raising it to the host's {total} bytes"
                ))
                .await;
            // Swap as much again here too: runc on cgroup v1 refuses an
            // unlimited swap (-1) together with a raised memory limit.
            body.memory = Some(total);
            body.memory_swap = Some(total.saturating_mul(2));
        }
        (None, _) => {}
    }
    match (config.nano_cpus, host.as_ref().and_then(|h| h.ncpu)) {
        (Some(nano), _) => body.nano_cpus = Some(nano),
        (None, Some(cpus)) if limited(has.nano_cpus) => {
            events
                .log(format!(
                    "the engine cannot clear a CPU limit: raising it to the host's {cpus} CPUs"
                ))
                .await;
            body.nano_cpus = Some(cpus.max(1) * 1_000_000_000);
        }
        (None, _) => {}
    }
    events
        .progress(50, format!("updating container {}", short(&id)))
        .await;
    call("updating the container", client.update_container(&id, body)).await?;
    let inspected = call(
        "inspecting the container",
        client.inspect_container(&id, None),
    )
    .await?;
    Ok(outputs(&inspected))
}

/// Whether a container holds something only one can hold at a time: a
/// `name` of its own, or a fixed host port. Its replacement cannot run
/// beside it, so Corbel is told to destroy it first. A config that does not
/// parse yet (templates still in it) is read as far as it goes.
pub fn holds_fixed_names(config_json: &str) -> bool {
    let Ok(config) = crate::config::object(config_json) else {
        return false;
    };
    let named = config.get("name").is_some_and(|n| !n.is_null());
    let fixed_port = config
        .get("ports")
        .and_then(Value::as_array)
        .is_some_and(|ports| {
            ports.iter().any(|p| match p.get("host") {
                None | Some(Value::Null) => false,
                Some(Value::Number(n)) => n.as_u64() != Some(0),
                Some(_) => true,
            })
        });
    named || fixed_port
}

/// The first top-level key, other than [`UPDATABLE_KEYS`], whose value differs
/// between two configs.
fn changed_key_not_updatable(previous: &str, next: &str) -> Option<String> {
    let previous = crate::config::object(previous).unwrap_or_default();
    let next = crate::config::object(next).unwrap_or_default();
    let mut keys: Vec<&String> = previous.keys().chain(next.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|key| !UPDATABLE_KEYS.contains(&key.as_str()))
        .find(|key| previous.get(*key) != next.get(*key))
        .cloned()
}

/// `created`, `running`, `paused`, `exited`, ...
pub fn state_of(inspected: &ContainerInspectResponse) -> String {
    inspected
        .state
        .as_ref()
        .and_then(|s| s.status)
        .map(|s| s.to_string())
        .unwrap_or_default()
}

/// `{id, name, image, network, ip, ports: [{container, host, protocol}], state}`.
pub fn outputs(inspected: &ContainerInspectResponse) -> Value {
    let host_config = inspected.host_config.clone().unwrap_or_default();
    let settings = inspected.network_settings.clone().unwrap_or_default();
    let network = host_config
        .network_mode
        .clone()
        .filter(|n| !n.is_empty() && n != "default");
    let ip = network.as_ref().and_then(|n| {
        settings
            .networks
            .as_ref()?
            .get(n)?
            .ip_address
            .clone()
            .filter(|ip| !ip.is_empty())
    });
    let published = settings.ports.clone().unwrap_or_default();
    let mut ports: Vec<(u16, String, Option<u16>)> = host_config
        .port_bindings
        .clone()
        .unwrap_or_default()
        .keys()
        .filter_map(|key| {
            let (port, protocol) = key.split_once('/').unwrap_or((key.as_str(), "tcp"));
            let port: u16 = port.parse().ok()?;
            let host = published
                .get(key)
                .and_then(|b| b.as_ref())
                .and_then(|b| b.iter().find_map(|b| b.host_port.as_ref()?.parse().ok()));
            Some((port, protocol.to_string(), host))
        })
        .collect();
    ports.sort();
    json!({
        "id": inspected.id.clone().unwrap_or_default(),
        "name": inspected.name.clone().unwrap_or_default().trim_start_matches('/'),
        "image": inspected.config.as_ref().and_then(|c| c.image.clone()).unwrap_or_default(),
        "network": network,
        "ip": ip,
        "ports": ports
            .into_iter()
            .map(|(container, protocol, host)| json!({"container": container, "host": host, "protocol": protocol}))
            .collect::<Vec<_>>(),
        "state": state_of(inspected),
    })
}

/// The container of `resource`, if any: by label, else by its name if that
/// one is labelled as this resource's.
pub async fn find(
    client: &Docker,
    resource: &proto::Resource,
) -> Result<Option<ContainerInspectResponse>, Problem> {
    for id in containers_of(client, &resource.resource_id).await? {
        match client.inspect_container(&id, None).await {
            Ok(found) => return Ok(Some(found)),
            Err(e) if status(&e) == Some(404) => continue,
            Err(e) => return Err(Problem::engine("inspecting the container", &e)),
        }
    }
    Ok(None)
}

/// The name the resource's container has or would have.
fn name_of(resource: &proto::Resource) -> String {
    crate::config::object(&resource.config_json)
        .ok()
        .and_then(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| default_name(resource))
}

/// Stops and removes every container of `resource`; absent is fine.
pub async fn destroy(
    client: &Docker,
    resource: &proto::Resource,
    stop_timeout_s: i32,
    events: &Events,
) -> Result<Value, Problem> {
    let mut ids = containers_of(client, &resource.resource_id).await?;
    let name = name_of(resource);
    match client.inspect_container(&name, None).await {
        Ok(found) => {
            let labels = found.config.as_ref().and_then(|c| c.labels.as_ref());
            if carries(labels, &resource.resource_id)
                && let Some(id) = found.id
                && !ids.contains(&id)
            {
                ids.push(id);
            }
        }
        Err(e) if status(&e) == Some(404) => {}
        Err(e) => return Err(Problem::engine("inspecting the container", &e)),
    }
    if ids.is_empty() {
        events.log("no container to destroy").await;
    }
    for id in ids {
        events
            .progress(30, format!("stopping container {}", short(&id)))
            .await;
        stop(client, &id, stop_timeout_s).await?;
        events
            .progress(70, format!("removing container {}", short(&id)))
            .await;
        let options = RemoveContainerOptions {
            v: false,
            force: true,
            ..Default::default()
        };
        match client.remove_container(&id, Some(options)).await {
            Ok(()) => {}
            Err(e) if status(&e) == Some(404) => {}
            // Already being removed.
            Err(e) if status(&e) == Some(409) && engine::message(&e).contains("in progress") => {}
            Err(e) => return Err(Problem::engine("removing the container", &e)),
        }
    }
    Ok(json!({}))
}

/// Stops `id`; stopped or gone is fine.
async fn stop(client: &Docker, id: &str, stop_timeout_s: i32) -> Result<(), Problem> {
    let options = StopContainerOptions {
        t: Some(stop_timeout_s),
        ..Default::default()
    };
    let bound = std::time::Duration::from_secs(stop_timeout_s as u64) + engine::CALL_TIMEOUT;
    match tokio::time::timeout(bound, client.stop_container(id, Some(options))).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if matches!(status(&e), Some(304 | 404)) => Ok(()),
        Ok(Err(e)) => Err(Problem::engine("stopping the container", &e)),
        Err(_) => Err(Problem::unavailable(
            "stopping the container: no answer from the engine in time",
        )),
    }
}

/// A power action on the resource's container.
pub async fn power(
    client: &Docker,
    resource: &proto::Resource,
    action: proto::PowerAction,
    stop_timeout_s: i32,
) -> Result<(), Problem> {
    use proto::PowerAction as A;
    let Some(found) = find(client, resource).await? else {
        return Err(Problem::not_found(format!(
            "no container of resource {}",
            resource.resource_id
        )));
    };
    let id = found.id.clone().unwrap_or_default();
    let state = state_of(&found);
    let unpause = || async {
        match client.unpause_container(&id).await {
            Ok(()) => Ok(()),
            Err(e) if idempotent(&e) => Ok(()),
            Err(e) => Err(Problem::engine("resuming the container", &e)),
        }
    };
    match action {
        A::Start => {
            if state == "paused" {
                return unpause().await;
            }
            match client.start_container(&id, None).await {
                Ok(()) => Ok(()),
                Err(e) if idempotent(&e) => Ok(()),
                Err(e) => Err(Problem::engine("starting the container", &e)),
            }
        }
        A::Stop => {
            if state == "paused" {
                unpause().await?;
            }
            stop(client, &id, stop_timeout_s).await
        }
        A::Restart => {
            if state == "paused" {
                unpause().await?;
            }
            let options = RestartContainerOptions {
                t: Some(stop_timeout_s),
                ..Default::default()
            };
            call(
                "restarting the container",
                client.restart_container(&id, Some(options)),
            )
            .await
        }
        A::Pause => match client.pause_container(&id).await {
            Ok(()) => Ok(()),
            Err(e) if idempotent(&e) => Ok(()),
            Err(e) => Err(Problem::engine("pausing the container", &e)),
        },
        A::Resume => unpause().await,
        A::Unspecified => Err(Problem::invalid("power: no action given")),
    }
}

/// An answer saying the container already is as asked.
fn idempotent(e: &bollard::errors::Error) -> bool {
    if status(e) == Some(304) {
        return true;
    }
    let message = engine::message(e);
    [
        "is already paused",
        "is not paused",
        "already started",
        "is already running",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// The last `tail` lines of the container's stdout and stderr.
pub async fn logs(client: &Docker, id: &str, tail: u64) -> Result<String, Problem> {
    let options = LogsOptions {
        stdout: true,
        stderr: true,
        tail: tail.to_string(),
        ..Default::default()
    };
    let reading = async {
        let mut text = Vec::new();
        let mut stream = std::pin::pin!(client.logs(id, Some(options)));
        while let Some(item) = stream.next().await {
            let item = item.map_err(|e| Problem::engine("reading the container's logs", &e))?;
            text.extend_from_slice(&item.into_bytes());
        }
        Ok::<_, Problem>(String::from_utf8_lossy(&text).into_owned())
    };
    tokio::time::timeout(engine::CALL_TIMEOUT, reading)
        .await
        .map_err(|_| Problem::unavailable("reading the container's logs: no answer in time"))?
}

/// The engine's inspect of the container as JSON, its environment's values
/// left out (they may be secrets): `Config.Env` lists the names only.
pub fn inspect_json(inspected: &ContainerInspectResponse) -> Value {
    let mut value = serde_json::to_value(inspected).unwrap_or(Value::Null);
    if let Some(env) = value.pointer_mut("/Config/Env")
        && let Value::Array(vars) = env
    {
        for var in vars.iter_mut() {
            if let Value::String(s) = var {
                let name = s.split_once('=').map(|(k, _)| k).unwrap_or(s).to_string();
                *var = Value::String(name);
            }
        }
    }
    value
}

pub fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}
