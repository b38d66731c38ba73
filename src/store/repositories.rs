//! Queries on repositories, elements, artifacts and bindings, for the
//! `repository` area.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait, OnConflict};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait,
    IntoActiveModel, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect, Set, TransactionTrait,
};
use uuid::Uuid;

use super::entities::{artifact, element, element_binding, invalid_element, repository};
use super::states::{ElementStatus, RepositoryStatus};

pub use artifact::Model as ArtifactRow;
pub use element::Model as ElementRow;
pub use invalid_element::Model as InvalidElementRow;
pub use repository::Model as RepositoryRow;

/// A new repository row; the id is the caller's (its driver may be sealed
/// for it).
pub struct NewRepository {
    pub id: Uuid,
    pub name: String,
    pub driver_kind: String,
    pub driver_spec: String,
    pub sync_mode: String,
    pub priority: i32,
    pub refresh_interval_seconds: i64,
}

pub async fn insert_repository(
    db: &DatabaseConnection,
    new: NewRepository,
    status: RepositoryStatus,
) -> Result<RepositoryRow, DbErr> {
    let now = Utc::now();
    repository::ActiveModel {
        id: Set(new.id),
        name: Set(new.name),
        driver_kind: Set(new.driver_kind),
        driver_spec: Set(new.driver_spec),
        sync_mode: Set(new.sync_mode),
        priority: Set(new.priority),
        refresh_interval_seconds: Set(new.refresh_interval_seconds),
        status: Set(status),
        status_message: Set(None),
        elements_seen: Set(0),
        elements_stored: Set(0),
        last_synced_at: Set(None),
        // Due at once: if the first sync is cut short, the refresh loop runs it.
        next_refresh_at: Set(Some(now)),
        created_at: Set(now),
        updated_at: Set(now),
    }
    .insert(db)
    .await
}

/// Replaces `driver_spec`s (`(id, read, new)`) in one transaction, each
/// only if it still holds the value read: all, or none (an error).
pub async fn replace_driver_specs(
    db: &DatabaseConnection,
    changes: &[(Uuid, String, String)],
) -> Result<(), DbErr> {
    let txn = sea_orm::TransactionTrait::begin(db).await?;
    for (id, old, new) in changes {
        let done = repository::Entity::update_many()
            .col_expr(repository::Column::DriverSpec, Expr::value(new.clone()))
            .filter(repository::Column::Id.eq(*id))
            .filter(repository::Column::DriverSpec.eq(old.clone()))
            .exec(&txn)
            .await?;
        if done.rows_affected != 1 {
            return Err(DbErr::Custom(format!(
                "repository {id} was changed or removed meanwhile; nothing was replaced"
            )));
        }
    }
    txn.commit().await
}

pub async fn find_repository(
    db: &DatabaseConnection,
    id: Uuid,
) -> Result<Option<RepositoryRow>, DbErr> {
    repository::Entity::find_by_id(id).one(db).await
}

pub async fn list_repositories(db: &DatabaseConnection) -> Result<Vec<RepositoryRow>, DbErr> {
    repository::Entity::find()
        .order_by_desc(repository::Column::Priority)
        .order_by_asc(repository::Column::Name)
        .all(db)
        .await
}

/// Columns of a repository to change; `None` leaves one as it is.
#[derive(Default)]
pub struct RepositoryChange {
    pub name: Option<String>,
    /// The driver's kind and its JSON spec, changed together.
    pub driver: Option<(String, String)>,
    pub sync_mode: Option<String>,
    pub priority: Option<i32>,
    pub refresh_interval_seconds: Option<i64>,
}

pub async fn update_repository(
    db: &DatabaseConnection,
    row: RepositoryRow,
    change: RepositoryChange,
) -> Result<RepositoryRow, DbErr> {
    let mut active = row.into_active_model();
    if let Some(v) = change.name {
        active.name = Set(v);
    }
    if let Some((kind, spec)) = change.driver {
        active.driver_kind = Set(kind);
        active.driver_spec = Set(spec);
    }
    if let Some(v) = change.sync_mode {
        active.sync_mode = Set(v);
    }
    if let Some(v) = change.priority {
        active.priority = Set(v);
    }
    if let Some(v) = change.refresh_interval_seconds {
        active.refresh_interval_seconds = Set(v);
    }
    active.updated_at = Set(Utc::now());
    active.update(db).await
}

/// Sets status fields (and progress, when given).
pub async fn set_repository_status(
    db: &DatabaseConnection,
    id: Uuid,
    status: RepositoryStatus,
    message: Option<String>,
) -> Result<(), DbErr> {
    repository::Entity::update_many()
        .col_expr(repository::Column::Status, Expr::value(status))
        .col_expr(repository::Column::StatusMessage, Expr::value(message))
        .col_expr(repository::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(repository::Column::Id.eq(id))
        .exec(db)
        .await
        .map(drop)
}

pub async fn set_repository_progress(
    db: &DatabaseConnection,
    id: Uuid,
    seen: i64,
    stored: i64,
) -> Result<(), DbErr> {
    repository::Entity::update_many()
        .col_expr(repository::Column::ElementsSeen, Expr::value(seen))
        .col_expr(repository::Column::ElementsStored, Expr::value(stored))
        .filter(repository::Column::Id.eq(id))
        .exec(db)
        .await
        .map(drop)
}

pub async fn finish_sync(
    db: &DatabaseConnection,
    id: Uuid,
    status: RepositoryStatus,
    message: Option<String>,
    synced_at: Option<DateTime<Utc>>,
    next_refresh_at: DateTime<Utc>,
) -> Result<(), DbErr> {
    let mut update = repository::Entity::update_many()
        .col_expr(repository::Column::Status, Expr::value(status))
        .col_expr(repository::Column::StatusMessage, Expr::value(message))
        .col_expr(
            repository::Column::NextRefreshAt,
            Expr::value(next_refresh_at),
        )
        .col_expr(repository::Column::UpdatedAt, Expr::value(Utc::now()));
    if let Some(at) = synced_at {
        update = update.col_expr(repository::Column::LastSyncedAt, Expr::value(at));
    }
    update
        .filter(repository::Column::Id.eq(id))
        .exec(db)
        .await
        .map(drop)
}

/// Repositories whose refresh is due.
pub async fn due_repositories(
    db: &DatabaseConnection,
    now: DateTime<Utc>,
) -> Result<Vec<RepositoryRow>, DbErr> {
    repository::Entity::find()
        .filter(repository::Column::NextRefreshAt.lte(now))
        .filter(repository::Column::Status.ne(RepositoryStatus::Syncing))
        .all(db)
        .await
}

pub async fn delete_repository(db: &DatabaseConnection, id: Uuid) -> Result<bool, DbErr> {
    Ok(repository::Entity::delete_by_id(id)
        .exec(db)
        .await?
        .rows_affected
        > 0)
}

pub async fn count_installed_in(
    db: &DatabaseConnection,
    repository_id: Uuid,
) -> Result<u64, DbErr> {
    element::Entity::find()
        .filter(element::Column::RepositoryId.eq(repository_id))
        .filter(element::Column::Installed.eq(true))
        .count(db)
        .await
}

/// A stored element as a sync compares it: fixed in size, so a repository of
/// a million elements costs tens of MiB to compare against, not hundreds.
#[derive(Clone, Copy, Debug)]
pub struct Stored {
    pub id: Uuid,
    /// SHA-256 of its inventory entry; `None` when it has none (or what is
    /// stored is not 64 hex digits, which no entry's hash equals).
    pub hash: Option<[u8; 32]>,
    pub installed: bool,
    /// Its manifest is stored (COPY fetches a missing one again).
    pub has_manifest: bool,
}

/// Rows read per query by [`existing_elements`].
const EXISTING_PAGE: u64 = 5_000;

/// Hands every stored element of a repository to `each` with its name and
/// version, read in pages of [`EXISTING_PAGE`] in key order (keyset
/// pagination on the `(repository_id, name, version)` index): memory holds one
/// page of rows, never the repository's.
pub async fn existing_elements(
    db: &DatabaseConnection,
    repository_id: Uuid,
    mut each: impl FnMut(String, String, Stored),
) -> Result<(), DbErr> {
    let mut after: Option<(String, String)> = None;
    loop {
        let mut query = element::Entity::find()
            .select_only()
            .columns([
                element::Column::Id,
                element::Column::Name,
                element::Column::Version,
                element::Column::InventoryHash,
                element::Column::Installed,
            ])
            // Whether there is one, without reading the manifests.
            .column_as(
                Expr::col(element::Column::Manifest).is_not_null(),
                "has_manifest",
            )
            .filter(element::Column::RepositoryId.eq(repository_id));
        if let Some((name, version)) = after.take() {
            query = query.filter(
                Expr::tuple([
                    Expr::col(element::Column::Name),
                    Expr::col(element::Column::Version),
                ])
                .gt(Expr::tuple([Expr::val(name), Expr::val(version)])),
            );
        }
        let rows: Vec<(Uuid, String, String, Option<String>, bool, bool)> = query
            .order_by_asc(element::Column::Name)
            .order_by_asc(element::Column::Version)
            .limit(EXISTING_PAGE)
            .into_tuple()
            .all(db)
            .await?;
        // A full page may have more after it: the next starts past its last key.
        after = (rows.len() as u64 == EXISTING_PAGE)
            .then(|| rows.last().map(|r| (r.1.clone(), r.2.clone())))
            .flatten();
        for (id, name, version, hash, installed, has_manifest) in rows {
            let stored = Stored {
                id,
                hash: hash.as_deref().and_then(hash_bytes),
                installed,
                has_manifest,
            };
            each(name, version, stored);
        }
        if after.is_none() {
            return Ok(());
        }
    }
}

/// A hash as stored (64 hex digits) as its bytes.
pub fn hash_bytes(hex_digits: &str) -> Option<[u8; 32]> {
    let mut bytes = [0; 32];
    hex::decode_to_slice(hex_digits, &mut bytes).ok()?;
    Some(bytes)
}

/// An element to write in a sync batch, with its artifacts.
pub struct ElementWrite {
    pub id: Uuid,
    pub name: String,
    pub version: String,
    pub hash: Option<String>,
    /// `Some` to store the manifest (COPY); `None` leaves it to be fetched.
    pub manifest: Option<String>,
    /// `Some` to replace the artifacts.
    pub artifacts: Option<Vec<(String, String, String)>>,
}

/// Inserts new elements and updates changed ones, all in one transaction.
pub async fn write_batch(
    db: &DatabaseConnection,
    repository_id: Uuid,
    inserts: Vec<ElementWrite>,
    updates: Vec<ElementWrite>,
) -> Result<(), DbErr> {
    let txn = db.begin().await?;
    let now = Utc::now();
    let mut artifact_rows = Vec::new();
    if !inserts.is_empty() {
        let mut rows = Vec::with_capacity(inserts.len());
        for write in inserts {
            if let Some(artifacts) = write.artifacts {
                artifact_rows.extend(artifacts.into_iter().map(|a| (write.id, a)));
            }
            rows.push(element::ActiveModel {
                id: Set(write.id),
                repository_id: Set(repository_id),
                name: Set(write.name),
                version: Set(write.version),
                inventory_hash: Set(write.hash),
                manifest: Set(write.manifest),
                status: Set(ElementStatus::New),
                status_message: Set(None),
                installed: Set(false),
                installed_at: Set(None),
                created_at: Set(now),
                updated_at: Set(now),
            });
        }
        // Keep each statement under SQLite's bound-parameter limit.
        for chunk in rows.chunks(500) {
            element::Entity::insert_many(chunk.to_vec())
                .exec(&txn)
                .await?;
        }
    }
    let updated: Vec<Uuid> = updates.iter().map(|w| w.id).collect();
    // A changed entry is judged again: what was found wrong with it goes.
    for chunk in updated.chunks(500) {
        invalid_element::Entity::delete_many()
            .filter(invalid_element::Column::ElementId.is_in(chunk.iter().copied()))
            .exec(&txn)
            .await?;
    }
    // Changed elements' artifacts are replaced: all of the batch's go in one
    // statement per 500, and the new ones are inserted with the new elements'.
    let replaced: Vec<Uuid> = updates
        .iter()
        .filter(|w| w.artifacts.is_some())
        .map(|w| w.id)
        .collect();
    for chunk in replaced.chunks(500) {
        artifact::Entity::delete_many()
            .filter(artifact::Column::ElementId.is_in(chunk.iter().copied()))
            .exec(&txn)
            .await?;
    }
    for write in updates {
        element::Entity::update_many()
            .col_expr(element::Column::InventoryHash, Expr::value(write.hash))
            .col_expr(element::Column::Manifest, Expr::value(write.manifest))
            .col_expr(element::Column::UpdatedAt, Expr::value(now))
            .filter(element::Column::Id.eq(write.id))
            .exec(&txn)
            .await?;
        if let Some(artifacts) = write.artifacts {
            artifact_rows.extend(artifacts.into_iter().map(|a| (write.id, a)));
        }
    }
    insert_artifacts(&txn, artifact_rows).await?;
    txn.commit().await
}

async fn insert_artifacts(
    db: &impl ConnectionTrait,
    rows: Vec<(Uuid, (String, String, String))>,
) -> Result<(), DbErr> {
    let models: Vec<artifact::ActiveModel> = rows
        .into_iter()
        .map(
            |(element_id, (urn, category, file_name))| artifact::ActiveModel {
                id: Set(Uuid::now_v7()),
                element_id: Set(element_id),
                urn: Set(urn),
                category: Set(category),
                file_name: Set(file_name),
            },
        )
        .collect();
    for chunk in models.chunks(500) {
        artifact::Entity::insert_many(chunk.to_vec())
            .on_conflict(
                OnConflict::columns([artifact::Column::ElementId, artifact::Column::Urn])
                    .update_columns([artifact::Column::Category, artifact::Column::FileName])
                    .to_owned(),
            )
            .exec(db)
            .await?;
    }
    Ok(())
}

async fn replace_artifacts_in(
    db: &impl ConnectionTrait,
    element_id: Uuid,
    artifacts: Vec<(String, String, String)>,
) -> Result<(), DbErr> {
    artifact::Entity::delete_many()
        .filter(artifact::Column::ElementId.eq(element_id))
        .exec(db)
        .await?;
    insert_artifacts(db, artifacts.into_iter().map(|a| (element_id, a)).collect()).await
}

/// Stores a fetched manifest (and artifacts, when given) in one transaction.
pub async fn store_manifest(
    db: &DatabaseConnection,
    element_id: Uuid,
    manifest: String,
    artifacts: Option<Vec<(String, String, String)>>,
) -> Result<(), DbErr> {
    let txn = db.begin().await?;
    element::Entity::update_many()
        .col_expr(element::Column::Manifest, Expr::value(Some(manifest)))
        .col_expr(element::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(element::Column::Id.eq(element_id))
        .exec(&txn)
        .await?;
    if let Some(artifacts) = artifacts {
        replace_artifacts_in(&txn, element_id, artifacts).await?;
    }
    invalid_element::Entity::delete_many()
        .filter(invalid_element::Column::ElementId.eq(element_id))
        .exec(&txn)
        .await?;
    txn.commit().await
}

/// A problem to record: with `element_id`, about that stored element.
pub struct InvalidWrite {
    pub element_id: Option<Uuid>,
    pub name: Option<String>,
    pub version: Option<String>,
    pub path: String,
    pub message: String,
}

fn invalid_model(repository_id: Uuid, write: InvalidWrite) -> invalid_element::ActiveModel {
    invalid_element::ActiveModel {
        id: Set(Uuid::now_v7()),
        repository_id: Set(repository_id),
        element_id: Set(write.element_id),
        name: Set(write.name),
        version: Set(write.version),
        path: Set(write.path),
        message: Set(write.message),
        created_at: Set(Utc::now()),
    }
}

/// Replaces what a sync found wrong with the listing itself (problems tied to
/// no stored element), in one transaction.
pub async fn replace_listing_problems(
    db: &DatabaseConnection,
    repository_id: Uuid,
    problems: Vec<InvalidWrite>,
) -> Result<(), DbErr> {
    let txn = db.begin().await?;
    invalid_element::Entity::delete_many()
        .filter(invalid_element::Column::RepositoryId.eq(repository_id))
        .filter(invalid_element::Column::ElementId.is_null())
        .exec(&txn)
        .await?;
    let models: Vec<_> = problems
        .into_iter()
        .map(|p| invalid_model(repository_id, p))
        .collect();
    for chunk in models.chunks(500) {
        invalid_element::Entity::insert_many(chunk.to_vec())
            .exec(&txn)
            .await?;
    }
    txn.commit().await
}

/// Records what is wrong with a stored element's manifest, replacing what
/// was recorded for it before.
pub async fn record_element_problem(
    db: &DatabaseConnection,
    repository_id: Uuid,
    problem: InvalidWrite,
) -> Result<(), DbErr> {
    let txn = db.begin().await?;
    if let Some(element_id) = problem.element_id {
        invalid_element::Entity::delete_many()
            .filter(invalid_element::Column::ElementId.eq(element_id))
            .exec(&txn)
            .await?;
    }
    invalid_model(repository_id, problem).insert(&txn).await?;
    txn.commit().await
}

pub async fn count_invalid(db: &DatabaseConnection, repository_id: Uuid) -> Result<u64, DbErr> {
    invalid_element::Entity::find()
        .filter(invalid_element::Column::RepositoryId.eq(repository_id))
        .count(db)
        .await
}

/// A page of a repository's invalid elements, by path, and how many in all.
pub async fn list_invalid(
    db: &DatabaseConnection,
    repository_id: Uuid,
    offset: u64,
    limit: u64,
) -> Result<(Vec<InvalidElementRow>, u64), DbErr> {
    let query = invalid_element::Entity::find()
        .filter(invalid_element::Column::RepositoryId.eq(repository_id));
    let total = query.clone().count(db).await?;
    let rows = query
        .order_by_asc(invalid_element::Column::Path)
        .order_by_asc(invalid_element::Column::Id)
        .offset(offset)
        .limit(limit)
        .all(db)
        .await?;
    Ok((rows, total))
}

/// Deletes elements by id, except installed ones; returns how many went.
pub async fn delete_elements(db: &DatabaseConnection, ids: &[Uuid]) -> Result<u64, DbErr> {
    let mut gone = 0;
    for chunk in ids.chunks(500) {
        gone += element::Entity::delete_many()
            .filter(element::Column::Id.is_in(chunk.iter().copied()))
            .filter(element::Column::Installed.eq(false))
            .exec(db)
            .await?
            .rows_affected;
    }
    Ok(gone)
}

pub async fn find_element(db: &DatabaseConnection, id: Uuid) -> Result<Option<ElementRow>, DbErr> {
    element::Entity::find_by_id(id).one(db).await
}

/// Filters for listing elements.
#[derive(Default)]
pub struct ElementFilter {
    pub name: Option<String>,
    pub repository_id: Option<Uuid>,
    pub installed: Option<bool>,
    pub search: Option<String>,
}

pub async fn list_elements(
    db: &DatabaseConnection,
    filter: &ElementFilter,
    offset: u64,
    limit: u64,
) -> Result<(Vec<ElementRow>, u64), DbErr> {
    let mut query = element::Entity::find();
    if let Some(name) = &filter.name {
        query = query.filter(element::Column::Name.eq(name.as_str()));
    }
    if let Some(repository_id) = filter.repository_id {
        query = query.filter(element::Column::RepositoryId.eq(repository_id));
    }
    if let Some(installed) = filter.installed {
        query = query.filter(element::Column::Installed.eq(installed));
    }
    if let Some(search) = &filter.search {
        // `%` and `_` in the search act as wildcards, as in SQL; harmless.
        let pattern = format!("%{search}%");
        query = query.filter(element::Column::Name.like(pattern));
    }
    let total = query.clone().count(db).await?;
    let rows = query
        .order_by_asc(element::Column::Name)
        .order_by_asc(element::Column::CreatedAt)
        .order_by_asc(element::Column::Id)
        .offset(offset)
        .limit(limit)
        .all(db)
        .await?;
    Ok((rows, total))
}

/// Every element with one of these names, across repositories.
pub async fn elements_named(
    db: &DatabaseConnection,
    names: &[String],
) -> Result<Vec<ElementRow>, DbErr> {
    super::find_in::<element::Entity, _>(db, element::Column::Name, names).await
}

pub async fn repository_priorities(db: &DatabaseConnection) -> Result<HashMap<Uuid, i32>, DbErr> {
    let rows: Vec<(Uuid, i32)> = repository::Entity::find()
        .select_only()
        .columns([repository::Column::Id, repository::Column::Priority])
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows.into_iter().collect())
}

pub async fn artifacts_of(
    db: &DatabaseConnection,
    element_id: Uuid,
) -> Result<Vec<ArtifactRow>, DbErr> {
    artifact::Entity::find()
        .filter(artifact::Column::ElementId.eq(element_id))
        .order_by_asc(artifact::Column::Urn)
        .all(db)
        .await
}

/// Ids of what `element_id` is bound to depend on (transitively).
pub async fn dependencies_of(
    db: &DatabaseConnection,
    element_id: Uuid,
) -> Result<Vec<Uuid>, DbErr> {
    element_binding::Entity::find()
        .filter(element_binding::Column::ElementId.eq(element_id))
        .all(db)
        .await
        .map(|rows| rows.into_iter().map(|r| r.depends_on_id).collect())
}

/// Ids of the elements bound to depend on `element_id` (transitively).
pub async fn dependents_of(db: &DatabaseConnection, element_id: Uuid) -> Result<Vec<Uuid>, DbErr> {
    element_binding::Entity::find()
        .filter(element_binding::Column::DependsOnId.eq(element_id))
        .all(db)
        .await
        .map(|rows| rows.into_iter().map(|r| r.element_id).collect())
}

pub async fn elements_by_ids(
    db: &DatabaseConnection,
    ids: &[Uuid],
) -> Result<Vec<ElementRow>, DbErr> {
    element::Entity::find()
        .filter(element::Column::Id.is_in(ids.iter().copied()))
        .order_by_asc(element::Column::Name)
        .all(db)
        .await
}

/// An install, as one transaction: each element in `activate` becomes installed
/// and ACTIVE; `release` (an upgrade's old version) stops being installed in the
/// same commit; bindings are added, and `rebind` moves bindings from one element
/// to another.
pub struct InstallTxn {
    pub activate: Vec<Uuid>,
    pub release: Option<Uuid>,
    pub bindings: Vec<(Uuid, Uuid)>,
    pub rebind: Option<(Uuid, Uuid)>,
}

pub async fn commit_install(db: &DatabaseConnection, plan: InstallTxn) -> Result<(), DbErr> {
    let txn = db.begin().await?;
    let now = Utc::now();
    if let Some(old) = plan.release {
        element::Entity::update_many()
            .col_expr(element::Column::Installed, Expr::value(false))
            .col_expr(
                element::Column::InstalledAt,
                Expr::value(Option::<DateTime<Utc>>::None),
            )
            .col_expr(element::Column::Status, Expr::value(ElementStatus::New))
            .col_expr(element::Column::UpdatedAt, Expr::value(now))
            .filter(element::Column::Id.eq(old))
            .exec(&txn)
            .await?;
        element_binding::Entity::delete_many()
            .filter(element_binding::Column::ElementId.eq(old))
            .exec(&txn)
            .await?;
    }
    if let Some((from, to)) = plan.rebind {
        element_binding::Entity::update_many()
            .col_expr(element_binding::Column::DependsOnId, Expr::value(to))
            .filter(element_binding::Column::DependsOnId.eq(from))
            .exec(&txn)
            .await?;
    }
    if !plan.activate.is_empty() {
        element::Entity::update_many()
            .col_expr(element::Column::Installed, Expr::value(true))
            .col_expr(element::Column::InstalledAt, Expr::value(Some(now)))
            .col_expr(element::Column::Status, Expr::value(ElementStatus::Active))
            .col_expr(
                element::Column::StatusMessage,
                Expr::value(Option::<String>::None),
            )
            .col_expr(element::Column::UpdatedAt, Expr::value(now))
            .filter(element::Column::Id.is_in(plan.activate.iter().copied()))
            .exec(&txn)
            .await?;
    }
    let rows: Vec<element_binding::ActiveModel> = plan
        .bindings
        .into_iter()
        .map(|(element_id, depends_on_id)| element_binding::ActiveModel {
            element_id: Set(element_id),
            depends_on_id: Set(depends_on_id),
        })
        .collect();
    for chunk in rows.chunks(500) {
        element_binding::Entity::insert_many(chunk.to_vec())
            .on_conflict_do_nothing_on([
                element_binding::Column::ElementId,
                element_binding::Column::DependsOnId,
            ])
            .exec(&txn)
            .await?;
    }
    txn.commit().await
}

pub async fn set_element_status(
    db: &DatabaseConnection,
    ids: &[Uuid],
    status: ElementStatus,
    message: Option<String>,
) -> Result<(), DbErr> {
    element::Entity::update_many()
        .col_expr(element::Column::Status, Expr::value(status))
        .col_expr(element::Column::StatusMessage, Expr::value(message))
        .col_expr(element::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(element::Column::Id.is_in(ids.iter().copied()))
        .exec(db)
        .await
        .map(drop)
}

/// Uninstalls one element and drops its own bindings, in one transaction.
pub async fn commit_uninstall(db: &DatabaseConnection, id: Uuid) -> Result<(), DbErr> {
    let txn = db.begin().await?;
    element_binding::Entity::delete_many()
        .filter(element_binding::Column::ElementId.eq(id))
        .exec(&txn)
        .await?;
    element::Entity::update_many()
        .col_expr(element::Column::Installed, Expr::value(false))
        .col_expr(
            element::Column::InstalledAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(element::Column::Status, Expr::value(ElementStatus::New))
        .col_expr(element::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(element::Column::Id.eq(id))
        .exec(&txn)
        .await?;
    txn.commit().await
}

/// Inserts one element (uploads), with its manifest.
pub async fn insert_element(
    db: &DatabaseConnection,
    repository_id: Uuid,
    write: ElementWrite,
) -> Result<(), DbErr> {
    write_batch(db, repository_id, vec![write], Vec::new()).await
}
