//! `trellis runs` (list, name, pin) and `trellis compare`, and the comparison `trellis run
//! --baseline` prints: the console side of `trellis_reports::history` and
//! `trellis_reports::compare`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use clap_complete::ArgValueCandidates;
use comfy_table::Cell;
use trellis_reports::calibration::UntrustedJudge;
use trellis_reports::compare::{self, Comparison, RunRef, Thresholds, Verdict};
use trellis_reports::history::{self, HistoryError, RunEntry};

use super::complete;
use super::console::{self, errln, outln};
use super::{EXIT_FAILED, EXIT_INCOMPLETE, EXIT_INVALID, EXIT_OK};

/// Where runs are looked up by id or name.
#[derive(Debug, Args)]
pub struct RunsDir {
    /// The directory holding run directories.
    #[arg(
        long = "dir",
        value_name = "DIR",
        default_value = "runs",
        global = true
    )]
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct RunsArgs {
    #[command(subcommand)]
    action: Option<RunsAction>,
    #[command(flatten)]
    runs: RunsDir,
    /// Print the list as a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum RunsAction {
    /// Give a run a name that `compare`, `run --baseline` and `runs pin` accept.
    ///
    /// Example: trellis runs name 20261122T035000.123Z-1a2b before-prompt-change
    Name {
        /// Run directory, run id (or a unique prefix) or current name.
        #[arg(add = ArgValueCandidates::new(complete::runs))]
        run: String,
        name: String,
    },
    /// Pin a run as the baseline (`compare` and `run --baseline` without a run use it);
    /// the previously pinned run is unpinned.
    ///
    /// Example: trellis runs pin before-prompt-change
    Pin {
        /// Run directory, run id (or a unique prefix) or name.
        #[arg(add = ArgValueCandidates::new(complete::runs))]
        run: String,
        /// Pin it even if it checked nothing (every trajectory an error, say) or did not
        /// cover its plan.
        #[arg(long)]
        force: bool,
    },
    /// Unpin a run.
    Unpin {
        /// Run directory, run id (or a unique prefix) or name.
        #[arg(add = ArgValueCandidates::new(complete::runs))]
        run: String,
    },
}

/// Regression thresholds, shared by `compare` and `run --baseline`.
#[derive(Debug, Args)]
pub struct ThresholdArgs {
    /// Largest pass-rate drop tolerated, in percentage points.
    #[arg(long, value_name = "POINTS", default_value_t = 0.0, value_parser = non_negative)]
    max_pass_rate_drop: f64,
    /// Largest drop of the mean judge score tolerated, in points (0–100).
    #[arg(long, value_name = "POINTS", default_value_t = 5.0, value_parser = non_negative)]
    max_score_drop: f64,
    /// Largest increase of the mean turn latency tolerated, in percent. A regression also
    /// needs the median turn to rise and a rank test to tell the turns apart (README, `trellis
    /// compare`): with one turn per scenario, a rise is caught only when most turns rose.
    #[arg(long, value_name = "PERCENT", default_value_t = 20.0, value_parser = non_negative)]
    max_latency_increase: f64,
    /// Latency increases below this many milliseconds never count as regressions (in the
    /// mean and in the median turn).
    #[arg(long, value_name = "MS", default_value_t = 25.0, value_parser = non_negative)]
    latency_noise_ms: f64,
    /// Significance level of the test that tells a pass-rate drop from noise when there are
    /// repeats; 1 counts every drop past the threshold.
    #[arg(long, value_name = "P", default_value_t = 0.05, value_parser = probability)]
    alpha: f64,
    /// Gate on the mean judge score even when a run's calibration.json (`trellis
    /// calibrate`) marks a judge below the agreement floor.
    #[arg(long)]
    gate_untrusted_judges: bool,
    /// Fail on a scenario, branch or check the base run checked that the head run no
    /// longer has (taken out of the suites, made `draft`, its text edited), and on one
    /// checked in fewer repetitions (a lower `repeat`). Without it they are shown as
    /// `removed` and counted in a note.
    #[arg(long)]
    gate_removed: bool,
}

/// A finite number of at least 0.
fn non_negative(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{text}` is not a number of at least 0")),
    }
}

/// A significance level: above 0, at most 1.
fn probability(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("`{text}` is not a level above 0 and at most 1")),
    }
}

impl ThresholdArgs {
    pub fn thresholds(&self) -> Thresholds {
        Thresholds {
            max_pass_rate_drop: self.max_pass_rate_drop,
            max_score_drop: self.max_score_drop,
            max_latency_increase_pct: self.max_latency_increase,
            latency_noise_ms: self.latency_noise_ms,
            alpha: self.alpha,
            gate_untrusted_judges: self.gate_untrusted_judges,
            gate_removed: self.gate_removed,
        }
    }
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The earlier run: directory (a path, or a name under --dir), id (or a unique prefix),
    /// name, or `pinned`. Default: the
    /// pinned baseline, else the second most recent finished run.
    #[arg(add = ArgValueCandidates::new(complete::runs))]
    base: Option<String>,
    /// The later run. Default: the most recent finished run.
    #[arg(add = ArgValueCandidates::new(complete::runs))]
    head: Option<String>,
    #[command(flatten)]
    runs: RunsDir,
    #[command(flatten)]
    thresholds: ThresholdArgs,
    /// Print the comparison as JSON (the `Comparison` structure) instead of tables.
    #[arg(long)]
    json: bool,
    /// Also write the comparison as a self-contained page to this file.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Compare two agents of one run (the run given, else the most recent finished one):
    /// BASE's results against HEAD's, scenario by scenario (`agents "a" "b"` in a suite).
    #[arg(long, num_args = 2, value_names = ["BASE", "HEAD"])]
    agents: Option<Vec<String>>,
}

/// A run given by directory, id (or a unique prefix) or name among the runs in `runs_dir`;
/// `Err` is the exit code, the error already said.
pub fn resolve(runs_dir: &Path, what: &str) -> Result<RunEntry, u8> {
    history::resolve_run(runs_dir, what).map_err(report_error)
}

/// A run named as a directory (taken as it is, whatever it holds: the command says what it
/// lacks) or, when no such directory exists, as a run id, prefix or name in `runs_dir`.
/// `Err` is the exit code of a refusal, already said.
pub fn run_dir(runs_dir: &Path, what: &str) -> Result<PathBuf, u8> {
    if Path::new(what).is_dir() {
        return Ok(PathBuf::from(what));
    }
    resolve(runs_dir, what).map(|entry| entry.dir)
}

fn report_error(e: HistoryError) -> u8 {
    errln!("{:?}", miette::Report::new(e));
    EXIT_INVALID
}

pub fn runs(args: RunsArgs) -> u8 {
    let dir = &args.runs.dir;
    let result = match &args.action {
        None => return list(dir, args.json),
        Some(RunsAction::Name { run, name }) => history::resolve_run(dir, run)
            .and_then(|entry| history::name_run(&entry, name).map(|()| entry))
            .map(|entry| format!("run {} is now named `{name}`", entry.run_id)),
        Some(RunsAction::Pin { run, force }) => history::resolve_run(dir, run)
            .and_then(|entry| match history::empty_baseline(&entry) {
                Some(refused) if !*force => Err(refused),
                _ => history::pin_run(&entry).map(|()| entry),
            })
            .map(|entry| {
                if let Some(why) = failed_its_gate(&entry.dir) {
                    errln!("warning: {why}");
                }
                format!("run {} is now the pinned baseline", entry.label())
            }),
        Some(RunsAction::Unpin { run }) => history::resolve_run(dir, run).and_then(|entry| {
            if !entry.baseline {
                return Ok(format!(
                    "run {} was not pinned: nothing changed",
                    entry.label()
                ));
            }
            history::unpin_run(&entry)
                .map(|()| format!("run {} is no longer pinned", entry.label()))
        }),
    };
    match result {
        Ok(message) => {
            outln!("{message}");
            EXIT_OK
        }
        Err(e) => report_error(e),
    }
}

fn list(dir: &Path, json: bool) -> u8 {
    // A damaged run.json hides only its own run: said, and the others listed.
    let runs = match history::list_readable_runs(dir) {
        Ok((runs, unreadable)) => {
            for (run_dir, e) in &unreadable {
                errln!(
                    "warning: {} is not listed: {e}: {}",
                    run_dir.display(),
                    super::recorder::source(e)
                );
            }
            runs
        }
        Err(e) => return report_error(e),
    };
    if json {
        // Pretty throughout: each run is a nested record (its whole run.json), which one
        // line per run would make unreadable.
        match serde_json::to_string_pretty(&runs) {
            Ok(text) => outln!("{text}"),
            Err(e) => {
                errln!("error: cannot encode the run list: {e}");
                return EXIT_INVALID;
            }
        }
        return EXIT_OK;
    }
    if runs.is_empty() {
        outln!("no runs in {}", dir.display());
        return EXIT_OK;
    }
    // The directory `--out` gave a run, when any differs from its id: what the person who
    // made the runs knows them by (`runs/slow3`), which `runs pin slow3` takes.
    let dir_name = |run: &history::RunEntry| {
        run.dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let with_dirs = runs.iter().any(|r| dir_name(r) != r.run_id);
    let mut headers = vec!["run"];
    if with_dirs {
        headers.push("dir");
    }
    headers.extend([
        "name",
        "started",
        "traj.",
        "pass rate",
        "duration",
        "labels",
        "state",
    ]);
    let mut table = console::table(&headers);
    for run in &runs {
        let mut row = vec![Cell::new(&run.run_id)];
        if with_dirs {
            let name = dir_name(run);
            row.push(Cell::new(if name == run.run_id { "" } else { &name }));
        }
        row.extend(vec![
            Cell::new(run.name.as_deref().unwrap_or("")),
            Cell::new(run.started_at.as_deref().unwrap_or("-")),
            Cell::new(run.trajectories.map_or("-".into(), |n| n.to_string())),
            Cell::new(percent(run.pass_rate())),
            Cell::new(run.duration_ms.map_or("-".into(), run_duration)),
            Cell::new(
                run.labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            Cell::new(state(run)),
        ]);
        table.add_row(row);
    }
    outln!("{table}");
    outln!(
        "{} in {}",
        console::count(runs.len() as u64, "run", "runs"),
        dir.display()
    );
    EXIT_OK
}

/// A run's `state` in `trellis runs`: pinned, unfinished, and how it was made when that
/// is not one `trellis run` (a merge of shards, partial when shards were missing; a
/// rejudge of another run's transcripts). A merge stopped while it wrote is unfinished
/// like any run.
fn state(run: &RunEntry) -> String {
    let merged = run.meta.as_ref().and_then(|m| m.merged.as_ref());
    let mut parts: Vec<String> = Vec::new();
    if run.baseline {
        parts.push("pinned".to_owned());
    }
    // Left out of the pass rate, as skipped ones are: said, or a run whose simulated user
    // broke character in 6 of 7 trajectories reads `100%` and nothing else.
    if let Some(invalid) = run.invalid.filter(|&n| n > 0) {
        parts.push(format!("{invalid} invalid"));
    }
    // The same transcripts judged again: not a run of the agent of its own.
    if let Some(original) = run.meta.as_ref().and_then(|m| m.rejudged_from.as_ref()) {
        parts.push(format!("rejudge of {original}"));
    }
    match merged {
        _ if !run.finished => parts.push("unfinished".to_owned()),
        Some(m) if m.partial => parts.push(format!("partial merge of {} shards", m.shards)),
        Some(m) => parts.push(format!("merged from {} shards", m.shards)),
        None if run.stopped => parts.push("stopped".to_owned()),
        None => {}
    }
    parts.join(", ")
}

pub fn compare_command(args: CompareArgs) -> u8 {
    let dir = &args.runs.dir;
    if let Some(agents) = &args.agents {
        return compare_agents_command(&args, agents);
    }
    let pair = match (&args.base, &args.head) {
        (Some(base), Some(head)) => {
            history::resolve_run(dir, base).and_then(|b| Ok((b, history::resolve_run(dir, head)?)))
        }
        (Some(base), None) => history::resolve_run(dir, base).and_then(|b| {
            let head = latest_other_than(dir, &b.run_id)?;
            Ok((b, head))
        }),
        (None, _) => default_pair(dir),
    };
    let (base, head) = match pair {
        Ok(pair) => pair,
        Err(e) => return report_error(e),
    };
    let comparison = match compare_runs(&base, &head, args.thresholds.thresholds()) {
        Ok(c) => c,
        Err(message) => {
            errln!("error: {message}");
            return EXIT_INVALID;
        }
    };
    if let Some(path) = &args.html
        && let Err(e) =
            trellis_reports::write_compare(path, &trellis_reports::ComparePage::from(&comparison))
    {
        errln!("{:?}", miette::Report::new(e));
        return EXIT_INCOMPLETE;
    }
    if args.json {
        match trellis_reports::to_json_string(&comparison) {
            Ok(text) => outln!("{text}"),
            Err(e) => errln!("error: cannot encode the comparison: {e}"),
        }
    } else {
        print_comparison(&comparison);
    }
    if comparison.regressed {
        EXIT_FAILED
    } else {
        EXIT_OK
    }
}

/// `compare --agents A B [RUN]`: two agents of one run, each replayed alone from the
/// journal and labelled `A→B`, so their scenarios pair up.
fn compare_agents_command(args: &CompareArgs, agents: &[String]) -> u8 {
    let (Some(base_agent), Some(head_agent)) = (agents.first(), agents.get(1)) else {
        errln!("error: --agents takes two agent ids: BASE HEAD");
        return EXIT_INVALID;
    };
    if args.head.is_some() {
        errln!("error: --agents compares two agents of one run; give one run, not two");
        return EXIT_INVALID;
    }
    let dir = &args.runs.dir;
    let run = match &args.base {
        Some(run) => history::resolve_run(dir, run),
        None => history::list_runs(dir).and_then(|runs| {
            runs.into_iter()
                .rev()
                .find(|r| r.finished)
                .ok_or_else(|| HistoryError::NotEnoughRuns {
                    what: format!("no finished run in {}", dir.display()),
                })
        }),
    };
    let run = match run {
        Ok(run) => run,
        Err(e) => return report_error(e),
    };
    let label = format!("{base_agent}→{head_agent}");
    let side =
        |agent: &str| match trellis_reports::stats::RunStats::for_agent(&run.dir, agent, &label) {
            Ok(Some(stats)) => Ok(stats),
            Ok(None) => Err(format!(
                "run {} has no trajectory of agent `{agent}`",
                run.label()
            )),
            Err(e) => Err(format!("cannot read run {}: {e}", run.label())),
        };
    let (base, head) = match (side(base_agent), side(head_agent)) {
        (Ok(b), Ok(h)) => (b, h),
        (Err(e), _) | (_, Err(e)) => {
            errln!("error: {e}");
            return EXIT_INVALID;
        }
    };
    let mut base_ref = run_ref(&run);
    let mut head_ref = run_ref(&run);
    base_ref.name = Some(format!("agent {base_agent}"));
    head_ref.name = Some(format!("agent {head_agent}"));
    let comparison = compare::compare(
        &base,
        base_ref,
        &head,
        head_ref,
        args.thresholds.thresholds(),
        match untrusted_judges(&[&run.dir]) {
            Ok(u) => u,
            Err(message) => {
                errln!("error: {message}");
                return EXIT_INVALID;
            }
        },
        agent_turn_latencies(&run.dir, base_agent, head_agent).as_ref(),
    );
    if let Some(path) = &args.html
        && let Err(e) =
            trellis_reports::write_compare(path, &trellis_reports::ComparePage::from(&comparison))
    {
        errln!("{:?}", miette::Report::new(e));
        return EXIT_INCOMPLETE;
    }
    if args.json {
        match trellis_reports::to_json_string(&comparison) {
            Ok(text) => outln!("{text}"),
            Err(e) => errln!("error: cannot encode the comparison: {e}"),
        }
    } else {
        print_comparison(&comparison);
    }
    if comparison.regressed {
        EXIT_FAILED
    } else {
        EXIT_OK
    }
}

/// The pinned baseline against the latest other finished run, else the last two.
fn default_pair(dir: &Path) -> Result<(RunEntry, RunEntry), HistoryError> {
    match history::resolve_run(dir, "pinned") {
        Ok(pinned) => {
            let head = latest_other_than(dir, &pinned.run_id)?;
            Ok((pinned, head))
        }
        Err(HistoryError::NothingPinned { .. }) | Err(HistoryError::NoSuchRun { .. }) => {
            history::last_two(dir)
        }
        Err(e) => Err(e),
    }
}

fn latest_other_than(dir: &Path, run_id: &str) -> Result<RunEntry, HistoryError> {
    history::list_runs(dir)?
        .into_iter()
        .rev()
        .find(|r| r.finished && r.run_id != run_id)
        .ok_or_else(|| HistoryError::NotEnoughRuns {
            what: format!(
                "no finished run in {} besides {run_id} to compare with",
                dir.display()
            ),
        })
}

pub fn run_ref(entry: &RunEntry) -> RunRef {
    RunRef {
        run_id: entry.run_id.clone(),
        name: entry.name.clone(),
        dir: entry.dir.display().to_string(),
        started_at: entry.started_at.clone().unwrap_or_default(),
        finished: entry.finished,
        stopped: entry.stopped,
    }
}

/// Reads both runs' statistics (`summary.json`, else the journal) and compares them.
pub fn compare_runs(
    base: &RunEntry,
    head: &RunEntry,
    thresholds: Thresholds,
) -> Result<Comparison, String> {
    let stats = |entry: &RunEntry| {
        history::run_stats(&entry.dir).map_err(|e| {
            let why = std::error::Error::source(&e)
                .map(|s| format!(": {s}"))
                .unwrap_or_default();
            format!("cannot read run {}: {e}{why}", entry.label())
        })
    };
    let base_stats = stats(base)?;
    let head_stats = stats(head)?;
    // A run against itself (or a copy of it: `trellis report --out`) always "passes": it
    // certifies nothing, and is most likely a mistyped id in a gate.
    if base.run_id == head.run_id {
        return Err(format!(
            "run {} would be compared with itself ({} and {}); give two different runs",
            base.label(),
            base.dir.display(),
            head.dir.display()
        ));
    }
    Ok(compare::compare(
        &base_stats,
        run_ref(base),
        &head_stats,
        run_ref(head),
        thresholds,
        untrusted_judges(&[&base.dir, &head.dir])?,
        turn_latencies(&base.dir, &head.dir).as_ref(),
    ))
}

/// Both runs' per-turn latencies, when both can be read (else latency is judged on the
/// mean alone), with the mean latencies of the whole runs of the same suites that started
/// before the head run in the same runs directory.
pub fn turn_latencies(base: &Path, head: &Path) -> Option<compare::TurnLatencies> {
    let base_turns = history::turn_latencies(base)?;
    let head_turns = history::turn_latencies(head)?;
    let EarlierMeans {
        means: earlier_means,
        runs: earlier_runs,
        by_agent: mut earlier_by_agent,
    } = earlier_latency_means(base, head);
    let all = |by_agent: &history::AgentLatencies| by_agent.values().flatten().copied().collect();
    let scenarios = base_turns
        .scenarios
        .iter()
        .filter_map(|(key, base)| {
            let head = head_turns.scenarios.get(key)?;
            Some((
                key.clone(),
                compare::TurnLatencies {
                    base: base.clone(),
                    head: head.clone(),
                    ..compare::TurnLatencies::default()
                },
            ))
        })
        .collect();
    let (base_turns, head_turns) = (base_turns.agents, head_turns.agents);
    let agents = if base_turns.len() > 1 || head_turns.len() > 1 {
        base_turns
            .iter()
            .filter_map(|(agent, base)| {
                let head = head_turns.get(agent)?;
                Some((
                    agent.clone(),
                    compare::TurnLatencies {
                        base: base.clone(),
                        head: head.clone(),
                        earlier_means: earlier_by_agent.remove(agent).unwrap_or_default(),
                        ..compare::TurnLatencies::default()
                    },
                ))
            })
            .collect()
    } else {
        BTreeMap::new()
    };
    Some(compare::TurnLatencies {
        base: all(&base_turns),
        head: all(&head_turns),
        earlier_means,
        earlier_runs,
        agents,
        scenarios,
    })
}

/// Two agents' per-turn latencies in one run, for `compare --agents`: each agent's turns
/// ranked against the other's, as two runs' are. No earlier runs: they are runs of both
/// agents, whose spread says nothing of one against the other.
fn agent_turn_latencies(dir: &Path, base: &str, head: &str) -> Option<compare::TurnLatencies> {
    let mut turns = history::turn_latencies(dir)?.agents;
    Some(compare::TurnLatencies {
        base: turns.remove(base)?,
        head: turns.remove(head)?,
        ..compare::TurnLatencies::default()
    })
}

/// The mean turn latency of the most recent finished runs (watch reruns are not listed)
/// with the head run's suite fingerprint that started before it, most recent first: those
/// that started no later than the base (how runs varied up to it), and later ones only when
/// they passed a `--baseline` comparison on latency themselves. A run after the base that
/// was never gated, or failed its gate on latency, may be the slower agent under test, not
/// a busier machine: counting it would let every later run as slow pass. A run's mean is that
/// of the turns its agent answered. Also each agent's mean in the same runs.
fn earlier_latency_means(base: &Path, head: &Path) -> EarlierMeans {
    let none = EarlierMeans::default;
    let Ok(head_entry) = history::read_run(head) else {
        return none();
    };
    let base_started = history::read_run(base).ok().and_then(|b| b.started_at);
    let fingerprint = head_entry
        .meta
        .as_ref()
        .map(|m| m.suite_fingerprint.clone());
    let (Some(fingerprint), Some(started), Some(runs_dir)) =
        (fingerprint, head_entry.started_at.clone(), head.parent())
    else {
        return none();
    };
    let Ok(mut runs) = history::list_runs(runs_dir) else {
        return none();
    };
    runs.retain(|r| {
        r.finished
            && r.run_id != head_entry.run_id
            && r.started_at
                .as_deref()
                .is_some_and(|s| s < started.as_str())
            && r.meta
                .as_ref()
                .is_some_and(|m| m.suite_fingerprint == fingerprint)
    });
    runs.sort_by(|a, b| b.started_at.cmp(&a.started_at));
    let mut means = Vec::new();
    let mut labels = Vec::new();
    let mut by_agent: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mean = |turns: &[f64]| turns.iter().sum::<f64>() / turns.len() as f64;
    for answered in runs
        .iter()
        .filter(|r| {
            let before_base = match (&r.started_at, &base_started) {
                (Some(run), Some(base)) => run <= base,
                _ => false,
            };
            match latency_verdict(&r.dir).as_deref() {
                Some("regressed") => false,
                // Not gated on latency: counted when it came no later than the base. Nor
                // is a rise its gate let through as `noise`: counted, one slower run that
                // got through (its median a hair short of the bar) raised the bar for the
                // next, and every later run of an agent twice as slow passed.
                None | Some("not_comparable" | "noise") => before_base,
                Some(_) => true,
            }
        })
        // The turns the agent answered: a faulted turn's latency is its fault (a hung
        // agent's turns are its timeouts), not how busy the machine was; counted, a run of
        // timeouts would excuse any slower agent after it for the next runs.
        .filter_map(|r| Some((r, history::answered_turn_latencies(&r.dir)?)))
        .filter(|(_, answered)| answered.values().any(|turns| !turns.is_empty()))
        .take(compare::SPREAD_WINDOW)
    {
        let (run, answered) = answered;
        let all: Vec<f64> = answered.values().flatten().copied().collect();
        means.push(mean(&all));
        labels.push(run.label().to_owned());
        for (agent, turns) in answered.into_iter().filter(|(_, t)| !t.is_empty()) {
            by_agent.entry(agent).or_default().push(mean(&turns));
        }
    }
    EarlierMeans {
        means,
        runs: labels,
        by_agent,
    }
}

/// [`earlier_latency_means`]: the runs' means, which runs they are, and each agent's.
#[derive(Default)]
struct EarlierMeans {
    means: Vec<f64>,
    runs: Vec<String>,
    by_agent: BTreeMap<String, Vec<f64>>,
}

/// The comparison `run --baseline` recorded in `dir` (`compare.json`), as JSON: read for
/// what it says of the run, whatever version of the structure wrote it.
fn recorded_comparison(dir: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read(dir.join(trellis_reports::COMPARE_FILE)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// What a run's own `--baseline` comparison (`compare.json`) found, when it failed: pinned,
/// its regressions become the bar later runs are held to, which is worth a word (a run
/// pinned by id or name may not be the one meant).
fn failed_its_gate(dir: &Path) -> Option<String> {
    let comparison = recorded_comparison(dir)?;
    if comparison["regressed"] != true {
        return None;
    }
    let regressions = comparison["regressions"].as_array().map_or(0, Vec::len);
    let first = comparison["regressions"][0].as_str().unwrap_or_default();
    Some(format!(
        "it failed its own gate against {} ({}; the first: {first}): later runs are now held \
         to what it regressed",
        comparison["base"]["run_id"]
            .as_str()
            .unwrap_or("its baseline"),
        console::count(regressions as u64, "regression", "regressions"),
    ))
}

/// The verdict on the mean latency of the comparison recorded in `dir` (`compare.json`,
/// written by `run --baseline`), if one is: `regressed` when the run's, any agent's or any
/// scenario's regressed, `noise` when the run's or an agent's was, else the run's.
fn latency_verdict(dir: &Path) -> Option<String> {
    let comparison = recorded_comparison(dir)?;
    let latency = comparison["metrics"]
        .as_array()?
        .iter()
        .filter(|m| m["metric"] == "latency_mean_ms");
    let mut run = None;
    // A scenario whose turns regressed: part of the agent under test slower, not the
    // machine (counted, one missed slowdown let every later one as slow pass).
    let scenarios = comparison["scenarios"].as_array().into_iter().flatten();
    if scenarios
        .into_iter()
        .any(|s| s["latency"]["verdict"] == "regressed")
    {
        return Some("regressed".to_owned());
    }
    let mut agent_noise = false;
    for m in latency {
        let verdict = m["verdict"].as_str();
        if verdict == Some("regressed") {
            return Some("regressed".to_owned());
        }
        if m.get("agent").is_none_or(serde_json::Value::is_null) {
            run = verdict.map(str::to_owned);
        } else if verdict == Some("noise") {
            agent_noise = true;
        }
    }
    // An agent's rise let through as noise is the run's, for what counts in the spread.
    match run {
        Some(verdict) if agent_noise && verdict != "noise" => Some("noise".to_owned()),
        run => run,
    }
}

/// The judges the runs' `calibration.json` files mark below the agreement floor.
pub fn untrusted_judges(dirs: &[&Path]) -> Result<Vec<UntrustedJudge>, String> {
    let mut all = Vec::new();
    for dir in dirs {
        let judges = trellis_reports::calibration::untrusted_judges(dir).map_err(|e| {
            let why = std::error::Error::source(&e)
                .map(|s| format!(": {s}"))
                .unwrap_or_default();
            format!("{e}{why}")
        })?;
        all.extend(judges);
    }
    Ok(all)
}

fn percent(rate: Option<f64>) -> String {
    rate.map_or_else(|| "-".to_owned(), |r| format!("{:.0}%", r * 100.0))
}

fn rate_cell(t: Option<compare::Tally>) -> String {
    match t {
        Some(t) if t.samples > 0 => format!("{}/{} ({})", t.passed, t.samples, percent(t.rate())),
        Some(_) => "not run".to_owned(),
        None => "-".to_owned(),
    }
}

fn verdict_cell(verdict: Verdict) -> Cell {
    console::verdict_cell(
        verdict.as_str(),
        matches!(verdict, Verdict::Regressed | Verdict::NotRun),
        verdict == Verdict::Improved,
    )
}

fn p_cell(p: Option<f64>) -> String {
    p.map_or_else(String::new, |p| format!("{p:.3}"))
}

/// The comparison as console tables: run metrics, then every scenario, branch and check
/// that changed, then the verdict.
/// Rows of each list of a comparison printed at most: a run against a baseline of 10,000
/// dataset instances, filtered to a few, listed every one removed (17,860 lines in a CI
/// log). The rest are counted by verdict; `--json` and `compare.json` hold every one.
const COMPARISON_LISTED: usize = 20;

/// Where a comparison's lists are whole.
const IN_FULL: &str = "listed in full by --json (and in the run's compare.json under --baseline)";

/// `rows` with those whose verdict gates first (regressed, not run), in their order
/// otherwise, cut to [`COMPARISON_LISTED`]; and the line that counts the rest by verdict.
fn gating_first<T>(mut rows: Vec<T>, verdict: impl Fn(&T) -> Verdict) -> (Vec<T>, Option<String>) {
    rows.sort_by_key(|r| !matches!(verdict(r), Verdict::Regressed | Verdict::NotRun));
    if rows.len() <= COMPARISON_LISTED {
        return (rows, None);
    }
    let rest = rows.split_off(COMPARISON_LISTED);
    let mut by_verdict: Vec<(Verdict, usize)> = Vec::new();
    for r in &rest {
        let v = verdict(r);
        match by_verdict.iter_mut().find(|(seen, _)| *seen == v) {
            Some((_, n)) => *n += 1,
            None => by_verdict.push((v, 1)),
        }
    }
    let counts: Vec<String> = by_verdict
        .iter()
        .map(|(v, n)| format!("{n} {}", v.as_str()))
        .collect();
    let line = format!(
        "… and {} more ({}): {IN_FULL}",
        rest.len(),
        counts.join(", ")
    );
    (rows, Some(line))
}

pub fn print_comparison(c: &Comparison) {
    let side = |r: &RunRef| match &r.name {
        Some(name) => format!("{name} ({})", r.run_id),
        None => r.run_id.clone(),
    };
    outln!("base {}\nhead {}", side(&c.base), side(&c.head));

    let mut metrics = console::table(&["metric", "base", "head", "change", "verdict"]);
    for m in &c.metrics {
        let shown = |v: Option<f64>| match (m.metric.as_str(), v) {
            (_, None) => "-".to_owned(),
            ("pass_rate", Some(v)) => format!("{:.1}%", v * 100.0),
            ("total_tokens", Some(v)) => format!("{v:.0}"),
            (_, Some(v)) => format!("{v:.1}"),
        };
        let change = match (m.metric.as_str(), m.delta) {
            (_, None) => String::new(),
            ("pass_rate", Some(d)) => format!("{:+.1} pts", d * 100.0),
            (_, Some(d)) => match m.base {
                Some(b) if b.abs() > f64::EPSILON => format!("{d:+.1} ({:+.0}%)", d / b * 100.0),
                _ => format!("{d:+.1}"),
            },
        };
        metrics.add_row(vec![
            Cell::new(match &m.agent {
                Some(agent) => format!("{} [{agent}]", m.metric),
                None => m.metric.clone(),
            }),
            Cell::new(shown(m.base)),
            Cell::new(shown(m.head)),
            Cell::new(change),
            verdict_cell(m.verdict),
        ]);
    }
    outln!("{metrics}");
    // Why a latency rise is noise (or regressed) is not in the figures.
    for m in c.metrics.iter().filter(|m| {
        matches!(
            m.verdict,
            Verdict::Noise | Verdict::Regressed | Verdict::Unchanged
        )
    }) {
        if let Some(why) = &m.why {
            let whose = m
                .agent
                .as_ref()
                .map(|a| format!(" [{a}]"))
                .unwrap_or_default();
            outln!("{}{whose} {}: {why}", m.metric, m.verdict.as_str());
        }
    }

    let changed = |v: Verdict| !matches!(v, Verdict::Unchanged | Verdict::NotComparable);
    let scenarios: Vec<_> = c
        .scenarios
        .iter()
        .filter(|s| changed(s.rate.verdict))
        .collect();
    if !scenarios.is_empty() {
        let (scenarios, more) = gating_first(scenarios, |s| s.rate.verdict);
        let mut table = console::table(&["scenario", "agent", "base", "head", "p", "verdict"]);
        for s in scenarios {
            table.add_row(vec![
                Cell::new(format!("{}/{}", s.suite, s.scenario)),
                Cell::new(&s.agent),
                Cell::new(rate_cell(s.rate.base)),
                Cell::new(rate_cell(s.rate.head)),
                Cell::new(p_cell(s.rate.p_value)),
                match &s.not_run {
                    Some(why) => console::verdict_cell(&format!("not run ({why})"), true, false),
                    None => verdict_cell(s.rate.verdict),
                },
            ]);
        }
        outln!("scenarios (repetitions where every branch passed)\n{table}");
        if let Some(more) = more {
            outln!("{more}");
        }
    }
    // A scenario's turns slower than the rest of the run became: its verdict and why (the
    // figures are in `--json`); a rise too small to tell, or too few turns to test, says so.
    let latencies: Vec<_> = c
        .scenarios
        .iter()
        .filter_map(|s| {
            let l = s.latency.as_ref()?;
            let shown = matches!(
                l.verdict,
                Verdict::Regressed | Verdict::Noise | Verdict::Ungated
            );
            (shown && l.why.is_some()).then_some((s, l))
        })
        .collect();
    if !latencies.is_empty() {
        let (latencies, more) = gating_first(latencies, |(_, l)| l.verdict);
        outln!("scenario latency (each scenario's turns, against the rest of the run)");
        for (s, l) in latencies {
            outln!(
                "  {}/{} [{}] latency_mean_ms {}: {}",
                s.suite,
                s.scenario,
                s.agent,
                l.verdict.as_str(),
                l.why.as_deref().unwrap_or_default()
            );
        }
        if let Some(more) = more {
            outln!("{more}");
        }
    }
    let branches: Vec<_> = c
        .branches
        .iter()
        .filter(|b| changed(b.rate.verdict))
        .collect();
    if !branches.is_empty() {
        let (branches, more) = gating_first(branches, |b| b.rate.verdict);
        let mut table = console::table(&[
            "scenario", "branch", "agent", "base", "head", "p", "verdict",
        ]);
        for b in branches {
            table.add_row(vec![
                Cell::new(format!("{}/{}", b.suite, b.scenario)),
                Cell::new(&b.trajectory),
                Cell::new(&b.agent),
                Cell::new(rate_cell(b.rate.base)),
                Cell::new(rate_cell(b.rate.head)),
                Cell::new(p_cell(b.rate.p_value)),
                verdict_cell(b.rate.verdict),
            ]);
        }
        outln!("branches\n{table}");
        if let Some(more) = more {
            outln!("{more}");
        }
    }
    // A check only in one run belongs to a branch or scenario only in one run (listed
    // above) or was added to or removed from the suite: counted, not listed.
    let one_sided = |v: Verdict| matches!(v, Verdict::Added | Verdict::Removed);
    // Checks of a scenario the head run skipped are that scenario's line above; a check the
    // head run skipped in a scenario it ran is listed.
    let scenarios_not_run: std::collections::BTreeSet<(&str, &str, &str)> = c
        .scenarios
        .iter()
        .filter(|s| s.rate.verdict == Verdict::NotRun)
        .map(|s| (s.suite.as_str(), s.scenario.as_str(), s.agent.as_str()))
        .collect();
    let of_scenario_not_run = |k: &trellis_reports::compare::CriterionChange| {
        k.rate.verdict == Verdict::NotRun
            && scenarios_not_run.contains(&(
                k.suite.as_str(),
                k.scenario.as_str(),
                k.agent.as_str(),
            ))
    };
    let criteria: Vec<_> = c
        .criteria
        .iter()
        .filter(|k| {
            changed(k.rate.verdict) && !one_sided(k.rate.verdict) && !of_scenario_not_run(k)
        })
        .collect();
    let not_run = c.criteria.iter().filter(|k| of_scenario_not_run(k)).count();
    // Checks of a scenario or branch only in one run are that line above, not counted again.
    let scenarios_one_sided: std::collections::BTreeSet<(&str, &str, &str)> = c
        .scenarios
        .iter()
        .filter(|s| one_sided(s.rate.verdict))
        .map(|s| (s.suite.as_str(), s.scenario.as_str(), s.agent.as_str()))
        .collect();
    let branches_one_sided: std::collections::BTreeSet<(&str, &str, &str, &str)> = c
        .branches
        .iter()
        .filter(|b| one_sided(b.rate.verdict))
        .map(|b| {
            let (suite, scenario) = (b.suite.as_str(), b.scenario.as_str());
            (suite, scenario, b.trajectory.as_str(), b.agent.as_str())
        })
        .collect();
    let (mut checks_removed, mut checks_added) = (0u64, 0u64);
    for k in c.criteria.iter().filter(|k| one_sided(k.rate.verdict)) {
        let (suite, scenario, agent) = (k.suite.as_str(), k.scenario.as_str(), k.agent.as_str());
        if scenarios_one_sided.contains(&(suite, scenario, agent))
            || branches_one_sided.contains(&(suite, scenario, k.trajectory.as_str(), agent))
        {
            continue;
        }
        match k.rate.verdict {
            Verdict::Removed => checks_removed += 1,
            _ => checks_added += 1,
        }
    }
    if !criteria.is_empty() {
        let (criteria, more) = gating_first(criteria, |k| k.rate.verdict);
        let mut table = console::table(&["branch", "check", "base", "head", "verdict", "why"]);
        for k in criteria {
            let at = k
                .turn_index
                .map(|i| format!("turn {i}: "))
                .unwrap_or_default();
            table.add_row(vec![
                Cell::new(format!(
                    "{}/{} {} [{}]",
                    k.suite, k.scenario, k.trajectory, k.agent
                )),
                Cell::new(format!("{at}{}", k.criterion)),
                Cell::new(rate_cell(k.rate.base)),
                Cell::new(rate_cell(k.rate.head)),
                verdict_cell(k.rate.verdict),
                Cell::new(k.head_failure.as_deref().unwrap_or("")),
            ]);
        }
        outln!("checks\n{table}");
        if let Some(more) = more {
            outln!("{more}");
        }
    }
    if not_run > 0 {
        outln!(
            "{} of scenarios that did not run in the head run (listed with --json)",
            console::count(not_run as u64, "check", "checks")
        );
    }
    if checks_removed + checks_added > 0 {
        let mut parts = Vec::new();
        if checks_removed > 0 {
            parts.push(format!(
                "{} only in the base run",
                console::count(checks_removed, "check is", "checks are")
            ));
        }
        if checks_added > 0 {
            parts.push(format!(
                "{} only in the head run",
                console::count(checks_added, "check is", "checks are")
            ));
        }
        outln!(
            "{}, in scenarios and branches of both (listed with --json)",
            parts.join(", ")
        );
    }
    if let Some(why) = &c.rules_differ {
        outln!("note: {why}");
    }
    if let Some(what) = &c.taken_out {
        outln!("note: {what}");
    }
    if let Some(why) = &c.score_gate_refused {
        outln!("note: {why}");
    } else if !c.untrusted_judges.is_empty() {
        outln!(
            "note: calibration marks {} below the agreement floor; the mean judge score gates \
             anyway (--gate-untrusted-judges)",
            console::count(c.untrusted_judges.len() as u64, "judge", "judges")
        );
    }
    if c.regressed {
        outln!(
            "{}:",
            console::paint_fail(&format!(
                "REGRESSED ({})",
                console::count(c.regressions.len() as u64, "regression", "regressions")
            ))
        );
        for r in c.regressions.iter().take(COMPARISON_LISTED) {
            outln!("  - {r}");
        }
        if let Some(more) = c
            .regressions
            .len()
            .checked_sub(COMPARISON_LISTED)
            .filter(|&n| n > 0)
        {
            outln!("  … and {more} more: {IN_FULL}");
        }
    } else {
        outln!(
            "{}: no regression past the thresholds",
            console::paint_pass("OK")
        );
    }
}

/// `trellis run --baseline`: resolves the baseline before the run starts, so a typo fails
/// at once rather than after the whole run.
pub fn resolve_baseline(runs_dir: &Path, what: &str) -> Result<RunEntry, u8> {
    let entry = history::resolve_run(runs_dir, what).map_err(|e| {
        // `--baseline` takes an optional value, so `run --baseline suites/` reads the suite
        // path as the baseline's name.
        let is_suite_path = matches!(
            e,
            HistoryError::NoSuchRun { .. } | HistoryError::NotARunDir { .. }
        ) && (Path::new(what).exists() || what.ends_with(".kdl"));
        let code = report_error(e);
        if is_suite_path {
            errln!(
                "hint: `{what}` was taken as the value of --baseline; put --baseline after \
                 the paths (`trellis run {what} --baseline`, `trellis merge SHARD_DIR… \
                 --baseline`) or give the run as --baseline=RUN"
            );
        }
        code
    })?;
    // Refused before anything runs, as `trellis runs pin` refuses it: a baseline that did
    // not cover its plan would hold this run to part of it (`compare` fails such a
    // comparison too, after the whole run).
    let short = if !entry.finished {
        Some("never reached its end")
    } else if entry.stopped {
        Some("was stopped before its work was done")
    } else {
        None
    };
    if let Some(why) = short {
        errln!(
            "error: the baseline, run {} ({}), {why}: it would hold this run to only part of \
             its plan",
            entry.label(),
            entry.dir.display()
        );
        errln!(
            "hint: finish it with `trellis run SUITES… --resume {}`, or give a run that \
             covered its plan (`trellis runs` lists them)",
            console::shell_word(&entry.dir)
        );
        return Err(EXIT_INVALID);
    }
    Ok(entry)
}

/// A run's wall time as the listing shows it: milliseconds under a second (a run of a few
/// trajectories read `0.0s`), else seconds to a tenth.
fn run_duration(ms: f64) -> String {
    if ms < 999.5 {
        format!("{ms:.0}ms")
    } else {
        format!("{:.1}s", ms / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::run_duration;

    #[test]
    fn short_runs_are_listed_in_milliseconds_and_long_ones_in_seconds() {
        let shown: Vec<String> = [0.4, 23.4, 999.4, 999.6, 1_049.0, 61_234.0]
            .into_iter()
            .map(run_duration)
            .collect();
        assert_eq!(shown, ["0ms", "23ms", "999ms", "1.0s", "1.0s", "61.2s"]);
    }
}
