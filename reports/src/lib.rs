//! Trellis results: turns a run journal into files people and tools read.
//!
//! [`ReportWriter`] consumes journal entries as a run produces them; [`write_reports`]
//! replays the journal (`journal.jsonl.zst`, or an older plain `journal.jsonl`) from a run
//! directory through the same writer. Either way the run
//! directory gets five Snappy-compressed Parquet tables (`trajectories`, `turns`, `tool_calls`, `criteria`,
//! `runs`), a self-contained `report.html` and a `junit.xml`. The journal is read line by
//! line and the tables are flushed in bounded batches, so memory does not grow with the run;
//! a journal cut short by a crash (no `run_finished`, a truncated last line) still yields
//! every table. Every file is written under a temporary name and renamed into place when
//! complete ([`PARTIAL_SUFFIX`]), and a file that cannot be written does not stop the others.
//! The layout of every file is documented in `docs/results.md`.

mod by_names;
pub mod calibrate;
pub mod calibration;
mod columns;
pub mod compare;
mod contained;
pub mod dataset;
mod error;
pub mod history;
mod html;
mod journal;
mod json;
mod junit;
pub mod labels;
pub mod pivot;
mod positions;
mod row_groups;
mod staged;
pub mod stats;
mod tables;
mod tally;
pub mod variance;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use trellis_records::{JournalEntry, NodeRecord, RunInfo, RunSummary, TrajectoryRecord};

pub use by_names::ByNames;
pub use error::ReportError;
pub use html::{
    CompareMetric, ComparePage, CompareRate, CompareRow, CompareRun, CompareTally, ScenarioTrend,
    TrendPoint, Trends, with_served_script, write_compare,
};
pub use staged::PARTIAL_SUFFIX;
pub use tally::Counts;

use crate::journal::JournalReader;
use crate::tables::{RunRow, Tables};
use crate::tally::{Rendered, Selection, Tally};

/// The journal the engine writes into the run directory (`journal.jsonl.zst`); runs of
/// earlier versions have [`PLAIN_JOURNAL_FILE`] instead.
pub use trellis_records::{JOURNAL_FILE, PLAIN_JOURNAL_FILE};
/// The HTML report written into the run directory.
pub const HTML_FILE: &str = "report.html";
/// The JUnit report written into the run directory.
pub const JUNIT_FILE: &str = "junit.xml";
/// The run's statistics as JSON ([`Summary`]), written into the run directory.
pub const SUMMARY_FILE: &str = "summary.json";
/// `trellis run --baseline`'s comparison as JSON ([`compare::Comparison`]).
pub const COMPARE_FILE: &str = "compare.json";
/// `trellis run --baseline`'s comparison as a page ([`write_compare`]).
pub const COMPARE_HTML_FILE: &str = "compare.html";
/// Every file a run writes into its directory, the journal first (and the plain journal
/// of earlier versions, which `--replace` removes too).
pub const RESULT_FILES: [&str; 17] = [
    JOURNAL_FILE,
    PLAIN_JOURNAL_FILE,
    tables::TRAJECTORIES_FILE,
    tables::TURNS_FILE,
    tables::TOOL_CALLS_FILE,
    tables::CRITERIA_FILE,
    tables::RUBRIC_SCORES_FILE,
    tables::RUNS_FILE,
    tables::SPANS_FILE,
    HTML_FILE,
    JUNIT_FILE,
    SUMMARY_FILE,
    history::RUN_META_FILE,
    trellis_records::SHARD_PLAN_FILE,
    COMPARE_FILE,
    COMPARE_HTML_FILE,
    calibration::CALIBRATION_FILE,
];

/// `summary.json`: the run's metadata and statistics, for CI scripts and dashboards.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub schema_version: u32,
    /// `run.json` as it was when the run's reports were written.
    pub meta: Option<history::RunMeta>,
    pub stats: stats::RunStats,
}

/// How much of the run `report.html` renders in full.
#[derive(Clone, Debug)]
pub struct ReportOptions {
    /// Full transcripts rendered for trajectories that errored, failed or were skipped;
    /// the rest are counted and pointed to `turns.parquet`.
    pub max_failing_transcripts: usize,
    /// Full transcripts rendered for passed trajectories.
    pub max_passing_transcripts: usize,
    /// Of those, the most for repetitions of one trajectory with one agent: a scenario
    /// repeated thousands of times shows a few of its passes, not the whole budget of them,
    /// and leaves room for the passes of the scenarios after it.
    pub max_passing_transcripts_per_trajectory: usize,
    /// Rows buffered per Parquet table before they are written as a row group.
    pub batch_rows: usize,
    /// Earlier runs drawn in each scenario's trend in `report.html`, read from the run
    /// directories next to this one; 0 draws no trend.
    pub trend_runs: usize,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            max_failing_transcripts: 500,
            max_passing_transcripts: 200,
            max_passing_transcripts_per_trajectory: 5,
            batch_rows: 8 * 1024,
            trend_runs: 10,
        }
    }
}

/// What [`write_reports`] or [`ReportWriter::finish`] wrote, and what it could not.
#[derive(Debug)]
pub struct ReportFiles {
    pub trajectories: PathBuf,
    pub turns: PathBuf,
    pub tool_calls: PathBuf,
    pub criteria: PathBuf,
    /// Per-metric scores of judged checks (Connexity's rubric).
    pub rubric_scores: PathBuf,
    pub runs: PathBuf,
    /// The agents' OpenTelemetry spans (`spans #true`, `--otlp-receiver`).
    pub spans: PathBuf,
    pub html: PathBuf,
    pub junit: PathBuf,
    pub summary: PathBuf,
    /// The run's statistics (also in `summary.json`).
    pub stats: stats::RunStats,
    /// Journal lines that were not valid entries and were skipped (a crash mid-write
    /// leaves one truncated last line).
    pub skipped_lines: usize,
    /// Whether the journal ended with `run_finished`; `false` when the run crashed or was
    /// killed.
    pub complete: bool,
    /// Files that could not be written, with why; every other file is complete.
    pub not_written: Vec<(PathBuf, ReportError)>,
    /// Why `report.html` has no transcripts, when it has none because the journal could not
    /// be read back (see [`ReportWriter::journal_lost`]).
    pub transcripts_missing: Option<String>,
}

impl ReportFiles {
    /// Every results file, tables first, whether written or not.
    pub fn paths(&self) -> [&Path; 10] {
        [
            &self.trajectories,
            &self.turns,
            &self.tool_calls,
            &self.criteria,
            &self.rubric_scores,
            &self.runs,
            &self.spans,
            &self.html,
            &self.junit,
            &self.summary,
        ]
    }

    /// The files that were written, tables first.
    pub fn written(&self) -> impl Iterator<Item = &Path> {
        self.paths()
            .into_iter()
            .filter(|p| !self.not_written.iter().any(|(missing, _)| missing == p))
    }

    /// Whether `path` is one of the files that could not be written.
    pub fn is_missing(&self, path: &Path) -> bool {
        self.not_written.iter().any(|(missing, _)| missing == path)
    }
}

/// Reads `run_dir`'s journal and writes every results file into `run_dir`. Fails only
/// when the journal cannot be opened or read; a file that cannot be written is listed in
/// [`ReportFiles::not_written`].
pub fn write_reports(run_dir: &Path, options: &ReportOptions) -> Result<ReportFiles, ReportError> {
    write_reports_to(run_dir, run_dir, options)
}

/// As [`write_reports`], but writes the results files into `out_dir` (created if missing),
/// leaving the run directory as it is: `trellis report RUN --out DIR`.
pub fn write_reports_to(
    run_dir: &Path,
    out_dir: &Path,
    options: &ReportOptions,
) -> Result<ReportFiles, ReportError> {
    let journal_path = trellis_journal::path_in(run_dir);
    // A second run's records would be counted as this one's (duplicate trajectories,
    // totals of both): refused before any file is started. A run directory mistyped has no
    // journal: refused before the output directory is made (it would be the typo).
    let mut scan = JournalReader::open(&journal_path)?;
    std::fs::create_dir_all(out_dir).map_err(|e| ReportError::io("create", out_dir, e))?;
    let mut line_number = 0u64;
    while let Some(line) = scan.next_line()? {
        line_number += 1;
        if line_number > 1 && line.starts_with(br#"{"run_started":"#) {
            return Err(ReportError::SecondRun {
                path: journal_path,
                line: line_number,
            });
        }
    }
    drop(scan);
    let mut journal = JournalReader::open(&journal_path)?;
    let info = match journal.next_entry()? {
        Some(JournalEntry::RunStarted(info)) => info,
        _ => return Err(ReportError::MissingRunStarted { path: journal_path }),
    };
    let mut writer = ReportWriter::start(out_dir, &info, options)?;
    writer.journal_path.clone_from(&journal_path);
    // The copy's `run.json`: written before the tables, as a run writes its own first.
    let mut meta_not_written = None;
    if out_dir != run_dir && !history::same_dir(out_dir, run_dir) {
        writer.meta = history::RunMeta::read(run_dir).ok().flatten();
        if let Some(meta) = &writer.meta {
            meta_not_written = copy_meta(meta, out_dir).err();
        }
    }
    while let Some(entry) = journal.next_entry()? {
        writer.push(&entry);
    }
    writer.skipped_lines = journal.skipped();
    drop(journal);
    let mut files = writer.finish();
    files.not_written.extend(meta_not_written);
    // The gate's verdict `run --baseline` added to the run's `junit.xml`, added again to the
    // rebuilt one (`trellis report`, or a finished run resumed with --baseline).
    if !files.not_written.iter().any(|(p, _)| *p == files.junit)
        && let Some(baseline) = history::RunMeta::read(run_dir)
            .ok()
            .flatten()
            .and_then(|m| m.compared_with)
        && let Ok(text) = std::fs::read(run_dir.join(COMPARE_FILE))
        && let Ok(comparison) = serde_json::from_slice::<compare::Comparison>(&text)
    {
        if let Err(e) = add_gate_to_junit(out_dir, &baseline, &comparison) {
            files.not_written.push((files.junit.clone(), e));
        }
        if !files.not_written.iter().any(|(p, _)| *p == files.html)
            && let Err(e) = add_gate_to_report(out_dir, &baseline, &comparison)
        {
            files.not_written.push((files.html.clone(), e));
        }
        // The banner links the comparison: rebuilt elsewhere (`trellis report RUN --out
        // OTHER`), the page's link pointed at files left behind.
        if !history::same_dir(run_dir, out_dir) {
            for name in [COMPARE_FILE, COMPARE_HTML_FILE] {
                let from = run_dir.join(name);
                if from.is_file()
                    && let Err(e) = std::fs::copy(&from, out_dir.join(name))
                {
                    let to = out_dir.join(name);
                    files
                        .not_written
                        .push((to.clone(), ReportError::io("copy the comparison to", to, e)));
                }
            }
        }
    }
    Ok(files)
}

/// Writes `meta`, the `run.json` of the run whose reports are rebuilt into `out_dir`, there
/// too. Without it the copy was a run that did not say what it ran: every later run next
/// to it read its whole `summary.json` for a trend (22 MB for a 20,000-scenario run), and
/// the history took it for a second run ([`history::list_runs`] now lists one run id once).
/// The run's name and pin stay with the run's own directory: a copy is not the run people
/// named or pinned.
fn copy_meta(meta: &history::RunMeta, out_dir: &Path) -> Result<(), (PathBuf, ReportError)> {
    let copy = history::RunMeta {
        name: None,
        baseline: false,
        ..meta.clone()
    };
    copy.write(out_dir).map_err(|e| {
        let path = out_dir.join(history::RUN_META_FILE);
        (
            path.clone(),
            ReportError::io("write", path, std::io::Error::other(e)),
        )
    })
}

/// Builds every results file from journal entries as they arrive, so a run can report
/// while it executes instead of re-reading its journal afterwards. Tables are flushed in
/// bounded batches; only the HTML transcripts go back to the journal (for the few
/// trajectories rendered in full), so the journal must be complete on disk at [`finish`],
/// or declared lost with [`journal_lost`].
///
/// [`finish`]: ReportWriter::finish
/// [`journal_lost`]: ReportWriter::journal_lost
pub struct ReportWriter {
    run_dir: PathBuf,
    /// Where the transcripts are read back from: the run directory's journal.
    journal_path: PathBuf,
    /// The journal's own start record, shared (a dataset's instances make it megabytes).
    info: Arc<RunInfo>,
    /// `run.json` as it was when the writer started.
    meta: Option<history::RunMeta>,
    tables: Tables,
    tally: Tally,
    stats: stats::StatsBuilder,
    /// Per scenario, the tree of nodes and every repetition's outcome, for the report.
    outline: html::Outline,
    selection: Selection,
    junit: junit::JunitBuilder,
    finished: Option<RunSummary>,
    skipped_lines: usize,
    /// Trajectory names through each (suite, scenario, node): what makes a node a shared
    /// prefix. Bounded by the size of the suites, not by repetitions.
    paths: Paths,
    /// The first error writing `junit.xml`'s cases; the other files go on without it.
    junit_failed: Option<ReportError>,
    /// Why the journal on disk cannot be read back for transcripts.
    journal_lost: Option<String>,
    /// Earlier runs per scenario for the report's trends; `None` reads the run
    /// directories next to this one.
    trends: Option<Trends>,
    trend_runs: usize,
}

impl ReportWriter {
    /// Creates the table files in `run_dir` for the run `info` describes.
    pub fn start(
        run_dir: &Path,
        info: &Arc<RunInfo>,
        options: &ReportOptions,
    ) -> Result<Self, ReportError> {
        // The run's start is given here, not pushed: the statistics need it too (the
        // planned trajectories, the suites' order).
        let mut stats = stats::StatsBuilder::default();
        stats.start(info);
        let mut tables = Tables::create(run_dir, &info.run_id, options.batch_rows)?;
        tables.set_instances(&info.scenarios);
        Ok(ReportWriter {
            run_dir: run_dir.to_path_buf(),
            journal_path: trellis_journal::path_in(run_dir),
            info: Arc::clone(info),
            // Metadata is an addition to the tables: a damaged `run.json` must not stop them.
            meta: history::RunMeta::read(run_dir).ok().flatten(),
            tables,
            tally: Tally::default(),
            stats,
            outline: html::Outline::for_plan(info),
            selection: Selection::new(options),
            junit: junit::JunitBuilder::new(info, run_dir),
            finished: None,
            skipped_lines: 0,
            paths: Paths::for_plan(info),
            junit_failed: None,
            journal_lost: None,
            trends: None,
            trend_runs: options.trend_runs,
        })
    }

    /// Says that the journal on disk is incomplete or unreadable (it could not be written):
    /// [`finish`](ReportWriter::finish) then writes every file from what was pushed and
    /// renders `report.html` without transcripts, saying why, instead of reading the journal.
    pub fn journal_lost(&mut self, why: impl Into<String>) {
        self.journal_lost = Some(why.into());
    }

    /// The run's git state, for a run whose `run.json` was written without it and completed
    /// later: what the results record of the run (`runs.parquet`, summary.json, the page).
    pub fn set_git(&mut self, git: history::GitState) {
        if let Some(meta) = &mut self.meta {
            meta.git = Some(git);
        }
    }

    /// Gives the report's per-scenario trends instead of reading them from the run
    /// directories next to this one (a history that knows more about runs than their
    /// directories).
    pub fn set_trends(&mut self, trends: Trends) {
        self.trends = Some(trends);
    }

    /// Takes one entry. A file that cannot be written stops taking entries (its error is
    /// reported by [`finish`](ReportWriter::finish)); the other files go on.
    pub fn push(&mut self, entry: &JournalEntry) {
        self.stats.push(entry);
        match entry {
            // A second `run_started` can only come from concatenated journals; the first
            // one names the run.
            JournalEntry::RunStarted(_) | JournalEntry::Agent(_) => {}
            JournalEntry::Spans(batch) => self.tables.push_spans(batch),
            JournalEntry::Node(node) => {
                self.tally.add_node(node);
                self.junit.add_node(node);
                self.outline.add_node(node);
                self.tables.push_node(node);
            }
            JournalEntry::Trajectory(trajectory) => {
                self.tally.add_trajectory(trajectory);
                self.outline.add_trajectory(trajectory);
                self.tables.push_trajectory(trajectory);
                if self.junit_failed.is_none() {
                    self.junit_failed = self.junit.add(trajectory, &self.info).err();
                }
                self.selection.offer(trajectory);
                for node in &trajectory.nodes {
                    self.paths.add(
                        &trajectory.suite,
                        &trajectory.scenario,
                        node,
                        &trajectory.trajectory,
                    );
                }
            }
            JournalEntry::RunFinished(summary) => self.finished = Some(summary.clone()),
        }
    }

    /// The run is quiet (it waits on its agents; nothing came for a while): writes the
    /// tables' buffered rows where there are enough for a row group, and compiles the report
    /// page's templates if no run of this process has yet, work the end of the run then does
    /// not wait for. A run that is never quiet writes full batches as before.
    pub fn flush_quiet(&mut self) {
        self.tables.flush_quiet();
        html::prepare();
    }

    /// Writes the last table batches, `junit.xml` and `report.html`: each file that can be
    /// written is, and [`ReportFiles::not_written`] says which could not and why.
    pub fn finish(self) -> ReportFiles {
        let ReportWriter {
            run_dir,
            journal_path,
            info,
            meta,
            tables,
            mut tally,
            stats,
            outline,
            selection,
            junit,
            finished,
            skipped_lines,
            paths,
            junit_failed,
            journal_lost,
            trends,
            trend_runs,
        } = self;
        let totals = tally.total;
        let run_row = RunRow {
            info: &info,
            finished: finished.as_ref(),
            trajectories: totals.total(),
            passed: totals.passed,
            failed: totals.failed,
            errors: totals.errors,
            skipped: totals.skipped,
            invalid: totals.invalid,
            turns: tally.turns,
            meta: meta.as_ref(),
        };
        let junit_path = run_dir.join(JUNIT_FILE);
        let html_path = run_dir.join(HTML_FILE);
        let pages = Pages {
            run_dir: &run_dir,
            journal_path: &journal_path,
            info: &info,
            finished: finished.as_ref(),
            tally: &mut tally,
            outline: &outline,
            junit,
            junit_failed,
            selection,
            paths,
            journal_lost,
            trends,
            trend_runs,
            skipped_lines,
            provenance: provenance(meta.as_ref()),
            compared_with: meta.as_ref().and_then(|m| m.compared_with.clone()),
            watch_rerun: meta.as_ref().is_some_and(|m| m.watch_rerun.is_some()),
        };
        let summary_path = run_dir.join(SUMMARY_FILE);
        // The tables (polars' Parquet writer), summary.json, and the pages (JUnit, and the
        // HTML with its transcripts read back from the journal) share nothing but what they
        // read: at the end of a run, when the executor's thread is idle, they are written side
        // by side. This thread ends the tables and writes the summary; the other writes the
        // pages, then ends whatever tables are left (at 2,000 trajectories the tables are 5
        // ms, the pages 2). The summary grows with the scenarios (next to 20,000 of them the
        // statistics and summary.json are 130-200 ms, the pages 70-120 and the tables 15-20):
        // for a run that `is_large` it comes first here, and the tables go to whichever
        // thread is free first. Without a second thread, one after the other.
        let summary_first = is_large(info.scenarios.len());
        let tables = tables.finish(run_row);
        let mut pages = Some(pages);
        let (summary, summary_staged, pages_written) = std::thread::scope(|scope| {
            let spawned = std::thread::Builder::new()
                .name("trellis-report".into())
                // The page's outline recurses once per level of a scenario's tree; reserved,
                // not committed, like the stack of the thread this otherwise ran on.
                .stack_size(PAGES_STACK)
                .spawn_scoped(scope, || {
                    let written = pages.take().map(|p| p.write(&junit_path, &html_path));
                    tables.help();
                    written
                });
            if !summary_first {
                tables.help();
            }
            let mut summary = Summary {
                schema_version: history::SCHEMA_VERSION,
                meta: meta.clone(),
                stats: stats.finish(),
            };
            let summary_staged = write_summary_unpublished(&summary_path, &mut summary);
            tables.help();
            let pages_written = spawned.ok().and_then(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            });
            (summary, summary_staged, pages_written)
        });
        let (table_paths, mut not_written) = tables.finish();
        // Moved into place once every table is: a run directory whose summary reads has its
        // tables.
        if let Err(e) = summary_staged.and_then(staged::Staged::publish) {
            not_written.push((summary_path.clone(), e));
        }
        let (pages_not_written, transcripts_missing) = pages_written
            // No second thread could be started: the pages are written now.
            .or_else(|| pages.take().map(|p| p.write(&junit_path, &html_path)))
            .unwrap_or_default();
        let stats = summary.stats;
        not_written.extend(pages_not_written);
        if is_large(info.scenarios.len()) {
            dispose(Box::new((info, outline, tally)));
        }

        ReportFiles {
            trajectories: table_paths.trajectories,
            turns: table_paths.turns,
            tool_calls: table_paths.tool_calls,
            criteria: table_paths.criteria,
            rubric_scores: table_paths.rubric_scores,
            runs: table_paths.runs,
            spans: table_paths.spans,
            html: html_path,
            junit: junit_path,
            summary: summary_path,
            stats,
            skipped_lines,
            complete: finished.is_some(),
            not_written,
            transcripts_missing,
        }
    }
}

/// From this many scenarios, what the end of a run no longer needs is freed on a thread of
/// its own ([`dispose`]). Below it, freeing takes little time, and freed here it is memory
/// the console's summary then reuses: freed aside, a 2,000-trajectory run peaked 0.6 MiB
/// higher.
const DISPOSE_ASIDE_FROM: usize = 1_000;

/// Whether a run of `scenarios` scenarios frees what its end no longer needs aside
/// ([`dispose`]) rather than in place.
pub fn is_large(scenarios: usize) -> bool {
    scenarios >= DISPOSE_ASIDE_FROM
}

/// Frees what the end of a run no longer needs on a thread of its own: the run's start
/// record, the report's outline and the tally hold an entry per scenario, and freeing those
/// of 20,000 scenarios took 70 M instructions after every file was written; the statistics
/// the command kept for its summary (src/cli/run.rs) took 7-10 ms more before the process
/// exited. The process that exits next does not wait for it (the kernel takes the memory
/// back); `trellis watch` gets it back while it waits for the next save. Dropped here if no
/// thread can start. For runs that [`is_large`]: below, freeing takes little time, and
/// freed in place it is memory the next steps reuse.
pub fn dispose(what: Box<dyn std::any::Any + Send>) {
    let _ = std::thread::Builder::new()
        .name("trellis-free".into())
        .spawn(move || drop(what));
}

/// The stack of the thread writing the pages at the end of a run.
const PAGES_STACK: usize = 64 * 1024 * 1024;

/// What `junit.xml` and `report.html` are written from at the end of a run: everything
/// [`ReportWriter::finish`] does not also hand to the tables.
struct Pages<'a> {
    run_dir: &'a Path,
    journal_path: &'a Path,
    info: &'a RunInfo,
    finished: Option<&'a RunSummary>,
    /// Settled ([`Tally::settle`]) by the pages' thread, which alone reads its maps.
    tally: &'a mut Tally,
    outline: &'a html::Outline,
    junit: junit::JunitBuilder,
    junit_failed: Option<ReportError>,
    selection: Selection,
    paths: Paths,
    journal_lost: Option<String>,
    trends: Option<Trends>,
    trend_runs: usize,
    skipped_lines: usize,
    /// What the run is a part or a combination of, for the page to say.
    provenance: Option<String>,
    /// The run `run --baseline` compared this one with, for the page to link `compare.html`.
    compared_with: Option<String>,
    /// A `trellis watch` rerun ([`html::Page::watch_rerun`]).
    watch_rerun: bool,
}

/// What a shard run, or a run merged from shards, is (`run.json`), said on its page: a
/// shard's report reads like a whole run otherwise.
fn provenance(meta: Option<&history::RunMeta>) -> Option<String> {
    let meta = meta?;
    if let Some(rerun) = meta.watch_rerun {
        return Some(format!(
            "Rerun {rerun} of a trellis watch session: this report covers what the rerun reran \
             and shows only the turns that called the agent; the session's whole state, reused \
             turns included, is in latest/report.html beside this directory."
        ));
    }
    if let Some(shard) = &meta.shard {
        return Some(format!(
            "Shard {} of {} of a sharded run: this report covers only the scenarios the split \
             gave this shard. Merge the shards' directories (trellis merge) for the whole \
             run.",
            shard.index, shard.count
        ));
    }
    let merged = meta.merged.as_ref()?;
    Some(if merged.partial && merged.missing > 0 {
        format!(
            "Merged from {} of {} shards (trellis merge --allow-partial): {} planned \
             trajectory runs are missing.",
            merged.runs.len(),
            merged.shards,
            merged.missing
        )
    } else if merged.partial {
        format!(
            "Merged from {} of {} shards (trellis merge --allow-partial): some of their \
             records could not be read.",
            merged.runs.len(),
            merged.shards
        )
    } else {
        format!("Merged from {} shards (trellis merge).", merged.shards)
    })
}

impl Pages<'_> {
    /// Writes `junit.xml` and `report.html`; returns the files not written and why, and why
    /// the transcripts are missing from the HTML, if they are.
    fn write(
        self,
        junit_path: &Path,
        html_path: &Path,
    ) -> (Vec<(PathBuf, ReportError)>, Option<String>) {
        self.tally.settle();
        let mut not_written = Vec::new();
        let planned = self.info.planned_trajectories;
        let recorded = self.tally.total.total();
        let incomplete = match self.finished {
            None => Some(format!(
                "the run never reached its end: {recorded} of {planned} planned trajectories \
                 recorded (`trellis run --resume` finishes it)"
            )),
            Some(_) if recorded < planned => Some(format!(
                "the run was stopped before its work was done: {recorded} of {planned} \
                 planned trajectories recorded (`trellis run --resume` finishes it)"
            )),
            Some(f) if f.interrupted && recorded == planned => Some(format!(
                "the run was stopped before its work was done: all {planned} planned \
                 trajectories recorded, some of them cut short (a check not judged, calls \
                 not made); `trellis run --resume` finishes it"
            )),
            // Agents that fork record more than the plan: the count alone cannot say what
            // the stop cut off.
            Some(f) if f.interrupted => Some(format!(
                "the run was stopped before its work was done: {recorded} trajectories \
                 recorded, with those its agents forked beyond the {planned} planned; the \
                 ones it did not reach are missing (`trellis run --resume` finishes it)"
            )),
            Some(_) => None,
        };
        if let Err(e) = self
            .junit_failed
            .map_or_else(|| self.junit.write(junit_path, incomplete.as_deref()), Err)
        {
            not_written.push((junit_path.to_path_buf(), e));
        }

        let rendered = self.selection.into_ordered();
        let (nodes, transcripts_missing) = match self.journal_lost {
            Some(why) => (HashMap::new(), Some(why)),
            None => match gather_nodes(self.journal_path, &rendered, &self.paths) {
                Ok(nodes) => (nodes, None),
                // The tables and counts are still right; only the transcripts are missing.
                Err(e) => (
                    HashMap::new(),
                    Some(format!("the journal could not be read back: {e}")),
                ),
            },
        };
        let trends = match &self.trends {
            Some(trends) => html::TrendSource::Given(trends),
            None if self.trend_runs > 0 => html::TrendSource::Siblings {
                run_dir: self.run_dir,
                limit: self.trend_runs,
            },
            None => html::TrendSource::None,
        };
        // Written by `trellis variance` after the run; a file that does not read is left
        // out of the page rather than failing it.
        let variance = variance::read(self.run_dir).ok().flatten();
        if let Err(e) = html::write(
            html_path,
            &html::Page {
                info: self.info,
                finished: self.finished,
                tally: self.tally,
                outline: self.outline,
                trends,
                rendered: &rendered,
                nodes: &nodes,
                skipped_lines: self.skipped_lines,
                transcripts_missing: transcripts_missing.as_deref(),
                variance: variance.as_ref(),
                provenance: self.provenance.as_deref(),
                compared_with: self.compared_with.as_deref(),
                watch_rerun: self.watch_rerun,
            },
        ) {
            not_written.push((html_path.to_path_buf(), e));
        }
        (not_written, transcripts_missing)
    }
}

/// `value` as JSON text laid out as Trellis's JSON files are ([`json::RowsFormatter`]:
/// indented, each list element on one line), for a command's `--json` output.
pub fn to_json_string(value: &impl serde::Serialize) -> serde_json::Result<String> {
    let mut out = Vec::new();
    json::to_writer(&mut out, value)?;
    // The formatter writes only what serde_json escapes and the keys' and values' own text.
    String::from_utf8(out).map_err(|e| serde_json::Error::io(std::io::Error::other(e)))
}

/// Writes `value` as JSON (laid out by [`json::RowsFormatter`]) to `path.partial` and moves
/// it into place (`summary.json`, `compare.json`).
/// Adds the verdict of `run --baseline`'s comparison to the run's `junit.xml` as a suite
/// of its own, `trellis gate`, with one case that fails listing the regressions (replacing
/// one an earlier comparison of the run added). Failures the baseline shares stay
/// `<failure>`s: the file says what failed, the gate case whether the run regressed.
pub fn add_gate_to_junit(
    run_dir: &Path,
    baseline: &str,
    comparison: &compare::Comparison,
) -> Result<(), ReportError> {
    junit::add_gate(
        &run_dir.join(JUNIT_FILE),
        baseline,
        &comparison.regressions,
        comparison.taken_out.as_deref(),
    )
}

/// Adds the verdict of `run --baseline`'s comparison to the run's `report.html`: the banner
/// that said a comparison follows now says whether the run passed the gate, with the first
/// regressions (`compare.html` has them all).
pub fn add_gate_to_report(
    run_dir: &Path,
    baseline: &str,
    comparison: &compare::Comparison,
) -> Result<(), ReportError> {
    html::add_gate(
        &run_dir.join(HTML_FILE),
        baseline,
        comparison.regressed,
        &comparison.regressions,
    )
}

pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), ReportError> {
    write_json_unpublished(path, value)?.publish().map(drop)
}

/// Writes `value` as JSON to `path.partial`, to be moved into place.
fn write_json_unpublished(
    path: &Path,
    value: &impl serde::Serialize,
) -> Result<staged::Staged, ReportError> {
    write_unpublished(path, |out| {
        json::to_writer(out, value).map_err(std::io::Error::from)
    })
}

/// Writes a JSON document to `path.partial` with `write`, then its last newline, to be
/// moved into place.
fn write_unpublished(
    path: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> Result<staged::Staged, ReportError> {
    use std::io::Write as _;
    let (staged, file) = staged::Staged::create(path)?;
    let mut out = std::io::BufWriter::new(file);
    write(&mut out)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .map_err(|e| ReportError::io("write", path, e))?;
    Ok(staged)
}

/// From this many rows in its lists, summary.json's rows are rendered on two threads.
const SUMMARY_ROWS_APART_FROM: usize = 2_000;

/// Writes `summary` as [`write_json_unpublished`] does, byte for byte; the rows of a large
/// one's lists are rendered on two threads ([`json::to_writer_with_rows`]). The lists are
/// lent out while it is written and put back.
fn write_summary_unpublished(
    path: &Path,
    summary: &mut Summary,
) -> Result<staged::Staged, ReportError> {
    let stats = &mut summary.stats;
    let rows =
        stats.scenarios.len() + stats.branches.len() + stats.nodes.len() + stats.criteria.len();
    if rows < SUMMARY_ROWS_APART_FROM {
        return write_json_unpublished(path, summary);
    }
    let scenarios = std::mem::take(&mut stats.scenarios);
    let branches = std::mem::take(&mut stats.branches);
    let nodes = std::mem::take(&mut stats.nodes);
    let criteria = std::mem::take(&mut stats.criteria);
    let written = write_unpublished(path, |out| {
        // The lists are `RunStats`' last fields and `stats` is the summary's last.
        json::to_writer_with_rows(
            out,
            &*summary,
            &[
                ("scenarios", &scenarios),
                ("branches", &branches),
                ("nodes", &nodes),
                ("criteria", &criteria),
            ],
        )
    });
    let stats = &mut summary.stats;
    stats.scenarios = scenarios;
    stats.branches = branches;
    stats.nodes = nodes;
    stats.criteria = criteria;
    written
}

/// Identifies one execution node of one repetition.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Deserialize)]
pub(crate) struct NodeKey {
    suite: String,
    scenario: String,
    agent: String,
    repetition: u32,
    node: String,
}

impl NodeKey {
    pub(crate) fn of(trajectory: &TrajectoryRecord, node: &str) -> Self {
        NodeKey {
            suite: trajectory.suite.clone(),
            scenario: trajectory.scenario.clone(),
            agent: trajectory.agent.clone(),
            repetition: trajectory.repetition,
            node: node.to_owned(),
        }
    }
}

/// A journal line with only what [`gather_nodes`] looks at.
#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum KeysOnly {
    Node(NodeKey),
}

/// A node needed by a rendered transcript.
#[derive(Default)]
pub(crate) struct NodeSlot {
    pub(crate) record: Option<NodeRecord>,
    /// How many trajectories in the whole journal go through this node: more than one
    /// means it is a shared prefix.
    pub(crate) trajectories: u32,
}

/// The trajectory names through each (suite, scenario, node): what makes a node a shared
/// prefix. Bounded by the size of the suites, not by repetitions.
struct Paths {
    /// Keyed by [`Paths::key`], built in `scratch`: a trajectory's lookups then allocate
    /// nothing once its names are known (three keys cloned and hashed per node before).
    names: HashMap<String, HashSet<String, foldhash::fast::FixedState>, foldhash::fast::FixedState>,
    scratch: String,
}

impl Paths {
    /// Paths with room for `info`'s planned nodes (its trajectories' leaves, at least).
    fn for_plan(info: &RunInfo) -> Self {
        let nodes = info.scenarios.iter().map(|s| s.trajectories.len()).sum();
        Paths {
            names: HashMap::with_capacity_and_hasher(nodes, foldhash::fast::FixedState::default()),
            scratch: String::new(),
        }
    }

    /// The three names, each but the last after its length, so that no two triples share
    /// a key whatever their names hold.
    /// Written piece by piece: through `write!` it was about 800 instructions a call,
    /// three calls a trajectory, 5% of the recorder's thread.
    fn key(out: &mut String, suite: &str, scenario: &str, node: &str) {
        out.clear();
        for (len, name) in [(suite.len(), suite), (scenario.len(), scenario)] {
            push_decimal(out, len);
            out.push(':');
            out.push_str(name);
        }
        out.push_str(node);
    }

    fn add(&mut self, suite: &str, scenario: &str, node: &str, trajectory: &str) {
        Self::key(&mut self.scratch, suite, scenario, node);
        match self.names.get_mut(self.scratch.as_str()) {
            Some(names) => {
                if !names.contains(trajectory) {
                    names.insert(trajectory.to_owned());
                }
            }
            None => {
                let names = HashSet::from_iter([trajectory.to_owned()]);
                self.names.insert(self.scratch.clone(), names);
            }
        }
    }

    /// How many trajectories go through the node.
    fn sharing(&self, suite: &str, scenario: &str, node: &str) -> u32 {
        let mut key = String::new();
        Self::key(&mut key, suite, scenario, node);
        self.names
            .get(&key)
            .map_or(0, |names| u32::try_from(names.len()).unwrap_or(u32::MAX))
    }
}

/// Appends `n` in decimal digits, as `write!(out, "{n}")` would, without the formatting
/// machinery (about 800 instructions a call on the recorder's thread).
pub(crate) fn push_decimal(out: &mut String, n: usize) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Second pass over the journal: the node records of the trajectories the HTML renders,
/// and only those, so memory stays bounded by the rendering caps. Only node lines are
/// decoded, and only their keys unless a rendered transcript needs them. The rendered
/// trajectories are mostly the journal's first ones: once every node is found and the
/// last rendered trajectory's own entry is passed, the rest of the journal is not read
/// (at the end of a 20,000-trajectory run it was all read and decoded, about as much work
/// as rendering the page).
fn gather_nodes(
    journal_path: &Path,
    rendered: &Rendered,
    paths: &Paths,
) -> Result<HashMap<NodeKey, NodeSlot>, ReportError> {
    let mut nodes: HashMap<NodeKey, NodeSlot> = rendered
        .trajectories
        .iter()
        .flat_map(|t| t.nodes.iter().map(move |n| (t, n)))
        .map(|(t, n)| {
            let sharing = paths.sharing(&t.suite, &t.scenario, n);
            (
                NodeKey::of(t, n),
                NodeSlot {
                    record: None,
                    trajectories: sharing,
                },
            )
        })
        .collect();
    if nodes.is_empty() {
        return Ok(nodes);
    }
    let mut missing = nodes.len();
    let mut trajectories_passed = 0u64;
    let mut journal = JournalReader::open(journal_path)?;
    while let Some(line) = journal.next_line()? {
        if line.starts_with(br#"{"trajectory":"#) {
            trajectories_passed += 1;
            // A node recorded again later (journals put end to end) is not the one these
            // trajectories went through: stop only past the last of them.
            if missing == 0 && trajectories_passed >= rendered.through {
                break;
            }
            continue;
        }
        if !line.starts_with(br#"{"node":"#) {
            continue;
        }
        let Ok(KeysOnly::Node(key)) = serde_json::from_slice::<KeysOnly>(line) else {
            continue;
        };
        if let Some(slot) = nodes.get_mut(&key)
            && let Ok(JournalEntry::Node(mut record)) = trellis_journal::parse_line(line)
        {
            if slot.record.is_none() {
                missing -= 1;
            }
            html::keep_for_page(&mut record);
            slot.record = Some(record);
        }
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node's key names its suite and scenario after their lengths, so that no two
    /// (suite, scenario, node) triples share one, whatever their names hold.
    #[test]
    fn node_keys_are_lengths_and_names_and_never_shared() {
        let mut key = String::new();
        Paths::key(&mut key, "booking", "s1", "start");
        assert_eq!(key, "7:booking2:s1start");
        Paths::key(&mut key, "", "", "");
        assert_eq!(key, "0:0:");
        let long = "x".repeat(1_234_567);
        Paths::key(&mut key, &long, "é", "n");
        assert_eq!(key, format!("1234567:{long}2:én"));
        let triples = [
            ("a1:b", "c", "d"),
            ("a", "1:bc", "d"),
            ("a", "b", "c1:d"),
            ("a1:b1:c", "", "d"),
            ("10:", "x", ""),
        ];
        let keys: std::collections::HashSet<String> = triples
            .iter()
            .map(|(suite, scenario, node)| {
                let mut key = String::new();
                Paths::key(&mut key, suite, scenario, node);
                key
            })
            .collect();
        assert_eq!(keys.len(), triples.len());
        let mut paths = Paths::for_plan(&RunInfo::default());
        paths.add("s", "c", "n", "main");
        paths.add("s", "c", "n", "other");
        paths.add("s", "c", "n", "main");
        assert_eq!(paths.sharing("s", "c", "n"), 2);
        assert_eq!(paths.sharing("s", "cn", ""), 0);
        for n in [
            0,
            7,
            9,
            10,
            99,
            100,
            1_000_001,
            u32::MAX as usize,
            usize::MAX,
        ] {
            let mut out = String::from("#");
            push_decimal(&mut out, n);
            assert_eq!(out, format!("#{n}"));
        }
    }

    /// A summary of many rows (their lists rendered on two threads) is written byte for
    /// byte as the whole document through one formatter, whatever the lists' sizes (one
    /// empty, one split between the threads, the threshold itself), with escaped and
    /// non-ASCII names, and its lists are put back.
    #[test]
    fn a_summary_rendered_on_two_threads_is_the_one_written_whole() {
        let row = |template: serde_json::Value, i: usize| {
            let mut row = template;
            let name = match i % 4 {
                0 => format!("s{i}"),
                1 => format!("quote \" and \\ {i}"),
                2 => format!("é 𝄞 \n\t{i}"),
                _ => format!("\"criteria\": [] {i}"),
            };
            row["scenario"] = name.into();
            if row.get("latency").is_some() {
                row["latency"]["p50_ms"] = (i as f64 / 7.0).into();
            }
            row
        };
        let scenario = serde_json::json!({"suite":"s","scenario":"","agent":"a","counts":{"trajectories":1,"passed":1,"failed":0,"errors":0,"skipped":0,"invalid":0},"repeats":{"samples":1,"passed":1,"skipped":0,"pass_rate":1.0,"interval":{"low":0.2,"high":1.0},"at_k":[{"k":1,"pass_at_k":1.0,"pass_hat_k":1.0}],"flaky":false},"latency":{"turns":1,"p50_ms":1.5,"p95_ms":2.5,"max_ms":3.0,"mean_ms":1.75}});
        let branch = serde_json::json!({"suite":"s","scenario":"","trajectory":"main","agent":"a","repeats":{"samples":1,"passed":1,"skipped":0,"pass_rate":1.0,"interval":{"low":0.2,"high":1.0},"at_k":[],"flaky":false},"outcome_runs":[[0,0,"passed"]],"mean_duration_ms":2.25});
        let node = serde_json::json!({"suite":"s","scenario":"","agent":"a","node":"start","parent":null,"reached":1,"passed":1,"failed_here":0,"failed_above":0,"executions":1,"executions_failed_here":0});
        let criterion = serde_json::json!({"suite":"s","scenario":"","trajectory":"main","agent":"a","turn_index":null,"criterion":"no-error","kind":"no-error","passed":1,"failed":0,"skipped":0,"first_failure":null});
        let dir = tempfile::tempdir().unwrap();
        for (scenarios, branches, nodes, criteria) in [
            (10, 0, 3, 2),
            (1_000, 0, 600, 400),
            (1_999, 1, 0, 0),
            (0, 0, 0, 2_500),
            (3, 2_001, 5, 1),
        ] {
            let list = |template: &serde_json::Value, n: usize| -> Vec<serde_json::Value> {
                (0..n).map(|i| row(template.clone(), i)).collect()
            };
            let mut summary = Summary {
                schema_version: history::SCHEMA_VERSION,
                meta: Some(history::RunMeta {
                    run_id: "r".into(),
                    labels: [("nodes".to_owned(), "[]".to_owned())].into(),
                    ..history::RunMeta::default()
                }),
                stats: stats::RunStats {
                    run_id: "r".into(),
                    started_at: "2026-12-04T00:00:00Z".into(),
                    suites: vec!["s".into(), "é".into()],
                    strict: false,
                    aggregates: Default::default(),
                    scenarios: serde_json::from_value(list(&scenario, scenarios).into()).unwrap(),
                    branches: serde_json::from_value(list(&branch, branches).into()).unwrap(),
                    nodes: serde_json::from_value(list(&node, nodes).into()).unwrap(),
                    criteria: serde_json::from_value(list(&criterion, criteria).into()).unwrap(),
                },
            };
            let before = summary.clone();
            let whole = dir.path().join("whole.json");
            let apart = dir.path().join("apart.json");
            write_json_unpublished(&whole, &summary)
                .unwrap()
                .publish()
                .unwrap();
            write_summary_unpublished(&apart, &mut summary)
                .unwrap()
                .publish()
                .unwrap();
            let (whole, apart) = (
                std::fs::read_to_string(&whole).unwrap(),
                std::fs::read_to_string(&apart).unwrap(),
            );
            assert!(
                whole == apart,
                "{scenarios}/{branches}/{nodes}/{criteria} rows: the files differ at byte {}",
                whole
                    .bytes()
                    .zip(apart.bytes())
                    .take_while(|(a, b)| a == b)
                    .count()
            );
            assert_eq!(summary.stats, before.stats);
        }
    }
}
