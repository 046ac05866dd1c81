//! The Trellis suite language: KDL suite files to a typed, validated [`model::Project`].
//!
//! [`load`] reads files (and directories of `*.kdl`), follows `include`s, decodes every node
//! into the model keeping source spans, validates cross-references and templates, and
//! returns either the project or every problem found, as one miette report.
//! [`graph`] derives each scenario's trajectory DAG and the scenario `needs` DAG.
//! [`dataset`] reads the tables `for-each` scenarios expand over (the loader expands them,
//! with `matrix` scenarios, into one scenario per row and combination of values).
//! [`format`] lays suite files out canonically (`trellis fmt`).

pub mod columns;
pub mod dataset;
pub mod depth;
pub mod diagnostics;
mod expand;
pub mod format;
pub mod graph;
pub mod lang;
pub mod model;
pub mod names;
pub mod parse;
pub mod template;
pub mod validate;

/// proptest's settings for the properties in this crate's unit tests: `TRELLIS_FUZZ_CASES`
/// cases (as `tests/it/fuzz.rs` reads it), or `default`, few enough for CI; no failure files.
#[cfg(test)]
pub(crate) fn fuzz_config(default: u32) -> proptest::test_runner::Config {
    let cases = std::env::var("TRELLIS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}

pub use diagnostics::{Diagnostic, Diagnostics};
pub use model::*;
pub use parse::{LoadCache, canonical, load, load_cached, load_with_overlay, url_problem};
