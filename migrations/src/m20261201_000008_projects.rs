//! Teams: projects, their members with a role each, and the project every
//! blueprint and deployment belongs to. An existing database (one user, the
//! admin, who could do everything) moves into a project named `default` that
//! holds every blueprint and deployment (but element installations, which go
//! to `platform`), with every server admin as its `ADMIN`. Users' `role` becomes the server role: `ADMIN` (manages providers,
//! repositories, elements, users) or `USER` (what their projects allow).

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;
use sea_orm_migration::sea_orm::ConnectionTrait;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The project an existing database's blueprints and deployments move into.
pub const DEFAULT_PROJECT: &str = "default";
/// The project of element installations.
pub const PLATFORM_PROJECT: &str = "platform";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Projects::Table)
                    .col(pk_uuid(Projects::Id))
                    .col(string_uniq(Projects::Name))
                    .col(text_null(Projects::Description))
                    // Quotas: none is unlimited. `quotas` is a JSON object of
                    // named quantities (as providers describe them) to limits.
                    .col(big_integer_null(Projects::MaxResources))
                    .col(big_integer_null(Projects::MaxLeaseSeconds))
                    .col(text(Projects::Quotas))
                    .col(timestamp_with_time_zone(Projects::CreatedAt))
                    .col(timestamp_with_time_zone(Projects::UpdatedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(ProjectMembers::Table)
                    .col(uuid(ProjectMembers::ProjectId))
                    .col(uuid(ProjectMembers::UserId))
                    .col(string(ProjectMembers::Role))
                    .col(timestamp_with_time_zone(ProjectMembers::CreatedAt))
                    .primary_key(
                        Index::create()
                            .col(ProjectMembers::ProjectId)
                            .col(ProjectMembers::UserId),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_project_members_project")
                            .from(ProjectMembers::Table, ProjectMembers::ProjectId)
                            .to(Projects::Table, Projects::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_project_members_user")
                            .from(ProjectMembers::Table, ProjectMembers::UserId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_project_members_user")
                    .table(ProjectMembers::Table)
                    .col(ProjectMembers::UserId)
                    .to_owned(),
            )
            .await?;
        // Not foreign keys (SQLite cannot add one to an existing table); the
        // code refuses to delete a project that holds anything.
        for table in [
            Blueprints::Table.into_iden(),
            Deployments::Table.into_iden(),
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(table)
                        .add_column(uuid_null(Blueprints::ProjectId))
                        .to_owned(),
                )
                .await?;
        }
        for (name, table) in [
            ("idx_blueprints_project", Blueprints::Table.into_iden()),
            ("idx_deployments_project", Deployments::Table.into_iden()),
        ] {
            manager
                .create_index(
                    Index::create()
                        .name(name)
                        .table(table)
                        .col(Blueprints::ProjectId)
                        .to_owned(),
                )
                .await?;
        }

        // What there is moves into `default`, owned by the server admins.
        let db = manager.get_connection();
        let id = uuid::Uuid::new_v4();
        let now = chrono::Utc::now();
        let insert = Query::insert()
            .into_table(Projects::Table)
            .columns([
                Projects::Id,
                Projects::Name,
                Projects::Description,
                Projects::Quotas,
                Projects::CreatedAt,
                Projects::UpdatedAt,
            ])
            .values_panic([
                id.into(),
                DEFAULT_PROJECT.into(),
                "Everything made before projects existed".into(),
                "{}".into(),
                now.into(),
                now.into(),
            ])
            .to_owned();
        db.execute(&insert).await?;
        for table in [
            Blueprints::Table.into_iden(),
            Deployments::Table.into_iden(),
        ] {
            let update = Query::update()
                .table(table)
                .value(Blueprints::ProjectId, id)
                .to_owned();
            db.execute(&update).await?;
        }
        // Element installations are the platform's, in a project of their own.
        let platform = uuid::Uuid::new_v4();
        let insert = Query::insert()
            .into_table(Projects::Table)
            .columns([
                Projects::Id,
                Projects::Name,
                Projects::Description,
                Projects::Quotas,
                Projects::CreatedAt,
                Projects::UpdatedAt,
            ])
            .values_panic([
                platform.into(),
                PLATFORM_PROJECT.into(),
                "Element installations".into(),
                "{}".into(),
                now.into(),
                now.into(),
            ])
            .to_owned();
        db.execute(&insert).await?;
        let update = Query::update()
            .table(Deployments::Table)
            .value(Blueprints::ProjectId, platform)
            .and_where(Expr::col(Deployments::ElementId).is_not_null())
            .to_owned();
        db.execute(&update).await?;
        let admins = Query::select()
            .column(Users::Id)
            .from(Users::Table)
            .and_where(Expr::col(Users::Role).eq("ADMIN"))
            .to_owned();
        let members = Query::insert()
            .into_table(ProjectMembers::Table)
            .columns([
                ProjectMembers::ProjectId,
                ProjectMembers::UserId,
                ProjectMembers::Role,
                ProjectMembers::CreatedAt,
            ])
            .select_from(
                Query::select()
                    .expr(Expr::val(id))
                    .column(Users::Id)
                    .expr(Expr::val("ADMIN"))
                    .expr(Expr::val(now))
                    .from(Users::Table)
                    .and_where(Expr::col(Users::Id).in_subquery(admins))
                    .to_owned(),
            )
            .map_err(|e| DbErr::Migration(e.to_string()))?
            .to_owned();
        db.execute(&members).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for (name, table) in [
            ("idx_blueprints_project", Blueprints::Table.into_iden()),
            ("idx_deployments_project", Deployments::Table.into_iden()),
        ] {
            manager
                .drop_index(Index::drop().name(name).table(table).to_owned())
                .await?;
        }
        for table in [
            Blueprints::Table.into_iden(),
            Deployments::Table.into_iden(),
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(table)
                        .drop_column(Blueprints::ProjectId)
                        .to_owned(),
                )
                .await?;
        }
        manager
            .drop_table(Table::drop().table(ProjectMembers::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Projects::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Projects {
    Table,
    Id,
    Name,
    Description,
    MaxResources,
    MaxLeaseSeconds,
    Quotas,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum ProjectMembers {
    Table,
    ProjectId,
    UserId,
    Role,
    CreatedAt,
}

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
    Role,
}

#[derive(DeriveIden)]
enum Blueprints {
    Table,
    ProjectId,
}

#[derive(DeriveIden)]
enum Deployments {
    Table,
    ElementId,
}
