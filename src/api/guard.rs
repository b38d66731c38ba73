//! The authentication guard: one check, at parse time, for every operation.
//!
//! A request without a valid token may select only the public root fields
//! (`serverInfo`, `login`, and introspection, since the schema is published in
//! `schema.graphql` anyway). Checking the parsed document means a new field is
//! private by default: nobody has to remember to guard it.

use std::collections::HashSet;
use std::sync::Arc;

use async_graphql::extensions::{Extension, ExtensionContext, ExtensionFactory, NextParseQuery};
use async_graphql::parser::types::{ExecutableDocument, Selection, SelectionSet};
use async_graphql::{ErrorExtensionValues, Pos, ServerError, ServerResult, Variables};

use super::{Caller, ErrorCode};

/// Root fields anyone may select.
const PUBLIC_ROOT_FIELDS: &[&str] = &["serverInfo", "login", "__typename", "__schema", "__type"];

pub struct RequireAuth;

impl ExtensionFactory for RequireAuth {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(RequireAuth)
    }
}

#[async_trait::async_trait]
impl Extension for RequireAuth {
    async fn parse_query(
        &self,
        ctx: &ExtensionContext<'_>,
        query: &str,
        variables: &Variables,
        next: NextParseQuery<'_>,
    ) -> ServerResult<ExecutableDocument> {
        let document = next.run(ctx, query, variables).await?;
        let caller = ctx.data_opt::<Caller>().unwrap_or(&Caller::Anonymous);
        if caller.is_signed_in() {
            return Ok(document);
        }
        for (_, operation) in document.operations.iter() {
            let mut seen = HashSet::new();
            if let Some((field, pos)) =
                first_private_field(&document, &operation.node.selection_set.node, &mut seen)
            {
                let mut extensions = ErrorExtensionValues::default();
                extensions.set("code", ErrorCode::Unauthenticated.as_str());
                let refusal = caller.unauthenticated().message;
                let mut error = ServerError::new(format!("`{field}`: {refusal}"), Some(pos));
                error.extensions = Some(extensions);
                return Err(error);
            }
        }
        Ok(document)
    }
}

/// The first root field outside the public list, looking through fragments.
/// `seen` stops fragment cycles, which validation has not rejected yet.
fn first_private_field(
    document: &ExecutableDocument,
    selections: &SelectionSet,
    seen: &mut HashSet<String>,
) -> Option<(String, Pos)> {
    for selection in &selections.items {
        let found = match &selection.node {
            Selection::Field(field) => {
                let name = field.node.name.node.as_str();
                (!PUBLIC_ROOT_FIELDS.contains(&name)).then(|| (name.to_owned(), field.pos))
            }
            Selection::InlineFragment(fragment) => {
                first_private_field(document, &fragment.node.selection_set.node, seen)
            }
            Selection::FragmentSpread(spread) => {
                let name = spread.node.fragment_name.node.as_str();
                if !seen.insert(name.to_owned()) {
                    continue;
                }
                match document.fragments.get(name) {
                    Some(fragment) => {
                        first_private_field(document, &fragment.node.selection_set.node, seen)
                    }
                    // Validation reports the unknown fragment.
                    None => None,
                }
            }
        };
        if found.is_some() {
            return found;
        }
    }
    None
}
