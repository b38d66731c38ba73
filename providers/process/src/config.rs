//! The two configurations, parsed by hand so every error names its key:
//! the provider's (from `Configure`) and a resource's (`Resource.config_json`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use corbel_provider_sdk::config::{object, present, scalar_text};
use serde_json::Value;

/// The provider's configuration. Each `Configure` carries all of it: a key
/// left out goes back to its default. Unknown keys are ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    /// How many services the one node holds (`capacity`, default 100).
    pub capacity: i64,
    /// How long a destroyed service has between SIGTERM and SIGKILL (`grace_ms`, default 5000).
    pub grace: Duration,
    /// Where records and logs go (`state_dir`), unless `CORBEL_STATE_DIR` says otherwise.
    pub state_dir: Option<PathBuf>,
    /// Variables of the provider's own environment passed on to every service
    /// (`pass_env`, default none), e.g. `["HTTP_PROXY", "NO_PROXY"]`. Services
    /// start from a clean environment (see [`crate::lifecycle::BASE_ENV`]);
    /// this is the opt-in for anything else the provider's host sets. Names
    /// starting `CORBEL_` are refused: those are the provider's own.
    pub pass_env: Vec<String>,
    /// How large a service's log file grows before it is rotated
    /// (`log_max_bytes`, default 1 MiB, from [`LOG_MAX_BYTES_RANGE`]).
    pub log_max_bytes: u64,
    /// How many rotated files of each service are kept (`log_files`, default
    /// 1, at most [`MAX_LOG_FILES`]; 0 keeps none: a full log is emptied).
    pub log_files: u32,
}

/// The values `log_max_bytes` may take: 1 KiB to 1 GiB.
pub const LOG_MAX_BYTES_RANGE: std::ops::RangeInclusive<u64> = 1024..=(1 << 30);
/// The most rotated files `log_files` may keep.
pub const MAX_LOG_FILES: u32 = 20;

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            capacity: 100,
            grace: Duration::from_millis(5000),
            state_dir: None,
            pass_env: Vec::new(),
            log_max_bytes: 1 << 20,
            log_files: 1,
        }
    }
}

impl ProviderConfig {
    /// Parses a `Configure` payload; the error names the offending key.
    pub fn parse(config: &Value) -> Result<Self, String> {
        let Value::Object(map) = config else {
            return Err("the configuration must be a JSON object".to_string());
        };
        let mut parsed = ProviderConfig::default();
        if let Some(value) = present(map, "capacity") {
            parsed.capacity = value
                .as_i64()
                .filter(|n| *n >= 0)
                .ok_or("capacity: expected a non-negative integer")?;
        }
        if let Some(value) = present(map, "grace_ms") {
            let ms = value
                .as_u64()
                .ok_or("grace_ms: expected a non-negative integer")?;
            parsed.grace = Duration::from_millis(ms);
        }
        if let Some(value) = present(map, "state_dir") {
            let dir = value.as_str().ok_or("state_dir: expected a string")?;
            parsed.state_dir = Some(PathBuf::from(dir));
        }
        if let Some(value) = present(map, "pass_env") {
            let Value::Array(names) = value else {
                return Err("pass_env: expected a list of variable names".to_string());
            };
            parsed.pass_env = names
                .iter()
                .enumerate()
                .map(|(i, name)| variable_name(name).map_err(|e| format!("pass_env[{i}]: {e}")))
                .collect::<Result<_, _>>()?;
        }
        if let Some(value) = present(map, "log_max_bytes") {
            parsed.log_max_bytes = value
                .as_u64()
                .filter(|n| LOG_MAX_BYTES_RANGE.contains(n))
                .ok_or_else(|| {
                    format!(
                        "log_max_bytes: expected an integer from {} to {}",
                        LOG_MAX_BYTES_RANGE.start(),
                        LOG_MAX_BYTES_RANGE.end()
                    )
                })?;
        }
        if let Some(value) = present(map, "log_files") {
            parsed.log_files = value
                .as_u64()
                .filter(|n| *n <= u64::from(MAX_LOG_FILES))
                .ok_or_else(|| {
                    format!("log_files: expected an integer from 0 to {MAX_LOG_FILES}")
                })? as u32;
        }
        Ok(parsed)
    }
}

/// A `process.v1.service` resource's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceConfig {
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// Pick a free port on 127.0.0.1, pass it as `PORT`, report it in outputs.
    pub port: bool,
    /// What it may touch (`sandbox`, see [`crate::sandbox`]).
    pub sandbox: Sandbox,
}

/// A service's `sandbox`: absent, or `{ read: [...], write: [...] }` (absolute
/// paths) widening what it may touch; `none` to start it unconfined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sandbox {
    /// Under a Landlock ruleset: the system's directories, its `cwd`, and these.
    Confined {
        read: Vec<PathBuf>,
        write: Vec<PathBuf>,
    },
    /// `sandbox: none`: no ruleset of its own (the provider's still applies).
    None,
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox::Confined {
            read: Vec::new(),
            write: Vec::new(),
        }
    }
}

impl Sandbox {
    fn parse(value: &Value) -> Result<Sandbox, String> {
        const EXPECTED: &str =
            "config.sandbox: expected `none` or an object { read: [paths], write: [paths] }";
        match value {
            Value::String(s) if s == "none" => Ok(Sandbox::None),
            Value::Object(map) => {
                if let Some(key) = map.keys().find(|k| !matches!(k.as_str(), "read" | "write")) {
                    return Err(format!(
                        "config.sandbox.{key}: unknown key (read and write are known)"
                    ));
                }
                Ok(Sandbox::Confined {
                    read: paths(map, "read")?,
                    write: paths(map, "write")?,
                })
            }
            _ => Err(EXPECTED.to_string()),
        }
    }
}

/// `config.sandbox.<key>`: a list of absolute paths.
fn paths(map: &serde_json::Map<String, Value>, key: &str) -> Result<Vec<PathBuf>, String> {
    let Some(value) = present(map, key) else {
        return Ok(Vec::new());
    };
    let Value::Array(items) = value else {
        return Err(format!("config.sandbox.{key}: expected a list of paths"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item.as_str() {
            Some(path) if Path::new(path).is_absolute() => Ok(PathBuf::from(path)),
            _ => Err(format!(
                "config.sandbox.{key}[{i}]: expected an absolute path"
            )),
        })
        .collect()
}

impl ServiceConfig {
    /// Parses `Resource.config_json`; errors read `config.<key>: <problem>`.
    pub fn parse(config_json: &str) -> Result<Self, String> {
        let map = object(config_json)?;
        let command = match present(&map, "command") {
            None => return Err("config.command: missing".to_string()),
            Some(Value::String(s)) if s.trim().is_empty() => {
                return Err("config.command: empty".to_string());
            }
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err("config.command: expected a string".to_string()),
        };
        let args = match present(&map, "args") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    scalar_text(item).ok_or_else(|| format!("config.args[{i}]: expected a string"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("config.args: expected a list of strings".to_string()),
        };
        let env = match present(&map, "env") {
            None => BTreeMap::new(),
            Some(Value::Object(vars)) => vars
                .iter()
                .map(|(key, value)| {
                    scalar_text(value)
                        .map(|v| (key.clone(), v))
                        .ok_or_else(|| format!("config.env.{key}: expected a string"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("config.env: expected an object of strings".to_string()),
        };
        let cwd = match present(&map, "cwd") {
            None => None,
            Some(Value::String(s)) => Some(PathBuf::from(s)),
            Some(_) => return Err("config.cwd: expected a string".to_string()),
        };
        let port = match present(&map, "port") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err("config.port: expected true or false".to_string()),
        };
        let sandbox = match present(&map, "sandbox") {
            None => Sandbox::default(),
            Some(value) => Sandbox::parse(value)?,
        };
        Ok(ServiceConfig {
            command,
            args,
            env,
            cwd,
            port,
            sandbox,
        })
    }
}

/// A `process.v1.job` resource's configuration: a service's keys (but
/// `port`), and how long and how often it may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobConfig {
    /// `command`, `args`, `env`, `cwd`, `sandbox` as a service's.
    pub run: ServiceConfig,
    /// How long one run may take before it is killed (`timeout_seconds`,
    /// default 600).
    pub timeout: Duration,
    /// How many more times a failed run is made (`retries`, default 0).
    pub retries: u32,
}

/// The longest a job's runs may take together: Corbel's default
/// `provider.resource_timeout_seconds`, its deadline on a whole deploy call.
pub const MAX_JOB_SECONDS: u64 = 1800;
/// The most `retries` a job may have.
pub const MAX_RETRIES: u64 = 10;

impl JobConfig {
    /// Parses `Resource.config_json`; errors read `config.<key>: <problem>`.
    pub fn parse(config_json: &str) -> Result<Self, String> {
        let run = ServiceConfig::parse(config_json)?;
        if run.port {
            return Err("config.port: a job has no port".to_string());
        }
        let map = object(config_json)?;
        let timeout = match present(&map, "timeout_seconds") {
            None => 600,
            Some(value) => value
                .as_u64()
                .filter(|n| (1..=MAX_JOB_SECONDS).contains(n))
                .ok_or_else(|| {
                    format!(
                        "config.timeout_seconds: expected an integer from 1 to {MAX_JOB_SECONDS}"
                    )
                })?,
        };
        let retries = match present(&map, "retries") {
            None => 0,
            Some(value) => value
                .as_u64()
                .filter(|n| *n <= MAX_RETRIES)
                .ok_or_else(|| {
                    format!("config.retries: expected an integer from 0 to {MAX_RETRIES}")
                })?,
        };
        let runs = retries + 1;
        if timeout * runs > MAX_JOB_SECONDS {
            return Err(format!(
                "config.timeout_seconds: {runs} runs of {timeout} s (retries: {retries}) could \
                 take longer than {MAX_JOB_SECONDS} s, Corbel's deadline on a deploy"
            ));
        }
        Ok(JobConfig {
            run,
            timeout: Duration::from_secs(timeout),
            retries: retries as u32,
        })
    }
}

/// A variable name `pass_env` may hold.
fn variable_name(value: &Value) -> Result<String, String> {
    let name = value.as_str().ok_or("expected a variable name")?;
    if name.is_empty() || name.contains(['=', '\0']) {
        return Err(format!("{name:?} is not a variable name"));
    }
    if name.starts_with("CORBEL_") {
        return Err(format!(
            "{name} is not passed on: CORBEL_ variables are the provider's own"
        ));
    }
    Ok(name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_sandbox_is_confined_by_default_widened_by_paths_or_none() {
        let parse = |sandbox: Value| {
            ServiceConfig::parse(&json!({"command": "sleep", "sandbox": sandbox}).to_string())
                .map(|s| s.sandbox)
        };
        assert_eq!(
            ServiceConfig::parse(r#"{"command": "sleep"}"#)
                .unwrap()
                .sandbox,
            Sandbox::default()
        );
        assert_eq!(parse(json!("none")), Ok(Sandbox::None));
        assert_eq!(
            parse(json!({"read": ["/srv/data"], "write": ["/var/app"]})),
            Ok(Sandbox::Confined {
                read: vec![PathBuf::from("/srv/data")],
                write: vec![PathBuf::from("/var/app")],
            })
        );
        for (bad, named) in [
            (json!("off"), "config.sandbox: expected `none`"),
            (
                json!({"write": ["relative"]}),
                "config.sandbox.write[0]: expected an absolute path",
            ),
            (
                json!({"read": "/srv"}),
                "config.sandbox.read: expected a list",
            ),
            (json!({"exec": []}), "config.sandbox.exec: unknown key"),
        ] {
            let error = parse(bad.clone()).unwrap_err();
            assert!(error.starts_with(named), "{bad}: {error}");
        }
    }

    #[test]
    fn provider_config_defaults_and_named_errors() {
        assert_eq!(
            ProviderConfig::parse(&json!({})),
            Ok(ProviderConfig::default())
        );
        let parsed = ProviderConfig::parse(
            &json!({"capacity": 3, "grace_ms": 10, "state_dir": "/s", "pass_env": ["HTTP_PROXY"],
                   "log_max_bytes": 4096, "log_files": 0, "x": 1}),
        )
        .unwrap();
        assert_eq!((parsed.log_max_bytes, parsed.log_files), (4096, 0));
        assert_eq!(parsed.pass_env, ["HTTP_PROXY"]);
        assert_eq!(parsed.capacity, 3);
        assert_eq!(parsed.grace, Duration::from_millis(10));
        assert_eq!(parsed.state_dir, Some(PathBuf::from("/s")));
        for (config, key) in [
            (json!({"capacity": "many"}), "capacity"),
            (json!({"capacity": -1}), "capacity"),
            (json!({"grace_ms": 1.5}), "grace_ms"),
            (json!({"state_dir": 7}), "state_dir"),
            (json!({"pass_env": "PATH"}), "pass_env"),
            (json!({"pass_env": ["A", 1]}), "pass_env[1]"),
            (json!({"pass_env": ["A=b"]}), "pass_env[0]"),
            (json!({"log_max_bytes": 10}), "log_max_bytes"),
            (json!({"log_max_bytes": "1M"}), "log_max_bytes"),
            (json!({"log_files": -1}), "log_files"),
            (json!({"log_files": 21}), "log_files"),
            (
                json!({"pass_env": ["CORBEL_PROVIDER_TOKEN"]}),
                "pass_env[0]",
            ),
        ] {
            let error = ProviderConfig::parse(&config).unwrap_err();
            assert!(error.starts_with(key), "{error}");
        }
    }

    #[test]
    fn job_config_defaults_bounds_and_named_errors() {
        let job = JobConfig::parse(r#"{"command": "true"}"#).unwrap();
        assert_eq!((job.timeout, job.retries), (Duration::from_secs(600), 0));
        let job =
            JobConfig::parse(r#"{"command": "x", "timeout_seconds": 60, "retries": 2}"#).unwrap();
        assert_eq!((job.timeout, job.retries), (Duration::from_secs(60), 2));
        for (config, key) in [
            (
                r#"{"command": "x", "timeout_seconds": 0}"#,
                "config.timeout_seconds",
            ),
            (
                r#"{"command": "x", "timeout_seconds": "1m"}"#,
                "config.timeout_seconds",
            ),
            (r#"{"command": "x", "retries": -1}"#, "config.retries"),
            (r#"{"command": "x", "retries": 11}"#, "config.retries"),
            (
                r#"{"command": "x", "retries": 3}"#,
                "config.timeout_seconds: 4 runs",
            ),
            (r#"{"command": "x", "port": true}"#, "config.port"),
            (r#"{"args": []}"#, "config.command"),
        ] {
            let error = JobConfig::parse(config).unwrap_err();
            assert!(error.starts_with(key), "{config}: {error}");
        }
    }

    #[test]
    fn service_config_fields_and_named_errors() {
        let parsed = ServiceConfig::parse(
            r#"{"command": "sleep", "args": ["30"], "env": {"A": "b"}, "cwd": "/tmp", "port": true}"#,
        )
        .unwrap();
        assert_eq!(parsed.command, "sleep");
        assert_eq!(parsed.args, ["30"]);
        assert_eq!(parsed.env["A"], "b");
        assert_eq!(parsed.cwd, Some(PathBuf::from("/tmp")));
        assert!(parsed.port);
        for (config, error) in [
            (r#"{}"#, "config.command: missing"),
            (r#"{"command": 1}"#, "config.command: expected a string"),
            (r#"{"command": " "}"#, "config.command: empty"),
            (
                r#"{"command": "x", "args": ["a", [2]]}"#,
                "config.args[1]: expected a string",
            ),
            (
                r#"{"command": "x", "env": {"K": {"v": 1}}}"#,
                "config.env.K: expected a string",
            ),
            (
                r#"{"command": "x", "port": "yes"}"#,
                "config.port: expected true or false",
            ),
            (r#"[1]"#, "config: expected a JSON object"),
        ] {
            assert_eq!(ServiceConfig::parse(config).unwrap_err(), error, "{config}");
        }
    }
}
