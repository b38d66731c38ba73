//! A provider's captured output: build and run lines, kept in a bounded ring in
//! memory, mirrored to tracing (with `provider.id`) and to the event bus.
//! Lines are never stored in the database.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::ProviderEvent;
use crate::events::Bus;
use crate::text::text_enum;

/// Longest line kept; a provider printing megabytes on one line is cut, not
/// buffered whole.
const MAX_LINE_BYTES: usize = 4096;

text_enum! {
    /// Where a line came from.
    pub enum LogStream {
        /// Output of the build command.
        Build = "build",
        /// The running provider's stdout.
        Stdout = "stdout",
        /// The running provider's stderr.
        Stderr = "stderr",
        /// Corbel's own notes about the provider (refusals, restarts).
        Corbel = "corbel",
    }
}

crate::text::text_serde!(LogStream);

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogLine {
    pub at: DateTime<Utc>,
    pub stream: LogStream,
    pub line: String,
}

/// The last lines of one provider.
pub struct LogRing {
    lines: VecDeque<LogLine>,
    capacity: usize,
}

impl LogRing {
    pub fn new(capacity: usize) -> Self {
        Self {
            lines: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    fn push(&mut self, line: LogLine) {
        if self.lines.len() == self.capacity {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }

    /// The last `n` lines, oldest first.
    pub fn last(&self, n: usize) -> Vec<LogLine> {
        let skip = self.lines.len().saturating_sub(n);
        self.lines.iter().skip(skip).cloned().collect()
    }
}

/// Writes lines for one provider: the ring, tracing and the bus.
#[derive(Clone)]
pub struct LogSink {
    provider_id: Uuid,
    ring: Arc<Mutex<LogRing>>,
    bus: Bus<ProviderEvent>,
}

impl LogSink {
    pub fn new(provider_id: Uuid, ring: Arc<Mutex<LogRing>>, bus: Bus<ProviderEvent>) -> Self {
        Self {
            provider_id,
            ring,
            bus,
        }
    }

    pub fn line(&self, stream: LogStream, text: &str) {
        let text = crate::text::bounded(
            text.trim_end_matches(['\r', '\n']).to_owned(),
            MAX_LINE_BYTES,
            " …",
        );
        tracing::info!(
            provider.id = %self.provider_id,
            stream = stream.as_str(),
            "{text}"
        );
        let line = LogLine {
            at: Utc::now(),
            stream,
            line: text,
        };
        self.ring
            .lock()
            .expect("the log ring is never poisoned")
            .push(line.clone());
        self.bus.publish(ProviderEvent::Log {
            provider_id: self.provider_id,
            line,
        });
    }

    /// The last `n` lines as one text block, for a failure message.
    pub fn tail(&self, n: usize) -> String {
        let lines = self
            .ring
            .lock()
            .expect("the log ring is never poisoned")
            .last(n);
        if lines.is_empty() {
            return "(no output)".to_owned();
        }
        lines
            .iter()
            .map(|l| l.line.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_lines() {
        let mut ring = LogRing::new(3);
        for i in 0..5 {
            ring.push(LogLine {
                at: Utc::now(),
                stream: LogStream::Stdout,
                line: i.to_string(),
            });
        }
        let got: Vec<String> = ring.last(10).into_iter().map(|l| l.line).collect();
        assert_eq!(got, ["2", "3", "4"]);
        let got: Vec<String> = ring.last(2).into_iter().map(|l| l.line).collect();
        assert_eq!(got, ["3", "4"]);
    }

    #[test]
    fn long_lines_are_cut_on_a_char_boundary() {
        let bus = Bus::new(4, tokio_util::sync::CancellationToken::new());
        let sink = LogSink::new(Uuid::nil(), Arc::new(Mutex::new(LogRing::new(4))), bus);
        sink.line(LogStream::Stdout, &"é".repeat(MAX_LINE_BYTES));
        let tail = sink.tail(1);
        assert!(tail.len() <= MAX_LINE_BYTES + 4, "{}", tail.len());
        assert!(tail.ends_with(" …"));
    }
}
