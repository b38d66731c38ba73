//! `corbel-provider.yaml`, the file at the root of a provider's repository: its name,
//! version, how to build and run it, and what it offers.
//!
//! Parsing is strict about shape (unknown keys are errors, since they are usually
//! typos) and lenient about meaning where providers may be newer than this server:
//! unknown features are kept, not refused. Every error names the file and the field.
//! It never fetches, builds or runs anything: it reads one file.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use super::ProviderMetadata;

pub const FILE_NAME: &str = "corbel-provider.yaml";
/// Larger files are refused unread: the file is a few lines, and it comes from
/// someone else's repository.
pub const MAX_SIZE: u64 = 64 * 1024;
/// Features this server knows; others are kept so a newer provider still loads.
pub const KNOWN_FEATURES: [&str; 9] = [
    "deploy",
    "destroy",
    "inspect",
    "nodes",
    "data",
    "power",
    "repository",
    "exec",
    "files",
];
const RUNTIMES: &str = "shell, docker, remote";
const MAX_NAME_LEN: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// `[A-Za-z0-9._-]{1,64}`.
    pub name: String,
    /// May be empty.
    pub description: String,
    pub version: String,
    pub author: Option<String>,
    pub runtime: Runtime,
    /// As written, unknown ones included; see [`KNOWN_FEATURES`].
    pub features: Vec<String>,
    pub resource_types: Vec<String>,
    /// What `corbel provider check` uses; the server ignores it.
    pub check: Check,
}

/// The `check:` section: samples for `corbel provider check`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Check {
    /// Sent with `Configure` when the provider registers (a JSON object).
    pub config: serde_json::Map<String, serde_json::Value>,
    /// A sample resource configuration per resource type, deployed and
    /// destroyed by the check.
    pub resources: std::collections::BTreeMap<String, serde_json::Value>,
    /// Per resource type, a configuration its sample is updated to in place
    /// (protocol version 2): it changes only keys the provider describes as
    /// updatable.
    pub updates: std::collections::BTreeMap<String, serde_json::Value>,
    /// Per resource type with a sample, a shell command that kills the
    /// deployed sample behind the provider's back (the "watch" check), run
    /// with `sh -c` in the provider's directory with the sample's outputs in
    /// its environment (`CORBEL_OUTPUTS`, `CORBEL_OUTPUT_<KEY>`).
    pub kill: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runtime {
    /// `build` and `run` are shell command lines, run in the checkout.
    Shell { build: Option<String>, run: String },
    /// An image built from the checkout and run as a container.
    Docker(DockerSpec),
    /// Run elsewhere by its operator; it registers over TCP with mutual TLS
    /// (`--provider-listen`). Nothing is built or started.
    Remote,
}

impl Runtime {
    /// The shell runtime's `run:` command line.
    pub fn shell_run(&self) -> Option<&str> {
        match self {
            Runtime::Shell { run, .. } => Some(run),
            Runtime::Docker(_) | Runtime::Remote => None,
        }
    }
}

/// The `docker:` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerSpec {
    /// Relative to the checkout, never leaving it.
    pub dockerfile: String,
    /// The build context: relative to the checkout, never leaving it.
    pub context: String,
    /// `--build-arg`s, in the order of their names.
    pub build_args: std::collections::BTreeMap<String, String>,
    /// The container's command; `None` runs the image's own.
    pub command: Option<Vec<String>>,
    /// Memory limit in bytes.
    pub memory: Option<i64>,
    /// CPU limit in billionths of a CPU (`cpus: 1.5` is 1,500,000,000).
    pub nano_cpus: Option<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("{FILE_NAME} not found in {}", .dir.display())]
    Missing { dir: PathBuf },
    #[error("{} is not a regular file", .path.display())]
    NotAFile { path: PathBuf },
    #[error("{} is too large ({size} bytes; at most {MAX_SIZE} are allowed)", .path.display())]
    TooLarge { path: PathBuf, size: u64 },
    #[error("could not read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The YAML does not have the expected shape; `message` names the field path.
    #[error("{FILE_NAME}: {message}")]
    Parse { message: String },
    #[error("{FILE_NAME}: {field}: {message}")]
    Invalid { field: String, message: String },
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with name, version and runtime"
)]
struct RawMetadata {
    name: String,
    #[serde(default)]
    description: String,
    version: String,
    #[serde(default)]
    author: Option<String>,
    runtime: String,
    #[serde(default)]
    shell: Option<RawShell>,
    #[serde(default)]
    docker: Option<RawDocker>,
    #[serde(default)]
    features: Vec<String>,
    #[serde(default)]
    resource_types: Vec<String>,
    #[serde(default)]
    check: Option<RawCheck>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with config, resources, updates and kill"
)]
struct RawCheck {
    #[serde(default)]
    config: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    resources: std::collections::BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    updates: std::collections::BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    kill: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with run and optionally build"
)]
struct RawShell {
    #[serde(default)]
    build: Option<String>,
    run: Option<String>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with dockerfile, context, build_args, command and limits"
)]
struct RawDocker {
    #[serde(default = "default_dockerfile")]
    dockerfile: String,
    #[serde(default = "default_context")]
    context: String,
    #[serde(default)]
    build_args: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    command: Option<Vec<String>>,
    #[serde(default)]
    limits: RawLimits,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a mapping with memory and cpus")]
struct RawLimits {
    /// Bytes, or a number with a `k`, `m` or `g` suffix (powers of 1024).
    #[serde(default)]
    memory: Option<serde_yaml_ng::Value>,
    #[serde(default)]
    cpus: Option<f64>,
}

impl Default for RawDocker {
    fn default() -> Self {
        Self {
            dockerfile: default_dockerfile(),
            context: default_context(),
            build_args: Default::default(),
            command: None,
            limits: RawLimits::default(),
        }
    }
}

/// The engine refuses less than this (6 MiB).
const MIN_MEMORY: i64 = 6 * 1024 * 1024;

/// `memory`: bytes as a number, or `<n>k`, `<n>m`, `<n>g` (powers of 1024).
fn memory_bytes(value: &serde_yaml_ng::Value) -> Result<i64, MetadataError> {
    let field = "docker.limits.memory";
    let text = match value {
        serde_yaml_ng::Value::Number(n) => n.to_string(),
        serde_yaml_ng::Value::String(s) => s.trim().to_ascii_lowercase(),
        _ => return Err(invalid(field, "must be a number of bytes or like `256m`")),
    };
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => text.split_at(at),
        None => (text.as_str(), ""),
    };
    let shift = match unit.trim_end_matches(['b', 'i']) {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        _ => {
            return Err(invalid(
                field,
                format!("`{text}`: the unit must be k, m or g"),
            ));
        }
    };
    let bytes = digits
        .parse::<i64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| invalid(field, format!("`{text}` is not a size in bytes")))?;
    if bytes < MIN_MEMORY {
        return Err(invalid(field, "must be at least 6m (the engine's minimum)"));
    }
    Ok(bytes)
}

fn default_dockerfile() -> String {
    "Dockerfile".to_owned()
}

fn default_context() -> String {
    ".".to_owned()
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> MetadataError {
    MetadataError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// Parses and checks the text of a `corbel-provider.yaml`.
pub fn parse(text: &str) -> Result<Metadata, MetadataError> {
    crate::yaml::check(text, "corbel-provider.yaml", &crate::yaml::LIMITS).map_err(|e| {
        MetadataError::Parse {
            message: e.to_string(),
        }
    })?;
    let deserializer = serde_yaml_ng::Deserializer::from_str(text);
    let raw: RawMetadata = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let inner = strip_yaml_path(&inner, &path);
        let message = if path == "." {
            inner.to_owned()
        } else {
            format!("{path}: {inner}")
        };
        MetadataError::Parse { message }
    })?;
    check(raw)
}

/// serde_yaml_ng prefixes some messages with its own idea of the path: `path`, or the
/// map holding it (for an unknown key). `path` from serde_path_to_error is the precise
/// one, so the other is removed.
fn strip_yaml_path<'m>(message: &'m str, path: &str) -> &'m str {
    let mut candidate = path;
    loop {
        if let Some(rest) = message
            .strip_prefix(candidate)
            .and_then(|rest| rest.strip_prefix(": "))
        {
            return rest;
        }
        match candidate.rfind(['.', '[']) {
            Some(end) if end > 0 => candidate = &candidate[..end],
            _ => return message,
        }
    }
}

/// The meaning of what parsed: each part checked in turn, the first error
/// returned.
fn check(raw: RawMetadata) -> Result<Metadata, MetadataError> {
    check_name(&raw.name)?;
    if raw.version.trim().is_empty() {
        return Err(invalid("version", "must not be empty"));
    }
    let runtime = runtime(&raw.runtime, raw.shell, raw.docker)?;
    check_lists(&raw.features, &raw.resource_types)?;
    let check = check_samples(raw.check, &raw.resource_types)?;
    Ok(Metadata {
        name: raw.name,
        description: raw.description,
        version: raw.version,
        author: raw.author,
        runtime,
        features: raw.features,
        resource_types: raw.resource_types,
        check,
    })
}

fn check_name(name: &str) -> Result<(), MetadataError> {
    if name.is_empty() {
        return Err(invalid("name", "must not be empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid(
            "name",
            format!("must be at most {MAX_NAME_LEN} characters"),
        ));
    }
    let name_ok = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    if !name.chars().all(name_ok) || name == "." || name == ".." {
        return Err(invalid(
            "name",
            format!(
                "`{}` may only contain letters, digits, `.`, `_` and `-`",
                name.escape_default()
            ),
        ));
    }
    Ok(())
}

/// The `runtime` named, with its section.
fn runtime(
    name: &str,
    shell: Option<RawShell>,
    docker: Option<RawDocker>,
) -> Result<Runtime, MetadataError> {
    Ok(match name {
        "shell" => {
            let shell =
                shell.ok_or_else(|| invalid("shell", "is required when runtime is `shell`"))?;
            let run = shell.run.filter(|r| !r.trim().is_empty());
            let run = run.ok_or_else(|| invalid("shell.run", "must not be empty"))?;
            let build = shell.build.filter(|b| !b.trim().is_empty());
            Runtime::Shell { build, run }
        }
        "docker" => Runtime::Docker(docker_spec(docker.unwrap_or_default())?),
        "remote" => Runtime::Remote,
        other => {
            return Err(invalid(
                "runtime",
                format!(
                    "unknown runtime `{}` (expected one of: {RUNTIMES})",
                    other.escape_default()
                ),
            ));
        }
    })
}

/// The `docker:` section, its paths kept inside the checkout and its limits
/// in the engine's units.
fn docker_spec(docker: RawDocker) -> Result<DockerSpec, MetadataError> {
    check_relative("docker.dockerfile", &docker.dockerfile)?;
    check_relative("docker.context", &docker.context)?;
    if let Some(command) = &docker.command
        && (command.is_empty() || command[0].trim().is_empty())
    {
        return Err(invalid("docker.command", "must name a program"));
    }
    for name in docker.build_args.keys() {
        if name.is_empty() || name.contains(['=', ' ']) {
            return Err(invalid(
                format!("docker.build_args.{name}"),
                "must be a name without `=` or spaces",
            ));
        }
    }
    let memory = docker
        .limits
        .memory
        .as_ref()
        .map(memory_bytes)
        .transpose()?;
    let nano_cpus = match docker.limits.cpus {
        None => None,
        Some(cpus) if cpus.is_finite() && cpus > 0.0 && cpus <= 1024.0 => {
            Some((cpus * 1e9).round() as i64)
        }
        Some(cpus) => {
            return Err(invalid(
                "docker.limits.cpus",
                format!("`{cpus}` must be more than 0 and at most 1024"),
            ));
        }
    };
    Ok(DockerSpec {
        dockerfile: docker.dockerfile,
        context: docker.context,
        build_args: docker.build_args,
        command: docker.command,
        memory,
        nano_cpus,
    })
}

fn check_lists(features: &[String], resource_types: &[String]) -> Result<(), MetadataError> {
    for (i, feature) in features.iter().enumerate() {
        if feature.trim().is_empty() {
            return Err(invalid(format!("features[{i}]"), "must not be empty"));
        }
    }
    for (i, kind) in resource_types.iter().enumerate() {
        if kind.is_empty() || kind.chars().any(char::is_whitespace) {
            return Err(invalid(
                format!("resource_types[{i}]"),
                format!(
                    "`{}` must be non-empty and without whitespace",
                    kind.escape_default()
                ),
            ));
        }
    }
    Ok(())
}

/// The `check:` section: samples only of declared types, updates only of
/// sampled ones.
fn check_samples(raw: Option<RawCheck>, resource_types: &[String]) -> Result<Check, MetadataError> {
    let check = raw.map_or_else(Check::default, |c| Check {
        config: c.config,
        resources: c.resources,
        updates: c.updates,
        kill: c.kill,
    });
    for kind in check.resources.keys() {
        if !resource_types.contains(kind) {
            return Err(invalid(
                format!("check.resources.{kind}"),
                "is not one of resource_types",
            ));
        }
    }
    for (kind, update) in &check.updates {
        if !check.resources.contains_key(kind) {
            return Err(invalid(
                format!("check.updates.{kind}"),
                "has no sample under check.resources to update",
            ));
        }
        if !update.is_object() {
            return Err(invalid(
                format!("check.updates.{kind}"),
                "must be a mapping (the whole new configuration)",
            ));
        }
    }
    for (kind, command) in &check.kill {
        if !check.resources.contains_key(kind) {
            return Err(invalid(
                format!("check.kill.{kind}"),
                "has no sample under check.resources to kill",
            ));
        }
        if command.trim().is_empty() {
            return Err(invalid(
                format!("check.kill.{kind}"),
                "is empty: give a shell command",
            ));
        }
    }
    Ok(check)
}

/// A path inside the checkout: relative, without `..`.
fn check_relative(field: &str, path: &str) -> Result<(), MetadataError> {
    let escapes = Path::new(path)
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    if path.trim().is_empty() || escapes {
        return Err(invalid(
            field,
            format!(
                "`{}` must be a relative path inside the repository",
                path.escape_default()
            ),
        ));
    }
    Ok(())
}

/// Reads and parses `dir/corbel-provider.yaml`. Symlinks are refused: the file is
/// someone else's, and parse errors quote what they read.
pub fn load(dir: &Path) -> Result<Metadata, MetadataError> {
    let path = dir.join(FILE_NAME);
    let read_error = |source| MetadataError::Read {
        path: path.clone(),
        source,
    };
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(MetadataError::Missing {
                dir: dir.to_owned(),
            });
        }
        Err(e) => return Err(read_error(e)),
    };
    if !meta.is_file() {
        return Err(MetadataError::NotAFile { path });
    }
    let too_large = |size| MetadataError::TooLarge {
        path: path.clone(),
        size,
    };
    if meta.len() > MAX_SIZE {
        return Err(too_large(meta.len()));
    }
    // The file may grow between the stat and the read: read one byte past the limit.
    let mut bytes = Vec::new();
    std::fs::File::open(&path)
        .and_then(|file| file.take(MAX_SIZE + 1).read_to_end(&mut bytes))
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_SIZE {
        return Err(too_large(bytes.len() as u64));
    }
    let text = String::from_utf8(bytes).map_err(|_| MetadataError::Parse {
        message: "the file is not valid UTF-8".to_owned(),
    })?;
    parse(&text)
}

/// What is stored and shown of a provider's metadata.
impl From<&Metadata> for ProviderMetadata {
    fn from(m: &Metadata) -> Self {
        ProviderMetadata {
            name: m.name.clone(),
            description: m.description.clone(),
            version: m.version.clone(),
            author: m.author.clone(),
            runtime: match m.runtime {
                Runtime::Shell { .. } => "shell".into(),
                Runtime::Docker(_) => "docker".into(),
                Runtime::Remote => "remote".into(),
            },
            features: m.features.clone(),
            resource_types: m.resource_types.clone(),
        }
    }
}

#[cfg(test)]
mod tests;
