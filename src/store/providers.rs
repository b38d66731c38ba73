//! Queries on providers, for the `provider` area.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, DbErr, EntityTrait, IntoActiveModel,
    QueryFilter, QueryOrder, Set,
};
use uuid::Uuid;

use super::entities::provider;
use super::states::ProviderStatus;

pub use provider::Model as ProviderRow;

/// A new provider row. The id is the caller's: its `secret_config` is sealed
/// for that id.
pub struct NewProvider {
    pub id: Uuid,
    pub name: String,
    pub git_url: String,
    pub git_ref: String,
    pub source_path: String,
    pub config: String,
    pub secret_config: String,
    pub auto_load: bool,
    pub run_as: String,
    pub token_hash: String,
}

pub async fn insert(
    db: &DatabaseConnection,
    new: NewProvider,
    status: ProviderStatus,
) -> Result<ProviderRow, DbErr> {
    let now = Utc::now();
    provider::ActiveModel {
        id: Set(new.id),
        name: Set(new.name),
        git_url: Set(new.git_url),
        git_ref: Set(new.git_ref),
        source_path: Set(new.source_path),
        config: Set(new.config),
        secret_config: Set(new.secret_config),
        auto_load: Set(new.auto_load),
        run_as: Set(new.run_as),
        token_hash: Set(new.token_hash),
        status: Set(status),
        status_message: Set(None),
        resolved_commit: Set(None),
        metadata: Set(None),
        features: Set("[]".to_owned()),
        resource_types: Set("[]".to_owned()),
        restarts: Set(0),
        last_seen_at: Set(None),
        created_at: Set(now),
        updated_at: Set(now),
    }
    .insert(db)
    .await
}

pub async fn find(db: &DatabaseConnection, id: Uuid) -> Result<Option<ProviderRow>, DbErr> {
    provider::Entity::find_by_id(id).one(db).await
}

pub async fn list(db: &DatabaseConnection) -> Result<Vec<ProviderRow>, DbErr> {
    provider::Entity::find()
        .order_by_asc(provider::Column::Name)
        .all(db)
        .await
}

/// Columns of a provider to change; `None` leaves one as it is.
#[derive(Default)]
pub struct ProviderChange {
    pub name: Option<String>,
    pub git_url: Option<String>,
    pub git_ref: Option<String>,
    pub source_path: Option<String>,
    pub auto_load: Option<bool>,
    pub run_as: Option<String>,
    pub token_hash: Option<String>,
    pub config: Option<String>,
    pub secret_config: Option<String>,
}

pub async fn update(
    db: &DatabaseConnection,
    row: ProviderRow,
    change: ProviderChange,
) -> Result<ProviderRow, DbErr> {
    let mut active = row.into_active_model();
    let ProviderChange {
        name,
        git_url,
        git_ref,
        source_path,
        auto_load,
        run_as,
        token_hash,
        config,
        secret_config,
    } = change;
    if let Some(v) = name {
        active.name = Set(v);
    }
    if let Some(v) = git_url {
        active.git_url = Set(v);
    }
    if let Some(v) = git_ref {
        active.git_ref = Set(v);
    }
    if let Some(v) = source_path {
        active.source_path = Set(v);
    }
    if let Some(v) = auto_load {
        active.auto_load = Set(v);
    }
    if let Some(v) = run_as {
        active.run_as = Set(v);
    }
    if let Some(v) = token_hash {
        active.token_hash = Set(v);
    }
    if let Some(v) = config {
        active.config = Set(v);
    }
    if let Some(v) = secret_config {
        active.secret_config = Set(v);
    }
    active.updated_at = Set(Utc::now());
    active.update(db).await
}

pub async fn set_status(
    db: &DatabaseConnection,
    id: Uuid,
    status: ProviderStatus,
    message: Option<&str>,
) -> Result<(), DbErr> {
    provider::Entity::update_many()
        .col_expr(provider::Column::Status, Expr::value(status))
        .col_expr(
            provider::Column::StatusMessage,
            Expr::value(message.map(str::to_owned)),
        )
        .col_expr(provider::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(provider::Column::Id.eq(id))
        .exec(db)
        .await
        .map(drop)
}

/// Records what a fetch found: the commit and the parsed metadata.
pub async fn set_source(
    db: &DatabaseConnection,
    id: Uuid,
    commit: &str,
    metadata: Option<String>,
) -> Result<(), DbErr> {
    provider::Entity::update_many()
        .col_expr(provider::Column::ResolvedCommit, Expr::value(commit))
        .col_expr(provider::Column::Metadata, Expr::value(metadata))
        .col_expr(provider::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(provider::Column::Id.eq(id))
        .exec(db)
        .await
        .map(drop)
}

/// Records a registration: what the provider announced, and when.
pub async fn set_registered(
    db: &DatabaseConnection,
    id: Uuid,
    features: String,
    resource_types: String,
    at: DateTime<Utc>,
) -> Result<(), DbErr> {
    provider::Entity::update_many()
        .col_expr(provider::Column::Features, Expr::value(features))
        .col_expr(provider::Column::ResourceTypes, Expr::value(resource_types))
        .col_expr(provider::Column::LastSeenAt, Expr::value(at))
        .filter(provider::Column::Id.eq(id))
        .exec(db)
        .await
        .map(drop)
}

pub async fn set_restarts(db: &DatabaseConnection, id: Uuid, restarts: i32) -> Result<(), DbErr> {
    provider::Entity::update_many()
        .col_expr(provider::Column::Restarts, Expr::value(restarts))
        .filter(provider::Column::Id.eq(id))
        .exec(db)
        .await
        .map(drop)
}

pub async fn set_last_seen(
    db: &DatabaseConnection,
    id: Uuid,
    at: DateTime<Utc>,
) -> Result<(), DbErr> {
    provider::Entity::update_many()
        .col_expr(provider::Column::LastSeenAt, Expr::value(at))
        .filter(provider::Column::Id.eq(id))
        .exec(db)
        .await
        .map(drop)
}

/// One provider's `secret_config` to replace: the value read, and the new one.
pub struct SecretChange {
    pub id: Uuid,
    pub old: String,
    pub new: String,
}

/// Replaces providers' `secret_config`s in one transaction, each only if it
/// still holds the value read: all are replaced, or (an error, naming the
/// provider that changed) none.
pub async fn replace_secret_configs(
    db: &DatabaseConnection,
    changes: Vec<SecretChange>,
) -> Result<(), DbErr> {
    use sea_orm::TransactionTrait;
    let txn = db.begin().await?;
    for change in changes {
        let done = provider::Entity::update_many()
            .col_expr(provider::Column::SecretConfig, Expr::value(change.new))
            .filter(provider::Column::Id.eq(change.id))
            .filter(provider::Column::SecretConfig.eq(change.old))
            .exec(&txn)
            .await?;
        if done.rows_affected != 1 {
            txn.rollback().await?;
            return Err(DbErr::Custom(format!(
                "provider {} was changed or removed meanwhile; nothing was replaced",
                change.id
            )));
        }
    }
    txn.commit().await
}

/// What deleting a provider did.
#[derive(Debug, PartialEq, Eq)]
pub enum Deletion {
    Deleted,
    NotFound,
    /// Refused: these deployments' nodes hold (or may hold) resources on it.
    Holding(Vec<super::deployments::Holder>),
}

/// Deletes the provider unless deployment nodes hold resources on it
/// ([`super::deployments::HOLDING_STATES`]), in one transaction: the row is
/// deleted first, so the transaction holds the write lock while it counts, and
/// the delete is rolled back if anything is held.
pub async fn delete_unless_holding(db: &DatabaseConnection, id: Uuid) -> Result<Deletion, DbErr> {
    use sea_orm::TransactionTrait;
    let txn = db.begin().await?;
    let deleted = provider::Entity::delete_by_id(id).exec(&txn).await?;
    if deleted.rows_affected == 0 {
        txn.rollback().await?;
        return Ok(Deletion::NotFound);
    }
    let holders =
        super::deployments::provider_holders(&txn, id, &super::deployments::HOLDING_STATES).await?;
    if !holders.is_empty() {
        txn.rollback().await?;
        return Ok(Deletion::Holding(holders));
    }
    txn.commit().await?;
    Ok(Deletion::Deleted)
}

/// At boot no provider runs yet (a provider exits when its server goes away):
/// every status but `FAILED` becomes `UNLOADED`.
pub async fn reset_statuses(db: &DatabaseConnection) -> Result<(), DbErr> {
    provider::Entity::update_many()
        .col_expr(
            provider::Column::Status,
            Expr::value(ProviderStatus::Unloaded),
        )
        .col_expr(provider::Column::StatusMessage, Expr::value(None::<String>))
        .filter(provider::Column::Status.ne(ProviderStatus::Unloaded))
        .filter(provider::Column::Status.ne(ProviderStatus::Failed))
        .exec(db)
        .await
        .map(drop)
}
