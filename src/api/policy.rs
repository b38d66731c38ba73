//! Who may use each root field: one table, [`POLICY`], for every query,
//! mutation and subscription. [`PolicyGuard`] enforces it at parse time for
//! the parts that depend only on the caller (public, signed in, server
//! admin), so a field is refused before anything runs; a field that acts in a
//! project ([`Need::Project`]) is checked by its resolver against the project
//! of what it reads or changes, through [`require`], which takes the role
//! from this same table. A root field missing from the table is refused to
//! anyone not signed in, and by every resolver that asks; the unit test
//! below fails for it first.

use std::collections::HashSet;
use std::sync::Arc;

use async_graphql::extensions::{Extension, ExtensionContext, ExtensionFactory, NextParseQuery};
use async_graphql::parser::types::{ExecutableDocument, Selection, SelectionSet};
use async_graphql::{Context, ErrorExtensionValues, Pos, ServerError, ServerResult, Variables};
use uuid::Uuid;

use super::{ApiError, Caller, ErrorCode, principal, state};
use crate::auth::{Access, Auth, ProjectRole, Role};

/// What a root field needs of its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Anyone, signed in or not.
    Public,
    /// Any signed-in user. Fields that read a user's own things (their
    /// account, tokens, projects) and the shared catalogue (providers,
    /// repositories, elements).
    SignedIn,
    /// A server admin: providers, repositories, elements, users, audit.
    ServerAdmin,
    /// This role (or above) in the project of what the field reads or
    /// changes; lists show only the caller's projects. Anyone else is told
    /// the thing does not exist.
    Project(ProjectRole),
}

use Need::{Project, Public, ServerAdmin, SignedIn};
const VIEWER: Need = Project(ProjectRole::Viewer);
const DEPLOYER: Need = Project(ProjectRole::Deployer);
const DEVELOPER: Need = Project(ProjectRole::Developer);
const PROJECT_ADMIN: Need = Project(ProjectRole::Admin);

/// Every root field (query, mutation and subscription; their names do not
/// repeat across the three) with what it needs.
pub const POLICY: &[(&str, Need)] = &[
    // The server and the caller.
    ("serverInfo", Public),
    ("replicas", ServerAdmin),
    ("login", Public),
    ("__typename", Public),
    ("__schema", Public),
    ("__type", Public),
    ("me", SignedIn),
    ("logout", SignedIn),
    ("setPassword", SignedIn),
    ("createApiToken", SignedIn),
    ("revokeApiToken", SignedIn),
    ("serverEvents", SignedIn),
    // The audit log (a project's own entries are `Project.auditLog`, for its
    // admins).
    ("auditLog", ServerAdmin),
    ("auditEvents", ServerAdmin),
    // Users.
    ("users", ServerAdmin),
    ("user", ServerAdmin),
    ("createUser", ServerAdmin),
    ("setUserDisabled", ServerAdmin),
    ("setUserRole", ServerAdmin),
    ("deleteUser", ServerAdmin),
    // Projects: anyone signed in may make one (and is its admin).
    ("projects", SignedIn),
    ("project", VIEWER),
    ("createProject", SignedIn),
    ("updateProject", PROJECT_ADMIN),
    ("deleteProject", PROJECT_ADMIN),
    ("setProjectMember", PROJECT_ADMIN),
    ("removeProjectMember", PROJECT_ADMIN),
    // Providers.
    ("providers", SignedIn),
    ("provider", SignedIn),
    ("providerEvents", ServerAdmin),
    ("createProvider", ServerAdmin),
    ("updateProvider", ServerAdmin),
    ("deleteProvider", ServerAdmin),
    ("loadProvider", ServerAdmin),
    ("unloadProvider", ServerAdmin),
    ("configureProvider", ServerAdmin),
    ("rotateProviderToken", ServerAdmin),
    ("issueProviderCertificate", ServerAdmin),
    // Repositories and elements.
    ("repositories", SignedIn),
    ("repository", SignedIn),
    ("repositoryEvents", SignedIn),
    ("elements", SignedIn),
    ("element", SignedIn),
    ("resolveElement", SignedIn),
    ("createRepository", ServerAdmin),
    ("updateRepository", ServerAdmin),
    ("deleteRepository", ServerAdmin),
    ("refreshRepository", ServerAdmin),
    ("installElement", ServerAdmin),
    ("uninstallElement", ServerAdmin),
    ("upgradeElement", ServerAdmin),
    ("editElement", ServerAdmin),
    ("uploadElement", ServerAdmin),
    // Blueprints.
    ("blueprints", VIEWER),
    ("blueprint", VIEWER),
    ("calculateCapacity", VIEWER),
    ("createBlueprint", DEVELOPER),
    ("updateBlueprint", DEVELOPER),
    ("deleteBlueprint", DEVELOPER),
    // Deployments.
    ("deployments", VIEWER),
    ("deployment", VIEWER),
    ("resourceNode", VIEWER),
    ("deploymentEvents", VIEWER),
    ("changesByHour", VIEWER),
    ("resourcesByHealth", VIEWER),
    ("deployBlueprint", DEPLOYER),
    ("destroyDeployment", DEPLOYER),
    ("redeployDeployment", DEPLOYER),
    ("extendDeployment", DEPLOYER),
    ("powerResource", DEPLOYER),
    ("restartResource", DEPLOYER),
    ("execResource", DEVELOPER),
    // Plans, applies and rollback.
    ("plan", VIEWER),
    ("planDeployment", DEPLOYER),
    ("applyPlan", DEPLOYER),
    ("rollbackDeployment", DEPLOYER),
];

/// What `field` needs, if the table names it.
pub fn need_of(field: &str) -> Option<Need> {
    POLICY
        .iter()
        .find(|(name, _)| *name == field)
        .map(|(_, need)| *need)
}

/// What the caller may do, read now.
pub(crate) async fn access(ctx: &Context<'_>) -> Result<Access, ApiError> {
    Ok(state::<Auth>(ctx)?.access(principal(ctx)?).await?)
}

/// Checks that the caller may do what the current root field does in
/// `project` (the project of what it reads or changes); `what` names that
/// thing for the `NOT_FOUND` an outsider gets ("deployment 0190…").
pub(crate) async fn require(
    ctx: &Context<'_>,
    project: Option<Uuid>,
    what: &str,
) -> Result<Access, ApiError> {
    let field = ctx.field().name();
    if let Some(project) = project {
        super::audit_notes::note_project(ctx, project);
    }
    let access = access(ctx).await?;
    match need_of(field) {
        Some(Project(role)) => access.require(project, role, what)?,
        Some(Public | SignedIn) => {}
        Some(ServerAdmin) if access.server_admin => {}
        Some(ServerAdmin) => return Err(forbidden(&format!("`{field}`"))),
        None => {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("`{field}` has no policy: refused"),
            ));
        }
    }
    Ok(access)
}

/// For a nested field only server admins may read (a provider's log):
/// `FORBIDDEN` for anyone else.
pub(crate) fn server_admin_only(ctx: &Context<'_>, what: &str) -> Result<(), ApiError> {
    if principal(ctx)?.user.role == Role::Admin {
        Ok(())
    } else {
        Err(forbidden(what))
    }
}

fn forbidden(what: &str) -> ApiError {
    ApiError::new(ErrorCode::Forbidden, format!("{what} is for server admins"))
}

pub struct PolicyGuard;

impl ExtensionFactory for PolicyGuard {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(PolicyGuard)
    }
}

#[async_trait::async_trait]
impl Extension for PolicyGuard {
    async fn parse_query(
        &self,
        ctx: &ExtensionContext<'_>,
        query: &str,
        variables: &Variables,
        next: NextParseQuery<'_>,
    ) -> ServerResult<ExecutableDocument> {
        let document = next.run(ctx, query, variables).await?;
        check(
            &document,
            ctx.data_opt::<Caller>().unwrap_or(&Caller::Anonymous),
        )?;
        Ok(document)
    }
}

/// Every root field of every operation in `document` is one `caller` may
/// select; else the error naming the first that is not.
pub(crate) fn check(document: &ExecutableDocument, caller: &Caller) -> ServerResult<()> {
    for (_, operation) in document.operations.iter() {
        let mut seen = HashSet::new();
        let mut fields = Vec::new();
        root_fields(
            document,
            &operation.node.selection_set.node,
            &mut seen,
            &mut fields,
        );
        for (field, pos) in fields {
            if let Some(refusal) = refusal(caller, &field) {
                let (code, message) = refusal;
                let mut extensions = ErrorExtensionValues::default();
                extensions.set("code", code.as_str());
                let mut error = ServerError::new(format!("`{field}`: {message}"), Some(pos));
                error.extensions = Some(extensions);
                return Err(error);
            }
        }
    }
    Ok(())
}

/// Why `caller` may not select the root field `field`, if they may not.
fn refusal(caller: &Caller, field: &str) -> Option<(ErrorCode, String)> {
    // A field the table does not name is private: refused to a caller who
    // is not signed in; for one who is, validation names a field the schema
    // lacks (the unit test below keeps every schema field in the table).
    let need = need_of(field);
    if need == Some(Public) {
        return None;
    }
    let Some(principal) = caller.principal() else {
        return Some((ErrorCode::Unauthenticated, caller.unauthenticated().message));
    };
    (need == Some(ServerAdmin) && principal.user.role != Role::Admin)
        .then(|| (ErrorCode::Forbidden, "this is for server admins".to_owned()))
}

/// The root fields selected, looking through fragments. `seen` stops
/// fragment cycles, which validation has not rejected yet.
fn root_fields(
    document: &ExecutableDocument,
    selections: &SelectionSet,
    seen: &mut HashSet<String>,
    out: &mut Vec<(String, Pos)>,
) {
    for selection in &selections.items {
        match &selection.node {
            Selection::Field(field) => {
                out.push((field.node.name.node.to_string(), field.pos));
            }
            Selection::InlineFragment(fragment) => {
                root_fields(document, &fragment.node.selection_set.node, seen, out);
            }
            Selection::FragmentSpread(spread) => {
                let name = spread.node.fragment_name.node.as_str();
                if !seen.insert(name.to_owned()) {
                    continue;
                }
                if let Some(fragment) = document.fragments.get(name) {
                    root_fields(document, &fragment.node.selection_set.node, seen, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_is_named_once() {
        let mut names = HashSet::new();
        for (name, _) in POLICY {
            assert!(names.insert(*name), "`{name}` is in the policy twice");
        }
    }

    /// Every root field of the schema has a policy, and the table names no
    /// field the schema lacks.
    #[test]
    fn the_table_and_the_schema_name_the_same_fields() {
        let schema = super::super::schema_builder(&Default::default()).finish();
        let sdl = schema.sdl();
        let mut fields = HashSet::new();
        for root in ["Query", "Mutation", "Subscription"] {
            let Some(start) = sdl.find(&format!("type {root} {{")) else {
                continue;
            };
            let body = &sdl[start..];
            let body = &body[body.find('{').unwrap() + 1..body.find("\n}").unwrap()];
            let mut in_doc = false;
            for line in body.lines() {
                let line = line.trim();
                if let Some(rest) = line.strip_prefix("\"\"\"") {
                    // `"""` opens or closes a description; `"""text"""` is one.
                    if rest.is_empty() || !rest.ends_with("\"\"\"") {
                        in_doc = !in_doc;
                    }
                    continue;
                }
                if in_doc || line.is_empty() || line.starts_with('"') || line.starts_with('#') {
                    continue;
                }
                let name: String = line
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    fields.insert(name);
                }
            }
        }
        assert!(
            fields.contains("serverInfo")
                && fields.contains("deploymentEvents")
                && fields.len() > 60,
            "the schema's root fields were not all read: {fields:?}"
        );
        for field in &fields {
            assert!(
                need_of(field).is_some(),
                "`{field}` has no policy in POLICY"
            );
        }
        for (name, _) in POLICY {
            assert!(
                name.starts_with("__") || fields.contains(*name),
                "POLICY names `{name}`, which the schema does not have"
            );
        }
    }
}
