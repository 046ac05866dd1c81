//! Streaming reader for a run's journal (`trellis-journal`: compressed or an older plain
//! one), tolerant of a run that crashed mid-write, with its errors as [`ReportError`]s.
//!
//! The journal is read one line at a time so memory does not grow with the run. A line that
//! does not parse (typically the last one, cut short by a crash) is skipped and counted rather
//! than failing the whole report: everything that was finished before it is still worth
//! reporting.

use std::path::Path;

use trellis_journal::JournalError;
use trellis_records::JournalEntry;

use crate::error::ReportError;

pub(crate) struct JournalReader {
    inner: trellis_journal::JournalReader,
}

impl JournalReader {
    pub(crate) fn open(path: &Path) -> Result<Self, ReportError> {
        trellis_journal::JournalReader::open(path)
            .map(|inner| JournalReader { inner })
            .map_err(|e| report_error("open", path, e))
    }

    /// Lines that were not a valid journal entry.
    pub(crate) fn skipped(&self) -> usize {
        self.inner.skipped()
    }

    /// The next entry that parses, `None` at the end of the file.
    pub(crate) fn next_entry(&mut self) -> Result<Option<JournalEntry>, ReportError> {
        let path = self.inner.path().to_path_buf();
        self.inner
            .next_entry()
            .map_err(|e| report_error("read", &path, e))
    }

    /// The next non-blank line, trimmed; `None` at the end of the file.
    pub(crate) fn next_line(&mut self) -> Result<Option<&[u8]>, ReportError> {
        let path = self.inner.path().to_path_buf();
        self.inner
            .next_line()
            .map_err(|e| report_error("read", &path, e))
    }
}

fn report_error(action: &'static str, path: &Path, error: JournalError) -> ReportError {
    match error {
        JournalError::Read { path, source } | JournalError::Write { path, source } => {
            ReportError::io(action, path, source)
        }
        JournalError::Encode(e) => ReportError::io(action, path, std::io::Error::other(e)),
    }
}
