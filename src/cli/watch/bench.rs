//! `trellis bench --watch`: how long an author waits. Runs `trellis watch` as a child
//! process on a copy of the example suites, saves an edit to one branch of a scenario again
//! and again, and reads the child's output to time each save to the first updated result
//! and to the end of the rerun, with the agent calls each rerun made. Also reports the CPU
//! the watcher uses while idle.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::cli::console::{errln, outln};
use crate::cli::{EXIT_FAILED, EXIT_INVALID, EXIT_OK};

/// The line of `booking.kdl` edited: the first step of its `asks-price` branch.
const EDITED: &str = "user \"How much is that?\"";
const WAIT: Duration = Duration::from_secs(120);

pub fn bench(suites: &Path, edits: u32) -> u8 {
    let Ok(dir) = tempfile::tempdir() else {
        errln!("error: cannot create a temporary directory");
        return EXIT_INVALID;
    };
    let copy = dir.path().join("suites");
    if let Err(e) = copy_dir(suites, &copy) {
        errln!("error: cannot copy {}: {e}", suites.display());
        return EXIT_INVALID;
    }
    let edited = copy.join("booking.kdl");
    let original = match std::fs::read_to_string(&edited) {
        Ok(text) if text.contains(EDITED) => text,
        _ => {
            errln!("error: {} has no `{EDITED}` step to edit", edited.display());
            return EXIT_INVALID;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            errln!("error: cannot find the trellis executable: {e}");
            return EXIT_INVALID;
        }
    };
    let child = Command::new(exe)
        .arg("watch")
        .arg(&copy)
        .arg("--out")
        .arg(dir.path().join("runs"))
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            errln!("error: cannot start trellis watch: {e}");
            return EXIT_INVALID;
        }
    };
    let (tx, lines) = mpsc::channel::<(Instant, String)>();
    if let Some(stdout) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
    }
    let code = measure(&lines, &edited, &original, edits, child.id());
    // Our own child: ended by its id.
    let _ = child.kill();
    let _ = child.wait();
    code
}

fn measure(
    lines: &mpsc::Receiver<(Instant, String)>,
    edited: &Path,
    original: &str,
    edits: u32,
    pid: u32,
) -> u8 {
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    outln!(
        "trellis watch on a copy of the example suites ({build} build); each save edits the \
         first step of booking/book-duct-cleaning's `asks-price` branch\n"
    );
    if wait_for(lines, "watch: rerun 1 done").is_none() {
        errln!(
            "error: the first run did not finish within {}s",
            WAIT.as_secs()
        );
        return EXIT_FAILED;
    }
    // Idle: nothing changes, the watcher should not use the CPU at all.
    let idle = Duration::from_secs(3);
    let before = cpu_ticks(pid);
    std::thread::sleep(idle);
    let idle_ticks = cpu_ticks(pid)
        .zip(before)
        .map(|(after, before)| after - before);

    outln!(
        "{:>4} {:>16} {:>14} {:>12}",
        "save",
        "first result ms",
        "rerun done ms",
        "agent calls"
    );
    let mut first_results = Vec::new();
    let mut done = Vec::new();
    for edit in 1..=edits {
        // Let the previous rerun's reports settle, as an author's pause between saves.
        std::thread::sleep(Duration::from_millis(300));
        let text = original.replace(EDITED, &format!("user \"How much is that? (edit {edit})\""));
        let saved = Instant::now();
        if let Err(e) = atomic_write(edited, &text) {
            errln!("error: cannot save {}: {e}", edited.display());
            return EXIT_FAILED;
        }
        let Some(first) = wait_for(lines, "(steps changed)") else {
            errln!(
                "error: save {edit} produced no result within {}s",
                WAIT.as_secs()
            );
            return EXIT_FAILED;
        };
        let finished = format!("watch: rerun {} done", edit + 1);
        let Some(end) = wait_for(lines, &finished) else {
            errln!(
                "error: rerun {} did not finish within {}s",
                edit + 1,
                WAIT.as_secs()
            );
            return EXIT_FAILED;
        };
        // `…; 6 agent calls, 39 turns reused; …` (`1 agent call`)
        let calls = end
            .1
            .split_once(" agent call")
            .and_then(|(before, _)| before.rsplit(' ').next())
            .unwrap_or("?")
            .to_owned();
        let first_ms = first.0.duration_since(saved).as_secs_f64() * 1000.0;
        let done_ms = end.0.duration_since(saved).as_secs_f64() * 1000.0;
        outln!("{edit:>4} {first_ms:>16.0} {done_ms:>14.0} {calls:>12}");
        first_results.push(first_ms);
        done.push(done_ms);
    }
    let stats = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let median = v.get(v.len() / 2).copied().unwrap_or(0.0);
        let min = v.first().copied().unwrap_or(0.0);
        let max = v.last().copied().unwrap_or(0.0);
        format!("median {median:.0} ms, min {min:.0} ms, max {max:.0} ms")
    };
    outln!("\nsave to first updated result: {}", stats(first_results));
    outln!("save to rerun recorded:       {}", stats(done));
    match idle_ticks {
        Some(ticks) => outln!(
            "idle CPU over {}s:            {ticks} clock tick(s) (1 tick = 10 ms)",
            idle.as_secs()
        ),
        None => outln!("idle CPU: not measured (no /proc)"),
    }
    EXIT_OK
}

/// The next line containing `needle`, with when it was printed.
fn wait_for(lines: &mpsc::Receiver<(Instant, String)>, needle: &str) -> Option<(Instant, String)> {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        let (at, line) = lines.recv_timeout(left).ok()?;
        if line.contains(needle) {
            return Some((at, line));
        }
    }
}

/// User + system clock ticks the process has used (Linux `/proc/PID/stat`).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it are plain.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn atomic_write(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("kdl.swp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target: PathBuf = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}
