//! Blueprints, deployments, their resource nodes, the journal of provider calls
//! in flight, and each deployment's event history.
//!
//! The journal is the crash-safety mechanism: an entry is written in the same
//! transaction as the node state that announces a provider call, and deleted in
//! the transaction that stores the call's result. What is left in it at start is
//! exactly what a crash interrupted.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        create_blueprints(manager).await?;
        create_deployments(manager).await?;
        create_nodes(manager).await?;
        create_journal(manager).await?;
        create_events(manager).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            DeploymentEvents::Table.into_iden(),
            Journal::Table.into_iden(),
            DeploymentNodes::Table.into_iden(),
            Deployments::Table.into_iden(),
            Blueprints::Table.into_iden(),
        ] {
            manager
                .drop_table(Table::drop().table(table).to_owned())
                .await?;
        }
        Ok(())
    }
}

/// The blueprints, by name.
async fn create_blueprints(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    manager
        .create_table(
            Table::create()
                .table(Blueprints::Table)
                .col(pk_uuid(Blueprints::Id))
                .col(string_uniq(Blueprints::Name))
                .col(text_null(Blueprints::Description))
                .col(text(Blueprints::Source))
                .col(timestamp_with_time_zone(Blueprints::CreatedAt))
                .col(timestamp_with_time_zone(Blueprints::UpdatedAt))
                .to_owned(),
        )
        .await
}

/// The deployments, each of a blueprint or an element.
async fn create_deployments(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    manager
        .create_table(
            Table::create()
                .table(Deployments::Table)
                .col(pk_uuid(Deployments::Id))
                .col(string(Deployments::Name))
                // Not a foreign key: destroyed deployments outlive their
                // blueprint; live ones keep it from being deleted (in code).
                .col(uuid_null(Deployments::BlueprintId))
                .col(uuid_null(Deployments::ElementId))
                .col(text(Deployments::Source))
                .col(text(Deployments::Variables))
                .col(string(Deployments::State))
                .col(string(Deployments::OnFailure))
                .col(text_null(Deployments::Error))
                .col(timestamp_with_time_zone_null(Deployments::ExpiresAt))
                .col(timestamp_with_time_zone(Deployments::CreatedAt))
                .col(timestamp_with_time_zone(Deployments::UpdatedAt))
                .to_owned(),
        )
        .await?;
    manager
        .create_index(
            Index::create()
                .name("idx_deployments_blueprint")
                .table(Deployments::Table)
                .col(Deployments::BlueprintId)
                .to_owned(),
        )
        .await
}

/// The resource nodes of each deployment, one per key and replica.
async fn create_nodes(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    manager
        .create_table(
            Table::create()
                .table(DeploymentNodes::Table)
                .col(pk_uuid(DeploymentNodes::Id))
                .col(uuid(DeploymentNodes::DeploymentId))
                .col(string(DeploymentNodes::Key))
                .col(integer(DeploymentNodes::Replica))
                .col(string(DeploymentNodes::ResourceType))
                .col(uuid_null(DeploymentNodes::ProviderId))
                .col(string_null(DeploymentNodes::Node))
                .col(string(DeploymentNodes::State))
                .col(text_null(DeploymentNodes::Config))
                .col(text_null(DeploymentNodes::Outputs))
                .col(text_null(DeploymentNodes::Error))
                // The run that created the resource: rollback destroys
                // what this run created, nothing older.
                .col(uuid_null(DeploymentNodes::RunId))
                .col(timestamp_with_time_zone(DeploymentNodes::UpdatedAt))
                .foreign_key(
                    ForeignKey::create()
                        .name("fk_deployment_nodes_deployment")
                        .from(DeploymentNodes::Table, DeploymentNodes::DeploymentId)
                        .to(Deployments::Table, Deployments::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;
    manager
        .create_index(
            Index::create()
                .name("uq_deployment_nodes_key_replica")
                .table(DeploymentNodes::Table)
                .col(DeploymentNodes::DeploymentId)
                .col(DeploymentNodes::Key)
                .col(DeploymentNodes::Replica)
                .unique()
                .to_owned(),
        )
        .await?;
    manager
        .create_index(
            Index::create()
                .name("idx_deployment_nodes_placement")
                .table(DeploymentNodes::Table)
                .col(DeploymentNodes::ProviderId)
                .col(DeploymentNodes::Node)
                .to_owned(),
        )
        .await
}

/// The journal of provider calls in flight.
async fn create_journal(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    manager
        .create_table(
            Table::create()
                .table(Journal::Table)
                .col(pk_uuid(Journal::Id))
                .col(uuid(Journal::DeploymentId))
                .col(uuid(Journal::NodeId))
                .col(uuid(Journal::ProviderId))
                .col(string(Journal::Intent))
                .col(timestamp_with_time_zone(Journal::CreatedAt))
                .foreign_key(
                    ForeignKey::create()
                        .name("fk_journal_node")
                        .from(Journal::Table, Journal::NodeId)
                        .to(DeploymentNodes::Table, DeploymentNodes::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await
}

/// Each deployment's event history, in order.
async fn create_events(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    manager
        .create_table(
            Table::create()
                .table(DeploymentEvents::Table)
                .col(pk_auto(DeploymentEvents::Id).big_integer())
                .col(uuid(DeploymentEvents::DeploymentId))
                .col(timestamp_with_time_zone(DeploymentEvents::At))
                .col(string(DeploymentEvents::Kind))
                .col(string_null(DeploymentEvents::NodeKey))
                .col(string_null(DeploymentEvents::State))
                .col(text(DeploymentEvents::Message))
                .foreign_key(
                    ForeignKey::create()
                        .name("fk_deployment_events_deployment")
                        .from(DeploymentEvents::Table, DeploymentEvents::DeploymentId)
                        .to(Deployments::Table, Deployments::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;
    manager
        .create_index(
            Index::create()
                .name("idx_deployment_events_deployment")
                .table(DeploymentEvents::Table)
                .col(DeploymentEvents::DeploymentId)
                .col(DeploymentEvents::Id)
                .to_owned(),
        )
        .await
}

#[derive(DeriveIden)]
enum Blueprints {
    Table,
    Id,
    Name,
    Description,
    Source,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Deployments {
    Table,
    Id,
    Name,
    BlueprintId,
    ElementId,
    Source,
    Variables,
    State,
    OnFailure,
    Error,
    ExpiresAt,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum DeploymentNodes {
    Table,
    Id,
    DeploymentId,
    Key,
    Replica,
    ResourceType,
    ProviderId,
    Node,
    State,
    Config,
    Outputs,
    Error,
    RunId,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Journal {
    Table,
    Id,
    DeploymentId,
    NodeId,
    ProviderId,
    Intent,
    CreatedAt,
}

#[derive(DeriveIden)]
enum DeploymentEvents {
    Table,
    Id,
    DeploymentId,
    At,
    Kind,
    NodeKey,
    State,
    Message,
}
