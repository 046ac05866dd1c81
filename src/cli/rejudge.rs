//! `trellis rejudge RUN_DIR PATHS…`: re-scores a recorded run's `judge`/`outcome` checks with
//! the judges the suites define now, without calling any agent, into a new run directory
//! whose journal names the original (`rejudged_from`).

use std::path::PathBuf;

use clap::Args;
use trellis_engine::journal;
use trellis_engine::llm::rejudge::rejudge as rejudge_journal;
use trellis_engine::llm::{LlmRuntime, LlmSetup};
use trellis_engine::record::TrajectoryStatus;
use trellis_engine::transport::http::HttpTransport;

use super::console::{count, errln, outln};
use super::recorder::Record;
use super::stop::{Signals, restore_default_signals};
use super::{EXIT_FAILED, EXIT_INCOMPLETE, EXIT_INVALID, EXIT_OK, LlmCacheMode};

#[derive(Debug, Args)]
pub struct RejudgeArgs {
    /// The recorded run: a run directory, or a run id (or a unique prefix) or a name in
    /// --dir.
    #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::run_dirs))]
    run: String,
    #[command(flatten)]
    runs: super::history::RunsDir,
    /// The suites whose judges, panels and providers score the checks now (the scenarios'
    /// checks are found by their text).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Output directory. Default: runs/<new-run-id>.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Let --out replace an earlier run in that directory.
    #[arg(long)]
    replace: bool,
    /// As for `trellis run`.
    #[arg(long, value_name = "DIR")]
    llm_cache: Option<PathBuf>,
    /// As for `trellis run`.
    #[arg(long, value_enum, default_value_t = LlmCacheMode::ReadWrite, requires = "llm_cache")]
    llm_cache_mode: LlmCacheMode,
}

pub fn rejudge(args: RejudgeArgs) -> u8 {
    let run_dir = match super::history::run_dir(&args.runs.dir, &args.run) {
        Ok(dir) => dir,
        Err(code) => return code,
    };
    // A shard's transcripts are part of a plan: re-scored alone they would enter the
    // history as a whole run.
    if trellis_reports::history::is_shard_run(&run_dir) {
        errln!(
            "error: {} holds one shard of a run; merge the shards first (`trellis merge \
             SHARD_DIR… --out DIR`) and rejudge the merged run",
            run_dir.display()
        );
        return EXIT_INVALID;
    }
    let Some(project) = super::load(&args.paths) else {
        return EXIT_INVALID;
    };
    let entries: Vec<_> = match journal::read(&journal::path_in(&run_dir)) {
        Ok(entries) => entries.collect(),
        Err(e) => {
            errln!("error: {e}: {}", super::recorder::source(&e));
            return EXIT_INVALID;
        }
    };
    // Decided as the run was: under `--strict` a check that did not run still fails its
    // trajectory (re-scoring must not turn it into a pass).
    let strict = entries.iter().any(
        |e| matches!(e, trellis_engine::record::JournalEntry::RunStarted(info) if info.strict),
    );
    let setup = LlmSetup::from_project(&project);
    if !setup.has_judge() {
        errln!(
            "error: the suites configure no judge: add a `provider` and a `judge \"ID\" \
             provider=\"…\"` node"
        );
        return EXIT_INVALID;
    }
    let run_id = super::run::new_run_id();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| super::default_out_dir(&run_id));
    let _claim = match super::recorder::claim_out_dir(&out, args.replace, false) {
        Ok(claim) => claim,
        Err(message) => {
            errln!("error: {message}");
            return EXIT_INVALID;
        }
    };
    let cache = super::run::llm_cache(args.llm_cache.as_deref(), args.llm_cache_mode);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            errln!("error: cannot start the async runtime: {e}");
            return EXIT_INVALID;
        }
    };
    let env = trellis_engine::render::snapshot_env();
    let llm = LlmRuntime::new(setup, &env, &HttpTransport::new(), cache);
    let started_at = trellis_engine::execute::rfc3339(std::time::SystemTime::now());
    let result = runtime.block_on(async {
        // The judges' calls are one piece of work: a stop signal ends it at once, before
        // anything is recorded (a half-rejudged run would mix old and new verdicts).
        let mut signals = Signals::watch();
        tokio::select! {
            result = rejudge_journal(
                &project,
                entries,
                &llm,
                &run_id,
                started_at,
                |faulted, criteria| {
                    trellis_engine::execute::trajectory_status(faulted, criteria, strict).0
                },
            ) => Ok(result),
            signal = signals.next() => Err(signal),
        }
    });
    restore_default_signals();
    let (entries, counts) = match result {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            errln!("error: {}: {e}", run_dir.display());
            return EXIT_INVALID;
        }
        Err(signal) => {
            errln!(
                "rejudge {} before its end: nothing was recorded in {}",
                signal.name(),
                out.display()
            );
            drop(_claim);
            // Only an empty directory goes: the one the claim made for this rejudge.
            let _ = std::fs::remove_dir(&out);
            return signal.exit_code();
        }
    };
    let mut record = match Record::create(&out) {
        Ok(record) => record,
        Err(e) => {
            errln!("error: {e}");
            return EXIT_INVALID;
        }
    };
    // Says what the directory is before its tables are written: `report.html` trends leave
    // a re-scoring of another run's transcripts out.
    let original = entries.iter().find_map(|e| match e {
        trellis_engine::record::JournalEntry::RunStarted(info) => info.rejudged_from.clone(),
        _ => None,
    });
    let meta = trellis_reports::history::RunMeta {
        rejudged_from: original,
        ..trellis_reports::history::RunMeta::marker(&run_id)
    };
    if let Err(e) = meta.write(&out) {
        errln!("warning: {e}: {}", super::recorder::source(&e));
    }
    let mut failed = false;
    let mut summary = None;
    for entry in &entries {
        if let trellis_engine::record::JournalEntry::Trajectory(t) = entry {
            failed |= matches!(t.status, TrajectoryStatus::Failed | TrajectoryStatus::Error);
        }
        if let trellis_engine::record::JournalEntry::RunFinished(s) = entry {
            summary = Some(s.clone());
        }
        record.push(entry);
    }
    let problems = record.finish().problems;
    if let Some(s) = summary {
        outln!(
            "rejudged {} check(s) of {} trajectories ({} changed status{}); trajectories: {} \
             passed, {} failed, {} error, {} skipped{}",
            counts.rejudged,
            s.trajectories,
            counts.changed,
            if counts.not_in_suite > 0 {
                format!(
                    "; {} no longer in the suites, kept as recorded",
                    counts.not_in_suite
                )
            } else {
                String::new()
            },
            s.passed,
            s.failed,
            s.errors,
            s.skipped,
            if s.invalid > 0 {
                format!(", {} invalid", s.invalid)
            } else {
                String::new()
            }
        );
    }
    if !counts.not_recorded.is_empty() {
        // Said, not judged: where a new check stands among the turns is the run's to decide.
        const SHOWN: usize = 5;
        errln!(
            "note: {} of the suites not in the recorded run, so not judged (`trellis run` \
             judges {}):",
            count(
                counts.not_recorded.len() as u64,
                "judged check",
                "judged checks"
            ),
            if counts.not_recorded.len() == 1 {
                "it"
            } else {
                "them"
            }
        );
        for check in counts.not_recorded.iter().take(SHOWN) {
            errln!("  - {check}");
        }
        if counts.not_recorded.len() > SHOWN {
            errln!("  … and {} more", counts.not_recorded.len() - SHOWN);
        }
    }
    outln!(
        "results: {} (rejudged from {})",
        out.display(),
        run_dir.display()
    );
    if !problems.is_empty() {
        errln!("error: results are incomplete:");
        for problem in &problems {
            errln!("  - {problem}");
        }
        return EXIT_INCOMPLETE;
    }
    if failed { EXIT_FAILED } else { EXIT_OK }
}
