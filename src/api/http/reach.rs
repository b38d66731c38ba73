//! What `/exec` and `/files` share: who the caller is (a bearer token or
//! the console's session), whether they may reach into a resource
//! (DEVELOPER in its project), what refused them, and the audit entry each
//! writes when it ends.

use axum::http::StatusCode;
use axum::response::Response;
use uuid::Uuid;

use super::caller::{authenticate, bearer_token};
use super::{HttpState, api_error_response};
use crate::api::{ApiError, ClientAddress, ErrorCode};
use crate::auth::{Principal, ProjectRole};

/// The signed-in caller of `/exec` or `/files`: a bearer token, or the
/// console's session cookie from this origin; else the 401 to answer.
pub(super) async fn principal_of(
    state: &HttpState,
    headers: &axum::http::HeaderMap,
) -> Result<Principal, Response> {
    let principal = match bearer_token(headers) {
        Some(token) => authenticate(&state.auth, token).await,
        None => Ok(None),
    };
    match principal {
        Ok(Some(principal)) => Ok(principal),
        Ok(None) => {
            let e = ApiError::new(
                ErrorCode::Unauthenticated,
                "sign in: this needs a bearer token or the console's session",
            );
            Err(api_error_response(StatusCode::UNAUTHORIZED, e))
        }
        Err(e) => Err(api_error_response(StatusCode::INTERNAL_SERVER_ERROR, e)),
    }
}

/// Checks that `principal` may reach into the node `node_id` (DEVELOPER in
/// its project: NOT_FOUND for an outsider); the project.
pub(super) async fn authorized(
    state: &HttpState,
    principal: &Principal,
    node_id: Uuid,
) -> Result<Option<Uuid>, Refusal> {
    let queries = state.deployments.queries();
    let node = queries.node(node_id).await.map_err(ApiError::from)?;
    let project = queries
        .get(node.deployment_id)
        .await
        .map_err(ApiError::from)?
        .project_id;
    let access = state.auth.access(principal).await.map_err(ApiError::from)?;
    access
        .require(
            project,
            ProjectRole::Developer,
            &format!("resource node {node_id}"),
        )
        .map_err(ApiError::from)?;
    Ok(project)
}

/// What an exec or a file transfer refused or failed with, for the client
/// and the audit log.
pub(super) struct Refusal(pub(super) ErrorCode, pub(super) String);

impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Self {
        Refusal(e.code, e.message)
    }
}

/// An exec or file transfer that ended, as the audit log keeps it.
pub(super) struct Done {
    pub(super) action: &'static str,
    pub(super) facts: serde_json::Map<String, serde_json::Value>,
    pub(super) project: Option<Uuid>,
    pub(super) failed: Option<Refusal>,
    pub(super) started: std::time::Instant,
}

/// Writes `done` to the audit log (a failure to is logged, not answered).
pub(super) async fn record(
    state: &HttpState,
    principal: &Principal,
    client: ClientAddress,
    done: Done,
) {
    let (outcome, error) = match done.failed {
        None => ("OK".to_owned(), None),
        Some(Refusal(code, message)) => (code.as_str().to_owned(), Some(message)),
    };
    let entry = crate::audit::Entry {
        id: Uuid::now_v7(),
        at: chrono::Utc::now(),
        user_id: Some(principal.user.id),
        username: Some(principal.user.username.clone()),
        project_id: done.project,
        action: done.action.to_owned(),
        arguments: done.facts,
        outcome,
        error,
        duration: done.started.elapsed(),
        address: client.0.map(|a| a.to_string()),
    };
    if let Err(e) = state.audit.record(entry).await {
        tracing::warn!(error = %e, action = done.action, "cannot record it in the audit log");
    }
}
