//! The `User` object: an account as the API shows it, with what it owns
//! (its API tokens) and belongs to (its memberships). `me`, `login` and the
//! user and member lists all answer it.

use async_graphql::{Context, Enum, ID, Object, SimpleObject};
use chrono::{DateTime, Utc};

use super::pagination::{Page, paginate};
use super::roles::{ProjectRole, Role};
use super::{ApiError, ErrorCode, principal, state};
use crate::auth::{self as domain, Auth};

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Bootstrap,
    Session,
    Api,
}

pub struct User {
    pub(super) user: domain::User,
}

#[Object]
impl User {
    async fn id(&self) -> ID {
        ID(self.user.id.to_string())
    }

    async fn username(&self) -> &str {
        &self.user.username
    }

    async fn role(&self) -> Role {
        match self.user.role {
            domain::Role::Admin => Role::Admin,
            domain::Role::User => Role::User,
        }
    }

    /// Whether the user can sign in with `login` (the first admin has no
    /// password until `setPassword`).
    async fn has_password(&self) -> bool {
        self.user.has_password
    }

    /// A disabled user cannot sign in, and their tokens do not work.
    async fn disabled(&self) -> bool {
        self.user.disabled
    }

    async fn created_at(&self) -> DateTime<Utc> {
        self.user.created_at
    }

    /// The projects the user is a member of, with their role in each (the
    /// user themself, or a server admin, may read them).
    async fn memberships(&self, ctx: &Context<'_>) -> Result<Vec<Membership>, ApiError> {
        memberships_of(ctx, &self.user).await
    }

    /// The user's tokens (never their secrets), oldest first.
    async fn api_tokens(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Page<ApiToken>, ApiError> {
        let who = principal(ctx)?;
        if who.user.id != self.user.id {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "only a user may list their own tokens",
            ));
        }
        let tokens = state::<Auth>(ctx)?.tokens(who).await?;
        paginate(
            tokens.into_iter().map(ApiToken::from).collect(),
            first,
            after,
        )
    }
}

#[derive(SimpleObject)]
pub struct ApiToken {
    id: ID,
    name: String,
    kind: TokenKind,
    created_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
    last_used_at: Option<DateTime<Utc>>,
}

impl From<domain::TokenInfo> for ApiToken {
    fn from(t: domain::TokenInfo) -> Self {
        Self {
            id: ID(t.id.to_string()),
            name: t.name,
            kind: match t.kind {
                domain::TokenKind::Bootstrap => TokenKind::Bootstrap,
                domain::TokenKind::Session => TokenKind::Session,
                domain::TokenKind::Api => TokenKind::Api,
            },
            created_at: t.created_at,
            expires_at: t.expires_at,
            last_used_at: t.last_used_at,
        }
    }
}

#[derive(SimpleObject)]
pub struct Membership {
    project: ProjectRef,
    role: ProjectRole,
}

#[derive(SimpleObject)]
pub struct ProjectRef {
    id: ID,
    name: String,
}

/// A user's memberships: their own, or anyone's for a server admin.
pub(super) async fn memberships_of(
    ctx: &Context<'_>,
    user: &domain::User,
) -> Result<Vec<Membership>, ApiError> {
    let who = principal(ctx)?;
    if who.user.id != user.id && who.user.role != domain::Role::Admin {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            "only the user and server admins may read a user's projects",
        ));
    }
    let auth = state::<Auth>(ctx)?;
    let theirs = auth
        .access(&domain::Principal {
            user: user.clone(),
            ..who.clone()
        })
        .await?;
    let mut out = Vec::new();
    for project in auth.projects(&theirs).await? {
        if let Some(role) = theirs.role_in(project.id) {
            out.push(Membership {
                project: ProjectRef {
                    id: ID(project.id.to_string()),
                    name: project.name,
                },
                role: role.into(),
            });
        }
    }
    Ok(out)
}
