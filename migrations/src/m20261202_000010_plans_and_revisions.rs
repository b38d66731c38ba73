//! Changing what runs: `deployment_plans` holds a plan (what applying a
//! blueprint and variables to a deployment would create, update, replace,
//! destroy or keep, and the state it was computed against, so a plan the
//! deployment moved away from is refused); `deployment_revisions` holds what
//! every deploy and apply asked for (blueprint source, variables, who, when,
//! outcome), numbered per deployment, for rollback. And a node has a
//! `generation`: a replacement made before the node it replaces is gone has
//! the same key and replica and the next generation, so
//! (deployment, key, replica) is unique per generation.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        create_plans(manager).await?;
        create_revisions(manager).await?;
        add_generations(manager).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("uq_deployment_nodes_key_replica_generation")
                    .table(DeploymentNodes::Table)
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
            .alter_table(
                Table::alter()
                    .table(DeploymentNodes::Table)
                    .drop_column(DeploymentNodes::Generation)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(DeploymentRevisions::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(DeploymentPlans::Table).to_owned())
            .await
    }
}

/// The plans, each against the deployment it changes.
async fn create_plans(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    manager
        .create_table(
            Table::create()
                .table(DeploymentPlans::Table)
                .col(pk_uuid(DeploymentPlans::Id))
                .col(uuid(DeploymentPlans::DeploymentId))
                .col(timestamp_with_time_zone(DeploymentPlans::CreatedAt))
                .col(string_null(DeploymentPlans::CreatedBy))
                .col(uuid_null(DeploymentPlans::BlueprintId))
                // What is asked: the blueprint's YAML and the bound
                // variables (JSON).
                .col(text(DeploymentPlans::Source))
                .col(text(DeploymentPlans::Variables))
                // What runs now, as the plan saw it: the deployment's
                // source and variables, and a fingerprint of its nodes.
                .col(text(DeploymentPlans::BaseSource))
                .col(text(DeploymentPlans::BaseVariables))
                .col(text(DeploymentPlans::Basis))
                // The changes, JSON.
                .col(text(DeploymentPlans::Changes))
                // `PENDING`, `APPLIED`.
                .col(string(DeploymentPlans::State))
                .col(timestamp_with_time_zone_null(DeploymentPlans::AppliedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(DeploymentPlans::Table, DeploymentPlans::DeploymentId)
                        .to(Deployments::Table, Deployments::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;
    manager
        .create_index(
            Index::create()
                .name("idx_deployment_plans_deployment")
                .table(DeploymentPlans::Table)
                .col(DeploymentPlans::DeploymentId)
                .to_owned(),
        )
        .await
}

/// The revisions, numbered per deployment.
async fn create_revisions(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    manager
        .create_table(
            Table::create()
                .table(DeploymentRevisions::Table)
                .col(pk_uuid(DeploymentRevisions::Id))
                .col(uuid(DeploymentRevisions::DeploymentId))
                .col(integer(DeploymentRevisions::Number))
                // `DEPLOY`, `APPLY`, `ROLLBACK`.
                .col(string(DeploymentRevisions::Kind))
                .col(text(DeploymentRevisions::Source))
                .col(text(DeploymentRevisions::Variables))
                .col(uuid_null(DeploymentRevisions::BlueprintId))
                .col(uuid_null(DeploymentRevisions::PlanId))
                // The operation that made it: its outcome is that
                // operation's.
                .col(uuid_null(DeploymentRevisions::OperationId))
                .col(string_null(DeploymentRevisions::CreatedBy))
                .col(timestamp_with_time_zone(DeploymentRevisions::CreatedAt))
                // `IN_PROGRESS`, `COMPLETE`, `FAILED`.
                .col(string(DeploymentRevisions::Outcome))
                .col(text_null(DeploymentRevisions::Error))
                .foreign_key(
                    ForeignKey::create()
                        .from(
                            DeploymentRevisions::Table,
                            DeploymentRevisions::DeploymentId,
                        )
                        .to(Deployments::Table, Deployments::Id)
                        .on_delete(ForeignKeyAction::Cascade),
                )
                .to_owned(),
        )
        .await?;
    manager
        .create_index(
            Index::create()
                .name("uq_deployment_revisions_number")
                .table(DeploymentRevisions::Table)
                .col(DeploymentRevisions::DeploymentId)
                .col(DeploymentRevisions::Number)
                .unique()
                .to_owned(),
        )
        .await
}

/// Nodes get a `generation`, and (deployment, key, replica) is unique per
/// generation.
async fn add_generations(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    manager
        .alter_table(
            Table::alter()
                .table(DeploymentNodes::Table)
                .add_column(integer(DeploymentNodes::Generation).default(0))
                .to_owned(),
        )
        .await?;
    manager
        .drop_index(
            Index::drop()
                .name("uq_deployment_nodes_key_replica")
                .table(DeploymentNodes::Table)
                .to_owned(),
        )
        .await?;
    manager
        .create_index(
            Index::create()
                .name("uq_deployment_nodes_key_replica_generation")
                .table(DeploymentNodes::Table)
                .col(DeploymentNodes::DeploymentId)
                .col(DeploymentNodes::Key)
                .col(DeploymentNodes::Replica)
                .col(DeploymentNodes::Generation)
                .unique()
                .to_owned(),
        )
        .await
}

#[derive(DeriveIden)]
enum Deployments {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum DeploymentNodes {
    Table,
    DeploymentId,
    Key,
    Replica,
    Generation,
}

#[derive(DeriveIden)]
enum DeploymentPlans {
    Table,
    Id,
    DeploymentId,
    CreatedAt,
    CreatedBy,
    BlueprintId,
    Source,
    Variables,
    BaseSource,
    BaseVariables,
    Basis,
    Changes,
    State,
    AppliedAt,
}

#[derive(DeriveIden)]
enum DeploymentRevisions {
    Table,
    Id,
    DeploymentId,
    Number,
    Kind,
    Source,
    Variables,
    BlueprintId,
    PlanId,
    OperationId,
    CreatedBy,
    CreatedAt,
    Outcome,
    Error,
}
