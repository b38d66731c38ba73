//! A repository's credentials at rest: a driver whose URL carries secrets
//! (userinfo, a credential parameter such as `?access_token=`; see
//! `crate::redact`) is stored sealed with the server's secret key, for the
//! repository's id, like a provider's `secretConfig`: the database alone
//! never shows it, and a value copied to another row does not open. A driver
//! without secrets is stored as it is (nothing to hide, and readable).
//!
//! At start, [`reseal`] seals the rows stored in the clear by an earlier
//! version and checks that the sealed ones open; with a new key it is the
//! rotation (`corbel secret-key rotate`), in one transaction.

use uuid::Uuid;

use super::{DriverSpec, RepositoryError};
use crate::seal::{self, Resealed, Rotated, SecretKey};
use crate::store::Db;
use crate::store::repositories::{self as rows, RepositoryRow};

/// The associated data of a repository's sealed driver: its id.
fn context(id: Uuid) -> Vec<u8> {
    format!("corbel repository {id} driver").into_bytes()
}

/// Whether `spec` carries a secret.
fn has_secrets(spec: &DriverSpec) -> bool {
    match spec {
        DriverSpec::Http { url } => !crate::redact::secrets(url).is_empty(),
        _ => false,
    }
}

/// The stored form of repository `id`'s driver: sealed when it carries a
/// secret (and a key is at hand: a server always has one).
pub(super) fn stored(key: Option<&SecretKey>, id: Uuid, spec: &DriverSpec) -> String {
    let json = serde_json::to_string(spec).expect("a driver spec serialises");
    match key {
        Some(key) if has_secrets(spec) => key.seal(&context(id), json.as_bytes()),
        _ => json,
    }
}

/// A stored row's driver, opened if sealed.
pub(super) fn read(
    key: Option<&SecretKey>,
    row: &RepositoryRow,
) -> Result<DriverSpec, RepositoryError> {
    let named = |what: String| format!("repository `{}` ({}): its driver {what}", row.name, row.id);
    let json = if seal::is_sealed(&row.driver_spec) {
        let Some(key) = key else {
            return Err(RepositoryError::Corrupt(named(
                "is sealed, and no secret key is loaded".into(),
            )));
        };
        key.open(&context(row.id), &row.driver_spec)
            .map_err(|e| RepositoryError::Corrupt(named(format!("does not open: {e}"))))?
    } else {
        row.driver_spec.clone().into_bytes()
    };
    serde_json::from_slice(&json)
        .map_err(|e| RepositoryError::Corrupt(named(format!("is not valid: {e}"))))
}

/// Puts every repository's driver that carries a secret under `new`, in one
/// transaction: clear ones are sealed, ones under `current` opened and
/// sealed again, ones under `new` checked and kept. A driver that cannot be
/// read refuses the whole change, naming every such repository; nothing is
/// written then. With `current` = `new` (at start) only clear rows change,
/// so running it again changes nothing.
pub async fn reseal(
    db: &Db,
    current: &SecretKey,
    new: &SecretKey,
) -> Result<Resealed, RepositoryError> {
    let mut done = Resealed::default();
    let mut changes = Vec::new();
    let mut unreadable = Vec::new();
    for row in rows::list_repositories(db).await? {
        let named =
            |what: String| format!("repository `{}` ({}): its driver {what}", row.name, row.id);
        let text = if seal::is_sealed(&row.driver_spec) {
            match seal::rotate(current, new, &context(row.id), &row.driver_spec) {
                Ok(Rotated::Kept) => {
                    done.kept += 1;
                    continue;
                }
                Ok(Rotated::Resealed(text)) => {
                    done.rotated += 1;
                    text
                }
                Err(e) => {
                    unreadable.push(named(format!("does not open: {e}")));
                    continue;
                }
            }
        } else {
            match read(None, &row) {
                Ok(spec) if has_secrets(&spec) => {
                    done.plain += 1;
                    stored(Some(new), row.id, &spec)
                }
                Ok(_) => continue,
                Err(e) => {
                    unreadable.push(e.to_string());
                    continue;
                }
            }
        };
        changes.push((row.id, row.driver_spec.clone(), text));
    }
    if !unreadable.is_empty() {
        return Err(RepositoryError::Corrupt(unreadable.join("; ")));
    }
    rows::replace_driver_specs(db, &changes).await?;
    Ok(done)
}
