//! The one way YAML from outside is read (blueprints, manifests, a local
//! repository's files, `corbel-provider.yaml`). A leaf: it uses nothing else of
//! the crate.
//!
//! Before serde_yaml_ng builds anything, [`check`] reads the text once as a
//! stream of events (saphyr-parser, linear, with its own flow-nesting limit)
//! and refuses it if it is too big, too deep, or too big *after alias
//! expansion*: each time an alias is used, the nodes and scalar bytes of its
//! anchor count again, so `&a` on a 100 KB string used 1,000 times counts
//! 100 MB and is refused after the first few dozen uses, not after the
//! expansion was made. serde_yaml_ng's own alias limit only counts uses, and
//! libyaml spends tens of milliseconds (seconds in a debug build) on tens of
//! thousands of nested flow collections (`cargo bench --profile dist --bench yaml`); neither
//! is reached with text that passed the check.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use saphyr_parser::{Event, Parser};
use serde::de::DeserializeOwned;

/// The bounds every YAML document is read under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Size of the text.
    pub max_bytes: usize,
    /// Nested mappings and sequences, aliases expanded.
    pub max_depth: usize,
    /// Nodes (scalars, mappings, sequences), each alias use counting its
    /// anchor's nodes again.
    pub max_nodes: u64,
    /// Bytes of scalars, each alias use counting its anchor's bytes again.
    pub max_scalar_bytes: u64,
}

/// The limits on every path: generous for any real manifest or blueprint (a
/// few KB), small enough that what serde_yaml_ng builds stays in tens of MB.
pub const LIMITS: Limits = Limits {
    max_bytes: 4 * 1024 * 1024,
    max_depth: 64,
    max_nodes: 250_000,
    max_scalar_bytes: 8 * 1024 * 1024,
};

/// Why a document was refused. Each message names the document (`origin`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum YamlError {
    #[error("{origin}: YAML is {bytes} bytes, over the limit of {limit}")]
    TooLong {
        origin: String,
        bytes: usize,
        limit: usize,
    },
    #[error(
        "{origin}: YAML too deep at line {line}: over the limit of {limit} nested mappings and sequences (aliases expanded)"
    )]
    TooDeep {
        origin: String,
        line: usize,
        limit: usize,
    },
    #[error(
        "{origin}: YAML too large after alias expansion at line {line}: {count} {what}, over the limit of {limit}"
    )]
    TooLarge {
        origin: String,
        line: usize,
        what: &'static str,
        count: u64,
        limit: u64,
    },
    #[error("{origin}: not valid YAML: {message}")]
    Invalid { origin: String, message: String },
    #[error("{origin}: reading stopped before the end: its time ran out")]
    Stopped { origin: String },
}

/// A stop flag never set, for [`check`] and [`from_str`].
static NEVER: AtomicBool = AtomicBool::new(false);

/// What a finished node adds each time it appears (itself or by alias).
#[derive(Clone, Copy, Default)]
struct Size {
    nodes: u64,
    bytes: u64,
    /// Collections nested in it, itself included.
    height: usize,
}

/// An open mapping or sequence.
struct Open {
    anchor: usize,
    nodes_before: u64,
    bytes_before: u64,
    /// The tallest child so far.
    child_height: usize,
}

/// The running count of one check.
struct Scan<'a> {
    origin: &'a str,
    limits: &'a Limits,
    /// Anchor id (saphyr numbers each definition from 1) → its expanded size,
    /// once the anchored node is complete.
    anchors: Vec<Option<Size>>,
    open: Vec<Open>,
    nodes: u64,
    bytes: u64,
    line: usize,
}

impl Scan<'_> {
    fn too_deep(&self) -> YamlError {
        YamlError::TooDeep {
            origin: self.origin.to_owned(),
            line: self.line,
            limit: self.limits.max_depth,
        }
    }

    /// A node of `size` appears at the current depth.
    fn add(&mut self, size: Size) -> Result<(), YamlError> {
        self.nodes = self.nodes.saturating_add(size.nodes);
        self.bytes = self.bytes.saturating_add(size.bytes);
        if self.open.len() + size.height > self.limits.max_depth {
            return Err(self.too_deep());
        }
        for (what, count, limit) in [
            ("nodes", self.nodes, self.limits.max_nodes),
            ("scalar bytes", self.bytes, self.limits.max_scalar_bytes),
        ] {
            if count > limit {
                return Err(YamlError::TooLarge {
                    origin: self.origin.to_owned(),
                    line: self.line,
                    what,
                    count,
                    limit,
                });
            }
        }
        if let Some(parent) = self.open.last_mut() {
            parent.child_height = parent.child_height.max(size.height);
        }
        Ok(())
    }

    fn anchor(&mut self, anchor: usize, size: Size) {
        if anchor == 0 {
            return;
        }
        if self.anchors.len() <= anchor {
            self.anchors.resize(anchor + 1, None);
        }
        self.anchors[anchor] = Some(size);
    }

    fn event(&mut self, event: Event<'_>) -> Result<(), YamlError> {
        match event {
            Event::Scalar(value, _, anchor, _) => {
                let size = Size {
                    nodes: 1,
                    bytes: value.len() as u64,
                    height: 0,
                };
                self.add(size)?;
                self.anchor(anchor, size);
            }
            Event::Alias(anchor) => {
                // An anchor still open is one the alias sits inside: its
                // expansion would never end.
                let Some(size) = self.anchors.get(anchor).copied().flatten() else {
                    return Err(YamlError::Invalid {
                        origin: self.origin.to_owned(),
                        message: format!(
                            "line {}: an alias refers to a node that contains it",
                            self.line
                        ),
                    });
                };
                self.add(size)?;
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if self.open.len() >= self.limits.max_depth {
                    return Err(self.too_deep());
                }
                self.open.push(Open {
                    anchor,
                    nodes_before: self.nodes,
                    bytes_before: self.bytes,
                    child_height: 0,
                });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let Some(done) = self.open.pop() else {
                    return Ok(());
                };
                let height = done.child_height + 1;
                // Its children are counted already: only the node itself is
                // added now; the anchor records the whole.
                self.add(Size {
                    nodes: 1,
                    bytes: 0,
                    height,
                })?;
                let whole = Size {
                    nodes: self.nodes - done.nodes_before,
                    bytes: self.bytes - done.bytes_before,
                    height,
                };
                self.anchor(done.anchor, whole);
            }
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart(_)
            | Event::DocumentEnd => {}
        }
        Ok(())
    }
}

/// Reads `text` as events and refuses it past `limits`; see the module docs.
pub fn check(text: &str, origin: &str, limits: &Limits) -> Result<(), YamlError> {
    check_until(text, origin, limits, &NEVER)
}

/// [`check`], giving up with [`YamlError::Stopped`] once `stop` is set (the
/// caller stopped waiting): the flag is read at every event.
pub fn check_until(
    text: &str,
    origin: &str,
    limits: &Limits,
    stop: &AtomicBool,
) -> Result<(), YamlError> {
    if text.len() > limits.max_bytes {
        return Err(YamlError::TooLong {
            origin: origin.to_owned(),
            bytes: text.len(),
            limit: limits.max_bytes,
        });
    }
    let mut scan = Scan {
        origin,
        limits,
        anchors: Vec::new(),
        open: Vec::new(),
        nodes: 0,
        bytes: 0,
        line: 0,
    };
    for item in Parser::new_from_str(text) {
        let (event, span) = item.map_err(|e| {
            // The scanner's own flow-nesting limit (256) can come first.
            if e.info() == "recursion limit exceeded" {
                YamlError::TooDeep {
                    origin: origin.to_owned(),
                    line: e.marker().line(),
                    limit: limits.max_depth,
                }
            } else {
                YamlError::Invalid {
                    origin: origin.to_owned(),
                    message: e.to_string(),
                }
            }
        })?;
        scan.line = span.start.line();
        scan.event(event)?;
        if stop.load(Ordering::Relaxed) {
            return Err(YamlError::Stopped {
                origin: origin.to_owned(),
            });
        }
    }
    Ok(())
}

/// Checks `text` under [`LIMITS`], then deserializes it with serde_yaml_ng.
pub fn from_str<T: DeserializeOwned>(text: &str, origin: &str) -> Result<T, YamlError> {
    from_str_until(text, origin, &NEVER)
}

/// [`from_str`], giving up once `stop` is set. The check reads the flag as
/// it goes; serde_yaml_ng cannot be stopped, but runs only on text the check
/// bounded, and not at all once the flag is set.
pub fn from_str_until<T: DeserializeOwned>(
    text: &str,
    origin: &str,
    stop: &AtomicBool,
) -> Result<T, YamlError> {
    check_until(text, origin, &LIMITS, stop)?;
    serde_yaml_ng::from_str(text).map_err(|e| YamlError::Invalid {
        origin: origin.to_owned(),
        message: e.to_string(),
    })
}

/// The 1-based line of the node at a dotted `path` (`resources.web.depends_on[0]`)
/// in `text`: the line of its key for a mapping entry, of the item for a
/// sequence entry. When the path goes further than the document (a missing
/// field), the line of the deepest part that is there; `None` for an empty
/// path or text that does not parse that far. For pointing an author at a
/// problem; `text` is expected to have passed [`check`].
pub fn line_of(text: &str, path: &str) -> Option<usize> {
    lines_of(text, &[path], &NEVER).pop().flatten()
}

/// [`line_of`] for each of `paths`, in one read of `text`: linear in the
/// text and the paths' length, however many paths there are (a line each
/// for a thousand problems costs one read, not a thousand). Stops early
/// once every path is found, or once `stop` is set (what was found by then
/// is answered).
pub fn lines_of(text: &str, paths: &[&str], stop: &AtomicBool) -> Vec<Option<usize>> {
    let mut trie = Trie::default();
    let ends: Vec<Option<Vec<usize>>> = paths.iter().map(|p| trie.insert(p)).collect();
    let mut finder = LineFinder {
        trie,
        frames: Vec::new(),
        at: Vec::new(),
        left: 0,
    };
    finder.left = finder.trie.nodes.iter().filter(|n| n.wanted).count();
    for item in Parser::new_from_str(text) {
        let Ok((event, span)) = item else { break };
        if finder.event(&event, span.start.line()) || stop.load(Ordering::Relaxed) {
            break;
        }
    }
    ends.iter()
        .map(|nodes| {
            nodes
                .as_ref()?
                .iter()
                .rev()
                .find_map(|&n| finder.trie.nodes[n].line)
        })
        .collect()
}

/// The wanted paths, segment by segment; node 0 is the document's root.
struct Trie {
    nodes: Vec<TrieNode>,
}

#[derive(Default)]
struct TrieNode {
    children: HashMap<Segment, usize>,
    /// Where the node was first met.
    line: Option<usize>,
    /// Whether a wanted path ends here (and is not yet found).
    wanted: bool,
}

impl Default for Trie {
    fn default() -> Self {
        Trie {
            nodes: vec![TrieNode::default()],
        }
    }
}

impl Trie {
    /// Adds `path`; the nodes along it, root left out (`None` when empty).
    fn insert(&mut self, path: &str) -> Option<Vec<usize>> {
        let segments = segments(path);
        if segments.is_empty() {
            return None;
        }
        let mut at = 0;
        let mut along = Vec::with_capacity(segments.len());
        for segment in segments {
            let next = self.nodes.len();
            at = *self.nodes[at].children.entry(segment).or_insert(next);
            if at == next {
                self.nodes.push(TrieNode::default());
            }
            along.push(at);
        }
        self.nodes[at].wanted = true;
        Some(along)
    }
}

/// One frame per open collection: where it is, and which entry is current.
enum Frame {
    Map {
        expect_key: bool,
        key: Option<String>,
        key_line: usize,
    },
    Seq {
        next: usize,
    },
}

impl Frame {
    /// The frame a `MappingStart` (else a `SequenceStart`) opens.
    fn opened(event: &Event<'_>, line: usize) -> Frame {
        match event {
            Event::MappingStart(..) => Frame::Map {
                expect_key: true,
                key: None,
                key_line: line,
            },
            _ => Frame::Seq { next: 0 },
        }
    }
}

/// What a node's event means to the collection it is in.
enum Placed {
    /// The key of a mapping entry: no node of the path.
    Key,
    /// An entry's value or a sequence's item, at this segment and line
    /// (`None` under a key that is not a scalar, or at the root).
    Entry(Option<(Segment, usize)>),
}

/// [`lines_of`]'s walk through the events.
struct LineFinder {
    trie: Trie,
    frames: Vec<Frame>,
    /// The trie node of each open collection (`None` off every wanted path).
    at: Vec<Option<usize>>,
    /// Wanted paths not found yet.
    left: usize,
}

impl LineFinder {
    /// Takes one event at `line`; true once every path is found.
    fn event(&mut self, event: &Event<'_>, line: usize) -> bool {
        let starts_node = matches!(
            event,
            Event::Scalar(..)
                | Event::Alias(_)
                | Event::MappingStart(..)
                | Event::SequenceStart(..)
        );
        // The root collection is the trie's root; anything else is the
        // child its segment names, if any.
        let mut entered = if self.frames.is_empty() {
            Some(0)
        } else {
            None
        };
        if starts_node {
            match self.place(event, line) {
                Placed::Key => return false,
                Placed::Entry(entry) => {
                    if let Some((segment, line)) = entry {
                        entered = self.found(&segment, line);
                    }
                }
            }
        }
        if self.left == 0 {
            return true;
        }
        match event {
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                self.frames.push(Frame::opened(event, line));
                self.at.push(entered);
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.frames.pop();
                self.at.pop();
            }
            _ => {}
        }
        false
    }

    /// Where the node `event` starts sits in the innermost open collection.
    fn place(&mut self, event: &Event<'_>, line: usize) -> Placed {
        match self.frames.last_mut() {
            Some(Frame::Map {
                expect_key,
                key,
                key_line,
            }) if *expect_key => {
                if let Event::Scalar(value, ..) = event {
                    *key = Some(value.to_string());
                } else {
                    *key = None;
                }
                *key_line = line;
                *expect_key = false;
                if !matches!(event, Event::Scalar(..) | Event::Alias(_)) {
                    // A complex key: skip what it holds as if a value.
                    self.frames.push(Frame::opened(event, line));
                    self.at.push(None);
                }
                Placed::Key
            }
            Some(Frame::Map {
                expect_key,
                key,
                key_line,
            }) => {
                *expect_key = true;
                Placed::Entry(key.take().map(|k| (Segment::Key(k), *key_line)))
            }
            Some(Frame::Seq { next }) => {
                let entry = (Segment::Index(*next), line);
                *next += 1;
                Placed::Entry(Some(entry))
            }
            None => Placed::Entry(None),
        }
    }

    /// The trie node of `segment` (at `line`) in the innermost collection,
    /// when it is on a wanted path; records where it was first met.
    fn found(&mut self, segment: &Segment, line: usize) -> Option<usize> {
        let parent = (*self.at.last()?)?;
        let node = *self.trie.nodes[parent].children.get(segment)?;
        let node_ref = &mut self.trie.nodes[node];
        node_ref.line.get_or_insert(line);
        if std::mem::take(&mut node_ref.wanted) {
            self.left -= 1;
        }
        Some(node)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Segment {
    Key(String),
    Index(usize),
}

/// `a.b[0].c` → `[Key(a), Key(b), Index(0), Key(c)]`.
fn segments(path: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (name, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !name.is_empty() {
            out.push(Segment::Key(name.to_owned()));
        }
        while let Some(close) = rest.find(']') {
            if let Ok(n) = rest[1..close].parse() {
                out.push(Segment::Index(n));
            }
            rest = &rest[close + 1..];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLUEPRINT: &str = "version: \"1\"\nvariables:\n  port: { type: int }\nresources:\n  db:\n    type: process.v1.service\n  web:\n    type: process.v1.service\n    depends_on:\n      - db\n      - cache\n    config: {command: sleep, args: [\"1\", \"2\"]}\n";

    #[test]
    fn line_of_finds_keys_items_and_flow_entries() {
        assert_eq!(line_of(BLUEPRINT, "version"), Some(1));
        assert_eq!(line_of(BLUEPRINT, "variables.port.type"), Some(3));
        assert_eq!(line_of(BLUEPRINT, "resources.db"), Some(5));
        assert_eq!(line_of(BLUEPRINT, "resources.web.type"), Some(8));
        assert_eq!(line_of(BLUEPRINT, "resources.web.depends_on[0]"), Some(10));
        assert_eq!(line_of(BLUEPRINT, "resources.web.depends_on[1]"), Some(11));
        assert_eq!(line_of(BLUEPRINT, "resources.web.config.args[1]"), Some(12));
    }

    #[test]
    fn line_of_a_missing_field_is_the_line_of_what_holds_it() {
        assert_eq!(line_of(BLUEPRINT, "resources.db.config"), Some(5));
        assert_eq!(line_of(BLUEPRINT, "resources.web.depends_on[7]"), Some(9));
        assert_eq!(line_of(BLUEPRINT, "outputs.url"), None);
        assert_eq!(line_of(BLUEPRINT, ""), None);
        assert_eq!(line_of("a: [", "a"), Some(1));
        assert_eq!(line_of("", "a"), None);
    }

    #[test]
    fn lines_of_answers_many_paths_in_one_read() {
        let paths = [
            "resources.web.depends_on[1]",
            "version",
            "",
            "resources.db.config",
            "resources.web.depends_on[1]",
            "outputs.url",
        ];
        assert_eq!(
            lines_of(BLUEPRINT, &paths, &NEVER),
            [Some(11), Some(1), None, Some(5), Some(11), None]
        );
        // 20,000 unknown keys, each asked for: one read, each on its line.
        let text: String = (0..20_000).map(|i| format!("k{i}: {i}\n")).collect();
        let asked: Vec<String> = (0..20_000).rev().map(|i| format!("k{i}")).collect();
        let asked: Vec<&str> = asked.iter().map(String::as_str).collect();
        let lines = lines_of(&text, &asked, &NEVER);
        assert_eq!(lines[0], Some(20_000));
        assert_eq!(lines[19_999], Some(1));
        let stop = AtomicBool::new(true);
        assert_eq!(lines_of(&text, &asked, &stop)[0], None);
    }

    #[test]
    fn a_set_stop_flag_stops_the_check() {
        let stop = AtomicBool::new(true);
        let e = check_until("a: 1\nb: 2\n", "doc.yaml", &LIMITS, &stop).unwrap_err();
        assert_eq!(
            e.to_string(),
            "doc.yaml: reading stopped before the end: its time ran out"
        );
    }

    const SMALL: Limits = Limits {
        max_bytes: 10_000,
        max_depth: 5,
        max_nodes: 100,
        max_scalar_bytes: 1_000,
    };

    fn err(text: &str, limits: &Limits) -> String {
        check(text, "doc.yaml", limits).unwrap_err().to_string()
    }

    #[test]
    fn ordinary_documents_pass() {
        for text in [
            "",
            "a: 1",
            "name: x\nversion: 1.0.0\nresources:\n  web:\n    type: t\n    config: {a: [1, 2]}\n",
            "base: &b {x: 1}\nother:\n  <<: *b\n  y: 2\n",
            "{\"json\": [true, null, 1.5]}",
        ] {
            check(text, "doc.yaml", &SMALL).unwrap();
        }
    }

    #[test]
    fn an_alias_counts_what_it_expands_to() {
        // 100 bytes, then used 8 times, and the keys `a` and `b`: 902 bytes.
        let s = "x".repeat(100);
        let ok = format!("a: &a {s}\nb: [{}]\n", ["*a"; 8].join(", "));
        check(&ok, "doc.yaml", &SMALL).unwrap();
        // Once more is over, though the text is only a few bytes longer.
        let over = format!("a: &a {s}\nb: [{}]\n", ["*a"; 9].join(", "));
        let e = err(&over, &SMALL);
        assert!(
            e.starts_with("doc.yaml: YAML too large after alias expansion at line 2:")
                && e.ends_with("1002 scalar bytes, over the limit of 1000"),
            "{e}"
        );
    }

    #[test]
    fn nested_aliases_multiply() {
        // The classic billion laughs: 10 anchors, each 10 uses of the last.
        let mut text = "l0: &l0 [lol]\n".to_owned();
        for i in 1..10 {
            let uses = vec![format!("*l{}", i - 1); 10].join(", ");
            text.push_str(&format!("l{i}: &l{i} [{uses}]\n"));
        }
        let e = err(&text, &LIMITS);
        assert!(e.contains("YAML too large after alias expansion"), "{e}");
        assert!(e.contains("nodes, over the limit of 250000"), "{e}");
    }

    #[test]
    fn an_anchored_mapping_counts_its_nodes_and_depth() {
        let text = "a: &a {k: {k: v}}\nb: *a\n";
        check(text, "doc.yaml", &SMALL).unwrap();
        // Used three levels deeper, its two levels reach past 5.
        let deep = "a: &a {k: {k: v}}\nb: [[[*a]]]\n";
        let e = err(deep, &SMALL);
        assert!(e.contains("YAML too deep at line 2"), "{e}");
    }

    #[test]
    fn depth_size_and_syntax_are_refused_with_the_document_named() {
        let e = err(&"[".repeat(200_000), &LIMITS);
        assert_eq!(
            e,
            "doc.yaml: YAML too deep at line 1: over the limit of 64 nested mappings and sequences (aliases expanded)"
        );
        let e = err("a: [[[[[1]]]]]", &SMALL);
        assert!(e.contains("too deep at line 1"), "{e}");
        let e = err(&"x".repeat(10_001), &SMALL);
        assert_eq!(e, "doc.yaml: YAML is 10001 bytes, over the limit of 10000");
        let e = err("a: [1, 2", &SMALL);
        assert!(e.starts_with("doc.yaml: not valid YAML: "), "{e}");
        let e = err("a: *nowhere", &SMALL);
        assert!(e.starts_with("doc.yaml: not valid YAML: "), "{e}");
        let e = err("a: &a [1, *a]", &SMALL);
        assert!(e.contains("contains it"), "{e}");
    }

    #[test]
    fn deep_nesting_is_refused_quickly() {
        // libyaml takes seconds on this; the check stops at the limit.
        for text in [
            "[".repeat(200_000),
            "{".repeat(200_000),
            format!("a: {}", "[".repeat(200_000)),
            (0..500).map(|i| format!("{}- \n", " ".repeat(i))).collect(),
        ] {
            let started = std::time::Instant::now();
            assert!(check(&text, "doc.yaml", &LIMITS).is_err());
            assert!(started.elapsed() < std::time::Duration::from_secs(1));
        }
    }

    #[test]
    fn from_str_deserializes_what_passed() {
        let v: serde_json::Value = from_str("a: &x [1]\nb: *x", "doc.yaml").unwrap();
        assert_eq!(v, serde_json::json!({"a": [1], "b": [1]}));
    }
}
