//! The in-memory slots: what Corbel knows about each provider while it runs —
//! its live status, its link, its supervisor's mailbox and its log ring — and
//! `Slots`, the map of them, through which every status change passes (memory,
//! bus, row). The row in the database trails this; `catalog` overlays it on
//! the row.
//!
//! Never starts, stops or calls a provider, and never decides anything: the
//! supervisor and the registry change the slots, the others read them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::binding::Binding;
use super::link::Link;
use super::logs::{LogLine, LogRing, LogSink, LogStream};
use super::{Provider, ProviderEvent, ProviderStatus, rows};
use crate::events::Bus;
use crate::store::Db;

/// What a supervisor can be told.
pub(super) enum Command {
    /// Stop the provider and end; the sender hears when it is done.
    Unload(oneshot::Sender<()>),
}

/// A registered provider's link.
pub(super) struct Connection {
    pub link: Link,
    pub session: String,
    pub features: Vec<String>,
    pub resource_types: Vec<String>,
    /// Stops this link's health monitor.
    pub monitor: CancellationToken,
}

#[derive(Default)]
struct SlotState {
    /// `None` until something happens to it in this process: the row knows.
    status: Option<(ProviderStatus, Option<String>)>,
    connection: Option<Connection>,
    /// The process Corbel started last: its token is accepted along with the
    /// stored one, once, and forgotten when that process stops.
    launch: Option<Launch>,
    supervisor: Option<mpsc::Sender<Command>>,
    last_seen: Option<DateTime<Utc>>,
    restarts: Option<i32>,
}

/// One launch of a provider by the supervisor.
struct Launch {
    token: String,
    /// How the registry recognises the launched process; `None` until the
    /// runtime has started it (a registration arriving sooner waits for it).
    binding: watch::Sender<Option<Option<Binding>>>,
    /// A registration with the token succeeded: it is spent.
    spent: bool,
}

/// What a launch says of a registration's token.
pub(super) enum LaunchToken {
    /// Not this launch's token (or no launch).
    Other,
    /// This launch's: the registration must come from the process the
    /// binding names (the receiver yields it once the runtime started it;
    /// `Some(None)`: the runtime cannot bind), and the token must be unspent.
    Launch {
        spent: bool,
        binding: watch::Receiver<Option<Option<Binding>>>,
    },
}

pub(super) struct Slot {
    pub id: Uuid,
    state: Mutex<SlotState>,
    /// Held by a registration from its token check to its end, so a token is
    /// spent before the next registration looks at it.
    registering: tokio::sync::Mutex<()>,
    ring: Arc<Mutex<LogRing>>,
    /// Bumped whenever the link is set or lost; supervisors wait on it.
    changed: watch::Sender<u64>,
    /// Loaded as a remote provider: it registers over TLS, and only so.
    remote: std::sync::atomic::AtomicBool,
}

impl Slot {
    fn new(id: Uuid, log_lines: usize) -> Self {
        Self {
            id,
            state: Mutex::default(),
            registering: tokio::sync::Mutex::new(()),
            ring: Arc::new(Mutex::new(LogRing::new(log_lines))),
            changed: watch::channel(0).0,
            remote: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether it is loaded as a remote provider.
    pub fn is_remote(&self) -> bool {
        self.remote.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Set by its supervisor while it waits for or follows a remote provider.
    pub fn set_remote(&self, remote: bool) {
        self.remote
            .store(remote, std::sync::atomic::Ordering::Release);
    }

    fn state(&self) -> MutexGuard<'_, SlotState> {
        self.state.lock().expect("a slot's state is never poisoned")
    }

    pub fn status(&self) -> ProviderStatus {
        self.state()
            .status
            .as_ref()
            .map_or(ProviderStatus::Unloaded, |(s, _)| *s)
    }

    /// A supervisor runs it, or it is registered (perhaps from outside).
    pub fn is_loaded(&self) -> bool {
        let state = self.state();
        state.supervisor.is_some() || state.connection.is_some()
    }

    pub fn link(&self) -> Option<Link> {
        self.state().connection.as_ref().map(|c| c.link.clone())
    }

    /// The link and its registration's session, read together.
    pub fn link_and_session(&self) -> Option<(Link, String)> {
        self.state()
            .connection
            .as_ref()
            .map(|c| (c.link.clone(), c.session.clone()))
    }

    pub fn session(&self) -> Option<String> {
        self.state().connection.as_ref().map(|c| c.session.clone())
    }

    pub fn logs(&self, n: usize) -> Vec<LogLine> {
        self.ring
            .lock()
            .expect("the log ring is never poisoned")
            .last(n)
    }

    pub fn watch(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// A new launch with this token; its binding follows ([`bind_launch`](Self::bind_launch)).
    pub fn begin_launch(&self, token: String) {
        self.state().launch = Some(Launch {
            token,
            binding: watch::channel(None).0,
            spent: false,
        });
    }

    /// The launched process is running: registrations with the launch's token
    /// must come from what `binding` names (`None`: the runtime cannot tell).
    pub fn bind_launch(&self, binding: Option<Binding>) {
        if let Some(launch) = &self.state().launch {
            launch.binding.send_replace(Some(binding));
        }
    }

    /// The launched process has stopped (or never started): its token is void.
    pub fn end_launch(&self) {
        self.state().launch = None;
    }

    /// What the current launch says of `token`, compared in constant time.
    pub fn launch_token(&self, token: &str) -> LaunchToken {
        let state = self.state();
        match &state.launch {
            Some(launch) if same_secret(&launch.token, token) => LaunchToken::Launch {
                spent: launch.spent,
                binding: launch.binding.subscribe(),
            },
            _ => LaunchToken::Other,
        }
    }

    /// A registration with `token` succeeded: a second one with it is refused.
    pub fn spend_launch(&self, token: &str) {
        if let Some(launch) = &mut self.state().launch
            && same_secret(&launch.token, token)
        {
            launch.spent = true;
        }
    }

    /// One registration at a time for this provider.
    pub async fn registration_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.registering.lock().await
    }

    pub fn supervisor(&self) -> Option<mpsc::Sender<Command>> {
        self.state().supervisor.clone()
    }

    /// Claims the slot for a new supervisor; `false` if one runs already.
    pub fn claim(&self, mailbox: mpsc::Sender<Command>) -> bool {
        let mut state = self.state();
        if state.supervisor.is_some() {
            return false;
        }
        state.supervisor = Some(mailbox);
        true
    }

    pub fn release(&self) {
        self.state().supervisor = None;
    }

    /// Installs a new link, handing back the one it replaces.
    pub fn connect(&self, connection: Connection) -> Option<Connection> {
        let old = {
            let mut state = self.state();
            state.last_seen = Some(Utc::now());
            state.connection.replace(connection)
        };
        self.changed.send_modify(|n| *n += 1);
        old
    }

    /// Drops the link if it is still `session`'s (any link when `None`).
    pub fn disconnect(&self, session: Option<&str>) -> Option<Connection> {
        let old = {
            let mut state = self.state();
            match (&state.connection, session) {
                (Some(c), Some(s)) if c.session != s => None,
                (None, _) => None,
                _ => state.connection.take(),
            }
        };
        if let Some(old) = &old {
            old.monitor.cancel();
            self.changed.send_modify(|n| *n += 1);
        }
        old
    }

    pub fn saw(&self, at: DateTime<Utc>) {
        self.state().last_seen = Some(at);
    }

    pub fn set_restarts(&self, restarts: i32) {
        self.state().restarts = Some(restarts);
    }

    fn set_status(&self, status: ProviderStatus, message: Option<String>) {
        self.state().status = Some((status, message));
    }

    /// Puts what is known in memory over what the row says.
    pub fn overlay(&self, provider: &mut Provider) {
        let state = self.state();
        if let Some((status, message)) = &state.status {
            provider.status = *status;
            provider.status_message = message.clone();
        }
        if let Some(at) = state.last_seen {
            provider.last_seen_at = Some(at);
        }
        if let Some(restarts) = state.restarts {
            provider.restarts = restarts;
        }
        if let Some(c) = &state.connection {
            provider.features = c.features.clone();
            provider.resource_types = c.resource_types.clone();
        }
    }
}

/// Equal in constant time (for equal lengths; lengths are not secret here).
pub(super) fn same_secret(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// Every provider's slot, made on first use; status changes go through here
/// so memory, the bus and the row agree.
pub(super) struct Slots {
    db: Db,
    bus: Bus<ProviderEvent>,
    log_lines: usize,
    map: Mutex<HashMap<Uuid, Arc<Slot>>>,
}

impl Slots {
    pub fn new(db: Db, bus: Bus<ProviderEvent>, log_lines: usize) -> Self {
        Self {
            db,
            bus,
            log_lines,
            map: Mutex::default(),
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<Uuid, Arc<Slot>>> {
        self.map.lock().expect("the slot map is never poisoned")
    }

    pub fn bus(&self) -> &Bus<ProviderEvent> {
        &self.bus
    }

    pub fn slot(&self, id: Uuid) -> Arc<Slot> {
        self.map()
            .entry(id)
            .or_insert_with(|| Arc::new(Slot::new(id, self.log_lines)))
            .clone()
    }

    pub fn existing(&self, id: Uuid) -> Option<Arc<Slot>> {
        self.map().get(&id).cloned()
    }

    /// Every slot touched since start.
    pub fn all(&self) -> Vec<Arc<Slot>> {
        self.map().values().cloned().collect()
    }

    /// Forgets a deleted provider.
    pub fn remove(&self, id: Uuid) {
        self.map().remove(&id);
    }

    pub fn sink(&self, slot: &Slot) -> LogSink {
        LogSink::new(slot.id, slot.ring.clone(), self.bus.clone())
    }

    /// Records a status: in memory, on the bus and in the row.
    pub async fn set_status(&self, slot: &Slot, status: ProviderStatus, message: Option<String>) {
        tracing::info!(
            provider.id = %slot.id,
            status = status.as_str(),
            message = message.as_deref().unwrap_or(""),
            "provider status"
        );
        slot.set_status(status, message.clone());
        self.bus.publish(ProviderEvent::Status {
            provider_id: slot.id,
            status,
            message: message.clone(),
        });
        if let Err(e) = rows::set_status(&self.db, slot.id, status, message.as_deref()).await {
            tracing::error!(provider.id = %slot.id, error = %e, "cannot store the provider's status");
        }
    }

    /// Drops `session`'s link as failed (unless another replaced it
    /// meanwhile): noted, and the provider `DISCONNECTED` saying why.
    pub async fn drop_failed_link(&self, slot: &Slot, session: &str, message: String) {
        if slot.disconnect(Some(session)).is_some() {
            self.note(slot, &message);
            if slot.status() != ProviderStatus::Unloading {
                self.set_status(slot, ProviderStatus::Disconnected, Some(message))
                    .await;
            }
        }
    }

    /// Updates the message alone (progress), in memory and on the bus.
    pub fn set_message(&self, slot: &Slot, message: String) {
        let status = slot.status();
        slot.set_status(status, Some(message.clone()));
        self.bus.publish(ProviderEvent::Status {
            provider_id: slot.id,
            status,
            message: Some(message),
        });
    }

    /// A note from Corbel in the provider's log.
    pub fn note(&self, slot: &Slot, text: &str) {
        self.sink(slot).line(LogStream::Corbel, text);
    }
}
