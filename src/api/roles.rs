//! The roles as the API shows them: a user's server role and a member's
//! role in a project, each converted by hand to and from the auth area's.

use async_graphql::Enum;

use crate::auth as domain;

/// A user's server role.
#[derive(Enum, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Manages providers, repositories, elements, users, and every project.
    Admin,
    /// Does what their role in each of their projects allows.
    User,
}

impl From<Role> for domain::Role {
    fn from(r: Role) -> Self {
        match r {
            Role::Admin => domain::Role::Admin,
            Role::User => domain::Role::User,
        }
    }
}

/// A member's role in a project; each allows what the ones before it do.
#[derive(Enum, Clone, Copy, PartialEq, Eq)]
pub enum ProjectRole {
    /// Reads the project's blueprints and deployments.
    Viewer,
    /// Also deploys, redeploys, extends, powers and destroys.
    Deployer,
    /// Also creates, edits and deletes blueprints.
    Developer,
    /// Also manages members and quotas, and may delete the project.
    Admin,
}

impl From<ProjectRole> for domain::ProjectRole {
    fn from(r: ProjectRole) -> Self {
        match r {
            ProjectRole::Viewer => domain::ProjectRole::Viewer,
            ProjectRole::Deployer => domain::ProjectRole::Deployer,
            ProjectRole::Developer => domain::ProjectRole::Developer,
            ProjectRole::Admin => domain::ProjectRole::Admin,
        }
    }
}

impl From<domain::ProjectRole> for ProjectRole {
    fn from(r: domain::ProjectRole) -> Self {
        match r {
            domain::ProjectRole::Viewer => ProjectRole::Viewer,
            domain::ProjectRole::Deployer => ProjectRole::Deployer,
            domain::ProjectRole::Developer => ProjectRole::Developer,
            domain::ProjectRole::Admin => ProjectRole::Admin,
        }
    }
}
