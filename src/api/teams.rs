//! Users (server admins manage them) and projects with their members.

use async_graphql::{Context, ID, InputObject, Json, Object, SimpleObject};
use chrono::{DateTime, Utc};

use super::policy::{access, require};
use super::roles::{ProjectRole, Role};
use super::user::User;
use super::{ApiError, parse_id, principal, state};
use crate::auth::{self as domain, Auth};

pub struct Project(domain::Project);

#[Object]
impl Project {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn name(&self) -> &str {
        &self.0.name
    }
    async fn description(&self) -> Option<&str> {
        self.0.description.as_deref()
    }
    /// Most resource nodes its deployments may hold at once (`null`: no limit).
    async fn max_resources(&self) -> Option<i64> {
        self.0.max_resources
    }
    /// Longest lease a deployment may ask for, in seconds (`null`: no limit).
    async fn max_lease_seconds(&self) -> Option<i64> {
        self.0.max_lease_seconds
    }
    /// Limits on named quantities providers describe (`{"cpu": 8}`).
    async fn quotas(&self) -> Json<serde_json::Map<String, serde_json::Value>> {
        Json(self.0.quotas.clone())
    }
    /// What its deployments use now of what its limits count.
    async fn usage(&self, ctx: &Context<'_>) -> Result<ProjectUsage, ApiError> {
        let (resources, quantities) = state::<crate::deploy::Deployments>(ctx)?
            .queries()
            .project_usage(self.0.id)
            .await?;
        Ok(ProjectUsage {
            resources: i64::try_from(resources).unwrap_or(i64::MAX),
            quantities: Json(quantities),
        })
    }
    /// The caller's role here (`ADMIN` for a server admin).
    async fn my_role(&self, ctx: &Context<'_>) -> Result<Option<ProjectRole>, ApiError> {
        Ok(access(ctx).await?.role_in(self.0.id).map(Into::into))
    }
    async fn members(&self, ctx: &Context<'_>) -> Result<Vec<Member>, ApiError> {
        let access = access(ctx).await?;
        Ok(state::<Auth>(ctx)?
            .members(&access, self.0.id)
            .await?
            .into_iter()
            .map(Member)
            .collect())
    }
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }
    async fn updated_at(&self) -> DateTime<Utc> {
        self.0.updated_at
    }
    /// The mutations made in this project, newest first (see `auditLog`):
    /// for its `ADMIN`s.
    async fn audit_log(
        &self,
        ctx: &Context<'_>,
        filter: Option<super::audit::AuditFilter>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<super::pagination::Page<super::audit::AuditEntry>, ApiError> {
        access(ctx).await?.require(
            Some(self.0.id),
            domain::ProjectRole::Admin,
            &format!("project {}", self.0.id),
        )?;
        let mut query = filter.unwrap_or_default().query()?;
        query.project_ids = Some(vec![self.0.id]);
        super::audit::page(ctx, query, first, after).await
    }
}

pub struct Member(domain::Member);

#[Object]
impl Member {
    async fn user(&self) -> User {
        User {
            user: self.0.user.clone(),
        }
    }
    async fn role(&self) -> ProjectRole {
        self.0.role.into()
    }
    async fn since(&self) -> DateTime<Utc> {
        self.0.since
    }
}

#[derive(SimpleObject)]
pub struct ProjectUsage {
    /// Resource nodes its deployments hold or are about to (against
    /// `maxResources`).
    resources: i64,
    /// What they count of each named quantity their providers describe
    /// (against `quotas`), e.g. `{"cpu": 6}`.
    quantities: Json<std::collections::BTreeMap<String, i64>>,
}

#[derive(InputObject)]
pub struct CreateUserInput {
    username: String,
    password: String,
    #[graphql(default_with = "Role::User")]
    role: Role,
}

#[derive(InputObject)]
pub struct CreateProjectInput {
    name: String,
    description: Option<String>,
    max_resources: Option<i64>,
    max_lease_seconds: Option<i64>,
    quotas: Option<Json<serde_json::Map<String, serde_json::Value>>>,
}

/// What to change; a field left out stays as it is, `null` clears a limit.
#[derive(InputObject)]
pub struct UpdateProjectInput {
    name: Option<String>,
    description: async_graphql::MaybeUndefined<String>,
    max_resources: async_graphql::MaybeUndefined<i64>,
    max_lease_seconds: async_graphql::MaybeUndefined<i64>,
    quotas: Option<Json<serde_json::Map<String, serde_json::Value>>>,
}

fn maybe<T>(value: async_graphql::MaybeUndefined<T>) -> Option<Option<T>> {
    match value {
        async_graphql::MaybeUndefined::Undefined => None,
        async_graphql::MaybeUndefined::Null => Some(None),
        async_graphql::MaybeUndefined::Value(v) => Some(Some(v)),
    }
}

#[derive(Default)]
pub struct TeamsQuery;

#[Object]
impl TeamsQuery {
    /// Every user, by name.
    async fn users(&self, ctx: &Context<'_>) -> Result<Vec<User>, ApiError> {
        Ok(state::<Auth>(ctx)?
            .users()
            .await?
            .into_iter()
            .map(|user| User { user })
            .collect())
    }

    async fn user(&self, ctx: &Context<'_>, id: ID) -> Result<User, ApiError> {
        Ok(User {
            user: state::<Auth>(ctx)?.user(parse_id(&id, "id")?).await?,
        })
    }

    /// The projects the caller is a member of (every project for a server
    /// admin), by name.
    async fn projects(&self, ctx: &Context<'_>) -> Result<Vec<Project>, ApiError> {
        let access = access(ctx).await?;
        Ok(state::<Auth>(ctx)?
            .projects(&access)
            .await?
            .into_iter()
            .map(Project)
            .collect())
    }

    async fn project(&self, ctx: &Context<'_>, id: ID) -> Result<Project, ApiError> {
        let id = parse_id(&id, "id")?;
        let access = require(ctx, Some(id), &format!("project {id}")).await?;
        Ok(Project(state::<Auth>(ctx)?.project(&access, id).await?))
    }
}

#[derive(Default)]
pub struct TeamsMutation;

#[Object]
impl TeamsMutation {
    /// Creates a user who signs in with the password given.
    async fn create_user(
        &self,
        ctx: &Context<'_>,
        input: CreateUserInput,
    ) -> Result<User, ApiError> {
        Ok(User {
            user: state::<Auth>(ctx)?
                .create_user(&input.username, &input.password, input.role.into())
                .await?,
        })
    }

    /// Disables a user (their sessions and tokens stop working at once) or
    /// enables them again.
    async fn set_user_disabled(
        &self,
        ctx: &Context<'_>,
        id: ID,
        disabled: bool,
    ) -> Result<User, ApiError> {
        Ok(User {
            user: state::<Auth>(ctx)?
                .set_user_disabled(principal(ctx)?, parse_id(&id, "id")?, disabled)
                .await?,
        })
    }

    async fn set_user_role(&self, ctx: &Context<'_>, id: ID, role: Role) -> Result<User, ApiError> {
        Ok(User {
            user: state::<Auth>(ctx)?
                .set_user_role(principal(ctx)?, parse_id(&id, "id")?, role.into())
                .await?,
        })
    }

    /// Deletes a user with their tokens and memberships.
    async fn delete_user(&self, ctx: &Context<'_>, id: ID) -> Result<bool, ApiError> {
        state::<Auth>(ctx)?
            .delete_user(principal(ctx)?, parse_id(&id, "id")?)
            .await?;
        Ok(true)
    }

    /// Creates a project; the caller is its first `ADMIN`.
    async fn create_project(
        &self,
        ctx: &Context<'_>,
        input: CreateProjectInput,
    ) -> Result<Project, ApiError> {
        let project = state::<Auth>(ctx)?
            .create_project(
                principal(ctx)?,
                domain::NewProject {
                    name: input.name,
                    description: input.description,
                    max_resources: input.max_resources,
                    max_lease_seconds: input.max_lease_seconds,
                    quotas: input.quotas.map(|q| q.0).unwrap_or_default(),
                },
            )
            .await?;
        super::audit_notes::note_project(ctx, project.id);
        Ok(Project(project))
    }

    async fn update_project(
        &self,
        ctx: &Context<'_>,
        id: ID,
        input: UpdateProjectInput,
    ) -> Result<Project, ApiError> {
        let id = parse_id(&id, "id")?;
        let access = require(ctx, Some(id), &format!("project {id}")).await?;
        Ok(Project(
            state::<Auth>(ctx)?
                .update_project(
                    &access,
                    id,
                    domain::ProjectChange {
                        name: input.name,
                        description: maybe(input.description),
                        max_resources: maybe(input.max_resources),
                        max_lease_seconds: maybe(input.max_lease_seconds),
                        quotas: input.quotas.map(|q| q.0),
                    },
                )
                .await?,
        ))
    }

    /// Deletes a project that holds no blueprint and no live deployment.
    async fn delete_project(&self, ctx: &Context<'_>, id: ID) -> Result<bool, ApiError> {
        let id = parse_id(&id, "id")?;
        let access = require(ctx, Some(id), &format!("project {id}")).await?;
        state::<Auth>(ctx)?.delete_project(&access, id).await?;
        Ok(true)
    }

    /// Adds a user to a project with a role, or changes their role.
    async fn set_project_member(
        &self,
        ctx: &Context<'_>,
        project_id: ID,
        username: String,
        role: ProjectRole,
    ) -> Result<Member, ApiError> {
        let id = parse_id(&project_id, "projectId")?;
        let access = require(ctx, Some(id), &format!("project {id}")).await?;
        Ok(Member(
            state::<Auth>(ctx)?
                .set_member(&access, id, &username, role.into())
                .await?,
        ))
    }

    async fn remove_project_member(
        &self,
        ctx: &Context<'_>,
        project_id: ID,
        username: String,
    ) -> Result<bool, ApiError> {
        let id = parse_id(&project_id, "projectId")?;
        let access = require(ctx, Some(id), &format!("project {id}")).await?;
        state::<Auth>(ctx)?
            .remove_member(&access, id, &username)
            .await?;
        Ok(true)
    }
}
