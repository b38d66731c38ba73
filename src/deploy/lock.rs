//! The per-deployment run lock: one thing at a time works on a deployment
//! (a run, a plan's apply, settling its journal). Held in this process only:
//! with replicas only the leader runs deployments. Taking it is
//! `Runs::lock` (refuses when busy) or `Runs::lock_for_request` (waits a
//! moment for a run that is settling).

use std::sync::Arc;

use uuid::Uuid;

use super::{DeployError, Inner};

/// Holds a deployment's lock; dropping it releases the lock.
pub(super) struct Lock {
    inner: Arc<Inner>,
    pub(super) id: Uuid,
}

impl Lock {
    /// Takes the deployment's lock, or refuses: something is working on it.
    pub(super) fn take(inner: &Arc<Inner>, id: Uuid, doing: &str) -> Result<Lock, DeployError> {
        let mut busy = inner.busy.lock().expect("the lock set is never poisoned");
        if !busy.insert(id) {
            return Err(DeployError::Conflict(format!(
                "deployment {id} is busy; it cannot start to {doing} now"
            )));
        }
        Ok(Lock {
            inner: inner.clone(),
            id,
        })
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        self.inner
            .busy
            .lock()
            .expect("the lock set is never poisoned")
            .remove(&self.id);
        self.inner.released.notify_waiters();
    }
}
