//! The one recorder of `run`, `watch` and `rejudge`: a run directory claimed for the
//! recording ([`claim_out_dir`]: the lock, `--replace`), and the fan-out of a run's events
//! into it ([`Record`]: the journal first, then the result tables, HTML and JUnit). The
//! console is each command's own (a run's progress, watch's view of a rerun).
//!
//! A sink that fails stops only itself: a journal that cannot be written still leaves the
//! tables, HTML and JUnit, and every problem is said once, at the end.

use std::path::{Path, PathBuf};

use trellis_engine::event::Event;
use trellis_engine::journal::{JournalError, JournalWriter};
use trellis_reports::{ReportError, ReportFiles, ReportOptions, ReportWriter};

/// The lock a run holds on its output directory (`.trellis-run.lock`, an advisory file
/// lock the operating system releases when the run ends, however it ends).
pub(super) const OUT_LOCK: &str = ".trellis-run.lock";

/// A run's claim on its output directory: the locked file, removed when the run is over
/// (a run killed outright leaves it behind, unlocked, and the next run takes it over).
pub(super) struct OutClaim {
    path: PathBuf,
    _lock: std::fs::File,
}

impl Drop for OutClaim {
    fn drop(&mut self) {
        // Removed while still locked: a run that opens the name afterwards gets a new file
        // and its own lock. Failing to remove it leaves an empty file, nothing worse.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Claims `out` for this run: refuses a directory another run is writing to, and one that
/// holds an earlier run unless `replace` says to clear it (a new journal over an old one
/// would silently lose the earlier results); `resumable` when the command can `--resume` it.
/// The returned file holds the claim.
pub(super) fn claim_out_dir(
    out: &Path,
    replace: bool,
    resumable: bool,
) -> Result<OutClaim, String> {
    std::fs::create_dir_all(out).map_err(|e| {
        // "File exists" says nothing of which file, nor why it is in the way.
        let why = match std::fs::symlink_metadata(out) {
            Ok(m) if m.file_type().is_symlink() && !out.exists() => {
                "it is a symbolic link to nothing".to_owned()
            }
            Ok(_) if out.exists() && !out.is_dir() => "it is a file, not a directory".to_owned(),
            _ => e.to_string(),
        };
        format!(
            "cannot create the output directory {}: {why}",
            out.display()
        )
    })?;
    let claim = lock(out).map_err(|e| e.to_string())?;
    // Only a regular file is an earlier run's journal; a device or a dangling name is not
    // a result anyone can lose.
    let Some(journal) = trellis_engine::journal::find(out) else {
        // No earlier run, but files of the names a run writes (a CI job's own junit.xml,
        // a run's tables whose journal was removed): not overwritten unasked either.
        let in_the_way: Vec<&str> = trellis_reports::RESULT_FILES
            .into_iter()
            .filter(|name| std::fs::symlink_metadata(out.join(name)).is_ok_and(|m| m.is_file()))
            .collect();
        if in_the_way.is_empty() {
            return Ok(claim);
        }
        if !replace {
            return Err(format!(
                "{} holds {}, which this run would overwrite (and no run's journal); pass \
                 --replace to overwrite {} or choose another --out",
                out.display(),
                in_the_way.join(", "),
                if in_the_way.len() == 1 { "it" } else { "them" },
            ));
        }
        clear_results(out)
            .map_err(|(path, e)| format!("cannot remove {} to replace it: {e}", path.display()))?;
        return Ok(claim);
    };
    if !replace {
        // Only `run` resumes; `merge` and `rejudge` write a run of their own.
        let resume = if resumable {
            format!(
                ", --resume {} to finish it if it was cut short,",
                super::console::shell_word(out)
            )
        } else {
            String::new()
        };
        return Err(format!(
            "{} already holds a run ({} exists); pass --replace to overwrite that run's \
             files{resume} or choose another --out (without --out every run gets its own \
             runs/<run-id>)",
            out.display(),
            journal.display(),
        ));
    }
    // The earlier run's files go before the new run starts, so a new run that is killed
    // early never leaves its journal next to the old run's tables.
    clear_results(out).map_err(|(path, e)| {
        format!(
            "cannot remove {} to replace the earlier run: {e}",
            path.display()
        )
    })?;
    Ok(claim)
}

/// Why a directory could not be claimed.
#[derive(Debug, thiserror::Error)]
pub(super) enum ClaimError {
    /// Another trellis process holds its lock: what to do is the caller's to say (wait and
    /// choose another `--out`, or wait and resume).
    #[error(
        "another trellis run is writing to {}; wait for it to finish or choose another --out",
        .0.display()
    )]
    Busy(PathBuf),
    #[error("{0}")]
    Other(String),
}

/// Claims the directory of a run to resume: only the lock, which refuses a run that is
/// still writing there (its journal is the point).
pub(super) fn claim_run_dir(dir: &Path) -> Result<OutClaim, ClaimError> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => lock(dir),
        Ok(_) => Err(ClaimError::Other(format!(
            "{} is not a run directory",
            dir.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ClaimError::Other(format!(
            "{} does not exist: there is no run to resume there",
            dir.display()
        ))),
        Err(e) => Err(ClaimError::Other(format!(
            "cannot resume {}: {e}",
            dir.display()
        ))),
    }
}

/// `trellis watch`'s hold on `latest` (created if missing) for its whole session: another
/// watch of the same `--out` would rewrite the same files under it, each moving its own
/// into place over the other's.
pub(super) fn claim_watch_dir(latest: &Path) -> Result<OutClaim, String> {
    std::fs::create_dir_all(latest)
        .map_err(|e| format!("cannot create {}: {e}", latest.display()))?;
    lock(latest).map_err(|e| match e {
        ClaimError::Busy(_) => format!(
            "another trellis is writing to {} (a `trellis watch` of the same --out?); stop it \
             or give this one another --out",
            latest.display()
        ),
        ClaimError::Other(why) => why,
    })
}

/// Takes `out`'s lock file, refusing when another trellis holds it.
fn lock(out: &Path) -> Result<OutClaim, ClaimError> {
    let lock_path = out.join(OUT_LOCK);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| ClaimError::Other(format!("cannot create {}: {e}", lock_path.display())))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(ClaimError::Busy(out.to_path_buf()));
        }
        // A filesystem without file locks (some network mounts) cannot tell: the run goes
        // on unguarded rather than not at all.
        Err(std::fs::TryLockError::Error(_)) => {}
    }
    Ok(OutClaim {
        path: lock_path,
        _lock: lock,
    })
}

/// Removes the result files (and their partial forms) an earlier recording left in `out`;
/// on failure, the file that could not be removed and why.
pub(super) fn clear_results(out: &Path) -> Result<(), (PathBuf, std::io::Error)> {
    for name in trellis_reports::RESULT_FILES {
        let path = out.join(name);
        let mut partial = path.as_os_str().to_owned();
        partial.push(trellis_reports::PARTIAL_SUFFIX);
        for path in [path, PathBuf::from(partial)] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err((path, e)),
            }
        }
    }
    Ok(())
}

/// One recording of a run's events into a run directory.
pub(super) struct Record {
    out: PathBuf,
    journal: JournalWriter,
    journal_error: Option<JournalError>,
    report: Option<ReportWriter>,
    /// The report writer could not start; the error is said at the end.
    report_error: Option<ReportError>,
    report_options: ReportOptions,
    /// A resumed run's recording: what [`Record::resumed`] says.
    resumed: Option<ResumedRecord>,
    /// Set by [`Record::flush_when_idle`]: entries are flushed by [`Record::idle`] or
    /// [`MAX_UNFLUSHED`] after the last flush, not one by one.
    batched: Option<std::time::Instant>,
    /// Entries were appended since the last flush: not yet readable on disk, so not yet
    /// to be reported as recorded ([`Record::holds_unflushed`]).
    unflushed: bool,
}

/// How long a batched journal may hold entries that are not yet readable on disk while the
/// recorder is never idle (a crash loses at most this much beyond the events queued).
const MAX_UNFLUSHED: std::time::Duration = std::time::Duration::from_millis(100);

/// How a resumed run's events are recorded: its journal already starts with the run's
/// `run_started` and what the earlier attempts finished, so the events add to it, and the
/// results files are written from the whole journal at the end.
struct ResumedRecord {
    /// Agents whose setup record the journal keeps: set up again, they are not recorded
    /// twice.
    agents: std::collections::HashSet<String>,
}

/// What a finished [`Record`] left in its directory.
pub(super) struct Recorded {
    /// The journal, when all of it was written.
    pub journal_path: Option<PathBuf>,
    /// The result files, unless none could be written.
    pub files: Option<ReportFiles>,
    /// What could not be written, one sentence each.
    pub problems: Vec<String>,
}

impl Record {
    /// Starts `out`'s journal (and `out`).
    pub(super) fn create(out: &Path) -> Result<Record, String> {
        let journal = JournalWriter::create(out).map_err(|e| format!("{e}: {}", source(&e)))?;
        Ok(Record {
            out: out.to_path_buf(),
            journal,
            journal_error: None,
            report: None,
            report_error: None,
            report_options: ReportOptions::default(),
            resumed: None,
            batched: None,
            unflushed: false,
        })
    }

    /// Records a resumed run into `out`, appending to `journal` (which holds what the
    /// earlier attempts finished, `agents`' setup records among it).
    pub(super) fn resumed(
        out: &Path,
        journal: JournalWriter,
        agents: std::collections::HashSet<String>,
    ) -> Record {
        Record {
            out: out.to_path_buf(),
            journal,
            journal_error: None,
            report: None,
            report_error: None,
            report_options: ReportOptions::default(),
            resumed: Some(ResumedRecord { agents }),
            batched: None,
            unflushed: false,
        }
    }

    /// Flushes the journal when the caller says it has nothing queued ([`Record::idle`]) or
    /// [`MAX_UNFLUSHED`] after the last flush, instead of after every trajectory: under load
    /// a flush per trajectory was a zstd block and a `write` each (about 5% of a run's CPU
    /// at 20,000 one-turn trajectories a second), and a crash still loses only what had not
    /// reached the recorder or was queued behind it.
    pub(super) fn flush_when_idle(&mut self) {
        self.batched = Some(std::time::Instant::now());
    }

    /// The caller has no event queued: what was appended is flushed.
    pub(super) fn idle(&mut self) {
        if self.batched.is_some() {
            self.flush_journal();
        }
    }

    /// The run has been quiet for a while (it waits on its agents; [`Record::idle`] came
    /// first): the tables write the rows they buffered, when there are enough for a row
    /// group, instead of leaving them all to the end of the run.
    pub(super) fn quiet(&mut self) {
        if let Some(report) = &mut self.report {
            report.flush_quiet();
        }
    }

    /// Whether entries appended since the last flush are not yet on disk: what reports an
    /// event as recorded (the console, `--message-format json`) waits until they are, or a
    /// `kill -9` loses trajectories a script was already told had finished.
    pub(super) fn holds_unflushed(&self) -> bool {
        self.unflushed && self.journal_error.is_none()
    }

    fn flush_journal(&mut self) {
        if self.journal_error.is_none()
            && let Err(e) = self.journal.flush()
        {
            self.journal_error = Some(e);
        }
        self.unflushed = false;
        if let Some(last) = &mut self.batched {
            *last = std::time::Instant::now();
        }
    }

    fn append(&mut self, event: &Event) {
        if self.journal_error.is_some() {
            return;
        }
        if self.batched.is_some() && matches!(event, Event::RunFinished(_)) {
            // Every trajectory is whole on disk before the run's last entry, as when
            // flushing one by one: a journal cut in its end still holds all of them.
            self.flush_journal();
        }
        let appended = match self.batched {
            Some(_) => {
                self.unflushed = true;
                self.journal.append_unflushed(event)
            }
            None => self.journal.append(event),
        };
        if let Err(e) = appended {
            self.journal_error = Some(e);
        } else if self
            .batched
            .is_some_and(|last| last.elapsed() >= MAX_UNFLUSHED)
        {
            self.flush_journal();
        }
    }

    /// The run's git state, known only once it has run (src/cli/meta.rs, `GitProbe`): the
    /// results record it as run.json now does.
    pub(super) fn set_git(&mut self, git: trellis_reports::history::GitState) {
        if let Some(report) = &mut self.report {
            report.set_git(git);
        }
    }

    /// The directory recorded into.
    pub(super) fn out(&self) -> &Path {
        &self.out
    }

    pub(super) fn push(&mut self, event: &Event) {
        if let Some(resumed) = &self.resumed {
            // The journal names the run already, and the tables are written from all of it
            // at the end.
            let recorded = match event {
                Event::RunStarted(_) => true,
                Event::Agent(agent) => resumed.agents.contains(&agent.agent),
                _ => false,
            };
            if !recorded {
                self.append(event);
            }
            return;
        }
        self.append(event);
        match (self.report.as_mut(), event) {
            (Some(writer), event) => writer.push(event),
            (None, Event::RunStarted(info)) if self.report_error.is_none() => {
                match ReportWriter::start(&self.out, info, &self.report_options) {
                    Ok(writer) => self.report = Some(writer),
                    Err(e) => self.report_error = Some(e),
                }
            }
            (None, _) => {}
        }
    }

    /// Flushes the journal, then writes the result tables, HTML and JUnit.
    pub(super) fn finish(self) -> Recorded {
        let Record {
            out,
            journal,
            journal_error,
            report,
            report_error,
            report_options,
            resumed: _,
            batched: _,
            unflushed: _,
        } = self;
        let mut problems = Vec::new();
        let journal_error = match journal_error {
            Some(e) => Some(e),
            // The HTML transcripts are read back from the journal: it must be on disk first.
            None => journal.finish().err(),
        };
        let journal_path = match &journal_error {
            None => Some(out.join(trellis_engine::journal::JOURNAL_FILE)),
            Some(e) => {
                problems.push(format!(
                    "{e}: {}; report.html has no transcripts and `trellis report` cannot \
                     rebuild this run",
                    source(e)
                ));
                None
            }
        };
        let files = match (report, report_error) {
            (Some(mut writer), None) => {
                if let Some(e) = &journal_error {
                    writer
                        .journal_lost(format!("the journal could not be written ({})", source(e)));
                }
                Ok(writer.finish())
            }
            (_, Some(e)) => Err(e),
            // No event reached the writer: rebuild from whatever the journal holds.
            (None, None) => trellis_reports::write_reports(&out, &report_options),
        };
        match &files {
            Ok(files) => {
                for (path, e) in &files.not_written {
                    problems.push(format!(
                        "{} was not written: {e}: {}",
                        path.display(),
                        source(e)
                    ));
                }
            }
            Err(e) => problems.push(format!(
                "no results file was written: {e}: {}{}",
                source(e),
                if journal_path.is_some() {
                    format!("; `trellis report {}` rebuilds them", out.display())
                } else {
                    String::new()
                }
            )),
        }
        Recorded {
            journal_path,
            files: files.ok(),
            problems,
        }
    }
}

pub(super) fn source(e: &dyn std::error::Error) -> String {
    e.source().map(|s| s.to_string()).unwrap_or_default()
}
