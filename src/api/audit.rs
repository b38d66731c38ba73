//! The audit trail in the API: [`AuditTrail`] records every root mutation
//! field as it resolves (and every one the policy guard refuses before it
//! runs), `auditLog` reads the log with filters, `auditEvents` follows it
//! live; both are for server admins, and `Project.auditLog` gives a project's
//! `ADMIN`s the entries of their project.
//!
//! Which project a mutation acted in is what its resolver checked the
//! caller's role in (noted by `policy::require`, see `audit_notes`).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_graphql::connection::{Connection, Edge};
use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextParseQuery, NextPrepareRequest, NextResolve,
    ResolveInfo,
};
use async_graphql::parser::types::{ExecutableDocument, Field, OperationType, Selection};
use async_graphql::{
    Context, Enum, ID, InputObject, Json, Object, Request, ServerError, ServerResult, Subscription,
    Value, Variables,
};
use chrono::{DateTime, Utc};
use futures_util::{Stream, StreamExt};
use uuid::Uuid;

use super::audit_notes::{Notes, segment};
use super::pagination::{Page, Totals, page_size};
use super::{ApiError, Caller, ClientAddress, parse_id, state};
use crate::audit::{self as domain, Audit, AuditQuery, OutcomeFilter, hide_secrets};
use crate::events::Delivery;

/// One recorded mutation.
pub struct AuditEntry(domain::Entry);

#[Object]
impl AuditEntry {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn at(&self) -> DateTime<Utc> {
        self.0.at
    }
    /// The user who made it (`null` for a caller not signed in); the user
    /// may since have been deleted.
    async fn user_id(&self) -> Option<ID> {
        self.0.user_id.map(|id| ID(id.to_string()))
    }
    /// Their name when they made it; for a `login`, the name given.
    async fn username(&self) -> Option<&str> {
        self.0.username.as_deref()
    }
    /// The project it acted in, when it acted in one.
    async fn project_id(&self) -> Option<ID> {
        self.0.project_id.map(|id| ID(id.to_string()))
    }
    /// The mutation (`deployBlueprint`).
    async fn action(&self) -> &str {
        &self.0.action
    }
    /// Its arguments, with secrets (passwords, tokens, `secretConfig`,
    /// credentials in URLs) replaced by `***` and long strings cut.
    async fn arguments(&self) -> Json<&serde_json::Map<String, serde_json::Value>> {
        Json(&self.0.arguments)
    }
    /// `OK`, or the error's code (`FORBIDDEN`, `NOT_FOUND`, `CONFLICT`…).
    async fn outcome(&self) -> &str {
        &self.0.outcome
    }
    /// The error's message, when it failed.
    async fn error(&self) -> Option<&str> {
        self.0.error.as_deref()
    }
    /// How long it took, in milliseconds.
    async fn duration_ms(&self) -> f64 {
        self.0.duration.as_secs_f64() * 1000.0
    }
    /// The address the request came from, when known.
    async fn address(&self) -> Option<&str> {
        self.0.address.as_deref()
    }
}

/// Which outcomes a filter keeps.
#[derive(Enum, Clone, Copy, PartialEq, Eq)]
pub enum AuditOutcome {
    Ok,
    /// Every outcome but `OK`.
    Failed,
}

/// Which entries to read; every part given must hold.
#[derive(InputObject, Default)]
pub struct AuditFilter {
    user_id: Option<ID>,
    /// A user's name as recorded (any case).
    username: Option<String>,
    project_id: Option<ID>,
    /// Mutation names (`["deployBlueprint", "destroyDeployment"]`).
    actions: Option<Vec<String>>,
    outcome: Option<AuditOutcome>,
    /// One error code (`FORBIDDEN`); overrides `outcome`.
    code: Option<String>,
    /// From this time on (inclusive).
    since: Option<DateTime<Utc>>,
    /// Before this time.
    until: Option<DateTime<Utc>>,
}

impl AuditFilter {
    pub(super) fn query(self) -> Result<AuditQuery, ApiError> {
        let user_id = self
            .user_id
            .map(|id| parse_id(&id, "filter.userId"))
            .transpose()?;
        let project = self
            .project_id
            .map(|id| parse_id(&id, "filter.projectId"))
            .transpose()?;
        let outcome = match (self.code, self.outcome) {
            (Some(code), _) => Some(OutcomeFilter::Code(code.to_ascii_uppercase())),
            (None, Some(AuditOutcome::Ok)) => Some(OutcomeFilter::Ok),
            (None, Some(AuditOutcome::Failed)) => Some(OutcomeFilter::Failed),
            (None, None) => None,
        };
        if let Some(actions) = &self.actions
            && actions.len() > 100
        {
            return Err(ApiError::validation(
                "filter.actions: at most 100 names".to_owned(),
            ));
        }
        Ok(AuditQuery {
            user_id,
            username: self.username,
            project_ids: project.map(|id| vec![id]),
            actions: self.actions,
            outcome,
            since: self.since,
            until: self.until,
        })
    }
}

/// A page of the log, newest first; a cursor is an entry's id.
pub(super) async fn page(
    ctx: &Context<'_>,
    query: AuditQuery,
    first: Option<i32>,
    after: Option<String>,
) -> Result<Page<AuditEntry>, ApiError> {
    let limit = page_size(first)?;
    let before = after
        .map(|cursor| {
            cursor
                .parse::<Uuid>()
                .map_err(|_| ApiError::validation("`after` is not a cursor from this list"))
        })
        .transpose()?;
    let audit = state::<Audit>(ctx)?;
    let total = audit
        .count(&query)
        .await
        .map_err(|e| ApiError::internal(&e))?;
    let mut entries = audit
        .list(&query, before, limit + 1)
        .await
        .map_err(|e| ApiError::internal(&e))?;
    let more = entries.len() as u64 > limit;
    entries.truncate(limit as usize);
    let mut page =
        Connection::with_additional_fields(before.is_some(), more, Totals::known(total as u64));
    page.edges.extend(
        entries
            .into_iter()
            .map(|entry| Edge::new(entry.id.to_string(), AuditEntry(entry))),
    );
    Ok(page)
}

#[derive(Default)]
pub struct AuditQueryRoot;

#[Object]
impl AuditQueryRoot {
    /// The audit log, newest first: every mutation, who made it, in which
    /// project, how it ended. Server admins.
    async fn audit_log(
        &self,
        ctx: &Context<'_>,
        filter: Option<AuditFilter>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Page<AuditEntry>, ApiError> {
        super::policy::require(ctx, None, "the audit log").await?;
        page(ctx, filter.unwrap_or_default().query()?, first, after).await
    }
}

#[derive(Default)]
pub struct AuditSubscription;

#[Subscription]
impl AuditSubscription {
    /// Entries as they are recorded, those `filter` keeps. Server admins.
    async fn audit_events(
        &self,
        ctx: &Context<'_>,
        filter: Option<AuditFilter>,
    ) -> Result<impl Stream<Item = Result<AuditEntry, ApiError>> + use<>, ApiError> {
        super::policy::require(ctx, None, "the audit log").await?;
        let query = filter.unwrap_or_default().query()?;
        Ok(state::<Audit>(ctx)?
            .events()
            .subscribe()
            .filter_map(move |delivery| {
                let item = match delivery {
                    Delivery::Event(entry) => entry
                        .matches(&query)
                        .then(|| Ok(AuditEntry((*entry).clone()))),
                    Delivery::Lagged(n) => Some(Err(ApiError::new(
                        super::ErrorCode::Internal,
                        format!("{n} audit entries were missed: read them from auditLog"),
                    ))),
                };
                std::future::ready(item)
            }))
    }
}

/// The extension that writes the log.
pub struct AuditTrail;

impl ExtensionFactory for AuditTrail {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(Recorder::default())
    }
}

/// One request's recorder.
#[derive(Default)]
struct Recorder {
    notes: Notes,
    variables: Mutex<Variables>,
}

impl Recorder {
    fn variables(&self) -> Variables {
        self.variables.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

/// Who is calling, as an entry names them.
fn actor(ctx: &ExtensionContext<'_>) -> (Option<Uuid>, Option<String>) {
    match ctx.data_opt::<Caller>() {
        Some(Caller::SignedIn(principal)) => (
            Some(principal.user.id),
            Some(principal.user.username.clone()),
        ),
        _ => (None, None),
    }
}

/// A field's arguments, variables filled in, secrets hidden.
fn arguments(field: &Field, variables: &Variables) -> serde_json::Map<String, serde_json::Value> {
    let mut out = serde_json::Map::new();
    for (name, value) in &field.arguments {
        let value = value
            .node
            .clone()
            .into_const_with(|var| Ok::<_, ()>(variables.get(&var).cloned().unwrap_or_default()))
            .ok()
            .and_then(|v| v.into_json().ok())
            .unwrap_or_default();
        out.insert(name.node.to_string(), value);
    }
    match hide_secrets(serde_json::Value::Object(out)) {
        serde_json::Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
}

fn code_of(error: &ServerError) -> String {
    error
        .extensions
        .as_ref()
        .and_then(|x| x.get("code"))
        .and_then(|code| match code {
            async_graphql::Value::String(s) => Some(s.clone()),
            async_graphql::Value::Enum(s) => Some(s.to_string()),
            _ => None,
        })
        .unwrap_or_else(|| "ERROR".to_owned())
}

async fn record(ctx: &ExtensionContext<'_>, entry: domain::Entry) {
    let Some(audit) = ctx.data_opt::<Audit>() else {
        return;
    };
    let action = entry.action.clone();
    if let Err(error) = audit.record(entry).await {
        // The mutation has happened; the log says it could not keep it.
        tracing::error!(%error, action, "the audit log could not record a mutation");
    }
}

fn address(ctx: &ExtensionContext<'_>) -> Option<String> {
    ctx.data_opt::<ClientAddress>()
        .and_then(|a| a.0)
        .map(|ip| ip.to_string())
}

#[async_trait::async_trait]
impl Extension for Recorder {
    async fn prepare_request(
        &self,
        ctx: &ExtensionContext<'_>,
        request: Request,
        next: NextPrepareRequest<'_>,
    ) -> ServerResult<Request> {
        next.run(ctx, request.data(self.notes.clone())).await
    }

    async fn parse_query(
        &self,
        ctx: &ExtensionContext<'_>,
        query: &str,
        variables: &Variables,
        next: NextParseQuery<'_>,
    ) -> ServerResult<ExecutableDocument> {
        let parsed = next.run(ctx, query, variables).await;
        // Only a mutation's arguments are recorded: a query keeps nothing.
        if let Ok(document) = &parsed
            && !variables.is_empty()
            && document
                .operations
                .iter()
                .any(|(_, op)| op.node.ty == OperationType::Mutation)
            && let Ok(mut kept) = self.variables.lock()
        {
            *kept = variables.clone();
        }
        // A mutation the policy guard refused never resolves: it is recorded
        // here, once per root field, when a signed-in caller was refused.
        if let Err(error) = &parsed
            && code_of(error) == "FORBIDDEN"
            && let (Some(user_id), username) = actor(ctx)
            && let Ok(document) = async_graphql::parser::parse_query(query)
        {
            for (_, operation) in document.operations.iter() {
                if operation.node.ty != OperationType::Mutation {
                    continue;
                }
                for selection in &operation.node.selection_set.node.items {
                    let Selection::Field(field) = &selection.node else {
                        continue;
                    };
                    let entry = domain::Entry {
                        id: Uuid::now_v7(),
                        at: Utc::now(),
                        user_id: Some(user_id),
                        username: username.clone(),
                        project_id: None,
                        action: field.node.name.node.to_string(),
                        arguments: arguments(&field.node, variables),
                        outcome: "FORBIDDEN".to_owned(),
                        error: Some(error.message.clone()),
                        duration: std::time::Duration::ZERO,
                        address: address(ctx),
                    };
                    record(ctx, entry).await;
                }
            }
        }
        parsed
    }

    async fn resolve(
        &self,
        ctx: &ExtensionContext<'_>,
        info: ResolveInfo<'_>,
        next: NextResolve<'_>,
    ) -> ServerResult<Option<Value>> {
        if info.parent_type != "Mutation" || info.path_node.parent.is_some() {
            return next.run(ctx, info).await;
        }
        let key = segment(info.path_node.segment);
        let action = info.name.to_owned();
        let mut args = arguments(info.field, &self.variables());
        let started = Instant::now();
        let result = next.run(ctx, info).await;
        let duration = started.elapsed();
        let noted = self.notes.of(&key);
        let (mut user_id, mut username) = actor(ctx);
        if action == "login" {
            // Who tried: the name given, and the user once signed in.
            username = args
                .get("username")
                .and_then(|v| v.as_str())
                .map(str::to_owned);
            user_id = noted.user;
        }
        for (name, value) in noted.facts {
            args.insert(name.to_owned(), value);
        }
        let (outcome, error) = match &result {
            Ok(_) => ("OK".to_owned(), None),
            Err(e) => (code_of(e), Some(e.message.clone())),
        };
        record(
            ctx,
            domain::Entry {
                id: Uuid::now_v7(),
                at: Utc::now(),
                user_id,
                username,
                project_id: noted.project,
                action,
                arguments: args,
                outcome,
                error,
                duration,
                address: address(ctx),
            },
        )
        .await;
        result
    }
}
