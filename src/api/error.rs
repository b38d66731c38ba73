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

/// The codes clients can rely on, as they appear in `extensions.code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    Unauthenticated,
    Forbidden,
    NotFound,
    Validation,
    Conflict,
    /// The HTTP body is not a GraphQL request (malformed JSON, too large).
    BadRequest,
    /// The document does not parse or validate (unknown field, too deep).
    InvalidQuery,
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Unauthenticated => "UNAUTHENTICATED",
            ErrorCode::Forbidden => "FORBIDDEN",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::Validation => "VALIDATION",
            ErrorCode::Conflict => "CONFLICT",
            ErrorCode::BadRequest => "BAD_REQUEST",
            ErrorCode::InvalidQuery => "INVALID_QUERY",
            ErrorCode::Internal => "INTERNAL",
        }
    }
}

#[derive(Clone, Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub fn unauthenticated() -> Self {
        Self::new(
            ErrorCode::Unauthenticated,
            "authentication required: send `Authorization: Bearer <token>`",
        )
    }

    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Validation, message)
    }

    /// Logs `cause` and returns an error that says nothing about it.
    pub fn internal(cause: &(dyn std::error::Error + 'static)) -> Self {
        tracing::error!(error = %chain(cause), "internal error");
        Self::new(ErrorCode::Internal, "internal error")
    }
}

impl From<ApiError> for async_graphql::Error {
    fn from(e: ApiError) -> Self {
        async_graphql::Error::new(e.message).extend_with(|_, ext| ext.set("code", e.code.as_str()))
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::InvalidCredentials => Self::new(ErrorCode::Unauthenticated, e.to_string()),
            AuthError::Invalid(message) => Self::validation(message),
            AuthError::TokenNotFound(_) => Self::new(ErrorCode::NotFound, e.to_string()),
            AuthError::Db(ref db) if crate::store::is_conflict(db) => Self::new(
                ErrorCode::Conflict,
                "that conflicts with an existing record",
            ),
            AuthError::Db(_) | AuthError::Hash(_) | AuthError::Corrupt(_) => Self::internal(&e),
        }
    }
}

/// `error: cause: cause…`, for logs.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
