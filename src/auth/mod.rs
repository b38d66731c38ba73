//! Users, passwords, tokens, and the one place that decides who a request is.
//!
//! Passwords are hashed with argon2. Tokens are 32 random bytes shown to their
//! owner once; only their SHA-256 is stored (a token has full entropy, so a fast
//! hash is enough and keeps per-request checks cheap). Roles are a column on the
//! user; what a principal may do is `teams::Access`.

mod limiter;
mod password;
mod recent;
mod settings;
mod teams;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use limiter::{Limited, LimitedBy};
pub use settings::{LoginFlags, LoginLimits};
pub use teams::{
    Access, DEFAULT_PROJECT, Member, NewProject, PLATFORM_PROJECT, Project, ProjectChange,
    ProjectRole,
};

use crate::store::{Db, DbErr};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::events::Bus;
use crate::secret::{Secret, hash_token};
use crate::store::{self, users};
use crate::text::text_enum;

/// The name of the user the first start creates.
pub const ADMIN_USERNAME: &str = "admin";
/// The name of the admin's token taken from the configuration
/// (`CORBEL_ADMIN_TOKEN`): one such token at a time, replaced when it changes.
pub const GIVEN_TOKEN_NAME: &str = "CORBEL_ADMIN_TOKEN";
/// Prefix of every token, so a leaked one is easy to spot in a scan.
const TOKEN_PREFIX: &str = "cbl_";
/// Longest token accepted; longer ones are refused before any hashing.
const MAX_TOKEN_LEN: usize = 512;
/// Shortest admin token accepted from the configuration.
const MIN_GIVEN_TOKEN_LEN: usize = 16;
/// A token's `last_used_at` is rewritten at most this often, keeping reads cheap.
const TOUCH_EVERY: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

text_enum! {
    /// A user's server role: an `ADMIN` manages providers, repositories,
    /// elements, users and every project; a `USER` does what the roles in
    /// their projects allow.
    pub enum Role {
        Admin = "ADMIN",
        User = "USER",
    }
}

text_enum! {
    /// What a token is for.
    pub enum TokenKind {
        /// Made at first start (or from `CORBEL_ADMIN_TOKEN`).
        Bootstrap = "BOOTSTRAP",
        /// From `login`; expires.
        Session = "SESSION",
        /// From `createApiToken`; lives until revoked.
        Api = "API",
    }
}

#[derive(Clone, Debug)]
pub struct User {
    pub id: Uuid,
    pub username: String,
    pub role: Role,
    pub has_password: bool,
    pub disabled: bool,
    pub created_at: DateTime<Utc>,
}

/// Who is making a request, and with which token.
#[derive(Clone, Debug)]
pub struct Principal {
    pub user: User,
    pub token_id: Uuid,
    pub token_kind: TokenKind,
}

/// A token as its owner may see it later: never the secret.
#[derive(Clone, Debug)]
pub struct TokenInfo {
    pub id: Uuid,
    pub name: String,
    pub kind: TokenKind,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("invalid username or password")]
    InvalidCredentials,
    #[error("{0}")]
    Invalid(String),
    #[error("no token {0} belongs to you")]
    TokenNotFound(Uuid),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Conflict(String),
    #[error("a stored row is not valid: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Db(DbErr),
    #[error("password hashing failed: {0}")]
    Hash(String),
    #[error("{}", rate_limited_message(.0))]
    RateLimited(Limited),
}

fn rate_limited_message(limited: &Limited) -> String {
    let by = match limited.by {
        LimitedBy::UserFromAddress => "this user name from this address",
        LimitedBy::User => "this user name from addresses it has not signed in from",
        LimitedBy::Address => "this address",
    };
    format!(
        "too many failed logins for {by}: try again in {} s",
        limited.retry_after.as_secs_f64().ceil() as u64
    )
}

impl From<DbErr> for AuthError {
    /// A unique or foreign key the store refused is a conflict, not a fault.
    fn from(e: DbErr) -> Self {
        if crate::store::is_conflict(&e) {
            Self::Conflict("that conflicts with an existing record".into())
        } else {
            Self::Db(e)
        }
    }
}

/// What the auth area publishes on its bus (a secret is never part of one).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AuthEvent {
    /// A user signed in and got a session.
    UserLoggedIn { user_id: Uuid, username: String },
    /// An API token was made.
    ApiTokenCreated {
        user_id: Uuid,
        token_id: Uuid,
        name: String,
    },
    /// An API token was revoked.
    ApiTokenRevoked { user_id: Uuid, token_id: Uuid },
    /// A session (or a token) ended with `logout`.
    SessionEnded { user_id: Uuid, token_id: Uuid },
    /// What a user may do changed (a membership, their role, disabled,
    /// deleted); `None`: anyone's (a project was deleted). Subscriptions
    /// check again whether their reader may still follow what they follow.
    AccessChanged { user_id: Option<Uuid> },
}

#[derive(Clone)]
pub struct Auth {
    db: Db,
    session_ttl: Duration,
    bus: Bus<AuthEvent>,
    /// Failed logins per user name and address, in memory: with replicas only
    /// the leader serves logins (standbys forward them), so one count holds.
    limiter: Arc<limiter::LoginLimiter>,
    /// Tokens checked a moment ago (see [`recent`]).
    recent: Arc<recent::RecentTokens>,
}

impl Auth {
    pub fn new(db: Db, session_ttl: Duration, bus: Bus<AuthEvent>, login: &LoginLimits) -> Self {
        Self {
            db,
            session_ttl,
            bus,
            limiter: Arc::new(limiter::LoginLimiter::new(login)),
            recent: Arc::default(),
        }
    }

    /// Sign-ins and tokens made or revoked, as they happen.
    pub fn events(&self) -> &Bus<AuthEvent> {
        &self.bus
    }

    /// On a store with no users, creates `admin` with a token and returns the token
    /// when Corbel made it (so it can be shown once). With `given` (the admin
    /// token from the configuration), that token is the admin's, stored under the
    /// name [`GIVEN_TOKEN_NAME`]: when a later start gives another one, it
    /// replaces the one given before (which stops working), and the log says so.
    pub async fn bootstrap(&self, given: Option<&Secret>) -> Result<Option<String>, AuthError> {
        if let Some(token) = given
            && !(MIN_GIVEN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&token.expose().len())
        {
            return Err(AuthError::Invalid(format!(
                "CORBEL_ADMIN_TOKEN must be {MIN_GIVEN_TOKEN_LEN} to {MAX_TOKEN_LEN} characters"
            )));
        }
        if store::users::count_users(&self.db).await? == 0 {
            let (token, name) = match given {
                Some(t) => (t.expose().to_owned(), GIVEN_TOKEN_NAME),
                None => (new_token(), "bootstrap"),
            };
            let created = users::insert_user_with_token(
                &self.db,
                ADMIN_USERNAME,
                Role::Admin.as_str(),
                Some((TokenKind::Bootstrap.as_str(), name, hash_token(&token))),
            )
            .await;
            return match created {
                Ok(_) => Ok(given.is_none().then_some(token)),
                // Another replica bootstrapped the same store a moment earlier.
                Err(e) if store::is_conflict(&e) => Ok(None),
                Err(e) => Err(e.into()),
            };
        }
        if let Some(token) = given {
            let hash = hash_token(token.expose());
            if !users::token_exists(&self.db, &hash).await? {
                let admin = users::find_by_username(&self.db, ADMIN_USERNAME)
                    .await?
                    .ok_or_else(|| AuthError::Corrupt("users exist but no `admin`".into()))?;
                let replaced = users::replace_named_token(
                    &self.db,
                    users::NewToken {
                        user_id: admin.id,
                        kind: TokenKind::Bootstrap.as_str(),
                        name: GIVEN_TOKEN_NAME,
                        token_hash: hash,
                        expires_at: None,
                    },
                )
                .await?;
                self.recent.forget_all();
                if replaced > 0 {
                    tracing::info!(
                        user = ADMIN_USERNAME,
                        token.name = GIVEN_TOKEN_NAME,
                        "CORBEL_ADMIN_TOKEN changed: the admin token it gave before is revoked \
                         and the new one replaces it"
                    );
                } else {
                    tracing::info!(
                        user = ADMIN_USERNAME,
                        token.name = GIVEN_TOKEN_NAME,
                        "CORBEL_ADMIN_TOKEN is new to this database: it is now the admin's \
                         token `{GIVEN_TOKEN_NAME}`; the admin's other tokens are kept"
                    );
                }
            }
        }
        Ok(None)
    }

    /// The principal a bearer token stands for, or `None` for an unknown, expired
    /// or disabled one.
    pub async fn authenticate(&self, token: &str) -> Result<Option<Principal>, AuthError> {
        if token.is_empty() || token.len() > MAX_TOKEN_LEN {
            return Ok(None);
        }
        let hash = hash_token(token);
        let checked = match self.recent.get(&hash, Instant::now()) {
            Some(checked) => checked,
            None => {
                // Taken before the read: a change made meanwhile drops it.
                let (generation, read_at) = (self.recent.generation(), Instant::now());
                let Some((row, user)) = users::find_token(&self.db, &hash).await? else {
                    return Ok(None);
                };
                if user.disabled {
                    return Ok(None);
                }
                let checked = recent::Checked {
                    principal: Principal {
                        user: to_user(user)?,
                        token_id: row.id,
                        token_kind: row.kind.parse()?,
                    },
                    expires_at: row.expires_at,
                    last_used_at: row.last_used_at,
                };
                self.recent
                    .put(hash.clone(), checked.clone(), generation, read_at);
                checked
            }
        };
        let now = Utc::now();
        if checked.expires_at.is_some_and(|at| at <= now) {
            return Ok(None);
        }
        if checked.last_used_at.is_none_or(|at| now - at > TOUCH_EVERY) {
            users::touch_token(&self.db, checked.principal.token_id, now).await?;
            self.recent.touched(&hash, now);
        }
        Ok(Some(checked.principal))
    }

    /// Checks a username and password and opens a session. `from` is the
    /// client's address, for the per-address limit on failed attempts; a name
    /// or address over its limit is refused before any password is checked.
    pub async fn login(
        &self,
        username: &str,
        password: &str,
        from: Option<IpAddr>,
    ) -> Result<(User, String), AuthError> {
        // The attempt is counted before the password is checked (so concurrent
        // guesses cannot all pass), and given back if it succeeds.
        self.limiter
            .attempt(username, from, Instant::now())
            .map_err(AuthError::RateLimited)?;
        let row = users::find_by_username(&self.db, username).await?;
        let stored = row.as_ref().and_then(|r| r.password_hash.clone());
        let matches = password::verify(password, stored).await?;
        let row = match (row, matches) {
            (Some(row), true) if !row.disabled => {
                self.limiter.succeeded(username, from, Instant::now());
                row
            }
            _ => {
                if let Some(addr) = from {
                    tracing::info!(client.address = %addr, "failed login");
                } else {
                    tracing::info!("failed login");
                }
                return Err(AuthError::InvalidCredentials);
            }
        };
        let token = new_token();
        let ttl = chrono::TimeDelta::from_std(self.session_ttl)
            .map_err(|_| AuthError::Invalid("session lifetime is too long".into()))?;
        users::insert_token(
            &self.db,
            users::NewToken {
                user_id: row.id,
                kind: TokenKind::Session.as_str(),
                name: "session",
                token_hash: hash_token(&token),
                expires_at: Some(Utc::now() + ttl),
            },
        )
        .await?;
        let user = to_user(row)?;
        self.bus.publish(AuthEvent::UserLoggedIn {
            user_id: user.id,
            username: user.username.clone(),
        });
        Ok((user, token))
    }

    /// Ends the session (or revokes the token) the principal came in with.
    pub async fn logout(&self, who: &Principal) -> Result<(), AuthError> {
        users::delete_token(&self.db, who.user.id, who.token_id).await?;
        self.recent.forget_all();
        self.bus.publish(AuthEvent::SessionEnded {
            user_id: who.user.id,
            token_id: who.token_id,
        });
        Ok(())
    }

    /// Sets the principal's password. A user who has one must give it.
    pub async fn set_password(
        &self,
        who: &Principal,
        current: Option<&str>,
        new: &str,
    ) -> Result<(), AuthError> {
        password::check_strength(new)?;
        let row = users::find_user(&self.db, who.user.id)
            .await?
            .ok_or(AuthError::InvalidCredentials)?;
        if let Some(stored) = row.password_hash {
            let given = current.ok_or_else(|| {
                AuthError::Invalid("currentPassword is required to change a password".into())
            })?;
            if !password::verify(given, Some(stored)).await? {
                return Err(AuthError::Invalid("currentPassword is wrong".into()));
            }
        }
        let hash = password::hash(new).await?;
        users::set_password_hash(&self.db, row.id, hash).await?;
        // `hasPassword` is part of who the caller is.
        self.recent.forget_all();
        Ok(())
    }

    /// Makes an API token; the secret is returned here and never again.
    pub async fn create_api_token(
        &self,
        who: &Principal,
        name: &str,
    ) -> Result<(TokenInfo, String), AuthError> {
        let name = name.trim();
        if name.is_empty() || name.chars().count() > 100 {
            return Err(AuthError::Invalid(
                "name must be 1 to 100 characters".into(),
            ));
        }
        let token = new_token();
        let row = users::insert_token(
            &self.db,
            users::NewToken {
                user_id: who.user.id,
                kind: TokenKind::Api.as_str(),
                name,
                token_hash: hash_token(&token),
                expires_at: None,
            },
        )
        .await?;
        let info = to_token_info(row)?;
        self.bus.publish(AuthEvent::ApiTokenCreated {
            user_id: who.user.id,
            token_id: info.id,
            name: info.name.clone(),
        });
        Ok((info, token))
    }

    pub async fn tokens(&self, who: &Principal) -> Result<Vec<TokenInfo>, AuthError> {
        users::list_tokens(&self.db, who.user.id)
            .await?
            .into_iter()
            .map(to_token_info)
            .collect()
    }

    pub async fn revoke_token(&self, who: &Principal, token_id: Uuid) -> Result<(), AuthError> {
        if !users::delete_token(&self.db, who.user.id, token_id).await? {
            return Err(AuthError::TokenNotFound(token_id));
        }
        self.recent.forget_all();
        self.bus.publish(AuthEvent::ApiTokenRevoked {
            user_id: who.user.id,
            token_id,
        });
        Ok(())
    }

    /// Deletes expired sessions; run from a background loop.
    pub async fn purge_expired(&self) -> Result<u64, AuthError> {
        Ok(users::delete_expired_tokens(&self.db, Utc::now()).await?)
    }
}

fn new_token() -> String {
    crate::secret::new_token(TOKEN_PREFIX)
}

impl From<crate::text::UnknownText> for AuthError {
    fn from(e: crate::text::UnknownText) -> Self {
        AuthError::Corrupt(e.to_string())
    }
}

fn to_user(row: users::UserRow) -> Result<User, AuthError> {
    Ok(User {
        role: row.role.parse()?,
        id: row.id,
        username: row.username,
        has_password: row.password_hash.is_some(),
        disabled: row.disabled,
        created_at: row.created_at,
    })
}

fn to_token_info(row: users::TokenRow) -> Result<TokenInfo, AuthError> {
    Ok(TokenInfo {
        kind: row.kind.parse()?,
        id: row.id,
        name: row.name,
        created_at: row.created_at,
        expires_at: row.expires_at,
        last_used_at: row.last_used_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_prefixed_and_hashed() {
        let a = new_token();
        let b = new_token();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 64);
        assert_eq!(hash_token(&a), hash_token(&a));
        assert_ne!(hash_token(&a), a);
    }
}
