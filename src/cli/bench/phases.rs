//! Where a measured `trellis run`'s wall time went: `bench --table` splits each run it times
//! into its start, the run itself, the writing of its results and its exit.
//!
//! The run marks the moments between them as it passes them ([`mark`], three clock reads
//! per run, whether or not anyone asks), and when [`ENV`] names a file it writes them there
//! as it exits ([`write_if_asked`]). `bench --table` sets [`ENV`] for each run it spawns and
//! reads the file back ([`Phases::read`]) against its own clock at the spawn and the reap:
//! the four parts add up to the wall time it measured. A binary that predates the marks
//! writes no file, and the table says so instead of splitting its wall time.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The environment variable naming the file a run writes its marks to.
pub(crate) const ENV: &str = "TRELLIS_BENCH_PHASES";

/// A moment of `trellis run` that [`mark`] records.
#[derive(Clone, Copy)]
pub(crate) enum Phase {
    /// The executor is handed the plan: the suites are loaded, the run directory and the
    /// recorder's thread exist.
    Run,
    /// The executor has returned: every trajectory has ended.
    Ran,
    /// The journal, tables, `report.html`, `junit.xml` and `summary.json` are written.
    Reported,
}

const NAMES: [&str; 3] = ["run", "ran", "reported"];

/// Microseconds since the Unix epoch at each [`Phase`]; 0 until marked. The wall clock, not
/// `Instant`: the reading side is another process.
static MARKS: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

pub(crate) fn mark(phase: Phase) {
    MARKS[phase as usize].store(micros(SystemTime::now()), Ordering::Relaxed);
}

/// As the process exits: writes the marks, and the exit itself, to the file [`ENV`] names,
/// if it names one. A file that cannot be written only leaves the table without a split.
pub(crate) fn write_if_asked() {
    let Some(path) = std::env::var_os(ENV) else {
        return;
    };
    let mut text = String::new();
    for (name, at) in NAMES.iter().zip(&MARKS) {
        let at = at.load(Ordering::Relaxed);
        if at != 0 {
            text.push_str(&format!("{name} {at}\n"));
        }
    }
    text.push_str(&format!("exiting {}\n", micros(SystemTime::now())));
    let _ = std::fs::write(path, text);
}

fn micros(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A measured run's wall time in four parts that add up to it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Phases {
    /// From the spawn to the executor's start: loading the program, parsing the arguments
    /// and suites, planning, creating the run directory.
    pub start: Duration,
    /// The executor, from its start to the end of the last trajectory.
    pub run: Duration,
    /// From there to the last result file written: the recorder catching up, the tables,
    /// the HTML, JUnit and summary.
    pub results: Duration,
    /// From there until the process was reaped: the console's last lines and the kernel
    /// taking the process down (its memory unmapped, its sockets closed).
    pub exit: Duration,
}

impl Phases {
    /// The split of the run spawned at `spawned` and reaped at `reaped` (this process's
    /// wall clock) from the marks it left at `path`; `None` when it left none (a binary
    /// without them, or a run that stopped before its results).
    pub(super) fn read(path: &Path, spawned: SystemTime, reaped: SystemTime) -> Option<Self> {
        let text = std::fs::read_to_string(path).ok()?;
        let at = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|micros| micros.trim().parse::<u64>().ok())
                .map(|micros| UNIX_EPOCH + Duration::from_micros(micros))
        };
        let (run, ran, reported) = (at("run")?, at("ran")?, at("reported")?);
        // Between two clocks read in two processes, a part can only come out negative by
        // the clock's own resolution: it is then nothing.
        let between =
            |from: SystemTime, to: SystemTime| to.duration_since(from).unwrap_or_default();
        Some(Phases {
            start: between(spawned, run),
            run: between(run, ran),
            results: between(ran, reported),
            exit: between(reported, reaped),
        })
    }
}

impl std::fmt::Display for Phases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        write!(
            f,
            "{:.1} · {:.1} · {:.1} · {:.1} ms",
            ms(self.start),
            ms(self.run),
            ms(self.results),
            ms(self.exit)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_add_up_to_the_spawn_to_the_reap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("phases");
        let spawned = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let at = |ms: u64| micros(spawned + Duration::from_millis(ms));
        std::fs::write(
            &path,
            format!(
                "run {}\nran {}\nreported {}\nexiting {}\n",
                at(4),
                at(104),
                at(120),
                at(121)
            ),
        )
        .unwrap();
        let reaped = spawned + Duration::from_millis(125);
        let phases = Phases::read(&path, spawned, reaped).unwrap();
        assert_eq!(phases.start, Duration::from_millis(4));
        assert_eq!(phases.run, Duration::from_millis(100));
        assert_eq!(phases.results, Duration::from_millis(16));
        assert_eq!(phases.exit, Duration::from_millis(5));
        assert_eq!(phases.to_string(), "4.0 · 100.0 · 16.0 · 5.0 ms");
    }

    #[test]
    fn a_run_that_left_no_marks_is_not_split() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("phases");
        let now = SystemTime::now();
        assert_eq!(Phases::read(&path, now, now), None);
        // Stopped before its results: no `reported`.
        std::fs::write(&path, "run 1\nran 2\nexiting 3\n").unwrap();
        assert_eq!(Phases::read(&path, now, now), None);
    }
}
