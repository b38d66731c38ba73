//! `serverInfo`: public facts about this server; `replicas`: the servers
//! sharing its database, for server admins.

use async_graphql::{Context, Enum, ID, Object, SimpleObject};
use chrono::{DateTime, Utc};

use super::{ApiError, Caller, ServerFacts, state};
use crate::cluster::{Cluster, ReplicaState};

#[derive(SimpleObject)]
pub struct ServerInfo {
    /// Corbel's version.
    version: String,
    /// SHA-256 of the store settings: replicas on one store share it.
    instance_id: String,
    /// `sqlite` or `postgres`.
    database: String,
    /// When this process started serving.
    started_at: DateTime<Utc>,
    /// This server's id as a replica (new at every start).
    replica_id: ID,
    /// The URL this replica advertises (`--advertise-url`): for signed-in
    /// callers only (it may name an internal address); null without a token.
    advertise_url: Option<String>,
    /// Whether this replica leads: runs the singletons (lease reaper,
    /// background repository refresh).
    leader: bool,
}

/// How a replica stands, as the database's clock sees its lease.
#[derive(Enum, Clone, Copy, PartialEq, Eq)]
#[graphql(name = "ReplicaState")]
pub enum ReplicaStateGql {
    /// Its lease is running.
    Alive,
    /// Its lease ran out without a goodbye: killed, paused, or cut off from
    /// the database.
    Lost,
    /// It left at shutdown.
    Stopped,
}

/// A server that joined this database as a replica.
#[derive(SimpleObject)]
pub struct Replica {
    id: ID,
    advertise_url: String,
    host: String,
    pid: i32,
    version: String,
    /// The id of the secret key it runs with (every replica must share
    /// one; a replica with another is refused at start).
    key_id: Option<String>,
    started_at: DateTime<Utc>,
    /// Its last renewal.
    heartbeat_at: DateTime<Utc>,
    /// Its lease runs out then, unless renewed.
    lease_until: DateTime<Utc>,
    stopped_at: Option<DateTime<Utc>>,
    state: ReplicaStateGql,
    /// Holds the leader lease now.
    leader: bool,
}

#[derive(Default)]
pub struct ServerQuery;

#[Object]
impl ServerQuery {
    /// Public facts about this server; needs no token.
    async fn server_info(&self, ctx: &Context<'_>) -> Result<ServerInfo, ApiError> {
        let facts = state::<ServerFacts>(ctx)?;
        let cluster = state::<Cluster>(ctx)?;
        Ok(ServerInfo {
            version: crate::VERSION.to_owned(),
            instance_id: facts.instance_id.clone(),
            database: facts.database.to_owned(),
            started_at: facts.started_at,
            replica_id: ID(cluster.id().to_string()),
            advertise_url: ctx
                .data_opt::<Caller>()
                .is_some_and(Caller::is_signed_in)
                .then(|| cluster.advertise_url().to_owned()),
            leader: cluster.leader_epoch().is_some(),
        })
    }

    /// The servers that joined this database as replicas, newest first
    /// (those gone for a day are forgotten). Server admins only.
    async fn replicas(&self, ctx: &Context<'_>) -> Result<Vec<Replica>, ApiError> {
        let cluster = state::<Cluster>(ctx)?;
        let replicas = cluster
            .replicas()
            .await
            .map_err(|e| ApiError::internal(&e))?;
        Ok(replicas
            .into_iter()
            .map(|r| Replica {
                id: ID(r.id.to_string()),
                advertise_url: r.advertise_url,
                host: r.host,
                pid: r.pid,
                version: r.version,
                key_id: r.key_id,
                started_at: r.started_at,
                heartbeat_at: r.heartbeat_at,
                lease_until: r.lease_until,
                stopped_at: r.stopped_at,
                state: match r.state {
                    ReplicaState::Alive => ReplicaStateGql::Alive,
                    ReplicaState::Lost => ReplicaStateGql::Lost,
                    ReplicaState::Stopped => ReplicaStateGql::Stopped,
                },
                leader: r.leader,
            })
            .collect())
    }
}
