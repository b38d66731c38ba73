//! A bounded cache of parsed GraphQL documents, keyed by their text.
//!
//! Clients send the same few documents over and over; parsing is a large share of
//! a small request's cost. A hit hands async-graphql the parsed document, which
//! still goes through the guard, the limits and validation like any other. Parse
//! errors are not cached, so their messages come from the parser as usual.

use std::collections::HashMap;
use std::sync::Mutex;

use async_graphql::parser::types::ExecutableDocument;

pub struct DocumentCache {
    entries: Mutex<HashMap<String, ExecutableDocument>>,
    capacity: usize,
    /// Longer documents are parsed every time rather than kept.
    max_len: usize,
}

impl DocumentCache {
    pub fn new(capacity: usize, max_len: usize) -> Self {
        Self {
            entries: Mutex::new(HashMap::with_capacity(capacity)),
            capacity,
            max_len,
        }
    }

    /// Sets the parsed form of the request's query when it is known or parses.
    pub fn prepare(&self, request: &mut async_graphql::Request) {
        if request.query.len() > self.max_len {
            return;
        }
        let cached = self.lock().get(&request.query).cloned();
        let document = match cached {
            Some(document) => document,
            None => match async_graphql::parser::parse_query(&request.query) {
                Ok(document) => {
                    let mut entries = self.lock();
                    if entries.len() >= self.capacity {
                        // Simple and bounded: start over rather than track recency.
                        entries.clear();
                    }
                    entries.insert(request.query.clone(), document.clone());
                    document
                }
                Err(_) => return,
            },
        };
        request.set_parsed_query(document);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, ExecutableDocument>> {
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
}
