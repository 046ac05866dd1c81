//! Journals cut short by a crash, and journals that are not Trellis journals.

use std::fs::File;

use polars_io::prelude::*;
use trellis_reports::{ReportError, ReportOptions, write_reports};

use super::fixtures::{entries, write_journal};

#[test]
fn crashed_run_still_produces_tables() {
    let dir = tempfile::tempdir().unwrap();
    // No `run_finished`, and a last line cut mid-write inside a multi-byte character.
    let mut truncated =
        br#"{"trajectory":{"suite":"shop","scenario":"booking","trajectory":"caf"#.to_vec();
    truncated.push(0xC3);
    let tail = String::from_utf8_lossy(&truncated).into_owned();
    write_journal(dir.path(), &entries(), &tail);
    // Make the cut byte-exact rather than the lossy replacement character.
    let path = dir.path().join("journal.jsonl");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(bytes.len() - tail.len());
    bytes.extend_from_slice(&truncated);
    std::fs::write(&path, bytes).unwrap();

    let files = write_reports(dir.path(), &ReportOptions::default()).unwrap();
    assert!(!files.complete);
    assert_eq!(files.skipped_lines, 1);

    let read = |p: &std::path::Path| ParquetReader::new(File::open(p).unwrap()).finish().unwrap();
    assert_eq!(read(&files.trajectories).height(), 6);
    assert_eq!(read(&files.turns).height(), 13);
    let runs = read(&files.runs);
    assert_eq!(runs.column("finished_at").unwrap().null_count(), 1);
    assert_eq!(runs.column("duration_ms").unwrap().null_count(), 1);
    assert_eq!(
        runs.column("trajectories").unwrap().u64().unwrap().get(0),
        Some(6)
    );

    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(html.contains("Did not finish"));
    assert!(html.contains("covers 6 of 6 planned trajectories"));
    assert!(html.contains("1 journal line(s) could not be read"));
}

#[test]
fn malformed_line_in_the_middle_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let all = entries();
    let path = dir.path().join("journal.jsonl");
    let mut text = String::new();
    for (i, entry) in all.iter().enumerate() {
        text.push_str(&serde_json::to_string(entry).unwrap());
        text.push('\n');
        if i == 2 {
            text.push_str("not json\n\n");
        }
    }
    std::fs::write(&path, text).unwrap();
    let files = write_reports(dir.path(), &ReportOptions::default()).unwrap();
    assert_eq!(files.skipped_lines, 1);
}

#[test]
fn journal_without_run_started_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let all = entries();
    write_journal(dir.path(), &all[1..], "");
    let err = write_reports(dir.path(), &ReportOptions::default()).unwrap_err();
    assert!(
        matches!(err, ReportError::MissingRunStarted { .. }),
        "{err:?}"
    );

    write_journal(dir.path(), &[], "");
    let err = write_reports(dir.path(), &ReportOptions::default()).unwrap_err();
    assert!(
        matches!(err, ReportError::MissingRunStarted { .. }),
        "{err:?}"
    );
}

#[test]
fn missing_journal_is_an_io_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = write_reports(dir.path(), &ReportOptions::default()).unwrap_err();
    match err {
        ReportError::Io { path, .. } => assert!(path.ends_with(trellis_reports::JOURNAL_FILE)),
        other => panic!("unexpected error {other:?}"),
    }
}
