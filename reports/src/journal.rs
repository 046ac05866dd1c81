//! Streaming reader for `journal.jsonl`, tolerant of a run that crashed mid-write.
//!
//! The journal is read one line at a time so memory does not grow with the run. A line that
//! does not parse (typically the last one, cut short by a crash) is skipped and counted rather
//! than failing the whole report: everything that was finished before it is still worth
//! reporting.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use trellis_records::JournalEntry;

use crate::error::ReportError;

pub(crate) struct JournalReader {
    path: PathBuf,
    reader: BufReader<File>,
    line: Vec<u8>,
    /// Lines that were not a valid journal entry.
    pub(crate) skipped: usize,
}

impl JournalReader {
    pub(crate) fn open(path: &Path) -> Result<Self, ReportError> {
        let file = File::open(path).map_err(|e| ReportError::io("open", path, e))?;
        Ok(JournalReader {
            path: path.to_path_buf(),
            reader: BufReader::with_capacity(256 * 1024, file),
            line: Vec::new(),
            skipped: 0,
        })
    }

    /// The next entry that parses, `None` at the end of the file.
    pub(crate) fn next_entry(&mut self) -> Result<Option<JournalEntry>, ReportError> {
        loop {
            let Some(line) = self.next_line()? else {
                return Ok(None);
            };
            match serde_json::from_slice::<JournalEntry>(line) {
                Ok(entry) => return Ok(Some(entry)),
                Err(_) => self.skipped += 1,
            }
        }
    }

    /// The next non-blank line, trimmed; `None` at the end of the file.
    pub(crate) fn next_line(&mut self) -> Result<Option<&[u8]>, ReportError> {
        loop {
            self.line.clear();
            // Bytes, not `read_line`: a line cut inside a multi-byte character must count as
            // one malformed line, not abort the read with an encoding error.
            let read = self
                .reader
                .read_until(b'\n', &mut self.line)
                .map_err(|e| ReportError::io("read", &self.path, e))?;
            if read == 0 {
                return Ok(None);
            }
            if !self.line.trim_ascii().is_empty() {
                return Ok(Some(self.line.trim_ascii()));
            }
        }
    }
}
