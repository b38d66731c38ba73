//! Users and their tokens. `role` is a plain string column so roles and project
//! membership can grow without rewriting this table.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Users::Table)
                    .col(pk_uuid(Users::Id))
                    .col(string_uniq(Users::Username))
                    .col(string_null(Users::PasswordHash))
                    .col(string(Users::Role))
                    .col(boolean(Users::Disabled).default(false))
                    .col(timestamp_with_time_zone(Users::CreatedAt))
                    .col(timestamp_with_time_zone(Users::UpdatedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(ApiTokens::Table)
                    .col(pk_uuid(ApiTokens::Id))
                    .col(uuid(ApiTokens::UserId))
                    .col(string(ApiTokens::Kind))
                    .col(string(ApiTokens::Name))
                    .col(string_uniq(ApiTokens::TokenHash))
                    .col(timestamp_with_time_zone(ApiTokens::CreatedAt))
                    .col(timestamp_with_time_zone_null(ApiTokens::ExpiresAt))
                    .col(timestamp_with_time_zone_null(ApiTokens::LastUsedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_api_tokens_user")
                            .from(ApiTokens::Table, ApiTokens::UserId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_api_tokens_user")
                    .table(ApiTokens::Table)
                    .col(ApiTokens::UserId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(ApiTokens::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Users::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
    Username,
    PasswordHash,
    Role,
    Disabled,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum ApiTokens {
    Table,
    Id,
    UserId,
    Kind,
    Name,
    TokenHash,
    CreatedAt,
    ExpiresAt,
    LastUsedAt,
}
