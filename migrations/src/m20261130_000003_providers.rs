//! Providers: plugin programs fetched from git and run by Corbel.
//!
//! The registration token is stored only as a SHA-256 hash; the configuration is
//! split into plain values (shown by the API) and secret values (sent to the
//! provider, never shown).

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Providers::Table)
                    .col(pk_uuid(Providers::Id))
                    .col(string_uniq(Providers::Name))
                    .col(text(Providers::GitUrl))
                    .col(string(Providers::GitRef))
                    .col(text(Providers::Config))
                    .col(text(Providers::SecretConfig))
                    .col(boolean(Providers::AutoLoad))
                    .col(string(Providers::TokenHash))
                    .col(string(Providers::Status))
                    .col(text_null(Providers::StatusMessage))
                    .col(string_null(Providers::ResolvedCommit))
                    .col(text_null(Providers::Metadata))
                    .col(text(Providers::Features))
                    .col(text(Providers::ResourceTypes))
                    .col(integer(Providers::Restarts).default(0))
                    .col(timestamp_with_time_zone_null(Providers::LastSeenAt))
                    .col(timestamp_with_time_zone(Providers::CreatedAt))
                    .col(timestamp_with_time_zone(Providers::UpdatedAt))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Providers::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Providers {
    Table,
    Id,
    Name,
    GitUrl,
    GitRef,
    Config,
    SecretConfig,
    AutoLoad,
    TokenHash,
    Status,
    StatusMessage,
    ResolvedCommit,
    Metadata,
    Features,
    ResourceTypes,
    Restarts,
    LastSeenAt,
    CreatedAt,
    UpdatedAt,
}
