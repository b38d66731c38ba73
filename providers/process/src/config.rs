//! The two configurations, parsed by hand so every error names its key:
//! the provider's (from `Configure`) and a resource's (`Resource.config_json`).

use std::collections::BTreeMap;
use std::path::PathBuf;
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
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            capacity: 100,
            grace: Duration::from_millis(5000),
            state_dir: None,
            pass_env: Vec::new(),
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
        Ok(ServiceConfig {
            command,
            args,
            env,
            cwd,
            port,
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
    fn provider_config_defaults_and_named_errors() {
        assert_eq!(
            ProviderConfig::parse(&json!({})),
            Ok(ProviderConfig::default())
        );
        let parsed = ProviderConfig::parse(
            &json!({"capacity": 3, "grace_ms": 10, "state_dir": "/s", "pass_env": ["HTTP_PROXY"], "x": 1}),
        )
        .unwrap();
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
