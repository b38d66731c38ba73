//! Who did what: `audit_log` records every mutation (who, in which project,
//! what, when, its outcome and its arguments with secrets hidden). And what a
//! resource counts against its project's named quotas: `deployment_nodes.quota`
//! holds the quantities its provider described (`DescribeResources`), a JSON
//! object of name to amount, summed per project when a plan is checked.
//! And a blueprint's name is unique in its project, not across the server:
//! two teams may each have a `web`, and a name taken elsewhere tells an
//! outsider nothing.

use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};
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
            .await?;
        blueprint_names_per_project(manager).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // Not made unique across the server again: two projects may hold
        // the same name by now.
        manager
            .drop_index(
                Index::drop()
                    .name("uq_blueprints_project_name")
                    .table(Blueprints::Table)
                    .to_owned(),
            )
            .await?;
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

/// Drops the server-wide unique constraint on `blueprints.name` for one on
/// (`project_id`, `name`). PostgreSQL drops the constraint; SQLite cannot, so
/// the table is made again with the same columns and its rows copied (no
/// foreign key points at it).
async fn blueprint_names_per_project(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    let db = manager.get_connection();
    match manager.get_database_backend() {
        DbBackend::Postgres => {
            db.execute_unprepared(
                "ALTER TABLE blueprints DROP CONSTRAINT IF EXISTS blueprints_name_key",
            )
            .await?;
        }
        _ => {
            // The columns as migrations 4 and 8 made them; one call, so one
            // connection of the pool runs them all, in order.
            db.execute_unprepared(
                "CREATE TABLE \"blueprints_new\" ( \"id\" uuid_text NOT NULL PRIMARY KEY, \
                 \"name\" varchar NOT NULL, \"description\" text NULL, \"source\" text NOT NULL, \
                 \"created_at\" timestamp_with_timezone_text NOT NULL, \
                 \"updated_at\" timestamp_with_timezone_text NOT NULL, \"project_id\" uuid_text NULL ); \
                 INSERT INTO \"blueprints_new\" (id, name, description, source, created_at, updated_at, project_id) \
                 SELECT id, name, description, source, created_at, updated_at, project_id FROM \"blueprints\"; \
                 DROP TABLE \"blueprints\"; \
                 ALTER TABLE \"blueprints_new\" RENAME TO \"blueprints\"; \
                 CREATE INDEX \"idx_blueprints_project\" ON \"blueprints\" (\"project_id\");",
            )
            .await?;
        }
    }
    manager
        .create_index(
            Index::create()
                .name("uq_blueprints_project_name")
                .table(Blueprints::Table)
                .col(Blueprints::ProjectId)
                .col(Blueprints::Name)
                .unique()
                .to_owned(),
        )
        .await
}

#[derive(DeriveIden)]
enum Blueprints {
    Table,
    Name,
    ProjectId,
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
