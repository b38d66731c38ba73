//! The abusive requests of issues 11 and 38, shared by the tests
//! (`limits.rs`, `parsing.rs`, `ws_limits.rs`) and the `abuse` benchmark
//! (which includes this file by path): nothing here may use the rest of the
//! test support.

/// `levels` fragments, each spreading the next twice: 2^levels fields
/// once expanded, from about 40 bytes a level.
pub fn doubling_fragments(levels: usize) -> String {
    let mut query = String::from("query Doubling { ...F1 }\n");
    for i in 1..levels {
        query.push_str(&format!(
            "fragment F{i} on Query {{ ...F{n} ...F{n} }}\n",
            n = i + 1
        ));
    }
    query.push_str(&format!("fragment F{levels} on Query {{ __typename }}\n"));
    query
}

/// The full introspection query GraphiQL sends, in short.
pub const INTROSPECTION: &str = "query Introspection { __schema { queryType { name } \
    mutationType { name } subscriptionType { name } types { ...FullType } \
    directives { name description locations args { ...InputValue } } } } \
    fragment FullType on __Type { kind name description \
    fields(includeDeprecated: true) { name description args { ...InputValue } type { ...TypeRef } \
    isDeprecated deprecationReason } inputFields { ...InputValue } interfaces { ...TypeRef } \
    enumValues(includeDeprecated: true) { name description isDeprecated deprecationReason } \
    possibleTypes { ...TypeRef } } \
    fragment InputValue on __InputValue { name description type { ...TypeRef } defaultValue } \
    fragment TypeRef on __Type { kind name ofType { kind name ofType { kind name ofType { kind name \
    ofType { kind name ofType { kind name ofType { kind name ofType { kind name } } } } } } } }";

/// About 190 KB of blueprint: 15,000 top-level keys no blueprint has, as in
/// issue 38 (it held `/healthz` for 95 s when parsing was quadratic).
pub fn unknown_keys() -> String {
    let mut source = String::from("version: \"1\"\nresources: {}\n");
    for i in 0..15_000 {
        source.push_str(&format!("k{i:05}: {i}\n"));
    }
    source
}

/// A small document with a large answer: the mutations described, four
/// times over (tens of KB an answer), for a client that does not read them.
pub fn large_answer() -> String {
    let mutations =
        "__type(name: \"Mutation\") { fields { name description args { name description } } }";
    format!("{{ a: {mutations} b: {mutations} c: {mutations} d: {mutations} }}")
}
