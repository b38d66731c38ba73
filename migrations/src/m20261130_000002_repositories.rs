//! Repositories, their elements and artifacts, and the transitive dependency
//! bindings that keep an installed element from being removed under a dependent.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        create_repositories(manager).await?;
        create_elements(manager).await?;
        create_artifacts(manager).await?;
        create_bindings(manager).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            ElementBindings::Table.into_iden(),
            Artifacts::Table.into_iden(),
            Elements::Table.into_iden(),
            Repositories::Table.into_iden(),
        ] {
            manager
                .drop_table(Table::drop().table(table).to_owned())
                .await?;
        }
        Ok(())
    }
}

/// The repositories, with what their last sync saw and stored.
async fn create_repositories(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    manager
        .create_table(
            Table::create()
                .table(Repositories::Table)
                .col(pk_uuid(Repositories::Id))
                .col(string_uniq(Repositories::Name))
                .col(string(Repositories::DriverKind))
                .col(text(Repositories::DriverSpec))
                .col(string(Repositories::SyncMode))
                .col(integer(Repositories::Priority))
                .col(big_integer(Repositories::RefreshIntervalSeconds))
                .col(string(Repositories::Status))
                .col(text_null(Repositories::StatusMessage))
                .col(big_integer(Repositories::ElementsSeen).default(0))
                .col(big_integer(Repositories::ElementsStored).default(0))
                .col(timestamp_with_time_zone_null(Repositories::LastSyncedAt))
                .col(timestamp_with_time_zone_null(Repositories::NextRefreshAt))
                .col(timestamp_with_time_zone(Repositories::CreatedAt))
                .col(timestamp_with_time_zone(Repositories::UpdatedAt))
                .to_owned(),
        )
        .await
}

/// The elements of each repository, one row per version, with one
/// installed version per name at most.
async fn create_elements(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    manager
        .create_table(
            Table::create()
                .table(Elements::Table)
                .col(pk_uuid(Elements::Id))
                .col(uuid(Elements::RepositoryId))
                .col(string(Elements::Name))
                .col(string(Elements::Version))
                .col(string_null(Elements::InventoryHash))
                .col(text_null(Elements::Manifest))
                .col(string(Elements::Status))
                .col(text_null(Elements::StatusMessage))
                .col(boolean(Elements::Installed).default(false))
                .col(timestamp_with_time_zone_null(Elements::InstalledAt))
                .col(timestamp_with_time_zone(Elements::CreatedAt))
                .col(timestamp_with_time_zone(Elements::UpdatedAt))
                .foreign_key(
                    ForeignKey::create()
                        .name("fk_elements_repository")
                        .from(Elements::Table, Elements::RepositoryId)
                        .to(Repositories::Table, Repositories::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;
    manager
        .create_index(
            Index::create()
                .name("uq_elements_repository_name_version")
                .table(Elements::Table)
                .col(Elements::RepositoryId)
                .col(Elements::Name)
                .col(Elements::Version)
                .unique()
                .to_owned(),
        )
        .await?;
    manager
        .create_index(
            Index::create()
                .name("idx_elements_name")
                .table(Elements::Table)
                .col(Elements::Name)
                .to_owned(),
        )
        .await?;
    // One installed version per name, enforced by the store itself (a partial
    // unique index, which SQLite and PostgreSQL both have).
    manager
        .get_connection()
        .execute_unprepared(
            "CREATE UNIQUE INDEX uq_elements_installed_name ON elements (name) WHERE installed",
        )
        .await?;
    Ok(())
}

/// The artifacts each element lists.
async fn create_artifacts(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    manager
        .create_table(
            Table::create()
                .table(Artifacts::Table)
                .col(pk_uuid(Artifacts::Id))
                .col(uuid(Artifacts::ElementId))
                .col(string(Artifacts::Urn))
                .col(string(Artifacts::Category))
                .col(string(Artifacts::FileName))
                .foreign_key(
                    ForeignKey::create()
                        .name("fk_artifacts_element")
                        .from(Artifacts::Table, Artifacts::ElementId)
                        .to(Elements::Table, Elements::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;
    manager
        .create_index(
            Index::create()
                .name("uq_artifacts_element_urn")
                .table(Artifacts::Table)
                .col(Artifacts::ElementId)
                .col(Artifacts::Urn)
                .unique()
                .to_owned(),
        )
        .await
}

/// What each installed element depends on, directly or not: a dependency
/// bound so cannot be deleted.
async fn create_bindings(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    manager
        .create_table(
            Table::create()
                .table(ElementBindings::Table)
                .col(uuid(ElementBindings::ElementId))
                .col(uuid(ElementBindings::DependsOnId))
                .primary_key(
                    Index::create()
                        .col(ElementBindings::ElementId)
                        .col(ElementBindings::DependsOnId),
                )
                .foreign_key(
                    ForeignKey::create()
                        .name("fk_bindings_element")
                        .from(ElementBindings::Table, ElementBindings::ElementId)
                        .to(Elements::Table, Elements::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .foreign_key(
                    ForeignKey::create()
                        .name("fk_bindings_depends_on")
                        .from(ElementBindings::Table, ElementBindings::DependsOnId)
                        .to(Elements::Table, Elements::Id)
                        .on_delete(ForeignKeyAction::Restrict),
                )
                .to_owned(),
        )
        .await?;
    manager
        .create_index(
            Index::create()
                .name("idx_bindings_depends_on")
                .table(ElementBindings::Table)
                .col(ElementBindings::DependsOnId)
                .to_owned(),
        )
        .await
}

#[derive(DeriveIden)]
enum Repositories {
    Table,
    Id,
    Name,
    DriverKind,
    DriverSpec,
    SyncMode,
    Priority,
    RefreshIntervalSeconds,
    Status,
    StatusMessage,
    ElementsSeen,
    ElementsStored,
    LastSyncedAt,
    NextRefreshAt,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Elements {
    Table,
    Id,
    RepositoryId,
    Name,
    Version,
    InventoryHash,
    Manifest,
    Status,
    StatusMessage,
    Installed,
    InstalledAt,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Artifacts {
    Table,
    Id,
    ElementId,
    Urn,
    Category,
    FileName,
}

#[derive(DeriveIden)]
enum ElementBindings {
    Table,
    ElementId,
    DependsOnId,
}
