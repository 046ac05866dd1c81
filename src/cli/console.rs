//! The console reporter: a progress bar on a terminal, one line per finished trajectory
//! otherwise, and a summary table at the end. It reads the same event stream the journal
//! stores.
//!
//! Console output is the one thing a run may lose: `trellis run … | head -5` or quitting
//! `less` closes stdout, and a closed terminal closes stderr. Everything printed by `run`
//! goes through [`outln!`] and [`errln!`] (the per-trajectory lines through
//! [`Console::flush_lines`], a batch at a time), which never panic (`println!` does on a
//! closed pipe) and go silent on a stream after its first failed write, so the run finishes
//! and writes every results file whatever happens to the console.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use comfy_table::{Cell, ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use foldhash::fast::FixedState;
use indicatif::{ProgressBar, ProgressStyle};
use trellis_engine::event::Event;
use trellis_engine::record::{CriterionStatus, RunSummary, TrajectoryRecord, TrajectoryStatus};
use trellis_reports::Counts;
use trellis_reports::stats::Name;

/// Failures printed in full at the end; the rest are in the report.
const FAILURES_SHOWN: usize = 10;
/// Trajectories whose checks did not run listed at the end; the rest are in the report.
const UNCHECKED_SHOWN: usize = 10;

/// Set once a write to stdout failed (closed pipe): stdout is not written again.
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);
/// Set once a write to stderr failed.
static STDERR_GONE: AtomicBool = AtomicBool::new(false);

/// Why stdout could not be written, when that was not a reader going away: a full disk or
/// an I/O error under `… --message-format json > events.jsonl` loses output a program
/// reads, which the exit code must say ([`stdout_lost`]).
static STDOUT_LOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// `text` to `stream` in one write, unless an earlier write to it failed; a failed write
/// silences the stream from then on.
fn write_text(gone: &AtomicBool, mut stream: impl Write, text: &str) {
    if gone.load(Ordering::Relaxed) {
        return;
    }
    let written = stream
        .write_all(text.as_bytes())
        .and_then(|()| stream.flush());
    if let Err(e) = written {
        gone.store(true, Ordering::Relaxed);
        // A closed pipe is a reader that has seen enough (`| head`); anything else lost
        // what was written.
        if std::ptr::eq(gone, &STDOUT_GONE) && e.kind() != std::io::ErrorKind::BrokenPipe {
            let _ = STDOUT_LOST.set(e.to_string());
        }
    }
}

/// Why output to stdout was lost, other than its reader closing it (see [`STDOUT_LOST`]).
pub fn stdout_lost() -> Option<&'static str> {
    STDOUT_LOST.get().map(String::as_str)
}

fn write_line(gone: &AtomicBool, stream: impl Write, args: fmt::Arguments<'_>) {
    if gone.load(Ordering::Relaxed) {
        return;
    }
    // Formatted into one buffer and written at once: stderr is unbuffered, and writing a
    // rendered diagnostic piece by piece made `trellis check suites/` about 1,200 `write`
    // calls.
    let mut line = fmt::format(args);
    line.push('\n');
    write_text(gone, stream, &line);
}

/// One line to stdout; see [`outln!`].
pub fn out_line(args: fmt::Arguments<'_>) {
    write_line(&STDOUT_GONE, std::io::stdout().lock(), args);
}

/// Text as is to stdout, silenced like [`outln!`] by a closed stdout.
pub fn out_text(text: &str) {
    write_text(&STDOUT_GONE, std::io::stdout().lock(), text);
}

/// Text as is to stderr, silenced like [`errln!`] by a closed stderr.
fn err_text(text: &str) {
    write_text(&STDERR_GONE, std::io::stderr().lock(), text);
}

/// One line to stderr; see [`errln!`].
pub fn err_line(args: fmt::Arguments<'_>) {
    write_line(&STDERR_GONE, std::io::stderr().lock(), args);
}

/// `println!` that never panics: a closed stdout silences it instead.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::console::out_line(format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics: a closed stderr silences it instead.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::cli::console::err_line(format_args!($($arg)*))
    };
}

pub(crate) use {errln, outln};

/// The checks of one trajectory and agent that did not run.
struct Unchecked {
    repetitions: Vec<u32>,
    /// `turn N: criterion` and why it did not run: the same for every repetition listed.
    checks: Vec<(String, String)>,
}

/// (suite rank, suite, scenario, branch, agent, repetition).
type FailureKey = (usize, String, String, String, String, u32);

/// A row of the summary table: (suite, scenario or `base (N instances)`, agent).
type RowKey<'a> = (&'a str, Cow<'a, str>, &'a str);

/// The instances of one scenario as written, on one agent, as the summary counts them.
#[derive(Default)]
struct Instances {
    count: u64,
    /// All of them, summed.
    counts: Counts,
    /// The name of the one row for all of them, when they are more than [`INSTANCE_ROWS`],
    /// until it is written.
    row: Option<String>,
}

/// Bytes of per-trajectory lines held before they are written even though the run keeps
/// the reporter busy.
const PENDING_LINES_MAX: usize = 16 * 1024;

/// A scenario with more instances than this is one row of the summary.
const INSTANCE_ROWS: u64 = 20;

/// Rows of a summary table (and of the agents' grid) printed at most. Past it, the summary
/// shows the rows that did not all pass and counts the rest: a suite generated with 20,000
/// scenarios printed a table of 20,000 rows, which no one reads at a terminal and which
/// took 130 ms to lay out, more than the run's results files. report.html and summary.json
/// have every row.
const TABLE_ROWS: usize = 100;

/// Values of a matrix variable set side by side as columns at most; past it, the grid has a
/// row per value instead (a matrix of 150 values printed lines of 7,000 characters).
const MATRIX_COLUMNS: usize = 12;

/// A scenario's names (suite, scenario, agent), shared with the counts they were recorded
/// under rather than copied: a dataset's 100,000 instances were 300,000 strings made for the
/// summary, and freed after it.
type ScenarioNames = (Name, Name, Name);

pub struct Console {
    /// Trajectories the plan has, to say how much of it a stopped run covers.
    planned: u64,
    bar: Option<ProgressBar>,
    /// Print a line per trajectory (stderr is not a terminal).
    lines: bool,
    /// Those lines not yet written: they go out together whenever the reporter catches up
    /// with the run ([`Console::flush_lines`]), a `write` per batch rather than per
    /// trajectory.
    pending: String,
    /// Print nothing at all (benchmarks).
    silent: bool,
    /// Per (suite, scenario, agent), ordered: made from `recorded` by
    /// [`Console::settle`] when the summary is printed.
    per_scenario: BTreeMap<ScenarioNames, Counts>,
    /// Counted as trajectories finish, found without copying their names.
    recorded: trellis_reports::ByNames<Counts>,
    /// Suites in load order (from `run_started`): the order of every list printed.
    suites: Vec<String>,
    /// The instances of `matrix` scenarios (from `run_started`, without their rows), for
    /// the matrix grid.
    matrix_instances: Vec<trellis_engine::record::ScenarioInfo>,
    /// Suite → instance id → the scenario as written, for every `for-each` / `matrix`
    /// instance: a scenario with many instances is one row of the summary. By suite, so that
    /// a row's names find it as they are, without copies.
    instance_of: HashMap<String, HashMap<String, String, FixedState>, FixedState>,
    /// (suite, scenario) → its position in the plan, for the scenarios planned against
    /// several agents: the rows of the agents' grid, in the order the report lists them.
    grid_rank: HashMap<(String, String), usize>,
    /// The first failures in stable order (suite, scenario, branch, agent, repetition), not
    /// in the order they finished, so the same run always shows the same ones.
    failures: BTreeMap<FailureKey, TrajectoryRecord>,
    failures_total: u64,
    /// The first invalid trajectories (the simulated user broke character), in stable
    /// order, with why.
    invalid: BTreeMap<FailureKey, String>,
    invalid_total: u64,
    /// The paths of each `attack` search (scenario × agent × repetition): trajectory name,
    /// its attack record and the LLM tokens it took.
    attacks: BTreeMap<FailureKey, Vec<(String, trellis_engine::record::AttackRecord, u64)>>,
    /// Distinct skip reasons with how many trajectories each skipped.
    skip_reasons: BTreeMap<String, u64>,
    /// Checks that did not run, over every trajectory.
    checks_skipped: u64,
    /// Trajectories with checks that did not run, the repetitions of one trajectory and
    /// agent together: the first few, kept for the summary.
    /// Per trajectory and agent, its repetitions grouped by the checks that did not run and
    /// why (one repetition's fault is not another's).
    unchecked: BTreeMap<(String, String, String, String), Vec<Unchecked>>,
    unchecked_total: u64,
    /// Trajectories with checks that did not run that are not in `unchecked`.
    unchecked_not_shown: u64,
    /// The engine's own LLM calls (judges, simulated users, Fixie's LLM), summed over trajectories.
    llm: trellis_engine::llm::LlmUsage,
    /// Where each check is written, printed beside the failures listed.
    sites: Option<std::sync::Arc<super::sites::Sites>>,
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
            planned: total,
            lines: !terminal && !quiet && !silent,
            pending: String::new(),
            silent,
            per_scenario: BTreeMap::new(),
            recorded: trellis_reports::ByNames::default(),
            suites: Vec::new(),
            matrix_instances: Vec::new(),
            instance_of: HashMap::default(),
            grid_rank: HashMap::new(),
            failures: BTreeMap::new(),
            failures_total: 0,
            invalid: BTreeMap::new(),
            invalid_total: 0,
            attacks: BTreeMap::new(),
            skip_reasons: BTreeMap::new(),
            checks_skipped: 0,
            unchecked: BTreeMap::new(),
            unchecked_total: 0,
            unchecked_not_shown: 0,
            llm: trellis_engine::llm::LlmUsage::default(),
            sites: None,
        }
    }

    pub fn set_sites(&mut self, sites: Option<std::sync::Arc<super::sites::Sites>>) {
        self.sites = sites;
    }

    /// `  (suites/a.kdl:12:9)` after a failed check, when its place in the suite is known.
    fn site_of(&self, t: &TrajectoryRecord, c: &trellis_engine::record::CriterionRecord) -> String {
        let Some(sites) = &self.sites else {
            return String::new();
        };
        sites.after_check(t, c)
    }

    fn suite_rank(&self, suite: &str) -> usize {
        self.suites
            .iter()
            .position(|s| s == suite)
            .unwrap_or(usize::MAX)
    }

    pub fn on_event(&mut self, event: &Event) {
        if let Event::RunStarted(info) = event {
            self.suites.clone_from(&info.suites);
            self.matrix_instances = info
                .scenarios
                .iter()
                .filter(|s| s.instance.as_ref().is_some_and(|i| !i.vars.is_empty()))
                .map(|s| {
                    let mut s = s.clone();
                    if let Some(i) = &mut s.instance {
                        i.row = None;
                    }
                    s
                })
                .collect();
            self.instance_of = HashMap::default();
            for s in &info.scenarios {
                if let Some(i) = &s.instance {
                    self.instance_of
                        .entry(s.suite.clone())
                        .or_default()
                        .insert(s.scenario.clone(), i.of.clone());
                }
            }
            self.grid_rank = info
                .scenarios
                .iter()
                .enumerate()
                .filter(|(_, s)| s.agents.len() > 1)
                .map(|(rank, s)| ((s.suite.clone(), s.scenario.clone()), rank))
                .collect();
            return;
        }
        let Event::Trajectory(t) = event else {
            return;
        };
        let not_run = self.count(t);
        if let Some(bar) = &self.bar {
            // Forks an agent asks for add trajectories the plan could not count.
            if bar.length().is_some_and(|len| bar.position() >= len) {
                bar.inc_length(1);
            }
            bar.inc(1);
            if self.failures_total > 0 {
                bar.set_message(format!("({} not passing)", self.failures_total));
            }
        } else if self.lines {
            let mut not_run = match not_run {
                0 => String::new(),
                n => format!(" · {} did not run", count(n as u64, "check", "checks")),
            };
            if t.awaiting_human.is_some() {
                not_run.push_str(" · ended waiting for a human");
            }
            let word = format!("{:>5}", status_word(t.status));
            let _ = writeln!(
                self.pending,
                "{} {}/{} {} [{} #{}] {} {:.0}ms{not_run}",
                paint_status(&word, t.status, stderr_colour()),
                t.suite,
                t.scenario,
                t.trajectory,
                t.agent,
                t.repetition,
                count(u64::from(t.turns), "turn", "turns"),
                t.duration_ms
            );
            if self.pending.len() >= PENDING_LINES_MAX {
                self.flush_lines();
            }
        }
    }

    /// Writes the per-trajectory lines not yet written.
    pub fn flush_lines(&mut self) {
        if !self.pending.is_empty() {
            err_text(&self.pending);
            self.pending.clear();
        }
    }

    /// Takes a trajectory an earlier attempt of the run finished (`--resume`) into the
    /// summary and the progress, without a line of its own.
    pub fn seed(&mut self, t: &TrajectoryRecord) {
        self.count(t);
        if let Some(bar) = &self.bar {
            if bar.length().is_some_and(|len| bar.position() >= len) {
                bar.inc_length(1);
            }
            bar.inc(1);
        }
    }

    /// Adds what was counted since the last call to the ordered per-scenario counts.
    fn settle(&mut self) {
        let rows = self.recorded.drain_sorted();
        if self.per_scenario.is_empty() {
            // Ordered rows: the map is built at once, with no search down it for each.
            self.per_scenario = rows.into_iter().collect();
            return;
        }
        for (key, c) in rows {
            self.per_scenario.entry(key).or_default().merge(&c);
        }
    }

    /// Counts a finished trajectory into the summary; returns how many of its checks did
    /// not run.
    fn count(&mut self, t: &TrajectoryRecord) -> usize {
        self.recorded
            .update([&t.suite, &t.scenario, &t.agent], |counts| {
                counts.add(t.status)
            });
        match t.status {
            TrajectoryStatus::Passed | TrajectoryStatus::Failed | TrajectoryStatus::Error => {}
            TrajectoryStatus::Invalid => {
                self.invalid_total += 1;
                let key = (
                    self.suite_rank(&t.suite),
                    t.suite.clone(),
                    t.scenario.clone(),
                    t.trajectory.clone(),
                    t.agent.clone(),
                    t.repetition,
                );
                let reason = t.invalid_reason().unwrap_or("no reason given").to_owned();
                self.invalid.insert(key, reason);
                if self.invalid.len() > FAILURES_SHOWN {
                    self.invalid.pop_last();
                }
            }
            TrajectoryStatus::Skipped => {
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
        if let Some(llm) = t.llm.as_deref() {
            self.llm.merge(llm);
        }
        if let Some(attack) = t.attack.as_deref() {
            let key = (
                self.suite_rank(&t.suite),
                t.suite.clone(),
                t.scenario.clone(),
                String::new(),
                t.agent.clone(),
                t.repetition,
            );
            let tokens = t
                .llm
                .as_deref()
                .map_or(0, |u| u.input_tokens + u.output_tokens);
            self.attacks.entry(key).or_default().push((
                t.trajectory.clone(),
                attack.clone(),
                tokens,
            ));
        }
        let not_run = t.checks_with(CriterionStatus::Skipped);
        // An invalid trajectory's checks were left out on purpose (listed with INVALID).
        if not_run > 0 && t.status != TrajectoryStatus::Invalid {
            self.checks_skipped += not_run as u64;
            self.unchecked_total += 1;
            self.add_unchecked(t);
        }
        if matches!(t.status, TrajectoryStatus::Failed | TrajectoryStatus::Error) {
            self.failures_total += 1;
            let key = (
                self.suite_rank(&t.suite),
                t.suite.clone(),
                t.scenario.clone(),
                t.trajectory.clone(),
                t.agent.clone(),
                t.repetition,
            );
            let keep = self.failures.len() < FAILURES_SHOWN
                || self
                    .failures
                    .last_key_value()
                    .is_some_and(|(last, _)| key < *last);
            if keep {
                self.failures.insert(key, t.clone());
                if self.failures.len() > FAILURES_SHOWN {
                    self.failures.pop_last();
                }
            }
        }
        not_run
    }

    fn add_unchecked(&mut self, t: &TrajectoryRecord) {
        let key = (
            t.suite.clone(),
            t.scenario.clone(),
            t.trajectory.clone(),
            t.agent.clone(),
        );
        let checks: Vec<(String, String)> = t
            .criteria
            .iter()
            .filter(|c| c.status == CriterionStatus::Skipped)
            .map(|c| {
                let at = c
                    .turn_index
                    .map(|i| format!("turn {i}: "))
                    .unwrap_or_default();
                (
                    format!("{at}{}", c.criterion),
                    c.detail.clone().unwrap_or_else(|| "no reason given".into()),
                )
            })
            .collect();
        if let Some(groups) = self.unchecked.get_mut(&key) {
            match groups.iter_mut().find(|g| g.checks == checks) {
                Some(group) => group.repetitions.push(t.repetition),
                None => groups.push(Unchecked {
                    repetitions: vec![t.repetition],
                    checks,
                }),
            }
            return;
        }
        // The first few in stable order, not the first few to finish.
        let full = self.unchecked.len() >= UNCHECKED_SHOWN;
        if full
            && self
                .unchecked
                .last_key_value()
                .is_none_or(|(last, _)| key > *last)
        {
            self.unchecked_not_shown += 1;
            return;
        }
        self.unchecked.insert(
            key,
            vec![Unchecked {
                repetitions: vec![t.repetition],
                checks,
            }],
        );
        if self.unchecked.len() > UNCHECKED_SHOWN
            && let Some((_, dropped)) = self.unchecked.pop_last()
        {
            self.unchecked_not_shown += dropped
                .iter()
                .map(|g| g.repetitions.len() as u64)
                .sum::<u64>();
        }
    }

    /// With several agents, the scenarios side by side: one row per scenario, one column
    /// per agent, each cell its pass rate and 95% interval (`agents "a" "b"` over the same
    /// cases compares models or prompts at a glance; `trellis compare RUN --agents a b`
    /// tests the differences).
    fn agent_grid(&self) {
        // Kept by (suite, scenario, agent): a scenario run against several agents has rows
        // next to each other. Without one, there is no grid, and no map of every scenario
        // to build and look through.
        let several = self
            .per_scenario
            .keys()
            .zip(self.per_scenario.keys().skip(1))
            .any(|((s1, c1, _), (s2, c2, _))| s1 == s2 && c1 == c2);
        if !several {
            return;
        }
        // Per suite, the scenarios run against several agents, and those agents with their
        // counts (a cell is found by its agent).
        type OfAgents<'a> = Vec<(&'a str, &'a Counts)>;
        let mut by_suite: BTreeMap<&str, BTreeMap<&str, OfAgents<'_>>> = BTreeMap::new();
        for ((suite, scenario, agent), c) in &self.per_scenario {
            by_suite
                .entry(&**suite)
                .or_default()
                .entry(&**scenario)
                .or_default()
                .push((&**agent, c));
        }
        let mut suites: Vec<(&str, BTreeMap<&str, OfAgents<'_>>)> = by_suite.into_iter().collect();
        suites.sort_by_key(|(suite, _)| self.suite_rank(suite));
        for (suite, mut scenarios) in suites {
            scenarios.retain(|_, agents| agents.len() > 1);
            let agents: std::collections::BTreeSet<&str> = scenarios
                .values()
                .flatten()
                .map(|(agent, _)| *agent)
                .collect();
            let cell = |scenario: &str, agent: &str| {
                scenarios
                    .get(scenario)
                    .and_then(|of| of.iter().find(|(a, _)| *a == agent))
                    .map(|(_, c)| *c)
            };
            if agents.len() < 2 {
                continue;
            }
            let mut header = vec!["scenario"];
            header.extend(agents.iter().copied());
            let mut grid = table(&header);
            // In plan order, as the report lists them (a matrix's instances as the matrix
            // lists its values, `n=2` before `n=10`); a scenario the plan did not list, by
            // name after them.
            let mut rows: Vec<&str> = scenarios.keys().copied().collect();
            rows.sort_by_cached_key(|scenario| {
                let rank = self
                    .grid_rank
                    .get(&(suite.to_string(), (*scenario).to_string()))
                    .copied()
                    .unwrap_or(usize::MAX);
                (rank, *scenario)
            });
            // Past [`TABLE_ROWS`], as the summary: the scenarios that did not all pass on
            // some agent, and a count of the rest.
            let total = rows.len();
            let mut left_out = None;
            if total > TABLE_ROWS {
                let all_passed = |scenario: &str| {
                    agents
                        .iter()
                        .all(|agent| cell(scenario, agent).is_none_or(Counts::all_passed))
                };
                rows.retain(|scenario| !all_passed(scenario));
                let not_passed = rows.len();
                rows.truncate(TABLE_ROWS);
                if rows.is_empty() {
                    outln!(
                        "{suite}: agents side by side: {total} scenarios, all passed on every \
                         agent: too many to list here (trajectories.parquet has every one)"
                    );
                    continue;
                }
                let more = total - rows.len();
                let why = match not_passed - rows.len() {
                    0 => "all passed on every agent".to_owned(),
                    n => format!("{n} of them not all passed"),
                };
                let scenarios = if more == 1 { "scenario" } else { "scenarios" };
                left_out = Some(format!(
                    "… and {more} more {scenarios} ({why}); trajectories.parquet has every one"
                ));
            }
            for scenario in rows {
                let mut row = vec![Cell::new(scenario)];
                for agent in &agents {
                    row.push(Cell::new(cell(scenario, agent).map_or_else(
                        || "·".to_string(),
                        |c| {
                            let ran = c.passed + c.failed + c.errors;
                            if ran == 0 {
                                return "-".to_string();
                            }
                            let interval = trellis_reports::stats::wilson_interval(
                                c.passed,
                                ran,
                                trellis_reports::stats::CONFIDENCE,
                            )
                            .map_or_else(String::new, |i| format!(" ({}%)", i.label()));
                            format!(
                                "{}%{interval}",
                                trellis_reports::stats::percent_label(c.passed as f64 / ran as f64)
                            )
                        },
                    )));
                }
                grid.add_row(row);
            }
            outln!("{suite}: agents side by side (pass rate, 95% CI)\n{grid}");
            if let Some(left_out) = left_out {
                outln!("{left_out}");
            }
        }
    }

    /// The summary's rows: one per scenario and agent, but a scenario with more than
    /// [`INSTANCE_ROWS`] instances is one row, its instances' counts together (a
    /// 10,000-row dataset would print 10,000 rows; the report and the grids show them).
    fn summary_rows(&self) -> Vec<(RowKey<'_>, Counts)> {
        // The rows borrow the names they are counted under: a dataset's 20,000 instances
        // were 140,000 copies of them, and 10 ms of the summary.
        let base = |suite: &str, scenario: &str| {
            self.instance_of
                .get(suite)
                .and_then(|of| of.get(scenario))
                .map(String::as_str)
        };
        let mut rows: Vec<(RowKey<'_>, Counts)> = if self.instance_of.is_empty() {
            // No instances: a row per (suite, scenario, agent), in the order they are kept.
            self.per_scenario
                .iter()
                .map(|((suite, scenario, agent), c)| {
                    ((&**suite, Cow::Borrowed(&**scenario), &**agent), *c)
                })
                .collect()
        } else {
            // A scenario of many instances is one row: its instances are summed, and the
            // row named, once per scenario as written rather than once per instance (the
            // instances of a 20,000-row dataset were 40 ms of the run's end).
            // Each row's scenario as written, found once for both passes below.
            let bases: Vec<Option<&str>> = self
                .per_scenario
                .keys()
                .map(|(suite, scenario, _)| base(suite, scenario))
                .collect();
            let mut instances: HashMap<(&str, &str, &str), Instances, FixedState> =
                HashMap::default();
            for (((suite, _, agent), c), &base) in self.per_scenario.iter().zip(&bases) {
                if let Some(base) = base {
                    let entry = instances.entry((suite, base, agent)).or_default();
                    entry.count += 1;
                    entry.counts.merge(c);
                }
            }
            for ((_, base, _), entry) in &mut instances {
                if entry.count > INSTANCE_ROWS {
                    entry.row = Some(format!("{base} ({} instances)", entry.count));
                }
            }
            let mut rows: BTreeMap<RowKey<'_>, Counts> = BTreeMap::new();
            for (((suite, scenario, agent), c), &base) in self.per_scenario.iter().zip(&bases) {
                let many = base
                    .and_then(|b| instances.get_mut(&(&**suite, b, &**agent)))
                    .filter(|entry| entry.count > INSTANCE_ROWS);
                match many {
                    Some(entry) => {
                        // The row of all of them, written at the first.
                        if let Some(name) = entry.row.take() {
                            rows.entry((suite, Cow::Owned(name), agent))
                                .or_default()
                                .merge(&entry.counts);
                        }
                    }
                    None => rows
                        .entry((suite, Cow::Borrowed(&**scenario), agent))
                        .or_default()
                        .merge(c),
                }
            }
            rows.into_iter().collect()
        };
        // The suites in load order, their scenarios as people order names (`m[a=2]` before
        // `m[a=10]`), as the run's tables order them.
        rows.sort_by(|((sa, ca, aa), _), ((sb, cb, ab), _)| {
            self.suite_rank(sa)
                .cmp(&self.suite_rank(sb))
                .then_with(|| trellis_reports::stats::natural_cmp(ca, cb))
                .then_with(|| trellis_reports::stats::natural_cmp(aa, ab))
        });
        rows
    }

    /// With `matrix` scenarios, their pass rates by each variable's values: one row per
    /// scenario as written (and agent), one column per value, every instance with the value
    /// together (`trellis_reports::pivot`).
    fn matrix_grid(&self) {
        let counts = self
            .per_scenario
            .iter()
            .map(|((suite, scenario, agent), c)| {
                (
                    &**suite,
                    &**scenario,
                    &**agent,
                    c.passed,
                    c.passed + c.failed + c.errors,
                )
            });
        let grids =
            trellis_reports::pivot::matrix_grids(&self.suites, &self.matrix_instances, counts);
        let text = |cell: &Option<_>| {
            cell.map_or_else(
                || "·".to_string(),
                |c| match trellis_reports::pivot::cell_text(c) {
                    (rate, interval) if interval.is_empty() => rate,
                    (rate, interval) => format!("{rate} ({interval})"),
                },
            )
        };
        for g in grids {
            let names: Vec<String> = g
                .rows
                .iter()
                .map(|row| match &row.agent {
                    Some(agent) => format!("{} [{agent}]", row.scenario),
                    None => row.scenario.clone(),
                })
                .collect();
            let mut left_out = 0;
            let grid =
                if g.values.len() <= MATRIX_COLUMNS {
                    let mut header = vec!["scenario".to_string()];
                    header.extend(g.values.iter().map(|v| format!("{}={v}", g.var)));
                    let header: Vec<&str> = header.iter().map(String::as_str).collect();
                    let mut grid = table(&header);
                    for (row, name) in g.rows.iter().zip(&names) {
                        let mut cells = vec![Cell::new(name)];
                        cells.extend(row.cells.iter().map(|cell| Cell::new(text(cell))));
                        grid.add_row(cells);
                    }
                    grid
                } else {
                    // Too many values to stand side by side: a row each, in the order written,
                    // the scenarios as columns.
                    let mut header = vec![g.var.as_str()];
                    header.extend(names.iter().map(String::as_str));
                    let mut grid = table(&header);
                    left_out = g.values.len().saturating_sub(TABLE_ROWS);
                    for (i, value) in g.values.iter().enumerate().take(TABLE_ROWS) {
                        let mut cells = vec![Cell::new(value)];
                        cells.extend(g.rows.iter().map(|row| {
                            Cell::new(row.cells.get(i).map_or_else(String::new, &text))
                        }));
                        grid.add_row(cells);
                    }
                    grid
                };
            outln!(
                "{}: by matrix value `{}` (pass rate, 95% CI)\n{grid}",
                g.suite,
                g.var
            );
            if left_out > 0 {
                outln!("… and {left_out} more values (report.html has every one)");
            }
        }
    }

    pub fn finish(
        &mut self,
        summary: Option<&RunSummary>,
        out: &Path,
        journal: Option<&Path>,
        files: &trellis_reports::ReportFiles,
    ) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if self.silent {
            return;
        }
        self.settle();
        let mut table = table(&[
            "suite",
            "scenario",
            "agent",
            "passed",
            "failed",
            "error",
            "skipped",
            "invalid",
            "pass rate",
            "95% CI",
        ]);
        let rows = self.summary_rows();
        let (rows, left_out) = rows_to_print(rows);
        for ((suite, scenario, agent), c) in rows {
            let ran = c.passed + c.failed + c.errors;
            let rate = if ran == 0 {
                "-".to_string()
            } else {
                format!(
                    "{}%",
                    trellis_reports::stats::percent_label(c.passed as f64 / ran as f64)
                )
            };
            let interval = trellis_reports::stats::wilson_interval(
                c.passed,
                ran,
                trellis_reports::stats::CONFIDENCE,
            )
            .map_or_else(String::new, |i| format!("{}%", i.label()));
            table.add_row(vec![
                Cell::new(suite),
                Cell::new(scenario),
                Cell::new(agent),
                Cell::new(c.passed),
                verdict_cell(&c.failed.to_string(), c.failed > 0, false),
                verdict_cell(&c.errors.to_string(), c.errors > 0, false),
                Cell::new(c.skipped),
                Cell::new(c.invalid),
                Cell::new(rate),
                Cell::new(interval),
            ]);
        }
        if table.row_count() > 0 || left_out.is_none() {
            outln!("{table}");
        }
        if let Some(left_out) = left_out {
            outln!("{left_out}");
        }
        self.agent_grid();
        self.matrix_grid();

        // Branches that both passed and failed across repetitions, in stable order.
        for b in files.stats.branches.iter().filter(|b| b.repeats.flaky) {
            let all = b
                .repeats
                .at_k
                .last()
                .map(|k| {
                    format!(
                        "; pass^{k} {:.2}, pass@{k} {:.2}",
                        k.pass_hat_k,
                        k.pass_at_k,
                        k = k.k
                    )
                })
                .unwrap_or_default();
            outln!(
                "{} {}/{} {} [{}]: {} of {} passed{all}",
                paint("FLAKY", anstyle::AnsiColor::Yellow, stdout_colour()),
                b.suite,
                b.scenario,
                b.trajectory,
                b.agent,
                b.repeats.passed,
                count(b.repeats.samples, "repetition", "repetitions"),
            );
        }

        // A failure in a shared prefix, said once at the prefix rather than once per branch.
        for n in files
            .stats
            .nodes
            .iter()
            .filter(|n| n.failed_here > 0 && n.reached > n.executions)
        {
            outln!(
                "{} {}/{} [{}] at shared node `{}`: failed in {} of {}, which fails {} below it",
                paint("PREFIX", anstyle::AnsiColor::Red, stdout_colour()),
                n.suite,
                n.scenario,
                n.agent,
                n.node,
                n.executions_failed_here,
                count(n.executions, "execution", "executions"),
                count(n.failed_here, "trajectory", "trajectories"),
            );
        }

        for t in self.failures.values() {
            outln!(
                "\n{} {}/{} {} [{} #{}]",
                paint_status(status_word(t.status), t.status, stdout_colour()),
                t.suite,
                t.scenario,
                t.trajectory,
                t.agent,
                t.repetition
            );
            if let Some(f) = &t.fault {
                outln!(
                    "    {} fault: {}",
                    f.category.as_str(),
                    untrusted_under(&f.message, "      ")
                );
            }
            for c in t.criteria.iter().filter(|c| c.status.is_failure()) {
                let at = c
                    .turn_index
                    .map(|i| format!("turn {i}: "))
                    .unwrap_or_default();
                // An errored check could not be decided (its judge failed): say so.
                let mark = if c.status == CriterionStatus::Error {
                    "! error: "
                } else {
                    "✗ "
                };
                outln!(
                    "    {mark}{at}{}{}\n      {}",
                    c.criterion,
                    self.site_of(t, c),
                    untrusted_under(c.detail.as_deref().unwrap_or(""), "        ")
                );
            }
            // Failed with nothing failed: `--strict` turned what did not run into a failure.
            let nothing_failed =
                t.fault.is_none() && !t.criteria.iter().any(|c| c.status.is_failure());
            if nothing_failed {
                if let Some(reason) = &t.skip_reason {
                    outln!("    ✗ did not run (--strict): {}", untrusted(reason));
                }
                let not_run = t.checks_with(CriterionStatus::Skipped);
                if not_run > 0 {
                    outln!(
                        "    ✗ {} did not run (--strict): see UNCHECKED below",
                        count(not_run as u64, "check", "checks")
                    );
                }
            }
        }
        if self.failures_total > self.failures.len() as u64 {
            outln!(
                "\n… and {} more not passing (listed in order, the first {FAILURES_SHOWN} shown): see the report",
                self.failures_total - self.failures.len() as u64
            );
        }

        for ((_, suite, scenario, trajectory, agent, repetition), reason) in &self.invalid {
            outln!(
                "\n{} {suite}/{scenario} {trajectory} [{agent} #{repetition}]: the simulated user \
                 broke character (not the agent's failure)\n    {}",
                paint("INVALID", anstyle::AnsiColor::Magenta, stdout_colour()),
                untrusted(reason),
            );
        }
        if self.invalid_total > self.invalid.len() as u64 {
            outln!(
                "\n… and {} more invalid: see the report",
                self.invalid_total - self.invalid.len() as u64
            );
        }
        for ((_, suite, scenario, _, agent, repetition), paths) in &self.attacks {
            print_attack(suite, scenario, agent, *repetition, paths, out);
        }
        for (reason, n) in &self.skip_reasons {
            outln!(
                "\nSKIP {}: {reason}",
                count(*n, "trajectory", "trajectories")
            );
        }
        for ((suite, scenario, trajectory, agent), u) in
            self.unchecked.iter().flat_map(|(key, groups)| {
                // In repetition order, whichever finished first.
                let mut groups: Vec<&Unchecked> = groups.iter().collect();
                groups.sort_by_key(|g| g.repetitions.iter().min().copied());
                groups.into_iter().map(move |g| (key, g))
            })
        {
            let mut repetitions = u.repetitions.clone();
            repetitions.sort_unstable();
            let repetitions: Vec<String> = repetitions.iter().map(|r| format!("#{r}")).collect();
            outln!(
                "\nUNCHECKED {suite}/{scenario} {trajectory} [{agent} {}]: checks that did not run",
                repetitions.join(" ")
            );
            for (check, why) in &u.checks {
                outln!("    - {check}\n      {why}");
            }
        }
        if self.unchecked_not_shown > 0 {
            outln!(
                "\n… and {} more with checks that did not run: see the report",
                count(self.unchecked_not_shown, "trajectory", "trajectories")
            );
        }
        if summary.is_none() {
            let (mut passed, mut failed, mut errors, mut skipped) = (0, 0, 0, 0);
            for c in self.per_scenario.values() {
                passed += c.passed;
                failed += c.failed;
                errors += c.errors;
                skipped += c.skipped;
            }
            outln!(
                "\nrun did not finish: {} of {} planned recorded ({passed} passed, {failed} \
                 failed, {}, {skipped} skipped)",
                count(
                    passed + failed + errors + skipped,
                    "trajectory",
                    "trajectories"
                ),
                self.planned,
                count(errors, "error", "errors")
            );
        }
        if let Some(s) = summary {
            let of_planned = if s.trajectories < self.planned {
                format!(" of {} planned (the run was stopped)", self.planned)
            } else if s.interrupted && s.trajectories == self.planned {
                // Every planned trajectory has a record, but the stop cut some short (a
                // check left unjudged, say).
                " (the run was stopped: some were cut short)".to_owned()
            } else if s.interrupted {
                // Agents that fork record more than the plan: the count alone cannot say
                // what the stop cut off.
                format!(
                    ", with those its agents forked beyond the {} planned (the run was \
                     stopped: some were not reached)",
                    self.planned
                )
            } else {
                String::new()
            };
            // Said only when there are some, so a run without simulated users reads as ever.
            let invalid = if s.invalid > 0 {
                format!(", {} invalid (left out of pass rates)", s.invalid)
            } else {
                String::new()
            };
            // Under a second in milliseconds, as the report and `trellis runs` say it ("0.0s"
            // for a 41 ms run read as nothing measured).
            let took = if s.duration_ms < 1000.0 {
                format!("{:.0} ms", s.duration_ms)
            } else {
                format!("{:.1}s", s.duration_ms / 1000.0)
            };
            outln!(
                "\n{}{of_planned}: {} passed, {} failed, {}, {} skipped{invalid} · {} in {took}",
                count(s.trajectories, "trajectory", "trajectories"),
                s.passed,
                s.failed,
                count(s.errors, "error", "errors"),
                s.skipped,
                count(s.turns, "turn", "turns"),
            );
        }
        // The engine's own calls (a model under test, `openai`/`anthropic` agents, is the
        // `agent` role of the line below), each counted once where it was made: the run's
        // role totals. The trajectories' records count a shared prefix's calls in each of
        // its branches, so their sum is the fallback of a run that did not say.
        let from_roles = summary.filter(|s| !s.llm_roles.is_empty()).map(|s| {
            let mut engine = trellis_engine::llm::LlmUsage::default();
            for (_, usage) in s.llm_roles.iter().filter(|(role, _)| *role != "agent") {
                engine.merge(usage);
            }
            engine
        });
        let llm = from_roles.as_ref().unwrap_or(&self.llm);
        if llm.calls > 0 {
            outln!(
                "LLM (judges, simulated users, attackers, Fixie's LLM): {}, {} tokens in, {} \
                 out{}{}",
                count(llm.calls, "call", "calls"),
                llm.input_tokens,
                llm.output_tokens,
                llm.cost
                    .map(|c| format!(", cost {c:.4}"))
                    .unwrap_or_default(),
                if llm.cache_hits > 0 {
                    format!(", {} from the cache", llm.cache_hits)
                } else {
                    String::new()
                }
            );
        }
        // Each call once, by role.
        if let Some(s) = summary
            && !s.llm_roles.is_empty()
        {
            let roles: Vec<String> = s
                .llm_roles
                .iter()
                .map(|(role, u)| {
                    let cost = u.cost.map(|c| format!(", cost {c:.4}")).unwrap_or_default();
                    let cached = if u.cache_hits > 0 {
                        format!(", {} cached", u.cache_hits)
                    } else {
                        String::new()
                    };
                    format!(
                        "{role} {} ({} in, {} out{cost}{cached})",
                        count(u.calls, "call", "calls"),
                        u.input_tokens,
                        u.output_tokens
                    )
                })
                .collect();
            outln!("LLM by role: {}", roles.join("; "));
        }
        if self.checks_skipped > 0 {
            outln!(
                "{} did not run (on {}); --strict counts them as failures",
                count(self.checks_skipped, "check", "checks"),
                count(self.unchecked_total, "trajectory", "trajectories")
            );
        }
        // An agent that could not take the run's connections as fast as they came: the
        // turns are right, but their latencies include a wait the agent's queue caused.
        for (address, n) in summary.iter().flat_map(|s| &s.connections_redone) {
            outln!("{}", backlog_notice(address, *n));
        }
        for (command, n) in summary.iter().flat_map(|s| &s.requests_resent) {
            outln!("{}", resent_notice(command, *n));
        }
        if let Some(s) = summary
            && !s.abandoned.is_empty()
        {
            print_abandoned(&s.abandoned);
        }
        outln!("results: {}", out.display());
        // Tables by name (they sit next to each other); the files people open by full path.
        let shown = |path: &Path, full: bool| {
            let name = if full {
                path.display().to_string()
            } else {
                path.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            };
            if files.is_missing(path) {
                format!("{name} (NOT WRITTEN)")
            } else {
                name
            }
        };
        outln!("  report   {}", shown(&files.html, true));
        outln!(
            "  tables   {}",
            [
                &files.trajectories,
                &files.turns,
                &files.tool_calls,
                &files.criteria,
                &files.rubric_scores,
                &files.runs,
                &files.spans
            ]
            .iter()
            .map(|p| shown(p, false))
            .collect::<Vec<_>>()
            .join(", ")
        );
        outln!("  junit    {}", shown(&files.junit, true));
        outln!("  summary  {}", shown(&files.summary, true));
        match journal {
            // Written, but gone since (the directory removed while the run ran).
            Some(journal) if !journal.is_file() => outln!(
                "  journal  NOT FOUND: {} is gone (its directory removed during the run?)",
                journal.display()
            ),
            Some(journal) => outln!("  journal  {}", journal.display()),
            None => outln!("  journal  (incomplete: could not be written)"),
        }
    }
}

/// The line that names a loopback server (an agent, or an LLM provider) whose full accept
/// queue dropped `attempts` connection attempts (`RunSummary::connections_redone`), for
/// `run` and `watch`.
pub(super) fn backlog_notice(address: &str, attempts: u64) -> String {
    format!(
        "{} {address} dropped {} (its accept queue was full); each was made again within \
         milliseconds and the wait is in the latencies of the calls to it (an agent's turns, \
         or an LLM provider's judge and simulator calls): lower --jobs, or the provider's \
         concurrency, or raise that server's listen backlog",
        paint("BACKLOG", anstyle::AnsiColor::Yellow, stdout_colour()),
        count(attempts, "connection attempt", "connection attempts"),
    )
}

/// The line that names a long-lived agent process that ended under `requests` requests
/// without answering them (`RunSummary::requests_resent`), for `run` and `watch`: those
/// turns got the answer of the process started in its place, and no check saw the death.
pub(super) fn resent_notice(command: &str, requests: u64) -> String {
    format!(
        "{} the agent process `{command}` ended without answering {}; each was sent again to \
         a new process, whose answer the turn has (no check fails for it): its log on those \
         turns says so, and an agent that read the request before it died heard it twice",
        paint("RESTARTED", anstyle::AnsiColor::Yellow, stdout_colour()),
        count(requests, "request", "requests"),
    )
}

/// Says, on stderr, why a run sits waiting for agents' spans, for `run` and `watch`: once
/// per agent whose turn got no span at all within `--spans-wait` (naming where the spans
/// go, `receiver`), and when the end of the run waits for missing ones (`--spans-grace`).
pub(super) fn spans_notices(receiver: String) -> trellis_engine::otel::SpansNotices {
    use trellis_engine::otel::SpansNotice;
    let told = std::sync::Mutex::new(std::collections::HashSet::<String>::new());
    trellis_engine::otel::SpansNotices(std::sync::Arc::new(move |notice| match notice {
        SpansNotice::TurnGotNone {
            agent,
            wait,
            foreign,
            refused,
            reached,
        } => {
            let first = told
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(agent.to_owned());
            if first && reached {
                // Its spans reach the receiver: the endpoint is right, this turn made none.
                errln!(
                    "a turn of agent `{agent}` got no span within {} of its answer \
                     (--spans-wait), though its earlier turns' spans arrived: the agent made \
                     none for that turn, or sent them later (its checks on spans see none; \
                     raise --spans-wait if they come late)",
                    humantime::format_duration(wait),
                );
            } else if first {
                // Spans that arrive in traces of their own say the endpoint is right and
                // the agent does not continue the `traceparent` it is sent.
                let fix = if let Some((n, why)) = refused {
                    format!(
                        "the receiver at {receiver} refused {}: {why}",
                        count(n, "export request", "export requests")
                    )
                } else if foreign > 0 {
                    format!(
                        "the receiver at {receiver} got {} of other traces, dropped: the \
                         agent must continue the `traceparent` header of each request in its \
                         spans (extract it, or use an instrumented HTTP server)",
                        count(foreign, "span", "spans")
                    )
                } else {
                    format!("point its OTEL_EXPORTER_OTLP_ENDPOINT at {receiver}")
                };
                errln!(
                    "no span of agent `{agent}` arrived within {} of its answer \
                     (--spans-wait), and each of its turns waits as long: {fix}",
                    humantime::format_duration(wait),
                );
            }
        }
        // Said only of an agent that was said to send none: its endpoint is right after all.
        SpansNotice::Late { agent, spans, wait } => {
            let told_none = told
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains(agent);
            if told_none {
                errln!(
                    "{} of agent `{agent}` did arrive, later than {} after their turns' \
                     answers, once those turns were checked (recorded with late=true in \
                     spans.parquet): the agent's spans reach the receiver; raise --spans-wait \
                     for its checks to see them",
                    count(spans, "span", "spans"),
                    humantime::format_duration(wait),
                );
            }
        }
        SpansNotice::EndWaits { turns, grace } => errln!(
            "waiting up to {} for the agents' spans of {} (--spans-grace; agents with \
             `spans #true`, and every agent when --otlp-receiver is given)",
            humantime::format_duration(grace),
            count(
                turns as u64,
                "turn that has no root span yet",
                "turns that have no root span yet"
            ),
        ),
    }))
}

/// An attack search's summary: paths explored and successes by depth, and the cheapest
/// successful path (fewest attack turns, then fewest LLM tokens) with how to freeze it.
fn print_attack(
    suite: &str,
    scenario: &str,
    agent: &str,
    repetition: u32,
    paths: &[(String, trellis_engine::record::AttackRecord, u64)],
    out: &Path,
) {
    use std::collections::BTreeSet;
    let goal = paths.first().map(|(_, a, _)| a.goal.as_str()).unwrap_or("");
    let deepest = paths.iter().map(|(_, a, _)| a.depth).max().unwrap_or(0);
    let succeeded: Vec<_> = paths
        .iter()
        .filter(|(_, a, _)| a.outcome == "succeeded")
        .collect();
    // Paths explored at depth d: the distinct first d messages of the recorded paths (a
    // path that went on is recorded only at its end).
    let by_depth: Vec<String> = (1..=deepest)
        .map(|d| {
            let explored: BTreeSet<&[String]> = paths
                .iter()
                .filter_map(|(_, a, _)| a.messages.get(..d as usize))
                .collect();
            let won = succeeded.iter().filter(|(_, a, _)| a.depth == d).count();
            // A path whose judge or turn failed at this depth is not known to have
            // resisted: said apart, not counted as explored without success.
            let errors = paths
                .iter()
                .filter(|(_, a, _)| a.depth == d && a.outcome == "error")
                .count();
            let judged = explored.len().saturating_sub(errors);
            if errors == 0 {
                format!("{d}: {won}/{judged}")
            } else {
                format!("{d}: {won}/{judged} ({errors} not judged)")
            }
        })
        .collect();
    if deepest == 0 {
        outln!(
            "\n{} {suite}/{scenario} [{agent} #{repetition}] goal {goal:?}: the search did not \
             get past its start (its error is above)",
            paint("ATTACK", anstyle::AnsiColor::Red, stdout_colour())
        );
        return;
    }
    let word = if succeeded.is_empty() {
        paint("ATTACK", anstyle::AnsiColor::Green, stdout_colour())
    } else {
        paint("ATTACK", anstyle::AnsiColor::Red, stdout_colour())
    };
    outln!(
        "\n{word} {suite}/{scenario} [{agent} #{repetition}] goal {goal:?}: {} explored, {} \
         reached the goal\n    success rate by depth: {}",
        count(paths.len() as u64, "path", "paths"),
        succeeded.len(),
        by_depth.join(" · ")
    );
    if let Some((name, attack, tokens)) = succeeded
        .iter()
        .min_by_key(|(_, a, tokens)| (a.depth, *tokens))
    {
        let messages: Vec<String> = attack.messages.iter().map(|m| format!("{m:?}")).collect();
        outln!(
            "    cheapest successful path: {name} ({}, {tokens} LLM tokens): {}\n    freeze \
             it: trellis freeze {} {scenario}/{name}",
            count(u64::from(attack.depth), "attack turn", "attack turns"),
            messages.join(" → "),
            out.display()
        );
    }
}

/// The summary's rows to print, with what says how many were left out: all of them up to
/// [`TABLE_ROWS`]; past it, the first [`TABLE_ROWS`] that did not all pass (failed, error,
/// skipped or invalid), in the table's order.
fn rows_to_print<K>(rows: Vec<(K, Counts)>) -> (Vec<(K, Counts)>, Option<String>) {
    if rows.len() <= TABLE_ROWS {
        return (rows, None);
    }
    let total = rows.len();
    let not_passed = rows.iter().filter(|(_, c)| !c.all_passed()).count();
    let shown: Vec<(K, Counts)> = rows
        .into_iter()
        .filter(|(_, c)| !c.all_passed())
        .take(TABLE_ROWS)
        .collect();
    let left_out = total - shown.len();
    let not_passed_left_out = not_passed - shown.len();
    let why = if not_passed_left_out == 0 {
        "all passed".to_owned()
    } else {
        format!("{not_passed_left_out} of them not all passed")
    };
    let line = if shown.is_empty() {
        format!(
            "{total} scenario rows, all passed: too many to list here (trajectories.parquet has \
             every one)"
        )
    } else {
        let rows = if left_out == 1 { "row" } else { "rows" };
        format!("… and {left_out} more {rows} ({why}); trajectories.parquet has every one")
    };
    (shown, Some(line))
}

/// `path` as one shell word, for a command the user is told to run ([`shell_quote`]).
pub fn shell_word(path: &std::path::Path) -> String {
    shell_quote(&path.to_string_lossy())
}

/// `text` as one word for `sh`: as it is when it holds only characters no shell reads
/// specially, else single-quoted (`'sp ace/run 1'`).
pub fn shell_quote(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./+,:@".contains(c));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// `1 check`, `12 checks`.
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A status word in its colour: green passed, red failed and error, yellow skipped.
fn paint_status(word: &str, status: TrajectoryStatus, enabled: bool) -> String {
    let colour = match status {
        TrajectoryStatus::Passed => anstyle::AnsiColor::Green,
        TrajectoryStatus::Failed | TrajectoryStatus::Error => anstyle::AnsiColor::Red,
        TrajectoryStatus::Skipped => anstyle::AnsiColor::Yellow,
        TrajectoryStatus::Invalid => anstyle::AnsiColor::Magenta,
    };
    paint(word, colour, enabled)
}

fn status_word(status: TrajectoryStatus) -> &'static str {
    match status {
        TrajectoryStatus::Passed => "PASS",
        TrajectoryStatus::Failed => "FAIL",
        TrajectoryStatus::Error => "ERROR",
        TrajectoryStatus::Skipped => "SKIP",
        TrajectoryStatus::Invalid => "INVAL",
    }
}

/// Whether stdout gets colour: a terminal, and neither `NO_COLOR` nor `TERM=dumb` says
/// otherwise (`CLICOLOR_FORCE` forces it); decided by `anstream`.
///
/// Decided once per process: the answer takes a system call and three environment lookups,
/// and the console asks for every trajectory.
pub fn stdout_colour() -> bool {
    static CHOICE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| {
        anstream::AutoStream::choice(&std::io::stdout()) != anstream::ColorChoice::Never
    })
}

/// Whether stderr gets colour, as [`stdout_colour`].
pub fn stderr_colour() -> bool {
    static CHOICE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| {
        anstream::AutoStream::choice(&std::io::stderr()) != anstream::ColorChoice::Never
    })
}

fn paint(text: &str, colour: anstyle::AnsiColor, enabled: bool) -> String {
    if !enabled {
        return text.to_owned();
    }
    let style = anstyle::Style::new().fg_color(Some(colour.into())).bold();
    format!("{style}{text}{style:#}")
}

/// Red and bold on a colour terminal (stdout).
pub fn paint_fail(text: &str) -> String {
    paint(text, anstyle::AnsiColor::Red, stdout_colour())
}

/// Green and bold on a colour terminal (stdout).
pub fn paint_pass(text: &str) -> String {
    paint(text, anstyle::AnsiColor::Green, stdout_colour())
}

/// A table in the house style, as wide as the terminal allows (comfy-table wraps cells to
/// the terminal width when stdout is one; a pipe gets full rows).
pub fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header.to_vec());
    // A pseudo-terminal that reports no size (`script`, some CI runners) reads as 0 columns,
    // and a very narrow one leaves a cell a character or two: every word wrapped to a
    // column of letters (a 10-column table on 20 columns made 732 lines). `COLUMNS` then,
    // when it is wide enough, else full rows, which the terminal wraps as lines.
    let narrowest = u16::try_from(header.len() * 8).unwrap_or(u16::MAX).max(20);
    if table.width().is_some_and(|w| w < narrowest) {
        match std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.trim().parse::<u16>().ok())
            .filter(|&c| c >= narrowest)
        {
            Some(columns) => {
                table.set_width(columns);
            }
            None => {
                table.set_content_arrangement(ContentArrangement::Disabled);
            }
        }
    }
    // comfy-table colours only on a terminal of its own judging; the colour decision is
    // ours (`NO_COLOR`, `CLICOLOR_FORCE`), and cells only get colours when it says yes.
    if stdout_colour() {
        table.enforce_styling();
    }
    table
}

/// A verdict or status cell: red when bad, green when good, plain without colour.
pub fn verdict_cell(text: &str, bad: bool, good: bool) -> Cell {
    let cell = Cell::new(text);
    if !stdout_colour() {
        return cell;
    }
    if bad {
        cell.fg(comfy_table::Color::Red)
    } else if good {
        cell.fg(comfy_table::Color::Green)
    } else {
        cell
    }
}

/// Text an agent or an LLM wrote (a fault's quoted body or stderr, a judge's reason, a
/// simulated user's words), made safe to print: control characters other than newline and
/// tab, and the bidirectional overrides, are written as escapes (`\u{1b}`). Printed raw, an
/// agent's answer could clear the screen, set the terminal's title, or move the cursor up
/// and overwrite a line with a fake `PASS` (a carriage return does that too).
pub(super) fn untrusted(text: &str) -> std::borrow::Cow<'_, str> {
    trellis_engine::record::shown::visible_controls_but(text, &['\n', '\t'])
}

/// [`untrusted`], its lines after the first indented by `indent`: an agent's stderr or a
/// traceback in a fault stays inside the failure it belongs to, rather than reading as a
/// line of its own at the margin of a CI log.
pub(super) fn untrusted_under<'t>(text: &'t str, indent: &str) -> std::borrow::Cow<'t, str> {
    let shown = untrusted(text);
    if !shown.contains('\n') {
        return shown;
    }
    let mut out = String::with_capacity(shown.len() + indent.len() * 4);
    for (i, line) in shown.trim_end_matches('\n').split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
            out.push_str(indent);
        }
        out.push_str(line);
    }
    std::borrow::Cow::Owned(out)
}

/// The agent calls a stop dropped unanswered, longest waiting first: what hung, where.
pub(super) fn print_abandoned(calls: &[trellis_engine::record::AbandonedCall]) {
    const SHOWN: usize = 10;
    outln!(
        "{}",
        if calls.len() == 1 {
            "1 agent call unanswered when the run stopped (dropped with its trajectory, which \
             is not recorded):"
                .to_owned()
        } else {
            format!(
                "{} agent calls unanswered when the run stopped (dropped with their \
                 trajectories, which are not recorded):",
                calls.len()
            )
        }
    );
    for c in calls.iter().take(SHOWN) {
        outln!("  {}", c.describe());
    }
    if calls.len() > SHOWN {
        outln!(
            "  … and {} more (the journal's run_finished.abandoned)",
            calls.len() - SHOWN
        );
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn a_multi_line_text_stays_indented_under_its_first_line() {
        assert_eq!(super::untrusted_under("one line", "  "), "one line");
        assert_eq!(
            super::untrusted_under("stderr: boom\nTraceback: KeyError 'x'\n", "      "),
            "stderr: boom\n      Traceback: KeyError 'x'"
        );
    }

    #[test]
    fn a_path_is_one_shell_word() {
        assert_eq!(super::shell_word(Path::new("runs/a-1_b.c")), "runs/a-1_b.c");
        assert_eq!(
            super::shell_word(Path::new("sp ace/run 1")),
            "'sp ace/run 1'"
        );
        assert_eq!(super::shell_word(Path::new("it's")), "'it'\\''s'");
        assert_eq!(super::shell_word(Path::new("$HOME")), "'$HOME'");
        assert_eq!(super::shell_word(Path::new("runs/café")), "'runs/café'");
        assert_eq!(super::shell_word(Path::new("")), "''");
    }
}
