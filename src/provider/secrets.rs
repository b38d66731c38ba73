//! A provider's `secretConfig` at rest: sealed with the server's secret key
//! (`crate::seal`), for the provider's id, so the database alone never shows
//! it and a value copied to another row does not open.
//!
//! The rules, all here: a row is written sealed ([`Secrets::seal`]); a row is
//! read by opening it ([`Secrets::open`]), and one that is not sealed, or does
//! not open, is an error naming the provider, never read as plain text; at
//! start, [`reseal`] seals the rows stored before sealing existed and checks
//! that every other row opens; [`reseal`] with a new key is the rotation.

use std::sync::Arc;

use uuid::Uuid;

use super::{ProviderError, rows};
use crate::seal::{self, OpenError, Resealed, Rotated, SecretKey};
use crate::store::Db;

/// Seals and opens `secretConfig`s with the server's key.
#[derive(Clone, Debug)]
pub(super) struct Secrets {
    key: Arc<SecretKey>,
}

/// The associated data of a provider's sealed `secretConfig`: its id.
fn context(id: Uuid) -> Vec<u8> {
    format!("corbel provider {id} secretConfig").into_bytes()
}

impl Secrets {
    pub fn new(key: SecretKey) -> Self {
        Self { key: Arc::new(key) }
    }

    /// The stored form of provider `id`'s `secretConfig`.
    pub fn seal(&self, id: Uuid, value: &serde_json::Value) -> String {
        self.key.seal(&context(id), value.to_string().as_bytes())
    }

    /// [`reseal`] under this server's key: seals unsealed rows, checks the
    /// others.
    pub async fn seal_stored(&self, db: &Db) -> Result<Resealed, ProviderError> {
        reseal(db, &self.key, &self.key).await
    }

    /// The row's `secretConfig`, opened.
    pub fn open(&self, row: &rows::ProviderRow) -> Result<serde_json::Value, ProviderError> {
        open(&self.key, row)
    }
}

fn open(key: &SecretKey, row: &rows::ProviderRow) -> Result<serde_json::Value, ProviderError> {
    let named = |what: String| {
        format!(
            "provider `{}` ({}): its secretConfig {what}",
            row.name, row.id
        )
    };
    if !seal::is_sealed(&row.secret_config) {
        return Err(ProviderError::Sealed(named(
            "is stored unsealed; the server seals such rows when it starts".into(),
        )));
    }
    let plain = key
        .open(&context(row.id), &row.secret_config)
        .map_err(|e| ProviderError::Sealed(named(open_message(e))))?;
    serde_json::from_slice(&plain)
        .map_err(|e| ProviderError::Corrupt(named(format!("is not JSON once opened: {e}"))))
}

fn open_message(e: OpenError) -> String {
    match e {
        OpenError::OtherKey {
            sealed_with,
            this_key,
        } => format!(
            "was sealed with secret key {sealed_with}, but this server's key is {this_key}: \
             start the server with the key file it was sealed with (--secret-key-file), or, \
             if a rotation to that key was interrupted, run \
             `corbel secret-key rotate --new-key-file <that key file>` again"
        ),
        other => other.to_string(),
    }
}

/// Puts every provider's `secretConfig` under `new`, in one transaction:
/// rows stored unsealed are sealed, rows under `current` are opened and
/// sealed again, rows already under `new` are checked to open and kept. Any
/// row that cannot be read (another key, a changed value) refuses the whole
/// change, naming every such provider; nothing is written then.
///
/// At start `current` and `new` are the same key: only unsealed rows change,
/// so running it again changes nothing. For a rotation, a run interrupted
/// before its commit changed nothing, and one interrupted after it finds the
/// rows under `new` and keeps them: running it again finishes either.
pub async fn reseal(
    db: &Db,
    current: &SecretKey,
    new: &SecretKey,
) -> Result<Resealed, ProviderError> {
    let mut done = Resealed::default();
    let mut changes = Vec::new();
    let mut unreadable = Vec::new();
    for row in rows::list(db).await? {
        let stored = if !seal::is_sealed(&row.secret_config) {
            match serde_json::from_str::<serde_json::Value>(&row.secret_config) {
                Ok(value @ serde_json::Value::Object(_)) => {
                    done.plain += 1;
                    new.seal(&context(row.id), value.to_string().as_bytes())
                }
                _ => {
                    unreadable.push(format!(
                        "provider `{}` ({}): its secretConfig is neither sealed nor a JSON object",
                        row.name, row.id
                    ));
                    continue;
                }
            }
        } else {
            match seal::rotate(current, new, &context(row.id), &row.secret_config) {
                Ok(Rotated::Kept) => {
                    done.kept += 1;
                    continue;
                }
                Ok(Rotated::Resealed(stored)) => {
                    done.rotated += 1;
                    stored
                }
                Err(e) => {
                    unreadable.push(format!(
                        "provider `{}` ({}): its secretConfig {}",
                        row.name,
                        row.id,
                        open_message(e)
                    ));
                    continue;
                }
            }
        };
        changes.push(rows::SecretChange {
            id: row.id,
            new: stored,
            old: row.secret_config,
        });
    }
    if !unreadable.is_empty() {
        return Err(ProviderError::Sealed(format!(
            "{} stored secretConfig(s) cannot be read, nothing was changed: {}",
            unreadable.len(),
            unreadable.join("; ")
        )));
    }
    if !changes.is_empty() {
        rows::replace_secret_configs(db, changes).await?;
    }
    Ok(done)
}
