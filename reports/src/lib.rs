//! Trellis results: turns a run journal into files people and tools read.
//!
//! [`write_reports`] streams `journal.jsonl` from a run directory and writes, next to it,
//! five zstd-compressed Parquet tables (`trajectories`, `turns`, `tool_calls`, `criteria`,
//! `runs`), a self-contained `report.html` and a `junit.xml`. The journal is read line by
//! line and the tables are flushed in bounded batches, so memory does not grow with the run;
//! a journal cut short by a crash (no `run_finished`, a truncated last line) still yields
//! every table. The layout of every file is documented in `docs/results.md`.

mod error;
mod html;
mod journal;
mod junit;
mod tables;
mod tally;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use trellis_engine::record::{JournalEntry, NodeRecord, RunSummary, TrajectoryRecord};

pub use error::ReportError;

use crate::journal::JournalReader;
use crate::tables::{RunRow, Tables};
use crate::tally::{Selection, Tally};

/// The journal the engine writes into the run directory.
pub const JOURNAL_FILE: &str = "journal.jsonl";
/// The HTML report written into the run directory.
pub const HTML_FILE: &str = "report.html";
/// The JUnit report written into the run directory.
pub const JUNIT_FILE: &str = "junit.xml";

/// How much of the run `report.html` renders in full.
#[derive(Clone, Debug)]
pub struct ReportOptions {
    /// Full transcripts rendered for trajectories that errored, failed or were skipped;
    /// the rest are counted and pointed to `turns.parquet`.
    pub max_failing_transcripts: usize,
    /// Full transcripts rendered for passed trajectories.
    pub max_passing_transcripts: usize,
    /// Rows buffered per Parquet table before they are written as a row group.
    pub batch_rows: usize,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            max_failing_transcripts: 500,
            max_passing_transcripts: 200,
            batch_rows: 64 * 1024,
        }
    }
}

/// What [`write_reports`] wrote.
#[derive(Clone, Debug)]
pub struct ReportFiles {
    pub trajectories: PathBuf,
    pub turns: PathBuf,
    pub tool_calls: PathBuf,
    pub criteria: PathBuf,
    pub runs: PathBuf,
    pub html: PathBuf,
    pub junit: PathBuf,
    /// Journal lines that were not valid entries and were skipped (a crash mid-write
    /// leaves one truncated last line).
    pub skipped_lines: usize,
    /// Whether the journal ended with `run_finished`; `false` when the run crashed or was
    /// killed.
    pub complete: bool,
}

impl ReportFiles {
    /// Every file written, tables first.
    pub fn paths(&self) -> [&Path; 7] {
        [
            &self.trajectories,
            &self.turns,
            &self.tool_calls,
            &self.criteria,
            &self.runs,
            &self.html,
            &self.junit,
        ]
    }
}

/// Reads `run_dir/journal.jsonl` and writes every results file into `run_dir`.
pub fn write_reports(run_dir: &Path, options: &ReportOptions) -> Result<ReportFiles, ReportError> {
    let journal_path = run_dir.join(JOURNAL_FILE);
    let mut journal = JournalReader::open(&journal_path)?;
    let info = match journal.next_entry()? {
        Some(JournalEntry::RunStarted(info)) => info,
        _ => return Err(ReportError::MissingRunStarted { path: journal_path }),
    };

    let mut tables = Tables::create(run_dir, &info.run_id, options.batch_rows)?;
    let mut tally = Tally::default();
    let mut selection = Selection::new(options);
    let mut junit = junit::JunitBuilder::new(&info);
    let mut finished: Option<RunSummary> = None;

    while let Some(entry) = journal.next_entry()? {
        match entry {
            // A second `run_started` can only come from concatenated journals; the first
            // one names the run.
            JournalEntry::RunStarted(_) => {}
            JournalEntry::Node(node) => {
                tally.add_node(&node);
                tables.push_node(&node)?;
            }
            JournalEntry::Trajectory(trajectory) => {
                tally.add_trajectory(&trajectory);
                tables.push_trajectory(&trajectory)?;
                junit.add(&trajectory);
                selection.offer(trajectory);
            }
            JournalEntry::RunFinished(summary) => finished = Some(summary),
        }
    }
    let skipped_lines = journal.skipped;
    drop(journal);

    let totals = tally.total;
    let table_paths = tables.finish(RunRow {
        info: &info,
        finished: finished.as_ref(),
        trajectories: totals.total(),
        passed: totals.passed,
        failed: totals.failed,
        errors: totals.errors,
        skipped: totals.skipped,
        turns: tally.turns,
    })?;

    let junit_path = run_dir.join(JUNIT_FILE);
    junit.write(&junit_path)?;

    let rendered = selection.into_ordered();
    let nodes = gather_nodes(&journal_path, &rendered.trajectories)?;
    let html_path = run_dir.join(HTML_FILE);
    html::write(
        &html_path,
        &html::Page {
            info: &info,
            finished: finished.as_ref(),
            tally: &tally,
            rendered: &rendered,
            nodes: &nodes,
            skipped_lines,
        },
    )?;

    Ok(ReportFiles {
        trajectories: table_paths.trajectories,
        turns: table_paths.turns,
        tool_calls: table_paths.tool_calls,
        criteria: table_paths.criteria,
        runs: table_paths.runs,
        html: html_path,
        junit: junit_path,
        skipped_lines,
        complete: finished.is_some(),
    })
}

/// Identifies one execution node of one repetition.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
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

    fn of_record(record: &NodeRecord) -> Self {
        NodeKey {
            suite: record.suite.clone(),
            scenario: record.scenario.clone(),
            agent: record.agent.clone(),
            repetition: record.repetition,
            node: record.node.clone(),
        }
    }
}

/// A node needed by a rendered transcript.
#[derive(Default)]
pub(crate) struct NodeSlot {
    pub(crate) record: Option<NodeRecord>,
    /// How many trajectories in the whole journal go through this node: more than one
    /// means it is a shared prefix.
    pub(crate) trajectories: u32,
}

/// Second pass over the journal: the node records of the trajectories the HTML renders,
/// and only those, so memory stays bounded by the rendering caps.
fn gather_nodes(
    journal_path: &Path,
    rendered: &[TrajectoryRecord],
) -> Result<HashMap<NodeKey, NodeSlot>, ReportError> {
    let mut nodes: HashMap<NodeKey, NodeSlot> = rendered
        .iter()
        .flat_map(|t| t.nodes.iter().map(|n| NodeKey::of(t, n)))
        .map(|key| (key, NodeSlot::default()))
        .collect();
    if nodes.is_empty() {
        return Ok(nodes);
    }
    let mut journal = JournalReader::open(journal_path)?;
    while let Some(entry) = journal.next_entry()? {
        match entry {
            JournalEntry::Node(record) => {
                if let Some(slot) = nodes.get_mut(&NodeKey::of_record(&record)) {
                    slot.record = Some(record);
                }
            }
            JournalEntry::Trajectory(trajectory) => {
                for node in &trajectory.nodes {
                    if let Some(slot) = nodes.get_mut(&NodeKey::of(&trajectory, node)) {
                        slot.trajectories = slot.trajectories.saturating_add(1);
                    }
                }
            }
            JournalEntry::RunStarted(_) | JournalEntry::RunFinished(_) => {}
        }
    }
    Ok(nodes)
}
