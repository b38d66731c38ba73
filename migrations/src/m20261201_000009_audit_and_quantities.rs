//! Who did what: `audit_log` records every mutation (who, in which project,
//! what, when, its outcome and its arguments with secrets hidden). And what a
//! resource counts against its project's named quotas: `deployment_nodes.quota`
//! holds the quantities its provider described (`DescribeResources`), a JSON
//! object of name to amount, summed per project when a plan is checked.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(AuditLog::Table)
                    // UUID v7: ordered by time, the key of the log's pages.
                    .col(pk_uuid(AuditLog::Id))
                    .col(timestamp_with_time_zone(AuditLog::At))
                    // The user's id and name as they were: the entry outlives
                    // the user (no foreign key).
                    .col(uuid_null(AuditLog::UserId))
                    .col(string_null(AuditLog::Username))
                    .col(uuid_null(AuditLog::ProjectId))
                    .col(string(AuditLog::Action))
                    .col(text(AuditLog::Arguments))
                    // `OK`, or the error's code (`FORBIDDEN`, `NOT_FOUND`…).
                    .col(string(AuditLog::Outcome))
                    .col(text_null(AuditLog::Error))
                    .col(big_integer(AuditLog::DurationMicros))
                    .col(string_null(AuditLog::Address))
                    .to_owned(),
            )
            .await?;
        for (name, column) in [
            ("idx_audit_log_at", AuditLog::At),
            ("idx_audit_log_user", AuditLog::UserId),
            ("idx_audit_log_project", AuditLog::ProjectId),
            ("idx_audit_log_action", AuditLog::Action),
        ] {
            manager
                .create_index(
                    Index::create()
                        .name(name)
                        .table(AuditLog::Table)
                        .col(column)
                        .to_owned(),
                )
                .await?;
        }
        manager
            .alter_table(
                Table::alter()
                    .table(DeploymentNodes::Table)
                    .add_column(text_null(DeploymentNodes::Quota))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(DeploymentNodes::Table)
                    .drop_column(DeploymentNodes::Quota)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(AuditLog::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum AuditLog {
    Table,
    Id,
    At,
    UserId,
    Username,
    ProjectId,
    Action,
    Arguments,
    Outcome,
    Error,
    DurationMicros,
    Address,
}

#[derive(DeriveIden)]
enum DeploymentNodes {
    Table,
    Quota,
}
