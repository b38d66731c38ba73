//! `me`, `login`, `logout`, `setPassword`, API tokens.

use async_graphql::{Context, Enum, ID, Object, SimpleObject};
use chrono::{DateTime, Utc};

use super::pagination::{Page, paginate};
use super::{ApiError, principal, state};
use crate::auth::{self as domain, Auth};

/// The cookie `login` sets, read as an alternative to the bearer header.
pub const SESSION_COOKIE: &str = "corbel_session";

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
    async fn memberships(
        &self,
        ctx: &Context<'_>,
    ) -> Result<Vec<super::teams::Membership>, ApiError> {
        super::teams::memberships_of(ctx, &self.user).await
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
                super::ErrorCode::Forbidden,
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
pub struct LoginPayload {
    /// A session token; send it as `Authorization: Bearer <token>`. It is also
    /// set as an HTTP-only cookie for browsers.
    token: String,
    user: User,
}

#[derive(SimpleObject)]
pub struct CreateApiTokenPayload {
    /// The secret. It is shown here once and never again.
    token: String,
    api_token: ApiToken,
}

#[derive(Default)]
pub struct AuthQuery;

#[Object]
impl AuthQuery {
    /// The signed-in user.
    async fn me(&self, ctx: &Context<'_>) -> Result<User, ApiError> {
        Ok(User {
            user: principal(ctx)?.user.clone(),
        })
    }
}

#[derive(Default)]
pub struct AuthMutation;

#[Object]
impl AuthMutation {
    /// Signs in with a username and password; needs no token.
    async fn login(
        &self,
        ctx: &Context<'_>,
        username: String,
        password: String,
    ) -> Result<LoginPayload, ApiError> {
        let from = ctx
            .data_opt::<super::ClientAddress>()
            .and_then(|address| address.0);
        let (user, token) = state::<Auth>(ctx)?
            .login(&username, &password, from)
            .await?;
        super::audit::note_user(ctx, user.id);
        ctx.append_http_header(
            "Set-Cookie",
            format!("{SESSION_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"),
        );
        Ok(LoginPayload {
            token,
            user: User { user },
        })
    }

    /// Ends the session (or revokes the token) this request came with.
    async fn logout(&self, ctx: &Context<'_>) -> Result<bool, ApiError> {
        state::<Auth>(ctx)?.logout(principal(ctx)?).await?;
        ctx.append_http_header(
            "Set-Cookie",
            format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
        );
        Ok(true)
    }

    /// Sets the caller's password. `currentPassword` is required once one is set.
    async fn set_password(
        &self,
        ctx: &Context<'_>,
        new_password: String,
        current_password: Option<String>,
    ) -> Result<bool, ApiError> {
        state::<Auth>(ctx)?
            .set_password(principal(ctx)?, current_password.as_deref(), &new_password)
            .await?;
        Ok(true)
    }

    /// Makes a long-lived token for scripts. The secret is in the payload once.
    async fn create_api_token(
        &self,
        ctx: &Context<'_>,
        name: String,
    ) -> Result<CreateApiTokenPayload, ApiError> {
        let (info, token) = state::<Auth>(ctx)?
            .create_api_token(principal(ctx)?, &name)
            .await?;
        Ok(CreateApiTokenPayload {
            token,
            api_token: info.into(),
        })
    }

    /// Revokes one of the caller's tokens.
    async fn revoke_api_token(&self, ctx: &Context<'_>, id: ID) -> Result<bool, ApiError> {
        let id = id
            .parse::<uuid::Uuid>()
            .map_err(|_| ApiError::validation(format!("`id`: `{}` is not a token id", id.0)))?;
        state::<Auth>(ctx)?
            .revoke_token(principal(ctx)?, id)
            .await?;
        Ok(true)
    }
}
