//! [`HealthBoard`]: what a provider knows of its resources' health, and the
//! `WatchResources` stream served from it (protocol version 3, the "watch"
//! feature).
//!
//! A provider sets a resource's health whenever it learns of a change (a
//! child's exit, an engine's event); the board keeps the latest of each and
//! hands every change to each open watch. `serve` is the whole stream: the
//! first report on the resources Corbel asked about, the `synced` mark, then
//! the changes.
//!
//! ```
//! use corbel_provider_sdk::{HealthBoard, proto::Health};
//!
//! let board = HealthBoard::new();
//! board.set("r1", Health::Healthy, "");
//! board.set("r1", Health::Down, "exited with status 1");
//! assert_eq!(board.get("r1").unwrap().health(), Health::Down);
//! ```

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast;
use tonic::Status;

use crate::proto::{self, Health, ResourceStatus};
use crate::provider::StatusSink;

/// Changes a slow watch may fall behind by before it is sent everything again.
const BACKLOG: usize = 4096;

/// The latest health of each resource a provider manages.
pub struct HealthBoard {
    statuses: Mutex<HashMap<String, ResourceStatus>>,
    changes: broadcast::Sender<ResourceStatus>,
}

impl Default for HealthBoard {
    fn default() -> Self {
        Self::new()
    }
}

impl HealthBoard {
    pub fn new() -> Self {
        HealthBoard {
            statuses: Mutex::new(HashMap::new()),
            changes: broadcast::channel(BACKLOG).0,
        }
    }

    /// Records `resource_id`'s health now; a change goes to every watch. The
    /// same health and reason again changes nothing.
    pub fn set(&self, resource_id: &str, health: Health, reason: impl Into<String>) {
        self.set_at(resource_id, health, reason, now_ms());
    }

    /// [`HealthBoard::set`], with when it changed (ms since the Unix epoch).
    pub fn set_at(
        &self,
        resource_id: &str,
        health: Health,
        reason: impl Into<String>,
        changed_at_unix_ms: i64,
    ) {
        let status = ResourceStatus {
            resource_id: resource_id.to_owned(),
            health: health as i32,
            reason: reason.into(),
            changed_at_unix_ms,
            observed_config_json: String::new(),
            synced: false,
            exit_code: None,
        };
        self.put(status);
    }

    /// The resource exited (DOWN): with its exit status when known (0 is a
    /// clean exit; a signal's death is 128 + the signal).
    pub fn exited(&self, resource_id: &str, exit_code: Option<i32>, reason: impl Into<String>) {
        self.put(ResourceStatus {
            resource_id: resource_id.to_owned(),
            health: Health::Down as i32,
            reason: reason.into(),
            changed_at_unix_ms: now_ms(),
            observed_config_json: String::new(),
            synced: false,
            exit_code,
        });
    }

    /// Records a status as given (with `observed_config_json`, say).
    pub fn put(&self, status: ResourceStatus) {
        let mut statuses = self.lock();
        let same = statuses.get(&status.resource_id).is_some_and(|old| {
            old.health == status.health
                && old.reason == status.reason
                && old.observed_config_json == status.observed_config_json
                && old.exit_code == status.exit_code
        });
        if same {
            return;
        }
        statuses.insert(status.resource_id.clone(), status.clone());
        // Sent under the lock, so every watch sees changes in the order kept.
        let _ = self.changes.send(status);
    }

    /// The resource is gone on purpose (destroyed): no more reports of it.
    pub fn forget(&self, resource_id: &str) {
        self.lock().remove(resource_id);
    }

    /// The latest status of `resource_id`, if the board has one.
    pub fn get(&self, resource_id: &str) -> Option<ResourceStatus> {
        self.lock().get(resource_id).cloned()
    }

    /// Every status on the board.
    pub fn all(&self) -> Vec<ResourceStatus> {
        self.lock().values().cloned().collect()
    }

    /// The whole `WatchResources` stream: a status for each resource of the
    /// request (DOWN for one the board does not hold), `synced`, then every
    /// change until Corbel hangs up.
    pub async fn serve(
        &self,
        request: proto::WatchResourcesRequest,
        sink: StatusSink,
    ) -> Result<(), Status> {
        let mut changes = self.changes.subscribe();
        let first: Vec<ResourceStatus> = {
            let statuses = self.lock();
            request
                .resources
                .iter()
                .map(|r| {
                    statuses
                        .get(&r.resource_id)
                        .cloned()
                        .unwrap_or_else(|| missing(&r.resource_id))
                })
                .collect()
        };
        for status in first {
            if !sink.send(status).await {
                return Ok(());
            }
        }
        let synced = ResourceStatus {
            synced: true,
            ..Default::default()
        };
        if !sink.send(synced).await {
            return Ok(());
        }
        loop {
            let change = tokio::select! {
                change = changes.recv() => change,
                () = sink.closed() => return Ok(()),
            };
            let batch = match change {
                Ok(status) => vec![status],
                // Fell behind: everything again, newest known.
                Err(broadcast::error::RecvError::Lagged(_)) => self.all(),
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            };
            for status in batch {
                if !sink.send(status).await {
                    return Ok(());
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, ResourceStatus>> {
        self.statuses
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn missing(resource_id: &str) -> ResourceStatus {
    ResourceStatus {
        resource_id: resource_id.to_owned(),
        health: Health::Down as i32,
        reason: "the provider holds no such resource".to_owned(),
        changed_at_unix_ms: now_ms(),
        observed_config_json: String::new(),
        synced: false,
        exit_code: None,
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
