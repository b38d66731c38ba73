//! A body from a source must keep a pace: at least `min_bytes_per_second`
//! over each window of `stall_timeout` (`[repository]`), apart from the idle
//! deadline (which a byte every few seconds never trips) and the total one
//! (30 minutes). So a source that trickles ends its sync within about one
//! window, with that reason.
//!
//! Windows follow one another from the first read: each that ends is judged
//! on what it brought, at its end, whether a chunk arrived then or not.

use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::time::Instant;

/// The pace a body keeps; see the module docs.
pub(super) struct Pace {
    min_per_second: u64,
    window: Duration,
    started: Instant,
    bytes: u64,
}

impl Pace {
    pub(super) fn new(min_per_second: u64, window: Duration) -> Self {
        Self {
            min_per_second,
            window,
            started: Instant::now(),
            bytes: 0,
        }
    }

    /// Counts `n` bytes received now; why the source is too slow when the
    /// window that ended fell short.
    fn received(&mut self, n: usize) -> Result<(), String> {
        self.bytes += n as u64;
        let elapsed = self.started.elapsed();
        if elapsed < self.window {
            return Ok(());
        }
        let needed = self.min_per_second as f64 * elapsed.as_secs_f64();
        if (self.bytes as f64) < needed {
            return Err(format!(
                "the source sent {} bytes in {:.1}s, under the {} bytes a second it must keep \
                 (min_bytes_per_second, over stall_timeout_seconds = {}s)",
                self.bytes,
                elapsed.as_secs_f64(),
                self.min_per_second,
                self.window.as_secs_f32()
            ));
        }
        self.started = Instant::now();
        self.bytes = 0;
        Ok(())
    }

    /// The next item of `stream`, judging each window as it ends (also
    /// when no chunk comes); `Err` with the reason when one falls short.
    pub(super) async fn next<S, T, E>(
        &mut self,
        stream: &mut S,
    ) -> Result<Option<Result<T, E>>, String>
    where
        S: Stream<Item = Result<T, E>> + Unpin,
        T: AsRef<[u8]>,
    {
        loop {
            let left = self.window.saturating_sub(self.started.elapsed());
            match tokio::time::timeout(left.max(Duration::from_millis(1)), stream.next()).await {
                Ok(item) => {
                    if let Some(Ok(chunk)) = &item {
                        self.received(chunk.as_ref().len())?;
                    }
                    return Ok(item);
                }
                Err(_) => self.received(0)?,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_trickle_fails_at_the_end_of_its_window_and_a_steady_body_never() {
        // A byte every 50 ms: the first window (300 ms) judges it, without
        // waiting for a late chunk.
        let trickle = futures_util::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Some((Ok::<_, ()>(b"x".to_vec()), ()))
        });
        let mut trickle = Box::pin(trickle);
        let mut pace = Pace::new(1024, Duration::from_millis(300));
        let started = Instant::now();
        let reason = loop {
            if let Err(reason) = pace.next(&mut trickle).await {
                break reason;
            }
        };
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(reason.contains("under the 1024 bytes a second"), "{reason}");

        // Silence is judged at the window's end too.
        let mut silent = Box::pin(futures_util::stream::pending::<Result<Vec<u8>, ()>>());
        let mut pace = Pace::new(1, Duration::from_millis(100));
        let reason = pace.next(&mut silent).await.unwrap_err();
        assert!(reason.contains("the source sent 0 bytes"), "{reason}");

        // 2 KiB every 10 ms, over several windows: never too slow.
        let steady = futures_util::stream::iter(0..100).then(|_| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok::<_, ()>(vec![0u8; 2048])
        });
        let mut steady = Box::pin(steady);
        let mut pace = Pace::new(1024, Duration::from_millis(200));
        let mut chunks = 0;
        while let Some(item) = pace.next(&mut steady).await.expect("fast enough") {
            item.unwrap();
            chunks += 1;
        }
        assert_eq!(chunks, 100);
    }
}
