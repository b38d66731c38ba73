//! The deployments pages in real Chromium: a deployment's whole life on
//! its pages, a change planned, applied and rolled back, and a container's
//! power and logs from its node's panel, and a node's live health (red once
//! its process is killed, restarted from its panel, listed on the overview),
//! and a command run from a node's panel, and a deployment of 1,000 nodes
//! drawn by level with only the rows in view.
//! This module holds what they share:
//! the mark that tells a reload, and a node's box in the drawn DAG.

mod changes;
mod exec;
mod health;
mod large;
mod lifecycle;
mod power;

/// Marks the document; the mark survives anything but a reload.
const MARK: &str = "window.__marker = 1; return true;";
const MARKED: &str = "window.__marker === 1";

fn node(key: &str) -> String {
    format!(r#"#dag [data-key="{key}"]"#)
}
