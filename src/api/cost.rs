//! What a document costs, counted before anything else walks it.
//!
//! A document's size after fragment expansion can be exponential in its text:
//! `fragment F1 on Query { ...F2 ...F2 }`, `F2` spreading `F3` twice, and so on,
//! is a kilobyte that expands to 2^26 fields. async-graphql's own checks (its
//! recursion-depth check at parse time, the complexity and depth validators)
//! expand every spread as they go, so they would pay that cost themselves.
//! [`expanded_size`] counts it instead with each fragment's size memoized, in
//! time linear in the text, and [`CostLimit`] refuses an over-large document
//! in `prepare_request`, which async-graphql runs before parsing, validation
//! and execution (a request from the HTTP handler, a websocket `subscribe`).
//!
//! The size counts one per field, inline fragment and spread, wherever it ends
//! up after expansion, over every operation and every fragment definition
//! (validation visits unused fragments too).

use std::collections::HashMap;
use std::sync::Arc;

use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextPrepareRequest,
};
use async_graphql::parser::types::{ExecutableDocument, Selection, SelectionSet};
use async_graphql::{Request, ServerError, ServerResult};

use super::settings::{GraphqlLimits, RequestLimits};
use super::{ApiError, Caller};

/// Nesting of selection sets and spreads beyond which counting stops: far past
/// what async-graphql accepts (32), and shallow enough for any stack.
const MAX_NESTING: usize = 256;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CostError {
    /// The expanded size passes `limit` (counting stopped there).
    TooLarge { limit: usize },
    /// A fragment spreads itself, directly or through others.
    Cycle { fragment: String },
    /// Selections nest deeper than [`MAX_NESTING`].
    TooDeep,
}

/// The document's size after fragment expansion, or why it has none within
/// `limit`.
pub fn expanded_size(document: &ExecutableDocument, limit: usize) -> Result<usize, CostError> {
    let mut counter = Counter {
        document,
        limit,
        sizes: HashMap::new(),
    };
    let mut total = 0usize;
    for (_, operation) in document.operations.iter() {
        let size = counter.selection_set(&operation.node.selection_set.node, 0)?;
        total = counter.add(total, size)?;
    }
    for name in document.fragments.keys() {
        let size = counter.fragment(name.as_str(), 0)?;
        total = counter.add(total, size)?;
    }
    Ok(total)
}

enum Memo {
    /// Being counted: meeting it again is a cycle.
    Open,
    Done(usize),
}

struct Counter<'a> {
    document: &'a ExecutableDocument,
    limit: usize,
    sizes: HashMap<&'a str, Memo>,
}

impl<'a> Counter<'a> {
    fn add(&self, a: usize, b: usize) -> Result<usize, CostError> {
        let sum = a.saturating_add(b);
        if sum > self.limit {
            return Err(CostError::TooLarge { limit: self.limit });
        }
        Ok(sum)
    }

    fn selection_set(&mut self, set: &'a SelectionSet, nesting: usize) -> Result<usize, CostError> {
        if nesting > MAX_NESTING {
            return Err(CostError::TooDeep);
        }
        let mut size = 0usize;
        for selection in &set.items {
            let inner = match &selection.node {
                Selection::Field(field) => {
                    self.selection_set(&field.node.selection_set.node, nesting + 1)?
                }
                Selection::InlineFragment(fragment) => {
                    self.selection_set(&fragment.node.selection_set.node, nesting + 1)?
                }
                Selection::FragmentSpread(spread) => {
                    self.fragment(spread.node.fragment_name.node.as_str(), nesting + 1)?
                }
            };
            size = self.add(size, self.add(1, inner)?)?;
        }
        Ok(size)
    }

    fn fragment(&mut self, name: &'a str, nesting: usize) -> Result<usize, CostError> {
        match self.sizes.get(name) {
            Some(Memo::Done(size)) => return Ok(*size),
            Some(Memo::Open) => {
                return Err(CostError::Cycle {
                    fragment: name.to_owned(),
                });
            }
            None => {}
        }
        // An unknown fragment counts nothing; validation names it.
        let Some(definition) = self.document.fragments.get(name) else {
            return Ok(0);
        };
        self.sizes.insert(name, Memo::Open);
        let size = self.selection_set(&definition.node.selection_set.node, nesting)?;
        self.sizes.insert(name, Memo::Done(size));
        Ok(size)
    }
}

/// The schema extension that applies [`expanded_size`] to every request, with
/// the caller's limit (anonymous callers get the tighter one).
pub struct CostLimit {
    pub limits: GraphqlLimits,
}

impl ExtensionFactory for CostLimit {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(CostLimitExtension {
            limits: self.limits.clone(),
        })
    }
}

struct CostLimitExtension {
    limits: GraphqlLimits,
}

#[async_trait::async_trait]
impl Extension for CostLimitExtension {
    async fn prepare_request(
        &self,
        ctx: &ExtensionContext<'_>,
        mut request: Request,
        next: NextPrepareRequest<'_>,
    ) -> ServerResult<Request> {
        // Over HTTP the caller is in the request's data; over a websocket, in
        // the connection's.
        let signed_in = request
            .data
            .get(&std::any::TypeId::of::<Caller>())
            .and_then(|d| d.downcast_ref::<Caller>())
            .or_else(|| ctx.data_opt::<Caller>())
            .is_some_and(Caller::is_signed_in);
        let limits = self.limits.for_caller(signed_in);
        check(request.parsed_query()?, &limits)?;
        next.run(ctx, request).await
    }
}

/// [`expanded_size`] within the caller's `limits`, or the error saying why not.
pub(crate) fn check(document: &ExecutableDocument, limits: &RequestLimits) -> ServerResult<()> {
    let Err(e) = expanded_size(document, limits.max_query_size) else {
        return Ok(());
    };
    let error = match e {
        CostError::TooLarge { limit } => {
            let key = limits.key("max_query_size");
            ApiError::limit(
                &key,
                limit,
                format!(
                    "the query is larger than {limit} selections once its fragments are \
                     expanded (`{key}`{})",
                    if limits.anonymous {
                        "; send a token for the higher limit"
                    } else {
                        ""
                    }
                ),
            )
        }
        CostError::Cycle { fragment } => ApiError::new(
            super::ErrorCode::InvalidQuery,
            format!("fragment `{fragment}` spreads itself"),
        ),
        CostError::TooDeep => ApiError::new(
            super::ErrorCode::InvalidQuery,
            format!("selections nest deeper than {MAX_NESTING}"),
        ),
    };
    Err(to_server_error(error))
}

/// A request-wide error: it points at no place in the document, so it carries no
/// `locations` (a default `Pos` would show the invalid line 0).
pub(crate) fn to_server_error(error: ApiError) -> ServerError {
    let mut error =
        async_graphql::Error::from(error).into_server_error(async_graphql::Pos::default());
    error.locations.clear();
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_wide_errors_point_at_no_line() {
        let error = to_server_error(ApiError::new(super::super::ErrorCode::Timeout, "late"));
        let shown = serde_json::to_value(&error).unwrap();
        assert_eq!(shown["message"], "late");
        assert!(shown.get("locations").is_none(), "{shown}");
    }

    fn size(query: &str, limit: usize) -> Result<usize, CostError> {
        expanded_size(&async_graphql::parser::parse_query(query).unwrap(), limit)
    }

    /// `levels` fragments, each spreading the next twice.
    fn doubling(levels: usize) -> String {
        let mut query = String::from("query { ...F1 }\n");
        for i in 1..levels {
            query.push_str(&format!(
                "fragment F{i} on Query {{ ...F{n} ...F{n} }}\n",
                n = i + 1
            ));
        }
        query.push_str(&format!(
            "fragment F{levels} on Query {{ serverInfo {{ version }} }}\n"
        ));
        query
    }

    #[test]
    fn plain_documents_count_their_selections() {
        assert_eq!(size("{ serverInfo { version } }", 100), Ok(2));
        assert_eq!(size("{ a b c { d ... on X { e } } }", 100), Ok(6));
        assert_eq!(size("{ ...F } fragment F on Q { a b }", 100), Ok(5));
    }

    #[test]
    fn exponential_fragments_are_counted_expanded_and_quickly() {
        let query = doubling(60);
        let started = std::time::Instant::now();
        assert_eq!(
            size(&query, 1_000_000),
            Err(CostError::TooLarge { limit: 1_000_000 })
        );
        // The operation (1 + F1 = 63) and each definition: F1..F5.
        assert_eq!(size(&doubling(5), 1_000), Ok(63 + 62 + 30 + 14 + 6 + 2));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn fragment_cycles_and_unknown_fragments() {
        assert!(matches!(
            size(
                "{ ...A } fragment A on Q { ...B } fragment B on Q { ...A }",
                100
            ),
            Err(CostError::Cycle { .. })
        ));
        assert_eq!(size("{ ...Missing }", 100), Ok(1));
    }
}
