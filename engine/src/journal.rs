//! The run journal: `journal.jsonl`, one [`JournalEntry`] per line, appended as events
//! arrive and flushed after every finished trajectory, so a crash loses at most the
//! trajectories still in flight.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

pub use crate::record::JOURNAL_FILE;
use crate::record::JournalEntry;

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum JournalError {
    #[error("cannot write the run journal {path}")]
    #[diagnostic(code(trellis::journal::io))]
    Io {
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error("cannot encode a journal entry")]
    #[diagnostic(code(trellis::journal::encode))]
    Encode(#[source] serde_json::Error),
}

pub struct JournalWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl JournalWriter {
    /// Creates `dir/journal.jsonl` (and `dir`).
    pub fn create(dir: &Path) -> Result<Self, JournalError> {
        let io = |error| JournalError::Io {
            path: dir.to_path_buf(),
            error,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let path = dir.join(JOURNAL_FILE);
        let file = File::create(&path).map_err(|error| JournalError::Io {
            path: path.clone(),
            error,
        })?;
        Ok(JournalWriter {
            path,
            out: BufWriter::with_capacity(256 * 1024, file),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn append(&mut self, entry: &JournalEntry) -> Result<(), JournalError> {
        serde_json::to_writer(&mut self.out, entry).map_err(JournalError::Encode)?;
        self.out.write_all(b"\n").map_err(|error| self.io(error))?;
        // Node lines are only useful with their trajectory line, so flushing after each
        // trajectory is enough to keep every finished trajectory across a crash.
        if !matches!(entry, JournalEntry::Node(_)) {
            self.out.flush().map_err(|error| self.io(error))?;
        }
        Ok(())
    }

    pub fn finish(mut self) -> Result<PathBuf, JournalError> {
        self.out.flush().map_err(|error| self.io(error))?;
        Ok(self.path)
    }

    fn io(&self, error: std::io::Error) -> JournalError {
        JournalError::Io {
            path: self.path.clone(),
            error,
        }
    }
}

/// Reads a journal back, skipping a torn last line (a crash mid-write).
pub fn read(path: &Path) -> Result<impl Iterator<Item = JournalEntry>, JournalError> {
    let file = File::open(path).map_err(|error| JournalError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    Ok(BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .filter_map(|line| serde_json::from_str(&line).ok()))
}
