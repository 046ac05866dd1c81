//! The Trellis suite language: KDL suite files to a typed, validated [`model::Project`].
//!
//! [`load`] reads files (and directories of `*.kdl`), follows `include`s, decodes every node
//! into the model keeping source spans, validates cross-references and templates, and
//! returns either the project or every problem found, as one miette report.
//! [`graph`] derives each scenario's trajectory DAG and the scenario `needs` DAG.
//! [`dataset`] reads the tables `for-each` scenarios expand over (the loader expands them,
//! with `matrix` scenarios, into one scenario per row and combination of values).
//! [`format`] lays suite files out canonically (`trellis fmt`).

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

pub use diagnostics::{Diagnostic, Diagnostics};
pub use model::*;
pub use parse::{canonical, load, load_with_overlay};
