//! Deployments listed newest first (`deployments(first: …)`, with or
//! without a project or blueprint) read an index in that order instead of
//! sorting what they match: with 100,000 deployments stored, a first page
//! took 30-100 ms on SQLite (issue 41). The created-time index holds the
//! name too, so a name search tests it without reading the rows it skips.
//! The project's and blueprint's indexes become the first columns of the
//! new ones.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for old in ["idx_deployments_project", "idx_deployments_blueprint"] {
            manager
                .drop_index(Index::drop().name(old).table(Deployments::Table).to_owned())
                .await?;
        }
        let newest_first = |name: &str, first: Option<Deployments>, last: Option<Deployments>| {
            let mut index = Index::create();
            index.name(name).table(Deployments::Table);
            if let Some(first) = first {
                index.col(first);
            }
            index
                .col((Deployments::CreatedAt, IndexOrder::Desc))
                .col((Deployments::Id, IndexOrder::Asc));
            if let Some(last) = last {
                index.col(last);
            }
            index.to_owned()
        };
        for index in [
            newest_first("idx_deployments_created", None, Some(Deployments::Name)),
            newest_first(
                "idx_deployments_project_created",
                Some(Deployments::ProjectId),
                None,
            ),
            newest_first(
                "idx_deployments_blueprint_created",
                Some(Deployments::BlueprintId),
                None,
            ),
        ] {
            manager.create_index(index).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for new in [
            "idx_deployments_created",
            "idx_deployments_project_created",
            "idx_deployments_blueprint_created",
        ] {
            manager
                .drop_index(Index::drop().name(new).table(Deployments::Table).to_owned())
                .await?;
        }
        for (name, column) in [
            ("idx_deployments_project", Deployments::ProjectId),
            ("idx_deployments_blueprint", Deployments::BlueprintId),
        ] {
            manager
                .create_index(
                    Index::create()
                        .name(name)
                        .table(Deployments::Table)
                        .col(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden, Clone, Copy)]
enum Deployments {
    Table,
    CreatedAt,
    Id,
    Name,
    ProjectId,
    BlueprintId,
}
