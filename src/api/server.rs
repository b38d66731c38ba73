//! `serverInfo`: public facts about this server.

use async_graphql::{Context, Object, SimpleObject};
use chrono::{DateTime, Utc};

use super::{ApiError, ServerFacts, state};

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
}

#[derive(Default)]
pub struct ServerQuery;

#[Object]
impl ServerQuery {
    /// Public facts about this server; needs no token.
    async fn server_info(&self, ctx: &Context<'_>) -> Result<ServerInfo, ApiError> {
        let facts = state::<ServerFacts>(ctx)?;
        Ok(ServerInfo {
            version: crate::VERSION.to_owned(),
            instance_id: facts.instance_id.clone(),
            database: facts.database.to_owned(),
            started_at: facts.started_at,
        })
    }
}
