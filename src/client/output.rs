//! How results are shown: aligned tables and lines for people (`text`), the
//! API's own objects for programs (`json`: only JSON on stdout, errors as
//! JSON on stderr; `yaml`: the same objects as YAML, a stream's items as
//! documents, each after `---`).

use std::io::Write as _;

use serde_json::Value;

use super::error::ClientError;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    #[default]
    Text,
    Json,
    Yaml,
}

#[derive(Clone, Copy, Debug)]
pub struct Output {
    pub format: Format,
}

impl Output {
    /// Whether programs read it: the API's objects, as JSON or YAML.
    pub fn structured(&self) -> bool {
        self.format != Format::Text
    }

    /// One document on stdout: pretty JSON, or YAML.
    pub fn value(&self, value: &Value) {
        match self.format {
            Format::Yaml => print!("{}", yaml(value)),
            _ => println!(
                "{}",
                serde_json::to_string_pretty(value).expect("JSON serialises")
            ),
        }
    }

    /// One item of a stream (events, log lines): JSON on one line, or a
    /// YAML document after `---`.
    pub fn line(&self, value: &Value) {
        let mut out = std::io::stdout().lock();
        let _ = match self.format {
            Format::Yaml => write!(out, "---\n{}", yaml(value)),
            _ => writeln!(out, "{value}"),
        };
        let _ = out.flush();
    }

    /// A note for people on stderr; nothing in `json` mode.
    pub fn note(&self, text: &str) {
        if !self.structured() {
            eprintln!("{text}");
        }
    }

    /// The error on stderr: `corbel: CODE: message`, or as JSON or YAML.
    pub fn error(&self, error: &ClientError) {
        if self.format == Format::Yaml {
            eprint!("{}", yaml(&error.to_json()));
        } else if self.structured() {
            eprintln!("{}", error.to_json());
        } else {
            eprintln!("corbel: {error}");
        }
    }
}

/// An aligned table: a header, then a row per item; the last column is not
/// padded.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let widths = widths(header, rows);
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    std::iter::once(&header)
        .chain(rows)
        .map(|row| aligned(row, &widths) + "\n")
        .collect()
}

/// Each column's width in the table of `header` and `rows`.
pub fn widths(header: &[&str], rows: &[Vec<String>]) -> Vec<usize> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    widths
}

/// One row in columns of `widths`, two spaces apart; the last cell not
/// padded (a longer cell pushes the rest on).
pub fn aligned(row: &[String], widths: &[usize]) -> String {
    let last = row.len().saturating_sub(1);
    let mut line = String::new();
    for (i, cell) in row.iter().enumerate() {
        line.push_str(cell);
        if i != last {
            let pad = widths
                .get(i)
                .copied()
                .unwrap_or(0)
                .saturating_sub(cell.chars().count());
            line.push_str(&" ".repeat(pad + 2));
        }
    }
    line
}

/// A JSON field as a table cell: strings bare, null as `-`.
pub fn cell(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// `value` as YAML (a JSON value always is).
fn yaml(value: &Value) -> String {
    serde_yaml_ng::to_string(value).expect("a JSON value serialises as YAML")
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
