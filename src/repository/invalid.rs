//! Invalid elements: what a sync (or a LAZY first fetch) could not take as an
//! element, kept with the reason so that one bad entry never fails the whole
//! repository. A sync replaces the listing's problems; a manifest's problem is
//! tied to its element and goes when a good manifest is stored or the entry
//! changes.

use uuid::Uuid;

use super::{InvalidElement, Repositories, RepositoryError};
use crate::store::Db;
use crate::store::repositories as rows;
use crate::text::bounded;

impl Repositories {
    /// A page of the repository's invalid elements, by path, and the total.
    pub async fn invalid_elements(
        &self,
        repository_id: Uuid,
        offset: u64,
        limit: u64,
    ) -> Result<(Vec<InvalidElement>, u64), RepositoryError> {
        let (found, total) = rows::list_invalid(&self.db, repository_id, offset, limit).await?;
        Ok((
            found
                .into_iter()
                .map(|row| InvalidElement {
                    name: row.name,
                    version: row.version,
                    path: row.path,
                    message: row.message,
                    element_id: row.element_id,
                })
                .collect(),
            total,
        ))
    }

    pub async fn invalid_count(&self, repository_id: Uuid) -> Result<u64, RepositoryError> {
        Ok(rows::count_invalid(&self.db, repository_id).await?)
    }
}

impl InvalidElement {
    /// A stored element whose manifest (or per-element listing) is bad.
    pub fn of_element(
        element_id: Uuid,
        name: &str,
        version: &str,
        path: String,
        error: &RepositoryError,
    ) -> Self {
        InvalidElement {
            name: Some(name.to_owned()),
            version: Some(version.to_owned()),
            path,
            message: error.to_string(),
            element_id: Some(element_id),
        }
    }

    /// As stored: each text cut to a bound, since all of it comes from the
    /// source (a name may be any YAML value, a message quotes the entry).
    pub(super) fn into_write(self) -> rows::InvalidWrite {
        rows::InvalidWrite {
            element_id: self.element_id,
            name: self.name.map(|n| bounded(n, 256, "…")),
            version: self.version.map(|v| bounded(v, 256, "…")),
            path: bounded(self.path, 1024, "…"),
            message: bounded(self.message, 2048, "…"),
        }
    }
}

/// Records a stored element's problem; a failure to record is logged, since
/// the caller reports the problem itself either way.
pub(super) async fn record(db: &Db, repository_id: Uuid, problem: InvalidElement) {
    let element = problem.element_id;
    if let Err(e) = rows::record_element_problem(db, repository_id, problem.into_write()).await {
        tracing::warn!(repository.id = %repository_id, element.id = ?element, error = %e,
            "an invalid element could not be recorded");
    }
}

/// `inventory.json#/elements/{name}/{version}`, escaped as a JSON pointer.
pub fn entry_path(name: &str, version: &str) -> String {
    let escape = |s: &str| s.replace('~', "~0").replace('/', "~1");
    format!(
        "inventory.json#/elements/{}/{}",
        escape(name),
        escape(version)
    )
}
