//! What replicas must share (issue 40): each replica records the id of the
//! secret key it runs with and the provider state directory it uses, so a
//! replica that joins with another key or another directory is refused at
//! start, naming both, and `replicas` shows each one's key.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column a statement: SQLite alters one at a time.
        for column in [Replicas::KeyId, Replicas::StateDir] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Replicas::Table)
                        .add_column(string_null(column))
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [Replicas::KeyId, Replicas::StateDir] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Replicas::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden, Clone, Copy)]
enum Replicas {
    Table,
    KeyId,
    StateDir,
}
