//! `trellis bench`: the engine's own cost, measured end to end in one process.
//!
//! Generates a suite of N trajectories of 4 turns against the builtin booking agent, runs
//! the full pipeline (load, plan, execute, journal, Parquet, HTML, JUnit) and prints
//! turns/second, whole-process CPU time per turn (engine and builtin agent together, report
//! writing included) and peak memory (max RSS).

use std::time::Instant;

use clap::Args;
use trellis_engine::plan::{Plan, Selection};

use super::{EXIT_FAILED, EXIT_INVALID, EXIT_OK};

pub(crate) mod phases;
mod table;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Trajectories to run (repetitions of one 4-turn scenario) [default: 10000; with
    /// --table, the one-turn trajectories of the throughput figure: 20000].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    trajectories: Option<u32>,
    /// Agent calls in flight at once.
    #[arg(long, short = 'j', default_value_t = 256, value_parser = super::jobs_in_range)]
    pub(super) jobs: usize,
    /// Measure this many runs and print each with the median (CPU timings on shared
    /// machines vary from run to run) [default: 3; with --table, 1: each timed figure is then
    /// the median of this many runs of every binary, taken in turns, with their range].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    runs: Option<u32>,
    /// Keep the run directories here (run-0, run-1, …; with --table, one per figure and
    /// binary) instead of a temporary directory.
    #[arg(long, value_name = "DIR")]
    out: Option<std::path::PathBuf>,
    /// Measure `trellis watch` instead: save an edit to one branch of a copy of the example
    /// suites --edits times and print the time from each save to the first updated result.
    #[arg(long)]
    watch: bool,
    /// With --watch: how many saves to time.
    #[arg(long, default_value_t = 10)]
    edits: u32,
    /// With --watch: the example suites to copy (they must hold booking.kdl). With
    /// --table: the suites `trellis check` is timed on.
    #[arg(long, value_name = "DIR", default_value = "suites")]
    suites: std::path::PathBuf,
    /// Print the figures a user feels, each from a fresh `trellis` process: throughput
    /// (20,000 one-turn trajectories; as a share of wrk's when wrk is installed), the
    /// latency-bound case (a 50 ms agent at c=256), a 2,000-trajectory run's wall time and
    /// peak memory, one trajectory's wall time, `trellis check`, the journal's size next to
    /// the Parquet tables, and the binary's size.
    #[arg(long, conflicts_with = "watch")]
    table: bool,
    /// With --table: measure this agent (a Connexity endpoint, e.g. an nginx returning a
    /// fixed answer) instead of the loopback one trellis serves itself.
    #[arg(long, requires = "table", value_name = "URL")]
    url: Option<String>,
    /// With --table: measure this trellis binary instead of the running one; give it
    /// more than once to measure binaries side by side (before and after a change), each
    /// figure for every binary before the next figure.
    #[arg(long, requires = "table", value_name = "PATH")]
    exe: Vec<std::path::PathBuf>,
    /// Serve the loopback Connexity agent --table measures (it answers every turn alike,
    /// after MS milliseconds: 50 is the latency-bound figure's), print its URL as the first
    /// line of stdout and serve until Ctrl-C or SIGTERM, which stop it cleanly (exit 0), as
    /// `trellis agent` does: to run or profile one figure's suite by hand against it.
    #[arg(
        long,
        value_name = "MS",
        conflicts_with_all = [
            "table", "watch", "url", "exe", "trajectories", "jobs", "runs", "out", "edits",
            "suites",
        ]
    )]
    serve_agent: Option<u64>,
}

const TURNS: u64 = 4;

pub fn bench(args: BenchArgs) -> u8 {
    if args.watch {
        return super::watch::bench::bench(&args.suites, args.edits.max(1));
    }
    if let Some(ms) = args.serve_agent {
        return table::serve_agent(std::time::Duration::from_millis(ms));
    }
    if args.table {
        return table::table(&table::TableArgs {
            url: args.url,
            exes: args.exe,
            throughput_trajectories: args.trajectories.unwrap_or(20_000),
            suites: args.suites,
            out: args.out,
            rounds: args.runs.unwrap_or(1),
        });
    }
    let runs = args.runs.unwrap_or(3);
    let trajectories = args.trajectories.unwrap_or(10_000);
    let Ok(dir) = tempfile::tempdir() else {
        super::console::errln!("error: cannot create a temporary directory");
        return EXIT_INVALID;
    };
    let suite = dir.path().join("bench.kdl");
    let text = format!(
        r##"agent "booking" protocol="connexity" builtin="booking"
scenario "bench" {{
    repeat {n}
    user "Hi, I'd like to book a duct cleaning."
    expect reply contains="postal code"
    user "It's V4T 0A7."
    expect tool "check_service_area" zone="V4T0A7"
    user "Tuesday works."
    expect reply matches=#"(?i)booked"#
    user "Thanks, bye."
    criteria {{
        no-error
        tool "create_booking"
        turns max=4
    }}
}}
"##,
        n = trajectories
    );
    if let Err(e) = std::fs::write(&suite, text) {
        super::console::errln!("error: cannot write the bench suite: {e}");
        return EXIT_INVALID;
    }
    let expected = u64::from(trajectories) * TURNS;
    super::console::outln!(
        "{} trajectories × {TURNS} turns against the builtin agent, --jobs {}, {}",
        trajectories,
        args.jobs,
        super::console::count(u64::from(runs), "run", "runs")
    );
    super::console::outln!(
        "CPU is whole-process (engine, builtin agent, journal, Parquet, HTML, JUnit).\n"
    );
    super::console::outln!(
        "{:>4} {:>10} {:>12} {:>14} {:>18}",
        "run",
        "wall s",
        "turns/s",
        "CPU µs/turn",
        "reporting µs/turn"
    );
    let mut figures = Vec::new();
    for run in 0..runs {
        let out = match &args.out {
            Some(out) => out.join(format!("run-{run}")),
            None => dir.path().join(format!("run-{run}")),
        };
        let Some(f) = measure(&suite, &out, args.jobs) else {
            return EXIT_INVALID;
        };
        // Its run stopped by a signal (Ctrl-C reaches the whole process group): the
        // bench stops as that run did, with its exit code, not as a failed measurement.
        if matches!(
            f.exit_code,
            super::stop::EXIT_INTERRUPTED
                | super::stop::EXIT_TERMINATED
                | super::stop::EXIT_HUNG_UP
        ) {
            super::console::errln!("stopped during run {run}");
            return f.exit_code;
        }
        if f.turns != expected || f.exit_code != EXIT_OK {
            super::console::errln!(
                "error: run {run} took {} turns (expected {expected}) and exited {}",
                f.turns,
                f.exit_code
            );
            return EXIT_FAILED;
        }
        let per_turn = |secs: f64| secs * 1e6 / f.turns as f64;
        super::console::outln!(
            "{:>4} {:>10.2} {:>12.0} {:>14.1} {:>18.1}",
            run + 1,
            f.wall,
            f.turns as f64 / f.wall,
            per_turn(f.cpu),
            per_turn(f.report_cpu)
        );
        figures.push((f.turns as f64 / f.wall, per_turn(f.cpu)));
    }

    super::console::outln!(
        "\nmedian            {:.0} turns/s, {:.1} µs CPU per turn",
        median(figures.iter().map(|f| f.0).collect()),
        median(figures.iter().map(|f| f.1).collect())
    );
    super::console::outln!(
        "peak memory       {:.1} MiB (max RSS of the process)",
        peak_rss_mib()
    );
    EXIT_OK
}

struct Figures {
    turns: u64,
    wall: f64,
    cpu: f64,
    report_cpu: f64,
    exit_code: u8,
}

/// One full run: load, plan, execute, report.
fn measure(suite: &std::path::Path, out: &std::path::Path, jobs: usize) -> Option<Figures> {
    let cpu_before = cpu_time();
    let wall = Instant::now();
    let project = super::load(&[suite.to_path_buf()])?;
    let mut plan = match Plan::build(&project, &Selection::default()) {
        Ok(plan) => plan,
        Err(e) => {
            super::console::errln!("{:?}", miette::Report::new(e));
            return None;
        }
    };
    let settings = super::run::Settings {
        replay_users: None,
        jobs,
        quiet: true,
        silent: true,
        strict: false,
        json_events: false,
        llm_cache: trellis_engine::llm::LlmCache::disabled(),
        llm_budget: Default::default(),
        otlp_receiver: None,
        otlp_endpoint: None,
        spans_wait: trellis_engine::otel::DEFAULT_SPANS_WAIT,
        spans_grace: trellis_engine::otel::DEFAULT_SPANS_WAIT,
        signals: None,
        sites: None,
    };
    // As `trellis run` does: the journal records what each trajectory means.
    trellis_engine::fingerprint::stamp(&project, &mut plan);
    let outcome = match super::run::execute_plan(plan, "bench", out, &settings, None, None) {
        Ok(o) => o,
        Err(e) => {
            super::console::errln!("error: {e}");
            return None;
        }
    };
    Some(Figures {
        turns: outcome.summary.as_ref().map_or(0, |s| s.turns),
        wall: wall.elapsed().as_secs_f64(),
        cpu: cpu_time() - cpu_before,
        report_cpu: outcome.report_cpu,
        exit_code: outcome.exit_code,
    })
}

/// User + system CPU seconds of this process so far.
pub fn cpu_time() -> f64 {
    rusage_cpu(libc::RUSAGE_SELF)
}

/// User + system CPU seconds of the calling thread so far.
pub fn thread_cpu_time() -> f64 {
    rusage_cpu(libc::RUSAGE_THREAD)
}

fn rusage_cpu(who: libc::c_int) -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a full rusage into the pointer it is given.
    let usage = unsafe {
        if libc::getrusage(who, usage.as_mut_ptr()) != 0 {
            return 0.0;
        }
        usage.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

pub fn peak_rss_mib() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: as above.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return 0.0;
        }
        usage.assume_init()
    };
    // Linux reports ru_maxrss in KiB.
    usage.ru_maxrss as f64 / 1024.0
}

/// The median of `v` (at least one value); of an even number, the mean of the middle two:
/// the upper one paired the best throughput of two runs with the worst CPU, a figure of
/// neither run.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let half = v.len() / 2;
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 0 => (v[half - 1] + v[half]) / 2.0,
        _ => v[half],
    }
}

#[cfg(test)]
mod median_tests {
    #[test]
    fn the_median_of_two_runs_is_their_mean() {
        assert_eq!(super::median(vec![27_976.0, 24_184.0]), 26_080.0);
        assert_eq!(super::median(vec![3.0, 1.0, 2.0]), 2.0);
        assert!(super::median(Vec::new()).is_nan());
    }
}
