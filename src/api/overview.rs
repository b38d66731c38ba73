//! What the console's overview draws beside its counters: the recent changes
//! hour by hour and the deployed resources by health, of the deployments the
//! caller may see.

use async_graphql::{Context, Object, SimpleObject};
use chrono::{DateTime, Utc};

use super::deploy_enums::ResourceHealth;
use super::policy::access;
use super::{ApiError, state};
use crate::deploy::Deployments;

/// The most hours `changesByHour` looks back: a week.
const MAX_HOURS: i32 = 168;

/// One clock hour of the deployments' history.
#[derive(SimpleObject)]
pub struct HourOfChanges {
    /// The hour's start.
    from: DateTime<Utc>,
    /// Deployments whose state, or a node's, changed in it.
    deployments: u64,
    /// Resource nodes (`key[replica]` of a deployment) whose state changed in it.
    resources: u64,
}

/// How many deployed resources have one health.
#[derive(SimpleObject)]
pub struct HealthCount {
    health: ResourceHealth,
    count: u64,
}

#[derive(Default)]
pub struct OverviewQuery;

#[Object]
impl OverviewQuery {
    /// Deployments and resource nodes changed in each of the last `hours`
    /// clock hours (1 to 168), oldest first, the current hour last: of the
    /// deployments the caller may see, from their event history.
    async fn changes_by_hour(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 24)] hours: i32,
    ) -> Result<Vec<HourOfChanges>, ApiError> {
        if !(1..=MAX_HOURS).contains(&hours) {
            return Err(ApiError::validation(format!(
                "hours: expected 1 to {MAX_HOURS}, got {hours}"
            )));
        }
        let visible = access(ctx).await?.visible();
        let hours = state::<Deployments>(ctx)?
            .queries()
            .changes_by_hour(hours as u32, visible.as_deref())
            .await?;
        Ok(hours
            .into_iter()
            .map(|h| HourOfChanges {
                from: h.from,
                deployments: h.deployments,
                resources: h.resources,
            })
            .collect())
    }

    /// The deployed resources of the deployments the caller may see, by
    /// health (those not judged yet are `UNKNOWN`); healths none has are left
    /// out.
    async fn resources_by_health(&self, ctx: &Context<'_>) -> Result<Vec<HealthCount>, ApiError> {
        let visible = access(ctx).await?.visible();
        let counts = state::<Deployments>(ctx)?
            .queries()
            .nodes_by_health(visible.as_deref())
            .await?;
        Ok(counts
            .into_iter()
            .map(|(health, count)| HealthCount {
                health: health.into(),
                count,
            })
            .collect())
    }
}
