//! sea-orm entities. One module per table; no GraphQL or domain logic here.
//! State and status columns are typed by the enums of `states`.

pub mod user {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "users")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        #[sea_orm(unique)]
        pub username: String,
        pub password_hash: Option<String>,
        pub role: String,
        pub disabled: bool,
        pub created_at: DateTimeUtc,
        pub updated_at: DateTimeUtc,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {
        #[sea_orm(has_many = "super::api_token::Entity")]
        ApiTokens,
    }

    impl Related<super::api_token::Entity> for Entity {
        fn to() -> RelationDef {
            Relation::ApiTokens.def()
        }
    }

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod api_token {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "api_tokens")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        pub user_id: Uuid,
        pub kind: String,
        pub name: String,
        #[sea_orm(unique)]
        pub token_hash: String,
        pub created_at: DateTimeUtc,
        pub expires_at: Option<DateTimeUtc>,
        pub last_used_at: Option<DateTimeUtc>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {
        #[sea_orm(
            belongs_to = "super::user::Entity",
            from = "Column::UserId",
            to = "super::user::Column::Id",
            on_delete = "Cascade"
        )]
        User,
    }

    impl Related<super::user::Entity> for Entity {
        fn to() -> RelationDef {
            Relation::User.def()
        }
    }

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod repository {
    use sea_orm::entity::prelude::*;

    use crate::store::states::RepositoryStatus;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "repositories")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        #[sea_orm(unique)]
        pub name: String,
        pub driver_kind: String,
        /// The driver's settings as JSON text.
        pub driver_spec: String,
        pub sync_mode: String,
        pub priority: i32,
        pub refresh_interval_seconds: i64,
        pub status: RepositoryStatus,
        pub status_message: Option<String>,
        pub elements_seen: i64,
        pub elements_stored: i64,
        pub last_synced_at: Option<DateTimeUtc>,
        pub next_refresh_at: Option<DateTimeUtc>,
        pub created_at: DateTimeUtc,
        pub updated_at: DateTimeUtc,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {
        #[sea_orm(has_many = "super::element::Entity")]
        Elements,
    }

    impl Related<super::element::Entity> for Entity {
        fn to() -> RelationDef {
            Relation::Elements.def()
        }
    }

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod element {
    use sea_orm::entity::prelude::*;

    use crate::store::states::ElementStatus;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "elements")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        pub repository_id: Uuid,
        pub name: String,
        pub version: String,
        /// SHA-256 of the element's inventory entry, to notice changes.
        pub inventory_hash: Option<String>,
        /// The manifest as JSON text; `None` until fetched (LAZY).
        pub manifest: Option<String>,
        pub status: ElementStatus,
        pub status_message: Option<String>,
        pub installed: bool,
        pub installed_at: Option<DateTimeUtc>,
        pub created_at: DateTimeUtc,
        pub updated_at: DateTimeUtc,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {
        #[sea_orm(
            belongs_to = "super::repository::Entity",
            from = "Column::RepositoryId",
            to = "super::repository::Column::Id",
            on_delete = "Cascade"
        )]
        Repository,
        #[sea_orm(has_many = "super::artifact::Entity")]
        Artifacts,
    }

    impl Related<super::repository::Entity> for Entity {
        fn to() -> RelationDef {
            Relation::Repository.def()
        }
    }

    impl Related<super::artifact::Entity> for Entity {
        fn to() -> RelationDef {
            Relation::Artifacts.def()
        }
    }

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod artifact {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "artifacts")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        pub element_id: Uuid,
        pub urn: String,
        pub category: String,
        pub file_name: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {
        #[sea_orm(
            belongs_to = "super::element::Entity",
            from = "Column::ElementId",
            to = "super::element::Column::Id",
            on_delete = "Cascade"
        )]
        Element,
    }

    impl Related<super::element::Entity> for Entity {
        fn to() -> RelationDef {
            Relation::Element.def()
        }
    }

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod invalid_element {
    use sea_orm::entity::prelude::*;

    /// What a sync could not take as an element, and why.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "invalid_elements")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        pub repository_id: Uuid,
        /// Set when the problem is a stored element's manifest: the row goes
        /// with the element, and when its manifest is stored.
        pub element_id: Option<Uuid>,
        pub name: Option<String>,
        pub version: Option<String>,
        pub path: String,
        pub message: String,
        pub created_at: DateTimeUtc,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod element_binding {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "element_bindings")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub element_id: Uuid,
        #[sea_orm(primary_key, auto_increment = false)]
        pub depends_on_id: Uuid,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod provider {
    use sea_orm::entity::prelude::*;

    use crate::store::states::ProviderStatus;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "providers")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        #[sea_orm(unique)]
        pub name: String,
        pub git_url: String,
        pub git_ref: String,
        /// Where `corbel-provider.yaml` is, relative to the repository's root;
        /// empty is the root.
        pub source_path: String,
        /// Plain configuration values, a JSON object as text.
        pub config: String,
        /// Secret configuration values, a JSON object as text; never shown.
        pub secret_config: String,
        pub auto_load: bool,
        /// The user it runs as (the server runs as root); empty: the server's.
        pub run_as: String,
        /// SHA-256 (hex) of the registration token.
        pub token_hash: String,
        pub status: ProviderStatus,
        pub status_message: Option<String>,
        pub resolved_commit: Option<String>,
        /// The parsed `corbel-provider.yaml`, as JSON text.
        pub metadata: Option<String>,
        /// JSON arrays of strings, as the provider announced at registration.
        pub features: String,
        pub resource_types: String,
        pub restarts: i32,
        pub last_seen_at: Option<DateTimeUtc>,
        pub created_at: DateTimeUtc,
        pub updated_at: DateTimeUtc,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod blueprint {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "blueprints")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        #[sea_orm(unique)]
        pub name: String,
        pub description: Option<String>,
        /// The blueprint's YAML, as authored.
        pub source: String,
        pub created_at: DateTimeUtc,
        pub updated_at: DateTimeUtc,
        /// The project it belongs to (set for every row since migration 8).
        pub project_id: Option<Uuid>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod deployment {
    use sea_orm::entity::prelude::*;

    use crate::store::states::DeploymentState;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "deployments")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        pub name: String,
        pub blueprint_id: Option<Uuid>,
        /// Set for an element's installation.
        pub element_id: Option<Uuid>,
        /// The blueprint as it was when deployed (YAML).
        pub source: String,
        /// The bound variables, a JSON object as text.
        pub variables: String,
        pub state: DeploymentState,
        pub on_failure: String,
        pub error: Option<String>,
        pub expires_at: Option<DateTimeUtc>,
        pub created_at: DateTimeUtc,
        pub updated_at: DateTimeUtc,
        /// The operation under way or last run (deploy, redeploy, destroy);
        /// nodes it deploys carry it as their `run_id`.
        pub operation_id: Option<Uuid>,
        /// What the operation is doing: `DEPLOY`, `ROLLBACK` or `DESTROY`;
        /// `None` once the deployment is settled.
        pub phase: Option<String>,
        /// The project it belongs to (set for every row since migration 8).
        pub project_id: Option<Uuid>,
        /// Its nodes' health rolled up, worst first: `DOWN`, `DEGRADED`,
        /// `UNKNOWN`, `HEALTHY` (migration 13).
        pub health: String,
        pub health_changed_at: Option<DateTimeUtc>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {
        #[sea_orm(has_many = "super::deployment_node::Entity")]
        Nodes,
    }

    impl Related<super::deployment_node::Entity> for Entity {
        fn to() -> RelationDef {
            Relation::Nodes.def()
        }
    }

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod deployment_node {
    use sea_orm::entity::prelude::*;

    use crate::store::states::NodeState;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "deployment_nodes")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        pub deployment_id: Uuid,
        /// The blueprint's resource key.
        pub key: String,
        pub replica: i32,
        pub resource_type: String,
        pub provider_id: Option<Uuid>,
        /// The provider node it is placed on.
        pub node: Option<String>,
        pub state: NodeState,
        /// The rendered configuration, JSON text.
        pub config: Option<String>,
        /// The outputs, JSON text.
        pub outputs: Option<String>,
        pub error: Option<String>,
        pub run_id: Option<Uuid>,
        pub updated_at: DateTimeUtc,
        /// What it counts against its project's named quotas, as its provider
        /// described it: a JSON object of name to amount, or none.
        pub quota: Option<String>,
        /// 0, or one more than the node it replaces while that one still
        /// runs (a replacement made before the old one is destroyed).
        pub generation: i32,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {
        #[sea_orm(
            belongs_to = "super::deployment::Entity",
            from = "Column::DeploymentId",
            to = "super::deployment::Column::Id",
            on_delete = "Cascade"
        )]
        Deployment,
    }

    impl Related<super::deployment::Entity> for Entity {
        fn to() -> RelationDef {
            Relation::Deployment.def()
        }
    }

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod journal {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "journal")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        pub deployment_id: Uuid,
        pub node_id: Uuid,
        pub provider_id: Uuid,
        /// `DEPLOY` or `DESTROY`.
        pub intent: String,
        pub created_at: DateTimeUtc,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod deployment_plan {
    use sea_orm::entity::prelude::*;

    use crate::store::states::PlanState;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "deployment_plans")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        pub deployment_id: Uuid,
        pub created_at: DateTimeUtc,
        pub created_by: Option<String>,
        pub blueprint_id: Option<Uuid>,
        /// What is asked: the blueprint (YAML) and the bound variables (JSON).
        pub source: String,
        pub variables: String,
        /// What ran when the plan was made.
        pub base_source: String,
        pub base_variables: String,
        /// The deployment's state and nodes as the plan saw them (JSON).
        pub basis: String,
        /// The changes (JSON).
        pub changes: String,
        pub state: PlanState,
        pub applied_at: Option<DateTimeUtc>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod deployment_revision {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "deployment_revisions")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        pub deployment_id: Uuid,
        /// 1, 2, … per deployment.
        pub number: i32,
        /// `DEPLOY`, `APPLY` or `ROLLBACK`.
        pub kind: String,
        pub source: String,
        pub variables: String,
        pub blueprint_id: Option<Uuid>,
        pub plan_id: Option<Uuid>,
        pub operation_id: Option<Uuid>,
        pub created_by: Option<String>,
        pub created_at: DateTimeUtc,
        /// `IN_PROGRESS`, `COMPLETE` or `FAILED`.
        pub outcome: String,
        pub error: Option<String>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod deployment_event {
    use sea_orm::entity::prelude::*;

    use crate::store::states::EventState;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "deployment_events")]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub deployment_id: Uuid,
        pub at: DateTimeUtc,
        pub kind: String,
        pub node_key: Option<String>,
        pub state: Option<EventState>,
        pub message: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod project {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "projects")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        #[sea_orm(unique)]
        pub name: String,
        pub description: Option<String>,
        pub max_resources: Option<i64>,
        pub max_lease_seconds: Option<i64>,
        /// Named quantities to limits, a JSON object as text.
        pub quotas: String,
        pub created_at: DateTimeUtc,
        pub updated_at: DateTimeUtc,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod project_member {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "project_members")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub project_id: Uuid,
        #[sea_orm(primary_key, auto_increment = false)]
        pub user_id: Uuid,
        /// `VIEWER`, `DEPLOYER`, `DEVELOPER` or `ADMIN`.
        pub role: String,
        pub created_at: DateTimeUtc,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod audit_entry {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "audit_log")]
    pub struct Model {
        /// UUID v7: in the order the entries were made.
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        pub at: DateTimeUtc,
        pub user_id: Option<Uuid>,
        pub username: Option<String>,
        pub project_id: Option<Uuid>,
        /// The mutation's name (`deployBlueprint`).
        pub action: String,
        /// Its arguments with secrets hidden, a JSON object as text.
        pub arguments: String,
        /// `OK` or the error's code.
        pub outcome: String,
        pub error: Option<String>,
        pub duration_micros: i64,
        pub address: Option<String>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod resource_health {
    use sea_orm::entity::prelude::*;

    /// What was last learned of a deployed resource's health (migration 13).
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "resource_health")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub node_id: Uuid,
        pub deployment_id: Uuid,
        /// `HEALTHY`, `DEGRADED`, `DOWN` or `UNKNOWN`.
        pub health: String,
        pub reason: Option<String>,
        pub changed_at: DateTimeUtc,
        /// The node's `updated_at` when this was learned: a node written
        /// since (deployed again, updated) is judged afresh.
        pub node_updated_at: DateTimeUtc,
        /// Restarts by its restart policy or by hand, ever.
        pub restarts: i32,
        /// When the current restart window opened, and the restarts in it.
        pub window_from: Option<DateTimeUtc>,
        pub window_restarts: i32,
        /// When the next restart may go (the backoff), while one is due.
        pub next_restart_at: Option<DateTimeUtc>,
        /// Healing stopped: a crash loop.
        pub gave_up: bool,
        /// The keys whose observed config differs from the deployed one, a
        /// JSON array, or none.
        pub drift: Option<String>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}
