//! The `Blueprint` object: a stored blueprint with its resources and
//! variables as the API shows them.

use async_graphql::{Context, ID, Json, Object, SimpleObject};
use chrono::{DateTime, Utc};

use super::deploy_enums::PlacementStrategy;
use super::{ApiError, state};
use crate::deploy::blueprint::Replicas;
use crate::deploy::{self as domain, Deployments};

#[derive(SimpleObject)]
pub struct BlueprintResource {
    key: String,
    #[graphql(name = "type")]
    resource_type: String,
    /// The provider named in the blueprint, if any (else found by type).
    provider: Option<String>,
    depends_on: Vec<String>,
    /// A number, or the template that gives it at deploy time.
    replicas: String,
    strategy: PlacementStrategy,
    config: Json<serde_json::Value>,
}

#[derive(SimpleObject)]
pub struct BlueprintVariable {
    name: String,
    #[graphql(name = "type")]
    var_type: String,
    default: Option<Json<serde_json::Value>>,
    description: Option<String>,
}

pub struct Blueprint(pub(super) domain::StoredBlueprint);

#[Object]
impl Blueprint {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn name(&self) -> &str {
        &self.0.name
    }
    /// The project it belongs to.
    async fn project_id(&self) -> Option<ID> {
        self.0.project_id.map(|id| ID(id.to_string()))
    }
    async fn description(&self) -> Option<&str> {
        self.0.description.as_deref()
    }
    /// The YAML as authored.
    async fn source(&self) -> &str {
        &self.0.source
    }
    async fn resources(&self) -> Vec<BlueprintResource> {
        resources_of(&self.0.parsed)
    }
    async fn variables(&self) -> Vec<BlueprintVariable> {
        self.0
            .parsed
            .variables
            .iter()
            .map(|v| BlueprintVariable {
                name: v.name.clone(),
                var_type: v.ty.as_str().to_owned(),
                default: v.default.clone().map(Json),
                description: v.description.clone(),
            })
            .collect()
    }
    /// Resource types no provider serves now: deploying would fail on them.
    async fn warnings(&self, ctx: &Context<'_>) -> Result<Vec<String>, ApiError> {
        Ok(state::<Deployments>(ctx)?
            .blueprints()
            .warnings(&self.0.parsed)
            .await)
    }
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }
    async fn updated_at(&self) -> DateTime<Utc> {
        self.0.updated_at
    }
}

/// A blueprint's resources as the API shows them.
pub(super) fn resources_of(parsed: &crate::deploy::blueprint::Blueprint) -> Vec<BlueprintResource> {
    parsed
        .resources
        .iter()
        .map(|r| BlueprintResource {
            key: r.key.clone(),
            resource_type: r.resource_type.clone(),
            provider: r.provider.clone(),
            depends_on: r.depends_on.clone(),
            replicas: match &r.replicas {
                Replicas::Fixed(n) => n.to_string(),
                Replicas::Template(t) => t.clone(),
            },
            strategy: r.strategy.into(),
            config: Json(r.config.clone()),
        })
        .collect()
}
