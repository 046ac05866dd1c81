//! Each scenario's pass rate over recent runs, for the sparkline in its section.
//!
//! [`ScenarioTrend`] is what the page draws; [`trends_from_sibling_runs`] is one simple way
//! to fill it (the run directories next to this one, read from their Parquet tables). A
//! history module that knows named runs and baselines can fill it instead.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use polars::prelude::*;

use crate::tables::{RUNS_FILE, TRAJECTORIES_FILE};

/// One run's result for one scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrendPoint {
    pub run_id: String,
    /// RFC 3339, UTC; points are drawn in this order.
    pub started_at: String,
    pub passed: u64,
    /// Trajectories that ran (skipped ones are left out, as in every pass rate).
    pub ran: u64,
}

/// A scenario's results over earlier runs, oldest first (the current run is added by the
/// page itself).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScenarioTrend {
    pub points: Vec<TrendPoint>,
}

/// Trends by (suite, scenario).
pub type Trends = BTreeMap<(String, String), ScenarioTrend>;

/// The `limit` most recent runs in the directories next to `run_dir` that started before
/// `started_at`, per scenario. A directory that is not a complete run (no tables, or
/// unreadable ones) is passed over: a trend is a convenience, never a reason to fail.
pub(crate) fn trends_from_sibling_runs(
    run_dir: &Path,
    run_id: &str,
    started_at: &str,
    limit: usize,
) -> Trends {
    let Some(parent) = run_dir.parent() else {
        return Trends::new();
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Trends::new();
    };
    let mut runs: Vec<(String, String, std::path::PathBuf)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|dir| dir.join(RUNS_FILE).is_file() && dir.join(TRAJECTORIES_FILE).is_file())
        // A watch rerun, watch's `latest` mirror or one shard of a run is not a whole run:
        // its pass counts would draw a scenario's trend from part of the suite.
        .filter(|dir| {
            !crate::history::is_part_of_run(dir)
                && dir.file_name() != Some(std::ffi::OsStr::new(crate::history::WATCH_LATEST))
        })
        .filter_map(|dir| {
            let (id, started) = run_row(&dir.join(RUNS_FILE))?;
            (id != run_id && (started.as_str(), id.as_str()) < (started_at, run_id))
                .then_some((started, id, dir))
        })
        .collect();
    runs.sort();
    let skip = runs.len().saturating_sub(limit);
    let mut trends = Trends::new();
    for (started, id, dir) in runs.into_iter().skip(skip) {
        let Some(counts) = scenario_counts(&dir.join(TRAJECTORIES_FILE)) else {
            continue;
        };
        for (key, (passed, ran)) in counts {
            trends.entry(key).or_default().points.push(TrendPoint {
                run_id: id.clone(),
                started_at: started.clone(),
                passed,
                ran,
            });
        }
    }
    trends
}

fn read(path: &Path, columns: &[&str]) -> Option<DataFrame> {
    let file = File::open(path).ok()?;
    ParquetReader::new(file)
        .with_columns(Some(columns.iter().map(|c| (*c).to_owned()).collect()))
        .finish()
        .ok()
}

/// `(run_id, started_at)` of a run's `runs.parquet`.
fn run_row(path: &Path) -> Option<(String, String)> {
    let df = read(path, &["run_id", "started_at"])?;
    let id = df.column("run_id").ok()?.str().ok()?.get(0)?.to_owned();
    let started = df.column("started_at").ok()?.str().ok()?.get(0)?.to_owned();
    Some((id, started))
}

/// Passed and ran per (suite, scenario) of a run's `trajectories.parquet`.
fn scenario_counts(path: &Path) -> Option<BTreeMap<(String, String), (u64, u64)>> {
    let df = read(path, &["suite", "scenario", "status"])?;
    let suites = df.column("suite").ok()?.str().ok()?;
    let scenarios = df.column("scenario").ok()?.str().ok()?;
    let statuses = df.column("status").ok()?.str().ok()?;
    let mut counts: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for ((suite, scenario), status) in suites.iter().zip(scenarios.iter()).zip(statuses.iter()) {
        let (Some(suite), Some(scenario), Some(status)) = (suite, scenario, status) else {
            continue;
        };
        let slot = counts
            .entry((suite.to_owned(), scenario.to_owned()))
            .or_default();
        match status {
            "passed" => {
                slot.0 += 1;
                slot.1 += 1;
            }
            "skipped" => {}
            _ => slot.1 += 1,
        }
    }
    Some(counts)
}
