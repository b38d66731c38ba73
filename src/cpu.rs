//! CPU-bound work on request input (parsing a blueprint or a manifest a
//! client sent): run on tokio's blocking pool, never on an async worker, at
//! most a few at once, and stopped when the caller stops waiting for it. A
//! leaf: it uses nothing else of the crate.
//!
//! The work is handed a stop flag. When the future [`run`] returns is
//! dropped (the request's deadline passed, the client went away), the flag
//! is set, and work that checks it as it goes (the YAML check, the blueprint
//! reader and checks, all linear in what they read) returns early instead of
//! running to the end on a thread nobody waits for. What cannot check it
//! (serde_yaml_ng building a tree) runs only on text whose size and shape
//! were bounded first, so it is short. A permit is held until the work has
//! returned, so stopped work still counts against the bound.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::Semaphore;

/// A stop flag that is never set, for callers with no deadline (stored
/// sources read back, tests).
pub static NEVER: AtomicBool = AtomicBool::new(false);

/// Whether `stop` has been set.
pub fn stopped(stop: &AtomicBool) -> bool {
    stop.load(Ordering::Relaxed)
}

/// Sets the flag when dropped: the caller of [`run`] stopped waiting.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// At most one piece of work per core but one, so the async workers keep a
/// core to answer on (`/healthz`, other requests); at least one.
fn gate() -> &'static Semaphore {
    static GATE: OnceLock<Semaphore> = OnceLock::new();
    GATE.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Semaphore::new(cores.saturating_sub(1).max(1))
    })
}

/// Runs `work` on the blocking pool, within the bound above, keeping the
/// caller's tracing span. Dropping the returned future sets the flag `work`
/// is given; a panic in `work` is resumed here.
pub async fn run<T, F>(work: F) -> T
where
    T: Send + 'static,
    F: FnOnce(&AtomicBool) -> T + Send + 'static,
{
    let flag = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(flag.clone());
    // The gate is never closed, so acquiring cannot fail.
    let permit = gate().acquire().await.ok();
    let span = tracing::Span::current();
    let task = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        span.in_scope(|| work(&flag))
    });
    match task.await {
        Ok(value) => value,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[tokio::test]
    async fn work_runs_and_answers() {
        assert_eq!(run(|stop| (stopped(stop), 40 + 2)).await, (false, 42));
    }

    #[tokio::test]
    async fn dropping_the_future_stops_the_work() {
        let (done, finished) = std::sync::mpsc::channel();
        let spinning = run(move |stop| {
            let started = Instant::now();
            while !stopped(stop) && started.elapsed() < Duration::from_secs(30) {
                std::hint::spin_loop();
            }
            done.send(started.elapsed()).unwrap();
        });
        // The caller gives up after 20 ms, as a request past its deadline does.
        let gave_up = tokio::time::timeout(Duration::from_millis(20), spinning).await;
        assert!(gave_up.is_err());
        let ran =
            tokio::task::spawn_blocking(move || finished.recv_timeout(Duration::from_secs(10)))
                .await
                .unwrap()
                .expect("the work noticed the flag and returned");
        assert!(ran < Duration::from_secs(10), "the work ran {ran:?}");
    }
}
