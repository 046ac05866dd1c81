//! The language crate's integration tests, in one binary: golden diagnostics on broken
//! suites (`golden/`), the decoded model of valid ones (`ok/`), generated hostile input
//! (`fuzz`), and the language table against the reference (`language_doc`) and against what
//! decoding enforces (`types`).

mod cache;
mod directories;
mod format;
mod fuzz;
mod golden;
mod language_doc;
mod needs;
mod nesting;
mod nodes;
mod ok;
mod types;
