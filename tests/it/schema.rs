//! `schema.graphql` is the contract: it must equal what the code generates.

#[test]
fn schema_file_matches_the_code() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schema.graphql");
    let generated = corbel::api::sdl();
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "schema.graphql is out of date with the code; regenerate it with\n\n    \
         cargo run -- schema > schema.graphql\n\nand review the diff"
    );
}
