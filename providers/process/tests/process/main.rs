//! The process provider through the SDK's test host: real processes, real
//! sockets, a real state directory. One test binary (`process`); this file
//! holds what its tests share: a host on a state directory, resources with
//! ids of their own, and a guard that kills what a failing test started.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use corbel_provider_process::ProcessProvider;
use corbel_provider_process::lifecycle::TAG;
use corbel_provider_process::procfs;
use corbel_provider_sdk::Status;
use corbel_provider_sdk::proto;
use corbel_provider_sdk::serde_json::Value;
use corbel_provider_sdk::testing::{DEADLINE, TestHost};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The next status of a watch (`TestHost::watch`'s stream), within a
/// deadline. A macro (defined before the modules that use it): the SDK does
/// not name the stream's type.
macro_rules! next_status {
    ($stream:expr) => {
        tokio::time::timeout(std::time::Duration::from_secs(10), $stream.message())
            .await
            .expect("a status within 10 s")
            .expect("the watch stream does not fail")
            .expect("the watch stream does not end")
    };
}

mod binary;
mod configuration;
mod jobs;
mod killed_mid_start;
mod output;
mod services;
mod watch;

async fn host_in(state: &Path) -> TestHost {
    TestHost::start(ProcessProvider::new(Some(state.to_path_buf()))).await
}

/// A resource whose id no other test (or test run) uses: services are found
/// machine-wide by the id in their tag.
fn resource(kind: &str, key: &str, config: Value) -> proto::Resource {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    proto::Resource {
        resource_id: format!("{key}-{}-{nanos}", std::process::id()),
        ..corbel_provider_sdk::testing::resource(kind, key, config)
    }
}

/// Kills whatever carries the tag of `resource_id` when dropped, so a failing
/// test leaves no process behind.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for found in procfs::tagged(TAG, &self.0) {
            let _ = kill(Pid::from_raw(found.pid), Signal::SIGKILL);
        }
    }
}

fn cleanup(resource: &proto::Resource) -> Cleanup {
    Cleanup(resource.resource_id.clone())
}

/// The live processes tagged with `resource`'s id.
fn tagged(resource: &proto::Resource) -> Vec<i32> {
    procfs::tagged(TAG, &resource.resource_id)
        .iter()
        .map(|t| t.pid)
        .collect()
}

fn pid_of(outputs: &Value) -> i32 {
    outputs["pid"].as_i64().expect("a pid output") as i32
}

fn running(pid: i32) -> bool {
    procfs::stat(pid).is_some_and(|s| s.state != 'Z')
}

/// `RetrieveData` of `kind` on `resource`, its answer parsed.
async fn data(
    host: &TestHost,
    resource: &proto::Resource,
    kind: &str,
    config: Value,
) -> Result<Value, Status> {
    let request = proto::RetrieveDataRequest {
        r#type: kind.to_string(),
        config_json: config.to_string(),
        resource: Some(resource.clone()),
    };
    let answer = tokio::time::timeout(DEADLINE, host.client().retrieve_data(request))
        .await
        .expect("RetrieveData answers within the deadline")?;
    Ok(serde_json::from_str(&answer.into_inner().data_json).expect("data is JSON"))
}

/// Waits, with a deadline, for `check` to hold.
async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
