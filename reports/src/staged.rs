//! Results files are written under a temporary name (`NAME.partial`) and renamed into place
//! once complete, so a run that is killed or fails mid-write never leaves a truncated
//! `*.parquet`, `report.html` or `junit.xml` where a glob, a browser or a CI system finds it.
//! The rename is atomic on one file system; no fsync is done (a power cut may still lose the
//! newest file, never expose half of one). A file whose writing failed (a full disk, say) has
//! its `.partial` removed, so a run that exits 3 leaves no half-written file under any name.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::ReportError;

/// Appended to a results file's name while it is written.
pub const PARTIAL_SUFFIX: &str = ".partial";

/// A results file being written under its temporary name.
pub(crate) struct Staged {
    /// Where the file goes once complete.
    pub(crate) path: PathBuf,
    partial: PathBuf,
    /// Renamed into place: nothing is left to clean up.
    published: bool,
}

impl Staged {
    /// Creates (or truncates a stale) `path.partial`.
    pub(crate) fn create(path: &Path) -> Result<(Self, File), ReportError> {
        let mut partial = path.as_os_str().to_owned();
        partial.push(PARTIAL_SUFFIX);
        let partial = PathBuf::from(partial);
        let file = File::create(&partial).map_err(|e| ReportError::io("create", &partial, e))?;
        Ok((
            Staged {
                path: path.to_path_buf(),
                partial,
                published: false,
            },
            file,
        ))
    }

    /// Renames the finished file into place, replacing an earlier one.
    pub(crate) fn publish(mut self) -> Result<PathBuf, ReportError> {
        std::fs::rename(&self.partial, &self.path)
            .map_err(|e| ReportError::io("move into place", &self.path, e))?;
        self.published = true;
        Ok(std::mem::take(&mut self.path))
    }
}

impl Drop for Staged {
    /// A file given up on (its writing failed, or it could not be moved into place) is
    /// removed rather than left half-written beside the results.
    fn drop(&mut self) {
        if !self.published {
            // Nothing more to do if it is already gone; the write's own error is reported.
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}
