//! Loading a recorded run's suites again from what its `run.json` says it was planned from
//! (`source`: every suite file, absolute, with the hash of its text, and the selection), so
//! a command about a run (`trellis variance RUN`) needs no suite paths.
//!
//! The files are loaded only when every one of them is still there with the text the run
//! loaded: results planned from edited suites would not be results of the recorded run, so
//! a gone or changed file is refused by name, with the way out (give the paths).

use std::path::{Path, PathBuf};

use trellis_engine::plan::Selection;
use trellis_reports::history::RunMeta;

/// Why a run's suites cannot be loaded from its record.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum RecordedSuitesError {
    #[error("cannot read {}'s run.json", dir.display())]
    #[diagnostic(
        code(trellis::recorded_suites::meta),
        help("give the suites the run was made from after the run: `{usage}`")
    )]
    Meta {
        dir: PathBuf,
        usage: String,
        #[source]
        source: trellis_reports::history::HistoryError,
    },
    #[error("{} does not record which suites it was planned from", dir.display())]
    #[diagnostic(
        code(trellis::recorded_suites::unrecorded),
        help(
            "runs recorded before trellis kept their suite files in run.json (and merged or copied runs without it) need the suites given: `{usage}`"
        )
    )]
    Unrecorded { dir: PathBuf, usage: String },
    #[error("the suites run {run} was planned from are not as they were: {}", problems.join("; "))]
    #[diagnostic(
        code(trellis::recorded_suites::changed),
        help(
            "restore them, or give the suites to use as they are now (the results then measure those): `{usage}`"
        )
    )]
    Changed {
        run: String,
        problems: Vec<String>,
        usage: String,
    },
}

/// The suite files and selection recorded for the run in `dir`, each file checked against
/// the text the run loaded. `usage` is the command with paths, for the hints.
pub fn recorded(dir: &Path, usage: &str) -> Result<(Vec<PathBuf>, Selection), RecordedSuitesError> {
    let meta = RunMeta::read(dir).map_err(|source| RecordedSuitesError::Meta {
        dir: dir.to_owned(),
        usage: usage.to_owned(),
        source,
    })?;
    let Some((meta, source)) = meta.and_then(|m| {
        let source = m.source.clone()?;
        Some((m, source))
    }) else {
        return Err(RecordedSuitesError::Unrecorded {
            dir: dir.to_owned(),
            usage: usage.to_owned(),
        });
    };
    let mut problems = Vec::new();
    for file in &source.files {
        match std::fs::read_to_string(&file.path) {
            Ok(text) if super::meta::text_hash(&text) == file.blake3 => {}
            Ok(_) => problems.push(format!("{} has changed since", file.path)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                problems.push(format!("{} is gone", file.path));
            }
            Err(e) => problems.push(format!("{} cannot be read ({e})", file.path)),
        }
    }
    if source.files.is_empty() {
        problems.push("run.json lists no suite file".to_owned());
    }
    if !problems.is_empty() {
        return Err(RecordedSuitesError::Changed {
            run: meta.run_id,
            problems,
            usage: usage.to_owned(),
        });
    }
    let selection = Selection {
        filters: source.filters,
        tags: meta.tags,
        include_inactive: source.include_inactive,
    };
    Ok((
        source
            .files
            .into_iter()
            .map(|f| PathBuf::from(f.path))
            .collect(),
        selection,
    ))
}
