//! The `trellis` binary end to end: real processes, real sockets, files read back.
//! One test binary for the CLI (just-style).

/// The shared test support, under the name the tests use.
mod support {
    pub use trellis_testkit::*;
}

mod a2a;
mod agent;
mod attack;
mod calibrate;
mod complete;
mod dataset;
mod diagnostics;
mod faults;
mod fidelity;
mod fmt;
mod history;
mod import;
mod import_connexity;
mod import_multiagent;
mod init;
mod judges;
mod llm_budget;
mod lsp;
mod multiagent;
mod otel;
mod outputs;
mod perf;
mod repo;
mod resume;
mod run;
mod shard;
mod tls;
mod variance;
mod watch;

use std::path::{Path, PathBuf};
use std::process::Output;

use polars_core::prelude::*;
use polars_io::prelude::*;

pub fn trellis() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_trellis"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd.kill_on_drop(true);
    without_runner_shards(&mut cmd);
    cmd
}

/// Makes a new pseudo-terminal `cmd`'s stdout, in a session of its own, and returns the
/// terminal's other end, to read what it writes. The terminal reports `rows` × `columns`
/// (0 × 0: no size, as `script` and some CI runners give). In a session of its own the
/// command has no controlling terminal but this one, whatever terminal the test was started
/// from, so the size it reads is this one's.
pub fn stdout_on_terminal(
    cmd: &mut tokio::process::Command,
    rows: u16,
    columns: u16,
) -> std::os::fd::OwnedFd {
    use std::os::fd::{FromRawFd, OwnedFd};
    let size = libc::winsize {
        ws_row: rows,
        ws_col: columns,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two new descriptors into the given ints; the name and termios
    // pointers may be null, and the window size is read from `size`.
    let opened = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    assert_eq!(opened, 0, "openpty");
    // SAFETY: both were just opened by openpty and are owned here alone.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    cmd.stdout(std::process::Stdio::from(slave));
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    master
}

/// The variables by which a CI runner or Kubernetes tells `trellis run` its shard: tests
/// that run on such a runner (GitLab `parallel`, Buildkite `parallelism`) must not have every
/// run they start take only part of its suite. Tests of sharding set them themselves.
pub const RUNNER_SHARD_VARS: [&str; 7] = [
    "JOB_COMPLETION_INDEX",
    "TRELLIS_SHARDS",
    "TRELLIS_SHARD",
    "CI_NODE_INDEX",
    "CI_NODE_TOTAL",
    "BUILDKITE_PARALLEL_JOB",
    "BUILDKITE_PARALLEL_JOB_COUNT",
];

pub fn without_runner_shards(cmd: &mut tokio::process::Command) {
    for name in RUNNER_SHARD_VARS {
        cmd.env_remove(name);
    }
    // Tests run as a GitHub Actions step would otherwise annotate that workflow and append
    // to its job summary; the tests of that set these themselves.
    cmd.env_remove("GITHUB_ACTIONS");
    cmd.env_remove("GITHUB_STEP_SUMMARY");
}

/// A loopback port nothing listens on, held for as long as the returned socket lives: it is
/// bound but not listening, so connections to it are refused, and no other test's server can
/// take it meanwhile (a port merely freed was, once, by a server of a test running beside,
/// and the "down" agent answered).
pub fn refused_port() -> (tokio::net::TcpSocket, u16) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind("127.0.0.1:0".parse().expect("an address"))
        .expect("bound");
    let port = socket.local_addr().expect("its address").port();
    (socket, port)
}

pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `trellis check PATH`.
pub async fn check(path: &Path) -> Output {
    trellis().arg("check").arg(path).output().await.unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Diagnostics without miette's line wrapping: words joined by single spaces.
pub fn flat(text: &str) -> String {
    text.split_whitespace()
        .filter(|w| *w != "|")
        .collect::<Vec<_>>()
        .join(" ")
}

/// A run directory's journal as plain JSON lines (it is written zstd-compressed); empty when
/// the directory holds none. A journal still being written reads up to its last flush.
pub fn journal_text(dir: &Path) -> String {
    let Some(path) = trellis_engine::journal::find(dir) else {
        return String::new();
    };
    let mut reader = trellis_engine::journal::JournalReader::open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut text = String::new();
    while let Some(line) = reader
        .next_line()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    {
        text.push_str(&String::from_utf8_lossy(line));
        text.push('\n');
    }
    text
}

/// The journal's file name in a run directory.
pub const JOURNAL: &str = trellis_engine::journal::JOURNAL_FILE;

pub fn read_parquet(path: &Path) -> DataFrame {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    ParquetReader::new(file).finish().unwrap()
}

pub fn strings(df: &DataFrame, column: &str) -> Vec<Option<String>> {
    df.column(column)
        .unwrap()
        .str()
        .unwrap()
        .iter()
        .map(|s| s.map(str::to_string))
        .collect()
}
