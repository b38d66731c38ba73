//! The edge error type. Policy: every resolver returns [`ApiError`], which carries
//! a stable `extensions.code` and a message meant for the client. Area errors
//! convert into it here; anything unexpected (database, IO, a bug) is logged with
//! its cause chain and reaches the client only as an opaque `INTERNAL` error.
//!
//! `ApiError` deliberately does not implement `Display`: async-graphql converts
//! any `Display` type into an error without a code, and we want the compiler to
//! stop that path.

use async_graphql::ErrorExtensions;

use crate::auth::AuthError;
use crate::deploy::DeployError;
use crate::provider::ProviderError;
use crate::repository::RepositoryError;
use crate::resolve::ResolveError;
use crate::text::text_enum;

text_enum! {
    /// The codes clients can rely on, as they appear in `extensions.code`.
    pub enum ErrorCode {
        Unauthenticated = "UNAUTHENTICATED",
        Forbidden = "FORBIDDEN",
        NotFound = "NOT_FOUND",
        Validation = "VALIDATION",
        Conflict = "CONFLICT",
        DependencyNotFound = "DEPENDENCY_NOT_FOUND",
        DependencyConstraint = "DEPENDENCY_CONSTRAINT",
        DependencyConstraintFormat = "DEPENDENCY_CONSTRAINT_FORMAT",
        DependencyCycle = "DEPENDENCY_CYCLE",
        AlreadyInstalled = "ALREADY_INSTALLED",
        HasDependents = "HAS_DEPENDENTS",
        /// A repository's source could not be read (unreachable, HTTP error, bad data).
        SourceUnavailable = "SOURCE_UNAVAILABLE",
        /// A provider is not connected, or a call to it failed or passed its deadline.
        ProviderUnavailable = "PROVIDER_UNAVAILABLE",
        /// A provider answered that the work itself failed.
        ProviderFailed = "PROVIDER_FAILED",
        /// An element's installation (a deployment) failed; the message says why.
        DeploymentFailed = "DEPLOYMENT_FAILED",
        /// The HTTP body is not a GraphQL request (malformed JSON, too large).
        BadRequest = "BAD_REQUEST",
        /// The document does not parse or validate (unknown field, too deep).
        InvalidQuery = "INVALID_QUERY",
        /// A limit on the request was passed (expanded document size, batch
        /// size, response size); `extensions.limit` names the setting.
        LimitExceeded = "LIMIT_EXCEEDED",
        /// The request ran past its deadline and was stopped.
        Timeout = "TIMEOUT",
        /// Too many failed attempts; `extensions.retryAfterSeconds` says when
        /// to try again.
        RateLimited = "RATE_LIMITED",
        /// No replica leads just now (a failover is under way): retry.
        Unavailable = "UNAVAILABLE",
        /// Asked of a standby replica, which sends the request on to the
        /// leader: a client sees it only if that failed too.
        OnLeader = "ON_LEADER",
        Internal = "INTERNAL",
    }
}

/// What a request without a token is told.
pub const NEEDS_A_TOKEN: &str =
    "this operation needs a token: send `Authorization: Bearer <token>`";
/// What a request with a token that is not valid is told.
pub const INVALID_TOKEN: &str = "the token is not valid (unknown, expired or revoked)";

#[derive(Clone, Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// More `extensions` entries (e.g. the dependents of `HAS_DEPENDENTS`).
    pub details: Vec<(&'static str, async_graphql::Value)>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// `UNAUTHENTICATED` for a request that came without a token.
    pub fn unauthenticated() -> Self {
        Self::new(ErrorCode::Unauthenticated, NEEDS_A_TOKEN)
    }

    /// `UNAUTHENTICATED` for a request whose token is not (or no longer) valid.
    pub fn invalid_token() -> Self {
        Self::new(ErrorCode::Unauthenticated, INVALID_TOKEN)
    }

    /// `LIMIT_EXCEEDED`, naming the setting (`extensions.limit`) and its value.
    pub fn limit(key: &str, value: usize, message: impl Into<String>) -> Self {
        let mut error = Self::new(ErrorCode::LimitExceeded, message);
        error
            .details
            .push(("limit", async_graphql::Value::from(key.to_owned())));
        error
            .details
            .push(("max", async_graphql::Value::from(value as u64)));
        error
    }

    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Validation, message)
    }

    /// Logs `cause` and returns an error that says nothing about it.
    pub fn internal(cause: &(dyn std::error::Error + 'static)) -> Self {
        tracing::error!(error = %crate::error_chain(cause), "internal error");
        Self::new(ErrorCode::Internal, "internal error")
    }
}

impl From<ApiError> for async_graphql::Error {
    fn from(e: ApiError) -> Self {
        async_graphql::Error::new(e.message).extend_with(|_, ext| {
            ext.set("code", e.code.as_str());
            for (key, value) in e.details {
                ext.set(key, value);
            }
        })
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::InvalidCredentials => Self::new(ErrorCode::Unauthenticated, e.to_string()),
            AuthError::Invalid(message) => Self::validation(message),
            AuthError::TokenNotFound(_) => Self::new(ErrorCode::NotFound, e.to_string()),
            AuthError::NotFound(m) => Self::new(ErrorCode::NotFound, m),
            AuthError::Forbidden(m) => Self::new(ErrorCode::Forbidden, m),
            AuthError::Conflict(m) => Self::new(ErrorCode::Conflict, m),
            AuthError::RateLimited(limited) => {
                let mut error = Self::new(ErrorCode::RateLimited, e.to_string());
                let seconds = limited.retry_after.as_secs_f64().ceil() as u64;
                error
                    .details
                    .push(("retryAfterSeconds", async_graphql::Value::from(seconds)));
                error
            }
            AuthError::Db(_) | AuthError::Hash(_) | AuthError::Corrupt(_) => Self::internal(&e),
        }
    }
}

impl From<ProviderError> for ApiError {
    fn from(e: ProviderError) -> Self {
        match e {
            ProviderError::Invalid(m) => Self::validation(m),
            ProviderError::NotFound(m) => Self::new(ErrorCode::NotFound, m),
            ProviderError::Conflict(m) => Self::new(ErrorCode::Conflict, m),
            ProviderError::Unavailable(m) => Self::new(ErrorCode::ProviderUnavailable, m),
            ProviderError::OnLeader => Self::new(ErrorCode::OnLeader, e.to_string()),
            ProviderError::Failed { message, .. } => Self::new(ErrorCode::ProviderFailed, message),
            ProviderError::Db(_) | ProviderError::Corrupt(_) | ProviderError::Sealed(_) => {
                Self::internal(&e)
            }
        }
    }
}

impl From<RepositoryError> for ApiError {
    fn from(e: RepositoryError) -> Self {
        match e {
            RepositoryError::Invalid(m)
            | RepositoryError::Manifest(m)
            | RepositoryError::Inventory(m) => Self::validation(m),
            RepositoryError::NotFound(m) => Self::new(ErrorCode::NotFound, m),
            RepositoryError::Conflict(m) => Self::new(ErrorCode::Conflict, m),
            RepositoryError::AlreadyInstalled(m) => Self::new(ErrorCode::AlreadyInstalled, m),
            RepositoryError::HasDependents {
                message,
                dependents,
            } => {
                let mut error = Self::new(ErrorCode::HasDependents, message);
                error.details.push((
                    "dependents",
                    async_graphql::Value::List(
                        dependents
                            .into_iter()
                            .map(async_graphql::Value::from)
                            .collect(),
                    ),
                ));
                error
            }
            RepositoryError::Resolve(e) => {
                let code = match &e {
                    ResolveError::Version { .. } | ResolveError::RequirementVersion { .. } => {
                        ErrorCode::Validation
                    }
                    ResolveError::ConstraintFormat { .. } => ErrorCode::DependencyConstraintFormat,
                    ResolveError::UnknownRoot { .. } | ResolveError::NotFound { .. } => {
                        ErrorCode::DependencyNotFound
                    }
                    ResolveError::Conflict { .. } => ErrorCode::DependencyConstraint,
                    ResolveError::Cycle { .. } => ErrorCode::DependencyCycle,
                };
                Self::new(code, e.to_string())
            }
            RepositoryError::Source(m) => Self::new(ErrorCode::SourceUnavailable, m),
            RepositoryError::Deployment(m) => Self::new(ErrorCode::DeploymentFailed, m),
            RepositoryError::Db(_) | RepositoryError::Corrupt(_) => Self::internal(&e),
        }
    }
}

impl From<DeployError> for ApiError {
    fn from(e: DeployError) -> Self {
        match e {
            DeployError::Invalid(m) => Self::validation(m),
            DeployError::Blueprint(ref problems) => {
                let list = problems
                    .iter()
                    .map(|p| {
                        let mut entry = async_graphql::indexmap::IndexMap::new();
                        entry.insert(
                            async_graphql::Name::new("path"),
                            async_graphql::Value::from(p.problem.path.clone()),
                        );
                        entry.insert(
                            async_graphql::Name::new("message"),
                            async_graphql::Value::from(p.problem.message.clone()),
                        );
                        entry.insert(
                            async_graphql::Name::new("line"),
                            p.line.map_or(async_graphql::Value::Null, |l| {
                                async_graphql::Value::from(l as u64)
                            }),
                        );
                        async_graphql::Value::Object(entry)
                    })
                    .collect::<Vec<_>>();
                let mut error = Self::validation(e.to_string());
                error
                    .details
                    .push(("problems", async_graphql::Value::List(list)));
                error
            }
            DeployError::NotFound(m) => Self::new(ErrorCode::NotFound, m),
            DeployError::Conflict(m) => Self::new(ErrorCode::Conflict, m),
            DeployError::Provider(p) => p.into(),
            DeployError::Db(_) | DeployError::Corrupt(_) => Self::internal(&e),
        }
    }
}
