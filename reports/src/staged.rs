//! Results files are written under a temporary name (`NAME.partial`) and renamed into place
//! once complete, so a run that is killed or fails mid-write never leaves a truncated
//! `*.parquet`, `report.html` or `junit.xml` where a glob, a browser or a CI system finds it.
//! The rename is atomic on one file system; no fsync is done (a power cut may still lose the
//! newest file, never expose half of one). A file whose writing failed (a full disk, say) has
//! its `.partial` removed, so a run that exits 3 leaves no half-written file under any name.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::error::ReportError;

/// A results file as a library writes it, keeping the first I/O error it met: Parquet's
/// writer says one met while writing a page header as "Invalid thrift: transport error",
/// and the page's template engine as "I/O error during rendering", so a full disk read as
/// a damaged file or a template's bug. What they made of it is replaced by it
/// ([`kept_io_error`]).
pub(crate) struct KeptIoError<W = BufWriter<File>> {
    pub(crate) file: W,
    pub(crate) first: Arc<OnceLock<io::Error>>,
}

impl<W> KeptIoError<W> {
    fn keep<T>(&self, result: io::Result<T>) -> io::Result<T> {
        result.inspect_err(|e| {
            // Retried by `write_all`: not what a failure was.
            if matches!(
                e.kind(),
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
            ) {
                return;
            }
            let _ = self.first.set(copy_of(e));
        })
    }
}

impl<W: io::Write> io::Write for KeptIoError<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.file.write(buf);
        self.keep(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        let flushed = self.file.flush();
        self.keep(flushed)
    }
}

/// The first I/O error a [`KeptIoError`] met, as a value of its own.
pub(crate) fn kept_io_error(first: &OnceLock<io::Error>) -> Option<io::Error> {
    first.get().map(copy_of)
}

/// An I/O error as a value of its own (`io::Error` is not `Clone`): the same OS error, or
/// the same kind and text.
fn copy_of(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

/// Appended to a results file's name while it is written.
pub const PARTIAL_SUFFIX: &str = ".partial";

/// A results file being written under its temporary name.
pub(crate) struct Staged {
    /// Where the file goes once complete.
    pub(crate) path: PathBuf,
    /// `None`: written in place, `path` being no regular file (`--html /dev/stdout`).
    partial: Option<PathBuf>,
    /// Renamed into place: nothing is left to clean up.
    published: bool,
}

impl Staged {
    /// Creates (or truncates a stale) `path.partial`; or opens `path` itself when it is a
    /// device, a pipe or a socket (`/dev/stdout`, `/dev/null`), which a rename would
    /// replace with a regular file.
    pub(crate) fn create(path: &Path) -> Result<(Self, File), ReportError> {
        if std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| ReportError::io("open", path, e))?;
            return Ok((
                Staged {
                    path: path.to_path_buf(),
                    partial: None,
                    published: false,
                },
                file,
            ));
        }
        let mut partial = path.as_os_str().to_owned();
        partial.push(PARTIAL_SUFFIX);
        let partial = PathBuf::from(partial);
        let file = File::create(&partial).map_err(|e| ReportError::io("create", &partial, e))?;
        Ok((
            Staged {
                path: path.to_path_buf(),
                partial: Some(partial),
                published: false,
            },
            file,
        ))
    }

    /// Renames the finished file into place, replacing an earlier one.
    pub(crate) fn publish(mut self) -> Result<PathBuf, ReportError> {
        if let Some(partial) = &self.partial {
            std::fs::rename(partial, &self.path)
                .map_err(|e| ReportError::io("move into place", &self.path, e))?;
        }
        self.published = true;
        Ok(std::mem::take(&mut self.path))
    }
}

impl Drop for Staged {
    /// A file given up on (its writing failed, or it could not be moved into place) is
    /// removed rather than left half-written beside the results.
    fn drop(&mut self) {
        if !self.published
            && let Some(partial) = &self.partial
        {
            // Nothing more to do if it is already gone; the write's own error is reported.
            let _ = std::fs::remove_file(partial);
        }
    }
}
