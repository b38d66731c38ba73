//! Blueprints: create, update, delete and read stored blueprints, each parsed
//! and checked before it is stored. Never starts a run nor calls a provider
//! (it only asks `Providers` which resource types have one, for warnings).

use std::sync::atomic::AtomicBool;

use uuid::Uuid;

use super::{DeployError, Deployments, StoredBlueprint, blueprint};
use crate::store::DbErr;
use crate::store::deployments as rows;

/// The blueprints part of [`Deployments`].
#[derive(Clone, Copy)]
pub struct Blueprints<'a>(pub(super) &'a Deployments);

impl Blueprints<'_> {
    /// Stores a blueprint in `project`.
    pub async fn create(
        &self,
        project_id: Uuid,
        name: String,
        description: Option<String>,
        source: String,
    ) -> Result<StoredBlueprint, DeployError> {
        check_name(&name)?;
        let (source, parsed) = parse_off_workers(source).await?;
        let row = rows::insert_blueprint(
            &self.0.inner.db,
            project_id,
            name.clone(),
            description,
            source,
        )
        .await
        .map_err(|e| {
            conflict_or(e, || {
                format!("a blueprint named `{name}` exists in this project")
            })
        })?;
        Ok(stored(row, parsed))
    }

    /// The project a blueprint goes in when none is named: `default`.
    pub async fn default_project(&self) -> Result<Uuid, DeployError> {
        Ok(
            crate::store::projects::ensure_project(&self.0.inner.db, crate::auth::DEFAULT_PROJECT)
                .await?,
        )
    }

    pub async fn update(
        &self,
        id: Uuid,
        name: Option<String>,
        description: Option<String>,
        source: Option<String>,
    ) -> Result<StoredBlueprint, DeployError> {
        let row = self.row(id).await?;
        if let Some(name) = &name {
            check_name(name)?;
        }
        let (source, parsed) = match source {
            Some(source) => {
                let (source, parsed) = parse_off_workers(source).await?;
                (Some(source), Some(parsed))
            }
            None => (None, None),
        };
        let change = rows::BlueprintChange {
            name,
            description,
            source,
        };
        let row = rows::update_blueprint(&self.0.inner.db, row, change)
            .await
            .map_err(|e| {
                conflict_or(e, || {
                    "another blueprint of the project has that name".to_owned()
                })
            })?;
        match parsed {
            Some(parsed) => Ok(stored(row, parsed)),
            None => to_blueprint(row),
        }
    }

    pub async fn delete(&self, id: Uuid) -> Result<(), DeployError> {
        let row = self.row(id).await?;
        let live = rows::count_live_deployments(&self.0.inner.db, id).await?;
        if live > 0 {
            return Err(DeployError::Conflict(format!(
                "blueprint `{}` is used by {live} deployment(s) that are not destroyed",
                row.name
            )));
        }
        rows::delete_blueprint(&self.0.inner.db, id).await?;
        Ok(())
    }

    pub async fn get(&self, id: Uuid) -> Result<StoredBlueprint, DeployError> {
        to_blueprint(self.row(id).await?)
    }

    /// Blueprints of the `projects` given (all when `None`).
    pub async fn list(
        &self,
        projects: Option<&[Uuid]>,
    ) -> Result<Vec<StoredBlueprint>, DeployError> {
        rows::list_blueprints(&self.0.inner.db, projects)
            .await?
            .into_iter()
            .map(to_blueprint)
            .collect()
    }

    /// Resource types of the blueprint that no provider serves: a warning until
    /// deploy, an error then.
    pub async fn warnings(&self, blueprint: &blueprint::Blueprint) -> Vec<String> {
        let mut warnings = Vec::new();
        for resource in &blueprint.resources {
            if let Err(e) = self
                .0
                .inner
                .providers
                .for_resource_type(&resource.resource_type, resource.provider.as_deref())
                .await
            {
                warnings.push(format!("resources.{}.type: {e}", resource.key));
            }
        }
        warnings
    }

    async fn row(&self, id: Uuid) -> Result<rows::BlueprintRow, DeployError> {
        rows::find_blueprint(&self.0.inner.db, id)
            .await?
            .ok_or_else(|| DeployError::NotFound(format!("no blueprint with id {id}")))
    }
}

/// A blueprint's or a deployment's name: 1 to 128 printable characters.
pub(super) fn check_name(name: &str) -> Result<(), DeployError> {
    if name.trim().is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(DeployError::Invalid(format!(
            "name: `{name}` must be 1 to 128 printable characters"
        )));
    }
    Ok(())
}

/// Parses and checks a blueprint; every problem is named at once.
pub fn parse_checked(source: &str) -> Result<blueprint::Blueprint, DeployError> {
    parse_checked_until(source, &crate::cpu::NEVER)
}

/// [`parse_checked`] on the blocking pool (`crate::cpu`), for a source a
/// client sent: the async workers stay free, and when the request's
/// deadline drops this future the parse stops. Hands the source back with
/// what it parsed to.
pub(super) async fn parse_off_workers(
    source: String,
) -> Result<(String, blueprint::Blueprint), DeployError> {
    crate::cpu::run(move |stop| {
        let parsed = parse_checked_until(&source, stop)?;
        Ok((source, parsed))
    })
    .await
}

/// [`parse_checked`], giving up once `stop` is set. Linear in the source:
/// the problems (at most `blueprint::MAX_PROBLEMS` and a count) are placed
/// on their lines in one more read.
pub fn parse_checked_until(
    source: &str,
    stop: &AtomicBool,
) -> Result<blueprint::Blueprint, DeployError> {
    let located = |problems: Vec<blueprint::Problem>| {
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        let lines = crate::yaml::lines_of(source, &paths, stop);
        DeployError::Blueprint(
            problems
                .into_iter()
                .zip(lines)
                .map(|(problem, line)| super::LocatedProblem {
                    line: line.or_else(|| line_in(&problem.message)),
                    problem,
                })
                .collect(),
        )
    };
    let parsed = blueprint::parse_until(source, stop).map_err(|p| located(p.0))?;
    let problems = blueprint::check_until(&parsed, stop);
    if problems.is_empty() {
        Ok(parsed)
    } else {
        Err(located(problems))
    }
}

/// The line a YAML reader's message names (`… at line 5 column 4`), for a
/// problem with the document as a whole.
fn line_in(message: &str) -> Option<usize> {
    let (_, after) = message.rsplit_once("line ")?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().filter(|&n| n > 0)
}

fn to_blueprint(row: rows::BlueprintRow) -> Result<StoredBlueprint, DeployError> {
    let parsed = blueprint::parse(&row.source).map_err(|p| DeployError::Corrupt(p.to_string()))?;
    Ok(stored(row, parsed))
}

/// A stored row with what its source parses to.
fn stored(row: rows::BlueprintRow, parsed: blueprint::Blueprint) -> StoredBlueprint {
    StoredBlueprint {
        id: row.id,
        name: row.name,
        description: row.description,
        source: row.source,
        parsed,
        created_at: row.created_at,
        updated_at: row.updated_at,
        project_id: row.project_id,
    }
}

fn conflict_or(e: DbErr, message: impl FnOnce() -> String) -> DeployError {
    if crate::store::is_conflict(&e) {
        DeployError::Conflict(message())
    } else {
        DeployError::Db(e)
    }
}
