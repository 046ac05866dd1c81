//! `trellis bench --table`: the figures a person feels, each measured on a fresh `trellis`
//! process the way a user runs it (start-up, suite loading and the reports included).
//!
//! The agent is a loopback Connexity agent this command serves itself (optionally slowed,
//! for the latency-bound figure), or `--url` (an nginx returning a fixed answer is the
//! usual limit to compare with). When `wrk` is on the PATH, the same agent is also measured
//! with it, and throughput is given as a share of what wrk gets from the agent.
//!
//! One run of a figure on a shared VM says little (the same binary's throughput moves by a
//! third from one run to the next), so `--runs N` times each run N times for every binary,
//! the binaries taking turns, and prints the median with the range ([`Rounds`], [`spread`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use trellis_agents::fixed::serve;

use super::super::console::{errln, outln};
use super::super::{EXIT_FAILED, EXIT_INVALID, EXIT_OK};
use super::phases::{self, Phases};

/// What the table runs (README.md, "Performance").
pub struct TableArgs {
    pub url: Option<String>,
    /// The trellis binaries to measure side by side (none: this one).
    pub exes: Vec<PathBuf>,
    pub throughput_trajectories: u32,
    pub suites: PathBuf,
    /// Keep the suites and run directories here instead of a temporary directory.
    pub out: Option<PathBuf>,
    /// How many times each timed run is measured for every binary ([`Rounds`]).
    pub rounds: u32,
}

/// One measured process: wall time, peak RSS, exit code.
struct Measured {
    wall: Duration,
    max_rss_mib: f64,
    code: Option<i32>,
    /// Where a `trellis run`'s wall time went, when it was asked for its marks ([`run`]).
    phases: Option<Phases>,
}

pub fn table(args: &TableArgs) -> u8 {
    let exes = if args.exes.is_empty() {
        match std::env::current_exe() {
            Ok(exe) => vec![exe],
            Err(e) => {
                errln!("error: cannot find this trellis executable to measure it: {e}");
                return EXIT_INVALID;
            }
        }
    } else {
        // A binary that cannot be started would only give a column of failures.
        for exe in &args.exes {
            if !exe.is_file() {
                errln!(
                    "error: --exe {}: no such file (give the path to a trellis binary)",
                    exe.display()
                );
                return EXIT_INVALID;
            }
        }
        args.exes.clone()
    };
    let temp;
    let dir: &Path = match &args.out {
        Some(out) => {
            if let Err(e) = std::fs::create_dir_all(out) {
                errln!("error: cannot create {}: {e}", out.display());
                return EXIT_INVALID;
            }
            out
        }
        None => match tempfile::tempdir() {
            Ok(made) => {
                temp = made;
                temp.path()
            }
            Err(e) => {
                errln!("error: cannot create a temporary directory: {e}");
                return EXIT_INVALID;
            }
        },
    };
    let Some(runtime) = agent_runtime() else {
        return EXIT_INVALID;
    };
    let served = {
        let _runtime = runtime.enter();
        (serve(Duration::ZERO), serve(SLOW))
    };
    let (fast, slow) = match served {
        (Ok(fast), Ok(slow)) => (fast, slow),
        (Err(e), _) | (_, Err(e)) => {
            errln!("error: cannot start the loopback agent: {e}");
            return EXIT_INVALID;
        }
    };
    // The agents run on a thread of their own, beside the measured process, as a real
    // local agent would.
    std::thread::spawn(move || runtime.block_on(std::future::pending::<()>()));
    let url = args.url.clone().unwrap_or(fast);
    outln!("agent: {url}");
    for (i, exe) in exes.iter().enumerate() {
        outln!("[{}] {}", i + 1, exe.display());
    }
    outln!("");
    let mut table = Table {
        columns: exes.len(),
        ok: true,
    };
    table.header();

    // Each figure is measured for every binary before the next figure, and with more than
    // one round the binaries take turns within it, so that binaries compared side by side
    // see the same moments of the machine.
    let rounds = args.rounds.max(1);
    let n = args.throughput_trajectories;
    let suite = write_suite(dir, "throughput", &url, n);
    let mut wrk = Vec::new();
    let mut sizes = vec![None; exes.len()];
    let runs = Rounds::measure(&exes, rounds, |round, i, exe| {
        // wrk once a round, before the first binary of the round.
        if wrk.len() <= round as usize {
            wrk.push(wrk_requests_per_second(&url, dir));
        }
        let out = run_dir(dir, "throughput", i);
        let m = run(exe, &suite, &out, 256);
        if round + 1 == rounds {
            sizes[i] = m.as_ref().and_then(|_| journal_and_parquet(&out));
        }
        m
    });
    // turns/s of every round of each binary, in the order they ran.
    let throughput: Vec<Option<Vec<f64>>> = runs
        .iter()
        .map(|r| {
            r.as_ref().map(|r| {
                r.iter()
                    .map(|m| f64::from(n) / m.wall.as_secs_f64())
                    .collect()
            })
        })
        .collect();
    table.row(
        &format!("{n} one-turn trajectories, c=256: turns/s"),
        throughput
            .iter()
            .map(|t| t.as_ref().map(|t| spread(t, 0, ""))),
    );
    table.split(&runs);
    match wrk.into_iter().collect::<Result<Vec<f64>, String>>() {
        Ok(wrk) => {
            table.row(
                "  wrk on the same agent (c=64, 3 s): requests/s",
                exes.iter().map(|_| Some(spread(&wrk, 0, ""))),
            );
            table.row(
                "  turns/s ÷ wrk requests/s",
                throughput.iter().map(|t| {
                    t.as_ref().map(|t| {
                        // Each run against the wrk figure of its own round.
                        let ratios: Vec<f64> = t.iter().zip(&wrk).map(|(t, w)| t / w).collect();
                        spread(&ratios, 3, "")
                    })
                }),
            );
        }
        Err(why) => outln!("  ({why})"),
    }
    table.row(
        "  journal ÷ Parquet tables",
        sizes.iter().map(|s| {
            s.map(|(journal, parquet)| {
                format!(
                    "{:.2}× ({} / {} KB)",
                    journal as f64 / parquet as f64,
                    journal / 1000,
                    parquet / 1000
                )
            })
        }),
    );

    let suite = write_suite(dir, "latency", &slow, 2000);
    let ideal = SLOW.as_secs_f64() * (2000f64 / 256.0).ceil();
    let latency = Rounds::measure(&exes, rounds, |_, i, exe| {
        run(exe, &suite, &run_dir(dir, "latency", i), 256)
    });
    table.row(
        "2000 trajectories, c=256, 50 ms agent: wall ÷ ideal",
        latency.iter().map(|r| {
            r.as_ref().map(|r| {
                let walls = r.walls();
                if let [wall] = walls[..] {
                    format!("{:.2}× ({wall:.3} s)", wall / ideal)
                } else {
                    let ratios: Vec<f64> = walls.iter().map(|w| w / ideal).collect();
                    spread(&ratios, 2, "×")
                }
            })
        }),
    );
    table.split(&latency);
    match wrk_median_latency_ms(&slow, dir) {
        Ok(ms) => table.row(
            "  the agent alone (wrk, c=256): median latency",
            exes.iter().map(|_| Some(format!("{ms:.1} ms"))),
        ),
        Err(why) => outln!("  ({why})"),
    }

    let suite = write_suite(dir, "small", &url, 2000);
    let small = Rounds::measure(&exes, rounds, |_, i, exe| {
        run(exe, &suite, &run_dir(dir, "small", i), 64)
    });
    table.row(
        "2000 trajectories, c=64: wall (start and reports included)",
        small
            .iter()
            .map(|r| r.as_ref().map(|r| spread(&r.walls(), 3, " s"))),
    );
    table.split(&small);
    table.row(
        "  peak RSS",
        small.iter().map(|r| {
            r.as_ref().map(|r| {
                let rss: Vec<f64> = r.iter().map(|m| m.max_rss_mib).collect();
                spread(&rss, 1, " MiB")
            })
        }),
    );

    let one = dir.join("one.kdl");
    let text = "agent \"booking\" protocol=\"connexity\" builtin=\"booking\"\n\
                scenario \"one\" {\n    user \"Hi, I'd like to book a duct cleaning.\"\n    \
                expect reply contains=\"postal code\"\n}\n";
    let written = std::fs::write(&one, text).is_ok();
    let one_runs = Rounds::measure(&exes, 5, |_, i, exe| {
        written
            .then(|| run(exe, &one, &run_dir(dir, "one", i), 1))
            .flatten()
    });
    table.row(
        "one trajectory against the builtin agent: wall (best of 5)",
        one_runs.iter().map(|r| r.as_ref().map(Rounds::best_ms)),
    );

    if args.suites.exists() {
        let checks = Rounds::measure(&exes, 5, |_, _, exe| {
            measure(
                Command::new(exe)
                    .arg("check")
                    .arg(&args.suites)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null()),
                None,
            )
        });
        table.row(
            &format!("trellis check {}: wall (best of 5)", args.suites.display()),
            checks.iter().map(|r| r.as_ref().map(Rounds::best_ms)),
        );
    } else {
        outln!(
            "  (no {} to time `trellis check` on)",
            args.suites.display()
        );
    }
    table.row(
        "binary size",
        exes.iter().map(|exe| {
            let size = file_size(exe) as f64 / 1e6;
            Some(match stripped_size(exe) {
                Some(stripped) => {
                    format!("{size:.1} MB ({:.1} MB stripped)", stripped as f64 / 1e6)
                }
                None => format!("{size:.1} MB"),
            })
        }),
    );
    if table.ok { EXIT_OK } else { EXIT_FAILED }
}

/// The width of a binary's column: a run's split, `5.6 · 847.8 · 21.7 · 8.4 ms`, fits.
const COLUMN: usize = 28;

/// The printed table: a figure per row, a column per binary.
struct Table {
    columns: usize,
    /// Whether every figure was measured.
    ok: bool,
}

impl Table {
    fn header(&self) {
        let mut line = format!("{:<60}", "figure");
        for i in 0..self.columns {
            line.push_str(&format!(" {:<COLUMN$}", format!("[{}]", i + 1)));
        }
        outln!("{}", line.trim_end());
    }

    fn row(&mut self, figure: &str, values: impl Iterator<Item = Option<String>>) {
        let mut line = format!("{figure:<60}");
        for value in values {
            let value = value.unwrap_or_else(|| {
                self.ok = false;
                "failed".to_owned()
            });
            line.push_str(&format!(" {value:<COLUMN$}"));
        }
        outln!("{}", line.trim_end());
    }

    /// Under a timed run's row: where its wall time went ([`Phases`]), of the median run
    /// when there were several. A binary that leaves no marks gets a dash, not a failure:
    /// its figure above stands.
    fn split(&mut self, runs: &[Option<Rounds>]) {
        self.row(
            "  start · run · results · exit",
            runs.iter().map(|run| {
                run.as_ref()
                    .and_then(Rounds::median)
                    .map(|m| m.phases.map_or_else(|| "—".to_owned(), |p| p.to_string()))
            }),
        );
    }
}

/// The runtime the loopback agents are served on; `None` (said on stderr) when it cannot
/// start.
fn agent_runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            errln!("error: cannot start the loopback agent: {e}");
            None
        }
    }
}

/// `trellis bench --serve-agent MS`: the table's loopback agent alone, on this thread, until
/// Ctrl-C, SIGTERM or SIGHUP (exit 0, as `trellis agent` stops). Its URL is the first line of
/// stdout.
pub fn serve_agent(delay: Duration) -> u8 {
    let Some(runtime) = agent_runtime() else {
        return EXIT_INVALID;
    };
    runtime.block_on(async {
        let mut signals = super::super::stop::Signals::watch();
        match serve(delay) {
            Ok(url) => {
                outln!("{url}");
                let _ = std::io::Write::flush(&mut std::io::stdout());
                errln!(
                    "serving the loopback agent ({} ms); Ctrl-C to stop",
                    delay.as_millis()
                );
                signals.next().await;
                EXIT_OK
            }
            Err(e) => {
                errln!("error: cannot start the loopback agent: {e}");
                EXIT_INVALID
            }
        }
    })
}

/// The journal's size and the Parquet tables' in a run directory, when both are there.
fn journal_and_parquet(out: &Path) -> Option<(u64, u64)> {
    // Binaries before the journal was compressed write it plain.
    let journal = match file_size(&out.join(trellis_reports::JOURNAL_FILE)) {
        0 => file_size(&out.join(trellis_reports::PLAIN_JOURNAL_FILE)),
        size => size,
    };
    let parquet: u64 = std::fs::read_dir(out)
        .ok()?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "parquet"))
        .map(|e| file_size(&e.path()))
        .sum();
    (journal > 0 && parquet > 0).then_some((journal, parquet))
}

/// The delay of the slow agent (the latency-bound figure).
const SLOW: Duration = Duration::from_millis(50);

/// What `strip` would leave of the executable at `path`: its size without the symbol table
/// and its names (`.symtab`, `.strtab`, which the release profile keeps so that panics name
/// their functions) and without debug info. `None` when it is not an ELF file.
fn stripped_size(path: &Path) -> Option<u64> {
    use object::{Object as _, ObjectSection as _};
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let symbols: u64 = file
        .sections()
        .filter(|s| {
            s.name()
                .is_ok_and(|n| matches!(n, ".symtab" | ".strtab") || n.starts_with(".debug"))
        })
        .filter_map(|s| s.file_range())
        .map(|(_, size)| size)
        .sum();
    Some((data.len() as u64).saturating_sub(symbols))
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Every measured run of one binary for one figure, in the order they ran.
struct Rounds(Vec<Measured>);

impl Rounds {
    /// `rounds` runs of every binary in `exes`, taken in turns (each binary once, then each
    /// again): `each(round, i, exe)` measures binary `i` once. A binary with a run that
    /// failed gets `None`, and is not run again for this figure (its error was said once).
    fn measure(
        exes: &[PathBuf],
        rounds: u32,
        mut each: impl FnMut(u32, usize, &Path) -> Option<Measured>,
    ) -> Vec<Option<Rounds>> {
        let mut all: Vec<Option<Rounds>> = exes.iter().map(|_| Some(Rounds(Vec::new()))).collect();
        for round in 0..rounds {
            for (i, exe) in exes.iter().enumerate() {
                if let Some(done) = &mut all[i] {
                    match each(round, i, exe) {
                        Some(m) => done.0.push(m),
                        None => all[i] = None,
                    }
                }
            }
        }
        all
    }

    fn iter(&self) -> std::slice::Iter<'_, Measured> {
        self.0.iter()
    }

    /// Wall times in seconds, in the order the runs ran.
    fn walls(&self) -> Vec<f64> {
        self.iter().map(|m| m.wall.as_secs_f64()).collect()
    }

    /// The run of median wall time (the upper of the two middle ones of an even count):
    /// the one whose split is shown.
    fn median(&self) -> Option<&Measured> {
        let mut sorted: Vec<&Measured> = self.iter().collect();
        sorted.sort_by_key(|m| m.wall);
        sorted.get(sorted.len() / 2).copied()
    }

    /// The fastest run's wall time, in milliseconds.
    fn best_ms(&self) -> String {
        let best = self.iter().map(|m| m.wall).min().unwrap_or_default();
        format!("{:.1} ms", best.as_secs_f64() * 1000.0)
    }
}

/// One value with `decimals` decimals and its unit, or several as their median and their
/// range: `0.065 s (0.063–0.080)`.
fn spread(values: &[f64], decimals: usize, unit: &str) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted[..] {
        [] => "—".to_owned(),
        [one] => format!("{one:.decimals$}{unit}"),
        [first, .., last] => {
            let median = sorted[sorted.len() / 2];
            format!("{median:.decimals$}{unit} ({first:.decimals$}–{last:.decimals$})")
        }
    }
}

/// `n` one-turn trajectories of one scenario against `url`, checked for no fault.
fn write_suite(dir: &Path, name: &str, url: &str, n: u32) -> PathBuf {
    let path = dir.join(format!("{name}.kdl"));
    let text = format!(
        "agent \"agent\" protocol=\"connexity\" url=\"{url}\"\n\
         scenario \"{name}\" {{\n    repeat {n}\n    user \"hello\"\n    \
         criteria {{\n        no-error\n    }}\n}}\n"
    );
    // A write that fails shows as a run that cannot read its suite.
    let _ = std::fs::write(&path, text);
    path
}

/// Where binary `i` runs `figure`: a directory of its own under `dir`. A run reads the runs
/// beside it for its report's trends, so with every run side by side in `dir` each one read
/// the runs of the figures and binaries before it, work the first had less of.
fn run_dir(dir: &Path, figure: &str, i: usize) -> PathBuf {
    dir.join(format!("{figure}-{i}")).join("run")
}

/// `trellis run SUITE --out OUT --jobs J` as a user runs it; `None` (and says why) unless
/// every trajectory passed. The suites check only `no-error`: a failed trajectory is an agent
/// that refused, dropped or garbled a call, and a figure timed on faults measures them, not
/// the agent's answers.
fn run(exe: &Path, suite: &Path, out: &Path, jobs: usize) -> Option<Measured> {
    // Beside the run directory, which the run replaces.
    let marks = out.with_extension("phases");
    let m = measure(
        Command::new(exe)
            .arg("run")
            .arg(suite)
            .arg("--out")
            .arg(out)
            .arg("--replace")
            .args(["--quiet", "--jobs", &jobs.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        Some(&marks),
    )?;
    match m.code {
        Some(0) => Some(m),
        Some(1) => {
            errln!(
                "error: `trellis run {}` had trajectories that failed: the agent did not \
                 answer every call (is it up, and does it speak Connexity?); no figure from \
                 that run (`--out DIR` keeps it to look at)",
                suite.display(),
            );
            None
        }
        code => {
            errln!(
                "error: `trellis run {}` exited {code:?}; run it by hand to see why",
                suite.display()
            );
            None
        }
    }
}

/// Runs `cmd` and measures it: wall time from spawn to exit and the child's own peak RSS;
/// with `marks`, a `trellis run` asked to leave its marks there, read against this process's
/// clock at the spawn and the reap.
fn measure(cmd: &mut Command, marks: Option<&Path>) -> Option<Measured> {
    if let Some(marks) = marks {
        // A file left by an earlier bench with the same --out would pass for this run's.
        let _ = std::fs::remove_file(marks);
        cmd.env(phases::ENV, marks);
    }
    let spawned = SystemTime::now();
    let started = Instant::now();
    let child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            errln!("error: cannot start {cmd:?}: {e}");
            return None;
        }
    };
    let pid = libc::pid_t::try_from(child.id()).ok()?;
    let mut status = 0;
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: wait4 on a child this process spawned and has not waited for; it fills
    // `status` and a whole rusage.
    let usage = unsafe {
        if libc::wait4(pid, &mut status, 0, usage.as_mut_ptr()) != pid {
            return None;
        }
        usage.assume_init()
    };
    let wall = started.elapsed();
    let reaped = SystemTime::now();
    // The child was reaped by wait4: `Child`'s own wait would find nothing.
    std::mem::forget(child);
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    Some(Measured {
        wall,
        // Linux reports ru_maxrss in KiB.
        max_rss_mib: usage.ru_maxrss as f64 / 1024.0,
        code,
        phases: marks.and_then(|marks| Phases::read(marks, spawned, reaped)),
    })
}

/// What wrk gets from `url` (POSTing a Connexity request, 64 connections, 3 seconds), or
/// why there is no such figure.
fn wrk_requests_per_second(url: &str, dir: &Path) -> Result<f64, String> {
    let stdout = wrk(url, dir, &["-c64", "-d3s"])?;
    stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|rps| *rps > 0.0)
        .ok_or_else(|| format!("wrk gave no requests/s for {url}"))
}

/// The median latency in ms that wrk sees from `url` at 256 connections over 2 seconds:
/// what the slow agent itself takes at the latency figure's concurrency.
fn wrk_median_latency_ms(url: &str, dir: &Path) -> Result<f64, String> {
    let stdout = wrk(url, dir, &["-c256", "-d2s", "--latency"])?;
    stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("50%"))
        .and_then(|v| parse_wrk_duration_ms(v.trim()))
        .ok_or_else(|| format!("wrk gave no median latency for {url}"))
}

/// A duration as wrk prints it (`812.00us`, `52.30ms`, `1.02s`, `2.00m`), in ms.
fn parse_wrk_duration_ms(text: &str) -> Option<f64> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale = match unit {
        "us" => 1e-3,
        "ms" => 1.0,
        "s" => 1e3,
        "m" => 60e3,
        _ => return None,
    };
    Some(number * scale)
}

/// wrk's output for one run against `url` (one thread, POSTing a Connexity request, with
/// `args`), or why there is none. Its script is written into `dir`.
fn wrk(url: &str, dir: &Path, args: &[&str]) -> Result<String, String> {
    let script = dir.join("post.lua");
    std::fs::write(
        &script,
        "wrk.method = \"POST\"\n\
         wrk.body = '{\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}'\n\
         wrk.headers[\"Content-Type\"] = \"application/json\"\n",
    )
    .map_err(|e| format!("cannot write wrk's script: {e}"))?;
    let out = match Command::new("wrk")
        .arg("-t1")
        .args(args)
        .arg("-s")
        .arg(&script)
        .arg(url)
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err("install wrk to compare with the agent's own limit".into());
        }
        Err(e) => return Err(format!("cannot start wrk: {e}")),
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    // wrk counts answers of any status: an agent answering 404 or 500 is not measured.
    if out.status.success() && !stdout.contains("Non-2xx or 3xx responses") {
        return Ok(stdout);
    }
    let said = String::from_utf8_lossy(&out.stderr)
        .lines()
        .chain(stdout.lines())
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("no output")
        .to_string();
    Err(format!("wrk could not measure {url}: {said}"))
}

#[cfg(test)]
mod tests {
    use super::parse_wrk_duration_ms;

    #[test]
    fn wrk_durations_are_read_in_every_unit_it_prints() {
        assert_eq!(parse_wrk_duration_ms("52.30ms"), Some(52.3));
        assert_eq!(parse_wrk_duration_ms("812.00us"), Some(0.812));
        assert_eq!(parse_wrk_duration_ms("1.50s"), Some(1500.0));
        assert_eq!(parse_wrk_duration_ms("2.00m"), Some(120_000.0));
        assert_eq!(parse_wrk_duration_ms("52.30"), None);
        assert_eq!(parse_wrk_duration_ms("ms"), None);
        assert_eq!(parse_wrk_duration_ms("5h"), None);
    }
}
