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
        create_projects(manager).await?;
        create_members(manager).await?;
        add_project_columns(manager).await?;
        move_existing(manager.get_connection()).await
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

/// The projects, each with its quotas.
async fn create_projects(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
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
        .await
}

/// The members of each project, with a role each.
async fn create_members(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
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
        .await
}

/// The project of each blueprint and deployment.
async fn add_project_columns(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
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
    Ok(())
}

/// What there is moves into `default`, owned by the server admins; element
/// installations into `platform`.
async fn move_existing(db: &SchemaManagerConnection<'_>) -> Result<(), DbErr> {
    let id = uuid::Uuid::new_v4();
    let now = chrono::Utc::now();
    insert_project(
        db,
        id,
        DEFAULT_PROJECT,
        "Everything made before projects existed",
        now,
    )
    .await?;
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
    insert_project(db, platform, PLATFORM_PROJECT, "Element installations", now).await?;
    let update = Query::update()
        .table(Deployments::Table)
        .value(Blueprints::ProjectId, platform)
        .and_where(Expr::col(Deployments::ElementId).is_not_null())
        .to_owned();
    db.execute(&update).await?;
    add_admins(db, id, now).await
}

/// A project without quotas.
async fn insert_project(
    db: &SchemaManagerConnection<'_>,
    id: uuid::Uuid,
    name: &str,
    description: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), DbErr> {
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
            name.into(),
            description.into(),
            "{}".into(),
            now.into(),
            now.into(),
        ])
        .to_owned();
    db.execute(&insert).await?;
    Ok(())
}

/// Every server admin becomes an `ADMIN` of the project `id`.
async fn add_admins(
    db: &SchemaManagerConnection<'_>,
    id: uuid::Uuid,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), DbErr> {
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
