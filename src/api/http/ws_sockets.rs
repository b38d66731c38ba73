//! What one websocket may hold of the server: a place among the sockets its
//! client address has open ([`SocketCounts`], `ws_max_sockets_per_address`),
//! and a bounded queue of messages waiting to be sent ([`outbox`],
//! `ws_send_queue_bytes`, and over all sockets [`SendQueues`],
//! `ws_send_queue_total_bytes`), so a client that does not read is cut off
//! rather than letting answers pile up in memory.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ws::Message;
use tokio::sync::Notify;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio_util::sync::CancellationToken;

/// The websockets open from each client address.
#[derive(Debug, Default)]
pub struct SocketCounts {
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl SocketCounts {
    /// A place for one more socket from `address`, or `None` when it has
    /// `max` open already. The place is given back when the slot is dropped.
    pub(super) fn take(self: &Arc<Self>, address: IpAddr, max: usize) -> Option<SocketSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(address).or_default();
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(SocketSlot {
            counts: self.clone(),
            address,
        })
    }
}

/// One socket's place in [`SocketCounts`].
pub(super) struct SocketSlot {
    counts: Arc<SocketCounts>,
    address: IpAddr,
}

impl Drop for SocketSlot {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.address);
            }
        }
    }
}

/// The bytes waiting to be sent over every websocket of the server, against
/// `ws_send_queue_total_bytes`, and the sockets that share them.
///
/// Past the total, the socket that adds to its queue is cut off when it is
/// behind (something of its own waits) by at least its share of the total
/// (the total over the sockets open); a socket below its share is let
/// through, and a socket with nothing waiting, a client that reads, never is
/// cut. Each message costs two atomic additions, no lock: the socket holding
/// the most is not looked for, but whichever socket holds more than its share
/// is cut at its next message, and until then the others can each add no more
/// than their share (and a message). So the total stays near the budget, past
/// it by at most what sockets gathered while there were fewer of them, each
/// within `ws_send_queue_bytes`.
#[derive(Debug, Default)]
pub struct SendQueues {
    queued: AtomicUsize,
    sockets: AtomicUsize,
}

/// The sending half of a socket's queue: its producers (the protocol handler,
/// the reader answering a refused `subscribe`) push, the writer sends.
#[derive(Clone)]
pub(super) struct Outbox {
    messages: UnboundedSender<(Message, Charge)>,
    queued: Backlog,
    budget: usize,
    all: Arc<SendQueues>,
    total_budget: usize,
    /// Cancelled when a push found the queue full: the socket is cut off.
    pub(super) full: CancellationToken,
}

/// The writer's half of the queue. While it lives, the socket counts among
/// those sharing the total; dropped, what it still holds is given back.
pub(super) struct Queue {
    messages: UnboundedReceiver<(Message, Charge)>,
    all: Arc<SendQueues>,
}

/// The bytes one socket has pushed and not yet sent (the message being sent
/// included), and a wake-up for whoever waits for them to go down
/// ([`Backlog::room`]).
#[derive(Clone, Default)]
struct Backlog(Arc<BacklogCount>);

#[derive(Default)]
struct BacklogCount {
    bytes: AtomicUsize,
    sent: Notify,
}

impl Backlog {
    fn bytes(&self) -> usize {
        self.0.bytes.load(Ordering::Relaxed)
    }
}

/// What decides when a socket's next operation may start: its [`Backlog`],
/// and the cut-off for a client that does not read.
#[derive(Clone)]
pub(super) struct Pace {
    backlog: Backlog,
    stall: Duration,
    full: CancellationToken,
    /// The socket's operations read and not yet started.
    waiting: Arc<Waiting>,
}

/// How many of a socket's operations wait for their turn, and a wake-up
/// when one starts or ends.
#[derive(Default)]
struct Waiting {
    count: AtomicUsize,
    started: Notify,
}

/// One operation waiting for its turn, counted in [`Pace`] until dropped.
pub(super) struct InLine(Arc<Waiting>);

impl Drop for InLine {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::Relaxed);
        self.0.started.notify_waiters();
    }
}

/// The client's next message is read only while fewer of its operations
/// than this wait for their turn: a burst of a hundred `subscribe`s is read a
/// few at a time, as the socket's turns come, the rest left in the kernel's
/// buffers instead of held here (each waiting operation holds its request).
const WAITING_AT_MOST: usize = 2;

/// The client read nothing for `ws_send_stall_ms` while it had work waiting.
#[derive(Debug)]
pub(super) struct Stalled;

/// An operation starts, and the client's next message is read, only while
/// less than this waits to be sent on its socket: a client that does not
/// read what it asked for gets no more work done for it (and costs no CPU)
/// until it does. A reading client's queue stays far below it.
pub(super) const START_BELOW: usize = 16 * 1024;

impl Pace {
    /// Returns once fewer than [`START_BELOW`] bytes wait to be sent: at
    /// once for a client that reads. A client that lets `stall` pass without
    /// a message sent is not reading: its socket is cut off (as by a full
    /// queue).
    pub(super) async fn room(&self) -> Result<(), Stalled> {
        loop {
            // Created before the look: a message sent in between wakes it.
            let sent = self.backlog.0.sent.notified();
            if self.backlog.bytes() < START_BELOW {
                return Ok(());
            }
            if tokio::time::timeout(self.stall, sent).await.is_err() {
                self.full.cancel();
                return Err(Stalled);
            }
        }
    }

    /// Returns once fewer than [`START_BELOW`] bytes wait to be sent and
    /// fewer than [`WAITING_AT_MOST`] operations wait for their turn, however
    /// long that takes: what the client's next message waits for (a client
    /// only listening is not cut off for being slow; its queue's bounds see
    /// to that).
    pub(super) async fn read(&self) {
        loop {
            let sent = self.backlog.0.sent.notified();
            let started = self.waiting.started.notified();
            if self.backlog.bytes() >= START_BELOW {
                sent.await;
            } else if self.waiting.count.load(Ordering::Relaxed) >= WAITING_AT_MOST {
                started.await;
            } else {
                return;
            }
        }
    }

    /// Counts an operation as waiting for its turn until the guard is
    /// dropped (it started, or ended first).
    pub(super) fn in_line(&self) -> InLine {
        self.waiting.count.fetch_add(1, Ordering::Relaxed);
        InLine(self.waiting.clone())
    }
}

/// One queued message's bytes, counted against its socket's queue and the
/// total until dropped: once sent, or with the queue of a socket that ended.
pub(super) struct Charge {
    size: usize,
    queued: Backlog,
    all: Arc<SendQueues>,
}

impl Drop for Charge {
    fn drop(&mut self) {
        // Counters only: they order no other memory.
        self.queued.0.bytes.fetch_sub(self.size, Ordering::Relaxed);
        self.all.queued.fetch_sub(self.size, Ordering::Relaxed);
        if self.size > 0 {
            self.queued.0.sent.notify_waiters();
        }
    }
}

/// The queue was full: the client does not read what it is sent.
#[derive(Debug)]
pub(super) struct Full;

/// A queue holding at most `budget` bytes, or one message of any size, and
/// sharing `total_budget` with the other sockets' queues in `all`.
pub(super) fn outbox(budget: usize, total_budget: usize, all: &Arc<SendQueues>) -> (Outbox, Queue) {
    let (messages, receiver) = unbounded_channel();
    all.sockets.fetch_add(1, Ordering::Relaxed);
    let outbox = Outbox {
        messages,
        queued: Backlog::default(),
        budget,
        all: all.clone(),
        total_budget,
        full: CancellationToken::new(),
    };
    let queue = Queue {
        messages: receiver,
        all: all.clone(),
    };
    (outbox, queue)
}

impl Outbox {
    /// Queues `message`; `Full` (and the socket cut off) when it does not fit
    /// its socket's queue or, this socket behind by its share, the total.
    pub(super) fn push(&self, message: Message) -> Result<(), Full> {
        let size = size_of(&message);
        let before = self.queued.0.bytes.fetch_add(size, Ordering::Relaxed);
        let total_before = self.all.queued.fetch_add(size, Ordering::Relaxed);
        let charge = Charge {
            size,
            queued: self.queued.clone(),
            all: self.all.clone(),
        };
        let over_own = before + size > self.budget;
        let over_total = total_before + size > self.total_budget && before >= self.share();
        if before > 0 && (over_own || over_total) {
            drop(charge);
            self.full.cancel();
            return Err(Full);
        }
        // A writer gone has ended the connection: the message has no reader
        // (and its charge is dropped with it).
        let _ = self.messages.send((message, charge));
        Ok(())
    }

    /// When this socket's next operation may start, cut off after `stall`
    /// without a message sent.
    pub(super) fn pace(&self, stall: Duration) -> Pace {
        Pace {
            backlog: self.queued.clone(),
            stall,
            full: self.full.clone(),
            waiting: Arc::default(),
        }
    }

    /// This socket's share of the total: it over the sockets open.
    fn share(&self) -> usize {
        self.total_budget / self.all.sockets.load(Ordering::Relaxed).max(1)
    }
}

impl Queue {
    /// The next message to send and its charge, to drop once it is sent;
    /// `None` once every producer is gone.
    pub(super) async fn next(&mut self) -> Option<(Message, Charge)> {
        self.messages.recv().await
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.all.sockets.fetch_sub(1, Ordering::Relaxed);
    }
}

fn size_of(message: &Message) -> usize {
    match message {
        Message::Text(text) => text.len(),
        Message::Binary(bytes) => bytes.len(),
        Message::Ping(_) | Message::Pong(_) | Message::Close(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LARGE: usize = 1 << 30;

    fn text(bytes: usize) -> Message {
        Message::Text("x".repeat(bytes).into())
    }

    #[test]
    fn a_queue_takes_its_budget_or_one_message_and_no_more() {
        let all = Arc::default();
        let (outbox, mut queue) = outbox(10, LARGE, &all);
        outbox.push(text(40)).unwrap();
        assert!(outbox.push(text(1)).is_err());
        assert!(outbox.full.is_cancelled());
        let (_, charge) = futures_util::FutureExt::now_or_never(queue.next())
            .flatten()
            .unwrap();
        drop(charge);
        assert!(outbox.push(text(1)).is_ok());
        let (outbox, _queue) = super::outbox(10, LARGE, &all);
        for _ in 0..10 {
            outbox.push(text(1)).unwrap();
        }
        assert!(outbox.push(text(1)).is_err());
    }

    #[test]
    fn past_the_total_a_socket_behind_by_its_share_is_cut_never_one_that_reads() {
        let all = Arc::default();
        // Three sockets share 300 bytes: 100 each.
        let (hoarder, _hoarded) = outbox(LARGE, 300, &all);
        let (small, _small) = outbox(LARGE, 300, &all);
        let (reader, mut read) = outbox(LARGE, 300, &all);
        for _ in 0..3 {
            hoarder.push(text(100)).unwrap();
        }
        // Over the total: below its share, a socket is let through; with
        // nothing waiting, however large the message, too.
        small.push(text(50)).unwrap();
        small.push(text(40)).unwrap();
        reader.push(text(500)).unwrap();
        assert_eq!(all.queued.load(Ordering::Relaxed), 890);
        // Behind by its share, the next message cuts a socket off.
        assert!(hoarder.push(text(1)).is_err());
        assert!(hoarder.full.is_cancelled());
        small.push(text(20)).unwrap();
        assert!(small.push(text(1)).is_err());
        // The reader reads: what it had is given back, and it goes on.
        let (_, charge) = futures_util::FutureExt::now_or_never(read.next())
            .flatten()
            .unwrap();
        drop(charge);
        assert_eq!(all.queued.load(Ordering::Relaxed), 410);
        reader.push(text(500)).unwrap();
        assert!(!reader.full.is_cancelled());
        // A socket that ends gives back its place and what it held.
        drop((hoarder, _hoarded, small, _small));
        assert_eq!(all.queued.load(Ordering::Relaxed), 500);
        assert_eq!(all.sockets.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn an_address_holds_at_most_its_sockets_and_gets_them_back() {
        let counts = Arc::new(SocketCounts::default());
        let address: IpAddr = "192.0.2.1".parse().unwrap();
        let first = counts.take(address, 2).unwrap();
        let _second = counts.take(address, 2).unwrap();
        assert!(counts.take(address, 2).is_none());
        assert!(counts.take("192.0.2.2".parse().unwrap(), 2).is_some());
        drop(first);
        assert!(counts.take(address, 2).is_some());
    }
}
