//! The catalog: the stored providers — create, update, delete, get, list,
//! configure, rotate the token — and the checks on what is stored (names, git
//! URLs, refs, configuration objects). A provider read here carries the live
//! state of its slot over the row.
//!
//! Never starts, stops or calls a provider (except to hand a connected one its
//! new configuration), and never changes a slot: that is the supervisor's and
//! the registry's work.

use std::sync::Arc;

use uuid::Uuid;

use super::logs::LogLine;
use super::secrets::Secrets;
use super::state::Slots;
use super::{
    NewProvider, Provider, ProviderError, ProviderEvent, ProviderPatch, ProviderSettings,
    ProviderStatus, rows, source,
};
use crate::store::{Db, DbErr};

#[derive(Clone)]
pub(super) struct Catalog {
    db: Db,
    settings: ProviderSettings,
    slots: Arc<Slots>,
    secrets: Secrets,
}

impl Catalog {
    pub fn new(db: Db, settings: ProviderSettings, slots: Arc<Slots>, secrets: Secrets) -> Self {
        Self {
            db,
            settings,
            slots,
            secrets,
        }
    }

    /// At boot nothing runs yet: statuses left by the previous run are reset.
    pub async fn reset_after_restart(&self) -> Result<(), ProviderError> {
        rows::reset_statuses(&self.db).await?;
        Ok(())
    }

    /// Every stored row, as stored.
    pub async fn rows(&self) -> Result<Vec<rows::ProviderRow>, ProviderError> {
        Ok(rows::list(&self.db).await?)
    }

    /// Stores a new provider; its id and its registration token, shown once.
    pub async fn create(&self, new: NewProvider) -> Result<(Uuid, String), ProviderError> {
        check_name(&new.name)?;
        super::run_as::check(&new.run_as)?;
        self.check_git_url(&new.git_url)?;
        check_ref(&new.git_ref)?;
        let path = check_path(&new.path)?;
        let config = config_object("config", new.config)?;
        let secret = config_object("secretConfig", new.secret_config)?;
        let token = new_token();
        let id = Uuid::new_v4();
        let row = rows::insert(
            &self.db,
            rows::NewProvider {
                id,
                name: new.name.clone(),
                git_url: new.git_url,
                git_ref: new.git_ref,
                source_path: path,
                config: config.to_string(),
                secret_config: self.secrets.seal(id, &secret),
                auto_load: new.auto_load,
                run_as: new.run_as,
                token_hash: token_hash(&token),
            },
            ProviderStatus::Unloaded,
        )
        .await
        .map_err(|e| conflict_or(e, || format!("a provider named `{}` exists", new.name)))?;
        self.slots.bus().publish(ProviderEvent::Created {
            provider_id: row.id,
            name: row.name.clone(),
        });
        Ok((row.id, token))
    }

    pub async fn update(&self, id: Uuid, patch: ProviderPatch) -> Result<Provider, ProviderError> {
        let row = self.row(id).await?;
        if let Some(name) = &patch.name {
            check_name(name)?;
        }
        if let Some(url) = &patch.git_url {
            self.check_git_url(url)?;
        }
        if let Some(reference) = &patch.git_ref {
            check_ref(reference)?;
        }
        let path = patch.path.as_deref().map(check_path).transpose()?;
        if let Some(user) = &patch.run_as {
            super::run_as::check(user)?;
        }
        let change = rows::ProviderChange {
            name: patch.name,
            git_url: patch.git_url,
            git_ref: patch.git_ref,
            source_path: path,
            auto_load: patch.auto_load,
            run_as: patch.run_as,
            ..Default::default()
        };
        rows::update(&self.db, row, change)
            .await
            .map_err(|e| conflict_or(e, || "another provider has that name".to_owned()))?;
        self.get(id).await
    }

    /// The one place of the rule: a provider that is loaded, or holds
    /// resources of deployments, cannot be deleted (the store checks the
    /// holding in the same statement as the delete).
    pub async fn delete(&self, id: Uuid) -> Result<(), ProviderError> {
        let row = self.row(id).await?;
        if let Some(slot) = self.slots.existing(id)
            && slot.is_loaded()
        {
            return Err(ProviderError::Conflict(format!(
                "provider `{}` is loaded ({}); unload it first",
                row.name,
                slot.status().as_str()
            )));
        }
        match rows::delete_unless_holding(&self.db, id).await? {
            rows::Deletion::Deleted => {}
            rows::Deletion::NotFound => {
                return Err(ProviderError::NotFound(format!("no provider with id {id}")));
            }
            rows::Deletion::Holding(holders) => {
                return Err(ProviderError::Conflict(holding_message(
                    &row.name, &holders,
                )));
            }
        }
        self.slots.remove(id);
        self.slots.bus().publish(ProviderEvent::Deleted {
            provider_id: id,
            name: row.name.clone(),
        });
        for dir in [
            self.settings.provider_state_dir(id),
            self.settings.provider_dir(id),
        ] {
            if let Err(e) = tokio::fs::remove_dir_all(&dir).await
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(provider.id = %id, error = %e, "cannot remove the provider's directory");
            }
        }
        Ok(())
    }

    /// A new registration token; the old one stops working at once.
    pub async fn rotate_token(&self, id: Uuid) -> Result<(Provider, String), ProviderError> {
        let row = self.row(id).await?;
        let token = new_token();
        let change = rows::ProviderChange {
            token_hash: Some(token_hash(&token)),
            ..Default::default()
        };
        rows::update(&self.db, row, change).await?;
        Ok((self.get(id).await?, token))
    }

    /// Stores a new configuration. When the provider is connected it is sent
    /// first, and stored only if the provider takes it. `secret = None` keeps
    /// the secret values.
    pub async fn configure(
        &self,
        id: Uuid,
        config: serde_json::Value,
        secret: Option<serde_json::Value>,
    ) -> Result<Provider, ProviderError> {
        let row = self.row(id).await?;
        let config = config_object("config", config)?;
        let secret = match secret {
            Some(value) => config_object("secretConfig", value)?,
            None => self.secrets.open(&row)?,
        };
        if let Some(link) = self.slots.slot(id).link() {
            link.configure(merge(&config, &secret).to_string())
                .await
                .map_err(|e| match e.invalid_argument() {
                    Some(why) => ProviderError::Invalid(format!(
                        "the provider refused the configuration: {why}"
                    )),
                    None => ProviderError::Unavailable(e.to_string()),
                })?;
        }
        let change = rows::ProviderChange {
            config: Some(config.to_string()),
            secret_config: Some(self.secrets.seal(id, &secret)),
            ..Default::default()
        };
        rows::update(&self.db, row, change).await?;
        self.get(id).await
    }

    pub fn settings(&self) -> &ProviderSettings {
        &self.settings
    }

    pub async fn get(&self, id: Uuid) -> Result<Provider, ProviderError> {
        let row = self.row(id).await?;
        self.to_provider(row)
    }

    pub async fn list(&self) -> Result<Vec<Provider>, ProviderError> {
        rows::list(&self.db)
            .await?
            .into_iter()
            .map(|row| self.to_provider(row))
            .collect()
    }

    /// The last `n` lines of the provider's build and run output.
    pub async fn logs(&self, id: Uuid, n: usize) -> Result<Vec<LogLine>, ProviderError> {
        self.row(id).await?;
        Ok(self.slots.slot(id).logs(n))
    }

    pub(super) async fn row(&self, id: Uuid) -> Result<rows::ProviderRow, ProviderError> {
        rows::find(&self.db, id)
            .await?
            .ok_or_else(|| ProviderError::NotFound(format!("no provider with id {id}")))
    }

    fn check_git_url(&self, url: &str) -> Result<(), ProviderError> {
        source::check_url(url, &self.settings.source())
            .and_then(|()| source::check_local(url))
            .map_err(|e| ProviderError::Invalid(format!("gitUrl: {e}")))
    }

    fn to_provider(&self, row: rows::ProviderRow) -> Result<Provider, ProviderError> {
        let config = parse_object(&row.config)?;
        let secret = self.secrets.open(&row)?;
        let mut secret_keys: Vec<String> = secret
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        secret_keys.sort();
        let metadata = row
            .metadata
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| ProviderError::Corrupt(format!("provider metadata: {e}")))?;
        let mut provider = Provider {
            id: row.id,
            name: row.name,
            git_url: source::display_url(&row.git_url),
            git_ref: row.git_ref,
            path: row.source_path,
            config,
            secret_keys,
            auto_load: row.auto_load,
            run_as: row.run_as,
            status: row.status,
            status_message: row.status_message,
            resolved_commit: row.resolved_commit,
            metadata,
            features: string_list(&row.features)?,
            resource_types: string_list(&row.resource_types)?,
            restarts: row.restarts,
            last_seen_at: row.last_seen_at,
            created_at: row.created_at,
            updated_at: row.updated_at,
        };
        // What runs now is known here, not in the row: the row trails it.
        if let Some(slot) = self.slots.existing(row.id) {
            slot.overlay(&mut provider);
        }
        Ok(provider)
    }
}

fn check_name(name: &str) -> Result<(), ProviderError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(ProviderError::Invalid(format!(
            "name: `{name}` must be 1 to 64 characters of A-Z, a-z, 0-9, `.`, `_`, `-`"
        )))
    }
}

fn check_ref(reference: &str) -> Result<(), ProviderError> {
    if reference.len() > 255 || reference.chars().any(|c| c.is_control() || c == ' ') {
        return Err(ProviderError::Invalid(
            "ref: must be a tag, branch or commit (at most 255 characters, no spaces)".into(),
        ));
    }
    Ok(())
}

/// A subdirectory of the repository, as stored: relative, `/`-separated, no
/// `.` or `..` parts, no trailing `/`; the root is empty.
fn check_path(path: &str) -> Result<String, ProviderError> {
    let invalid =
        |why: &str| ProviderError::Invalid(format!("path: `{}` {why}", path.escape_default()));
    if path.len() > 255 {
        return Err(invalid("is longer than 255 bytes"));
    }
    if path.chars().any(char::is_control) || path.contains('\\') {
        return Err(invalid("contains a control character or `\\`"));
    }
    if path.starts_with('/') {
        return Err(invalid(
            "must be relative to the repository's root (no leading `/`)",
        ));
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(invalid("must stay inside the repository (no `..`)")),
            part => parts.push(part),
        }
    }
    Ok(parts.join("/"))
}

fn config_object(
    field: &str,
    value: serde_json::Value,
) -> Result<serde_json::Value, ProviderError> {
    match value {
        serde_json::Value::Object(_) => Ok(value),
        serde_json::Value::Null => Ok(serde_json::json!({})),
        other => Err(ProviderError::Invalid(format!(
            "{field}: must be a JSON object, not {}",
            json_kind(&other)
        ))),
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

pub(super) fn parse_object(text: &str) -> Result<serde_json::Value, ProviderError> {
    serde_json::from_str(text).map_err(|e| ProviderError::Corrupt(format!("provider config: {e}")))
}

fn string_list(text: &str) -> Result<Vec<String>, ProviderError> {
    serde_json::from_str(text).map_err(|e| ProviderError::Corrupt(format!("provider list: {e}")))
}

/// The configuration a provider receives: plain values, then secret ones.
pub(super) fn merge(config: &serde_json::Value, secret: &serde_json::Value) -> serde_json::Value {
    let mut merged = config.as_object().cloned().unwrap_or_default();
    if let Some(secret) = secret.as_object() {
        merged.extend(secret.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    serde_json::Value::Object(merged)
}

pub(super) fn new_token() -> String {
    crate::secret::new_token("cbp_")
}

pub(super) fn token_hash(token: &str) -> String {
    crate::secret::hash_token(token)
}

fn conflict_or(e: DbErr, message: impl FnOnce() -> String) -> ProviderError {
    if crate::store::is_conflict(&e) {
        ProviderError::Conflict(message())
    } else {
        ProviderError::Db(e)
    }
}

/// How many deployments a refusal to delete names; the rest are counted.
const HOLDERS_NAMED: usize = 5;

/// Why a provider cannot be deleted: the deployments holding resources on it,
/// by name and id, the first few named and the rest counted.
fn holding_message(provider: &str, holders: &[crate::store::deployments::Holder]) -> String {
    let resources: u64 = holders.iter().map(|h| h.nodes).sum();
    let mut named: Vec<String> = holders
        .iter()
        .take(HOLDERS_NAMED)
        .map(|h| {
            format!(
                "`{}` ({}, {} resource(s))",
                h.deployment_name, h.deployment_id, h.nodes
            )
        })
        .collect();
    if holders.len() > HOLDERS_NAMED {
        named.push(format!("and {} more", holders.len() - HOLDERS_NAMED));
    }
    format!(
        "provider `{provider}` holds {resources} resource(s) of {} deployment(s): {}; \
         destroy them first",
        holders.len(),
        named.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_override_plain_values_when_merged() {
        let merged = merge(
            &serde_json::json!({"a": 1, "password": "shown?"}),
            &serde_json::json!({"password": "hidden"}),
        );
        assert_eq!(merged, serde_json::json!({"a": 1, "password": "hidden"}));
    }

    #[test]
    fn a_refused_delete_names_a_few_holders_and_counts_the_rest() {
        let holders: Vec<_> = (0..7)
            .map(|i| crate::store::deployments::Holder {
                deployment_id: Uuid::from_u128(i),
                deployment_name: format!("d{i}"),
                nodes: 2,
            })
            .collect();
        let message = holding_message("process", &holders);
        assert!(
            message.starts_with("provider `process` holds 14 resource(s) of 7 deployment(s): "),
            "{message}"
        );
        assert!(
            message.contains(&format!(
                "`d4` ({}, 2 resource(s)), and 2 more;",
                Uuid::from_u128(4)
            )),
            "{message}"
        );
        assert!(!message.contains("`d5`"), "{message}");
    }

    #[test]
    fn names_refs_and_configs_are_checked() {
        assert!(check_name("process").is_ok());
        assert!(check_name("bad name").is_err());
        assert!(check_name("").is_err());
        assert!(check_ref("v1.0").is_ok());
        assert!(check_ref("a\nb").is_err());
        assert!(config_object("config", serde_json::json!([1])).is_err());
        assert_eq!(
            config_object("config", serde_json::Value::Null).unwrap(),
            serde_json::json!({})
        );
    }
}
