//! Teams: users managed by server admins, projects, and each member's role in
//! a project. [`Access`] is what one principal may do, read once per request:
//! a server admin may do everything; anyone else what their role in a
//! project allows there, and nothing in a project they are not a member of
//! (which, to them, does not exist).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{Auth, AuthError, Principal, Role, TokenKind, User, password, to_user};
use crate::store::{projects, users};
use crate::text::text_enum;

/// The project that holds what was made before projects existed, and where a
/// blueprint goes when none is named.
pub const DEFAULT_PROJECT: &str = migration::m20261201_000008_projects::DEFAULT_PROJECT;
/// The project element installations deploy into.
pub const PLATFORM_PROJECT: &str = migration::m20261201_000008_projects::PLATFORM_PROJECT;

text_enum! {
    /// A member's role in a project, each allowing what the one before does:
    /// `VIEWER` reads; `DEPLOYER` deploys, redeploys, extends, powers and
    /// destroys; `DEVELOPER` also edits blueprints; `ADMIN` manages members
    /// and quotas.
    pub enum ProjectRole {
        Viewer = "VIEWER",
        Deployer = "DEPLOYER",
        Developer = "DEVELOPER",
        Admin = "ADMIN",
    }
}

impl ProjectRole {
    fn rank(self) -> u8 {
        match self {
            ProjectRole::Viewer => 0,
            ProjectRole::Deployer => 1,
            ProjectRole::Developer => 2,
            ProjectRole::Admin => 3,
        }
    }

    /// Whether this role allows what `needed` allows.
    pub fn allows(self, needed: ProjectRole) -> bool {
        self.rank() >= needed.rank()
    }
}

/// What one principal may do.
#[derive(Clone, Debug)]
pub struct Access {
    pub user_id: Uuid,
    pub server_admin: bool,
    roles: HashMap<Uuid, ProjectRole>,
}

impl Access {
    /// The caller's role in a project (`ADMIN` for a server admin).
    pub fn role_in(&self, project: Uuid) -> Option<ProjectRole> {
        if self.server_admin {
            return Some(ProjectRole::Admin);
        }
        self.roles.get(&project).copied()
    }

    /// Whether the caller may do what `needed` allows in `project`: refused as
    /// `NotFound` (`what`, e.g. "deployment 0190…") when the project is not
    /// theirs, so an id tells an outsider nothing, and as `Forbidden` when
    /// their role is too low.
    pub fn require(
        &self,
        project: Option<Uuid>,
        needed: ProjectRole,
        what: &str,
    ) -> Result<(), AuthError> {
        let Some(role) = project.and_then(|p| self.role_in(p)) else {
            return Err(AuthError::NotFound(format!("no {what}")));
        };
        if role.allows(needed) {
            Ok(())
        } else {
            Err(AuthError::Forbidden(format!(
                "your role in this project is {}; this needs {} or above",
                role.as_str(),
                needed.as_str()
            )))
        }
    }

    /// The projects whose contents the caller may see; `None` for all.
    pub fn visible(&self) -> Option<Vec<Uuid>> {
        (!self.server_admin).then(|| self.roles.keys().copied().collect())
    }
}

/// A project as its members see it.
#[derive(Clone, Debug)]
pub struct Project {
    pub id: Uuid,
    pub name: String,
    pub description: Option<String>,
    /// Most resource nodes its live deployments may hold at once.
    pub max_resources: Option<i64>,
    /// Longest lease a deployment may ask for, in seconds.
    pub max_lease_seconds: Option<i64>,
    /// Named quantities (as providers describe resources) to limits.
    pub quotas: serde_json::Map<String, serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Clone, Debug)]
pub struct Member {
    pub user: User,
    pub role: ProjectRole,
    pub since: DateTime<Utc>,
}

pub struct NewProject {
    pub name: String,
    pub description: Option<String>,
    pub max_resources: Option<i64>,
    pub max_lease_seconds: Option<i64>,
    pub quotas: serde_json::Map<String, serde_json::Value>,
}

#[derive(Default)]
pub struct ProjectChange {
    pub name: Option<String>,
    pub description: Option<Option<String>>,
    pub max_resources: Option<Option<i64>>,
    pub max_lease_seconds: Option<Option<i64>>,
    pub quotas: Option<serde_json::Map<String, serde_json::Value>>,
}

impl Auth {
    /// What the user `id` may do, read now from their stored row; `None`
    /// once they are disabled or deleted.
    pub async fn access_of(&self, id: Uuid) -> Result<Option<Access>, AuthError> {
        let Some(row) = users::find_user(&self.db, id).await? else {
            return Ok(None);
        };
        if row.disabled {
            return Ok(None);
        }
        Ok(Some(self.access_for(id, row.role.parse()?).await?))
    }

    fn access_changed(&self, user_id: Option<Uuid>) {
        // Who a token stands for may have changed (disabled, deleted, another
        // role): the tokens checked a moment ago are read again.
        self.recent.forget_all();
        self.bus
            .publish(super::AuthEvent::AccessChanged { user_id });
    }

    /// What `who` may do, read now.
    pub async fn access(&self, who: &Principal) -> Result<Access, AuthError> {
        self.access_for(who.user.id, who.user.role).await
    }

    /// What a user with the server role `role` may do: everything for an
    /// admin, else what their memberships allow.
    async fn access_for(&self, user_id: Uuid, role: Role) -> Result<Access, AuthError> {
        let server_admin = role == Role::Admin;
        let mut roles = HashMap::new();
        if !server_admin {
            for m in projects::memberships_of(&self.db, user_id).await? {
                roles.insert(m.project_id, m.role.parse()?);
            }
        }
        Ok(Access {
            user_id,
            server_admin,
            roles,
        })
    }

    // ---- users (server admins) ----

    pub async fn users(&self) -> Result<Vec<User>, AuthError> {
        users::list_users(&self.db)
            .await?
            .into_iter()
            .map(to_user)
            .collect()
    }

    pub async fn user(&self, id: Uuid) -> Result<User, AuthError> {
        users::find_user(&self.db, id)
            .await?
            .map(to_user)
            .transpose()?
            .ok_or_else(|| AuthError::NotFound(format!("no user {id}")))
    }

    /// Creates a user who signs in with `password`.
    pub async fn create_user(
        &self,
        username: &str,
        password: &str,
        role: Role,
    ) -> Result<User, AuthError> {
        check_name("username", username)?;
        password::check_strength(password)?;
        if users::find_by_username(&self.db, username).await?.is_some() {
            return Err(AuthError::Conflict(format!(
                "a user named `{username}` exists"
            )));
        }
        let hash = password::hash(password).await?;
        to_user(users::insert_user(&self.db, username, role.as_str(), hash).await?)
    }

    /// Disables or enables a user. A disabled user's tokens stop working at
    /// once and their sessions are deleted. Nobody disables themselves, and
    /// the last enabled server admin stays.
    pub async fn set_user_disabled(
        &self,
        actor: &Principal,
        id: Uuid,
        disabled: bool,
    ) -> Result<User, AuthError> {
        let user = self.user(id).await?;
        if disabled {
            if id == actor.user.id {
                return Err(AuthError::Invalid("you cannot disable yourself".into()));
            }
            self.keep_an_admin(&user).await?;
        }
        let row = users::set_disabled(&self.db, id, disabled, TokenKind::Session.as_str())
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("no user {id}")))?;
        self.access_changed(Some(id));
        to_user(row)
    }

    pub async fn set_user_role(
        &self,
        actor: &Principal,
        id: Uuid,
        role: Role,
    ) -> Result<User, AuthError> {
        let user = self.user(id).await?;
        if role != Role::Admin {
            if id == actor.user.id {
                return Err(AuthError::Invalid(
                    "you cannot take your own server role away".into(),
                ));
            }
            self.keep_an_admin(&user).await?;
        }
        let row = users::set_role(&self.db, id, role.as_str())
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("no user {id}")))?;
        self.access_changed(Some(id));
        to_user(row)
    }

    /// Deletes a user with their tokens and memberships.
    pub async fn delete_user(&self, actor: &Principal, id: Uuid) -> Result<(), AuthError> {
        let user = self.user(id).await?;
        if id == actor.user.id {
            return Err(AuthError::Invalid("you cannot delete yourself".into()));
        }
        self.keep_an_admin(&user).await?;
        users::delete_user(&self.db, id).await?;
        self.access_changed(Some(id));
        Ok(())
    }

    /// Refuses to take away the last enabled server admin.
    async fn keep_an_admin(&self, user: &User) -> Result<(), AuthError> {
        if user.role == Role::Admin
            && !user.disabled
            && users::count_active_with_role(&self.db, Role::Admin.as_str()).await? <= 1
        {
            return Err(AuthError::Conflict(format!(
                "`{}` is the last enabled server admin",
                user.username
            )));
        }
        Ok(())
    }

    // ---- projects ----

    /// The projects the caller may see, by name.
    pub async fn projects(&self, access: &Access) -> Result<Vec<Project>, AuthError> {
        projects::list_projects(&self.db, access.visible().as_deref())
            .await?
            .into_iter()
            .map(to_project)
            .collect()
    }

    /// A project the caller may see (`NotFound` for one they may not).
    pub async fn project(&self, access: &Access, id: Uuid) -> Result<Project, AuthError> {
        access.require(Some(id), ProjectRole::Viewer, &format!("project {id}"))?;
        self.project_row(id).await
    }

    async fn project_row(&self, id: Uuid) -> Result<Project, AuthError> {
        projects::find_project(&self.db, id)
            .await?
            .map(to_project)
            .transpose()?
            .ok_or_else(|| AuthError::NotFound(format!("no project {id}")))
    }

    /// Creates a project; its creator is its first `ADMIN`.
    pub async fn create_project(
        &self,
        creator: &Principal,
        new: NewProject,
    ) -> Result<Project, AuthError> {
        check_name("name", &new.name)?;
        check_limits(new.max_resources, new.max_lease_seconds, &new.quotas)?;
        if projects::find_project_by_name(&self.db, &new.name)
            .await?
            .is_some()
        {
            return Err(AuthError::Conflict(format!(
                "a project named `{}` exists",
                new.name
            )));
        }
        let row = projects::insert_project(
            &self.db,
            projects::NewProject {
                name: new.name,
                description: new.description,
                max_resources: new.max_resources,
                max_lease_seconds: new.max_lease_seconds,
                quotas: serde_json::Value::Object(new.quotas).to_string(),
            },
            Some((creator.user.id, ProjectRole::Admin.as_str())),
        )
        .await?;
        to_project(row)
    }

    /// Changes a project's name, description or quotas (its `ADMIN`s).
    pub async fn update_project(
        &self,
        access: &Access,
        id: Uuid,
        change: ProjectChange,
    ) -> Result<Project, AuthError> {
        access.require(Some(id), ProjectRole::Admin, &format!("project {id}"))?;
        if let Some(name) = &change.name {
            check_name("name", name)?;
        }
        let current = self.project_row(id).await?;
        check_limits(
            change.max_resources.unwrap_or(current.max_resources),
            change
                .max_lease_seconds
                .unwrap_or(current.max_lease_seconds),
            change.quotas.as_ref().unwrap_or(&current.quotas),
        )?;
        let row = projects::find_project(&self.db, id)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("no project {id}")))?;
        let row = projects::update_project(
            &self.db,
            row,
            projects::ProjectChange {
                name: change.name,
                description: change.description,
                max_resources: change.max_resources,
                max_lease_seconds: change.max_lease_seconds,
                quotas: change
                    .quotas
                    .map(|q| serde_json::Value::Object(q).to_string()),
            },
        )
        .await?;
        to_project(row)
    }

    /// Deletes a project that holds no blueprint and no deployment that is
    /// not destroyed.
    pub async fn delete_project(&self, access: &Access, id: Uuid) -> Result<(), AuthError> {
        access.require(Some(id), ProjectRole::Admin, &format!("project {id}"))?;
        let project = self.project_row(id).await?;
        if project.name == DEFAULT_PROJECT || project.name == PLATFORM_PROJECT {
            return Err(AuthError::Invalid(format!(
                "`{}` is Corbel's own project and stays",
                project.name
            )));
        }
        let (blueprints, deployments) = projects::project_holdings(&self.db, id).await?;
        if blueprints > 0 || deployments > 0 {
            return Err(AuthError::Conflict(format!(
                "project `{}` holds {blueprints} blueprint(s) and {deployments} deployment(s) \
                 that are not destroyed: delete and destroy them first",
                project.name
            )));
        }
        projects::delete_project(&self.db, id).await?;
        self.access_changed(None);
        Ok(())
    }

    pub async fn members(&self, access: &Access, project: Uuid) -> Result<Vec<Member>, AuthError> {
        access.require(
            Some(project),
            ProjectRole::Viewer,
            &format!("project {project}"),
        )?;
        projects::members_of(&self.db, project)
            .await?
            .into_iter()
            .map(|(m, u)| {
                Ok(Member {
                    role: m.role.parse()?,
                    since: m.created_at,
                    user: to_user(u)?,
                })
            })
            .collect()
    }

    /// Adds `username` to a project with `role`, or changes their role.
    pub async fn set_member(
        &self,
        access: &Access,
        project: Uuid,
        username: &str,
        role: ProjectRole,
    ) -> Result<Member, AuthError> {
        access.require(
            Some(project),
            ProjectRole::Admin,
            &format!("project {project}"),
        )?;
        let user = users::find_by_username(&self.db, username)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("no user named `{username}`")))?;
        let row = projects::set_member(&self.db, project, user.id, role.as_str()).await?;
        self.access_changed(Some(user.id));
        Ok(Member {
            role,
            since: row.created_at,
            user: to_user(user)?,
        })
    }

    pub async fn remove_member(
        &self,
        access: &Access,
        project: Uuid,
        username: &str,
    ) -> Result<(), AuthError> {
        access.require(
            Some(project),
            ProjectRole::Admin,
            &format!("project {project}"),
        )?;
        let user = users::find_by_username(&self.db, username)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("no user named `{username}`")))?;
        if !projects::remove_member(&self.db, project, user.id).await? {
            return Err(AuthError::NotFound(format!(
                "`{username}` is not a member of this project"
            )));
        }
        self.access_changed(Some(user.id));
        Ok(())
    }
}

/// A user's or project's name (`field` says which): 1 to 64 lowercase
/// letters, digits, `.`, `_` and `-`.
fn check_name(field: &str, name: &str) -> Result<(), AuthError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(AuthError::Invalid(format!(
            "{field}: `{name}` must be 1 to 64 lowercase letters, digits, `.`, `_` or `-`"
        )))
    }
}

fn check_limits(
    max_resources: Option<i64>,
    max_lease_seconds: Option<i64>,
    quotas: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), AuthError> {
    if max_resources.is_some_and(|n| n < 0) {
        return Err(AuthError::Invalid("maxResources: must be 0 or more".into()));
    }
    if max_lease_seconds.is_some_and(|n| n <= 0) {
        return Err(AuthError::Invalid(
            "maxLeaseSeconds: must be more than 0".into(),
        ));
    }
    for (name, limit) in quotas {
        if name.is_empty() || name.len() > 64 {
            return Err(AuthError::Invalid(format!(
                "quotas: `{name}` must be 1 to 64 characters"
            )));
        }
        if limit.as_i64().is_none_or(|n| n < 0) {
            return Err(AuthError::Invalid(format!(
                "quotas.{name}: expected a whole number 0 or more, got {limit}"
            )));
        }
    }
    Ok(())
}

fn to_project(row: projects::ProjectRow) -> Result<Project, AuthError> {
    let quotas = match serde_json::from_str(&row.quotas) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => {
            return Err(AuthError::Corrupt(format!(
                "project {}: quotas are not a JSON object",
                row.id
            )));
        }
    };
    Ok(Project {
        id: row.id,
        name: row.name,
        description: row.description,
        max_resources: row.max_resources,
        max_lease_seconds: row.max_lease_seconds,
        quotas,
        created_at: row.created_at,
        updated_at: row.updated_at,
    })
}
