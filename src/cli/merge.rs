//! `trellis merge DIR… --out DIR`: the shard runs of `trellis run --shard I/N` combined into
//! one run that every reader takes for an unsharded run of the same plan.
//!
//! The merged run is recorded the way `run` records one: its events (a `run_started`
//! describing the whole plan, each shard's agent, node and trajectory entries, a
//! `run_finished` with the shards' totals) go through the same [`Record`] into a journal,
//! the result tables, HTML, JUnit and summary, and its `run.json` is a whole run's (plus
//! `merged`, naming the shards), so tables, reports, `compare`, `runs` and trends read it
//! like any run. Journals are read only through the journal reader, one entry at a time,
//! twice: once to check that the shards cover the plan (nothing is written when they do
//! not), once to record them; memory holds the plan and one bit per planned trajectory run.
//!
//! A shard's `shard.json` holds the whole split, so whatever is missing is known exactly:
//! a shard with no directory, a shard whose run did not finish (killed, stopped, or still
//! running) and the trajectory runs it did not record.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use clap::Args;
use trellis_engine::event::Event;
use trellis_engine::journal::JournalReader;
use trellis_engine::record::{
    JournalEntry, RunInfo, RunSummary, SHARD_PLAN_FILE, ShardPlan, TrajectoryRecord,
    TrajectoryStatus,
};
use trellis_reports::history::{MergeMeta, RunMeta, SCHEMA_VERSION};

use super::console::{Console, count, errln, outln};
use super::recorder::{Record, Recorded, source};
use super::{EXIT_FAILED, EXIT_INCOMPLETE, EXIT_INVALID, EXIT_OK};

/// Missing trajectory runs listed per shard unless `--verbose`.
const MISSING_SHOWN: usize = 20;

#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The shard run directories, one per shard (`trellis run --shard I/N` wrote them,
    /// or copies of their run.json, shard.json and journal.jsonl.zst).
    #[arg(required = true, value_name = "SHARD_DIR")]
    dirs: Vec<PathBuf>,
    /// Output directory. Default: runs/<run-id>. A directory that holds an earlier run, or
    /// files of the names a run writes (junit.xml, report.html, …), is refused unless
    /// --replace is given.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Let --out replace the earlier run in that directory.
    #[arg(long)]
    replace: bool,
    /// Merge what the shards hold even when shards are missing or did not finish: the
    /// merged run is marked partial (unfinished, left out of comparisons) and the exit code
    /// is 1.
    #[arg(long)]
    allow_partial: bool,
    /// List every missing trajectory run, not only the first few of each shard.
    #[arg(long, short = 'v')]
    verbose: bool,
    /// No progress output, as `trellis run -q`: merge shows none anyway, and takes the flag
    /// so that a CI script's `-q` on both commands is not an error.
    #[arg(long, short = 'q')]
    #[allow(dead_code)]
    quiet: bool,
    /// Compare the merged run with this run (directory, id, name; without a value the
    /// pinned baseline) and exit by the comparison, as `trellis run --baseline` does: 1 on
    /// a regression past the thresholds, 0 otherwise.
    #[arg(long, value_name = "RUN", num_args = 0..=1, default_missing_value = "pinned",
          add = clap_complete::engine::ArgValueCandidates::new(super::complete::runs))]
    baseline: Option<String>,
    #[command(flatten)]
    thresholds: super::history::ThresholdArgs,
    /// `human` (default) or `json`: one JSON object per line on stdout, as `trellis run`
    /// writes them (`run_started`, `trajectory_finished` for each merged trajectory,
    /// `run_finished` with the comparison and the exit code) instead of the summary.
    #[arg(long, value_enum, default_value_t = super::MessageFormat::Human)]
    message_format: super::MessageFormat,
}

/// Why shard directories cannot be merged at all (exit 2).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum MergeError {
    #[error("{} is not a shard run: {why}", dir.display())]
    #[diagnostic(
        code(trellis::merge::not_a_shard),
        help(
            "name the directories `trellis run --shard I/N` (or a runner's shard variables) wrote; a shard copied from elsewhere needs its run.json, shard.json and journal.jsonl.zst"
        )
    )]
    NotAShard { dir: PathBuf, why: String },
    #[error("the shards do not belong to one run: {what}")]
    #[diagnostic(
        code(trellis::merge::mismatch),
        help(
            "merge the shards of one split: every shard of the same suites, selection and shard count, balanced by the same costs (`--shard-costs RUN|none` makes them agree)"
        )
    )]
    Mismatch { what: String },
    #[error("shard {index} is given twice: {} and {}", first.display(), second.display())]
    #[diagnostic(
        code(trellis::merge::twice),
        help(
            "name each shard's directory once; a shard rerun into a new directory replaces the old one"
        )
    )]
    Twice {
        index: u32,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("shard {index} ({}) recorded `{what}`, which {why}", dir.display())]
    #[diagnostic(
        code(trellis::merge::foreign),
        help("the directory's journal and shard.json do not belong together")
    )]
    Foreign {
        index: u32,
        dir: PathBuf,
        what: String,
        why: String,
    },
    #[error("cannot read the journal of {}", dir.display())]
    #[diagnostic(code(trellis::merge::io))]
    Read {
        dir: PathBuf,
        #[source]
        source: trellis_engine::journal::JournalError,
    },
    #[error("--out {} is one of the shards", out.display())]
    #[diagnostic(
        code(trellis::merge::out),
        help("write the merged run into a directory of its own")
    )]
    OutIsShard { out: PathBuf },
}

pub fn merge(args: MergeArgs) -> u8 {
    match merge_inner(&args) {
        Ok(code) => code,
        Err(e) => {
            errln!("{:?}", miette::Report::new(e));
            EXIT_INVALID
        }
    }
}

/// One shard directory as read before merging.
struct ShardDir {
    dir: PathBuf,
    index: u32,
    meta: RunMeta,
    started: Option<RunInfo>,
    finished: Option<RunSummary>,
    /// Journal lines that could not be read (a run killed mid-write tears its last one).
    skipped_lines: usize,
    /// Its compressed journal ends inside a block: the writer was killed mid-flush.
    cut_short: bool,
    /// Another trellis still holds the directory's run lock.
    running: bool,
}

fn merge_inner(args: &MergeArgs) -> Result<u8, MergeError> {
    // Resolved first, among the runs next to the merged one, so a typo fails at once.
    let runs_dir = match &args.out {
        Some(out) => out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        None => PathBuf::from("runs"),
    };
    let baseline = match &args.baseline {
        Some(what) => match super::history::resolve_baseline(&runs_dir, what) {
            Ok(entry) => Some(entry),
            Err(code) => return Ok(code),
        },
        None => None,
    };
    // The same directory named twice (a glob and a path) is one shard.
    let mut seen = HashSet::new();
    let mut named_twice = BTreeSet::new();
    let dirs: Vec<&PathBuf> = args
        .dirs
        .iter()
        .filter(|d| {
            let fresh = seen.insert(d.canonicalize().unwrap_or_else(|_| (*d).clone()));
            if !fresh {
                named_twice.insert(d.display().to_string());
            }
            fresh
        })
        .collect();
    // Said, since a shard then missing reads as one never given.
    for dir in &named_twice {
        errln!("note: {dir} is given twice: it is merged once");
    }
    let mut split: Option<ShardPlan> = None;
    let mut shards: Vec<ShardDir> = Vec::new();
    for dir in dirs {
        let (meta, plan) = read_shard(dir)?;
        let index = plan.index;
        if let Some(first) = &split {
            check_same(first, &shards[0], &plan, &meta, dir)?;
        } else {
            split = Some(plan);
        }
        if let Some(other) = shards.iter().find(|s| s.index == index) {
            return Err(MergeError::Twice {
                index,
                first: other.dir.clone(),
                second: dir.clone(),
            });
        }
        shards.push(ShardDir {
            dir: dir.clone(),
            index,
            meta,
            started: None,
            finished: None,
            skipped_lines: 0,
            cut_short: false,
            running: is_running(dir),
        });
    }
    let Some(split) = split else {
        // clap requires one directory; nothing else leaves this empty.
        return Err(MergeError::Mismatch {
            what: "no shard directory was given".to_owned(),
        });
    };
    shards.sort_by_key(|s| s.index);
    let out = args.out.clone();
    if let Some(out) = &out
        && let Ok(out_canonical) = out.canonicalize()
        && shards
            .iter()
            .any(|s| s.dir.canonicalize().is_ok_and(|d| d == out_canonical))
    {
        return Err(MergeError::OutIsShard { out: out.clone() });
    }

    // First pass: what each shard recorded, against the plan.
    let mut coverage = Coverage::new(&split);
    for shard in &mut shards {
        survey(shard, &split, &mut coverage)?;
    }
    // One verdict policy for the merged run: a skipped check fails a `--strict` shard's
    // trajectory and not another's.
    let strictness: Vec<(&ShardDir, bool)> = shards
        .iter()
        .filter_map(|s| s.started.as_ref().map(|i| (s, i.strict)))
        .collect();
    if let Some((strict, _)) = strictness.iter().find(|(_, strict)| *strict)
        && let Some((lenient, _)) = strictness.iter().find(|(_, strict)| !*strict)
    {
        return Err(MergeError::Mismatch {
            what: format!(
                "{} ran with --strict and {} without: their trajectories were judged by \
                 different rules; run every shard with the same flags",
                strict.dir.display(),
                lenient.dir.display()
            ),
        });
    }
    // One version of the checks for the merged run: another trellis may decide a criterion,
    // a fault's category or a record's columns otherwise (a shard restored from an older
    // job's cache, say).
    let versions: Vec<(&ShardDir, &str)> = shards
        .iter()
        .filter_map(|s| s.started.as_ref().map(|i| (s, i.trellis_version.as_str())))
        .collect();
    if let Some(&(first, version)) = versions.first()
        && let Some(&(other, other_version)) = versions.iter().find(|(_, v)| *v != version)
    {
        return Err(MergeError::Mismatch {
            what: format!(
                "{} was run by trellis {version} and {} by trellis {other_version}: their \
                 checks may have been decided differently; run every shard with the same \
                 trellis",
                first.dir.display(),
                other.dir.display()
            ),
        });
    }
    let missing = missing_by_shard(&split, &shards, &coverage);
    let total_missing: u64 = missing.values().map(|m| m.runs).sum();
    let planned = coverage.planned;
    // A line lost inside a journal (a turn, a node) leaves its trajectory counted but its
    // records short, which coverage cannot see: said, and the merge is then partial.
    let damaged: Vec<&ShardDir> = shards
        .iter()
        // A finished shard's: an unfinished one's torn last line is its kill, said with
        // what it did not finish (docs/sharding.md).
        .filter(|s| s.started.is_some() && s.finished.is_some() && s.skipped_lines > 0)
        .collect();
    for shard in &damaged {
        errln!(
            "shard {}/{} ({}): {} of its journal could not be read (damaged, or cut while \
             copied): what they recorded is missing from the merge",
            shard.index,
            split.count,
            shard.dir.display(),
            count(shard.skipped_lines as u64, "line", "lines")
        );
    }
    if !damaged.is_empty() && !args.allow_partial {
        errln!(
            "error: a shard's records are incomplete; nothing was written\n\
             help: copy the shard's directory again, or pass --allow-partial to merge what \
             reads (the merged run is marked partial)"
        );
        return Ok(EXIT_FAILED);
    }
    // Every trajectory of a shard is there but not its end (killed just after its last
    // trajectory, or its journal's tail cut when copied): merged, but what only the end
    // records (its duration, LLM use by role, connections made again) is not counted.
    for shard in shards
        .iter()
        .filter(|s| s.started.is_some() && s.finished.is_none() && !s.running)
        .filter(|s| !missing.contains_key(&s.index))
    {
        errln!(
            "warning: shard {}/{} ({}): its journal has no end (the run was killed after its \
             last trajectory, or the journal's tail was cut when copied): its trajectories \
             are all merged, but its duration and its LLM use by role are not counted",
            shard.index,
            split.count,
            shard.dir.display(),
        );
    }
    if total_missing > 0 {
        say_missing(&split, &shards, &missing, args.verbose);
        if !args.allow_partial {
            errln!(
                "error: the shards do not cover the plan: {total_missing} of {} {} missing; \
                 nothing was written",
                count(planned, "trajectory run", "trajectory runs"),
                if total_missing == 1 { "is" } else { "are" }
            );
            errln!(
                "help: finish a killed shard with `trellis run SUITES --resume SHARD_DIR`, run \
                 a missing one again (the same command with its --shard I/N or runner index, \
                 --replace into the same directory), or pass --allow-partial to merge what is \
                 there (the merged run is marked partial)"
            );
            return Ok(EXIT_FAILED);
        }
    }

    // Second pass: record the merged run.
    let started_at = shards
        .iter()
        .filter_map(|s| s.started.as_ref().map(|i| i.started_at.clone()))
        .min()
        .unwrap_or_else(|| trellis_engine::execute::rfc3339(SystemTime::now()));
    let started = humantime::parse_rfc3339_weak(&started_at).unwrap_or_else(|_| SystemTime::now());
    let run_id = super::run::run_id_at(started);
    let out = out.unwrap_or_else(|| super::default_out_dir(&run_id));
    if let Err(message) = super::run::keeps_baseline(&out, baseline.as_ref(), args.replace) {
        errln!("error: {message}");
        return Ok(EXIT_INVALID);
    }
    let _claim = match super::recorder::claim_out_dir(&out, args.replace, false) {
        Ok(claim) => claim,
        Err(message) => {
            errln!("error: {message}");
            return Ok(EXIT_INVALID);
        }
    };
    let partial = total_missing > 0 || !damaged.is_empty();
    let mut meta = merged_meta(&run_id, &split, &shards, partial, total_missing);
    // A partial merge is not compared (below).
    meta.compared_with = baseline
        .as_ref()
        .filter(|_| !partial)
        .map(|b| b.label().to_owned());
    if let Err(e) = meta.write(&out) {
        errln!("warning: {e}: {}", source(&e));
    }
    let mut record = match Record::create(&out) {
        Ok(record) => record,
        Err(message) => {
            errln!("error: {message}");
            return Ok(EXIT_INVALID);
        }
    };
    let first = shards.iter().find_map(|s| s.started.as_ref());
    let info = RunInfo {
        run_id: run_id.clone(),
        started_at,
        trellis_version: first.map_or_else(
            || env!("CARGO_PKG_VERSION").to_owned(),
            |i| i.trellis_version.clone(),
        ),
        suites: first.map(|i| i.suites.clone()).unwrap_or_default(),
        jobs: shards
            .iter()
            .filter_map(|s| s.started.as_ref().map(|i| i.jobs))
            .sum(),
        planned_trajectories: planned,
        scenarios: split.scenarios.iter().map(|s| s.info.clone()).collect(),
        rejudged_from: None,
        // The shards ran with the same flags (a mix is refused above).
        strict: shards
            .iter()
            .any(|s| s.started.as_ref().is_some_and(|i| i.strict)),
        // When any shard was resumed (`run --resume`), in time order.
        resumed_at: {
            let mut at: Vec<String> = shards
                .iter()
                .filter_map(|s| s.started.as_ref())
                .flat_map(|i| i.resumed_at.iter().cloned())
                .collect();
            at.sort();
            at
        },
    };
    let json = args.message_format == super::MessageFormat::Json;
    let mut console = Console::new(planned, true, json);
    let mut push = |event: &Event| {
        record.push(event);
        console.on_event(event);
        if json {
            super::run::json_event(event, &out);
        }
    };
    push(&Event::RunStarted(std::sync::Arc::new(info)));
    let mut agents_seen: HashSet<String> = HashSet::new();
    let mut totals = RunSummary {
        run_id: run_id.clone(),
        ..RunSummary::default()
    };
    for shard in &shards {
        // Turn times count from the shard's own start: moved to count from the merged
        // run's, which is the earliest shard's.
        let offset_ms = shard
            .started
            .as_ref()
            .and_then(|i| humantime::parse_rfc3339_weak(&i.started_at).ok())
            .and_then(|at| at.duration_since(started).ok())
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        replay(shard, offset_ms, &mut agents_seen, &mut totals, &mut push)?;
    }
    // What was merged, counted: a partial merge records no end, but says what it holds.
    let merged_counts = serde_json::json!({
        "trajectories": totals.trajectories,
        "passed": totals.passed,
        "failed": totals.failed,
        "errors": totals.errors,
        "skipped": totals.skipped,
        "invalid": totals.invalid,
    });
    let ended = finished(totals, &shards);
    // A partial merge's JSON end still says how long its shards took together and whether
    // one was interrupted: it is not recorded as the run's end, but it is known.
    // A shard that never recorded its end was cut short too (killed, or still running).
    let ended_interrupted = ended.interrupted || shards.iter().any(|s| s.finished.is_none());
    let ended_ms = ended.duration_ms;
    let summary = (!partial).then_some(ended);
    if let Some(summary) = &summary {
        push(&Event::RunFinished(summary.clone()));
    }
    // The suites the shards were planned from, where they still are as they ran (a merge
    // job's checkout of the same commit): failures then say where each check is written,
    // and a workflow's annotations sit on the scenario's line. Without them, neither.
    // Loaded only for that: a dataset's suites take a while to expand.
    let wanted = super::github::wanted()
        || summary
            .as_ref()
            .is_none_or(|s| s.failed + s.errors + s.invalid > 0);
    let project = wanted
        .then(|| super::recorded_suites::recorded(&shards[0].dir, "trellis merge").ok())
        .flatten()
        .and_then(|(paths, _)| {
            trellis_dsl::load(&paths, &trellis_engine::protocol::registry::specs()).ok()
        });
    let locations = super::github::Locations::of_project(project.as_ref());
    if let Some(project) = &project {
        console.set_sites(Some(std::sync::Arc::new(super::sites::Sites::of_project(
            project,
        ))));
    }
    drop(project);
    let Recorded {
        journal_path,
        files,
        problems,
    } = record.finish();
    if let Some(files) = &files {
        console.finish(summary.as_ref(), &out, journal_path.as_deref(), files);
    }
    // A shard whose journal gave nothing (`--allow-partial`) was not merged.
    let merged: Vec<&ShardDir> = shards.iter().filter(|s| s.started.is_some()).collect();
    let said = format!(
        "merged {} of {} ({}) into run {run_id}{}",
        count(merged.len() as u64, "shard", "shards"),
        split.count,
        merged
            .iter()
            .map(|s| format!("{}: {}", s.index, s.meta.run_id))
            .collect::<Vec<_>>()
            .join(", "),
        if partial {
            format!(
                "; partial: {} of the plan missing",
                count(total_missing, "trajectory run", "trajectory runs")
            )
        } else {
            String::new()
        }
    );
    // Under `--message-format json` stdout is the event stream.
    if json {
        errln!("{said}");
    } else {
        outln!("{said}");
    }
    let finished_line = |comparison: Option<&trellis_reports::compare::Comparison>, exit: u8| {
        if json {
            let mut line = super::run::run_finished_json(
                &run_id,
                &out,
                summary.as_ref(),
                baseline.as_ref().map(|b| b.run_id.as_str()),
                comparison,
                exit,
            );
            line["merged_shards"] = serde_json::json!(merged.len());
            line["partial"] = serde_json::json!(partial);
            // A partial merge has no end recorded (`finished` false), but its counts are
            // those of the trajectories it merged, not unknown.
            if summary.is_none()
                && let (Some(line), Some(counts)) =
                    (line.as_object_mut(), merged_counts.as_object())
            {
                line.extend(counts.clone());
                line.insert("duration_ms".into(), serde_json::json!(ended_ms));
                line.insert("interrupted".into(), serde_json::json!(ended_interrupted));
            }
            outln!("{line}");
        }
    };
    if !problems.is_empty() {
        errln!("error: results are incomplete:");
        for problem in &problems {
            errln!("  - {problem}");
        }
        if baseline.is_some() {
            errln!("not compared with the baseline: the merged run's results are incomplete");
            super::run::forget_comparison(&out);
        }
        finished_line(None, EXIT_INCOMPLETE);
        return Ok(EXIT_INCOMPLETE);
    }
    let verdict = match &summary {
        Some(s) if s.failed == 0 && s.errors == 0 => {
            if let Some(why) = super::nothing_checked(s).filter(|_| !partial) {
                errln!("warning: {why}");
            }
            EXIT_OK
        }
        _ => EXIT_FAILED,
    };
    let mut comparison = None;
    let exit = match &baseline {
        None => verdict,
        Some(base) if partial => {
            errln!(
                "not compared with the baseline (run {}): the merged run is partial, and a \
                 comparison of part of a plan would read the missing scenarios as removed",
                base.label()
            );
            EXIT_FAILED
        }
        // As `run --baseline`: the comparison decides.
        Some(base) => match super::run::compare_with(base, &out, None, &args.thresholds) {
            Ok(super::run::Compared {
                comparison: c,
                written,
            }) => {
                if !json {
                    outln!("");
                    super::history::print_comparison(&c);
                }
                let exit = if !written {
                    EXIT_INCOMPLETE
                } else if c.regressed {
                    EXIT_FAILED
                } else {
                    EXIT_OK
                };
                comparison = Some(c);
                exit
            }
            Err(message) => {
                errln!("error: cannot compare with the baseline: {message}");
                super::run::forget_comparison(&out);
                EXIT_INCOMPLETE
            }
        },
    };
    // In a workflow, the merged run is the one the pull request is told about, as a run's.
    if let (Some(locations), Some(files)) = (&locations, &files) {
        super::github::report(
            locations,
            &files.stats,
            &out,
            baseline
                .as_ref()
                .map(|b| b.label())
                .zip(comparison.as_ref()),
            json,
        );
    }
    finished_line(comparison.as_ref(), exit);
    Ok(exit)
}

/// A shard directory's `run.json` and `shard.json`.
fn read_shard(dir: &Path) -> Result<(RunMeta, ShardPlan), MergeError> {
    let not_a_shard = |why: String| MergeError::NotAShard {
        dir: dir.to_path_buf(),
        why,
    };
    if dir.exists() && !dir.is_dir() {
        return Err(not_a_shard(
            "it is a file; give the shard's run directory (where its run.json and shard.json \
             are)"
                .to_owned(),
        ));
    }
    if !dir.is_dir() {
        return Err(not_a_shard("no such directory".to_owned()));
    }
    let meta = match RunMeta::read(dir) {
        Ok(Some(meta)) => meta,
        Ok(None) => return Err(not_a_shard("it has no run.json".to_owned())),
        Err(e) => return Err(not_a_shard(format!("{e}: {}", source(&e)))),
    };
    let Some(shard) = &meta.shard else {
        return Err(not_a_shard(
            "its run.json has no `shard`: a whole run, not a shard of one".to_owned(),
        ));
    };
    let path = dir.join(SHARD_PLAN_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| not_a_shard(format!("cannot read {}: {e}", path.display())))?;
    let plan: ShardPlan = serde_json::from_str(&text)
        .map_err(|e| not_a_shard(format!("{} is not a shard plan: {e}", path.display())))?;
    if plan.version != trellis_engine::record::SHARD_PLAN_VERSION {
        return Err(not_a_shard(format!(
            "{} is version {}, and this trellis reads version {}",
            path.display(),
            plan.version,
            trellis_engine::record::SHARD_PLAN_VERSION
        )));
    }
    if plan.index != shard.index || plan.count != shard.count || plan.digest != shard.digest {
        return Err(not_a_shard(format!(
            "run.json says shard {}/{} and {} says {}/{} of another split",
            shard.index,
            shard.count,
            path.display(),
            plan.index,
            plan.count
        )));
    }
    Ok((meta, plan))
}

/// The shards must come from one split of one suite.
fn check_same(
    first: &ShardPlan,
    first_dir: &ShardDir,
    plan: &ShardPlan,
    meta: &RunMeta,
    dir: &Path,
) -> Result<(), MergeError> {
    let mismatch = |what: String| Err(MergeError::Mismatch { what });
    let a = first_dir.dir.display();
    let b = dir.display();
    // The fingerprint covers the dataset files too. Suite files alike (their hashes in
    // `source`) with other data is left to the plan comparison below, which names the
    // scenarios whose rows changed; data that plans the same merges.
    fn suite_hashes(meta: &RunMeta) -> Option<Vec<&str>> {
        meta.source.as_ref().map(|source| {
            let mut hashes: Vec<&str> = source.files.iter().map(|f| f.blake3.as_str()).collect();
            hashes.sort_unstable();
            hashes
        })
    }
    let same_suite_files = suite_hashes(meta)
        .zip(suite_hashes(&first_dir.meta))
        .is_some_and(|(a, b)| a == b);
    if meta.suite_fingerprint != first_dir.meta.suite_fingerprint && !same_suite_files {
        return mismatch(format!(
            "{a} ran suites with fingerprint {} and {b} suites with fingerprint {}: the suite \
             files differ",
            short(&first_dir.meta.suite_fingerprint),
            short(&meta.suite_fingerprint)
        ));
    }
    if plan.count != first.count {
        return mismatch(format!(
            "{a} is a shard of {} and {b} a shard of {}",
            first.count, plan.count
        ));
    }
    if plan.digest != first.digest {
        let by = |p: &ShardPlan| match &p.balance {
            trellis_engine::record::ShardBalance::Trajectories => "trajectory count".to_owned(),
            trellis_engine::record::ShardBalance::MeasuredCost { run_id } => {
                format!("the costs of run {run_id}")
            }
        };
        let selection = if plan.scenarios.len() == first.scenarios.len() {
            String::new()
        } else {
            format!(
                " ({} and {} scenarios: another --filter or --tag)",
                first.scenarios.len(),
                plan.scenarios.len()
            )
        };
        // The same scenarios in another order: suite files given in another order (a glob
        // expanded under another locale), which changes how the split breaks ties.
        let names = |p: &ShardPlan| -> Vec<(String, String)> {
            p.scenarios
                .iter()
                .map(|s| (s.info.suite.clone(), s.info.scenario.clone()))
                .collect()
        };
        let (first_names, names_here) = (names(first), names(plan));
        let reordered = first_names != names_here && {
            let (mut x, mut y) = (first_names.clone(), names_here.clone());
            x.sort_unstable();
            y.sort_unstable();
            x == y
        };
        let balance = if reordered {
            let suites = |names: &[(String, String)]| {
                let mut order: Vec<&str> = Vec::new();
                for (suite, _) in names {
                    if !order.contains(&suite.as_str()) {
                        order.push(suite);
                    }
                }
                order.join(", ")
            };
            format!(
                "they loaded the same suites in another order ({} in {a}; {} in {b}): give \
                 every shard the same paths in the same order, or a directory, whose files \
                 are loaded sorted",
                suites(&first_names),
                suites(&names_here)
            )
        } else if first.balance == plan.balance {
            "another selection (--filter, --tag) or other dataset rows".to_owned()
        } else {
            format!("{a} was balanced by {} and {b} by {}", by(first), by(plan))
        };
        return mismatch(format!(
            "{a} and {b} split the plan differently{selection}: {balance}"
        ));
    }
    // The same split of other scenarios: a dataset edited between the shards' runs keeps
    // its row ids (`row-id`) but not its rows, and the merged tables would pair one
    // version's rows with the other's conversations.
    let changed: Vec<&str> = first
        .scenarios
        .iter()
        .zip(&plan.scenarios)
        .filter(|(x, y)| {
            x.info.fingerprints != y.info.fingerprints
                || serde_json::to_value(&x.info.instance).ok()
                    != serde_json::to_value(&y.info.instance).ok()
        })
        .map(|(x, _)| x.info.scenario.as_str())
        .collect();
    if !changed.is_empty() {
        let shown: Vec<&str> = changed.iter().take(5).copied().collect();
        let more = changed.len() - shown.len();
        return mismatch(format!(
            "{a} and {b} planned {} differently ({}{}): their steps or dataset rows changed \
             between the shards' runs; run every shard from the same files",
            count(changed.len() as u64, "scenario", "scenarios"),
            shown.join(", "),
            if more > 0 {
                format!(", … and {more} more")
            } else {
                String::new()
            }
        ));
    }
    Ok(())
}

fn short(fingerprint: &str) -> &str {
    fingerprint.get(..12).unwrap_or(fingerprint)
}

/// Whether another trellis process still holds `dir`'s run lock (the shard is running).
fn is_running(dir: &Path) -> bool {
    let Ok(lock) = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(super::recorder::OUT_LOCK))
    else {
        return false;
    };
    matches!(lock.try_lock(), Err(std::fs::TryLockError::WouldBlock))
}

/// Every planned trajectory run (scenario × agent × trajectory × repetition) as one bit,
/// set when a shard recorded it.
struct Coverage {
    /// Suite, then scenario id: the scenario's index in the split.
    scenarios: HashMap<String, HashMap<String, usize>>,
    /// Per scenario: trajectory name → index.
    trajectories: Vec<HashMap<String, usize>>,
    /// Per scenario: the first bit of its runs in `bits`.
    offsets: Vec<u64>,
    bits: Vec<u64>,
    /// The bits of trajectory runs recorded under their planned name: a second record of
    /// one is a duplicate.
    recorded: Vec<u64>,
    /// The runs recorded under a name the run gave (an agent's fork `accepts~refund`, a
    /// simulated user's `@retry1`), several of which share a planned run's bit.
    recorded_named: HashSet<(u64, String)>,
    planned: u64,
}

impl Coverage {
    fn new(split: &ShardPlan) -> Coverage {
        let mut scenarios: HashMap<String, HashMap<String, usize>> = HashMap::new();
        let mut trajectories = Vec::with_capacity(split.scenarios.len());
        let mut offsets = Vec::with_capacity(split.scenarios.len());
        let mut planned = 0u64;
        for (i, s) in split.scenarios.iter().enumerate() {
            scenarios
                .entry(s.info.suite.clone())
                .or_default()
                .insert(s.info.scenario.clone(), i);
            trajectories.push(
                s.info
                    .trajectories
                    .iter()
                    .enumerate()
                    .map(|(t, name)| (name.clone(), t))
                    .collect(),
            );
            offsets.push(planned);
            planned += runs_of(&s.info);
        }
        Coverage {
            scenarios,
            trajectories,
            offsets,
            bits: vec![0; planned.div_ceil(64) as usize],
            recorded: vec![0; planned.div_ceil(64) as usize],
            recorded_named: HashSet::new(),
            planned,
        }
    }

    /// Notes that `t`, the run at `bit`, was recorded; false when it already was (a
    /// journal that holds one trajectory twice would count it twice in the merged run).
    fn record_once(&mut self, scenario: usize, bit: u64, t: &TrajectoryRecord) -> bool {
        if self.trajectories[scenario].contains_key(&t.trajectory) {
            let (word, mask) = ((bit / 64) as usize, 1 << (bit % 64));
            let first = self.recorded[word] & mask == 0;
            self.recorded[word] |= mask;
            first
        } else {
            self.recorded_named.insert((bit, t.trajectory.clone()))
        }
    }

    /// The scenario and bit of a recorded trajectory, or why it is not in the plan.
    fn locate(&self, split: &ShardPlan, t: &TrajectoryRecord) -> Result<(usize, u64), String> {
        let scenario = self
            .scenarios
            .get(&t.suite)
            .and_then(|s| s.get(&t.scenario))
            .copied()
            .ok_or("is not a scenario of the plan")?;
        let info = &split.scenarios[scenario].info;
        let agent = info
            .agents
            .iter()
            .position(|a| *a == t.agent)
            .ok_or("names an agent the scenario does not run on")?;
        let trajectory = planned_name(&self.trajectories[scenario], t)
            .ok_or("is not a trajectory of the scenario")?;
        if t.repetition >= info.repeat {
            return Err(format!(
                "is repetition #{} of a scenario repeated {} times",
                t.repetition, info.repeat
            ));
        }
        let within = (agent as u64 * info.trajectories.len() as u64 + trajectory as u64)
            * u64::from(info.repeat)
            + u64::from(t.repetition);
        Ok((scenario, self.offsets[scenario] + within))
    }

    fn set(&mut self, bit: u64) {
        self.bits[(bit / 64) as usize] |= 1 << (bit % 64);
    }

    fn get(&self, bit: u64) -> bool {
        self.bits[(bit / 64) as usize] & (1 << (bit % 64)) != 0
    }
}

/// Trajectory runs of a scenario: trajectories × agents × repetitions.
fn runs_of(info: &trellis_engine::record::ScenarioInfo) -> u64 {
    info.trajectories.len() as u64 * info.agents.len() as u64 * u64::from(info.repeat)
}

/// The planned trajectory a recorded name belongs to: the name itself, or, for a path the
/// agent forked (`accepts~refund~late`), the longest planned name before a `~`.
fn planned_name(names: &HashMap<String, usize>, record: &TrajectoryRecord) -> Option<usize> {
    let recorded = record.trajectory.as_str();
    if let Some(&t) = names.get(recorded) {
        return Some(t);
    }
    // What the run added to the name, as resume reads it (a simulated user's `@retryN`
    // included).
    if let Some(&t) = names.get(record.planned_name()) {
        return Some(t);
    }
    let mut end = recorded.len();
    while let Some(cut) = recorded[..end].rfind('~') {
        if let Some(&t) = names.get(&recorded[..cut]) {
            return Some(t);
        }
        end = cut;
    }
    None
}

/// Reads one shard's journal: its start, end, and the trajectory runs it recorded.
fn survey(
    shard: &mut ShardDir,
    split: &ShardPlan,
    coverage: &mut Coverage,
) -> Result<(), MergeError> {
    // No journal: killed before its engine started, every trajectory run of it is missing.
    let Some(path) = journal_path(&shard.dir) else {
        return Ok(());
    };
    let read_error = read_error(&shard.dir);
    let mut journal = JournalReader::open(&path).map_err(&read_error)?;
    while let Some(entry) = journal.next_entry().map_err(&read_error)? {
        match entry {
            JournalEntry::RunStarted(info) => {
                if shard.started.is_none() {
                    let mut info = std::sync::Arc::unwrap_or_clone(info);
                    // The plan is the split's; the shard's own part of it is not needed.
                    info.scenarios = Vec::new();
                    shard.started = Some(info);
                }
            }
            JournalEntry::RunFinished(summary) => shard.finished = Some(summary),
            JournalEntry::Trajectory(t) => {
                let foreign = |why: String| MergeError::Foreign {
                    index: shard.index,
                    dir: shard.dir.clone(),
                    what: format!(
                        "{}/{} {} [{} #{}]",
                        t.suite, t.scenario, t.trajectory, t.agent, t.repetition
                    ),
                    why,
                };
                let (scenario, bit) = coverage.locate(split, &t).map_err(&foreign)?;
                let owner = split.scenarios[scenario].shard;
                if owner != shard.index {
                    return Err(foreign(format!(
                        "the split gives to shard {owner}: the shards overlap"
                    )));
                }
                if !coverage.record_once(scenario, bit, &t) {
                    return Err(foreign(
                        "is recorded twice in its journal: the merged run would count it twice"
                            .to_owned(),
                    ));
                }
                coverage.set(bit);
            }
            JournalEntry::Agent(_) | JournalEntry::Node(_) | JournalEntry::Spans(_) => {}
        }
    }
    shard.skipped_lines = journal.skipped();
    shard.cut_short = journal.cut_short();
    Ok(())
}

/// Where a shard's journal is, when it has one: compressed, or the plain `journal.jsonl` of
/// a shard an earlier trellis ran. It is read one entry at a time (a line torn by a kill is
/// skipped and counted).
fn journal_path(dir: &Path) -> Option<PathBuf> {
    trellis_engine::journal::find(dir)
}

fn read_error(dir: &Path) -> impl Fn(trellis_engine::journal::JournalError) -> MergeError {
    let dir = dir.to_path_buf();
    move |source| MergeError::Read {
        dir: dir.clone(),
        source,
    }
}

/// What one shard is missing.
#[derive(Default)]
struct Missing {
    /// Trajectory runs of the plan its scenarios hold that it did not record.
    runs: u64,
    /// The first of them (all with `--verbose`): suite/scenario trajectory [agent #rep].
    listed: Vec<String>,
    /// Its scenarios, when the shard has no directory.
    scenarios: Vec<String>,
}

fn missing_by_shard(
    split: &ShardPlan,
    shards: &[ShardDir],
    coverage: &Coverage,
) -> BTreeMap<u32, Missing> {
    let mut missing: BTreeMap<u32, Missing> = BTreeMap::new();
    let given: HashSet<u32> = shards.iter().map(|s| s.index).collect();
    for (i, s) in split.scenarios.iter().enumerate() {
        let info = &s.info;
        let has_dir = given.contains(&s.shard);
        let mut bit = coverage.offsets[i];
        for agent in &info.agents {
            for trajectory in &info.trajectories {
                for repetition in 0..info.repeat {
                    if !coverage.get(bit) {
                        let m = missing.entry(s.shard).or_default();
                        m.runs += 1;
                        if has_dir {
                            m.listed.push(format!(
                                "{}/{} {trajectory} [{agent} #{repetition}]",
                                info.suite, info.scenario
                            ));
                        }
                    }
                    bit += 1;
                }
            }
        }
        if !has_dir {
            let m = missing.entry(s.shard).or_default();
            m.scenarios
                .push(format!("{}/{}", info.suite, info.scenario));
        }
    }
    missing
}

/// Says, shard by shard, what is missing and why.
fn say_missing(
    split: &ShardPlan,
    shards: &[ShardDir],
    missing: &BTreeMap<u32, Missing>,
    verbose: bool,
) {
    for (&index, m) in missing {
        if m.runs == 0 {
            continue;
        }
        let Some(shard) = shards.iter().find(|s| s.index == index) else {
            let shown: Vec<&str> = m
                .scenarios
                .iter()
                .take(if verbose { usize::MAX } else { MISSING_SHOWN })
                .map(String::as_str)
                .collect();
            let more = m.scenarios.len() - shown.len();
            errln!(
                "shard {index}/{}: no directory given; it holds {} ({}): {}{}",
                split.count,
                count(m.scenarios.len() as u64, "scenario", "scenarios"),
                count(m.runs, "trajectory run", "trajectory runs"),
                shown.join(", "),
                if more > 0 {
                    format!(", … and {more} more (--verbose lists them)")
                } else {
                    String::new()
                }
            );
            continue;
        };
        let why = if shard.running {
            "its run is still going (another trellis holds its directory)".to_owned()
        } else if shard.started.is_none() && (shard.skipped_lines > 0 || shard.cut_short) {
            // A journal is there, and none of it reads: not a run that never started.
            "its journal could not be read (damaged, or cut short while it was written or \
             copied); copy the shard's directory again, or `trellis run SUITES --resume` it"
                .to_owned()
        } else if shard.started.is_none() && journal_path(&shard.dir).is_some() {
            "its journal has no `run_started` entry (empty: the run was stopped before it \
             recorded anything)"
                .to_owned()
        } else if shard.started.is_none() {
            "its run never started (no journal)".to_owned()
        } else if shard.finished.is_none() {
            let torn = if shard.skipped_lines > 0 {
                format!(
                    "; {} could not be read",
                    count(shard.skipped_lines as u64, "journal line", "journal lines")
                )
            } else if shard.cut_short {
                "; its journal ends mid-write".to_owned()
            } else {
                String::new()
            };
            format!(
                "its run did not finish (killed, or its machine lost){torn}; `trellis run SUITES \
                 --resume {}` finishes it",
                super::console::shell_word(&shard.dir)
            )
        } else {
            "its run was stopped before its end".to_owned()
        };
        errln!(
            "shard {index}/{} ({}, run {}): {why}: {} missing:",
            split.count,
            shard.dir.display(),
            shard.meta.run_id,
            count(m.runs, "trajectory run", "trajectory runs")
        );
        let limit = if verbose { usize::MAX } else { MISSING_SHOWN };
        for line in m.listed.iter().take(limit) {
            errln!("    {line}");
        }
        if m.listed.len() > limit {
            errln!(
                "    … and {} more (--verbose lists them)",
                m.listed.len() - limit
            );
        }
    }
}

/// Second pass: a shard's entries into the merged run (its own start and end left out,
/// an agent's setup recorded once, its turns' start times moved by `offset_ms`, how much
/// later than the merged run it started).
fn replay(
    shard: &ShardDir,
    offset_ms: f64,
    agents_seen: &mut HashSet<String>,
    totals: &mut RunSummary,
    push: &mut impl FnMut(&Event),
) -> Result<(), MergeError> {
    let Some(path) = journal_path(&shard.dir) else {
        return Ok(());
    };
    let read_error = read_error(&shard.dir);
    let mut journal = JournalReader::open(&path).map_err(&read_error)?;
    while let Some(mut entry) = journal.next_entry().map_err(&read_error)? {
        match &mut entry {
            JournalEntry::RunStarted(_) | JournalEntry::RunFinished(_) => {}
            JournalEntry::Spans(_) => push(&entry),
            JournalEntry::Agent(agent) => {
                if agents_seen.insert(agent.agent.clone()) {
                    push(&entry);
                }
            }
            JournalEntry::Node(node) => {
                // Every turn the engine takes is recorded on a node, replays included: the
                // count its summary gives.
                totals.turns += node.turns.len() as u64;
                // Turns just read are held once: moved in place, not copied.
                for turn in &mut node.turns {
                    let turn = std::sync::Arc::make_mut(turn);
                    turn.started_ms += offset_ms;
                    if let Some(ended) = &mut turn.ended_ms {
                        *ended += offset_ms;
                    }
                }
                push(&entry);
            }
            JournalEntry::Trajectory(t) => {
                totals.trajectories += 1;
                match t.status {
                    TrajectoryStatus::Passed => totals.passed += 1,
                    TrajectoryStatus::Failed => totals.failed += 1,
                    TrajectoryStatus::Error => totals.errors += 1,
                    TrajectoryStatus::Skipped => totals.skipped += 1,
                    TrajectoryStatus::Invalid => totals.invalid += 1,
                }
                push(&entry);
            }
        }
    }
    Ok(())
}

/// The merged run's end: `totals` counted from its records; it lasted from the first
/// shard's start to the last shard's end.
fn finished(mut total: RunSummary, shards: &[ShardDir]) -> RunSummary {
    let mut first_start: Option<SystemTime> = None;
    let mut last_end: Option<SystemTime> = None;
    for shard in shards {
        let Some(s) = &shard.finished else { continue };
        // LLM use per role is the shards' together, and so are the connections made again.
        for (role, usage) in &s.llm_roles {
            total
                .llm_roles
                .entry(role.clone())
                .or_default()
                .merge(usage);
        }
        for (address, n) in &s.connections_redone {
            *total.connections_redone.entry(address.clone()).or_default() += n;
        }
        for (command, n) in &s.requests_resent {
            *total.requests_resent.entry(command.clone()).or_default() += n;
        }
        total.interrupted |= s.interrupted;
        if s.finished_at > total.finished_at {
            total.finished_at.clone_from(&s.finished_at);
        }
        if let Some(start) = shard
            .started
            .as_ref()
            .and_then(|i| humantime::parse_rfc3339_weak(&i.started_at).ok())
        {
            let end = start + Duration::from_secs_f64(s.duration_ms.max(0.0) / 1000.0);
            first_start = Some(first_start.map_or(start, |f| f.min(start)));
            last_end = Some(last_end.map_or(end, |l| l.max(end)));
        }
    }
    total.duration_ms = match (first_start, last_end) {
        (Some(start), Some(end)) => end
            .duration_since(start)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0),
        _ => shards
            .iter()
            .filter_map(|s| s.finished.as_ref().map(|f| f.duration_ms))
            .fold(0.0, f64::max),
    };
    total
}

/// The merged run's `run.json`: a whole run's, from the shards' (the labels all of them
/// agree on), with `merged` naming them.
fn merged_meta(
    run_id: &str,
    split: &ShardPlan,
    shards: &[ShardDir],
    partial: bool,
    missing: u64,
) -> RunMeta {
    let first = &shards[0].meta;
    let mut endpoints = Vec::new();
    for shard in shards {
        for e in &shard.meta.endpoints {
            if !endpoints
                .iter()
                .any(|known: &trellis_reports::history::AgentEndpoint| known.agent == e.agent)
            {
                endpoints.push(e.clone());
            }
        }
    }
    let labels = first
        .labels
        .iter()
        .filter(|(k, v)| shards.iter().all(|s| s.meta.labels.get(*k) == Some(*v)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    RunMeta {
        schema_version: SCHEMA_VERSION,
        run_id: run_id.to_owned(),
        trellis_version: env!("CARGO_PKG_VERSION").to_owned(),
        suite_fingerprint: first.suite_fingerprint.clone(),
        git: first.git.clone(),
        endpoints,
        tags: first.tags.clone(),
        labels,
        name: None,
        baseline: false,
        watch_rerun: None,
        watch_latest: false,
        compared_with: None,
        shard: None,
        variance_condition: None,
        rejudged_from: None,
        merged: Some(MergeMeta {
            shards: split.count,
            // The shards whose records are in the merge (`--allow-partial` may leave some out).
            runs: shards
                .iter()
                .filter(|s| s.started.is_some())
                .map(|s| s.meta.run_id.clone())
                .collect(),
            partial,
            missing,
        }),
        // The shards were planned from the same suites and selection.
        source: first.source.clone(),
    }
}
