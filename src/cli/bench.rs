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

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Trajectories to run (repetitions of one 4-turn scenario).
    #[arg(long, default_value_t = 10_000)]
    trajectories: u32,
    /// Agent calls in flight at once.
    #[arg(long, short = 'j', default_value_t = 256)]
    jobs: usize,
    /// Keep the run directory here instead of a temporary one.
    #[arg(long, value_name = "DIR")]
    out: Option<std::path::PathBuf>,
}

const TURNS: u64 = 4;

pub fn bench(args: BenchArgs) -> u8 {
    let Ok(dir) = tempfile::tempdir() else {
        eprintln!("error: cannot create a temporary directory");
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
        n = args.trajectories
    );
    if let Err(e) = std::fs::write(&suite, text) {
        eprintln!("error: cannot write the bench suite: {e}");
        return EXIT_INVALID;
    }
    let out = args.out.unwrap_or_else(|| dir.path().join("run"));

    let cpu_before = cpu_time();
    let wall = Instant::now();
    let Some(project) = super::load(&[suite]) else {
        return EXIT_INVALID;
    };
    let plan = match Plan::build(&project, &Selection::default()) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("{:?}", miette::Report::new(e));
            return EXIT_INVALID;
        }
    };
    let outcome = match super::run::execute_plan(plan, "bench", &out, args.jobs, true, true) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_FAILED;
        }
    };
    let wall = wall.elapsed().as_secs_f64();
    let cpu = cpu_time() - cpu_before;
    let turns = outcome.summary.as_ref().map_or(0, |s| s.turns);
    let expected = u64::from(args.trajectories) * TURNS;
    println!("trajectories      {}", args.trajectories);
    println!("turns             {turns} (expected {expected})");
    if let Some(s) = &outcome.summary {
        println!(
            "outcome           {} passed, {} failed, {} error",
            s.passed, s.failed, s.errors
        );
    }
    println!("jobs              {}", args.jobs);
    println!("wall time         {wall:.2} s");
    println!("turns/second      {:.0}", turns as f64 / wall);
    println!("CPU time          {cpu:.2} s (whole process: engine, builtin agent, reports)");
    println!(
        "CPU per turn      {:.1} µs",
        if turns == 0 {
            0.0
        } else {
            cpu * 1e6 / turns as f64
        }
    );
    println!("peak memory       {:.1} MiB (max RSS)", peak_rss_mib());
    if turns == expected && outcome.exit_code == EXIT_OK {
        EXIT_OK
    } else {
        EXIT_FAILED
    }
}

/// User + system CPU seconds of this process so far.
fn cpu_time() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a full rusage into the pointer it is given.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return 0.0;
        }
        usage.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn peak_rss_mib() -> f64 {
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
