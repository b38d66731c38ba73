//! Replicas of one server on one database (issue 18, first part): membership
//! and leadership, both leases in the database (`store::cluster`).
//!
//! - **Membership.** A server joins as a replica with an id and the URL it
//!   advertises, and renews its lease every `heartbeat`; `replicas` lists who
//!   joined, each `ALIVE` (lease running), `LOST` (lease ran out without a
//!   goodbye: killed, paused or cut off) or `STOPPED` (left at shutdown).
//! - **Leadership.** One replica at a time holds the `leader` lease, with a
//!   fencing epoch that grows with every new holder. Singletons (the lease
//!   reaper, background repository refresh) run only on the leader, and stop
//!   when it steps down. A leader steps down on its own once its lease could
//!   have run out by its own clock, measured from before the renewal it last
//!   saw succeed, so a replica cut off from the database stops acting before
//!   the database would let another take over. Writes made as the leader go
//!   through [`Cluster::fenced`], which the database refuses once the epoch
//!   is not the holder's any more.
//!
//! Without `--cluster`, the server lock (`store::lock`) keeps one server per
//! database, so the one replica alive is the leader from its start: it takes
//! the lease over from whoever held it (dead, or the lock would not be held)
//! and marks the replicas it finds alive as lost. With `--cluster`
//! (`standby`), replicas wait as standbys, and the one that claims the lease
//! takes the server lock over and runs the whole server.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone as _, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::settings::{at_least, millis};
use crate::store::cluster::{self as rows, FencedError, FencedWrite, ReplicaRow};
use crate::store::{Db, DbErr, Transaction};

pub use crate::store::cluster::FencedError as Fenced;

/// The lease singletons run under.
pub const LEADER: &str = "leader";

/// Replicas whose lease ran out longer ago than this are forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);

/// The `[cluster]` section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSettings {
    /// Run as one of several replicas on one PostgreSQL database: a server
    /// that does not lead waits as a standby, forwarding requests to the
    /// leader, and takes over when the leader's lease runs out.
    pub enabled: bool,
    /// The URL other replicas and clients reach this one at; `None` is
    /// `http://<listen address>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise_url: Option<String>,
    /// How often a replica renews its leases.
    #[serde(rename = "heartbeat_ms", with = "millis")]
    pub heartbeat: Duration,
    /// How long a lease lasts without renewal: a replica silent this long is
    /// lost, and its leadership another's.
    #[serde(rename = "lease_ms", with = "millis")]
    pub lease: Duration,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            advertise_url: None,
            // A failover in under 5 s (kill -> a new leader serving: the
            // lease's rest, a heartbeat, the start), while a leader rides out
            // 3.5 s of a database that does not answer before it steps down.
            heartbeat: Duration::from_millis(500),
            lease: Duration::from_secs(4),
        }
    }
}

impl ClusterSettings {
    /// Refuses an advertised URL that is not `http(s)://host[:port][/path]`.
    pub fn check(&self) -> Result<(), String> {
        let Some(raw) = &self.advertise_url else {
            return Ok(());
        };
        let url = url::Url::parse(raw)
            .map_err(|e| format!("advertise_url: `{raw}` is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(format!(
                "advertise_url: `{raw}` must be an http:// or https:// URL with a host"
            ));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("advertise_url: must not hold a user name or password".to_owned());
        }
        Ok(())
    }

    /// A lease of at least three heartbeats, so one late renewal loses nothing.
    pub fn bounded(self) -> Self {
        let heartbeat = at_least(self.heartbeat, Duration::from_millis(50));
        Self {
            heartbeat,
            lease: at_least(self.lease, heartbeat * 3),
            ..self
        }
    }
}

/// The `--advertise-url` and `--cluster-*` flags, over `[cluster]`.
#[derive(Clone, Debug, Default, Serialize, clap::Args)]
pub struct ClusterFlags {
    /// Run as one of several replicas on one PostgreSQL database.
    #[arg(
        long = "cluster",
        env = "CORBEL_CLUSTER",
        global = true,
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    #[serde(rename = "enabled", skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// The URL this server is reached at by other replicas and clients, as
    /// `http(s)://host[:port]`.
    #[arg(long = "advertise-url", env = "CORBEL_ADVERTISE_URL", global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise_url: Option<String>,
    /// How often leases are renewed, in milliseconds.
    #[arg(
        long = "cluster-heartbeat-ms",
        env = "CORBEL_CLUSTER_HEARTBEAT_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heartbeat_ms: Option<u64>,
    /// How long a lease lasts unrenewed, in milliseconds.
    #[arg(
        long = "cluster-lease-ms",
        env = "CORBEL_CLUSTER_LEASE_MS",
        global = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
}

/// How a replica stands, as the database's clock sees its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaState {
    Alive,
    Lost,
    Stopped,
}

impl ReplicaState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaState::Alive => "ALIVE",
            ReplicaState::Lost => "LOST",
            ReplicaState::Stopped => "STOPPED",
        }
    }
}

/// A replica, for the API.
#[derive(Clone, Debug)]
pub struct Replica {
    pub id: Uuid,
    pub advertise_url: String,
    pub host: String,
    pub pid: i32,
    pub version: String,
    /// The id of the secret key it runs with.
    pub key_id: Option<String>,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    pub lease_until: DateTime<Utc>,
    pub stopped_at: Option<DateTime<Utc>>,
    pub state: ReplicaState,
    /// Holds the leader lease now.
    pub leader: bool,
}

fn at(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("database error: {0}")]
    Db(#[from] DbErr),
    /// This replica does not share what it must with one alive.
    #[error("{0}")]
    Unshared(String),
}

/// Refuses to migrate the database's schema under replicas that are alive:
/// they run the schema they started with, and a migration made under them
/// breaks them. A replica of a newer Corbel starts once the others are
/// stopped (the first to start migrates); this names both versions.
pub async fn check_migration(db: &Db) -> Result<(), ClusterError> {
    let pending = crate::store::pending_migrations(db)
        .await
        .map_err(|e| ClusterError::Unshared(e.to_string()))?;
    if pending.is_empty() {
        return Ok(());
    }
    // A schema from before replicas recorded what they run: nothing to check.
    let Ok((found, now)) = rows::replicas(db).await else {
        return Ok(());
    };
    let alive = found
        .iter()
        .find(|r| r.stopped_ms.is_none() && r.lease_until_ms > now);
    let Some(r) = alive else {
        return Ok(());
    };
    let from = crate::store::database_schema(db).await;
    Err(ClusterError::Unshared(format!(
        "this replica (Corbel {ours}) would migrate the database's schema from {from} to {to}, \
         but replica {id} at {url} (alive) runs Corbel {theirs} on {from}: stop every replica, \
         then start them all with this version (the first one migrates)",
        ours = crate::VERSION,
        to = crate::store::schema_version(),
        id = r.id,
        url = r.advertise_url,
        theirs = r.version,
    )))
}

/// What every replica of one database must share, checked as one joins:
/// one that runs with another secret key cannot read what the others
/// sealed, and one with another provider state directory loses what the
/// providers recorded when it takes over.
#[derive(Clone, Debug, Default)]
pub struct Shared {
    /// The id of the secret key it runs with.
    pub key_id: String,
    /// The root of the providers' state directories (absolute).
    pub state_dir: String,
}

impl Shared {
    /// Refuses `shared` when an alive replica (not `me`) records another
    /// key or state directory, naming both.
    async fn check(&self, db: &Db) -> Result<(), ClusterError> {
        let (found, now) = rows::replicas(db).await?;
        let alive = found
            .iter()
            .filter(|r| r.stopped_ms.is_none() && r.lease_until_ms > now);
        for r in alive {
            let facts = [
                (
                    "secret key",
                    r.key_id.as_deref(),
                    &self.key_id,
                    "start it with the cluster's key file (--secret-key-file)",
                ),
                (
                    "provider state directory",
                    r.state_dir.as_deref(),
                    &self.state_dir,
                    "give every replica the same --provider-state-dir, a directory they share",
                ),
            ];
            for (what, theirs, ours, fix) in facts {
                if let Some(theirs) = theirs
                    && theirs != ours
                {
                    return Err(ClusterError::Unshared(format!(
                        "this replica's {what} is {ours}, but replica {} at {} (alive) runs with {theirs}: {fix}",
                        r.id, r.advertise_url
                    )));
                }
            }
        }
        Ok(())
    }
}

/// This replica's membership and leadership.
#[derive(Clone)]
pub struct Cluster(Arc<Inner>);

struct Inner {
    db: Db,
    me: Uuid,
    advertise_url: String,
    settings: ClusterSettings,
    /// The leader lease's epoch while this replica holds it.
    leading: watch::Sender<Option<i64>>,
    /// Until when, by this replica's clock, its leadership holds: a lease
    /// from the last renewal seen to succeed, less a heartbeat.
    valid_until: std::sync::Mutex<Instant>,
    stopping: CancellationToken,
    /// A lone server (it holds the server lock): its joining and leading
    /// are no news to its operator, and logged at debug.
    alone: bool,
}

impl Cluster {
    /// Joins as a new replica advertising `advertise_url`, sharing `shared`
    /// with the replicas alive (refused otherwise). `alone`: this server
    /// holds the database's server lock, so no other replica is alive
    /// whatever the leases say; it takes the leader lease over at once.
    pub async fn join(
        db: Db,
        settings: ClusterSettings,
        advertise_url: String,
        shared: Shared,
        alone: bool,
        stopping: CancellationToken,
    ) -> Result<Cluster, ClusterError> {
        let settings = settings.bounded();
        let me = Uuid::new_v4();
        let lease_ms = millis_of(settings.lease);
        let row = ReplicaRow {
            id: me,
            advertise_url: advertise_url.clone(),
            host: nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_default(),
            pid: std::process::id() as i32,
            version: crate::VERSION.to_owned(),
            started_ms: 0,
            heartbeat_ms: 0,
            lease_until_ms: 0,
            stopped_ms: None,
            key_id: Some(shared.key_id.clone()),
            state_dir: Some(shared.state_dir.clone()),
        };
        if !alone {
            shared.check(&db).await?;
        }
        if alone {
            let lost = rows::end_leases(&db).await?;
            if lost > 0 {
                tracing::info!(replicas = lost, "replicas that never left are lost");
            }
        }
        rows::join(&db, &row, lease_ms).await?;
        let (leading, _) = watch::channel(None);
        // Measured before the claim below, as a renewal is.
        let valid_until = Instant::now() + settings.lease.saturating_sub(settings.heartbeat);
        let cluster = Cluster(Arc::new(Inner {
            db,
            me,
            advertise_url,
            settings,
            leading,
            valid_until: std::sync::Mutex::new(valid_until),
            stopping,
            alone,
        }));
        let epoch = rows::claim(&cluster.0.db, LEADER, me, lease_ms, alone).await?;
        cluster.set_leading(epoch);
        if alone {
            tracing::debug!(replica = %me, "a lone server: it leads");
        } else {
            tracing::info!(replica = %me, leader = ?epoch, "joined as a replica");
        }
        Ok(cluster)
    }

    pub fn id(&self) -> Uuid {
        self.0.me
    }

    pub fn advertise_url(&self) -> &str {
        &self.0.advertise_url
    }

    /// The leader lease's epoch while this replica holds it.
    pub fn leader_epoch(&self) -> Option<i64> {
        *self.0.leading.borrow()
    }

    /// Whether this replica leads now, by its own clock: false as soon as
    /// its lease could have run out, even before the heartbeat notices (a
    /// paused process sees this at once when it runs again).
    pub fn leads_now(&self) -> bool {
        self.leader_epoch().is_some() && Instant::now() < self.valid_until()
    }

    fn valid_until(&self) -> Instant {
        *self.0.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes to [`Self::leader_epoch`].
    pub fn leadership(&self) -> watch::Receiver<Option<i64>> {
        self.0.leading.subscribe()
    }

    fn set_leading(&self, epoch: Option<i64>) {
        self.0.leading.send_if_modified(|now| {
            if *now == epoch {
                return false;
            }
            match epoch {
                Some(epoch) if self.0.alone => tracing::debug!(epoch, "leading"),
                Some(epoch) => tracing::info!(epoch, "leading: singletons run here"),
                None if now.is_some() => tracing::warn!("stepped down as leader"),
                None => {}
            }
            *now = epoch;
            true
        });
    }

    /// Runs `write` as the leader: in one transaction with a check that this
    /// replica still holds the leader lease with the epoch it led with.
    pub async fn fenced<T: Send>(
        &self,
        write: impl for<'t> FnOnce(&'t Transaction) -> FencedWrite<'t, T> + Send,
    ) -> Result<T, FencedError> {
        let Some(epoch) = self.leader_epoch() else {
            return Err(FencedError::Fenced {
                name: LEADER.to_owned(),
                epoch: 0,
            });
        };
        rows::fenced(&self.0.db, LEADER, self.0.me, epoch, write).await
    }

    /// The replica leading now and the URL it advertises, if one does.
    pub async fn leader(&self) -> Result<Option<(Uuid, String)>, ClusterError> {
        Ok(rows::holder_url(&self.0.db, LEADER).await?)
    }

    pub fn settings(&self) -> &ClusterSettings {
        &self.0.settings
    }

    /// Every replica that joined (and is not yet forgotten), newest first.
    pub async fn replicas(&self) -> Result<Vec<Replica>, ClusterError> {
        let (found, now) = rows::replicas(&self.0.db).await?;
        let lease = rows::lease(&self.0.db, LEADER).await?;
        let leader = lease.filter(|l| l.until_ms > now).and_then(|l| l.holder);
        Ok(found
            .into_iter()
            .map(|r| Replica {
                state: if r.stopped_ms.is_some() {
                    ReplicaState::Stopped
                } else if r.lease_until_ms > now {
                    ReplicaState::Alive
                } else {
                    ReplicaState::Lost
                },
                leader: leader == Some(r.id),
                id: r.id,
                advertise_url: r.advertise_url,
                host: r.host,
                pid: r.pid,
                version: r.version,
                key_id: r.key_id,
                started_at: at(r.started_ms),
                heartbeat_at: at(r.heartbeat_ms),
                lease_until: at(r.lease_until_ms),
                stopped_at: r.stopped_ms.map(at),
            })
            .collect())
    }

    /// Renews membership and leadership every heartbeat until shutdown; then
    /// gives leadership up and leaves.
    pub async fn run(self) {
        let lease = self.0.settings.lease;
        let lease_ms = millis_of(lease);
        let mut every = tokio::time::interval(self.0.settings.heartbeat);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Leadership lasts, by this replica's clock, until a lease from the
        // last renewal seen to succeed could have run out, counted from
        // before that renewal was sent; a heartbeat earlier, to be safe
        // (`valid_until`, set first at `join`).
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = self.0.stopping.cancelled() => break,
            }
            // A renewal that hangs (the database cut off: packets dropped,
            // no error for minutes) must not keep a leader leading: when the
            // leadership it renews ends, the replica steps down. The renewal
            // itself is not cut short (a slow database is not a lost one).
            let leading = self.leader_epoch().is_some();
            let renewal = async {
                self.renew(lease_ms).await;
                if self.leader_epoch().is_some()
                    && let Err(e) = self.forget_gone().await
                {
                    tracing::debug!(error = %e, "cannot forget gone replicas");
                }
            };
            tokio::pin!(renewal);
            let late = tokio::select! {
                () = &mut renewal => false,
                () = tokio::time::sleep_until(self.valid_until()), if leading => true,
                // Shutdown does not wait for a renewal that hangs.
                _ = self.0.stopping.cancelled() => break,
            };
            if late {
                tracing::warn!(
                    "cannot renew the leader lease in time: the database does not answer"
                );
                self.set_leading(None);
                tokio::select! {
                    () = &mut renewal => {}
                    _ = self.0.stopping.cancelled() => break,
                }
            }
        }
        // Shutdown: leadership is given up, not lost (no warning). A replica
        // cut off from the database still stops: its leases run out instead.
        let goodbye = async {
            if let Some(epoch) = self.0.leading.send_replace(None) {
                match rows::release(&self.0.db, LEADER, self.0.me, epoch).await {
                    Ok(()) => tracing::info!(epoch, "gave the leader lease up"),
                    Err(e) => tracing::warn!(error = %e, "cannot give the leader lease up"),
                }
            }
            if let Err(e) = rows::leave(&self.0.db, self.0.me).await {
                tracing::warn!(error = %e, "cannot mark this replica stopped");
            }
        };
        if tokio::time::timeout(lease, goodbye).await.is_err() {
            tracing::warn!("the database does not answer: this replica's leases will run out");
        }
    }

    /// One renewal of membership and leadership.
    async fn renew(&self, lease_ms: i64) {
        match rows::heartbeat(&self.0.db, self.0.me, lease_ms).await {
            Ok(true) => {}
            Ok(false) => tracing::error!("this replica was marked stopped by another"),
            Err(e) => tracing::warn!(error = %e, "cannot renew this replica's lease"),
        }
        let sent = Instant::now();
        match rows::claim(&self.0.db, LEADER, self.0.me, lease_ms, false).await {
            Ok(Some(epoch)) => {
                *self.0.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = sent
                    + self
                        .0
                        .settings
                        .lease
                        .saturating_sub(self.0.settings.heartbeat);
                self.set_leading(Some(epoch));
            }
            Ok(None) => self.set_leading(None),
            Err(e) => {
                tracing::warn!(error = %e, "cannot renew the leader lease");
                if Instant::now() >= self.valid_until() {
                    self.set_leading(None);
                }
            }
        }
    }

    /// Forgets replicas gone for a day, as the leader.
    async fn forget_gone(&self) -> Result<u64, FencedError> {
        let keep = millis_of(FORGET_AFTER);
        self.fenced(move |txn| Box::pin(rows::forget_gone(txn, keep)))
            .await
    }

    /// Runs `start`'s tasks while this replica leads, aborting them when it
    /// steps down; once `stopping` fires, waits for them to end (they watch
    /// for it themselves).
    pub async fn lead(
        self,
        stopping: CancellationToken,
        start: impl Fn() -> Vec<tokio::task::JoinHandle<()>>,
    ) {
        let mut leadership = self.leadership();
        loop {
            let running = if leadership.borrow_and_update().is_some() {
                start()
            } else {
                Vec::new()
            };
            let ending = tokio::select! {
                changed = leadership.changed() => changed.is_err(),
                _ = stopping.cancelled() => true,
            };
            for task in running {
                if !ending {
                    task.abort();
                }
                let _ = task.await;
            }
            if ending {
                return;
            }
        }
    }
}

fn millis_of(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
