//! `trellis variance RUN [PATHS…]`: how much of each scenario's outcome variance comes from
//! the agent, the simulated user and the judge, measured by holding two of them fixed.
//!
//! Three conditions, cheapest first, each an ordinary piece of Trellis:
//! 1. **judge**: RUN's transcripts judged again `--judge-repeats` times (`rejudge`'s
//!    machinery, the draw in each judge call's cache key), in memory;
//! 2. **agent**: the suites run `--repeats` times with RUN's simulated users replayed
//!    (`run --replay-users`, every repetition replaying RUN's first), into
//!    `RUN/variance/agent`;
//! 3. **free**: the suites run `--repeats` times as they are, into `RUN/variance/free`.
//!
//! The decomposition is `trellis_reports::variance`; the result goes to the console and to
//! `RUN/variance.json`, which the run's `report.html` shows once rebuilt. A signal or an
//! LLM budget stops the condition running and those still to run; what finished is
//! decomposed and said to be partial. Signals are watched once for the whole command
//! ([`SignalRelay`]): each condition has a runtime of its own, and a watcher per condition
//! would leave the moments between them (and the next condition, once one restored the
//! default dispositions) unguarded.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use clap::Args;
use comfy_table::{Cell, Table};
use trellis_engine::journal;
use trellis_engine::llm::{LlmCache, LlmRuntime, LlmSetup};
use trellis_engine::plan::Selection;
use trellis_engine::record::{CriterionStatus, JournalEntry, TrajectoryRecord, TrajectoryStatus};
use trellis_engine::transport::http::HttpTransport;
use trellis_reports::variance::{
    Decomposition, GroupKey, IntervalMethod, PARTIAL_VARIANCE_FILE, Samples, VARIANCE_FILE,
    VARIANCE_SCHEMA_VERSION, VarianceReport,
};

use super::console::{errln, outln};
use super::history::RunsDir;
use super::stop::{SignalRelay, StopSignal};
use super::{EXIT_BUDGET, EXIT_FAILED, EXIT_INCOMPLETE, EXIT_INVALID, EXIT_OK, LlmCacheMode};

#[derive(Debug, Args)]
pub struct VarianceArgs {
    /// The recorded run: a run directory, a run id (or a unique prefix) or a name.
    #[arg(add = clap_complete::ArgValueCandidates::new(super::complete::runs))]
    run: String,
    /// The suites to plan RUN's scenarios from (found by suite and id). Default: the suite
    /// files RUN recorded in its run.json, refused if any is gone or changed.
    paths: Vec<PathBuf>,
    /// Repetitions of the agent (users replayed) and free conditions.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(2..=1000))]
    repeats: u32,
    /// Judgments of each recorded transcript (default: --repeats).
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=1000))]
    judge_repeats: Option<u32>,
    /// Print variance.json to stdout instead of the table (and no progress on stderr).
    #[arg(long)]
    json: bool,
    /// No plan or progress lines on stderr; only the table.
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Agent calls in flight at once.
    #[arg(long, short = 'j', default_value_t = 8)]
    pub(super) jobs: usize,
    /// As for `trellis run`.
    #[arg(long, value_name = "DIR")]
    llm_cache: Option<PathBuf>,
    /// As for `trellis run`.
    #[arg(long, value_enum, default_value_t = LlmCacheMode::ReadWrite, requires = "llm_cache")]
    llm_cache_mode: LlmCacheMode,
    /// Stop once this many LLM calls were sent, across all three conditions (cache hits do
    /// not count); what finished is decomposed.
    #[arg(long, value_name = "N")]
    max_llm_calls: Option<u64>,
    /// Stop once the LLM calls cost this much, across all three conditions.
    #[arg(long, value_name = "COST")]
    max_llm_cost: Option<f64>,
    #[command(flatten)]
    runs: RunsDir,
}

/// The outcome a condition counts: passed or not; invalid and skipped say nothing.
fn outcome(t: &TrajectoryRecord) -> Option<bool> {
    match t.status {
        TrajectoryStatus::Passed => Some(true),
        TrajectoryStatus::Failed | TrajectoryStatus::Error => Some(false),
        TrajectoryStatus::Skipped | TrajectoryStatus::Invalid => None,
    }
}

fn scenario_key(t: &TrajectoryRecord) -> (String, String, String) {
    (t.suite.clone(), t.scenario.clone(), t.agent.clone())
}

fn group(t: &TrajectoryRecord, repetition: u32) -> GroupKey {
    (
        t.suite.clone(),
        t.scenario.clone(),
        t.agent.clone(),
        t.trajectory.clone(),
        repetition,
    )
}

/// LLM use per role, as a run's summary counts it.
type Roles = std::collections::BTreeMap<String, trellis_engine::record::LlmUsage>;

/// LLM use so far, against the whole command's budget.
#[derive(Default)]
struct Spent {
    calls: u64,
    cost: f64,
}

impl Spent {
    fn add(&mut self, roles: &Roles) {
        for r in roles.values() {
            // Cache hits are not sent, so they spend nothing of the budget.
            self.calls += r.calls.saturating_sub(r.cache_hits);
            self.cost += r.cost.unwrap_or(0.0);
        }
    }
}

pub fn variance(args: VarianceArgs) -> u8 {
    let entry = match super::history::resolve(&args.runs.dir, &args.run) {
        Ok(entry) => entry,
        Err(code) => return code,
    };
    let run_dir = entry.dir.clone();
    let entries: Vec<JournalEntry> = match journal::read(&journal::path_in(&run_dir)) {
        Ok(entries) => entries.collect(),
        Err(e) => {
            errln!("error: {e}: {}", super::recorder::source(&e));
            return EXIT_INVALID;
        }
    };
    // The suites: as given, else as the run recorded them (its files unchanged, its
    // selection).
    let (paths, selection) = if args.paths.is_empty() {
        match super::recorded_suites::recorded(
            &run_dir,
            &format!("trellis variance {} PATHS…", args.run),
        ) {
            Ok(recorded) => recorded,
            Err(e) => {
                errln!("{:?}", miette::Report::new(e));
                return EXIT_INVALID;
            }
        }
    } else {
        (args.paths.clone(), every_scenario())
    };
    let Some(project) = super::load(&paths) else {
        return EXIT_INVALID;
    };
    let judge_repeats = args.judge_repeats.unwrap_or(args.repeats);

    // What RUN recorded: its scenarios, whether their users were simulated and their checks
    // judged.
    let mut samples = Samples::default();
    let mut recorded: HashSet<(String, String)> = HashSet::new();
    let mut trajectories = 0u64;
    let mut judged_checks = 0u64;
    let mut first_repetition = u32::MAX;
    for e in &entries {
        match e {
            JournalEntry::Node(n)
                if n.turns
                    .iter()
                    .any(|t| trellis_engine::execute::replay_users::is_simulated(t)) =>
            {
                samples
                    .simulated
                    .insert((n.suite.clone(), n.scenario.clone(), n.agent.clone()));
            }
            JournalEntry::Trajectory(t) => {
                trajectories += 1;
                first_repetition = first_repetition.min(t.repetition);
                recorded.insert((t.suite.clone(), t.scenario.clone()));
                let judged = t
                    .criteria
                    .iter()
                    .filter(|c| {
                        // A judged check skipped in the run (no judge configured) was not
                        // judged, and re-judging it asks no one.
                        LlmRuntime::is_judged_kind_name(&c.kind)
                            && c.status != CriterionStatus::Skipped
                            && !c
                                .detail
                                .as_deref()
                                .is_some_and(|d| d.starts_with("not checked"))
                    })
                    .count() as u64;
                if judged > 0 {
                    samples.judged.insert(scenario_key(t));
                }
                judged_checks += judged;
            }
            _ => {}
        }
    }
    if trajectories == 0 {
        errln!(
            "error: {} recorded no trajectory: there is nothing to measure",
            run_dir.display()
        );
        return EXIT_INVALID;
    }
    let Some(plan) = plan_of(&project, &selection, &recorded, args.repeats) else {
        return EXIT_INVALID;
    };
    if plan.scenarios.is_empty() {
        errln!(
            "error: none of the scenarios {} recorded is in the suites given (give the \
             suites the run was made from)",
            run_dir.display()
        );
        return EXIT_INVALID;
    }
    let planned = plan.trajectory_count();
    let changed = replanned(&plan, &entries);
    if !changed.is_empty() {
        let shown = changed
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        let more = changed.len().saturating_sub(5);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        if args.paths.is_empty() {
            // The suite files are unchanged (checked above): a dataset or another file
            // they read changed.
            errln!(
                "error: the suites run {} was planned from now plan {shown}{more} \
                 differently (a file they read changed)\n  help: restore it, or give the \
                 suites to use as they are now: `trellis variance {} PATHS…`",
                entry.run_id,
                args.run
            );
            return EXIT_INVALID;
        }
        errln!(
            "warning: the suites given plan {shown}{more} differently from run {}: the \
             users-replayed and free conditions measure them as they are now, the judge \
             condition judges the recorded transcripts",
            entry.run_id
        );
    }

    let quiet = args.quiet || args.json;
    // The plan, before anything is spent.
    if !quiet {
        errln!(
            "variance of run {} ({} recorded trajectories, {} scenarios):",
            entry.run_id,
            trajectories,
            plan.scenarios.len()
        );
        if judged_checks == 0 {
            errln!(
                "  judge: the run judged no check (none is LLM-judged, or no judge was \
                 configured): nothing can be attributed to the judge"
            );
        } else {
            errln!(
                "  judge: {judged_checks} judged check(s) × {judge_repeats} = {} judge calls, \
                 no agent call",
                judged_checks * u64::from(judge_repeats)
            );
        }
        errln!(
            "  agent: {planned} trajectory runs ({} repetitions), simulated users replayed \
             from the run, into {}",
            args.repeats,
            run_dir.join("variance/agent").display()
        );
        errln!(
            "  free:  {planned} trajectory runs ({} repetitions), everything fresh, into {}",
            args.repeats,
            run_dir.join("variance/free").display()
        );
        if samples.simulated.is_empty() {
            errln!("  the run has no simulated user turns: nothing can be attributed to the user");
        }
    }

    let cache = super::run::llm_cache(args.llm_cache.as_deref(), args.llm_cache_mode);
    let mut spent = Spent::default();
    let mut stopped: Option<(String, u8)> = None;
    // From here on a signal stops the conditions gracefully, whichever is running (or
    // none: between them, or while the results are written).
    let relay = match SignalRelay::start((!quiet).then(|| {
        "stopping: the condition running stops as `trellis run` does (signal again to \
         stop its calls at once); what finished is decomposed and marked partial"
            .to_owned()
    })) {
        Ok(relay) => relay,
        Err(e) => {
            errln!("error: cannot watch for signals: {e}");
            return EXIT_INVALID;
        }
    };
    let progress = |line: std::fmt::Arguments<'_>| {
        if !quiet {
            errln!("variance: {line}");
        }
    };

    // What the figures do not say (in variance.json too), and whether a condition measured
    // only errors.
    let mut warnings: Vec<String> = Vec::new();
    let mut measured_nothing = false;
    // 1. The judge condition.
    if judged_checks > 0 {
        progress(format_args!(
            "judge condition: {judged_checks} judged check(s), {judge_repeats} draws …"
        ));
        let started = std::time::Instant::now();
        let before = tally(&samples.judge);
        match judge_condition(
            &project,
            &entries,
            &args,
            judge_repeats,
            &cache,
            &relay,
            &mut samples,
        ) {
            Ok(roles) => spent.add(&roles),
            Err((why, roles, code)) => {
                spent.add(&roles);
                stopped = Some((why, code));
            }
        }
        let after = tally(&samples.judge);
        let judgments = after.0 - before.0;
        progress(format_args!(
            "judge condition {}: {} trajectory judgments ({} passed, {} errors) in {:.1}s",
            if stopped.is_some() { "stopped" } else { "done" },
            judgments,
            after.1 - before.1,
            samples.judge_errors,
            started.elapsed().as_secs_f64()
        ));
        // Errors count as not passing: a judge that fails every call gives outcomes that
        // never vary, and its variance read 0.000, as stable as a judge can be.
        if judgments > 0 && samples.judge_errors == judgments {
            measured_nothing = true;
            warnings.push(
                "every judgment of the judge condition ended in an error (is the judge \
                 failing? see the run's judge_error_category): the judge's share says nothing \
                 of it"
                    .to_owned(),
            );
        } else if samples.judge_errors > 0 {
            warnings.push(format!(
                "{} of {judgments} judgments of the judge condition ended in an error and \
                 count as not passing",
                samples.judge_errors
            ));
        }
        for warning in &warnings {
            errln!("warning: {warning}");
        }
    }

    // 2 and 3. The agent and free conditions: ordinary runs.
    let mut runs = std::collections::BTreeMap::new();
    for (name, replay) in [("agent", true), ("free", false)] {
        if let Some(signal) = relay.stopped()
            && stopped.is_none()
        {
            stopped = Some((
                format!("{} before the {name} condition", signal.name()),
                signal.exit_code(),
            ));
        }
        if stopped.is_some() {
            break;
        }
        let out = run_dir.join("variance").join(name);
        let budget = trellis_engine::llm::meter::Budget {
            max_calls: args
                .max_llm_calls
                .map(|m| m.saturating_sub(spent.calls).max(1)),
            max_cost: args
                .max_llm_cost
                .map(|m| (m - spent.cost).max(f64::MIN_POSITIVE)),
        };
        let replay_users = if replay {
            match super::run::load_user_replay(
                &args.runs.dir,
                &run_dir.display().to_string(),
                Some(first_repetition),
            ) {
                Ok(r) => Some(r),
                Err(code) => return code,
            }
        } else {
            None
        };
        // A plan is consumed by its run; planning again is cheap.
        let Some(plan) = plan_of(&project, &selection, &recorded, args.repeats) else {
            return EXIT_INVALID;
        };
        let planned = plan.trajectory_count();
        progress(format_args!(
            "{name} condition ({}): {planned} trajectory runs …",
            if replay {
                "users replayed"
            } else {
                "everything fresh"
            },
        ));
        let started = std::time::Instant::now();
        match condition_run(plan, &out, &args, &cache, budget, replay_users, &relay) {
            Ok((summary, code)) => {
                runs.insert(name.to_owned(), format!("variance/{name}"));
                if let Some(s) = &summary {
                    spent.add(&s.llm_roles);
                }
                let counted = add_outcomes(&out, name, &mut samples);
                if let Some(signal) = relay.stopped() {
                    stopped = Some((
                        format!("{} during the {name} condition", signal.name()),
                        signal.exit_code(),
                    ));
                } else if code == EXIT_BUDGET {
                    stopped = Some((
                        format!("the LLM budget was reached during the {name} condition"),
                        code,
                    ));
                } else if code >= 128 || code == EXIT_INCOMPLETE {
                    stopped = Some((format!("the {name} run did not finish"), code));
                }
                progress(format_args!(
                    "{name} condition {}: {} of {planned} trajectory runs recorded ({} \
                     passed, {} failed or error, {} invalid, {} skipped) in {:.1}s",
                    if stopped.is_some() { "stopped" } else { "done" },
                    counted.recorded,
                    counted.passed,
                    counted.failed,
                    counted.invalid,
                    counted.skipped,
                    started.elapsed().as_secs_f64()
                ));
                // As for the judge condition: outcomes that are all errors never vary, and
                // the share read 0.000, as steady as an agent can be.
                if counted.recorded > 0 && counted.errors == counted.recorded {
                    // Whose error: a judge that failed is not an agent that is down.
                    let why = match (&counted.first_fault, counted.faulted) {
                        (None, _) => "in their checks: is a judge failing?".to_owned(),
                        (Some(first), n) if n == counted.errors => {
                            format!("with a fault: is the agent down? the first: {first}")
                        }
                        (Some(first), n) => format!(
                            "{n} with a fault (the first: {first}), the rest in their checks"
                        ),
                    };
                    measured_nothing = true;
                    let warning = format!(
                        "every trajectory of the {name} condition ended in an error, {why} \
                         (see {}): its share says nothing of it",
                        out.display()
                    );
                    errln!("warning: {warning}");
                    warnings.push(warning);
                } else if counted.errors > 0 {
                    let warning = format!(
                        "{} of {} trajectories of the {name} condition ended in an error and \
                         count as not passing",
                        counted.errors, counted.recorded
                    );
                    errln!("warning: {warning}");
                    warnings.push(warning);
                }
            }
            Err(code) => return code,
        }
    }

    // A signal after the last condition still marks the result partial, as `run` does.
    if stopped.is_none()
        && let Some(signal) = relay.stopped()
    {
        stopped = Some((
            format!("{} after the conditions", signal.name()),
            signal.exit_code(),
        ));
    }
    let (scenarios, overall) = trellis_reports::variance::decompose(&samples);
    let report = VarianceReport {
        schema_version: VARIANCE_SCHEMA_VERSION,
        run_id: entry.run_id.clone(),
        repeats: args.repeats,
        judge_repeats,
        complete: stopped.is_none(),
        stopped: stopped.as_ref().map(|(why, _)| why.clone()),
        runs,
        scenarios,
        overall,
        intervals: Some(IntervalMethod::default()),
        warnings,
    };
    // A stopped measurement does not replace a complete one: a Ctrl-C lost the finished
    // analysis of an earlier, longer command.
    let keeps_earlier = !report.complete
        && matches!(
            trellis_reports::variance::read(&run_dir),
            Ok(Some(earlier)) if earlier.complete
        );
    let path = run_dir.join(if keeps_earlier {
        PARTIAL_VARIANCE_FILE
    } else {
        VARIANCE_FILE
    });
    if let Err(e) = trellis_reports::write_json(&path, &report) {
        errln!("error: {e}: {}", super::recorder::source(&e));
        return EXIT_INCOMPLETE;
    }
    // The run's report gains its variance section.
    if let Err(e) =
        trellis_reports::write_reports(&run_dir, &trellis_reports::ReportOptions::default())
    {
        errln!("warning: report.html was not rebuilt: {e}");
    }
    if args.json {
        match trellis_reports::to_json_string(&report) {
            Ok(text) => outln!("{text}"),
            Err(e) => errln!("error: {e}"),
        }
    } else {
        print_table(&report);
        outln!("variance: {}", path.display());
    }
    match stopped {
        Some((why, code)) => {
            if !args.json {
                errln!("partial: {why}; the figures use what finished");
            }
            if keeps_earlier {
                errln!(
                    "the complete {VARIANCE_FILE} of an earlier `trellis variance` is kept (the \
                     report shows it); this partial result is in {PARTIAL_VARIANCE_FILE}, and \
                     the conditions that ran replaced their runs under variance/"
                );
            }
            // A signal decides the exit code, whatever else stopped a condition.
            relay.stopped().map_or(code, StopSignal::exit_code)
        }
        // A condition that measured only errors: the figures are not a measurement, and a
        // script reading the exit code alone took them for one.
        None if measured_nothing => {
            errln!(
                "error: a condition measured nothing but errors (warned above, and in \
                 {}'s warnings)",
                path.display()
            );
            EXIT_FAILED
        }
        None => EXIT_OK,
    }
}

/// Suites given anew: the scenarios RUN recorded are found whatever their tags or state.
fn every_scenario() -> Selection {
    Selection {
        filters: Vec::new(),
        tags: Vec::new(),
        include_inactive: true,
    }
}

/// The suites' plan, cut down to the scenarios RUN recorded (their `needs` renumbered).
fn plan_of(
    project: &trellis_dsl::Project,
    selection: &Selection,
    recorded: &HashSet<(String, String)>,
    repeats: u32,
) -> Option<trellis_engine::plan::Plan> {
    let mut plan = match trellis_engine::plan::Plan::build(project, selection) {
        Ok(plan) => plan,
        Err(e) => {
            errln!("{:?}", miette::Report::new(e));
            return None;
        }
    };
    let keep: Vec<bool> = plan
        .scenarios
        .iter()
        .map(|s| recorded.contains(&(s.suite.to_string(), s.scenario.id.value.clone())))
        .collect();
    let mut renumber = vec![None; keep.len()];
    let mut next = 0;
    for (i, k) in keep.iter().enumerate() {
        if *k {
            renumber[i] = Some(next);
            next += 1;
        }
    }
    let scenarios = std::mem::take(&mut plan.scenarios);
    plan.scenarios = scenarios
        .into_iter()
        .enumerate()
        .filter(|(i, _)| keep[*i])
        .map(|(_, mut s)| {
            s.repeat = repeats;
            s.needs = s
                .needs
                .iter()
                .filter_map(|&n| renumber.get(n).copied().flatten())
                .collect();
            s
        })
        .collect();
    // As `run` does: the condition runs' journals say what each trajectory meant.
    trellis_engine::fingerprint::stamp(project, &mut plan);
    Some(plan)
}

/// Trajectories `plan` (stamped) means differently from the run that recorded `entries`:
/// what they send or check changed (a suite, an included file or a dataset row), as
/// `suite/scenario `trajectory``. Runs recorded before fingerprints existed say nothing.
fn replanned(plan: &trellis_engine::plan::Plan, entries: &[JournalEntry]) -> Vec<String> {
    let Some(info) = entries.iter().find_map(|e| match e {
        JournalEntry::RunStarted(info) => Some(info),
        _ => None,
    }) else {
        return Vec::new();
    };
    let recorded: std::collections::HashMap<(&str, &str, &str), &str> = info
        .scenarios
        .iter()
        .flat_map(|s| {
            s.trajectories
                .iter()
                .zip(&s.fingerprints)
                .map(move |(t, f)| ((&*s.suite, &*s.scenario, &**t), &**f))
        })
        .collect();
    let mut changed = Vec::new();
    for s in &plan.scenarios {
        for t in &s.trajectories {
            let key = (&*s.suite, s.scenario.id.value.as_str(), t.name.as_str());
            if let (Some(now), Some(then)) = (t.fingerprint.as_deref(), recorded.get(&key))
                && now != *then
            {
                changed.push(format!("{}/{} `{}`", key.0, key.1, key.2));
            }
        }
    }
    changed
}

/// The judge condition: `repeats` re-judgments of the recorded transcripts, in memory.
/// `Err` says why it stopped early (what finished is kept in `samples`).
fn judge_condition(
    project: &trellis_dsl::Project,
    entries: &[JournalEntry],
    args: &VarianceArgs,
    repeats: u32,
    cache: &LlmCache,
    relay: &SignalRelay,
    samples: &mut Samples,
) -> Result<Roles, (String, Roles, u8)> {
    let setup = LlmSetup::from_project(project);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return Err((
                format!("cannot start the async runtime: {e}"),
                Roles::new(),
                EXIT_INVALID,
            ));
        }
    };
    let env = trellis_engine::render::snapshot_env();
    let llm = LlmRuntime::new(setup, &env, &HttpTransport::new(), cache.clone());
    let stop = tokio_util::sync::CancellationToken::new();
    llm.meter().arm(
        trellis_engine::llm::meter::Budget {
            max_calls: args.max_llm_calls,
            max_cost: args.max_llm_cost,
        },
        stop.clone(),
    );
    let mut outcome = Ok(());
    runtime.block_on(async {
        let mut signals = relay.signals();
        for draw in 1..=repeats {
            let judging = trellis_engine::llm::rejudge::rejudge_draw(
                project,
                entries.to_vec(),
                &llm,
                "variance",
                String::new(),
                draw,
                |faulted, criteria| {
                    trellis_engine::execute::trajectory_status(faulted, criteria, false).0
                },
            );
            // A draw is one piece: a stop ends it unrecorded, earlier draws are kept.
            let result = tokio::select! {
                r = judging => r,
                signal = signals.next() => {
                    outcome = Err((
                        format!("{} during judge draw {draw}", signal.name()),
                        signal.exit_code(),
                    ));
                    return;
                }
                () = stop.cancelled() => {
                    outcome = Err(("the LLM budget was reached".to_owned(), EXIT_BUDGET));
                    return;
                }
            };
            let Ok((judged, _)) = result else {
                continue;
            };
            for e in judged {
                if let JournalEntry::Trajectory(t) = e
                    && let Some(passed) = outcome_of(&t)
                {
                    if t.status == trellis_engine::record::TrajectoryStatus::Error {
                        samples.judge_errors += 1;
                    }
                    samples
                        .judge
                        .entry(group(&t, t.repetition))
                        .or_default()
                        .push(passed);
                }
            }
        }
    });
    let roles = llm.meter().by_role();
    match outcome {
        Ok(()) => Ok(roles),
        Err((why, code)) => Err((why, roles, code)),
    }
}

fn outcome_of(t: &TrajectoryRecord) -> Option<bool> {
    outcome(t)
}

/// One of the agent and free conditions, as an ordinary run into `out` (an earlier
/// variance's is replaced). `Err` is the exit code of a refusal, already said.
fn condition_run(
    plan: trellis_engine::plan::Plan,
    out: &Path,
    args: &VarianceArgs,
    cache: &LlmCache,
    budget: trellis_engine::llm::meter::Budget,
    replay_users: Option<std::sync::Arc<trellis_engine::execute::UserReplay>>,
    relay: &SignalRelay,
) -> Result<(Option<trellis_engine::record::RunSummary>, u8), u8> {
    let _claim = match super::recorder::claim_out_dir(out, true, false) {
        Ok(claim) => claim,
        Err(message) => {
            errln!("error: {message}");
            return Err(EXIT_INVALID);
        }
    };
    let run_id = super::run::new_run_id();
    // Marked as a condition of the variance, not a run: `runs.parquet` says `variance`, so a
    // glob over every run's tables can leave it out.
    let meta = trellis_reports::history::RunMeta {
        variance_condition: out
            .file_name()
            .map(|name| name.to_string_lossy().into_owned()),
        ..trellis_reports::history::RunMeta::marker(&run_id)
    };
    if let Err(e) = meta.write(out) {
        errln!("warning: {e}: {}", super::recorder::source(&e));
    }
    let settings = super::run::Settings {
        replay_users,
        jobs: crate::descriptors::jobs_within_limit(
            args.jobs,
            crate::descriptors::AgentDescriptors::of(plan.agents.iter().map(|a| &a.endpoint)),
        )
        .0
        .clamp(1, trellis_engine::execute::MAX_JOBS),
        quiet: true,
        // The conditions' own consoles would bury the table; their runs are on disk.
        silent: true,
        strict: false,
        json_events: false,
        llm_cache: cache.clone(),
        llm_budget: budget,
        otlp_receiver: None,
        otlp_endpoint: None,
        spans_wait: std::time::Duration::from_secs(5),
        spans_grace: std::time::Duration::from_secs(5),
        signals: Some(relay.clone()),
        sites: None,
    };
    match super::run::execute_plan(plan, &run_id, out, &settings, None, None) {
        Ok(outcome) => Ok((outcome.summary, outcome.exit_code)),
        Err(message) => {
            errln!("error: {message}");
            Err(EXIT_INVALID)
        }
    }
}

/// What a condition's run recorded, for its progress line. A stopped run records what it
/// did not finish as skipped.
#[derive(Default)]
struct Counted {
    recorded: u64,
    passed: u64,
    /// Failed or errored.
    failed: u64,
    /// Of `failed`, those that errored (a fault, a check that could not run).
    errors: u64,
    /// Of `errors`, those that ended with a fault (the agent's, or the simulated user's),
    /// the first of them said; the rest errored in their checks (a judge that failed).
    faulted: u64,
    first_fault: Option<String>,
    invalid: u64,
    skipped: u64,
}

/// Outcomes and passes in a condition's groups so far.
fn tally(groups: &std::collections::BTreeMap<GroupKey, Vec<bool>>) -> (u64, u64) {
    groups
        .values()
        .flatten()
        .fold((0, 0), |(n, p), &passed| (n + 1, p + u64::from(passed)))
}

/// The outcomes a condition's run recorded, by trajectory (its repetitions one group).
fn add_outcomes(out: &Path, name: &str, samples: &mut Samples) -> Counted {
    let mut counted = Counted::default();
    let path = journal::path_in(out);
    let Ok(entries) = journal::read(&path) else {
        return counted;
    };
    let target = if name == "agent" {
        &mut samples.agent
    } else {
        &mut samples.free
    };
    for e in entries {
        if let JournalEntry::Trajectory(t) = e {
            counted.recorded += 1;
            match t.status {
                TrajectoryStatus::Passed => counted.passed += 1,
                TrajectoryStatus::Failed => counted.failed += 1,
                TrajectoryStatus::Error => {
                    counted.failed += 1;
                    counted.errors += 1;
                    if let Some(fault) = &t.fault {
                        counted.faulted += 1;
                        counted.first_fault.get_or_insert_with(|| {
                            format!("{} fault: {}", fault.category.as_str(), fault.message)
                        });
                    }
                }
                TrajectoryStatus::Invalid => counted.invalid += 1,
                TrajectoryStatus::Skipped => counted.skipped += 1,
            }
            if let Some(passed) = outcome(&t) {
                target.entry(group(&t, 0)).or_default().push(passed);
            }
        }
    }
    counted
}

fn fmt(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.3}"))
}

/// An estimate with its interval: `0.250 [0.100, 0.410]`.
fn estimate(v: Option<f64>, interval: Option<trellis_reports::stats::Interval>) -> String {
    match (v, interval) {
        (Some(v), Some(i)) => format!("{v:.3} [{:.3}, {:.3}]", i.low, i.high),
        (v, _) => fmt(v),
    }
}

fn counts(c: &trellis_reports::variance::Condition) -> String {
    match c.variance {
        Some(v) => format!(
            "{v:.3} ({}/{} in {} groups)",
            c.passed, c.outcomes, c.groups
        ),
        None => "–".to_owned(),
    }
}

fn row(table: &mut Table, name: &str, d: &Decomposition) {
    let user = if d.simulated {
        estimate(d.user, d.user_interval)
    } else {
        "n/a (no simulated turns)".to_owned()
    };
    table.add_row(vec![
        Cell::new(name),
        Cell::new(counts(&d.judge_condition)),
        Cell::new(counts(&d.agent_condition)),
        Cell::new(counts(&d.free_condition)),
        Cell::new(estimate(d.judge, d.judge_interval)),
        Cell::new(estimate(d.agent, d.agent_interval)),
        Cell::new(user),
        Cell::new(d.source.as_deref().unwrap_or("–")),
    ]);
}

fn print_table(report: &VarianceReport) {
    let mut table = Table::new();
    table.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
    table.set_header(vec![
        "scenario [agent]",
        "v(judge only)",
        "v(users replayed)",
        "v(free)",
        "judge",
        "agent",
        "user",
        "source",
    ]);
    for s in &report.scenarios {
        row(
            &mut table,
            &format!("{}/{} [{}]", s.suite, s.scenario, s.agent),
            &s.decomposition,
        );
    }
    row(&mut table, "overall", &report.overall);
    outln!("{table}");
    outln!(
        "variance of the pass indicator per condition (passed/outcomes in groups of \
         {} judgments or {} repetitions); judge = v(judge only), agent = v(users replayed) \
         − judge, user = v(free) − v(users replayed), differences below 0 set to 0; \
         [95% interval: {} resamples of a two-stage bootstrap over groups and outcomes, \
         seed fixed]",
        report.judge_repeats,
        report.repeats,
        trellis_reports::variance::RESAMPLES,
    );
    let clamped: Vec<String> = report
        .scenarios
        .iter()
        .filter(|s| !s.decomposition.clamped.is_empty())
        .map(|s| {
            format!(
                "{}/{}: {}",
                s.suite,
                s.scenario,
                s.decomposition.clamped.join(", ")
            )
        })
        .collect();
    if !clamped.is_empty() {
        outln!("clamped at 0 (sampling noise): {}", clamped.join("; "));
    }
}
