//! How results are shown: aligned tables and lines for people (`text`), the
//! API's own objects for programs (`json`: only JSON on stdout, errors as
//! JSON on stderr).

use std::io::Write as _;

use serde_json::Value;

use super::error::ClientError;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    #[default]
    Text,
    Json,
}

#[derive(Clone, Copy, Debug)]
pub struct Output {
    pub format: Format,
}

impl Output {
    pub fn json(&self) -> bool {
        self.format == Format::Json
    }

    /// One JSON document on stdout, pretty.
    pub fn value(&self, value: &Value) {
        println!(
            "{}",
            serde_json::to_string_pretty(value).expect("JSON serialises")
        );
    }

    /// One JSON document on one line (a stream of events or log lines).
    pub fn line(&self, value: &Value) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{value}");
        let _ = out.flush();
    }

    /// A note for people on stderr; nothing in `json` mode.
    pub fn note(&self, text: &str) {
        if !self.json() {
            eprintln!("{text}");
        }
    }

    /// The error on stderr: `corbel: message (CODE)`, or as JSON.
    pub fn error(&self, error: &ClientError) {
        if self.json() {
            eprintln!("{}", error.to_json());
        } else {
            eprintln!("corbel: {error}");
        }
    }
}

/// An aligned table: a header, then a row per item; the last column is not
/// padded.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                out.push_str(cell);
                out.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push('\n');
    }
    out
}

/// A JSON field as a table cell: strings bare, null as `-`.
pub fn cell(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_every_column_but_the_last() {
        let shown = table(
            &["NAME", "STATE", "ID"],
            &[
                vec!["web".into(), "COMPLETE".into(), "1".into()],
                vec!["a-longer-name".into(), "-".into(), "2".into()],
            ],
        );
        assert_eq!(
            shown,
            "NAME           STATE     ID\n\
             web            COMPLETE  1\n\
             a-longer-name  -         2\n"
        );
    }
}
