//! `inventory.json`, read as a stream: entries are handed over one at a time as
//! the parser meets them, so a large inventory is never held twice in memory.
//!
//! Bounds: the whole text by the caller (`max_inventory_bytes`, spooled to
//! disk and mapped, so the text is read in place, not copied); nesting costs
//! no stack (what is skipped or kept raw, serde_json reads without recursion;
//! `RawEntry`'s own fields are flat); and each entry, which is checked and
//! hashed where it lies, by [`MAX_ENTRY_BYTES`]: a larger one fails the parse
//! before any of it is checked.
//!
//! The format is described in `docs/repository-format.md`:
//!
//! ```json
//! {"elements": {"core": {"0.1.12-dev+abc": {"name": "core", "version": "0.1.12-dev+abc",
//!   "digest": "sha256:<hex of core.yaml>",
//!   "index": {"manifests": {"<uuid>": "core.yaml"}, "images": {...}}}}}}
//! ```
//!
//! A bad entry (a bad version, a bad artifact file name, a field of the wrong
//! type) does not stop the parse: it is handed over as an [`InvalidElement`]
//! and the next entry is read. Only an inventory that is not JSON, or not an
//! object of `elements`, fails as a whole.

use std::fmt;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use sha2::{Digest, Sha256};

use super::invalid::entry_path;
use super::{InvalidElement, RepositoryError};
use crate::resolve::Version;

/// Largest text of one entry (one element version) of an inventory.
pub const MAX_ENTRY_BYTES: u64 = 4 * 1024 * 1024;

/// Where the text starts, and who hears how far the parser has read.
struct Position<'a> {
    base: usize,
    consumed: &'a mut dyn FnMut(usize),
    known: &'a dyn Known,
}

/// Artifact categories of the inventory format.
pub const CATEGORIES: [&str; 5] = ["artifacts", "configs", "images", "manifests", "templates"];

/// One element version as the inventory lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InventoryEntry {
    pub name: String,
    pub version: Version,
    /// SHA-256 of the entry's JSON: a changed entry has a new hash (stored
    /// as hex).
    pub hash: [u8; 32],
    /// The manifest's digest as the inventory gives it (`sha256:<hex>`), if
    /// it does: being part of the entry, a new digest is a changed entry.
    pub digest: Option<String>,
    pub artifacts: Vec<ArtifactRef>,
}

/// An artifact: `category:uuid` and the file it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArtifactRef {
    pub category: String,
    pub uuid: String,
    pub file_name: String,
}

impl ArtifactRef {
    pub fn urn(&self) -> String {
        format!("{}:{}", self.category, self.uuid)
    }
}

/// The fields of an entry we read; the rest is ignored.
#[derive(Deserialize)]
struct RawEntry {
    name: Option<String>,
    version: Option<String>,
    digest: Option<String>,
    #[serde(default)]
    index: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
}

/// What `parse` hands over for each entry: the entry, or why it is invalid.
pub type Parsed = Result<InventoryEntry, InvalidElement>;

/// What [`parse_with`] hands over for each entry: the entry (or why it is
/// invalid), or only what `known` answered for it.
pub enum Read {
    Entry(Parsed),
    /// `known` knew the entry's name, version and hash: it is not checked
    /// or built again (the same text was valid when it was stored).
    Known(u32),
}

/// Answers, for an entry's name, version (as the inventory spells it) and
/// the hash of its text, whether the reader already holds it so, and then
/// what to hand over in its place.
pub trait Known {
    fn known(&self, name: &str, version: &str, hash: &[u8; 32]) -> Option<u32>;
}

/// Knows nothing: every entry is checked and built.
pub struct NothingKnown;

impl Known for NothingKnown {
    fn known(&self, _: &str, _: &str, _: &[u8; 32]) -> Option<u32> {
        None
    }
}

/// Parses the inventory `text`, calling `each` for every entry in order, a
/// bad entry as an [`InvalidElement`]. Fails only when the text is not an
/// inventory at all (or `each` fails).
pub fn parse(
    text: &[u8],
    mut each: impl FnMut(Parsed) -> Result<(), RepositoryError>,
) -> Result<u64, RepositoryError> {
    parse_with(
        text,
        |_| {},
        &NothingKnown,
        |read| match read {
            Read::Entry(parsed) => each(parsed),
            // Nothing is known.
            Read::Known(_) => Ok(()),
        },
    )
}

/// [`parse`], telling `consumed` at each entry the offset in `text` where it
/// starts (what lies before is read and will not be looked at again: a
/// mapped text can be released as it goes), and handing over only what
/// `known` answers for an entry it knows.
pub fn parse_with(
    text: &[u8],
    mut consumed: impl FnMut(usize),
    known: &dyn Known,
    mut each: impl FnMut(Read) -> Result<(), RepositoryError>,
) -> Result<u64, RepositoryError> {
    let mut count = 0u64;
    let mut failure = None;
    let mut position = Position {
        base: text.as_ptr() as usize,
        consumed: &mut consumed,
        known,
    };
    let mut de = serde_json::Deserializer::from_slice(text);
    let result = Root {
        each: &mut |entry| {
            count += 1;
            each(entry)
        },
        failure: &mut failure,
        position: &mut position,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    if let Some(failure) = failure {
        return Err(failure);
    }
    result.map_err(|e| RepositoryError::Inventory(format!("inventory.json: {e}")))?;
    Ok(count)
}

/// Checks an entry (its JSON text) and turns it into an [`InventoryEntry`].
pub fn entry_from_json(
    key_name: &str,
    key_version: &str,
    raw_json: &str,
) -> Result<InventoryEntry, RepositoryError> {
    entry_with_hash(
        key_name,
        key_version,
        raw_json,
        Sha256::digest(raw_json.as_bytes()).into(),
    )
}

/// [`entry_from_json`] with the text's hash made already.
fn entry_with_hash(
    key_name: &str,
    key_version: &str,
    raw_json: &str,
    hash: [u8; 32],
) -> Result<InventoryEntry, RepositoryError> {
    let raw: RawEntry = serde_json::from_str(raw_json).map_err(|e| {
        RepositoryError::Inventory(format!("element `{key_name}` {key_version}: {e}"))
    })?;
    build_entry(key_name, key_version, raw, hash)
}

fn build_entry(
    key_name: &str,
    key_version: &str,
    raw: RawEntry,
    hash: [u8; 32],
) -> Result<InventoryEntry, RepositoryError> {
    let at = |field: &str, problem: String| {
        RepositoryError::Inventory(format!(
            "element `{key_name}` {key_version}, field `{field}`: {problem}"
        ))
    };
    check_name(key_name).map_err(|p| at("name", p))?;
    if let Some(name) = &raw.name
        && name != key_name
    {
        return Err(at("name", format!("`{name}` differs from its key")));
    }
    if let Some(version) = &raw.version
        && version != key_version
    {
        return Err(at("version", format!("`{version}` differs from its key")));
    }
    let version: Version = key_version
        .parse()
        .map_err(|e: crate::resolve::ResolveError| at("version", e.to_string()))?;
    if let Some(digest) = &raw.digest {
        check_digest(digest).map_err(|p| at("digest", p))?;
    }
    let mut artifacts = Vec::new();
    for (category, files) in raw.index {
        if !CATEGORIES.contains(&category.as_str()) {
            return Err(at("index", format!("unknown category `{category}`")));
        }
        for (uuid, file_name) in files {
            check_file_name(&file_name).map_err(|p| at(&format!("index.{category}"), p))?;
            if uuid.is_empty()
                || uuid.len() > 64
                || !uuid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            {
                return Err(at(
                    &format!("index.{category}"),
                    format!("`{uuid}` is not an id"),
                ));
            }
            artifacts.push(ArtifactRef {
                category: category.clone(),
                uuid,
                file_name,
            });
        }
    }
    Ok(InventoryEntry {
        name: key_name.to_owned(),
        version,
        hash,
        digest: raw.digest,
        artifacts,
    })
}

/// `sha256:` and 64 lowercase hex digits.
fn check_digest(digest: &str) -> Result<(), String> {
    match digest.strip_prefix("sha256:") {
        Some(hex)
            if hex.len() == 64
                && hex
                    .chars()
                    .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)) =>
        {
            Ok(())
        }
        _ => Err(format!(
            "`{digest}` is not `sha256:` and 64 lowercase hex digits"
        )),
    }
}

/// Element names: letters, digits, `-`, `_`, `.`; at most 128; not `.` or `..`.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 128 {
        return Err("a name must be 1 to 128 characters".into());
    }
    if name == "." || name == ".." {
        return Err(format!("`{name}` is not a name"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "`{name}` may hold only letters, digits, `-`, `_` and `.`"
        ));
    }
    Ok(())
}

/// A file name must be a plain name: no directories, no `..`, not absolute.
pub fn check_file_name(file: &str) -> Result<(), String> {
    if file.is_empty() || file.len() > 255 {
        return Err("a file name must be 1 to 255 characters".into());
    }
    if file.contains('/')
        || file.contains('\\')
        || file == "."
        || file == ".."
        || file.contains('\0')
    {
        return Err(format!(
            "`{file}` is not a plain file name (no paths, no `..`)"
        ));
    }
    Ok(())
}

struct Root<'a, 'b, F> {
    each: &'a mut F,
    failure: &'a mut Option<RepositoryError>,
    position: &'a mut Position<'b>,
}

impl<'de, F: FnMut(Read) -> Result<(), RepositoryError>> DeserializeSeed<'de> for Root<'_, '_, F> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, F: FnMut(Read) -> Result<(), RepositoryError>> Visitor<'de> for Root<'_, '_, F> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object with `elements`")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut saw_elements = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == "elements" {
                saw_elements = true;
                map.next_value_seed(Names {
                    each: &mut *self.each,
                    failure: &mut *self.failure,
                    position: &mut *self.position,
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        if !saw_elements {
            return Err(serde::de::Error::missing_field("elements"));
        }
        Ok(())
    }
}

struct Names<'a, 'b, F> {
    each: &'a mut F,
    failure: &'a mut Option<RepositoryError>,
    position: &'a mut Position<'b>,
}

impl<'de, F: FnMut(Read) -> Result<(), RepositoryError>> DeserializeSeed<'de> for Names<'_, '_, F> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, F: FnMut(Read) -> Result<(), RepositoryError>> Visitor<'de> for Names<'_, '_, F> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("`elements`: an object of element names")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(name) = map.next_key::<String>()? {
            map.next_value_seed(Versions {
                name: &name,
                each: &mut *self.each,
                failure: &mut *self.failure,
                position: &mut *self.position,
            })?;
        }
        Ok(())
    }
}

struct Versions<'a, 'b, F> {
    name: &'a str,
    each: &'a mut F,
    failure: &'a mut Option<RepositoryError>,
    position: &'a mut Position<'b>,
}

impl<'de, F: FnMut(Read) -> Result<(), RepositoryError>> DeserializeSeed<'de>
    for Versions<'_, '_, F>
{
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, F: FnMut(Read) -> Result<(), RepositoryError>> Visitor<'de> for Versions<'_, '_, F> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "element `{}`: an object of versions", self.name)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(version) = map.next_key::<String>()? {
            // The entry's own text, where it lies: parsed once into what we
            // read, and hashed as is.
            let raw_json = map.next_value::<&'de serde_json::value::RawValue>();
            let raw_json = raw_json
                .map_err(|e| format!("element `{}` {version}: {e}", self.name))
                .and_then(|raw| {
                    let text = raw.get();
                    (self.position.consumed)(text.as_ptr() as usize - self.position.base);
                    if text.len() as u64 > MAX_ENTRY_BYTES {
                        return Err(format!(
                            "element `{}` {version}: an entry is over the limit of {MAX_ENTRY_BYTES} bytes",
                            self.name
                        ));
                    }
                    Ok(raw)
                })
                .map_err(|message| {
                    *self.failure = Some(RepositoryError::Inventory(message.clone()));
                    serde::de::Error::custom(message)
                })?;
            let text = raw_json.get();
            let hash: [u8; 32] = Sha256::digest(text.as_bytes()).into();
            let read = match self.position.known.known(self.name, &version, &hash) {
                Some(known) => Read::Known(known),
                // A bad entry is handed over as such; the parse goes on.
                None => Read::Entry(entry_with_hash(self.name, &version, text, hash).map_err(
                    |e| InvalidElement {
                        name: Some(self.name.to_owned()),
                        version: Some(version.clone()),
                        path: entry_path(self.name, &version),
                        message: e.to_string(),
                        element_id: None,
                    },
                )),
            };
            if let Err(e) = (self.each)(read) {
                let message = e.to_string();
                *self.failure = Some(e);
                return Err(serde::de::Error::custom(message));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(text: &str) -> Result<Vec<InventoryEntry>, RepositoryError> {
        let mut out = Vec::new();
        parse(text.as_bytes(), |e| {
            out.push(e.expect("a valid entry"));
            Ok(())
        })?;
        Ok(out)
    }

    fn invalid(text: &str) -> Vec<InvalidElement> {
        let mut out = Vec::new();
        parse(text.as_bytes(), |e| {
            if let Err(bad) = e {
                out.push(bad);
            }
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn a_known_entry_is_handed_over_as_what_was_answered_and_not_built() {
        struct KnowsCore([u8; 32]);
        impl Known for KnowsCore {
            fn known(&self, name: &str, version: &str, hash: &[u8; 32]) -> Option<u32> {
                (name == "core" && version == "1.0.0" && *hash == self.0).then_some(7)
            }
        }
        let core = r#"{"index": {"images": {"a1": "disk.qcow2"}}}"#;
        let text = format!(
            r#"{{"elements": {{"core": {{"1.0.0": {core}, "1.1.0": {core}}}, "bad": {{"1.0.0": {{"index": {{"nope": {{}}}}}}}}}}}}"#
        );
        let mut read = Vec::new();
        let hash: [u8; 32] = Sha256::digest(core.as_bytes()).into();
        parse_with(
            text.as_bytes(),
            |_| {},
            &KnowsCore(hash),
            |r| {
                read.push(match r {
                    Read::Known(answer) => format!("known {answer}"),
                    Read::Entry(Ok(entry)) => format!("entry {} {}", entry.name, entry.version),
                    Read::Entry(Err(bad)) => format!("invalid {}", bad.message),
                });
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(read[0], "known 7");
        assert_eq!(read[1], "entry core 1.1.0");
        assert!(
            read[2].starts_with("invalid ") && read[2].contains("unknown category"),
            "{read:?}"
        );
        // What another text of the same key would be: built and checked.
        let changed = text.replacen("disk.qcow2", "disk-v2.qcow2", 1);
        let mut first = None;
        parse_with(
            changed.as_bytes(),
            |_| {},
            &KnowsCore(hash),
            |r| {
                first.get_or_insert(matches!(r, Read::Entry(Ok(_))));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(first, Some(true));
    }

    #[test]
    fn entries_stream_out_with_artifacts() {
        let text = r#"{"elements": {"core": {
            "0.1.12-dev+abc": {"name": "core", "version": "0.1.12-dev+abc",
              "manifests": ["core.yaml"],
              "index": {"manifests": {"0a1b": "core.yaml"}, "images": {"77": "core.qcow2"}}},
            "0.1.12": {"name": "core", "version": "0.1.12"}},
          "web": {"1.0.0": {}}}, "extra": [1, 2]}"#;
        let entries = collect(text).unwrap();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0].name, "core");
        assert_eq!(entries[0].version.to_string(), "0.1.12-dev+abc");
        let urns: Vec<String> = entries[0].artifacts.iter().map(ArtifactRef::urn).collect();
        assert_eq!(urns, ["images:77", "manifests:0a1b"]);
        assert_ne!(entries[0].hash, entries[1].hash);
    }

    #[test]
    fn an_oversized_entry_is_refused_before_it_is_checked_and_deep_nesting_is_no_danger() {
        let big = "x".repeat(MAX_ENTRY_BYTES as usize);
        let text = format!(
            r#"{{"elements": {{"ok": {{"1.0.0": {{}}}}, "huge": {{"1.0.0": {{"pad": "{big}"}}}}}}}}"#
        );
        let mut seen = Vec::new();
        let e = parse(text.as_bytes(), |entry| {
            seen.push(entry.unwrap().name);
            Ok(())
        })
        .unwrap_err()
        .to_string();
        assert_eq!(seen, ["ok"]);
        assert!(
            e.starts_with("element `huge` 1.0.0: ")
                && e.contains(&format!("over the limit of {MAX_ENTRY_BYTES} bytes")),
            "{e}"
        );
        // Deep nesting costs no stack: serde_json skips what we do not read
        // without recursion, and an entry's depth is bounded by its size.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let text =
            format!(r#"{{"other": {deep}, "elements": {{"a": {{"1.0.0": {{"x": {deep}}}}}}}}}"#);
        assert_eq!(collect(&text).unwrap().len(), 1);
    }

    #[test]
    fn a_bad_inventory_fails_whole() {
        let cases = [
            ("not json", "inventory.json"),
            ("[1]", "inventory.json"),
            ("{}", "elements"),
            (r#"{"elements": []}"#, "inventory.json"),
            (
                r#"{"elements": {"a": {"1.0.0": {}}}} trailing"#,
                "inventory.json",
            ),
        ];
        for (text, hint) in cases {
            let err = collect(text).unwrap_err().to_string();
            assert!(err.contains(hint), "{text}: {err}");
        }
    }

    #[test]
    fn a_bad_entry_is_handed_over_named_and_the_rest_is_read() {
        let cases = [
            (
                r#"{"elements": {"a": {"1.x": {}}}}"#,
                "element `a` 1.x, field `version`",
                "inventory.json#/elements/a/1.x",
            ),
            (
                r#"{"elements": {"a": {"1.0.0": {"index": {"images": {"u1": "../etc/passwd"}}}}}}"#,
                "field `index.images`",
                "inventory.json#/elements/a/1.0.0",
            ),
            (
                r#"{"elements": {"a": {"1.0.0": {"index": {"images": {"u1": "/abs"}}}}}}"#,
                "not a plain file name",
                "inventory.json#/elements/a/1.0.0",
            ),
            (
                r#"{"elements": {"a": {"1.0.0": {"name": "b"}}}}"#,
                "field `name`",
                "inventory.json#/elements/a/1.0.0",
            ),
            (
                r#"{"elements": {"../x": {"1.0.0": {}}}}"#,
                "field `name`",
                "inventory.json#/elements/..~1x/1.0.0",
            ),
            (
                r#"{"elements": {"a": {"1.0.0": {"index": 5}}}}"#,
                "element `a` 1.0.0",
                "inventory.json#/elements/a/1.0.0",
            ),
            (
                r#"{"elements": {"a": {"1.0.0": {"digest": "md5:abc"}}}}"#,
                "field `digest`",
                "inventory.json#/elements/a/1.0.0",
            ),
        ];
        for (text, hint, path) in cases {
            // A good entry after the bad one is still read.
            let text = text.replacen(
                r#"{"elements": {"#,
                r#"{"elements": {"z": {"1.0.0": {}}, "#,
                1,
            );
            let bad = invalid(&text);
            assert_eq!(bad.len(), 1, "{text}: {bad:?}");
            assert!(bad[0].message.contains(hint), "{text}: {bad:?}");
            assert_eq!(bad[0].path, path, "{text}");
            let mut good = Vec::new();
            parse(text.as_bytes(), |e| {
                good.extend(e.ok().map(|e| e.name));
                Ok(())
            })
            .unwrap();
            assert_eq!(good, ["z"], "{text}");
        }
    }

    #[test]
    fn a_digest_is_kept_and_changes_the_entry() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        let other = format!("sha256:{}", "cd".repeat(32));
        let one = collect(&format!(
            r#"{{"elements": {{"a": {{"1.0.0": {{"digest": "{digest}"}}}}}}}}"#
        ))
        .unwrap();
        let two = collect(&format!(
            r#"{{"elements": {{"a": {{"1.0.0": {{"digest": "{other}"}}}}}}}}"#
        ))
        .unwrap();
        assert_eq!(one[0].digest.as_deref(), Some(digest.as_str()));
        assert_ne!(one[0].hash, two[0].hash);
    }
}
