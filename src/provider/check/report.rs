//! The check's verdicts: one row per check, and the table printed at the end.

use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    /// Works with Corbel, but not as the protocol asks.
    Warn,
    /// Not checked (e.g. no sample to deploy).
    Skip,
    Fail,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Warn => "WARN",
            Outcome::Skip => "SKIP",
            Outcome::Fail => "FAIL",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Row {
    pub check: String,
    pub outcome: Outcome,
    pub detail: String,
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub rows: Vec<Row>,
    /// The scratch directory, when kept.
    pub kept: Option<PathBuf>,
}

impl Report {
    pub fn failures(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| r.outcome == Outcome::Fail)
            .count()
    }

    /// The table printed at the end: one line per check, details wrapped
    /// under it when they run long.
    pub fn table(&self) -> String {
        let width = self.rows.iter().map(|r| r.check.len()).max().unwrap_or(5);
        let mut out = format!("{:width$}  RESULT  DETAIL\n", "CHECK");
        for row in &self.rows {
            let mut lines = row.detail.lines();
            let first = lines.next().unwrap_or("");
            let _ = writeln!(
                out,
                "{:width$}  {:6}  {first}",
                row.check,
                row.outcome.as_str()
            );
            for line in lines {
                let _ = writeln!(out, "{:width$}          {line}", "");
            }
        }
        let count = |o| self.rows.iter().filter(|r| r.outcome == o).count();
        let _ = writeln!(
            out,
            "\n{} passed, {} failed, {} warnings, {} skipped",
            count(Outcome::Pass),
            count(Outcome::Fail),
            count(Outcome::Warn),
            count(Outcome::Skip)
        );
        out
    }

    pub(super) fn add(
        &mut self,
        check: impl Into<String>,
        outcome: Outcome,
        detail: impl Into<String>,
    ) {
        self.rows.push(Row {
            check: check.into(),
            outcome,
            detail: detail.into(),
        });
    }

    pub(super) fn result(
        &mut self,
        check: impl Into<String>,
        result: Result<String, String>,
    ) -> bool {
        match result {
            Ok(detail) => {
                self.add(check, Outcome::Pass, detail);
                true
            }
            Err(detail) => {
                self.add(check, Outcome::Fail, detail);
                false
            }
        }
    }
}
