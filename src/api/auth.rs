//! `me`, `login`, `logout`, `setPassword`, API tokens.

use async_graphql::{Context, ID, Object, SimpleObject};

use super::user::{ApiToken, User};
use super::{ApiError, principal, state};
use crate::auth::Auth;

/// The cookie `login` sets, read as an alternative to the bearer header.
pub const SESSION_COOKIE: &str = "corbel_session";

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
        super::audit_notes::note_user(ctx, user.id);
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
