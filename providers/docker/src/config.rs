//! The configurations, parsed by hand so every error names its key: the
//! provider's (from `Configure`) and each resource type's (`Resource.config_json`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use corbel_provider_sdk::config::{present, scalar_text};
use serde_json::{Map, Value};

/// A resource's `config_json` as an object.
pub use corbel_provider_sdk::config::object;

/// The provider's configuration. Each `Configure` carries all of it: a key
/// left out goes back to its default. Unknown keys are ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    /// The engine to talk to (`docker_host`); `None`: bollard's defaults
    /// (`DOCKER_HOST`, `DOCKER_TLS_VERIFY`, `DOCKER_CERT_PATH`, else the local socket).
    pub docker_host: Option<String>,
    /// How many resources the one node holds (`capacity`, default 100).
    pub capacity: i64,
    /// Seconds a stopped container has before it is killed (`stop_timeout_s`, default 5).
    pub stop_timeout_s: i32,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            docker_host: None,
            capacity: 100,
            stop_timeout_s: 5,
        }
    }
}

impl ProviderConfig {
    /// Parses a `Configure` payload; the error names the offending key.
    pub fn parse(config: &Value) -> Result<Self, String> {
        let map = match config {
            Value::Object(map) => map,
            Value::Null => return Ok(ProviderConfig::default()),
            _ => return Err("the configuration must be a JSON object".to_string()),
        };
        let mut parsed = ProviderConfig::default();
        if let Some(value) = present(map, "docker_host") {
            let host = value.as_str().ok_or("docker_host: expected a string")?;
            if !host.trim().is_empty() {
                parsed.docker_host = Some(host.trim().to_string());
            }
        }
        if let Some(value) = present(map, "capacity") {
            parsed.capacity = value
                .as_i64()
                .filter(|n| *n >= 0)
                .ok_or("capacity: expected a non-negative integer")?;
        }
        if let Some(value) = present(map, "stop_timeout_s") {
            parsed.stop_timeout_s = value
                .as_i64()
                .filter(|n| (0..=3600).contains(n))
                .ok_or("stop_timeout_s: expected an integer 0–3600")?
                as i32;
        }
        Ok(parsed)
    }
}

/// Where a container's image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// An image reference that must be on the engine (or pullable).
    Reference(String),
    /// Built from a directory on the provider's host.
    Build {
        context: PathBuf,
        dockerfile: String,
        args: BTreeMap<String, String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    pub container: u16,
    /// 0: the engine picks one.
    pub host: u16,
    pub protocol: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountSource {
    Volume(String),
    Bind(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    pub source: MountSource,
    pub target: String,
    pub read_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restart {
    /// `no`, `always`, `unless-stopped` or `on-failure`.
    pub name: String,
    /// For `on-failure:N`.
    pub max_retries: Option<i64>,
}

/// A `docker.v1.container` resource's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerConfig {
    pub image: ImageSource,
    pub command: Option<Vec<String>>,
    pub entrypoint: Option<Vec<String>>,
    pub env: BTreeMap<String, String>,
    pub ports: Vec<PortSpec>,
    pub mounts: Vec<MountSpec>,
    pub network: Option<String>,
    pub aliases: Vec<String>,
    pub restart: Option<Restart>,
    pub memory: Option<i64>,
    pub nano_cpus: Option<i64>,
    pub labels: BTreeMap<String, String>,
    pub name: Option<String>,
}

/// A `docker.v1.network` resource's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkConfig {
    pub name: Option<String>,
    pub driver: String,
    pub internal: bool,
    pub labels: BTreeMap<String, String>,
}

/// A `docker.v1.volume` resource's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeConfig {
    pub name: Option<String>,
    pub driver: String,
    pub labels: BTreeMap<String, String>,
}

impl ContainerConfig {
    pub fn parse(config_json: &str) -> Result<Self, String> {
        let map = object(config_json)?;
        let image = parse_image(&map)?;
        let command = match present(&map, "command") {
            None => None,
            Some(Value::String(s)) => Some(vec!["sh".into(), "-c".into(), s.clone()]),
            Some(value) => Some(string_list(value, "command")?),
        };
        let entrypoint = present(&map, "entrypoint")
            .map(|v| string_list(v, "entrypoint"))
            .transpose()?;
        let env = string_map(present(&map, "env"), "env")?;
        for key in env.keys() {
            if key.is_empty() || key.contains(['=', '\0']) {
                return Err(format!("env.{key}: not a variable name"));
            }
        }
        let ports = list_of(&map, "ports", parse_port)?;
        let mounts = list_of(&map, "mounts", parse_mount)?;
        let network = optional_name(&map, "network")?;
        let aliases = match present(&map, "aliases") {
            None => Vec::new(),
            Some(value) => string_list(value, "aliases")?,
        };
        if !aliases.is_empty() && network.is_none() {
            return Err("aliases: need a `network`".into());
        }
        let restart = match present(&map, "restart") {
            None => None,
            Some(Value::String(s)) => Some(parse_restart(s)?),
            Some(_) => {
                return Err(
                    "restart: expected no, always, unless-stopped, on-failure or on-failure:N"
                        .into(),
                );
            }
        };
        let (memory, nano_cpus) = match present(&map, "limits") {
            None => (None, None),
            Some(Value::Object(limits)) => parse_limits(limits)?,
            Some(_) => return Err("limits: expected an object {memory, cpus}".into()),
        };
        let labels = string_map(present(&map, "labels"), "labels")?;
        for key in labels.keys() {
            if key.starts_with("io.corbel.") {
                return Err(format!(
                    "labels.{key}: io.corbel.* labels are the provider's own"
                ));
            }
        }
        let name = optional_name(&map, "name")?;
        Ok(ContainerConfig {
            image,
            command,
            entrypoint,
            env,
            ports,
            mounts,
            network,
            aliases,
            restart,
            memory,
            nano_cpus,
            labels,
            name,
        })
    }
}

/// `image` (a reference) or `build` (a directory to build), one of them.
fn parse_image(map: &Map<String, Value>) -> Result<ImageSource, String> {
    match (present(map, "image"), present(map, "build")) {
        (Some(_), Some(_)) => Err("image: give `image` or `build`, not both".into()),
        (None, None) => Err("image: missing (give `image` or `build`)".into()),
        (Some(Value::String(s)), None) if !s.trim().is_empty() => {
            Ok(ImageSource::Reference(s.trim().to_string()))
        }
        (Some(_), None) => Err("image: expected an image reference".into()),
        (None, Some(build)) => parse_build(build),
    }
}

/// The list at `key`, each item parsed by `parse` (given its place,
/// `key[i]`); empty if absent.
fn list_of<T>(
    map: &Map<String, Value>,
    key: &str,
    parse: impl Fn(&Value, &str) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    match present(map, key) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| parse(item, &format!("{key}[{i}]")))
            .collect(),
        Some(_) => Err(format!("{key}: expected a list")),
    }
}

/// `limits: {memory, cpus}`: the memory in bytes and the CPUs in
/// billionths, each if given.
fn parse_limits(limits: &Map<String, Value>) -> Result<(Option<i64>, Option<i64>), String> {
    for key in limits.keys() {
        if key != "memory" && key != "cpus" {
            return Err(format!("limits.{key}: unknown (memory, cpus)"));
        }
    }
    let memory = present(limits, "memory")
        .map(|v| {
            parse_bytes(v).ok_or_else(|| {
                "limits.memory: expected bytes or a size such as \"64m\"".to_string()
            })
        })
        .transpose()?;
    let cpus = present(limits, "cpus")
        .map(|v| {
            v.as_f64()
                .filter(|c| *c > 0.0 && *c <= 1024.0)
                .map(|c| (c * 1e9).round() as i64)
                .ok_or_else(|| "limits.cpus: expected a positive number".to_string())
        })
        .transpose()?;
    Ok((memory, cpus))
}

impl NetworkConfig {
    pub fn parse(config_json: &str) -> Result<Self, String> {
        let map = object(config_json)?;
        let name = optional_name(&map, "name")?;
        let driver = match present(&map, "driver") {
            None => "bridge".to_string(),
            Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
            Some(_) => return Err("driver: expected a driver name".into()),
        };
        let internal = match present(&map, "internal") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err("internal: expected true or false".into()),
        };
        let labels = own_labels(&map)?;
        Ok(NetworkConfig {
            name,
            driver,
            internal,
            labels,
        })
    }
}

impl VolumeConfig {
    pub fn parse(config_json: &str) -> Result<Self, String> {
        let map = object(config_json)?;
        let name = optional_name(&map, "name")?;
        let driver = match present(&map, "driver") {
            None => "local".to_string(),
            Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
            Some(_) => return Err("driver: expected a driver name".into()),
        };
        let labels = own_labels(&map)?;
        Ok(VolumeConfig {
            name,
            driver,
            labels,
        })
    }
}

fn own_labels(map: &Map<String, Value>) -> Result<BTreeMap<String, String>, String> {
    let labels = string_map(present(map, "labels"), "labels")?;
    if let Some(key) = labels.keys().find(|k| k.starts_with("io.corbel.")) {
        return Err(format!(
            "labels.{key}: io.corbel.* labels are the provider's own"
        ));
    }
    Ok(labels)
}

fn parse_build(value: &Value) -> Result<ImageSource, String> {
    let Value::Object(build) = value else {
        return Err("build: expected an object {context, dockerfile, args}".into());
    };
    let context = match present(build, "context") {
        Some(Value::String(s)) if s.starts_with('/') => PathBuf::from(s),
        Some(Value::String(_)) => return Err("build.context: expected an absolute path".into()),
        None => return Err("build.context: missing".into()),
        Some(_) => return Err("build.context: expected an absolute path".into()),
    };
    let dockerfile = match present(build, "dockerfile") {
        None => "Dockerfile".to_string(),
        Some(Value::String(s)) if !s.trim().is_empty() => {
            let s = s.trim();
            if s.starts_with('/') || s.split('/').any(|part| part == "..") {
                return Err("build.dockerfile: expected a path inside the context".into());
            }
            s.to_string()
        }
        Some(_) => return Err("build.dockerfile: expected a path inside the context".into()),
    };
    let args = string_map(present(build, "args"), "build.args")?;
    Ok(ImageSource::Build {
        context,
        dockerfile,
        args,
    })
}

fn parse_port(value: &Value, at: &str) -> Result<PortSpec, String> {
    let Value::Object(port) = value else {
        return Err(format!(
            "{at}: expected an object {{container, host, protocol}}"
        ));
    };
    let number = |key: &str, zero: bool| -> Result<Option<u16>, String> {
        match present(port, key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|n| *n <= 65535 && (zero || *n >= 1))
                .map(|n| Some(n as u16))
                .ok_or_else(|| {
                    let low = if zero { 0 } else { 1 };
                    format!("{at}.{key}: expected a number {low}–65535")
                }),
        }
    };
    let container =
        number("container", false)?.ok_or_else(|| format!("{at}.container: missing"))?;
    let host = number("host", true)?.unwrap_or(0);
    let protocol = match present(port, "protocol") {
        None => "tcp".to_string(),
        Some(Value::String(s)) if s == "tcp" || s == "udp" => s.clone(),
        Some(_) => return Err(format!("{at}.protocol: expected tcp or udp")),
    };
    Ok(PortSpec {
        container,
        host,
        protocol,
    })
}

fn parse_mount(value: &Value, at: &str) -> Result<MountSpec, String> {
    let Value::Object(mount) = value else {
        return Err(format!(
            "{at}: expected an object {{volume|bind, target, read_only}}"
        ));
    };
    let text = |key: &str| -> Result<Option<String>, String> {
        match present(mount, key) {
            None => Ok(None),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
            Some(_) => Err(format!("{at}.{key}: expected a non-empty string")),
        }
    };
    let source = match (text("volume")?, text("bind")?) {
        (Some(volume), None) => MountSource::Volume(volume),
        (None, Some(bind)) if bind.starts_with('/') => MountSource::Bind(bind),
        (None, Some(_)) => return Err(format!("{at}.bind: expected an absolute path")),
        _ => return Err(format!("{at}: give exactly one of `volume` or `bind`")),
    };
    let target = match text("target")? {
        Some(t) if t.starts_with('/') => t,
        Some(_) => return Err(format!("{at}.target: expected an absolute path")),
        None => return Err(format!("{at}.target: missing")),
    };
    let read_only = match present(mount, "read_only") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(format!("{at}.read_only: expected true or false")),
    };
    Ok(MountSpec {
        source,
        target,
        read_only,
    })
}

fn parse_restart(text: &str) -> Result<Restart, String> {
    let bad =
        || "restart: expected no, always, unless-stopped, on-failure or on-failure:N".to_string();
    match text {
        "no" | "always" | "unless-stopped" | "on-failure" => Ok(Restart {
            name: text.to_string(),
            max_retries: None,
        }),
        _ => {
            let n = text
                .strip_prefix("on-failure:")
                .and_then(|n| n.parse::<i64>().ok())
                .filter(|n| *n >= 0)
                .ok_or_else(bad)?;
            Ok(Restart {
                name: "on-failure".into(),
                max_retries: Some(n),
            })
        }
    }
}

/// Bytes as a number, or a size with a unit: `b`, `k`, `m`, `g` (powers of
/// 1024, as docker reads them).
pub fn parse_bytes(value: &Value) -> Option<i64> {
    if let Some(n) = value.as_i64() {
        return (n > 0).then_some(n);
    }
    let text = value.as_str()?.trim().to_ascii_lowercase();
    let text = text
        .strip_suffix('b')
        .filter(|t| !t.is_empty() && t.ends_with(['k', 'm', 'g']))
        .unwrap_or(&text);
    let (digits, unit) = match text.chars().last()? {
        'k' => (&text[..text.len() - 1], 1i64 << 10),
        'm' => (&text[..text.len() - 1], 1 << 20),
        'g' => (&text[..text.len() - 1], 1 << 30),
        'b' => (&text[..text.len() - 1], 1),
        _ => (text, 1),
    };
    let n: f64 = digits.trim().parse().ok()?;
    let bytes = n * unit as f64;
    (n.is_finite() && bytes >= 1.0 && bytes < i64::MAX as f64).then_some(bytes as i64)
}

fn optional_name(map: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match present(map, key) {
        None => Ok(None),
        Some(Value::String(s)) if valid_name(s) => Ok(Some(s.clone())),
        Some(_) => Err(format!(
            "{key}: expected a name of letters, digits, `_`, `.` and `-`"
        )),
    }
}

/// What the engine accepts as a container, network or volume name.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn string_list(value: &Value, key: &str) -> Result<Vec<String>, String> {
    let Value::Array(items) = value else {
        return Err(format!("{key}: expected a list of strings"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| scalar_text(item).ok_or_else(|| format!("{key}[{i}]: expected a string")))
        .collect()
}

fn string_map(value: Option<&Value>, key: &str) -> Result<BTreeMap<String, String>, String> {
    match value {
        None => Ok(BTreeMap::new()),
        Some(Value::Object(vars)) => vars
            .iter()
            .map(|(k, v)| {
                scalar_text(v)
                    .map(|v| (k.clone(), v))
                    .ok_or_else(|| format!("{key}.{k}: expected a string"))
            })
            .collect(),
        Some(_) => Err(format!("{key}: expected an object of strings")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn provider_config_defaults_and_named_errors() {
        assert_eq!(
            ProviderConfig::parse(&json!({})),
            Ok(ProviderConfig::default())
        );
        let parsed = ProviderConfig::parse(
            &json!({"docker_host": "tcp://h:2376", "capacity": 3, "stop_timeout_s": 1}),
        )
        .unwrap();
        assert_eq!(parsed.docker_host.as_deref(), Some("tcp://h:2376"));
        assert_eq!(parsed.capacity, 3);
        assert_eq!(parsed.stop_timeout_s, 1);
        for (config, key) in [
            (json!({"docker_host": 1}), "docker_host"),
            (json!({"capacity": "many"}), "capacity"),
            (json!({"stop_timeout_s": -1}), "stop_timeout_s"),
            (json!({"stop_timeout_s": "5"}), "stop_timeout_s"),
        ] {
            let error = ProviderConfig::parse(&config).unwrap_err();
            assert!(error.starts_with(key), "{error}");
        }
    }

    #[test]
    fn container_config_fields() {
        let parsed = ContainerConfig::parse(
            &json!({
                "image": "busybox:1",
                "command": "echo hi",
                "env": {"A": "b", "N": 1},
                "ports": [{"container": 80}, {"container": 53, "host": 5353, "protocol": "udp"}],
                "mounts": [{"volume": "v", "target": "/data"}, {"bind": "/tmp", "target": "/t", "read_only": true}],
                "network": "net",
                "aliases": ["web"],
                "restart": "on-failure:3",
                "limits": {"memory": "64m", "cpus": 0.5},
                "labels": {"team": "a"},
            })
            .to_string(),
        )
        .unwrap();
        assert_eq!(parsed.image, ImageSource::Reference("busybox:1".into()));
        assert_eq!(
            parsed.command.unwrap(),
            ["sh", "-c", "echo hi"].map(String::from)
        );
        assert_eq!(parsed.env["N"], "1");
        assert_eq!(parsed.ports[0].host, 0);
        assert_eq!(parsed.ports[0].protocol, "tcp");
        assert_eq!(parsed.ports[1].protocol, "udp");
        assert_eq!(parsed.mounts[1].source, MountSource::Bind("/tmp".into()));
        assert!(parsed.mounts[1].read_only);
        assert_eq!(parsed.restart.unwrap().max_retries, Some(3));
        assert_eq!(parsed.memory, Some(64 << 20));
        assert_eq!(parsed.nano_cpus, Some(500_000_000));
    }

    #[test]
    fn sizes() {
        for (text, bytes) in [
            (json!(1000), Some(1000)),
            (json!("64m"), Some(64 << 20)),
            (json!("64MB"), Some(64 << 20)),
            (json!("1g"), Some(1 << 30)),
            (json!("512k"), Some(512 << 10)),
            (json!("100b"), Some(100)),
            (json!("100"), Some(100)),
            (json!("x"), None),
            (json!(-1), None),
        ] {
            assert_eq!(parse_bytes(&text), bytes, "{text}");
        }
    }

    #[test]
    fn container_config_named_errors() {
        for (config, error) in [
            (json!({}), "image: missing"),
            (json!({"image": 1}), "image:"),
            (json!({"image": "x", "build": {"context": "/c"}}), "image:"),
            (json!({"build": {"context": "rel"}}), "build.context:"),
            (
                json!({"build": {"context": "/c", "dockerfile": "../D"}}),
                "build.dockerfile:",
            ),
            (
                json!({"build": {"context": "/c", "args": {"A": []}}}),
                "build.args.A:",
            ),
            (json!({"image": "x", "command": 5}), "command:"),
            (json!({"image": "x", "command": ["a", {}]}), "command[1]:"),
            (json!({"image": "x", "env": {"A": []}}), "env.A:"),
            (
                json!({"image": "x", "ports": [{"container": 0}]}),
                "ports[0].container: expected a number 1–65535",
            ),
            (
                json!({"image": "x", "ports": [{"container": 80, "host": 70000}]}),
                "ports[0].host:",
            ),
            (
                json!({"image": "x", "ports": [{"container": 80, "protocol": "sctp"}]}),
                "ports[0].protocol:",
            ),
            (
                json!({"image": "x", "mounts": [{"target": "/d"}]}),
                "mounts[0]:",
            ),
            (
                json!({"image": "x", "mounts": [{"volume": "v", "target": "d"}]}),
                "mounts[0].target:",
            ),
            (json!({"image": "x", "network": "a b"}), "network:"),
            (json!({"image": "x", "aliases": ["a"]}), "aliases:"),
            (json!({"image": "x", "restart": "sometimes"}), "restart:"),
            (
                json!({"image": "x", "limits": {"memory": "lots"}}),
                "limits.memory:",
            ),
            (
                json!({"image": "x", "limits": {"cpus": -1}}),
                "limits.cpus:",
            ),
            (
                json!({"image": "x", "labels": {"io.corbel.resource": "x"}}),
                "labels.io.corbel.resource:",
            ),
            (json!({"image": "x", "name": "/bad"}), "name:"),
        ] {
            let got = ContainerConfig::parse(&config.to_string()).unwrap_err();
            assert!(got.starts_with(error), "{config}: {got}");
        }
        assert_eq!(
            ContainerConfig::parse("[1]").unwrap_err(),
            "config: expected a JSON object"
        );
    }

    #[test]
    fn network_and_volume_configs() {
        let net = NetworkConfig::parse("{}").unwrap();
        assert_eq!(net.driver, "bridge");
        assert!(!net.internal);
        assert!(
            NetworkConfig::parse(r#"{"internal": "yes"}"#)
                .unwrap_err()
                .starts_with("internal:")
        );
        let vol = VolumeConfig::parse(r#"{"name": "data"}"#).unwrap();
        assert_eq!(vol.driver, "local");
        assert_eq!(vol.name.as_deref(), Some("data"));
        assert!(
            VolumeConfig::parse(r#"{"labels": 1}"#)
                .unwrap_err()
                .starts_with("labels:")
        );
    }
}
