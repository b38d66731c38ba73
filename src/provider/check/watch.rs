//! The "watch" check (protocol version 3): a sample deployed and watched
//! with `WatchResources`. The first report must have it HEALTHY, then
//! `synced`; then the check kills it behind the provider's back and the
//! stream must say DOWN within the call deadline.
//!
//! How it kills a sample, in this order: the shell command of
//! `check.kill.<type>` in `corbel-provider.yaml` (run with `sh -c` in the
//! provider's directory, the sample's outputs in its environment: see
//! [`output_env`]); a `pid` in its outputs (SIGKILL); an `id` in its outputs
//! that the local Docker engine knows as a container (killed through the
//! engine). With none of these the check warns, naming why. A provider that
//! does not register "watch" is skipped: Corbel polls it with Inspect.

use std::path::Path;
use std::time::Duration;

use corbel_proto::v1::{self as proto, Health};
use tokio::time::Instant;
use uuid::Uuid;

use super::super::link::Link;
use super::super::metadata::Metadata;
use super::calls::{deploy, destroy, resource};
use super::{Check, Outcome};

const ROW: &str = "watch";
const FIRST: &str = "watch: first report";
const KILLED: &str = "watch: DOWN when killed";

/// What `check_watch` goes by.
pub(super) struct Watch<'a> {
    /// The version the provider registered with.
    pub(super) version: u32,
    /// The features it registered.
    pub(super) features: &'a [String],
    /// The provider's directory, where a `check.kill` command runs.
    pub(super) dir: &'a Path,
    pub(super) node: &'a str,
}

/// How a sample is killed behind its provider's back.
enum Kill {
    Command(String),
    Pid(i32),
    Container(String),
}

impl Kill {
    fn describe(&self) -> String {
        match self {
            Kill::Command(command) => format!("check.kill's `{command}`"),
            Kill::Pid(pid) => format!("SIGKILL to pid {pid}"),
            Kill::Container(id) => format!("killing container {}", &id[..id.len().min(12)]),
        }
    }
}

impl Check {
    /// Skipped without "watch"; else the first sample that can be killed is
    /// deployed, watched, killed and destroyed.
    pub(super) async fn check_watch(&mut self, link: &Link, meta: &Metadata, watch: Watch<'_>) {
        if !watch.features.iter().any(|f| f == "watch") {
            let why = "the provider does not register `watch`: Corbel polls it with Inspect";
            self.report.add(ROW, Outcome::Skip, why);
            return;
        }
        if watch.version < corbel_proto::HEALTH_VERSION {
            let why = format!(
                "registers `watch` but speaks protocol version {}: WatchResources needs {}, so \
                 Corbel polls it with Inspect",
                watch.version,
                corbel_proto::HEALTH_VERSION
            );
            self.report.add(ROW, Outcome::Warn, why);
            return;
        }
        let mut why_not = Vec::new();
        for kind in &meta.resource_types {
            let Some(sample) = meta.check.resources.get(kind) else {
                continue;
            };
            let res = resource(
                "check-watch",
                kind,
                sample,
                &Uuid::new_v4().to_string(),
                watch.node,
            );
            (self.say)(&format!("watching a {kind}"));
            let outputs = match deploy(link, &res).await {
                Ok(outputs) => outputs,
                Err(e) => {
                    why_not.push(format!("{kind}: deploying the sample: {e}"));
                    continue;
                }
            };
            let kill = kill_for(meta.check.kill.get(kind), &outputs).await;
            if let Some(kill) = &kill {
                self.watch_sample(link, &res, &outputs, kill, watch.dir)
                    .await;
            } else {
                why_not.push(format!(
                    "{kind}: its outputs name no `pid` nor a container `id`, and there is no \
                     `check.kill.{kind}` command"
                ));
            }
            let _ = destroy(link, &res, &outputs).await;
            if kill.is_some() {
                return;
            }
        }
        if why_not.is_empty() {
            why_not.push("no sample under `check.resources` to deploy".to_owned());
        }
        let why = format!(
            "DOWN not checked: nothing could be killed behind the provider's back ({}); add a \
             shell command under `check.kill.<type>` in corbel-provider.yaml",
            why_not.join("; ")
        );
        self.report.add(ROW, Outcome::Warn, why);
    }

    /// The watch opened on `res`: HEALTHY then `synced`; killed, DOWN.
    async fn watch_sample(
        &mut self,
        link: &Link,
        res: &proto::Resource,
        outputs: &serde_json::Value,
        kill: &Kill,
        dir: &Path,
    ) {
        let deadline = self.options.settings.call_timeout;
        let request = proto::WatchResourcesRequest {
            resources: vec![res.clone()],
        };
        let mut stream = match link.watch_resources(request).await {
            Ok(stream) => stream,
            Err(e) => {
                self.report.add(FIRST, Outcome::Fail, e.to_string());
                return;
            }
        };
        let first = first_report(&mut stream, &res.resource_id, deadline).await;
        if !self.report.result(FIRST, first) {
            return;
        }
        (self.say)(&format!("killing the sample: {}", kill.describe()));
        if let Err(e) = run_kill(kill, res, outputs, dir, deadline).await {
            let why = format!("{}: {e}", kill.describe());
            self.report.add(KILLED, Outcome::Fail, why);
            return;
        }
        match until_down(&mut stream, &res.resource_id, deadline).await {
            Ok(down) if down.reason.trim().is_empty() => self.report.add(
                KILLED,
                Outcome::Warn,
                "DOWN without a reason: say why in words (e.g. \"exited with status 137 (SIGKILL)\")",
            ),
            Ok(down) => {
                let code = down
                    .exit_code
                    .map(|c| format!(", exit_code {c}"))
                    .unwrap_or_default();
                let said = format!("after {}: DOWN \"{}\"{code}", kill.describe(), down.reason);
                self.report.add(KILLED, Outcome::Pass, said);
            }
            Err(e) => self.report.add(KILLED, Outcome::Fail, e),
        }
    }
}

/// The next status within what is left of `deadline`; `None` at the end.
async fn next(
    stream: &mut tonic::Streaming<proto::ResourceStatus>,
    until: Instant,
    waiting_for: &str,
) -> Result<Option<proto::ResourceStatus>, String> {
    match tokio::time::timeout_at(until, stream.message()).await {
        Ok(Ok(status)) => Ok(status),
        Ok(Err(status)) => Err(format!(
            "the stream failed waiting for {waiting_for}: {} {}",
            status.code(),
            status.message()
        )),
        Err(_) => Err(format!("no {waiting_for} within the call deadline")),
    }
}

/// The first report: the sample HEALTHY, then `synced`.
async fn first_report(
    stream: &mut tonic::Streaming<proto::ResourceStatus>,
    id: &str,
    deadline: Duration,
) -> Result<String, String> {
    let until = Instant::now() + deadline;
    let mut ours = None;
    loop {
        let Some(status) = next(stream, until, "`synced`").await? else {
            return Err("the stream ended before `synced`".to_owned());
        };
        if status.synced {
            break;
        }
        if status.resource_id == id {
            ours = Some(status);
        }
    }
    let Some(ours) = ours else {
        return Err(
            "no status of the deployed sample before `synced`: the first report has one for \
             each resource of the request"
                .to_owned(),
        );
    };
    match ours.health() {
        Health::Healthy => Ok("the sample HEALTHY, then synced".to_owned()),
        other => Err(format!(
            "the sample just deployed is {} ({:?}), not HEALTHY",
            other.as_str_name(),
            ours.reason
        )),
    }
}

/// The sample's status once it is DOWN.
async fn until_down(
    stream: &mut tonic::Streaming<proto::ResourceStatus>,
    id: &str,
    deadline: Duration,
) -> Result<proto::ResourceStatus, String> {
    let until = Instant::now() + deadline;
    loop {
        let Some(status) = next(stream, until, "DOWN after the kill").await? else {
            return Err("the stream ended before the sample was DOWN".to_owned());
        };
        if status.resource_id == id && status.health() == Health::Down {
            return Ok(status);
        }
    }
}

/// How this sample can be killed, if at all.
async fn kill_for(command: Option<&String>, outputs: &serde_json::Value) -> Option<Kill> {
    if let Some(command) = command {
        return Some(Kill::Command(command.clone()));
    }
    if let Some(pid) = outputs["pid"].as_i64().and_then(|p| i32::try_from(p).ok())
        && pid > 1
    {
        return Some(Kill::Pid(pid));
    }
    let id = outputs["id"].as_str()?;
    let client = docker().await?;
    let inspected =
        tokio::time::timeout(Duration::from_secs(10), client.inspect_container(id, None)).await;
    matches!(inspected, Ok(Ok(_))).then(|| Kill::Container(id.to_owned()))
}

/// The local engine (bollard's defaults: `DOCKER_HOST` or the socket), its
/// API version agreed; `None` when there is none.
async fn docker() -> Option<bollard::Docker> {
    let client = bollard::Docker::connect_with_defaults().ok()?;
    let agreed = tokio::time::timeout(Duration::from_secs(10), client.negotiate_version()).await;
    agreed.ok()?.ok()
}

async fn run_kill(
    kill: &Kill,
    res: &proto::Resource,
    outputs: &serde_json::Value,
    dir: &Path,
    deadline: Duration,
) -> Result<(), String> {
    match kill {
        Kill::Pid(pid) => {
            use nix::sys::signal::{Signal, kill};
            kill(nix::unistd::Pid::from_raw(*pid), Signal::SIGKILL).map_err(|e| e.to_string())
        }
        Kill::Container(id) => {
            let client = docker()
                .await
                .ok_or("the Docker engine cannot be reached")?;
            let options = bollard::query_parameters::KillContainerOptions {
                signal: "KILL".to_owned(),
            };
            match tokio::time::timeout(deadline, client.kill_container(id, Some(options))).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("the engine did not answer in time".to_owned()),
            }
        }
        Kill::Command(command) => run_command(command, res, outputs, dir, deadline).await,
    }
}

/// `check.kill`'s command, under the deadline; its output when it fails.
async fn run_command(
    command: &str,
    res: &proto::Resource,
    outputs: &serde_json::Value,
    dir: &Path,
    deadline: Duration,
) -> Result<(), String> {
    let mut run = tokio::process::Command::new("sh");
    run.arg("-c")
        .arg(command)
        .current_dir(dir)
        .envs(output_env(res, outputs))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = match tokio::time::timeout(deadline, run.output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(format!("cannot run sh: {e}")),
        Err(_) => return Err("it did not end within the call deadline".to_owned()),
    };
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr);
    let said = crate::text::bounded(said.trim().to_owned(), 500, "…");
    Err(format!("it failed ({}): {said}", out.status))
}

/// A kill command's environment: `CORBEL_RESOURCE_ID`, `CORBEL_OUTPUTS`
/// (the outputs as JSON) and `CORBEL_OUTPUT_<KEY>` for each top-level output
/// that is a string, number or boolean (the key upper-cased, any character
/// but a letter or digit made `_`: `path` → `CORBEL_OUTPUT_PATH`).
fn output_env(res: &proto::Resource, outputs: &serde_json::Value) -> Vec<(String, String)> {
    let mut env = vec![
        ("CORBEL_RESOURCE_ID".to_owned(), res.resource_id.clone()),
        ("CORBEL_OUTPUTS".to_owned(), outputs.to_string()),
    ];
    for (key, value) in outputs.as_object().into_iter().flatten() {
        let value = match value {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            _ => continue,
        };
        let name: String = key
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect();
        env.push((format!("CORBEL_OUTPUT_{name}"), value));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_reach_a_kill_command_as_variables() {
        let res = proto::Resource {
            resource_id: "r1".to_owned(),
            ..Default::default()
        };
        let outputs = serde_json::json!({"path": "/tmp/x", "pid": 42, "ok": true, "list": [1], "my-key": "v"});
        let env = output_env(&res, &outputs);
        for (name, value) in [
            ("CORBEL_RESOURCE_ID", "r1"),
            ("CORBEL_OUTPUT_PATH", "/tmp/x"),
            ("CORBEL_OUTPUT_PID", "42"),
            ("CORBEL_OUTPUT_OK", "true"),
            ("CORBEL_OUTPUT_MY_KEY", "v"),
        ] {
            assert!(
                env.iter().any(|(n, v)| n == name && v == value),
                "{name}={value} in {env:?}"
            );
        }
        assert!(!env.iter().any(|(n, _)| n == "CORBEL_OUTPUT_LIST"));
        let whole = env.iter().find(|(n, _)| n == "CORBEL_OUTPUTS").unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&whole.1).unwrap(),
            outputs
        );
    }
}
