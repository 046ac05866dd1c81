//! The language crate's integration tests, in one binary: golden diagnostics on broken
//! suites (`golden/`) and the decoded model of valid ones (`ok/`).

mod golden;
mod needs;
mod nodes;
mod ok;
