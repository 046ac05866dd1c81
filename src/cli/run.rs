//! `trellis run`: load, plan, execute with the journal and console as reporters on the
//! event stream, then turn the journal into Parquet, HTML and JUnit.

use std::path::Path;
use std::time::SystemTime;

use trellis_engine::event::{self, Event};
use trellis_engine::execute::{self, RunOptions};
use trellis_engine::journal::JournalWriter;
use trellis_engine::plan::Plan;
use trellis_engine::record::RunSummary;

use super::console::Console;
use super::{EXIT_FAILED, EXIT_INVALID, EXIT_OK, RunArgs};

/// Exit code when the run was interrupted (Ctrl-C); finished trajectories are still reported.
const EXIT_INTERRUPTED: u8 = 130;

pub fn run(args: RunArgs) -> u8 {
    let Some(project) = super::load(&args.paths.paths) else {
        return EXIT_INVALID;
    };
    let Some(plan) = super::plan(&project, &args.select) else {
        return EXIT_INVALID;
    };
    if plan.scenarios.is_empty() {
        eprintln!("error: no scenario matches the selection");
        return EXIT_INVALID;
    }
    let run_id = new_run_id();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| super::default_out_dir(&run_id));
    match execute_plan(plan, &run_id, &out, args.jobs, args.quiet, false) {
        Ok(outcome) => outcome.exit_code,
        Err(message) => {
            eprintln!("error: {message}");
            EXIT_INVALID
        }
    }
}

pub struct Outcome {
    pub exit_code: u8,
    pub summary: Option<RunSummary>,
}

/// Runs a plan into `out` and writes every report. Shared by `run` and `bench`.
pub fn execute_plan(
    plan: Plan,
    run_id: &str,
    out: &Path,
    jobs: usize,
    quiet: bool,
    silent: bool,
) -> Result<Outcome, String> {
    let mut journal = JournalWriter::create(out).map_err(|e| format!("{e}: {}", source(&e)))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let mut console = Console::new(plan.trajectory_count(), quiet, silent);
    let options = RunOptions {
        run_id: run_id.to_string(),
        jobs,
    };
    let (summary, interrupted, journal_error) = runtime.block_on(async {
        let (tx, mut rx) = event::channel();
        let mut engine = tokio::spawn(execute::run(plan, options, tx));
        let mut interrupted = false;
        let mut journal_error = None;
        let mut summary = None;
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some(ev) => {
                        if journal_error.is_none()
                            && let Err(e) = journal.append(&ev)
                        {
                            journal_error = Some(e);
                        }
                        if let Event::RunFinished(s) = &ev {
                            summary = Some(s.clone());
                        }
                        console.on_event(&ev);
                    }
                    None => break,
                },
                _ = &mut ctrl_c, if !interrupted => {
                    interrupted = true;
                    engine.abort();
                    console.interrupted();
                }
            }
        }
        let _ = (&mut engine).await;
        (summary, interrupted, journal_error)
    });
    // Agent tasks of an aborted run may still hold sockets; do not wait for them.
    runtime.shutdown_background();
    if let Some(e) = journal_error {
        return Err(format!("{e}: {}", source(&e)));
    }
    let journal_path = journal
        .finish()
        .map_err(|e| format!("{e}: {}", source(&e)))?;

    let files = trellis_reports::write_reports(out, &trellis_reports::ReportOptions::default());
    let files = match files {
        Ok(files) => files,
        Err(e) => {
            eprintln!("{:?}", miette::Report::new(e));
            return Ok(Outcome {
                exit_code: EXIT_FAILED,
                summary,
            });
        }
    };
    console.finish(summary.as_ref(), out, &journal_path, &files);
    let exit_code = if interrupted {
        EXIT_INTERRUPTED
    } else {
        match &summary {
            Some(s) if s.failed == 0 && s.errors == 0 => EXIT_OK,
            _ => EXIT_FAILED,
        }
    };
    Ok(Outcome { exit_code, summary })
}

fn source(e: &dyn std::error::Error) -> String {
    e.source().map(|s| s.to_string()).unwrap_or_default()
}

/// `20261122T035000Z-1a2b`: sortable by time, unique enough for runs started in the same
/// second by different processes.
pub fn new_run_id() -> String {
    let now = SystemTime::now();
    let stamp: String = execute::rfc3339(now)
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    let nanos = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let salt = (nanos ^ std::process::id().rotate_left(16)) & 0xffff;
    format!("{stamp}-{salt:04x}")
}
