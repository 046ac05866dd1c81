//! Everything that can stop a report from being written.

use std::io;
use std::path::PathBuf;

use polars_error::PolarsError;

/// Why [`crate::write_reports`] failed. Journal lines that do not parse are not errors:
/// they are skipped and counted in [`crate::ReportFiles::skipped_lines`].
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ReportError {
    #[error("cannot {action} {}", path.display())]
    #[diagnostic(code(trellis::reports::io))]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("{} has no `run_started` entry on its first line", path.display())]
    #[diagnostic(
        code(trellis::reports::no_run_started),
        help(
            "point at a run directory written by `trellis run`; its journal starts with `run_started`"
        )
    )]
    MissingRunStarted { path: PathBuf },

    #[error("{} holds more than one run: a second `run_started` on line {line}", path.display())]
    #[diagnostic(
        code(trellis::reports::two_runs),
        help(
            "a journal is one run's; this one looks like two journals joined (`cat a b`): \
             report each run from its own directory, or combine shards with `trellis merge`"
        )
    )]
    SecondRun { path: PathBuf, line: u64 },

    #[error("cannot render {}", path.display())]
    #[diagnostic(
        code(trellis::reports::template),
        help("this is a bug in trellis: please report it with the run's journal.jsonl")
    )]
    Template {
        path: PathBuf,
        #[source]
        source: minijinja::Error,
    },

    #[error("{} is not a variance report", path.display())]
    #[diagnostic(
        code(trellis::reports::variance),
        help("`trellis variance RUN …` writes it again")
    )]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    #[error("cannot write Parquet file {}", path.display())]
    #[diagnostic(code(trellis::reports::parquet))]
    Polars {
        path: PathBuf,
        #[source]
        source: PolarsError,
    },
}

impl ReportError {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        ReportError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
