//! The audit trail: every mutation, whoever made it and however it ended, is
//! an [`Entry`] (who, which project, what, when, the outcome, the arguments
//! with secrets hidden). The API records them (`api::audit`); this area keeps
//! them, answers queries on them, publishes each as it is made, for admins to
//! follow live, and forgets them after the retention the server is given.
//!
//! An entry is written before the mutation's answer goes out: whoever got an
//! answer can find its entry.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::events::Bus;
use crate::store::Db;
use crate::store::audit::{self as rows, AuditRow};
pub use crate::store::audit::{AuditQuery, OutcomeFilter};

/// One recorded mutation.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Entry {
    pub id: Uuid,
    pub at: DateTime<Utc>,
    pub user_id: Option<Uuid>,
    pub username: Option<String>,
    pub project_id: Option<Uuid>,
    pub action: String,
    /// The arguments, secrets hidden (see [`hide_secrets`]).
    pub arguments: Map<String, Value>,
    /// `OK`, or the error's code.
    pub outcome: String,
    pub error: Option<String>,
    pub duration: Duration,
    /// The address the request came from, when known.
    pub address: Option<String>,
}

impl Entry {
    fn from_row(row: AuditRow) -> Self {
        Self {
            id: row.id,
            at: row.at,
            user_id: row.user_id,
            username: row.username,
            project_id: row.project_id,
            action: row.action,
            // Written by `record` from a map; anything else reads as empty
            // rather than failing the whole log.
            arguments: serde_json::from_str(&row.arguments).unwrap_or_default(),
            outcome: row.outcome,
            error: row.error,
            duration: Duration::from_micros(row.duration_micros.max(0) as u64),
            address: row.address,
        }
    }

    fn to_row(&self) -> AuditRow {
        AuditRow {
            id: self.id,
            at: self.at,
            user_id: self.user_id,
            username: self.username.clone(),
            project_id: self.project_id,
            action: self.action.clone(),
            arguments: Value::Object(self.arguments.clone()).to_string(),
            outcome: self.outcome.clone(),
            error: self.error.clone(),
            duration_micros: i64::try_from(self.duration.as_micros()).unwrap_or(i64::MAX),
            address: self.address.clone(),
        }
    }

    /// Whether `query` selects this entry (for the live feed, as the store
    /// does for the log).
    pub fn matches(&self, query: &AuditQuery) -> bool {
        query.user_id.is_none_or(|id| self.user_id == Some(id))
            && query.username.as_ref().is_none_or(|name| {
                self.username
                    .as_ref()
                    .is_some_and(|u| u.eq_ignore_ascii_case(name))
            })
            && query
                .project_ids
                .as_ref()
                .is_none_or(|ids| self.project_id.is_some_and(|p| ids.contains(&p)))
            && query
                .actions
                .as_ref()
                .is_none_or(|actions| actions.contains(&self.action))
            && match &query.outcome {
                None => true,
                Some(OutcomeFilter::Ok) => self.outcome == "OK",
                Some(OutcomeFilter::Failed) => self.outcome != "OK",
                Some(OutcomeFilter::Code(code)) => &self.outcome == code,
            }
            && query.since.is_none_or(|at| self.at >= at)
            && query.until.is_none_or(|at| self.at < at)
    }
}

#[derive(Clone)]
pub struct Audit {
    db: Db,
    bus: Bus<Entry>,
}

impl Audit {
    pub fn new(db: Db, bus: Bus<Entry>) -> Self {
        Self { db, bus }
    }

    /// Stores `entry` and publishes it.
    pub async fn record(&self, entry: Entry) -> Result<(), crate::store::DbErr> {
        rows::insert(&self.db, entry.to_row()).await?;
        metrics::counter!("corbel_audit_entries_total", "outcome" => outcome_label(&entry.outcome))
            .increment(1);
        self.bus.publish(entry);
        Ok(())
    }

    /// Up to `limit` entries matching `query`, newest first, older than
    /// `before` when given.
    pub async fn list(
        &self,
        query: &AuditQuery,
        before: Option<Uuid>,
        limit: u64,
    ) -> Result<Vec<Entry>, crate::store::DbErr> {
        Ok(rows::list(&self.db, query, before, limit)
            .await?
            .into_iter()
            .map(Entry::from_row)
            .collect())
    }

    pub async fn count(&self, query: &AuditQuery) -> Result<u64, crate::store::DbErr> {
        rows::count(&self.db, query).await
    }

    pub fn events(&self) -> &Bus<Entry> {
        &self.bus
    }

    /// Forgets entries older than `days` days, now and every hour until
    /// `stop`; `0` keeps everything.
    pub fn spawn_pruning(&self, days: u32, stop: CancellationToken) {
        if days == 0 {
            return;
        }
        let db = self.db.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(3600));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = every.tick() => {}
                }
                let before = Utc::now() - chrono::TimeDelta::days(i64::from(days));
                match rows::prune(&db, before).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(entries = n, days, "pruned the audit log"),
                    Err(error) => tracing::warn!(%error, "pruning the audit log failed"),
                }
            }
        });
    }
}

/// A bounded label for the outcome metric.
fn outcome_label(outcome: &str) -> &'static str {
    if outcome == "OK" { "ok" } else { "error" }
}

/// The longest string argument kept whole; longer ones (a blueprint's source)
/// keep their start and say how long they were.
const MAX_STRING: usize = 2048;

/// `value` as the log may keep it: the value of any key that names a secret
/// (a password, a token, `secretConfig`, a credential; see
/// [`crate::redact::is_credential_name`]) is replaced by `***` whole, URLs
/// lose their credentials, and long strings are cut.
pub fn hide_secrets(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(key, value)| {
                    let value = if names_secret(&key) {
                        Value::String(crate::redact::HIDDEN.to_owned())
                    } else {
                        hide_secrets(value)
                    };
                    (key, value)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(hide_secrets).collect()),
        Value::String(text) => Value::String(shorten(crate::redact::url(&text))),
        other => other,
    }
}

fn names_secret(key: &str) -> bool {
    let lower = key.to_ascii_lowercase();
    crate::redact::is_credential_name(key)
        || lower.contains("secret")
        || lower.contains("password")
        || lower.contains("token")
        || lower == "stdin" // what is typed into an exec
}

fn shorten(text: String) -> String {
    if text.len() <= MAX_STRING {
        return text;
    }
    let mut cut = MAX_STRING;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes)", &text[..cut], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_are_hidden_wherever_they_are() {
        let hidden = hide_secrets(json!({
            "username": "ann",
            "password": "hunter2",
            "input": {
                "name": "p",
                "config": {"port": 8080},
                "secretConfig": {"apiKey": "s3cr3t"},
                "driver": {"url": "https://user:tok3n@git.example/x.git?access_token=abc"},
                "currentPassword": "old",
                "list": [{"token": "t0k"}],
            }
        }));
        let text = hidden.to_string();
        for secret in ["hunter2", "s3cr3t", "tok3n", "abc", "old", "t0k"] {
            assert!(!text.contains(secret), "{secret} is in {text}");
        }
        assert_eq!(hidden["username"], "ann");
        assert_eq!(hidden["input"]["config"]["port"], 8080);
        assert_eq!(hidden["input"]["secretConfig"], "***");
        assert_eq!(
            hidden["input"]["driver"]["url"],
            "https://***@git.example/x.git?access_token=***"
        );
    }

    #[test]
    fn long_strings_are_cut_on_a_character() {
        let long = "é".repeat(3000);
        let Value::String(cut) = hide_secrets(Value::String(long)) else {
            panic!("a string stays a string");
        };
        assert!(cut.len() < 2100 && cut.ends_with("(6000 bytes)"), "{cut}");
    }
}
