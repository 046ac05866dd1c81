//! `trellis run`: load, plan, execute with the journal, the result tables and the console as
//! reporters on the event stream, then write Parquet, HTML and JUnit.
//!
//! The results must survive what users do to a run: a closed console (see
//! [`super::console`]), Ctrl-C and SIGTERM (stop starting calls, give calls in flight a grace
//! period, write everything finished), a journal that cannot be written (the other files
//! are still written from the event stream) and an `--out` that holds an earlier run
//! (refused unless `--replace`).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::task::JoinHandle;
use trellis_engine::event::{self, Event};
use trellis_engine::execute::{self, RunOptions};
use trellis_engine::plan::Plan;
use trellis_engine::record::RunSummary;

use super::console::{Console, errln, outln};
use super::history;
use super::recorder::{Record, Recorded, source};
use super::resume::{Prepared, Resumed};
use super::shard;
use super::stop::{Signals, StopSignal, restore_default_signals};
use super::{EXIT_FAILED, EXIT_INCOMPLETE, EXIT_INVALID, EXIT_OK, MessageFormat, RunArgs};

/// How long agent calls in flight may take to finish once a run is told to stop.
const GRACE: Duration = Duration::from_secs(5);
/// How long the recorder naps when it has caught up with the run, and how many naps in a
/// row before it flushes and blocks until the next event: a run that is still busy hands
/// over its next events in batches, and an idle one has them on disk 2 ms later. The naps
/// are parks: the end of the run wakes the recorder from one (`execute_plan`).
const LINGER: Duration = Duration::from_micros(500);
const LINGER_ROUNDS: u32 = 4;
/// After the journal's flush, how much longer (in naps of [`QUIET`]) the recorder waits for
/// the next event before it calls the run quiet and has the tables write the rows they hold
/// ([`Record::quiet`]): long enough that a busy run whose thread was only descheduled for a
/// moment keeps its full-size row groups, short next to an agent's answer.
const QUIET: Duration = Duration::from_millis(1);
const QUIET_ROUNDS: u32 = 8;

pub fn run(args: RunArgs) -> u8 {
    let mut chosen = match shard::choose(args.shard, args.shards, &|name| std::env::var(name).ok())
    {
        Ok(chosen) => chosen,
        Err(e) => {
            errln!("{:?}", miette::Report::new(e));
            return EXIT_INVALID;
        }
    };
    if args.shard.is_none()
        && chosen.is_none()
        && args.resume.is_none()
        && let Some(job) = shard::gitlab_matrix_job(&|name| std::env::var(name).ok())
    {
        errln!(
            "note: {} and {} are those of GitLab `parallel: matrix` job `{job}`, not a \
             shard: the whole plan runs (pass --shard I/N to shard it)",
            shard::GITLAB_INDEX,
            shard::GITLAB_TOTAL
        );
    }
    // A shard resumes as the shard it started as, with the split it recorded.
    let recorded = match &args.resume {
        Some(dir) => match shard::recorded(dir) {
            Ok(recorded) => recorded,
            Err(message) => {
                errln!("error: {message}");
                return EXIT_INVALID;
            }
        },
        None => None,
    };
    if let Some(code) = resumed_shard(&args, recorded.as_ref(), &mut chosen) {
        return code;
    }
    if chosen.is_none() && args.shard_costs.is_some() {
        errln!(
            "error: --shard-costs balances the shards of a sharded run, and this run is not \
             sharded (--shard I/N)"
        );
        return EXIT_INVALID;
    }
    if let Some(chosen) = &chosen
        && args.baseline.is_some()
    {
        errln!(
            "error: shard {} (from {}) runs part of the plan, so it cannot be compared with a \
             whole run; gate the merged run instead: `trellis merge SHARD_DIR… --out DIR \
             --baseline{}` (docs/sharding.md), or pass --shard 1/1 to run the whole plan",
            chosen.shard,
            chosen.from,
            match args.baseline.as_deref() {
                Some("pinned") | None => String::new(),
                Some(run) => format!(" {run}"),
            }
        );
        return EXIT_INVALID;
    }
    // Started before the suites load; its answer completes run.json at the end of the run.
    let git = super::meta::GitProbe::start(
        args.paths
            .paths
            .first()
            .map_or(Path::new(super::DEFAULT_SUITES), PathBuf::as_path),
    );
    let Some(project) = super::load(&args.paths.paths) else {
        return EXIT_INVALID;
    };
    let Some(mut plan) = super::plan(&project, &args.select) else {
        return EXIT_INVALID;
    };
    if plan.scenarios.is_empty() {
        errln!(
            "error: {}",
            super::nothing_selected(&project, &args.select.selection())
        );
        return EXIT_INVALID;
    }
    // `--repeat N` in place of each scenario's own `repeat`: repetitions are the plan's.
    if let Some(n) = args.repeat {
        for scenario in &mut plan.scenarios {
            scenario.repeat = n;
        }
    }
    // What each trajectory means goes into the journal, for `--resume` to compare.
    trellis_engine::fingerprint::stamp(&project, &mut plan);
    let json = args.message_format == MessageFormat::Json;
    let mut run_id = new_run_id();
    let out = match (&args.resume, &args.out) {
        (Some(dir), _) | (None, Some(dir)) => dir.clone(),
        (None, None) => super::default_out_dir(&run_id),
    };
    // Resolved before the run, among the runs next to this one, so a typo fails at once.
    let runs_dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let baseline = match &args.baseline {
        Some(what) => match history::resolve_baseline(&runs_dir, what) {
            Ok(entry) => Some(entry),
            Err(code) => return code,
        },
        None => None,
    };
    // `trellis runs`, `compare` and watch take a directory of that name for watch's state.
    if args.resume.is_none()
        && out
            .file_name()
            .is_some_and(|n| n == trellis_reports::history::WATCH_LATEST)
    {
        errln!(
            "error: --out {} is named `{}`, where `trellis watch` keeps its state: a run \
             there would be hidden from `trellis runs` and `compare`, and rewritten by watch; \
             choose another name",
            out.display(),
            trellis_reports::history::WATCH_LATEST
        );
        return EXIT_INVALID;
    }
    // Watch's mirror is not a run either: it holds the last rerun's whole state under that
    // rerun's id, and watch clears it at its next rerun, so a run finished there would be
    // hidden from `trellis runs` and lost.
    if let Some(dir) = &args.resume
        && (dir
            .file_name()
            .is_some_and(|n| n == trellis_reports::history::WATCH_LATEST)
            || matches!(
                trellis_reports::history::RunMeta::read(dir),
                Ok(Some(meta)) if meta.watch_latest
            ))
    {
        errln!(
            "error: {} is where `trellis watch` mirrors its current state, not a run: it \
             cannot be resumed (watch rewrites it after every rerun); run `trellis watch` \
             again, or start a run with `trellis run --out DIR`",
            dir.display()
        );
        return EXIT_INVALID;
    }
    if let Err(message) = keeps_baseline(
        &out,
        baseline.as_ref(),
        args.replace && args.resume.is_none(),
    ) {
        errln!("error: {message}");
        return EXIT_INVALID;
    }
    // Split before the directory is claimed, so a named cost run that cannot be read
    // leaves nothing behind.
    let split = match (&chosen, recorded) {
        (Some(chosen), Some(split)) => {
            if let Err(difference) = shard::fits(&plan, &split) {
                errln!(
                    "error: shard {} cannot be resumed: the split it started with no longer \
                     fits the suites ({difference}); the shards of one run must share one \
                     split, so run every shard again with `--replace`",
                    chosen.shard
                );
                return EXIT_INVALID;
            }
            Some(split)
        }
        (Some(chosen), None) => {
            let costs = match shard::costs(&runs_dir, args.shard_costs.as_deref(), &plan) {
                Ok(costs) => costs,
                Err(message) => {
                    errln!("{message}");
                    return EXIT_INVALID;
                }
            };
            Some(trellis_engine::shard::split(
                &plan,
                chosen.shard.count(),
                chosen.shard.index(),
                costs.as_ref(),
            ))
        }
        (None, _) => None,
    };
    // Held until the run is over: a second run into the same directory is refused.
    let claim = match &args.resume {
        // Another --out is no answer to a resume: the run to finish is in this directory.
        Some(dir) => super::recorder::claim_run_dir(dir).map_err(|e| match e {
            super::recorder::ClaimError::Busy(_) => format!(
                "another trellis run is writing to {}; resume it once that run has ended \
                 (stopped with Ctrl-C, it keeps what it finished)",
                dir.display()
            ),
            other => other.to_string(),
        }),
        None => super::recorder::claim_out_dir(&out, args.replace, true),
    };
    let _claim = match claim {
        Ok(claim) => claim,
        Err(message) => {
            errln!("error: {message}");
            return EXIT_INVALID;
        }
    };
    // Cut down to the shard first: a resumed shard's journal is checked against its own
    // part of the plan.
    if let (Some(split), Some(chosen)) = (&split, &chosen) {
        shard::apply(&mut plan, split, chosen);
    }
    let mut resumed = None;
    if let Some(dir) = &args.resume {
        let console = Console::new(plan.trajectory_count(), args.quiet || json, json);
        match super::resume::prepare(dir, &plan, args.jobs, args.strict, console) {
            Ok(Prepared::AlreadyFinished { run_id, summary }) => {
                // Nothing of the edit would run: said, so it is not taken for a run of it.
                let suites_changed = matches!(
                    trellis_reports::history::RunMeta::read(dir),
                    Ok(Some(meta)) if !meta.suite_fingerprint.is_empty()
                        && meta.suite_fingerprint != super::meta::fingerprint(&project)
                );
                // Results written again from the journal need neither the plan nor the
                // suites: let go first, they were most of the memory of such a resume (a
                // dataset of 200,000 rows: 1.97 GB with them, where `trellis report` takes
                // 1.15), the case of a pod killed while it wrote its results.
                drop(plan);
                drop(project);
                let mut code = already_finished(dir, &run_id, &summary);
                if code == EXIT_OK
                    && chosen.is_none()
                    && let Some(why) = super::nothing_checked(&summary)
                {
                    errln!("warning: {why}");
                }
                let mut comparison = None;
                // With --baseline, the verdict is the comparison's, as when a run ends: a
                // CI step retried with `--resume` must give the gate's answer again.
                if let Some(base) = &baseline
                    && matches!(code, EXIT_OK | EXIT_FAILED)
                {
                    code = match compare_with(base, dir, None, &args.thresholds) {
                        Ok(Compared {
                            comparison: c,
                            written,
                        }) => {
                            // `report.html` links the comparison `compare.json` now holds.
                            if let Ok(Some(mut meta)) = trellis_reports::history::RunMeta::read(dir)
                                && meta.compared_with.as_deref() != Some(base.label())
                            {
                                meta.compared_with = Some(base.label().to_owned());
                                if let Err(e) = meta.write(dir) {
                                    errln!("warning: {e}: {}", source(&e));
                                }
                                // Its page names the baseline it links: written again.
                                if let Err(e) = trellis_reports::write_reports(
                                    dir,
                                    &trellis_reports::ReportOptions::default(),
                                ) {
                                    errln!("warning: {e}: {}", source(&e));
                                }
                            }
                            if !json {
                                outln!("");
                                history::print_comparison(&c);
                            }
                            let code = if !written {
                                EXIT_INCOMPLETE
                            } else if c.regressed {
                                EXIT_FAILED
                            } else {
                                EXIT_OK
                            };
                            comparison = Some(c);
                            code
                        }
                        Err(message) => {
                            errln!("error: cannot compare with the baseline: {message}");
                            EXIT_INCOMPLETE
                        }
                    };
                }
                if suites_changed {
                    errln!(
                        "note: the suites (or the files they read) changed since this run; a \
                         finished run is not run again: start a new run (without --resume) \
                         to run them as they are now"
                    );
                }
                // A script reads the stream's last line for the verdict, whatever ran.
                if json {
                    outln!(
                        "{}",
                        run_finished_json(
                            &run_id,
                            dir,
                            Some(&summary),
                            baseline.as_ref().map(|b| b.run_id.as_str()),
                            comparison.as_ref(),
                            code,
                        )
                    );
                }
                return code;
            }
            Ok(Prepared::Empty) => {
                if let Err((path, e)) = super::recorder::clear_results(dir) {
                    errln!("error: cannot remove {}: {e}", path.display());
                    return EXIT_INVALID;
                }
                if !json && !args.quiet {
                    errln!(
                        "the run in {} was stopped before it recorded anything: it starts \
                         over as run {run_id}",
                        dir.display()
                    );
                }
            }
            Ok(Prepared::Resume(r)) => {
                run_id.clone_from(&r.run_id);
                if !json && !args.quiet {
                    // Finished ones count the forks agents made beyond the plan: "58
                    // kept, the rest of 54" read as more done than planned.
                    errln!(
                        "resuming run {run_id} in {}: {} finished before and kept (forks \
                         the agents made included); what is left of the {} planned runs now",
                        dir.display(),
                        super::console::count(
                            r.finished.totals().trajectories,
                            "trajectory",
                            "trajectories"
                        ),
                        plan.trajectory_count()
                    );
                }
                resumed = Some(*r);
            }
            Err(message) => {
                errln!("error: {message}");
                return EXIT_INVALID;
            }
        }
    }
    if let Some(split) = &split {
        // Without it the shard cannot be merged: better not to spend the agent calls. A
        // resumed shard writes the split it read back.
        let path = out.join(trellis_engine::record::SHARD_PLAN_FILE);
        if let Err(e) = trellis_reports::write_json(&path, split) {
            errln!("error: {e}: {}", source(&e));
            return EXIT_INCOMPLETE;
        }
    }
    // A resumed run keeps the metadata it started with (its name, labels, pin, shard).
    let keep_meta = resumed.is_some()
        && trellis_reports::history::RunMeta::read(&out).is_ok_and(|m| m.is_some());
    // A kept run.json keeps its git state too: the probe is let go (and its processes
    // waited for) here.
    let git = git.filter(|_| !keep_meta);
    if !keep_meta {
        let mut meta = super::meta::build(
            &run_id,
            &project,
            &plan,
            &args.select.selection(),
            &args.labels,
        );
        if let (Some(split), Some(chosen)) = (&split, &chosen) {
            meta.shard = Some(trellis_reports::history::ShardMeta {
                index: chosen.shard.index(),
                count: chosen.shard.count(),
                digest: split.digest.clone(),
            });
        }
        meta.compared_with = baseline.as_ref().map(|b| b.label().to_owned());
        if let Err(e) = meta.write(&out) {
            // The run is still worth having without its metadata (a shard's is needed to
            // merge it, which says so then).
            errln!("warning: {e}: {}", source(&e));
        }
    } else if let Ok(Some(mut meta)) = trellis_reports::history::RunMeta::read(&out) {
        // A resumed run links the comparison it ends with: another baseline's, or none
        // when it is resumed without --baseline.
        let compared_with = baseline.as_ref().map(|b| b.label().to_owned());
        // And it is a run of the files as they are now: a resume may take rows appended
        // to a dataset, and the fingerprint the history matches runs by must change with
        // them (the resumed run of 2,420 rows read as one of the 2,400 it started with).
        let fingerprint = super::meta::fingerprint(&project);
        if meta.compared_with != compared_with || meta.suite_fingerprint != fingerprint {
            meta.compared_with = compared_with;
            if meta.suite_fingerprint != fingerprint {
                meta.suite_fingerprint = fingerprint;
                meta.source = Some(super::meta::source(&project, &args.select.selection()));
            }
            if let Err(e) = meta.write(&out) {
                errln!("warning: {e}: {}", source(&e));
            }
        }
    }
    let replay_users = match &args.replay_users {
        Some(what) => match load_user_replay(&runs_dir, what, None) {
            Ok(replay) => Some(replay),
            Err(code) => return code,
        },
        None => None,
    };
    let (jobs, lowered) = crate::descriptors::jobs_within_limit(
        args.jobs,
        crate::descriptors::AgentDescriptors::of(project.agents.iter().map(|a| &a.endpoint)),
    );
    if let Some(why) = lowered {
        errln!("warning: {why}");
    }
    let settings = Settings {
        replay_users,
        jobs,
        quiet: args.quiet || json,
        silent: json,
        strict: args.strict,
        json_events: json,
        llm_cache: llm_cache(args.llm_cache.as_deref(), args.llm_cache_mode),
        llm_budget: trellis_engine::llm::meter::Budget {
            max_calls: args.max_llm_calls,
            max_cost: args.max_llm_cost,
        },
        otlp_receiver: args.otlp_receiver,
        otlp_endpoint: args.otlp_endpoint.clone(),
        spans_wait: args.spans_wait,
        spans_grace: args.spans_grace,
        signals: None,
        sites: Some(std::sync::Arc::new(super::sites::Sites::of(
            &plan, &project,
        ))),
    };
    let fresh = resumed.is_none();
    // Where the scenarios are written, for a GitHub workflow's annotations (nothing outside
    // one).
    let locations = super::github::Locations::of(&plan, &project);
    // The plan holds what the run needs of the suites; the rest (the files' text, the
    // datasets' rows) would be held for nothing until the process exits.
    drop(project);
    let outcome = match execute_plan(plan, &run_id, &out, &settings, resumed, git) {
        Ok(outcome) => outcome,
        Err(message) => {
            errln!("error: {message}");
            if fresh {
                // Nothing ran (a receiver port taken, an OTLP setting refused): the
                // directory must not be listed as a run that never finished.
                abandon(&out, _claim);
            }
            return EXIT_INVALID;
        }
    };
    // A partial merge finished with --resume covers its plan now: its run.json says so.
    if !fresh
        && outcome
            .stats
            .as_ref()
            .is_some_and(|s| s.aggregates.finished && !s.aggregates.interrupted)
    {
        complete_partial_merge(&out);
    }
    let mut exit_code = outcome.exit_code;
    // A shard is part of a run: `merge` says whether the whole checked anything.
    if exit_code == EXIT_OK
        && chosen.is_none()
        && let Some(why) = outcome.summary.as_ref().and_then(super::nothing_checked)
    {
        errln!("warning: {why}");
    }
    let mut comparison = None;
    if let Some(base) = &baseline {
        match compare_with(base, &out, outcome.stats.as_ref(), &args.thresholds) {
            Ok(Compared {
                comparison: c,
                written,
            }) => {
                if !json {
                    outln!("");
                    history::print_comparison(&c);
                }
                // The comparison decides, unless the run itself did not finish its work.
                if matches!(exit_code, EXIT_OK | EXIT_FAILED) {
                    exit_code = if !written {
                        EXIT_INCOMPLETE
                    } else if c.regressed {
                        EXIT_FAILED
                    } else {
                        EXIT_OK
                    };
                }
                comparison = Some(c);
            }
            Err(message) => {
                errln!("error: cannot compare with the baseline: {message}");
                if matches!(exit_code, EXIT_OK | EXIT_FAILED) {
                    exit_code = EXIT_INCOMPLETE;
                }
                forget_comparison(&out);
            }
        }
    }
    if let (Some(locations), Some(stats)) = (&locations, &outcome.stats) {
        super::github::report(
            locations,
            stats,
            &out,
            baseline
                .as_ref()
                .map(|b| b.label())
                .zip(comparison.as_ref()),
            json,
        );
    }
    // A signal while the results of a run that ended by itself were written: they are
    // complete, and the exit code says the command was asked to stop.
    if let Some(signal) = super::stop::late_signal() {
        errln!(
            "the run was {} while its results were written: every trajectory finished, and \
             the results are complete",
            signal.name()
        );
        exit_code = signal.exit_code();
    }
    if json {
        let mut event = run_finished_json(
            &run_id,
            &out,
            outcome.summary.as_ref(),
            baseline.as_ref().map(|b| b.run_id.as_str()),
            comparison.as_ref(),
            exit_code,
        );
        event["shard"] = serde_json::json!(chosen.as_ref().map(|c| c.shard.to_string()));
        outln!("{event}");
    }
    // The statistics of every scenario, kept for the comparison and the summary: the
    // process exits next, and freeing those of a large run is not worth waiting for.
    if outcome
        .stats
        .as_ref()
        .is_some_and(|s| trellis_reports::is_large(s.scenarios.len()))
    {
        trellis_reports::dispose(Box::new(outcome));
    }
    exit_code
}

/// Reconciles `--resume DIR` with sharding: a shard directory (`recorded`, its
/// `shard.json`) resumes as that shard, which the flags and a runner's variables may repeat
/// but not contradict; a whole run is not resumed as a shard. `Some` is the exit code of a
/// refusal, already said.
fn resumed_shard(
    args: &RunArgs,
    recorded: Option<&trellis_engine::record::ShardPlan>,
    chosen: &mut Option<shard::Chosen>,
) -> Option<u8> {
    let dir = args.resume.as_ref()?;
    match (recorded, chosen.as_ref()) {
        (Some(split), Some(c))
            if (c.shard.index(), c.shard.count()) != (split.index, split.count) =>
        {
            errln!(
                "error: {} holds shard {}/{} of its run, and {} says shard {}; resume it as \
                 the shard it is (leave out --shard, or unset the runner's variables)",
                dir.display(),
                split.index,
                split.count,
                c.from,
                c.shard
            );
            Some(EXIT_INVALID)
        }
        (Some(_), _) if args.shard_costs.is_some() => {
            errln!(
                "error: a resumed shard keeps the split it started with (its shard.json); \
                 leave out --shard-costs"
            );
            Some(EXIT_INVALID)
        }
        // `--shard 1/1` asks for the whole plan (`shard::choose` gives no shard for it):
        // a shard's directory holds part of one.
        (Some(split), None) if args.shard.is_some() => {
            errln!(
                "error: {} holds shard {}/{} of its run, and --shard says the whole plan; \
                 resume it as the shard it is (leave out --shard)",
                dir.display(),
                split.index,
                split.count
            );
            Some(EXIT_INVALID)
        }
        (Some(split), None) => match trellis_engine::shard::Shard::new(split.index, split.count) {
            Ok(shard) => {
                *chosen = Some(shard::Chosen {
                    shard,
                    from: format!(
                        "{}",
                        dir.join(trellis_engine::record::SHARD_PLAN_FILE).display()
                    ),
                });
                None
            }
            Err(e) => {
                errln!(
                    "error: {}: {:?}",
                    dir.join(trellis_engine::record::SHARD_PLAN_FILE).display(),
                    miette::Report::new(e)
                );
                Some(EXIT_INVALID)
            }
        },
        (None, Some(c)) if trellis_engine::journal::find(dir).is_some() => {
            errln!(
                "error: {} holds a whole run (it has no {}), and {} says shard {}; resume it \
                 as the whole run it is (leave out --shard, or unset the runner's variables)",
                dir.display(),
                trellis_engine::record::SHARD_PLAN_FILE,
                c.from,
                c.shard
            );
            Some(EXIT_INVALID)
        }
        _ => None,
    }
}

/// `--resume` of a run that reached its end: nothing runs. Its results files are written
/// again from the journal if any is missing (a run killed while writing them).
fn already_finished(dir: &Path, run_id: &str, summary: &RunSummary) -> u8 {
    errln!(
        "run {run_id} in {} already finished ({}: {} passed, {} failed, {}, {} skipped); \
         nothing to run",
        dir.display(),
        super::console::count(summary.trajectories, "trajectory", "trajectories"),
        summary.passed,
        summary.failed,
        super::console::count(summary.errors, "error", "errors"),
        summary.skipped
    );
    let optional = [
        trellis_engine::journal::JOURNAL_FILE,
        trellis_engine::record::SHARD_PLAN_FILE,
        trellis_engine::journal::PLAIN_FILE,
        trellis_reports::history::RUN_META_FILE,
        trellis_reports::COMPARE_FILE,
        trellis_reports::COMPARE_HTML_FILE,
        trellis_reports::calibration::CALIBRATION_FILE,
    ];
    let missing: Vec<&str> = trellis_reports::RESULT_FILES
        .into_iter()
        .filter(|name| !optional.contains(name) && !dir.join(name).is_file())
        .collect();
    // The run's verdict, as when it ended: a pod restarted after its shard finished
    // reports what the shard found.
    let verdict = if summary.failed == 0 && summary.errors == 0 {
        EXIT_OK
    } else {
        EXIT_FAILED
    };
    if missing.is_empty() {
        return verdict;
    }
    match trellis_reports::write_reports(dir, &trellis_reports::ReportOptions::default()) {
        Ok(files) if files.not_written.is_empty() => {
            errln!(
                "its results files were missing ({}) and were written again from the journal",
                missing.join(", ")
            );
            verdict
        }
        Ok(files) => {
            errln!("error: results are incomplete:");
            for (path, e) in &files.not_written {
                errln!("  - {} was not written: {e}: {}", path.display(), source(e));
            }
            EXIT_INCOMPLETE
        }
        Err(e) => {
            errln!("error: {e}: {}", source(&e));
            EXIT_INCOMPLETE
        }
    }
}

/// Compares the finished run in `out` with `base` and writes `compare.json` next to it.
/// Refuses a run that would destroy or become its own baseline: `--replace` of the pinned
/// run's directory deletes the baseline before the run starts, and a run recorded in the
/// directory `--baseline` names is then compared with itself (it always "passes").
pub(super) fn keeps_baseline(
    out: &Path,
    baseline: Option<&trellis_reports::history::RunEntry>,
    replacing: bool,
) -> Result<(), String> {
    if let Some(base) = baseline
        && trellis_reports::history::same_dir(&base.dir, out)
    {
        return Err(format!(
            "{} is the baseline this run is compared with (run {}): a run recorded there \
             would be compared with itself; choose another --out (without --out every run \
             gets its own runs/<run-id>)",
            out.display(),
            base.label()
        ));
    }
    if replacing
        && trellis_reports::history::is_run_dir(out)
        && let Ok(run) = trellis_reports::history::read_run(out)
    {
        if run.baseline {
            return Err(format!(
                "{} holds the pinned baseline (run {}); --replace would delete it. Choose \
                 another --out, or unpin it first: trellis runs unpin {}",
                out.display(),
                run.label(),
                out.display()
            ));
        }
        // A name is what `--baseline NAME` and `compare NAME` find the run by: said, so a
        // gate that names it later is not left wondering where it went.
        if let Some(name) = &run.name {
            errln!(
                "warning: --replace deletes run {} named `{name}`; the name goes with it \
                 (`trellis runs name RUN {name}` gives it to another run)",
                run.run_id
            );
        }
    }
    Ok(())
}

/// The run's LLM cache (`--llm-cache DIR`, `--llm-cache-mode`), with a warning when it
/// cannot do its job: the run goes on, and its calls are made and paid as without one.
pub(super) fn llm_cache(
    dir: Option<&Path>,
    mode: super::LlmCacheMode,
) -> trellis_engine::llm::LlmCache {
    let Some(dir) = dir else {
        return trellis_engine::llm::LlmCache::disabled();
    };
    let cache = trellis_engine::llm::LlmCache::new(dir, cache_mode(mode));
    if let Some(why) = cache.unusable() {
        errln!(
            "warning: --llm-cache: {why}; LLM calls are neither replayed from it nor kept \
             (each judge and simulated-user call is made, and paid, as without a cache)"
        );
    }
    cache
}

pub(super) fn compare_with(
    base: &trellis_reports::history::RunEntry,
    out: &Path,
    head_stats: Option<&trellis_reports::stats::RunStats>,
    thresholds: &history::ThresholdArgs,
) -> Result<Compared, String> {
    let head = trellis_reports::history::read_run(out).map_err(|e| e.to_string())?;
    let base_stats = trellis_reports::history::run_stats(&base.dir)
        .map_err(|e| format!("{e}: {}", source(&e)))?;
    let head_stats = match head_stats {
        Some(stats) => stats.clone(),
        None => trellis_reports::stats::RunStats::from_run_dir(out)
            .map_err(|e| format!("{e}: {}", source(&e)))?,
    };
    let comparison = trellis_reports::compare::compare(
        &base_stats,
        history::run_ref(base),
        &head_stats,
        history::run_ref(&head),
        thresholds.thresholds(),
        history::untrusted_judges(&[&base.dir, out])?,
        history::turn_latencies(&base.dir, out).as_ref(),
    );
    // Each is a results file: one not written makes the run's results incomplete (exit 3),
    // whatever the gate's verdict, and the others are still written.
    let mut written = true;
    let mut failed = |e: &dyn std::error::Error| {
        errln!("error: {e}: {}", source(e));
        written = false;
    };
    let path = out.join(trellis_reports::COMPARE_FILE);
    if let Err(e) = trellis_reports::write_json(&path, &comparison) {
        failed(&e);
    }
    if let Err(e) = trellis_reports::add_gate_to_junit(out, base.label(), &comparison) {
        failed(&e);
    }
    if let Err(e) = trellis_reports::add_gate_to_report(out, base.label(), &comparison) {
        failed(&e);
    }
    let page = trellis_reports::ComparePage::from(&comparison);
    let path = out.join(trellis_reports::COMPARE_HTML_FILE);
    if let Err(e) = trellis_reports::write_compare(&path, &page) {
        failed(&e);
    }
    Ok(Compared {
        comparison,
        written,
    })
}

/// A comparison with the baseline, and whether every file that records it was written.
pub(super) struct Compared {
    pub comparison: trellis_reports::compare::Comparison,
    /// `compare.json`, `compare.html` and the gate in `junit.xml` and `report.html`.
    pub written: bool,
}

/// A comparison that could not be made is not linked by a report rebuilt later
/// (`trellis report`); the page written with the run links a missing `compare.html`, as the
/// console's exit code 3 says.
pub(super) fn forget_comparison(out: &Path) {
    if let Ok(Some(mut meta)) = trellis_reports::history::RunMeta::read(out)
        && meta.compared_with.take().is_some()
        && let Err(e) = meta.write(out)
    {
        errln!("warning: {e}: {}", source(&e));
    }
}

/// `--llm-cache-mode` as the engine's cache mode.
pub(super) fn cache_mode(mode: super::LlmCacheMode) -> trellis_engine::llm::CacheMode {
    match mode {
        super::LlmCacheMode::ReadWrite => trellis_engine::llm::CacheMode::ReadWrite,
        super::LlmCacheMode::Off => trellis_engine::llm::CacheMode::Off,
        super::LlmCacheMode::ReplayOnly => trellis_engine::llm::CacheMode::ReplayOnly,
    }
}

/// Starts the OTLP span receiver when `--otlp-receiver` asks for one or an agent has
/// `spans #true` (then on a free port of 127.0.0.1).
fn start_receiver(
    runtime: &tokio::runtime::Runtime,
    plan: &Plan,
    settings: &Settings,
) -> Result<Option<std::sync::Arc<trellis_engine::otel::SpanReceiver>>, String> {
    let wanted = plan.agents.iter().any(|a| a.spans);
    let addr = match settings.otlp_receiver {
        Some(addr) => addr,
        None if wanted => std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        None => return Ok(None),
    };
    // Builtins are handed the address; a given one, or agents of the user's own, need telling.
    let tell = settings.otlp_receiver.is_some() || own_agents_send_spans(plan);
    let receiver = runtime.block_on(start_span_receiver(addr, tell && !settings.silent))?;
    Ok(Some(std::sync::Arc::new(receiver)))
}

/// Whether an agent of the user's own (not a builtin) has `spans #true`: it must be told
/// where the run's span receiver listens.
pub(super) fn own_agents_send_spans(plan: &Plan) -> bool {
    plan.agents
        .iter()
        .any(|a| a.spans && !matches!(a.endpoint, trellis_dsl::model::Endpoint::Builtin(_)))
}

/// Starts a span receiver on `addr`, for `run` and `watch`, and with `tell` says where it
/// listens (for the agents' OTEL_EXPORTER_OTLP_ENDPOINT).
pub(super) async fn start_span_receiver(
    addr: std::net::SocketAddr,
    tell: bool,
) -> Result<trellis_engine::otel::SpanReceiver, String> {
    let receiver = trellis_engine::otel::SpanReceiver::start(addr)
        .await
        .map_err(|e| {
            format!("{e}\n  help: pick another address with --otlp-receiver ADDR (port 0: any free port)")
        })?;
    if tell {
        errln!(
            "OTLP receiver for agent spans: {} (set the agents' OTEL_EXPORTER_OTLP_ENDPOINT to it)",
            receiver.endpoint()
        );
    }
    Ok(receiver)
}

/// A benchmark (nothing on the console, no JSON events either): it measures the engine, so
/// it never exports, whatever OTEL_EXPORTER_OTLP_* say.
fn is_benchmark(settings: &Settings) -> bool {
    settings.silent && !settings.json_events
}

/// How [`execute_plan`] runs and reports.
pub struct Settings {
    /// `--replay-users`: the recorded simulated users to replay.
    pub replay_users: Option<std::sync::Arc<trellis_engine::execute::UserReplay>>,
    /// Agent calls in flight at once.
    pub jobs: usize,
    /// No progress output, only the summary.
    pub quiet: bool,
    /// Nothing on the console at all (benchmarks).
    pub silent: bool,
    /// A check or trajectory that did not run fails its trajectory.
    pub strict: bool,
    /// `--message-format json`: `run_started` and `trajectory_finished` lines on stdout.
    pub json_events: bool,
    /// The LLM response cache (`--llm-cache`, `--llm-cache-mode`).
    pub llm_cache: trellis_engine::llm::LlmCache,
    /// `--max-llm-calls`, `--max-llm-cost`.
    pub llm_budget: trellis_engine::llm::meter::Budget,
    /// `--otlp-receiver`: where to receive the agents' spans.
    pub otlp_receiver: Option<std::net::SocketAddr>,
    /// `--otlp-endpoint`: where to export the run's own spans (else OTEL_EXPORTER_OTLP_*).
    pub otlp_endpoint: Option<String>,
    /// `--spans-wait`, `--spans-grace`.
    pub spans_wait: std::time::Duration,
    pub spans_grace: std::time::Duration,
    /// The caller watches SIGINT/SIGTERM for a command of several runs (`variance`): the
    /// run stops on the relay's signals and leaves the handlers installed. `None`: the run
    /// watches for itself and restores the default dispositions at its end.
    pub signals: Option<super::stop::SignalRelay>,
    /// Where the suites write each check, for the failures the console lists.
    pub sites: Option<std::sync::Arc<super::sites::Sites>>,
}

pub struct Outcome {
    pub exit_code: u8,
    pub summary: Option<RunSummary>,
    /// CPU seconds of the reporter thread: journal, tables, HTML, JUnit (for `bench`).
    pub report_cpu: f64,
    /// The run's statistics, when its reports were written.
    pub stats: Option<trellis_reports::stats::RunStats>,
}

/// Runs a plan into `out` and writes every report. Shared by `run` and `bench`. `Err` means
/// nothing ran (the run directory or the runtime could not be set up).
///
/// The engine runs on this thread's runtime; every reporter (journal, tables, console) runs
/// on a thread of its own fed by the event stream, so writing results never delays an agent
/// call and never inflates a measured latency.
/// A run `trellis merge --allow-partial` made, and `--resume` has just finished: it is no
/// longer missing anything (`trellis runs` stops calling it a partial merge).
fn complete_partial_merge(out: &Path) {
    use trellis_reports::history::RunMeta;
    let Ok(Some(mut meta)) = RunMeta::read(out) else {
        return;
    };
    let Some(merged) = meta.merged.as_mut().filter(|m| m.partial) else {
        return;
    };
    merged.partial = false;
    merged.missing = 0;
    if let Err(e) = meta.write(out) {
        errln!("warning: {e}: {}", source(&e));
    }
}

/// Removes what a run that never started wrote in `out` (its `run.json`, a shard's
/// `shard.json`), then `out` itself when nothing else is in it.
fn abandon(out: &Path, claim: super::recorder::OutClaim) {
    for name in [
        trellis_reports::history::RUN_META_FILE,
        trellis_engine::record::SHARD_PLAN_FILE,
    ] {
        let _ = std::fs::remove_file(out.join(name));
    }
    // The lock file goes with the claim; a directory with anything else in it stays.
    drop(claim);
    let _ = std::fs::remove_dir(out);
}

/// Runs `plan` into `out`; `git`, when given, is asked at the end for the suites' git
/// state, which `run.json` and the results record.
pub fn execute_plan(
    plan: Plan,
    run_id: &str,
    out: &Path,
    settings: &Settings,
    resumed: Option<Resumed>,
    git: Option<super::meta::GitProbe>,
) -> Result<Outcome, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    // Before the run directory is written: a receiver that cannot listen stops the run
    // before anything of it exists.
    let export = if is_benchmark(settings) {
        None
    } else {
        trellis_engine::otel::export::ExportConfig::resolve(
            settings.otlp_endpoint.as_deref(),
            |name| std::env::var(name).ok(),
        )
        .map_err(|e| {
            use trellis_engine::otel::export::ExportConfigError as E;
            match e {
                E::BadEndpoint(_) | E::Protocol { .. } => format!(
                    "{e}\n  help: give --otlp-endpoint http://HOST:4318 (OTLP/HTTP, protobuf)"
                ),
                E::BadHeader { .. }
                | E::BadTimeout { .. }
                | E::BadCompression { .. }
                | E::Credentials(_)
                | E::BadResource { .. } => e.to_string(),
            }
        })?
    };
    let receiver = start_receiver(&runtime, &plan, settings)?;
    let trace = trellis_engine::transport::trace::RunTrace::from_env();
    // A resumed run's clock goes on from its earlier sessions', as its turns count.
    let earlier = resumed.as_ref().map(|r| r.finished.elapsed());
    let exporter = export.map(|config| {
        let warn: std::sync::Arc<dyn Fn(&str) + Send + Sync> =
            std::sync::Arc::new(|why: &str| errln!("warning: {why}"));
        let mut exporter =
            trellis_engine::otel::export::SpanExporter::start(config, trace.clone(), warn);
        if let Some(earlier) = earlier {
            exporter.resumed_after(earlier);
        }
        exporter
    });
    let silent = settings.silent;
    let (record, console, resume, started) = match resumed {
        Some(r) => (
            Record::resumed(out, r.journal, r.agents),
            r.console,
            Some(r.finished),
            Some((r.started_at, r.resumed_at)),
        ),
        None => (
            Record::create(out)?,
            Console::new(plan.trajectory_count(), settings.quiet, silent),
            None,
            None,
        ),
    };
    let mut console = console;
    console.set_sites(settings.sites.clone());
    let reporter = Reporter {
        record,
        console,
        summary: None,
        json_events: settings.json_events,
        export: exporter,
        held: Vec::new(),
        started,
    };
    let options = RunOptions {
        telemetry: trellis_engine::otel::Telemetry {
            trace: Some(trace),
            receiver: receiver.clone(),
            receiver_given: settings.otlp_receiver.is_some(),
            notices: receiver
                .as_ref()
                .filter(|_| !settings.silent)
                .map(|r| super::console::spans_notices(r.endpoint())),
            spans_wait: settings.spans_wait,
            spans_grace: settings.spans_grace,
        },
        run_id: run_id.to_string(),
        jobs: settings.jobs,
        stop: Default::default(),
        abandon: Default::default(),
        grace_end: Default::default(),
        strict: settings.strict,
        reuse: None,
        transport: None,
        llm_cache: settings.llm_cache.clone(),
        launcher: Some(std::sync::Arc::new(super::launcher())),
        resume,
        replay_users: settings.replay_users.clone(),
        first: Vec::new(),
        llm_budget: settings.llm_budget,
    };
    let stop = options.stop.clone();
    let abandon = options.abandon.clone();
    let grace_end = options.grace_end.clone();
    let (tx, mut rx) = event::channel();
    let reporter = std::thread::Builder::new()
        .name("trellis-reporter".into())
        .spawn(move || {
            let mut reporter = reporter;
            reporter.record.flush_when_idle();
            let mut lingered = 0;
            loop {
                let event = match rx.try_recv() {
                    Ok(event) => {
                        lingered = 0;
                        event
                    }
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty)
                        if lingered < LINGER_ROUNDS =>
                    {
                        // A busy run's next events are moments away. Napping for them lets
                        // the executor queue them without waking this thread for each one
                        // (a futex wake per trajectory on the run's thread) and the journal
                        // is flushed once per batch rather than per trajectory.
                        lingered += 1;
                        std::thread::park_timeout(LINGER);
                        continue;
                    }
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty)
                        if lingered < LINGER_ROUNDS + QUIET_ROUNDS =>
                    {
                        if lingered == LINGER_ROUNDS {
                            // Caught up: what was recorded becomes readable on disk, and
                            // is said.
                            reporter.record.idle();
                            reporter.release();
                            reporter.console.flush_lines();
                        }
                        lingered += 1;
                        std::thread::park_timeout(QUIET);
                        continue;
                    }
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                        // Quiet: the run waits on its agents, and the tables' work is done
                        // now rather than at its end. Then wait for more.
                        reporter.record.quiet();
                        match rx.blocking_recv() {
                            Some(event) => event,
                            None => break,
                        }
                    }
                    Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => break,
                };
                reporter.on_event(event);
            }
            reporter.record.idle();
            reporter.release();
            reporter.console.flush_lines();
            (reporter, super::bench::thread_cpu_time())
        })
        .map_err(|e| format!("cannot start the reporter thread: {e}"))?;

    super::bench::phases::mark(super::bench::phases::Phase::Run);
    let stopped_by = runtime.block_on(async {
        let mut signals = settings
            .signals
            .as_ref()
            .map_or_else(Signals::watch, super::stop::SignalRelay::signals);
        let mut engine = execute::spawn(plan, options, tx);
        let first = tokio::select! {
            finished = &mut engine => {
                engine_ended(finished);
                return None;
            }
            signal = signals.next() => signal,
        };
        // Graceful first: no new agent call starts, calls in flight may finish and their
        // trajectories are recorded. A second signal or the end of the grace period cuts
        // the rest off.
        grace_end.set(tokio::time::Instant::now() + GRACE);
        stop.cancel();
        if !silent {
            errln!(
                "{}: stopping: no new agent call starts, calls in flight get {}s to finish, \
                 finished trajectories are kept and reported (signal again to stop at once)",
                first.name(),
                GRACE.as_secs()
            );
        }
        tokio::select! {
            finished = &mut engine => engine_ended(finished),
            () = tokio::time::sleep(GRACE) => {
                if !silent {
                    errln!("calls still in flight after {}s are abandoned", GRACE.as_secs());
                }
                abandon_calls(engine, &abandon, &mut signals).await;
            }
            again = signals.next() => {
                if !silent {
                    errln!("{} again: stopping now", again.name());
                }
                abandon_calls(engine, &abandon, &mut signals).await;
            }
        }
        Some(first)
    });
    super::bench::phases::mark(super::bench::phases::Phase::Ran);
    // Dropping the runtime drops every task still holding an event sender, which ends the
    // reporter's stream; agent tasks of an aborted run are not waited for.
    runtime.shutdown_background();
    // The recorder may be in one of its naps: woken, it finds the stream ended instead of
    // sleeping out the nap at the end of every run.
    reporter.thread().unpark();
    if settings.signals.is_none() {
        match stopped_by {
            // Stopped once already: the next signal is the "again" that stops at once.
            Some(_) => restore_default_signals(),
            None => super::stop::finish_results_through_signals(),
        }
    }
    let Ok((reporter, mut report_cpu)) = reporter.join() else {
        errln!(
            "error: trellis failed while reporting (a bug); results are incomplete: \
             `trellis report {}` rebuilds them from the journal",
            out.display()
        );
        return Ok(Outcome {
            exit_code: stopped_by.map_or(EXIT_INCOMPLETE, StopSignal::exit_code),
            summary: None,
            report_cpu: 0.0,
            stats: None,
        });
    };
    let Reporter {
        mut record,
        mut console,
        summary,
        export,
        ..
    } = reporter;
    // run.json was written without the git state, so that the run did not wait on `git`:
    // it is completed now, on disk and for the results.
    if let Some(state) = git.and_then(super::meta::GitProbe::finish) {
        if let Ok(Some(mut meta)) = trellis_reports::history::RunMeta::read(out) {
            meta.git = Some(state.clone());
            if let Err(e) = meta.write(out) {
                errln!("warning: {e}: {}", source(&e));
            }
        }
        record.set_git(state);
    }
    // What could not be written, said once at the end.
    let cpu_before_finish = super::bench::thread_cpu_time();
    let Recorded {
        journal_path,
        files,
        problems,
    } = record.finish();
    report_cpu += super::bench::thread_cpu_time() - cpu_before_finish;
    super::bench::phases::mark(super::bench::phases::Phase::Reported);
    if let Some(files) = &files {
        console.finish(summary.as_ref(), out, journal_path.as_deref(), files);
    }
    // The console's counts hold every scenario's names: freed aside for a large run, as
    // the report's are (30 ms of a 100,000-row dataset's end, before the exit).
    if files
        .as_ref()
        .is_some_and(|f| trellis_reports::is_large(f.stats.scenarios.len()))
    {
        trellis_reports::dispose(Box::new(console));
    }
    if let Some(signal) = stopped_by
        && !silent
    {
        if summary.as_ref().is_some_and(|s| !s.interrupted) {
            // The signal came as the last calls answered: nothing was cut off.
            errln!(
                "the run was {} as it ended: every trajectory finished and is reported",
                signal.name()
            );
        } else {
            errln!(
                "the run was {} before its end: only finished trajectories are reported; \
                 `trellis run … --resume {}` finishes it",
                signal.name(),
                super::console::shell_word(out)
            );
        }
    }
    // After the results are written: a collector that is slow or down held every results
    // file back for its wait, and a second signal in it left none written. Bounded
    // (FLUSH_TIMEOUT), and cut short by a signal.
    if let Some(export) = export {
        let sent = export.finish(&|| super::stop::late_signal().is_some());
        if !silent && sent.failure.is_none() && sent.dropped == 0 {
            errln!("OTLP export: {} spans sent", sent.sent);
        } else if !silent && sent.unconfirmed > 0 {
            errln!(
                "OTLP export: {} spans sent, {} dropped, {} not confirmed",
                sent.sent,
                sent.dropped,
                sent.unconfirmed
            );
        } else if !silent {
            // Why was said in the warning, when it happened.
            errln!(
                "OTLP export: {} spans sent, {} dropped",
                sent.sent,
                sent.dropped
            );
        }
    }

    let budget = summary.as_ref().and_then(|s| s.stopped_by.as_deref());
    if let Some(reason) = budget
        && !silent
    {
        errln!(
            "the run stopped early: {reason}; calls in flight finished, only finished \
             trajectories are reported"
        );
    }
    if !problems.is_empty() {
        errln!("error: results are incomplete:");
        for problem in &problems {
            errln!("  - {problem}");
        }
    }
    let exit_code = match stopped_by {
        Some(signal) => signal.exit_code(),
        None if !problems.is_empty() => EXIT_INCOMPLETE,
        None if budget.is_some() => super::EXIT_BUDGET,
        None => match &summary {
            Some(s) if s.failed == 0 && s.errors == 0 => EXIT_OK,
            _ => EXIT_FAILED,
        },
    };
    Ok(Outcome {
        exit_code,
        summary,
        report_cpu,
        stats: files.map(|f| f.stats),
    })
}

/// `--replay-users RUN`: the run (directory, id or name among the runs in `runs_dir`) read
/// for its simulated users; `pin` replays that recorded repetition for every repetition.
/// `Err` is the exit code of a refusal, already said.
pub fn load_user_replay(
    runs_dir: &Path,
    what: &str,
    pin: Option<u32>,
) -> Result<std::sync::Arc<trellis_engine::execute::UserReplay>, u8> {
    let entry = history::resolve(runs_dir, what)?;
    let path = trellis_engine::journal::path_in(&entry.dir);
    let entries = match trellis_engine::journal::read(&path) {
        Ok(entries) => entries,
        Err(e) => {
            errln!("error: {e}: {}", path.display());
            return Err(EXIT_INVALID);
        }
    };
    let mut replay = trellis_engine::execute::UserReplay::from_entries(entries);
    if let Some(pin) = pin {
        replay = replay.pin(pin);
    }
    if replay.is_empty() {
        errln!(
            "error: {} recorded no trajectory: there is no user to replay",
            entry.dir.display()
        );
        return Err(EXIT_INVALID);
    }
    Ok(std::sync::Arc::new(replay))
}

fn engine_ended(finished: Result<RunSummary, tokio::task::JoinError>) {
    if let Err(e) = finished
        && e.is_panic()
    {
        // Units catch their own panics; this is one outside them. The run has no summary,
        // so it exits 1 and reports what the journal holds.
        errln!("error: trellis failed while running (a bug): {e}");
    }
}

/// Drops the calls still in flight: the engine ends at once with what finished and records
/// the run's end (`interrupted`), so the stop reads as a stop and not as a crash. An engine
/// that does not end soon after (an agent process that will not die) is aborted, and the
/// journal is left without an end, as after a kill.
async fn abandon_calls(
    mut engine: JoinHandle<RunSummary>,
    abandon: &tokio_util::sync::CancellationToken,
    signals: &mut Signals,
) {
    abandon.cancel();
    tokio::select! {
        finished = &mut engine => engine_ended(finished),
        // One more signal does not wait for the run's end to be recorded.
        _ = signals.next() => {
            engine.abort();
            let _ = engine.await;
        }
        () = tokio::time::sleep(ABANDON_GRACE) => {
            engine.abort();
            let _ = engine.await;
        }
    }
}

/// How long an engine told to drop its calls may take to record the run's end.
const ABANDON_GRACE: Duration = Duration::from_secs(3);

/// Events held for the journal's flush at most ([`Reporter::held`]): past it the journal is
/// flushed at once (a flush per 256 trajectories costs nothing a turn shows).
const MAX_HELD: usize = 256;

/// Everything that consumes the event stream: the run's [`Record`] (journal first, then the
/// result tables), then the console.
struct Reporter {
    record: Record,
    console: Console,
    summary: Option<RunSummary>,
    json_events: bool,
    /// `--otlp-endpoint`: the run's own spans, built from the same events.
    export: Option<trellis_engine::otel::export::SpanExporter>,
    /// Events recorded in the journal but not yet flushed to disk: said (on the console,
    /// as JSON lines) once they are, so that nothing is reported finished that a `kill -9`
    /// would lose. At most the recorder's batching window (100 ms) of them.
    held: Vec<Event>,
    /// A resumed run's first start and later attempts' (its journal's): its own start event
    /// says them, as `runs.parquet` and the journal do, not this attempt's start alone.
    started: Option<(String, Vec<String>)>,
}

impl Reporter {
    fn on_event(&mut self, event: Event) {
        let event = match (event, self.started.take()) {
            (Event::RunStarted(info), Some((started_at, resumed_at))) => {
                let mut info = trellis_engine::record::RunInfo::clone(&info);
                info.started_at = started_at;
                info.resumed_at = resumed_at;
                Event::RunStarted(std::sync::Arc::new(info))
            }
            (event, started) => {
                self.started = started;
                event
            }
        };
        self.record.push(&event);
        if let Some(export) = &mut self.export {
            export.push(&event);
        }
        if let Event::RunFinished(s) = &event {
            self.summary = Some(s.clone());
        }
        if self.record.holds_unflushed() {
            self.held.push(event);
            // Bounded in number too: a busy run finishes thousands of trajectories within
            // one batching window, and each held record is its whole transcript (2,000
            // one-turn trajectories in 0.06 s held 4 MiB until the end).
            if self.held.len() >= MAX_HELD {
                self.record.idle();
                self.release();
            }
        } else {
            self.release();
            self.say(&event);
        }
    }

    /// Says the events held until the journal was flushed, in order.
    fn release(&mut self) {
        if self.record.holds_unflushed() {
            return;
        }
        let held = std::mem::take(&mut self.held);
        for event in &held {
            self.say(event);
        }
        self.held = held;
        self.held.clear();
    }

    fn say(&mut self, event: &Event) {
        if self.json_events {
            json_event(event, self.record.out());
        }
        self.console.on_event(event);
    }
}

/// `--message-format json`'s last line: how the run (or a merge of shards) ended, with the
/// baseline comparison when there was one.
pub(super) fn run_finished_json(
    run_id: &str,
    out: &Path,
    s: Option<&trellis_engine::record::RunSummary>,
    baseline: Option<&str>,
    comparison: Option<&trellis_reports::compare::Comparison>,
    exit_code: u8,
) -> serde_json::Value {
    serde_json::json!({
        "type": "run_finished",
        "run_id": run_id,
        "out": out.display().to_string(),
        "finished": s.is_some(),
        "interrupted": s.map(|s| s.interrupted),
        "trajectories": s.map(|s| s.trajectories),
        "passed": s.map(|s| s.passed),
        "failed": s.map(|s| s.failed),
        "errors": s.map(|s| s.errors),
        "skipped": s.map(|s| s.skipped),
        "invalid": s.map(|s| s.invalid),
        "duration_ms": s.map(|s| s.duration_ms),
        "connections_redone": s.map(|s| &s.connections_redone),
        "requests_resent": s.map(|s| &s.requests_resent),
        "baseline": baseline,
        "regressed": comparison.map(|c| c.regressed),
        "regressions": comparison.map(|c| c.regressions.clone()),
        "exit_code": exit_code,
    })
}

/// `--message-format json`: one line per run start and finished trajectory, as cargo's and
/// nextest's machine-readable output. `run_finished` is printed by [`run`] once the reports
/// (and the baseline comparison) are done.
pub(super) fn json_event(event: &Event, out: &Path) {
    let line = match event {
        Event::RunStarted(info) => serde_json::json!({
            "type": "run_started",
            "run_id": info.run_id,
            "started_at": info.started_at,
            "resumed_at": info.resumed_at,
            "trellis_version": info.trellis_version,
            "suites": info.suites,
            "planned_trajectories": info.planned_trajectories,
            "out": out.display().to_string(),
        }),
        Event::Trajectory(t) => {
            let failed: Vec<_> = t
                .criteria
                .iter()
                // A check whose evaluator failed is what makes its trajectory `error`.
                .filter(|c| c.status.is_failure())
                .map(|c| {
                    serde_json::json!({
                        "criterion": c.criterion,
                        "kind": c.kind,
                        "status": c.status.as_str(),
                        "turn_index": c.turn_index,
                        "detail": c.detail,
                    })
                })
                .collect();
            serde_json::json!({
                "type": "trajectory_finished",
                "suite": t.suite,
                "scenario": t.scenario,
                "trajectory": t.trajectory,
                "agent": t.agent,
                "repetition": t.repetition,
                "status": t.status.as_str(),
                "turns": t.turns,
                "duration_ms": t.duration_ms,
                "failed_criteria": failed,
                "fault": t.fault,
                "skip_reason": t.skip_reason,
            })
        }
        _ => return,
    };
    outln!("{line}");
}

/// `20261122T035000.123Z-1a2b`: the start time to the millisecond, so run ids (and `ls
/// runs/`) sort in the order runs started, even for runs made back to back within one
/// second; the salt tells apart runs that different processes start in the same
/// millisecond. Run directories named in the older `20261122T035000Z-1a2b` form are still
/// read and listed (by their `started_at`).
pub fn new_run_id() -> String {
    run_id_at(SystemTime::now())
}

/// A run id for a run that started at `now` (`trellis merge`: when its first shard
/// started), in [`new_run_id`]'s form.
pub fn run_id_at(now: SystemTime) -> String {
    let seconds: String = humantime::format_rfc3339_seconds(now)
        .to_string()
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == 'T')
        .collect();
    let nanos = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let millis = nanos / 1_000_000;
    // From the clock now, not `now`: a merged run's start is a shard's, to the second,
    // and two merges of it must not get one id.
    let salted = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let salt = (salted ^ std::process::id().rotate_left(16)) & 0xffff;
    format!("{seconds}.{millis:03}Z-{salt:04x}")
}

#[cfg(test)]
mod tests {
    use super::new_run_id;

    #[test]
    fn run_ids_sort_in_the_order_they_were_made() {
        let mut ids = Vec::new();
        for _ in 0..4 {
            ids.push(new_run_id());
            std::thread::sleep(std::time::Duration::from_millis(3));
        }
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(sorted, ids);
        assert!(ids[0].contains('.') && ids[0].ends_with(char::is_alphanumeric));
    }
}
