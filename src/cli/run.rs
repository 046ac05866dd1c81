//! `trellis run`: load, plan, execute with the journal and console as reporters on the
//! event stream, then turn the journal into Parquet, HTML and JUnit.

use std::path::Path;
use std::time::SystemTime;

use trellis_engine::event::{self, Event};
use trellis_engine::execute::{self, RunOptions};
use trellis_engine::journal::{JournalError, JournalWriter};
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
    /// CPU seconds of the reporter thread: journal, tables, HTML, JUnit (for `bench`).
    pub report_cpu: f64,
}

/// Runs a plan into `out` and writes every report. Shared by `run` and `bench`.
///
/// The engine runs on this thread's runtime; every reporter (journal, tables, console) runs
/// on a thread of its own fed by the event stream, so writing results never delays an agent
/// call and never inflates a measured latency.
pub fn execute_plan(
    plan: Plan,
    run_id: &str,
    out: &Path,
    jobs: usize,
    quiet: bool,
    silent: bool,
) -> Result<Outcome, String> {
    let journal = JournalWriter::create(out).map_err(|e| format!("{e}: {}", source(&e)))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let reporter = Reporter {
        journal,
        journal_error: None,
        report: None,
        report_error: None,
        report_options: trellis_reports::ReportOptions::default(),
        console: Console::new(plan.trajectory_count(), quiet, silent),
        out: out.to_path_buf(),
        summary: None,
    };
    let options = RunOptions {
        run_id: run_id.to_string(),
        jobs,
        stop: Default::default(),
        strict: false,
    };
    let (tx, mut rx) = event::channel();
    let reporter = std::thread::Builder::new()
        .name("trellis-reporter".into())
        .spawn(move || {
            let mut reporter = reporter;
            while let Some(event) = rx.blocking_recv() {
                reporter.on_event(&event);
            }
            (reporter, super::bench::thread_cpu_time())
        })
        .map_err(|e| format!("cannot start the reporter thread: {e}"))?;

    let interrupted = runtime.block_on(async {
        let mut engine = tokio::spawn(execute::run(plan, options, tx));
        tokio::select! {
            finished = &mut engine => {
                if let Err(e) = finished
                    && e.is_panic()
                {
                    // Units catch their own panics; this is one outside them. The run has no
                    // summary, so it exits 1 and reports what the journal holds.
                    eprintln!("error: trellis failed while running (a bug): {e}");
                }
                false
            }
            _ = tokio::signal::ctrl_c() => {
                if !silent {
                    eprintln!("interrupted: stopping; finished trajectories are kept and reported");
                }
                engine.abort();
                let _ = engine.await;
                true
            }
        }
    });
    // Dropping the runtime drops every task still holding an event sender, which ends the
    // reporter's stream; agent tasks of an aborted run are not waited for.
    runtime.shutdown_background();
    restore_default_interrupt();
    let (reporter, mut report_cpu) = reporter
        .join()
        .map_err(|_| "the reporter thread panicked".to_string())?;
    let Reporter {
        journal,
        journal_error,
        report,
        report_error,
        report_options,
        console,
        summary,
        ..
    } = reporter;
    if let Some(e) = journal_error {
        return Err(format!("{e}: {}", source(&e)));
    }
    // The HTML transcripts are read back from the journal: it must be complete on disk first.
    let journal_path = journal
        .finish()
        .map_err(|e| format!("{e}: {}", source(&e)))?;

    let cpu_before_finish = super::bench::thread_cpu_time();
    let files = match (report, report_error) {
        (Some(writer), None) => writer.finish(),
        (_, Some(e)) => Err(e),
        // No event reached the writer: rebuild from whatever the journal holds.
        (None, None) => trellis_reports::write_reports(out, &report_options),
    };
    report_cpu += super::bench::thread_cpu_time() - cpu_before_finish;
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

/// Everything that consumes the event stream: the journal first (it is what survives a
/// crash), then the result tables, then the console.
struct Reporter {
    journal: JournalWriter,
    journal_error: Option<JournalError>,
    report: Option<ReportWriter>,
    /// The first report error stops reporting (it is shown at the end) but never the run:
    /// the journal still records everything and `write_reports` can rebuild from it.
    report_error: Option<trellis_reports::ReportError>,
    report_options: trellis_reports::ReportOptions,
    console: Console,
    out: std::path::PathBuf,
    summary: Option<RunSummary>,
}

impl Reporter {
    fn on_event(&mut self, event: &Event) {
        if self.journal_error.is_none()
            && let Err(e) = self.journal.append(event)
        {
            self.journal_error = Some(e);
        }
        if self.report_error.is_none() {
            let result = match (self.report.as_mut(), event) {
                (None, Event::RunStarted(info)) => {
                    ReportWriter::start(&self.out, info, &self.report_options)
                        .map(|w| self.report = Some(w))
                }
                (Some(writer), event) => writer.push(event),
                (None, _) => Ok(()),
            };
            if let Err(e) = result {
                self.report_error = Some(e);
            }
        }
        if let Event::RunFinished(s) = event {
            self.summary = Some(s.clone());
        }
        self.console.on_event(event);
    }
}

/// Tokio keeps SIGINT once it has watched for it. Writing the reports is not worth trapping
/// the user for: from here on Ctrl-C stops the process (the journal is already on disk and
/// `trellis report` rebuilds the rest).
fn restore_default_interrupt() {
    // SAFETY: resetting a signal to its default disposition has no preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
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
