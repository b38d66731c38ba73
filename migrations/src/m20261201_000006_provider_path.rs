//! A provider may live in a subdirectory of its repository (a monorepo):
//! `path` is where its `corbel-provider.yaml` is, relative to the repository's
//! root; empty is the root.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Providers::Table)
                    .add_column(string(Providers::SourcePath).default(""))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Providers::Table)
                    .drop_column(Providers::SourcePath)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Providers {
    Table,
    SourcePath,
}
