//! `trellis run`: load, plan, execute with the journal and console as reporters on the
//! event stream, then turn the journal into Parquet, HTML and JUnit.

use std::path::Path;
use std::time::SystemTime;

use trellis_engine::event::{self, Event};
use trellis_engine::execute::{self, RunOptions};
use trellis_engine::journal::JournalWriter;
use trellis_engine::plan::Plan;
use trellis_engine::record::RunSummary;
use trellis_reports::ReportWriter;

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
    /// Process CPU seconds spent writing the reports (for `bench`).
    pub report_cpu: f64,
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
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let mut console = Console::new(plan.trajectory_count(), quiet, silent);
    let options = RunOptions {
        run_id: run_id.to_string(),
        jobs,
    };
    let report_options = trellis_reports::ReportOptions::default();
    let mut report: Option<ReportWriter> = None;
    let mut report_error: Option<trellis_reports::ReportError> = None;
    let mut report_cpu = 0.0;
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
                        let cpu = super::bench::cpu_time();
                        feed_report(&mut report, &mut report_error, out, &report_options, &ev);
                        report_cpu += super::bench::cpu_time() - cpu;
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
    // The HTML transcripts are read back from the journal: it must be complete on disk first.
    let journal_path = journal
        .finish()
        .map_err(|e| format!("{e}: {}", source(&e)))?;

    let cpu_before_finish = super::bench::cpu_time();
    let files = match (report, report_error) {
        (Some(writer), None) => writer.finish(),
        (_, Some(e)) => Err(e),
        // No event reached the writer: rebuild from whatever the journal holds.
        (None, None) => trellis_reports::write_reports(out, &report_options),
    };
    report_cpu += super::bench::cpu_time() - cpu_before_finish;
    let files = match files {
        Ok(files) => files,
        Err(e) => {
            eprintln!("{:?}", miette::Report::new(e));
            return Ok(Outcome {
                exit_code: EXIT_FAILED,
                summary,
                report_cpu,
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
    Ok(Outcome {
        exit_code,
        summary,
        report_cpu,
    })
}

/// Feeds one event to the report writer, creating it at `run_started`. The first report
/// error stops reporting (it is shown at the end) but never the run: the journal still
/// records everything.
fn feed_report(
    report: &mut Option<ReportWriter>,
    error: &mut Option<trellis_reports::ReportError>,
    out: &Path,
    options: &trellis_reports::ReportOptions,
    event: &Event,
) {
    if error.is_some() {
        return;
    }
    let result = match (report.as_mut(), event) {
        (None, Event::RunStarted(info)) => {
            ReportWriter::start(out, info, options).map(|w| *report = Some(w))
        }
        (Some(writer), event) => writer.push(event),
        (None, _) => Ok(()),
    };
    if let Err(e) = result {
        *error = Some(e);
    }
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
