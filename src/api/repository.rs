//! Repositories and elements in the API.

use async_graphql::{
    Context, Enum, ID, InputObject, Json, Object, OneofObject, SimpleObject, Union,
};
use chrono::{DateTime, Utc};

use super::pagination::{Page, page_of, window};
use super::{ApiError, parse_id, principal, state};
use crate::repository::{self as domain, DriverSpec, ElementFilter as DomainFilter, Repositories};

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// Store names and versions; fetch a manifest when it is first needed.
    Lazy,
    /// Store everything at sync time.
    Copy,
}

impl From<SyncMode> for domain::SyncMode {
    fn from(m: SyncMode) -> Self {
        match m {
            SyncMode::Lazy => domain::SyncMode::Lazy,
            SyncMode::Copy => domain::SyncMode::Copy,
        }
    }
}

impl From<domain::SyncMode> for SyncMode {
    fn from(m: domain::SyncMode) -> Self {
        match m {
            domain::SyncMode::Lazy => SyncMode::Lazy,
            domain::SyncMode::Copy => SyncMode::Copy,
        }
    }
}

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
pub enum RepositoryStatus {
    New,
    Syncing,
    Active,
    Error,
}

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
pub enum ElementStatus {
    New,
    InProgress,
    Active,
    Error,
}

#[derive(InputObject)]
pub struct HttpDriverInput {
    /// Base URL of a static file server in the nginx layout.
    url: String,
}

#[derive(InputObject)]
pub struct LocalDriverInput {
    /// Absolute path of a directory of YAML manifests on the server.
    path: String,
}

/// The migration driver takes no settings; pass `{}`.
#[derive(InputObject, Default)]
pub struct MigrationDriverInput {
    /// Ignored; GraphQL input objects need at least one field.
    note: Option<String>,
}

#[derive(InputObject)]
pub struct ProviderDriverInput {
    /// A provider with the `repository` feature.
    provider_id: ID,
}

/// Exactly one driver.
#[derive(OneofObject)]
pub enum DriverInput {
    Http(HttpDriverInput),
    Local(LocalDriverInput),
    Migration(MigrationDriverInput),
    Provider(ProviderDriverInput),
}

impl TryFrom<DriverInput> for DriverSpec {
    type Error = ApiError;

    fn try_from(d: DriverInput) -> Result<Self, ApiError> {
        Ok(match d {
            DriverInput::Http(h) => DriverSpec::Http { url: h.url },
            DriverInput::Local(l) => DriverSpec::Local {
                path: l.path.into(),
            },
            DriverInput::Migration(m) => {
                let _ = m.note;
                DriverSpec::Migration
            }
            DriverInput::Provider(p) => DriverSpec::Provider {
                provider_id: parse_id(&p.provider_id, "driver.provider.providerId")?,
            },
        })
    }
}

#[derive(InputObject)]
pub struct CreateRepositoryInput {
    name: String,
    driver: DriverInput,
    #[graphql(default_with = "SyncMode::Lazy")]
    sync_mode: SyncMode,
    /// Higher wins when several repositories offer a name.
    #[graphql(default = 0)]
    priority: i32,
    #[graphql(default = 3600)]
    refresh_interval_seconds: i64,
}

#[derive(InputObject)]
pub struct UpdateRepositoryInput {
    name: Option<String>,
    driver: Option<DriverInput>,
    sync_mode: Option<SyncMode>,
    priority: Option<i32>,
    refresh_interval_seconds: Option<i64>,
}

#[derive(InputObject, Default)]
pub struct ElementFilter {
    name: Option<String>,
    repository_id: Option<ID>,
    installed: Option<bool>,
    /// Part of the name.
    search: Option<String>,
}

#[derive(SimpleObject)]
pub struct HttpDriver {
    kind: String,
    /// The URL with its credentials hidden (userinfo, token parameters).
    url: String,
}

#[derive(SimpleObject)]
pub struct LocalDriver {
    kind: String,
    path: String,
}

#[derive(SimpleObject)]
pub struct MigrationDriver {
    kind: String,
}

#[derive(SimpleObject)]
pub struct ProviderDriver {
    kind: String,
    provider_id: ID,
}

#[derive(Union)]
pub enum Driver {
    Http(HttpDriver),
    Local(LocalDriver),
    Migration(MigrationDriver),
    Provider(ProviderDriver),
}

/// How far the current (or last) sync got.
#[derive(SimpleObject)]
pub struct SyncProgress {
    /// Inventory entries read.
    seen: i64,
    /// Elements stored for this repository.
    stored: i64,
}

pub struct Repository(domain::Repository);

#[Object]
impl Repository {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn name(&self) -> &str {
        &self.0.name
    }
    async fn driver(&self) -> Driver {
        let kind = self.0.driver.kind().to_owned();
        match &self.0.driver {
            DriverSpec::Http { url } => Driver::Http(HttpDriver {
                kind,
                url: crate::redact::url(url),
            }),
            DriverSpec::Local { path } => Driver::Local(LocalDriver {
                kind,
                path: path.display().to_string(),
            }),
            DriverSpec::Migration => Driver::Migration(MigrationDriver { kind }),
            DriverSpec::Provider { provider_id } => Driver::Provider(ProviderDriver {
                kind,
                provider_id: ID(provider_id.to_string()),
            }),
        }
    }
    async fn sync_mode(&self) -> SyncMode {
        self.0.sync_mode.into()
    }
    async fn priority(&self) -> i32 {
        self.0.priority
    }
    async fn refresh_interval_seconds(&self) -> i64 {
        self.0.refresh_interval_seconds
    }
    async fn status(&self) -> RepositoryStatus {
        match self.0.status {
            domain::RepositoryStatus::New => RepositoryStatus::New,
            domain::RepositoryStatus::Syncing => RepositoryStatus::Syncing,
            domain::RepositoryStatus::Active => RepositoryStatus::Active,
            domain::RepositoryStatus::Error => RepositoryStatus::Error,
        }
    }
    /// Why the last sync failed (`ERROR`, naming what could not be read), or,
    /// when it stored what it could but found invalid elements, how many:
    /// `26 elements, 1 invalid`. `null` after a sync with nothing wrong.
    async fn status_message(&self) -> Option<&str> {
        self.0.status_message.as_deref()
    }
    /// Entries, files or manifests of this repository that are not valid
    /// elements (see `invalidElements`). They never fail the repository.
    async fn invalid_element_count(&self, ctx: &Context<'_>) -> Result<i64, ApiError> {
        Ok(state::<Repositories>(ctx)?.invalid_count(self.0.id).await? as i64)
    }
    /// What the last sync (or a LAZY first fetch) could not take as an
    /// element, by path, each with what is wrong.
    async fn invalid_elements(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Page<InvalidElement>, ApiError> {
        let (offset, limit) = window(first, after)?;
        let (found, total) = state::<Repositories>(ctx)?
            .invalid_elements(self.0.id, offset, limit)
            .await?;
        Ok(page_of(
            found.into_iter().map(InvalidElement).collect(),
            offset,
            total,
        ))
    }
    async fn progress(&self) -> SyncProgress {
        SyncProgress {
            seen: self.0.elements_seen,
            stored: self.0.elements_stored,
        }
    }
    async fn last_synced_at(&self) -> Option<DateTime<Utc>> {
        self.0.last_synced_at
    }
    async fn next_refresh_at(&self) -> Option<DateTime<Utc>> {
        self.0.next_refresh_at
    }
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }
    async fn updated_at(&self) -> DateTime<Utc> {
        self.0.updated_at
    }
    async fn elements(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
        installed: Option<bool>,
        search: Option<String>,
    ) -> Result<Page<Element>, ApiError> {
        list_elements(
            ctx,
            DomainFilter {
                repository_id: Some(self.0.id),
                installed,
                search,
                name: None,
            },
            first,
            after,
        )
        .await
    }
}

pub struct Element(domain::Element);

#[Object]
impl Element {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn name(&self) -> &str {
        &self.0.name
    }
    async fn version(&self) -> &str {
        &self.0.version
    }
    async fn repository(&self, ctx: &Context<'_>) -> Result<Repository, ApiError> {
        Ok(Repository(
            state::<Repositories>(ctx)?
                .get(self.0.repository_id)
                .await?,
        ))
    }
    /// The manifest as JSON; in a LAZY repository it is fetched on first access.
    async fn manifest(&self, ctx: &Context<'_>) -> Result<Json<serde_json::Value>, ApiError> {
        if let Some(m) = &self.0.manifest {
            return Ok(Json(m.clone()));
        }
        Ok(Json(state::<Repositories>(ctx)?.manifest(self.0.id).await?))
    }
    /// What this installed element was installed with (transitively).
    async fn dependencies(&self, ctx: &Context<'_>) -> Result<Vec<Element>, ApiError> {
        Ok(state::<Repositories>(ctx)?
            .dependencies(self.0.id)
            .await?
            .into_iter()
            .map(Element)
            .collect())
    }
    /// Installed elements that depend on this one (transitively).
    async fn dependents(&self, ctx: &Context<'_>) -> Result<Vec<Element>, ApiError> {
        Ok(state::<Repositories>(ctx)?
            .dependents(self.0.id)
            .await?
            .into_iter()
            .map(Element)
            .collect())
    }
    async fn artifacts(&self, ctx: &Context<'_>) -> Result<Vec<Artifact>, ApiError> {
        Ok(state::<Repositories>(ctx)?
            .artifacts(self.0.id)
            .await?
            .into_iter()
            .map(Artifact)
            .collect())
    }
    async fn installed(&self) -> bool {
        self.0.installed
    }
    async fn installed_at(&self) -> Option<DateTime<Utc>> {
        self.0.installed_at
    }
    async fn status(&self) -> ElementStatus {
        match self.0.status {
            domain::ElementStatus::New => ElementStatus::New,
            domain::ElementStatus::InProgress => ElementStatus::InProgress,
            domain::ElementStatus::Active => ElementStatus::Active,
            domain::ElementStatus::Error => ElementStatus::Error,
        }
    }
    async fn status_message(&self) -> Option<&str> {
        self.0.status_message.as_deref()
    }
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }
}

/// An inventory entry, file or manifest that is not a valid element.
pub struct InvalidElement(domain::InvalidElement);

#[Object]
impl InvalidElement {
    /// The element's name, where it could be read.
    async fn name(&self) -> Option<&str> {
        self.0.name.as_deref()
    }
    /// The element's version as written, where it could be read.
    async fn version(&self) -> Option<&str> {
        self.0.version.as_deref()
    }
    /// Where it is, relative to the repository's root: a file
    /// (`web/1.0.0/manifests/web.yaml`, `apps/web.yaml`) or an inventory
    /// entry (`inventory.json#/elements/web/1.0.0`).
    async fn path(&self) -> &str {
        &self.0.path
    }
    /// What is wrong, naming the field.
    async fn message(&self) -> &str {
        &self.0.message
    }
    /// The listed element whose manifest this is, when the inventory entry
    /// itself was good (the element is listed, but cannot be installed).
    async fn element_id(&self) -> Option<ID> {
        self.0.element_id.map(|id| ID(id.to_string()))
    }
}

pub struct Artifact(domain::Artifact);

#[Object]
impl Artifact {
    /// `category:uuid`.
    async fn urn(&self) -> &str {
        &self.0.urn
    }
    async fn category(&self) -> &str {
        &self.0.category
    }
    async fn file_name(&self) -> &str {
        &self.0.file_name
    }
    /// Where Corbel serves the file (streamed from the source); needs a token.
    async fn url(&self) -> String {
        format!("/artifacts/{}/{}", self.0.element_id, self.0.urn)
    }
}

#[derive(SimpleObject)]
pub struct PlannedElement {
    element: Element,
    /// Installed already; the plan reuses it.
    already_installed: bool,
}

/// The install order: dependencies first, the element last.
#[derive(SimpleObject)]
pub struct InstallPlan {
    elements: Vec<PlannedElement>,
}

async fn list_elements(
    ctx: &Context<'_>,
    filter: DomainFilter,
    first: Option<i32>,
    after: Option<String>,
) -> Result<Page<Element>, ApiError> {
    let (offset, limit) = window(first, after)?;
    let (found, total) = state::<Repositories>(ctx)?
        .elements(&filter, offset, limit)
        .await?;
    Ok(page_of(
        found.into_iter().map(Element).collect(),
        offset,
        total,
    ))
}

#[derive(Default)]
pub struct RepositoryQuery;

#[Object]
impl RepositoryQuery {
    async fn repositories(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Page<Repository>, ApiError> {
        principal(ctx)?;
        let all = state::<Repositories>(ctx)?.list().await?;
        super::pagination::paginate(all.into_iter().map(Repository).collect(), first, after)
    }

    async fn repository(&self, ctx: &Context<'_>, id: ID) -> Result<Repository, ApiError> {
        principal(ctx)?;
        Ok(Repository(
            state::<Repositories>(ctx)?
                .get(parse_id(&id, "id")?)
                .await?,
        ))
    }

    async fn elements(
        &self,
        ctx: &Context<'_>,
        filter: Option<ElementFilter>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Page<Element>, ApiError> {
        principal(ctx)?;
        let filter = filter.unwrap_or_default();
        let repository_id = match &filter.repository_id {
            Some(id) => Some(parse_id(id, "filter.repositoryId")?),
            None => None,
        };
        list_elements(
            ctx,
            DomainFilter {
                name: filter.name,
                repository_id,
                installed: filter.installed,
                search: filter.search,
            },
            first,
            after,
        )
        .await
    }

    async fn element(&self, ctx: &Context<'_>, id: ID) -> Result<Element, ApiError> {
        principal(ctx)?;
        Ok(Element(
            state::<Repositories>(ctx)?
                .element(parse_id(&id, "id")?)
                .await?,
        ))
    }

    /// The install plan of an element, without installing anything.
    async fn resolve_element(&self, ctx: &Context<'_>, id: ID) -> Result<InstallPlan, ApiError> {
        principal(ctx)?;
        let plan = state::<Repositories>(ctx)?
            .resolve_plan(parse_id(&id, "id")?)
            .await?;
        Ok(InstallPlan {
            elements: plan
                .order
                .into_iter()
                .map(|p| PlannedElement {
                    element: Element(p.element),
                    already_installed: p.already_installed,
                })
                .collect(),
        })
    }
}

#[derive(Default)]
pub struct RepositoryMutation;

#[Object]
impl RepositoryMutation {
    /// Creates a repository and starts its first sync in the background.
    async fn create_repository(
        &self,
        ctx: &Context<'_>,
        input: CreateRepositoryInput,
    ) -> Result<Repository, ApiError> {
        principal(ctx)?;
        let created = state::<Repositories>(ctx)?
            .create(domain::NewRepository {
                name: input.name,
                driver: input.driver.try_into()?,
                sync_mode: input.sync_mode.into(),
                priority: input.priority,
                refresh_interval_seconds: input.refresh_interval_seconds,
            })
            .await?;
        Ok(Repository(created))
    }

    /// Changes settings; a new driver or sync mode starts a sync.
    async fn update_repository(
        &self,
        ctx: &Context<'_>,
        id: ID,
        input: UpdateRepositoryInput,
    ) -> Result<Repository, ApiError> {
        principal(ctx)?;
        let updated = state::<Repositories>(ctx)?
            .update(
                parse_id(&id, "id")?,
                domain::RepositoryPatch {
                    name: input.name,
                    driver: input.driver.map(TryInto::try_into).transpose()?,
                    sync_mode: input.sync_mode.map(Into::into),
                    priority: input.priority,
                    refresh_interval_seconds: input.refresh_interval_seconds,
                },
            )
            .await?;
        Ok(Repository(updated))
    }

    /// Deletes a repository and its elements; refused while it holds installed ones.
    async fn delete_repository(&self, ctx: &Context<'_>, id: ID) -> Result<bool, ApiError> {
        principal(ctx)?;
        state::<Repositories>(ctx)?
            .delete(parse_id(&id, "id")?)
            .await?;
        Ok(true)
    }

    /// Starts a sync now (a running one is left to finish). A changed
    /// inventory entry (or its `digest`) has its manifest read again; with
    /// `refetchManifests`, every manifest is (COPY: fetched now; LAZY:
    /// dropped, fetched at its next use), for a source whose manifests change
    /// under unchanged entries. A refetch asked while a sync runs is refused
    /// (`CONFLICT`).
    async fn refresh_repository(
        &self,
        ctx: &Context<'_>,
        id: ID,
        #[graphql(default = false)] refetch_manifests: bool,
    ) -> Result<Repository, ApiError> {
        principal(ctx)?;
        Ok(Repository(
            state::<Repositories>(ctx)?
                .refresh(parse_id(&id, "id")?, refetch_manifests)
                .await?,
        ))
    }

    /// Installs an element and, first, what it depends on.
    async fn install_element(&self, ctx: &Context<'_>, id: ID) -> Result<Element, ApiError> {
        principal(ctx)?;
        Ok(Element(
            state::<Repositories>(ctx)?
                .install(parse_id(&id, "id")?)
                .await?,
        ))
    }

    /// Uninstalls an element; refused with `HAS_DEPENDENTS` while others need it.
    async fn uninstall_element(&self, ctx: &Context<'_>, id: ID) -> Result<Element, ApiError> {
        principal(ctx)?;
        Ok(Element(
            state::<Repositories>(ctx)?
                .uninstall(parse_id(&id, "id")?)
                .await?,
        ))
    }

    /// Replaces the installed `id` with `toId`, another version of the same name,
    /// in one step: there is no moment with neither installed.
    async fn upgrade_element(
        &self,
        ctx: &Context<'_>,
        id: ID,
        to_id: ID,
    ) -> Result<Element, ApiError> {
        principal(ctx)?;
        Ok(Element(
            state::<Repositories>(ctx)?
                .upgrade(parse_id(&id, "id")?, parse_id(&to_id, "toId")?)
                .await?,
        ))
    }

    /// Replaces an element's manifest; name and version must match the element.
    async fn edit_element(
        &self,
        ctx: &Context<'_>,
        id: ID,
        manifest: Json<serde_json::Value>,
    ) -> Result<Element, ApiError> {
        principal(ctx)?;
        Ok(Element(
            state::<Repositories>(ctx)?
                .edit(parse_id(&id, "id")?, manifest.0)
                .await?,
        ))
    }

    /// Adds an element (its manifest as YAML) to a `local` or `migration` repository.
    async fn upload_element(
        &self,
        ctx: &Context<'_>,
        repository_id: ID,
        manifest: String,
    ) -> Result<Element, ApiError> {
        principal(ctx)?;
        Ok(Element(
            state::<Repositories>(ctx)?
                .upload(parse_id(&repository_id, "repositoryId")?, &manifest)
                .await?,
        ))
    }
}
