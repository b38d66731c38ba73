//! What a repository's sync could not take as an element (a bad inventory
//! entry, a bad manifest file), with the reason: a bad element no longer fails
//! the whole repository, it is listed here. Rows tied to an element (a listed
//! element whose manifest is bad) go with the element.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(InvalidElements::Table)
                    .col(pk_uuid(InvalidElements::Id))
                    .col(uuid(InvalidElements::RepositoryId))
                    .col(uuid_null(InvalidElements::ElementId))
                    .col(string_null(InvalidElements::Name))
                    .col(string_null(InvalidElements::Version))
                    .col(text(InvalidElements::Path))
                    .col(text(InvalidElements::Message))
                    .col(timestamp_with_time_zone(InvalidElements::CreatedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_invalid_elements_repository")
                            .from(InvalidElements::Table, InvalidElements::RepositoryId)
                            .to(Repositories::Table, Repositories::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_invalid_elements_element")
                            .from(InvalidElements::Table, InvalidElements::ElementId)
                            .to(Elements::Table, Elements::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_invalid_elements_repository")
                    .table(InvalidElements::Table)
                    .col(InvalidElements::RepositoryId)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_invalid_elements_element")
                    .table(InvalidElements::Table)
                    .col(InvalidElements::ElementId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(InvalidElements::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum InvalidElements {
    Table,
    Id,
    RepositoryId,
    ElementId,
    Name,
    Version,
    Path,
    Message,
    CreatedAt,
}

#[derive(DeriveIden)]
enum Repositories {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum Elements {
    Table,
    Id,
}
