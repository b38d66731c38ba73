//! A bounded cache of parsed GraphQL documents, keyed by their text.
//!
//! Clients send the same few documents over and over; parsing is a large share of
//! a small request's cost. A hit hands async-graphql the parsed document, which
//! still goes through the guard, the limits and validation like any other. Parse
//! errors are not cached, so their messages come from the parser as usual.
//!
//! A document without variables that once passed validation is marked so:
//! validating it again can only give the same answer (its rules read the
//! document and the schema, and variables' values, which it has none of),
//! and validation was half of the server's time answering `serverInfo`
//! (perf, `cargo bench --bench foundation`). Such a query runs on a schema
//! that skips the rules (`http::read_schema`).

use std::collections::HashMap;
use std::sync::Mutex;

use async_graphql::parser::types::ExecutableDocument;

pub struct DocumentCache {
    entries: Mutex<HashMap<String, Entry>>,
    capacity: usize,
    /// Longer documents are parsed every time rather than kept.
    max_len: usize,
}

#[derive(Clone)]
struct Entry {
    document: ExecutableDocument,
    validation: Validation,
}

/// What validating a request's document still needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Validation {
    /// Every time: its validation reads its variables' values, or it is
    /// not cached.
    Always,
    /// It has no variables and has not passed yet: [`DocumentCache::passed`]
    /// once it does.
    Once,
    /// None: it has no variables and passed once.
    Done,
}

impl DocumentCache {
    pub fn new(capacity: usize, max_len: usize) -> Self {
        Self {
            // Grown as documents come (made at `capacity` it held 200 KB
            // from the start).
            entries: Mutex::new(HashMap::new()),
            capacity,
            max_len,
        }
    }

    /// Sets the parsed form of the request's query when it is known or
    /// parses; what validating it still needs.
    pub fn prepare(&self, request: &mut async_graphql::Request) -> Validation {
        if request.query.len() > self.max_len {
            return Validation::Always;
        }
        let cached = self.lock().get(&request.query).cloned();
        let entry = match cached {
            Some(entry) => entry,
            None => match async_graphql::parser::parse_query(&request.query) {
                Ok(document) => {
                    let variables = document
                        .operations
                        .iter()
                        .any(|(_, operation)| !operation.node.variable_definitions.is_empty());
                    let entry = Entry {
                        document,
                        validation: match variables {
                            true => Validation::Always,
                            false => Validation::Once,
                        },
                    };
                    let mut entries = self.lock();
                    if entries.len() >= self.capacity {
                        // Simple and bounded: start over rather than track recency.
                        entries.clear();
                    }
                    entries.insert(request.query.clone(), entry.clone());
                    entry
                }
                Err(_) => return Validation::Always,
            },
        };
        request.set_parsed_query(entry.document);
        entry.validation
    }

    /// `query`, prepared as [`Validation::Once`], passed validation (its
    /// answer had no error): it is not validated again.
    pub fn passed(&self, query: &str) {
        if let Some(entry) = self.lock().get_mut(query)
            && entry.validation == Validation::Once
        {
            entry.validation = Validation::Done;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // A panic while holding the lock leaves a usable map; keep serving.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_reused_and_bounded() {
        let cache = DocumentCache::new(2, 100);
        for query in ["{ a }", "{ b }", "{ a }", "{ c }"] {
            let mut request = async_graphql::Request::new(query);
            cache.prepare(&mut request);
            assert!(request.parsed_query().is_ok());
        }
        assert!(cache.lock().len() <= 2);
        let mut broken = async_graphql::Request::new("{ a");
        cache.prepare(&mut broken);
        assert!(!cache.lock().contains_key("{ a"));
        let mut long = async_graphql::Request::new(format!("{{ {} }}", "a ".repeat(100)));
        cache.prepare(&mut long);
        assert!(!cache.lock().contains_key(&long.query));
    }

    #[test]
    fn only_a_document_without_variables_is_marked_valid() {
        let cache = DocumentCache::new(8, 1_000);
        let plain = "{ serverInfo { version } }";
        let with_variables = "query($id: ID!) { deployment(id: $id) { name } }";
        let prepare = |query: &str| cache.prepare(&mut async_graphql::Request::new(query));
        assert_eq!(prepare(plain), Validation::Once);
        assert_eq!(prepare(with_variables), Validation::Always);
        for query in [plain, with_variables] {
            cache.passed(query);
        }
        assert_eq!(prepare(plain), Validation::Done);
        assert_eq!(prepare(with_variables), Validation::Always);
        // Not cached (never prepared): nothing to mark.
        cache.passed("{ other }");
        assert_eq!(prepare("{ other }"), Validation::Once);
        // Too long to cache: validated every time.
        let long = format!("{{ {} }}", "a ".repeat(600));
        assert_eq!(prepare(&long), Validation::Always);
    }
}
