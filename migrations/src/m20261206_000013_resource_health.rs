//! Live health (issue 37): `resource_health` holds what Corbel last learned
//! of each deployed resource's health (HEALTHY, DEGRADED, DOWN, UNKNOWN), why,
//! and since when; how often it was restarted, and its restart window; the
//! keys whose observed config differs from the deployed one. A node's row
//! goes with the node. `deployments.health` is its nodes' health rolled up.
//! Health is an axis of its own: no state column changes meaning.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(ResourceHealth::Table)
                    .col(pk_uuid(ResourceHealth::NodeId))
                    .col(uuid(ResourceHealth::DeploymentId))
                    .col(string(ResourceHealth::Health))
                    .col(string_null(ResourceHealth::Reason))
                    .col(timestamp_with_time_zone(ResourceHealth::ChangedAt))
                    .col(timestamp_with_time_zone(ResourceHealth::NodeUpdatedAt))
                    .col(integer(ResourceHealth::Restarts).default(0))
                    .col(timestamp_with_time_zone_null(ResourceHealth::WindowFrom))
                    .col(integer(ResourceHealth::WindowRestarts).default(0))
                    .col(timestamp_with_time_zone_null(ResourceHealth::NextRestartAt))
                    .col(boolean(ResourceHealth::GaveUp).default(false))
                    .col(string_null(ResourceHealth::Drift))
                    .foreign_key(
                        ForeignKey::create()
                            .from(ResourceHealth::Table, ResourceHealth::NodeId)
                            .to(DeploymentNodes::Table, DeploymentNodes::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("resource_health_deployment")
                    .table(ResourceHealth::Table)
                    .col(ResourceHealth::DeploymentId)
                    .to_owned(),
            )
            .await?;
        // The healer asks for the earliest booked restart and those due.
        manager
            .create_index(
                Index::create()
                    .name("resource_health_next_restart")
                    .table(ResourceHealth::Table)
                    .col(ResourceHealth::NextRestartAt)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Deployments::Table)
                    .add_column(string(Deployments::Health).default("UNKNOWN"))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Deployments::Table)
                    .add_column(timestamp_with_time_zone_null(Deployments::HealthChangedAt))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [Deployments::Health, Deployments::HealthChangedAt] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Deployments::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        manager
            .drop_table(Table::drop().table(ResourceHealth::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum ResourceHealth {
    Table,
    NodeId,
    DeploymentId,
    Health,
    Reason,
    ChangedAt,
    NodeUpdatedAt,
    Restarts,
    WindowFrom,
    WindowRestarts,
    NextRestartAt,
    GaveUp,
    Drift,
}

#[derive(DeriveIden)]
enum DeploymentNodes {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum Deployments {
    Table,
    Health,
    HealthChangedAt,
}
