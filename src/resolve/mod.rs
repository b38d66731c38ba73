//! Versions, constraints and dependency resolution: pure code, no IO.
