//! A deployment remembers the operation under way (deploy, rollback, destroy)
//! and its id across restarts, so an interrupted run resumes as what it was,
//! and a rollback after a crash finds everything its operation created,
//! before the crash included.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite takes one column per ALTER TABLE.
        manager
            .alter_table(
                Table::alter()
                    .table(Deployments::Table)
                    .add_column(uuid_null(Deployments::OperationId))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Deployments::Table)
                    .add_column(string_null(Deployments::Phase))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_journal_node")
                    .table(Journal::Table)
                    .col(Journal::NodeId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(Index::drop().name("idx_journal_node").to_owned())
            .await?;
        for column in [Deployments::Phase, Deployments::OperationId] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Deployments::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Deployments {
    Table,
    OperationId,
    Phase,
}

#[derive(DeriveIden)]
enum Journal {
    Table,
    NodeId,
}
