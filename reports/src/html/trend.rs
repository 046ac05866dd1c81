//! Each scenario's pass rate over recent runs, for the sparkline in its section.
//!
//! [`ScenarioTrend`] is what the page draws; [`trends_from_sibling_runs`] is one simple way
//! to fill it (the run directories next to this one, read from their `summary.json`). A
//! history module that knows named runs and baselines can fill it instead.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::tables::RUNS_FILE;

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
/// `started_at`, per scenario. A directory that is not a complete run (no readable
/// `summary.json`) is passed over: a trend is a convenience, never a reason to fail.
///
/// Each sibling's `summary.json` is read, not its Parquet tables: the end of every run
/// reads this, and a runs directory only grows (the trajectories table of one 20,000-case
/// run took longer to read than the rest of a small run's reports).
pub(crate) fn trends_from_sibling_runs(
    run_dir: &Path,
    run_id: &str,
    started_at: &str,
    limit: usize,
) -> Trends {
    let Some(parent) = run_dir.parent().filter(|_| limit > 0) else {
        return Trends::new();
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Trends::new();
    };
    // The `limit` latest earlier runs, by (started_at, run_id).
    let mut latest: BTreeMap<(String, String), Vec<ScenarioRow>> = BTreeMap::new();
    for dir in entries.filter_map(Result::ok).map(|e| e.path()) {
        // A watch rerun, watch's `latest` mirror or one shard of a run is not a whole run:
        // its pass counts would draw a scenario's trend from part of the suite.
        if dir.file_name() == Some(std::ffi::OsStr::new(crate::history::WATCH_LATEST))
            || !dir.join(RUNS_FILE).is_file()
            || crate::history::is_part_of_run(&dir)
        {
            continue;
        }
        let Some(summary) = read_summary(&dir.join(crate::SUMMARY_FILE)) else {
            continue;
        };
        let TrendStats {
            run_id: id,
            started_at: started,
            scenarios,
        } = summary.stats;
        if id == run_id || (started.as_str(), id.as_str()) >= (started_at, run_id) {
            continue;
        }
        latest.insert((started, id), scenarios);
        if latest.len() > limit {
            latest.pop_first();
        }
    }
    let mut trends = Trends::new();
    for ((started, id), scenarios) in latest {
        let mut counts: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        for row in scenarios {
            let slot = counts.entry((row.suite, row.scenario)).or_default();
            slot.0 += row.counts.passed;
            slot.1 += row.counts.trajectories.saturating_sub(row.counts.skipped);
        }
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

/// What a trend needs of a `summary.json` (the rest of the file is skipped unread).
#[derive(Deserialize)]
struct TrendSummary {
    stats: TrendStats,
}

#[derive(Deserialize)]
struct TrendStats {
    run_id: String,
    started_at: String,
    scenarios: Vec<ScenarioRow>,
}

/// One scenario × agent of a summary.
#[derive(Deserialize)]
struct ScenarioRow {
    suite: String,
    scenario: String,
    counts: RowCounts,
}

#[derive(Deserialize)]
struct RowCounts {
    trajectories: u64,
    passed: u64,
    skipped: u64,
}

fn read_summary(path: &Path) -> Option<TrendSummary> {
    let text = std::fs::read(path).ok()?;
    serde_json::from_slice(&text).ok()
}
