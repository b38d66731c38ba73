//! Queries on projects and their members, for the `auth` area.

use chrono::Utc;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, DbErr, EntityTrait, IntoActiveModel,
    PaginatorTrait, QueryFilter, QueryOrder, Set, TransactionTrait,
};
use uuid::Uuid;

use super::entities::{blueprint, deployment, project, project_member, user};
use super::states::DeploymentState;

pub use project::Model as ProjectRow;
pub use project_member::Model as MemberRow;

pub struct NewProject {
    pub name: String,
    pub description: Option<String>,
    pub max_resources: Option<i64>,
    pub max_lease_seconds: Option<i64>,
    pub quotas: String,
}

/// Creates a project with its first member (its creator, as `owner_role`) in
/// one transaction.
pub async fn insert_project(
    db: &DatabaseConnection,
    new: NewProject,
    owner: Option<(Uuid, &str)>,
) -> Result<ProjectRow, DbErr> {
    let txn = db.begin().await?;
    let now = Utc::now();
    let row = project::ActiveModel {
        id: Set(Uuid::new_v4()),
        name: Set(new.name),
        description: Set(new.description),
        max_resources: Set(new.max_resources),
        max_lease_seconds: Set(new.max_lease_seconds),
        quotas: Set(new.quotas),
        created_at: Set(now),
        updated_at: Set(now),
    }
    .insert(&txn)
    .await?;
    if let Some((user_id, role)) = owner {
        project_member::ActiveModel {
            project_id: Set(row.id),
            user_id: Set(user_id),
            role: Set(role.to_owned()),
            created_at: Set(now),
        }
        .insert(&txn)
        .await?;
    }
    txn.commit().await?;
    Ok(row)
}

pub async fn find_project(db: &DatabaseConnection, id: Uuid) -> Result<Option<ProjectRow>, DbErr> {
    project::Entity::find_by_id(id).one(db).await
}

pub async fn find_project_by_name(
    db: &DatabaseConnection,
    name: &str,
) -> Result<Option<ProjectRow>, DbErr> {
    project::Entity::find()
        .filter(project::Column::Name.eq(name))
        .one(db)
        .await
}

/// Projects by name; only `ids` when given.
pub async fn list_projects(
    db: &DatabaseConnection,
    ids: Option<&[Uuid]>,
) -> Result<Vec<ProjectRow>, DbErr> {
    let mut query = project::Entity::find();
    if let Some(ids) = ids {
        query = query.filter(project::Column::Id.is_in(ids.iter().copied()));
    }
    query.order_by_asc(project::Column::Name).all(db).await
}

/// Columns of a project to change; `None` leaves one as it is, `Some(None)`
/// clears a limit.
#[derive(Default)]
pub struct ProjectChange {
    pub name: Option<String>,
    pub description: Option<Option<String>>,
    pub max_resources: Option<Option<i64>>,
    pub max_lease_seconds: Option<Option<i64>>,
    pub quotas: Option<String>,
}

pub async fn update_project(
    db: &DatabaseConnection,
    row: ProjectRow,
    change: ProjectChange,
) -> Result<ProjectRow, DbErr> {
    let mut active = row.into_active_model();
    if let Some(v) = change.name {
        active.name = Set(v);
    }
    if let Some(v) = change.description {
        active.description = Set(v);
    }
    if let Some(v) = change.max_resources {
        active.max_resources = Set(v);
    }
    if let Some(v) = change.max_lease_seconds {
        active.max_lease_seconds = Set(v);
    }
    if let Some(v) = change.quotas {
        active.quotas = Set(v);
    }
    active.updated_at = Set(Utc::now());
    active.update(db).await
}

/// What a project holds: its blueprints, and its deployments that are not
/// destroyed.
pub async fn project_holdings(db: &DatabaseConnection, id: Uuid) -> Result<(u64, u64), DbErr> {
    let blueprints = blueprint::Entity::find()
        .filter(blueprint::Column::ProjectId.eq(id))
        .count(db)
        .await?;
    let deployments = deployment::Entity::find()
        .filter(deployment::Column::ProjectId.eq(id))
        .filter(deployment::Column::State.ne(DeploymentState::Destroyed))
        .count(db)
        .await?;
    Ok((blueprints, deployments))
}

/// Deletes a project, its members and its destroyed deployments' rows.
pub async fn delete_project(db: &DatabaseConnection, id: Uuid) -> Result<bool, DbErr> {
    let txn = db.begin().await?;
    deployment::Entity::delete_many()
        .filter(deployment::Column::ProjectId.eq(id))
        .exec(&txn)
        .await?;
    let deleted = project::Entity::delete_by_id(id).exec(&txn).await?;
    txn.commit().await?;
    Ok(deleted.rows_affected > 0)
}

/// Adds a member, or changes the role of one: one statement (an upsert),
/// so that on SQLite it never reads and then writes in one transaction,
/// which fails at once ("database is locked") when another connection
/// writes in between.
pub async fn set_member(
    db: &DatabaseConnection,
    project_id: Uuid,
    user_id: Uuid,
    role: &str,
) -> Result<MemberRow, DbErr> {
    let member = project_member::ActiveModel {
        project_id: Set(project_id),
        user_id: Set(user_id),
        role: Set(role.to_owned()),
        created_at: Set(Utc::now()),
    };
    project_member::Entity::insert(member)
        .on_conflict(
            sea_orm::sea_query::OnConflict::columns([
                project_member::Column::ProjectId,
                project_member::Column::UserId,
            ])
            .update_column(project_member::Column::Role)
            .to_owned(),
        )
        .exec_with_returning(db)
        .await
}

pub async fn remove_member(
    db: &DatabaseConnection,
    project_id: Uuid,
    user_id: Uuid,
) -> Result<bool, DbErr> {
    Ok(project_member::Entity::delete_by_id((project_id, user_id))
        .exec(db)
        .await?
        .rows_affected
        > 0)
}

/// A project's members with their user rows, by user name.
pub async fn members_of(
    db: &DatabaseConnection,
    project_id: Uuid,
) -> Result<Vec<(MemberRow, user::Model)>, DbErr> {
    let members = project_member::Entity::find()
        .filter(project_member::Column::ProjectId.eq(project_id))
        .all(db)
        .await?;
    let users = user::Entity::find()
        .filter(user::Column::Id.is_in(members.iter().map(|m| m.user_id)))
        .all(db)
        .await?;
    let mut joined: Vec<_> = members
        .into_iter()
        .filter_map(|m| {
            let user = users.iter().find(|u| u.id == m.user_id)?.clone();
            Some((m, user))
        })
        .collect();
    joined.sort_by(|a, b| a.1.username.cmp(&b.1.username));
    Ok(joined)
}

/// The projects a user is a member of, with the role in each.
pub async fn memberships_of(
    db: &DatabaseConnection,
    user_id: Uuid,
) -> Result<Vec<MemberRow>, DbErr> {
    project_member::Entity::find()
        .filter(project_member::Column::UserId.eq(user_id))
        .all(db)
        .await
}

/// The id of the project named `name`, made (with no members and no limits)
/// if there is none: a race with another maker ends with the one row.
pub async fn ensure_project(db: &DatabaseConnection, name: &str) -> Result<Uuid, DbErr> {
    if let Some(row) = find_project_by_name(db, name).await? {
        return Ok(row.id);
    }
    let new = NewProject {
        name: name.to_owned(),
        description: None,
        max_resources: None,
        max_lease_seconds: None,
        quotas: "{}".into(),
    };
    match insert_project(db, new, None).await {
        Ok(row) => Ok(row.id),
        Err(e) if super::is_conflict(&e) => find_project_by_name(db, name)
            .await?
            .map(|row| row.id)
            .ok_or(e),
        Err(e) => Err(e),
    }
}
