//! The language crate's integration tests, in one binary: golden diagnostics on broken
//! suites (`golden/`), the decoded model of valid ones (`ok/`), and generated hostile input
//! (`fuzz`).

mod fuzz;
mod golden;
mod language_doc;
mod needs;
mod nesting;
mod nodes;
mod ok;
