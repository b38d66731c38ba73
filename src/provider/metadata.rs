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
pub const KNOWN_FEATURES: [&str; 7] = [
    "deploy",
    "destroy",
    "inspect",
    "nodes",
    "data",
    "power",
    "repository",
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
    expecting = "a mapping with config, resources and updates"
)]
struct RawCheck {
    #[serde(default)]
    config: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    resources: std::collections::BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    updates: std::collections::BTreeMap<String, serde_json::Value>,
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

fn check(raw: RawMetadata) -> Result<Metadata, MetadataError> {
    if raw.name.is_empty() {
        return Err(invalid("name", "must not be empty"));
    }
    if raw.name.len() > MAX_NAME_LEN {
        return Err(invalid(
            "name",
            format!("must be at most {MAX_NAME_LEN} characters"),
        ));
    }
    let name_ok = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    if !raw.name.chars().all(name_ok) || raw.name == "." || raw.name == ".." {
        return Err(invalid(
            "name",
            format!(
                "`{}` may only contain letters, digits, `.`, `_` and `-`",
                raw.name.escape_default()
            ),
        ));
    }
    if raw.version.trim().is_empty() {
        return Err(invalid("version", "must not be empty"));
    }
    let runtime = match raw.runtime.as_str() {
        "shell" => {
            let shell = raw
                .shell
                .ok_or_else(|| invalid("shell", "is required when runtime is `shell`"))?;
            let run = shell.run.filter(|r| !r.trim().is_empty());
            let run = run.ok_or_else(|| invalid("shell.run", "must not be empty"))?;
            let build = shell.build.filter(|b| !b.trim().is_empty());
            Runtime::Shell { build, run }
        }
        "docker" => {
            let docker = raw.docker.unwrap_or_default();
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
            Runtime::Docker(DockerSpec {
                dockerfile: docker.dockerfile,
                context: docker.context,
                build_args: docker.build_args,
                command: docker.command,
                memory,
                nano_cpus,
            })
        }
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
    };
    for (i, feature) in raw.features.iter().enumerate() {
        if feature.trim().is_empty() {
            return Err(invalid(format!("features[{i}]"), "must not be empty"));
        }
    }
    for (i, kind) in raw.resource_types.iter().enumerate() {
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
    let check = raw.check.map_or_else(Check::default, |c| Check {
        config: c.config,
        resources: c.resources,
        updates: c.updates,
    });
    for kind in check.resources.keys() {
        if !raw.resource_types.contains(kind) {
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
mod tests {
    use super::*;

    const SHELL: &str = "\
name: process
description: Runs resources as local processes
version: 0.1.0
author: someone
runtime: shell
shell:
  build: cargo build --release
  run: target/release/corbel-provider-process
features: [deploy, destroy, inspect, nodes]
resource_types: [process.v1.service]
";

    fn error(text: &str) -> String {
        match parse(text) {
            Ok(metadata) => panic!("expected an error, parsed {metadata:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn parses_a_shell_provider() {
        let metadata = parse(SHELL).expect("valid");
        assert_eq!(
            metadata,
            Metadata {
                name: "process".into(),
                description: "Runs resources as local processes".into(),
                version: "0.1.0".into(),
                author: Some("someone".into()),
                runtime: Runtime::Shell {
                    build: Some("cargo build --release".into()),
                    run: "target/release/corbel-provider-process".into(),
                },
                features: ["deploy", "destroy", "inspect", "nodes"]
                    .map(String::from)
                    .to_vec(),
                resource_types: vec!["process.v1.service".into()],
                check: Check::default(),
            }
        );
    }

    #[test]
    fn parses_a_docker_provider_with_defaults() {
        let text = "name: docker\nversion: 1.2.0\nruntime: docker\n\
                    shell:\n  run: ignored\nfeatures: [deploy, teleport]\n";
        let metadata = parse(text).expect("valid");
        assert_eq!(
            metadata.runtime,
            Runtime::Docker(DockerSpec {
                dockerfile: "Dockerfile".into(),
                context: ".".into(),
                build_args: Default::default(),
                command: None,
                memory: None,
                nano_cpus: None,
            })
        );
        assert_eq!(metadata.author, None);
        assert_eq!(metadata.description, "");
        // An unknown feature is kept for a newer provider, not refused.
        assert_eq!(metadata.features, ["deploy", "teleport"]);
        assert!(metadata.resource_types.is_empty());

        let text = "name: d\nversion: '1'\nruntime: docker\n\
                    docker: {dockerfile: build/Containerfile, context: build}\n";
        assert_eq!(
            parse(text).expect("valid").runtime,
            Runtime::Docker(DockerSpec {
                dockerfile: "build/Containerfile".into(),
                context: "build".into(),
                build_args: Default::default(),
                command: None,
                memory: None,
                nano_cpus: None,
            })
        );

        let text = "name: d\nversion: '1'\nruntime: docker\ndocker:\n  \
                    build_args: {PROFILE: release}\n  command: [/provider, --quiet]\n  \
                    limits: {memory: 256m, cpus: 1.5}\n";
        assert_eq!(
            parse(text).expect("valid").runtime,
            Runtime::Docker(DockerSpec {
                dockerfile: "Dockerfile".into(),
                context: ".".into(),
                build_args: [("PROFILE".to_owned(), "release".to_owned())].into(),
                command: Some(vec!["/provider".into(), "--quiet".into()]),
                memory: Some(256 * 1024 * 1024),
                nano_cpus: Some(1_500_000_000),
            })
        );
    }

    #[test]
    fn check_updates_name_a_sampled_type_and_a_mapping() {
        let with = |check: &str| {
            format!(
                "name: p\nversion: '1'\nruntime: shell\nshell: {{run: x}}\n\
                 resource_types: [a.v1.x, a.v1.y]\ncheck:\n{check}"
            )
        };
        let parsed = parse(&with(
            "  resources: {a.v1.x: {n: 1}}\n  updates: {a.v1.x: {n: 2}}\n",
        ))
        .unwrap();
        assert_eq!(parsed.check.updates["a.v1.x"], serde_json::json!({"n": 2}));
        for (check, expected) in [
            (
                "  resources: {a.v1.x: {}}\n  updates: {a.v1.y: {n: 2}}\n",
                "check.updates.a.v1.y: has no sample under check.resources",
            ),
            (
                "  resources: {a.v1.x: {}}\n  updates: {a.v1.x: 2}\n",
                "check.updates.a.v1.x: must be a mapping",
            ),
        ] {
            let message = error(&with(check));
            assert!(message.contains(expected), "{check}: {message}");
        }
    }

    #[test]
    fn docker_limits_are_checked() {
        let with = |limits: &str| {
            format!("name: d\nversion: '1'\nruntime: docker\ndocker:\n  limits: {limits}\n")
        };
        let memory = |text: &str| match parse(text).map(|m| m.runtime) {
            Ok(Runtime::Docker(spec)) => Ok(spec.memory),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(memory(&with("{memory: 8388608}")), Ok(Some(8 << 20)));
        assert_eq!(memory(&with("{memory: 1G}")), Ok(Some(1 << 30)));
        assert_eq!(memory(&with("{memory: 512MiB}")), Ok(Some(512 << 20)));
        for (limits, expected) in [
            ("{memory: 1m}", "docker.limits.memory: must be at least 6m"),
            (
                "{memory: 12t}",
                "docker.limits.memory: `12t`: the unit must be",
            ),
            (
                "{memory: lots}",
                "docker.limits.memory: `lots`: the unit must be",
            ),
            ("{cpus: 0}", "docker.limits.cpus: `0` must be more than 0"),
            ("{cpus: -1}", "docker.limits.cpus: `-1` must be more than 0"),
            ("{swap: 1}", "docker.limits.swap: unknown field `swap`"),
        ] {
            let message = memory(&with(limits)).unwrap_err();
            assert!(message.contains(expected), "{limits}: {message}");
        }
        let empty = "name: d\nversion: '1'\nruntime: docker\ndocker: {command: []}\n";
        assert!(error(empty).contains("docker.command: must name a program"));
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                "- a\n".to_owned(),
                "corbel-provider.yaml: invalid type: sequence, expected a mapping with name",
            ),
            (
                SHELL.replace("author:", "autor:"),
                "corbel-provider.yaml: autor: unknown field `autor`, expected one of `name`",
            ),
            (
                SHELL.replace(
                    "  run: target/release/corbel-provider-process",
                    "  run: [a, b]",
                ),
                "corbel-provider.yaml: shell.run: invalid type: sequence, expected a string",
            ),
            (
                SHELL.replace("  build:", "  biuld:"),
                "corbel-provider.yaml: shell.biuld: unknown field `biuld`",
            ),
            (
                SHELL.replace("version: 0.1.0\n", ""),
                "corbel-provider.yaml: missing field `version`",
            ),
            (
                SHELL.replace("name: process", "name: my provider"),
                "corbel-provider.yaml: name: `my provider` may only contain",
            ),
            (
                SHELL.replace("name: process", "name: ''"),
                "corbel-provider.yaml: name: must not be empty",
            ),
            (
                SHELL.replace("name: process", &format!("name: {}", "x".repeat(65))),
                "corbel-provider.yaml: name: must be at most 64 characters",
            ),
            (
                SHELL.replace("version: 0.1.0", "version: ''"),
                "corbel-provider.yaml: version: must not be empty",
            ),
            (
                SHELL.replace("  run: target/release/corbel-provider-process\n", ""),
                "corbel-provider.yaml: shell.run: must not be empty",
            ),
            (
                "name: a\nversion: '1'\nruntime: shell\n".to_owned(),
                "corbel-provider.yaml: shell: is required when runtime is `shell`",
            ),
            (
                SHELL.replace("runtime: shell", "runtime: podman"),
                "corbel-provider.yaml: runtime: unknown runtime `podman` (expected one of: shell, docker, remote)",
            ),
            (
                SHELL.replace("[deploy, destroy", "[deploy, ''"),
                "corbel-provider.yaml: features[1]: must not be empty",
            ),
            (
                SHELL.replace("[process.v1.service]", "[ok, 'a b']"),
                "corbel-provider.yaml: resource_types[1]: `a b` must be non-empty and without whitespace",
            ),
            (
                "name: d\nversion: '1'\nruntime: docker\ndocker: {context: ../..}\n".to_owned(),
                "corbel-provider.yaml: docker.context: `../..` must be a relative path",
            ),
        ];
        for (text, expected) in cases {
            let message = error(&text);
            assert!(
                message.starts_with(expected),
                "got: {message}\nwanted: {expected}"
            );
        }
        // Wrong types carry the YAML position.
        let message = error(&SHELL.replace(
            "  run: target/release/corbel-provider-process",
            "  run: [a, b]",
        ));
        assert!(message.contains("line 8"), "{message}");
    }

    #[test]
    fn alias_bomb_is_refused_quickly() {
        let mut text = String::from(
            "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
        );
        for level in b'b'..=b'i' {
            let previous = (level - 1) as char;
            let level = level as char;
            let refs = vec![format!("*{previous}"); 9].join(",");
            text.push_str(&format!("{level}: &{level} [{refs}]\n"));
        }
        text.push_str("features: *i\n");
        let started = std::time::Instant::now();
        let message = error(&text);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert!(message.starts_with("corbel-provider.yaml: "), "{message}");
        // It is a real bomb: expanded in full, serde_yaml_ng stops it.
        let expanded = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(&text);
        let expanded = expanded.expect_err("repetition limit").to_string();
        assert!(expanded.contains("repetition limit exceeded"), "{expanded}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn load_reads_the_file_from_a_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let error = load(dir.path()).expect_err("missing");
        assert!(matches!(error, MetadataError::Missing { .. }));
        assert_eq!(
            error.to_string(),
            format!("corbel-provider.yaml not found in {}", dir.path().display())
        );

        std::fs::write(dir.path().join(FILE_NAME), SHELL).expect("write");
        assert_eq!(load(dir.path()).expect("valid").name, "process");

        let big = format!("{SHELL}#{}\n", "x".repeat(MAX_SIZE as usize));
        std::fs::write(dir.path().join(FILE_NAME), big).expect("write");
        assert!(matches!(
            load(dir.path()),
            Err(MetadataError::TooLarge { .. })
        ));

        let other = tempfile::tempdir().expect("tempdir");
        std::fs::remove_file(dir.path().join(FILE_NAME)).expect("rm");
        std::fs::write(other.path().join("secret"), SHELL).expect("write");
        std::os::unix::fs::symlink(other.path().join("secret"), dir.path().join(FILE_NAME))
            .expect("symlink");
        assert!(matches!(
            load(dir.path()),
            Err(MetadataError::NotAFile { .. })
        ));
    }
}
