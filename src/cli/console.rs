//! The console reporter: a progress bar on a terminal, one line per finished trajectory
//! otherwise, and a summary table at the end. It reads the same event stream the journal
//! stores.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;

use comfy_table::{Cell, ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use indicatif::{ProgressBar, ProgressStyle};
use trellis_engine::event::Event;
use trellis_engine::record::{CriterionStatus, RunSummary, TrajectoryRecord, TrajectoryStatus};

/// Failures printed in full at the end; the rest are in the report.
const FAILURES_SHOWN: usize = 10;

#[derive(Default)]
struct Counts {
    passed: u64,
    failed: u64,
    errors: u64,
    skipped: u64,
}

pub struct Console {
    bar: Option<ProgressBar>,
    /// Print a line per trajectory (stderr is not a terminal).
    lines: bool,
    /// Print nothing at all (benchmarks).
    silent: bool,
    per_scenario: BTreeMap<(String, String, String), Counts>,
    failures: Vec<TrajectoryRecord>,
    failures_total: u64,
    /// Distinct skip reasons with how many trajectories each skipped.
    skip_reasons: BTreeMap<String, u64>,
}

impl Console {
    pub fn new(total: u64, quiet: bool, silent: bool) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let bar = (terminal && !quiet && !silent).then(|| {
            let bar = ProgressBar::new(total);
            if let Ok(style) = ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} trajectories {msg}",
            ) {
                bar.set_style(style);
            }
            bar
        });
        Console {
            bar,
            lines: !terminal && !quiet && !silent,
            silent,
            per_scenario: BTreeMap::new(),
            failures: Vec::new(),
            failures_total: 0,
            skip_reasons: BTreeMap::new(),
        }
    }

    pub fn on_event(&mut self, event: &Event) {
        let Event::Trajectory(t) = event else {
            return;
        };
        let counts = self
            .per_scenario
            .entry((t.suite.clone(), t.scenario.clone(), t.agent.clone()))
            .or_default();
        match t.status {
            TrajectoryStatus::Passed => counts.passed += 1,
            TrajectoryStatus::Failed => counts.failed += 1,
            TrajectoryStatus::Error => counts.errors += 1,
            TrajectoryStatus::Skipped => {
                counts.skipped += 1;
                // Reasons repeat per repetition and agent; a handful of distinct ones is all
                // a console needs, so stop collecting new ones past a few.
                let reason = t.skip_reason.as_deref().unwrap_or("no reason given");
                if let Some(n) = self.skip_reasons.get_mut(reason) {
                    *n += 1;
                } else if self.skip_reasons.len() < 8 {
                    self.skip_reasons.insert(reason.to_string(), 1);
                }
            }
        }
        if matches!(t.status, TrajectoryStatus::Failed | TrajectoryStatus::Error) {
            self.failures_total += 1;
            if self.failures.len() < FAILURES_SHOWN {
                self.failures.push(t.clone());
            }
        }
        if let Some(bar) = &self.bar {
            bar.inc(1);
            if self.failures_total > 0 {
                bar.set_message(format!("({} not passing)", self.failures_total));
            }
        } else if self.lines {
            eprintln!(
                "{:>7} {}/{} {} [{} #{}] {} turn(s) {:.0}ms",
                status_word(t.status),
                t.suite,
                t.scenario,
                t.trajectory,
                t.agent,
                t.repetition,
                t.turns,
                t.duration_ms
            );
        }
    }

    pub fn finish(
        &self,
        summary: Option<&RunSummary>,
        out: &Path,
        journal: &Path,
        files: &trellis_reports::ReportFiles,
    ) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if self.silent {
            return;
        }
        let mut table = Table::new();
        table
            .load_preset(UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_header(vec![
                "suite",
                "scenario",
                "agent",
                "passed",
                "failed",
                "error",
                "skipped",
                "pass rate",
            ]);
        for ((suite, scenario, agent), c) in &self.per_scenario {
            let ran = c.passed + c.failed + c.errors;
            let rate = if ran == 0 {
                "-".to_string()
            } else {
                format!("{:.0}%", 100.0 * c.passed as f64 / ran as f64)
            };
            table.add_row(vec![
                Cell::new(suite),
                Cell::new(scenario),
                Cell::new(agent),
                Cell::new(c.passed),
                Cell::new(c.failed),
                Cell::new(c.errors),
                Cell::new(c.skipped),
                Cell::new(rate),
            ]);
        }
        println!("{table}");

        let mut failures: Vec<&TrajectoryRecord> = self.failures.iter().collect();
        failures.sort_by(|a, b| {
            (&a.suite, &a.scenario, &a.trajectory, &a.agent, a.repetition).cmp(&(
                &b.suite,
                &b.scenario,
                &b.trajectory,
                &b.agent,
                b.repetition,
            ))
        });
        for t in failures {
            println!(
                "\n{} {}/{} {} [{} #{}]",
                status_word(t.status),
                t.suite,
                t.scenario,
                t.trajectory,
                t.agent,
                t.repetition
            );
            if let Some(f) = &t.fault {
                println!("    {} fault: {}", f.category.as_str(), f.message);
            }
            for c in t
                .criteria
                .iter()
                .filter(|c| c.status == CriterionStatus::Failed)
            {
                let at = c
                    .turn_index
                    .map(|i| format!("turn {i}: "))
                    .unwrap_or_default();
                println!(
                    "    ✗ {at}{}\n      {}",
                    c.criterion,
                    c.detail.as_deref().unwrap_or("")
                );
            }
        }
        if self.failures_total > self.failures.len() as u64 {
            println!(
                "\n… and {} more not passing: see the report",
                self.failures_total - self.failures.len() as u64
            );
        }

        for (reason, n) in &self.skip_reasons {
            println!("\nSKIP {n} trajectory(ies): {reason}");
        }
        if summary.is_none() {
            let (mut passed, mut failed, mut errors, mut skipped) = (0, 0, 0, 0);
            for c in self.per_scenario.values() {
                passed += c.passed;
                failed += c.failed;
                errors += c.errors;
                skipped += c.skipped;
            }
            println!(
                "\nrun did not finish: {} trajectories recorded ({passed} passed, {failed} failed, \
                 {errors} error, {skipped} skipped)",
                passed + failed + errors + skipped
            );
        }
        if let Some(s) = summary {
            println!(
                "\n{} trajectories: {} passed, {} failed, {} error, {} skipped · {} turns in {:.1}s",
                s.trajectories,
                s.passed,
                s.failed,
                s.errors,
                s.skipped,
                s.turns,
                s.duration_ms / 1000.0
            );
        }
        println!("results: {}", out.display());
        println!("  report   {}", files.html.display());
        println!(
            "  tables   {}",
            [
                &files.trajectories,
                &files.turns,
                &files.tool_calls,
                &files.criteria,
                &files.runs
            ]
            .iter()
            .filter_map(|p| p.file_name().and_then(|n| n.to_str()))
            .collect::<Vec<_>>()
            .join(", ")
        );
        println!("  junit    {}", files.junit.display());
        println!("  journal  {}", journal.display());
    }
}

fn status_word(status: TrajectoryStatus) -> &'static str {
    match status {
        TrajectoryStatus::Passed => "PASS",
        TrajectoryStatus::Failed => "FAIL",
        TrajectoryStatus::Error => "ERROR",
        TrajectoryStatus::Skipped => "SKIP",
    }
}
