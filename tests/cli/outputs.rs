//! The results of a run survive what users do to it: a console closed early, SIGTERM, a
//! kill -9, a journal that cannot be written, and an `--out` that holds an earlier run; and
//! the journal stays small next to the tables. Every test drives the real binary against
//! agents served on 127.0.0.1 by the test.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Child;
use tokio::sync::Notify;

use super::*;

/// A Connexity agent on 127.0.0.1 that answers every request after `delay`, or never.
struct SlowAgent {
    url: String,
    requests: Arc<AtomicUsize>,
    request_seen: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SlowAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SlowAgent {
    /// `None`: read the request and never answer.
    async fn start(delay: Option<Duration>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/agent/respond", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let request_seen = Arc::new(Notify::new());
        let (count, seen) = (requests.clone(), request_seen.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (count, seen) = (count.clone(), seen.clone());
                tokio::spawn(async move {
                    let _ = serve(stream, delay, &count, &seen).await;
                });
            }
        });
        SlowAgent {
            url,
            requests,
            request_seen,
            task,
        }
    }

    async fn wait_for_request(&self) {
        let seen = self.request_seen.notified();
        if self.requests.load(Ordering::SeqCst) == 0 {
            tokio::time::timeout(Duration::from_secs(30), seen)
                .await
                .expect("the agent got no request");
        }
    }
}

async fn serve(
    stream: TcpStream,
    delay: Option<Duration>,
    count: &AtomicUsize,
    seen: &Notify,
) -> std::io::Result<()> {
    let mut stream = BufReader::new(stream);
    loop {
        let mut content_length = 0usize;
        loop {
            let mut line = String::new();
            if stream.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            if line.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                content_length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; content_length];
        stream.read_exact(&mut body).await?;
        count.fetch_add(1, Ordering::SeqCst);
        seen.notify_waiters();
        match delay {
            Some(delay) => tokio::time::sleep(delay).await,
            None => std::future::pending::<()>().await,
        }
        let body = super::support::OK_BODY;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.get_mut().write_all(answer.as_bytes()).await?;
    }
}

/// A suite directory with one scenario per `(scenario, agent url, repeat)`.
fn suite(dir: &Path, scenarios: &[(&str, &str, u32)]) {
    let mut text = String::new();
    for (name, url, repeat) in scenarios {
        text.push_str(&format!(
            "agent \"{name}-agent\" protocol=\"connexity\" url=\"{url}\" {{ timeout \"60s\" }}\n\
             scenario \"{name}\" {{\n    agent \"{name}-agent\"\n    repeat {repeat}\n    \
             user \"hi\"\n    expect reply contains=\"Hello\"\n}}\n"
        ));
    }
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("suite.kdl"), text).unwrap();
}

fn spawn_run(suites: &Path, out: &Path, extra: &[&str]) -> Child {
    trellis()
        .arg("run")
        .arg(suites)
        .arg("--out")
        .arg(out)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

async fn wait(child: &mut Child, limit: Duration) -> ExitStatus {
    tokio::time::timeout(limit, child.wait())
        .await
        .expect("trellis did not exit in time")
        .unwrap()
}

/// Waits until the journal holds `n` trajectory lines.
async fn wait_for_trajectories(out: &Path, n: usize) {
    let started = Instant::now();
    loop {
        let lines = crate::journal_text(out)
            .lines()
            .filter(|l| l.starts_with("{\"trajectory\""))
            .count();
        if lines >= n {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the journal never got {n} trajectories"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn send(child: &Child, signal: i32) {
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on a child process id this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

/// Every results file is complete: the tables parse, the reports are closed documents, and
/// no temporary file is left behind.
fn assert_complete(out: &Path, trajectories: usize) {
    assert_eq!(
        read_parquet(&out.join("trajectories.parquet")).height(),
        trajectories
    );
    for table in ["turns", "tool_calls", "criteria", "runs"] {
        read_parquet(&out.join(format!("{table}.parquet")));
    }
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.trim_end().ends_with("</html>"), "report.html is cut");
    let junit = std::fs::read_to_string(out.join("junit.xml")).unwrap();
    assert!(
        junit.trim_end().ends_with("</testsuites>"),
        "junit.xml is cut"
    );
    assert_no_partial_files(out);
}

fn assert_no_partial_files(out: &Path) {
    let partial: Vec<_> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".partial"))
        .collect();
    assert!(partial.is_empty(), "left behind: {partial:?}");
}

fn journal_has_end(out: &Path) -> bool {
    crate::journal_text(out)
        .lines()
        .any(|l| l.starts_with("{\"run_finished\""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_closed_early_loses_no_result() {
    let agent = SlowAgent::start(Some(Duration::from_millis(100))).await;
    let dir = tempfile::tempdir().unwrap();
    suite(&dir.path().join("suites"), &[("slow", &agent.url, 6)]);
    let out = dir.path().join("out");
    let mut child = spawn_run(&dir.path().join("suites"), &out, &["--jobs", "1"]);
    // Like `trellis run … 2>&1 | head -1`: read one progress line, then close both pipes
    // while the run still has five trajectories to go.
    let stdout = child.stdout.take().unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    stderr.read_line(&mut first).await.unwrap();
    assert!(first.contains("PASS"), "{first}");
    drop(stderr);
    drop(stdout);

    let status = wait(&mut child, Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0), "the run's own exit code");
    assert!(journal_has_end(&out));
    assert_complete(&out, 6);
}

/// Output lost to a full disk (`/dev/full`) is not a reader that went away: the command
/// says so and exits 3, as for a results file it could not write; the run's results are
/// still written.
#[tokio::test]
async fn stdout_on_a_full_disk_exits_3_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    // `output()` would capture stdout whatever it is set to: spawned, with stderr piped.
    let on_full_disk = |cmd: &mut tokio::process::Command| {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        cmd.stdout(full)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
            .wait_with_output()
    };
    let out = dir.path().join("out");
    let o = on_full_disk(
        trellis()
            .args([
                "run",
                "suites/booking.kdl",
                "--message-format",
                "json",
                "--out",
            ])
            .arg(&out),
    )
    .await
    .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("could not write to stdout"), "{err}");
    assert_complete(
        &out,
        read_parquet(&out.join("trajectories.parquet")).height(),
    );
    let o = on_full_disk(trellis().args(["runs", "--json", "--dir"]).arg(dir.path()))
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    // Help and the version too: clap's own exit said 0.
    for args in [
        &["--help"][..],
        &["--version"],
        &["run", "--help"],
        &["help", "run"],
    ] {
        let o = on_full_disk(trellis().args(args)).await.unwrap();
        assert_eq!(o.status.code(), Some(3), "{args:?}: {}", stderr(&o));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_run_and_reports_what_finished() {
    let fast = SlowAgent::start(Some(Duration::ZERO)).await;
    let stuck = SlowAgent::start(None).await;
    let dir = tempfile::tempdir().unwrap();
    suite(
        &dir.path().join("suites"),
        &[("quick", &fast.url, 1), ("stuck", &stuck.url, 1)],
    );
    let out = dir.path().join("out");
    let child = spawn_run(&dir.path().join("suites"), &out, &[]);
    stuck.wait_for_request().await;
    wait_for_trajectories(&out, 1).await;

    send(&child, libc::SIGTERM);
    let signalled = Instant::now();
    let o = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("trellis did not exit after SIGTERM")
        .unwrap();
    assert_eq!(o.status.code(), Some(143), "{}", stderr(&o));
    // The call that never answers is given the grace period, then abandoned.
    assert!(signalled.elapsed() >= Duration::from_secs(4));
    assert!(stderr(&o).contains("SIGTERM"), "{}", stderr(&o));
    // The finished trajectory is in every file; the abandoned one in none.
    assert_complete(&out, 1);
    let t = read_parquet(&out.join("trajectories.parquet"));
    assert_eq!(strings(&t, "scenario"), [Some("quick".to_string())]);
    // A CI that reads only JUnit sees the run was cut short: one test case in error says so.
    let junit = std::fs::read_to_string(out.join("junit.xml")).unwrap();
    assert!(
        junit.contains(r#"<testcase name="the run covers its plan" classname="trellis""#)
            && junit.contains("1 of 2 planned trajectories recorded"),
        "{junit}"
    );
    let totals = junit
        .lines()
        .find(|l| l.starts_with("<testsuites"))
        .unwrap();
    assert!(
        totals.contains(r#"tests="2""#) && totals.contains(r#"errors="1""#),
        "{totals}"
    );
    assert_eq!(stuck.requests.load(Ordering::SeqCst), 1);
}

/// A closed terminal or SSH session (SIGHUP) stops the run as SIGTERM does: what finished
/// is written, and the exit code says which signal it was. Its default action killed the
/// run without results and left agent processes running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_stops_the_run_as_sigterm_does() {
    let agent = SlowAgent::start(Some(Duration::from_millis(200))).await;
    let dir = tempfile::tempdir().unwrap();
    suite(&dir.path().join("suites"), &[("slow", &agent.url, 20)]);
    let out = dir.path().join("out");
    let child = spawn_run(&dir.path().join("suites"), &out, &["--jobs", "1"]);
    wait_for_trajectories(&out, 1).await;
    send(&child, libc::SIGHUP);
    let o = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("trellis did not exit after SIGHUP")
        .unwrap();
    assert_eq!(o.status.code(), Some(129), "{}", stderr(&o));
    assert!(stderr(&o).contains("SIGHUP"), "{}", stderr(&o));
    let recorded = read_parquet(&out.join("trajectories.parquet")).height();
    assert!((1..20).contains(&recorded), "{recorded}");
    assert_complete(&out, recorded);
}

/// A CI cancelled as a run that ended by itself writes its results (the tables, the report)
/// must not leave a run that lists as finished without them: the signal lets them finish,
/// and the exit code says the command was stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_the_results_are_written_lets_them_finish() {
    let agent = SlowAgent::start(Some(Duration::ZERO)).await;
    let dir = tempfile::tempdir().unwrap();
    suite(&dir.path().join("suites"), &[("many", &agent.url, 3000)]);
    // The page is written last, under its temporary name, once every trajectory is done,
    // and for a few milliseconds only: on a loaded machine the test may not be scheduled
    // in that window. Missing it says nothing of trellis, so the run is made again (up to
    // three times) until the signal lands while the results are written.
    let mut attempt = 0;
    let (out, mut child) = loop {
        attempt += 1;
        let out = dir.path().join(format!("out{attempt}"));
        let log = std::fs::File::create(dir.path().join("stderr")).unwrap();
        let mut child = trellis()
            .arg("run")
            .arg(dir.path().join("suites"))
            .arg("--out")
            .arg(&out)
            .args(["--jobs", "64"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let page = out.join("report.html.partial");
        let started = Instant::now();
        let mut seen = true;
        while !page.exists() {
            if child.try_wait().unwrap().is_some() {
                seen = false;
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "no report was written"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if seen {
            break (out, child);
        }
        assert!(
            attempt < 3,
            "three runs ended before the test saw their report being written: make the run \
             larger"
        );
    };
    send(&child, libc::SIGTERM);
    let status = wait(&mut child, Duration::from_secs(60)).await;
    let said = std::fs::read_to_string(dir.path().join("stderr")).unwrap();
    assert_eq!(status.code(), Some(143), "{said}");
    assert!(
        said.contains("while its results were written") && said.contains("results are complete"),
        "{said}"
    );
    assert!(journal_has_end(&out));
    assert_complete(&out, 3000);
    assert!(out.join("summary.json").is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_stops_at_once() {
    let stuck = SlowAgent::start(None).await;
    let dir = tempfile::tempdir().unwrap();
    suite(&dir.path().join("suites"), &[("stuck", &stuck.url, 1)]);
    let out = dir.path().join("out");
    let mut child = spawn_run(&dir.path().join("suites"), &out, &[]);
    stuck.wait_for_request().await;

    send(&child, libc::SIGINT);
    let signalled = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    send(&child, libc::SIGINT);
    let status = wait(&mut child, Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(130));
    assert!(
        signalled.elapsed() < Duration::from_millis(4500),
        "waited out the grace period: {:?}",
        signalled.elapsed()
    );
    assert_complete(&out, 0);
    // What hung, and where: the call dropped unanswered, on the console and in `show`.
    let mut said = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut child.stdout.take().unwrap(), &mut said)
        .await
        .unwrap();
    let hung = "suite/stuck [stuck-agent #0] turn 0 (\"hi\"), waiting ";
    assert!(
        said.contains("1 agent call unanswered when the run stopped") && said.contains(hung),
        "{said}"
    );
    let o = trellis().arg("show").arg(&out).output().await.unwrap();
    assert!(stdout(&o).contains(hung), "{}", stdout(&o));
}

/// Calls dropped unanswered on two branches of one scenario name their branch: the two
/// lines are not the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_calls_name_their_branch() {
    let stuck = SlowAgent::start(None).await;
    let dir = tempfile::tempdir().unwrap();
    let suites = dir.path().join("suites");
    std::fs::create_dir_all(&suites).unwrap();
    std::fs::write(
        suites.join("s.kdl"),
        format!(
            "agent \"a\" protocol=\"connexity\" url=\"{}\" {{ timeout \"60s\" }}\n\
             scenario \"twin\" {{\n    branch \"left\" {{ user \"hi\"; }}\n    \
             branch \"right\" {{ user \"hi\"; }}\n    criteria {{ no-error; }}\n}}\n",
            stuck.url
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let mut child = spawn_run(&suites, &out, &[]);
    // Both branches' calls in flight.
    let started = Instant::now();
    while stuck.requests.load(Ordering::SeqCst) < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no two requests"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    send(&child, libc::SIGINT);
    tokio::time::sleep(Duration::from_millis(300)).await;
    send(&child, libc::SIGINT);
    let status = wait(&mut child, Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(130));
    let mut said = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut child.stdout.take().unwrap(), &mut said)
        .await
        .unwrap();
    assert!(said.contains("2 agent calls unanswered"), "{said}");
    assert!(said.contains("s/twin · left [a #0] turn 0"), "{said}");
    assert!(said.contains("s/twin · right [a #0] turn 0"), "{said}");
    // And the report's banner, which a person opens rather than the console.
    let page = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        page.contains("Agent calls unanswered when it stopped")
            && page.contains("twin · left [a #0] turn 0"),
        "not in the report"
    );
}

/// A stop ends a retry's wait (a 503 asking for 30 s) at once with the fault it would have
/// retried, recorded on the turn: no new call starts after a stop, and the wait is not sat
/// out until the grace period drops the call and its trajectory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ends_a_retrys_wait_with_its_fault_recorded() {
    use crate::support::{Behavior, MisbehavingServer};
    let agent = MisbehavingServer::start(Behavior::Unavailable {
        times: 100,
        retry_after: "30".into(),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suites = dir.path().join("suites");
    std::fs::create_dir_all(&suites).unwrap();
    std::fs::write(
        suites.join("suite.kdl"),
        format!(
            "agent \"down\" protocol=\"connexity\" url=\"{}\" {{ retries 2; timeout \"60s\" }}\n\
             scenario \"restarting\" {{\n    user \"hi\"\n    expect no-error\n}}\n",
            agent.url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let mut child = spawn_run(&suites, &out, &[]);
    let started = Instant::now();
    while agent.requests() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no request came"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    send(&child, libc::SIGINT);
    let signalled = Instant::now();
    let status = wait(&mut child, Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(130));
    assert!(
        signalled.elapsed() < Duration::from_millis(4500),
        "sat out the wait: {:?}",
        signalled.elapsed()
    );
    assert_eq!(agent.requests(), 1, "a retry was sent after the stop");
    let t = read_parquet(&out.join("trajectories.parquet"));
    assert_eq!(strings(&t, "status"), [Some("error".to_string())]);
    let turns = read_parquet(&out.join("turns.parquet"));
    let fault = strings(&turns, "fault_message");
    assert!(
        fault[0].as_deref().is_some_and(
            |m| m.contains("HTTP 503") && m.contains("not retried: the run was stopped")
        ),
        "{fault:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_run_leaves_no_unreadable_parquet_and_report_rebuilds_it() {
    let fast = SlowAgent::start(Some(Duration::ZERO)).await;
    let stuck = SlowAgent::start(None).await;
    let dir = tempfile::tempdir().unwrap();
    suite(
        &dir.path().join("suites"),
        &[("quick", &fast.url, 1), ("stuck", &stuck.url, 1)],
    );
    // Two runs side by side, as in runs/*/: one that finished, one killed mid-way.
    let runs = dir.path().join("runs");
    let finished = runs.join("finished");
    let o = trellis()
        .args(["run", "suites/", "--filter", "price-first", "--out"])
        .arg(&finished)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let killed = runs.join("killed");
    let mut child = spawn_run(&dir.path().join("suites"), &killed, &[]);
    stuck.wait_for_request().await;
    wait_for_trajectories(&killed, 1).await;
    child.start_kill().unwrap();
    wait(&mut child, Duration::from_secs(30)).await;

    // What `runs/*/trajectories.parquet` (or any `*.parquet`) globs find must all parse.
    let mut found = 0;
    for run in [&finished, &killed] {
        for entry in std::fs::read_dir(run).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "parquet") {
                let file = std::fs::File::open(&path).unwrap();
                if let Err(e) = ParquetReader::new(file).finish() {
                    panic!("{} is not readable: {e}", path.display());
                }
                found += 1;
            }
        }
    }
    assert_eq!(found, 7, "only the finished run has tables");

    let o = trellis().arg("report").arg(&killed).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("did not finish"), "{}", stdout(&o));
    assert_complete(&killed, 1);
}

#[tokio::test]
async fn a_journal_that_cannot_be_written_still_leaves_every_other_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    // Every write to /dev/full fails with ENOSPC: a full disk, for the journal only.
    std::os::unix::fs::symlink("/dev/full", out.join(crate::JOURNAL)).unwrap();
    let o = trellis()
        .args(["run", "suites/", "--filter", "price-first", "--out"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("results are incomplete"), "{err}");
    assert!(err.contains("journal"), "{err}");
    assert!(
        stdout(&o).contains("1 trajectory: 1 passed"),
        "{}",
        stdout(&o)
    );

    let t = read_parquet(&out.join("trajectories.parquet"));
    assert_eq!(strings(&t, "status"), [Some("passed".to_string())]);
    assert_eq!(read_parquet(&out.join("turns.parquet")).height(), 2);
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("price-first"));
    assert!(html.contains("Transcripts are not shown"));
    let junit = std::fs::read_to_string(out.join("junit.xml")).unwrap();
    assert!(junit.contains("price-first"));
}

#[tokio::test]
async fn a_results_file_that_cannot_be_written_leaves_no_partial_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    // The report is written under `report.html.partial` first: on /dev/full every write of
    // it fails with ENOSPC, as on a full disk.
    std::os::unix::fs::symlink("/dev/full", out.join("report.html.partial")).unwrap();
    let o = trellis()
        .args(["run", "suites/", "--filter", "price-first", "--out"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("report.html"), "{err}");
    let left: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !left.iter().any(|name| name.ends_with(".partial")),
        "{left:?}"
    );
    assert!(!out.join("report.html").exists(), "{left:?}");
    // Every other file is complete.
    let t = read_parquet(&out.join("trajectories.parquet"));
    assert_eq!(strings(&t, "status"), [Some("passed".to_string())]);
    assert!(out.join("junit.xml").is_file(), "{left:?}");
}

#[tokio::test]
async fn out_refuses_an_earlier_run_unless_told_to_replace_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let run = |extra: &'static [&'static str]| {
        let mut cmd = trellis();
        cmd.args(["run", "suites/", "--filter", "price-first", "--out"])
            .arg(&out)
            .args(extra);
        cmd
    };
    let o = run(&[]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let journal = std::fs::read(out.join(crate::JOURNAL)).unwrap();

    let o = run(&[]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--replace"), "{}", stderr(&o));
    assert_eq!(std::fs::read(out.join(crate::JOURNAL)).unwrap(), journal);

    let o = run(&["--replace"]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let replaced = std::fs::read(out.join(crate::JOURNAL)).unwrap();
    assert_ne!(replaced, journal, "a new run, with a new run id");
    assert_complete(&out, 1);
}

/// A directory without a run but with files of the names a run writes (a CI job's own
/// junit.xml) is refused as an earlier run is: they were overwritten without a word.
#[tokio::test]
async fn out_refuses_to_overwrite_results_files_that_are_not_a_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ci");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("junit.xml"), "<mine/>").unwrap();
    std::fs::write(out.join("notes.txt"), "kept").unwrap();
    let run = |extra: &'static [&'static str]| {
        let mut cmd = trellis();
        cmd.args(["run", "suites/", "--filter", "price-first", "--out"])
            .arg(&out)
            .args(extra);
        cmd
    };
    let o = run(&[]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        flat(&stderr(&o)).contains(
            "holds junit.xml, which this run would overwrite (and no run's journal); pass \
             --replace to overwrite it or choose another --out"
        ),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read_to_string(out.join("junit.xml")).unwrap(),
        "<mine/>"
    );
    assert!(!out.join(crate::JOURNAL).exists());

    let o = run(&["--replace"]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_complete(&out, 1);
    assert_eq!(
        std::fs::read_to_string(out.join("notes.txt")).unwrap(),
        "kept"
    );
}

/// Repetitions whose checks did not run for different reasons are listed apart: two that
/// answered (only the judged check skipped, no judge) are not said to have lost their
/// reply check to the fault two others had.
#[tokio::test]
async fn unchecked_repetitions_are_grouped_by_what_did_not_run() {
    let ok = (200, support::OK_BODY.to_owned());
    let down = (500, "down".to_owned());
    let server =
        support::MisbehavingServer::start(support::Behavior::Sequence(vec![ok.clone(), ok, down]))
            .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        format!(
            r#"agent "a" protocol="connexity" url="{}"
scenario "s" {{
    repeat 4
    user "Hi"
    expect reply contains="Hello"
    outcome "The agent greets the caller."
}}
"#,
            server.url()
        ),
    )
    .unwrap();
    let o = trellis()
        .args(["run", "--jobs", "1", "--out"])
        .arg(dir.path().join("r"))
        .arg(&suite)
        .output()
        .await
        .unwrap();
    let text = stdout(&o);
    assert!(text.contains("UNCHECKED s/s main [a #0 #1]"), "{text}");
    assert!(text.contains("UNCHECKED s/s main [a #2 #3]"), "{text}");
    let first = text.find("[a #0 #1]").unwrap();
    let second = text.find("[a #2 #3]").unwrap();
    // The two that answered lost only the judged check.
    assert!(!text[first..second].contains("reply contains"), "{text}");
    assert!(text[second..].contains("reply contains"), "{text}");
}

#[tokio::test]
async fn checks_that_did_not_run_are_shown_and_counted() {
    let out = tempfile::tempdir().unwrap();
    let o = trellis()
        .args(["run", "suites/", "--filter", "book-duct-cleaning", "--out"])
        .arg(out.path().join("r"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = stdout(&o);
    // 2 trajectories × 3 repetitions, each with an `outcome` and a `judge` and no judge.
    assert!(text.contains("12 checks did not run"), "{text}");
    assert!(
        text.contains("UNCHECKED booking/book-duct-cleaning accepts [demo #0 #1 #2]"),
        "{text}"
    );
    assert!(text.contains("no judge configured"), "{text}");

    let t = read_parquet(&out.path().join("r/trajectories.parquet"));
    let sum = |column: &str| -> u32 {
        t.column(column)
            .unwrap()
            .u32()
            .unwrap()
            .iter()
            .flatten()
            .sum()
    };
    let criteria = read_parquet(&out.path().join("r/criteria.parquet"));
    let with_status = |status: &str| {
        strings(&criteria, "status")
            .iter()
            .filter(|s| s.as_deref() == Some(status))
            .count() as u32
    };
    assert_eq!(sum("checks_skipped"), 12);
    assert_eq!(sum("checks_skipped"), with_status("skipped"));
    assert_eq!(sum("checks_passed"), with_status("passed"));
    assert_eq!(sum("checks_failed"), with_status("failed"));

    let html = std::fs::read_to_string(out.path().join("r/report.html")).unwrap();
    assert!(html.contains("12 checks did not run"));
    assert!(html.contains("Checks that did not run"));
}

#[tokio::test]

async fn strict_fails_a_trajectory_whose_checks_did_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = |strict: bool, out: &str| {
        let mut cmd = trellis();
        cmd.args(["run", "suites/", "--filter", "prompt-injection", "--out"])
            .arg(dir.path().join(out));
        if strict {
            cmd.arg("--strict");
        }
        cmd
    };
    // Its `judge` cannot run without a judge; everything else passes.
    let o = run(false, "lenient").output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(true, "strict").output().await.unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    // The failure says why, though no check failed.
    assert!(
        stdout(&o).contains("1 check did not run (--strict)"),
        "{}",
        stdout(&o)
    );
    let t = read_parquet(&dir.path().join("strict/trajectories.parquet"));
    assert_eq!(strings(&t, "status"), [Some("failed".to_string())]);
    let junit = std::fs::read_to_string(dir.path().join("strict/junit.xml")).unwrap();
    assert!(junit.contains("1 check did not run (--strict)"), "{junit}");
    assert!(junit.contains("no judge configured"), "{junit}");
}

#[tokio::test]
async fn list_and_graph_tolerate_a_closed_stdout() {
    for command in [["list", "suites/"], ["graph", "suites/"]] {
        let mut child = trellis()
            .args(command)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Closed before the command gets to print (like `| head -0`).
        drop(child.stdout.take());
        let o = child.wait_with_output().await.unwrap();
        assert_eq!(o.status.code(), Some(0), "{command:?}: {}", stderr(&o));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_finishes_in_the_grace_period_is_recorded() {
    let slow = SlowAgent::start(Some(Duration::from_millis(1500))).await;
    let dir = tempfile::tempdir().unwrap();
    suite(&dir.path().join("suites"), &[("slow", &slow.url, 1)]);
    let out = dir.path().join("out");
    let child = spawn_run(&dir.path().join("suites"), &out, &[]);
    slow.wait_for_request().await;

    send(&child, libc::SIGTERM);
    let signalled = Instant::now();
    let o = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("trellis did not exit after SIGTERM")
        .unwrap();
    assert_eq!(o.status.code(), Some(143), "{}", stderr(&o));
    assert!(
        signalled.elapsed() < Duration::from_millis(4500),
        "waited out the grace period although the call had finished"
    );
    assert_complete(&out, 1);
}

/// A run stopped by SIGTERM whose calls in flight all finished in the grace period ends its
/// journal properly; its report must still say that trajectories are missing, or its pass
/// rate reads like a complete run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_of_a_stopped_run_says_trajectories_are_missing() {
    let slow = SlowAgent::start(Some(Duration::from_millis(1000))).await;
    let dir = tempfile::tempdir().unwrap();
    let suites = dir.path().join("suites");
    std::fs::create_dir_all(&suites).unwrap();
    std::fs::write(
        suites.join("suite.kdl"),
        format!(
            "agent \"slow\" protocol=\"connexity\" url=\"{}\"\n\
             scenario \"two-turns\" {{\n    agent \"slow\"\n    repeat 2\n    user \"hi\"\n    \
             user \"again\"\n}}\n",
            slow.url
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let child = spawn_run(&suites, &out, &[]);
    slow.wait_for_request().await;

    send(&child, libc::SIGTERM);
    let o = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("trellis did not exit after SIGTERM")
        .unwrap();
    assert_eq!(o.status.code(), Some(143), "{}", stderr(&o));
    assert!(
        journal_has_end(&out),
        "the calls finished in the grace period"
    );
    assert_complete(&out, 0);
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        html.contains("Stopped before its end")
            && html.contains("covers 0 of 2 planned trajectories"),
        "the report does not say the run is incomplete"
    );
}

/// `trellis check suites/ 2>&1 | head -3`: the example suites draw warnings (stderr) and a
/// summary (stdout); a console closed before either is printed silences them, it does not
/// make `check` panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_tolerates_a_closed_stdout_and_stderr() {
    for close_stderr in [false, true] {
        let mut child = trellis()
            .args(["check", "suites/"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        if close_stderr {
            drop(child.stderr.take());
        }
        let o = child.wait_with_output().await.unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "stderr closed: {close_stderr}: {}",
            stderr(&o)
        );
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    }
}

#[tokio::test]
async fn the_report_counts_one_turn_and_one_check_in_the_singular() {
    let out = tempfile::tempdir().unwrap();
    let o = trellis()
        .args(["run", "suites/fixie.kdl", "--include-inactive", "--out"])
        .arg(out.path())
        .output()
        .await
        .unwrap();
    // `function-that-raises` (1 call, 1 check) errors on purpose.
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let html = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    assert!(html.contains(">1 turn ·"), "no `1 turn` in the report");
    assert!(!html.contains("1 turns"), "`1 turns` in the report");
    assert!(
        html.contains(">the 1 check<"),
        "no `the 1 check` in the report"
    );
    assert!(
        !html.contains("all 1 checks"),
        "`all 1 checks` in the report"
    );
}

/// Two runs never write into one directory at once, `--replace` or not: the second is
/// refused while the first holds it, and the first's results are whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_into_a_directory_in_use_is_refused() {
    let stuck = SlowAgent::start(Some(Duration::from_secs(2))).await;
    let dir = tempfile::tempdir().unwrap();
    suite(&dir.path().join("suites"), &[("slow", &stuck.url, 1)]);
    let out = dir.path().join("out");
    let mut first = spawn_run(&dir.path().join("suites"), &out, &[]);
    stuck.wait_for_request().await;
    let second = trellis()
        .arg("run")
        .arg(dir.path().join("suites"))
        .arg("--out")
        .arg(&out)
        .arg("--replace")
        .output()
        .await
        .unwrap();
    assert_eq!(second.status.code(), Some(2), "{}", stderr(&second));
    assert!(
        stderr(&second).contains("another trellis run is writing to"),
        "{}",
        stderr(&second)
    );
    let status = wait(&mut first, Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0));
    assert_complete(&out, 1);
    // Once the first run is over, the directory can be replaced.
    let third = trellis()
        .arg("run")
        .arg(dir.path().join("suites"))
        .arg("--out")
        .arg(&out)
        .arg("--replace")
        .output()
        .await
        .unwrap();
    assert_eq!(third.status.code(), Some(0), "{}", stderr(&third));
}

/// A judge on a slow model is still answering when the run is stopped: the conversation is
/// complete, so the trajectory is kept, with the unanswered check recorded as not run, and
/// without a verdict (`skipped`, not passed); `--resume` runs it again, judge included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_a_judge_answers_keeps_the_trajectory() {
    use super::support::llm::{FakeLlm, Reply, Rule};
    let pass = r#"{"score": 1, "label": "pass", "justification": "greets"}"#;
    let fake = FakeLlm::start(vec![Rule::otherwise([
        Reply::slow(Duration::from_secs(120), Reply::text(pass)),
        Reply::text(pass),
    ])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suites = dir.path().join("suites");
    std::fs::create_dir_all(&suites).unwrap();
    std::fs::write(
        suites.join("judged.kdl"),
        format!(
            r#"
agent "demo" protocol="connexity" builtin="booking"
provider "slow" kind="openai" base-url="{}" model="m"
scenario "book" {{
    user "Hi, I'd like to book a duct cleaning."
    criteria {{
        judge "SLOW-CHECK the agent greets"
    }}
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let child = spawn_run(&suites, &out, &[]);
    let asked = Instant::now();
    while fake.calls() == 0 {
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "the judge was never asked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    send(&child, libc::SIGTERM);
    let o = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("trellis did not exit after SIGTERM")
        .unwrap();
    assert_eq!(o.status.code(), Some(143), "{}", stderr(&o));
    assert_complete(&out, 1);
    let c = read_parquet(&out.join("criteria.parquet"));
    let criteria = strings(&c, "criterion");
    let at = criteria
        .iter()
        .position(|s| s.as_deref() == Some("judge \"SLOW-CHECK the agent greets\""))
        .unwrap_or_else(|| panic!("{criteria:?}"));
    assert_eq!(strings(&c, "status")[at].as_deref(), Some("skipped"));
    assert!(
        strings(&c, "detail")[at]
            .as_deref()
            .unwrap_or_default()
            .contains("stopped before the judge answered"),
        "{c:?}"
    );
    let t = read_parquet(&out.join("trajectories.parquet"));
    assert_eq!(strings(&t, "status"), [Some("skipped".to_owned())], "{t}");

    let o = trellis()
        .arg("run")
        .arg(&suites)
        .arg("--resume")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 2, "the resumed run asks the judge again");
    let t = read_parquet(&out.join("trajectories.parquet"));
    assert_eq!(strings(&t, "status"), [Some("passed".to_owned())], "{t}");
    let c = read_parquet(&out.join("criteria.parquet"));
    assert_eq!(strings(&c, "status"), [Some("passed".to_owned())], "{c}");
}

/// A judged check no judge would answer (none configured) is skipped for that reason when a
/// stop comes while its trajectory ends: it was recorded "stopped before the judge answered",
/// which was false, and made the trajectory one for `--resume` to run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_does_not_say_a_judge_never_configured_was_cut_off() {
    use super::support::{Behavior, MisbehavingServer, OK_BODY};
    let server = MisbehavingServer::start(Behavior::Delayed {
        delay: Duration::from_millis(1500),
        body: OK_BODY.to_owned(),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suites = dir.path().join("suites");
    std::fs::create_dir_all(&suites).unwrap();
    std::fs::write(
        suites.join("unjudged.kdl"),
        format!(
            r#"
agent "slow" protocol="connexity" url="{}"
scenario "greets" {{
    user "Hi"
    criteria {{
        judge "the agent greets"
    }}
}}
"#,
            server.url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let child = spawn_run(&suites, &out, &[]);
    let asked = Instant::now();
    while server.requests() == 0 {
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "the agent was never asked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    send(&child, libc::SIGTERM);
    let o = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("trellis did not exit after SIGTERM")
        .unwrap();
    assert_eq!(o.status.code(), Some(143), "{}", stderr(&o));
    let c = read_parquet(&out.join("criteria.parquet"));
    let details = strings(&c, "detail");
    assert_eq!(details.len(), 1, "{c}");
    let detail = details[0].as_deref().unwrap_or_default();
    assert!(!detail.contains("stopped"), "{detail}");
    assert!(detail.contains("no judge"), "{detail}");
}

/// The journal is the crash-safe source of truth but no longer 28 times the tables:
/// one-turn trajectories (the worst case: least text per timing) stay within twice them.
#[tokio::test]
async fn the_journal_stays_within_twice_the_parquet_tables() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    std::fs::write(
        &suite,
        r#"agent "booking" protocol="connexity" builtin="booking"
scenario "one-turn" {
    repeat 2000
    user "Hi, I'd like to book a duct cleaning."
    expect reply contains="postal code"
}
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .args(["-q", "--jobs", "64", "--out"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let parquet: u64 = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".parquet"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    let journal = std::fs::metadata(out.join(crate::JOURNAL)).unwrap().len();
    let json = journal_text(&out).len() as u64;
    assert!(
        journal <= 2 * parquet,
        "journal {journal} bytes, Parquet tables {parquet} bytes"
    );
    assert!(json > 10 * journal, "{json} bytes of JSON in {journal}");
    let trajectories = crate::journal_text(&out)
        .lines()
        .filter(|l| l.starts_with("{\"trajectory\""))
        .count();
    assert_eq!(trajectories, 2000);
}

/// Two journals joined into one (`cat a b`): `trellis report` refuses it, naming where the
/// second run starts, instead of reporting both runs' trajectories as one run's.
#[tokio::test]
async fn a_journal_holding_two_runs_is_refused_by_report() {
    let dir = tempfile::tempdir().unwrap();
    let mut journals = Vec::new();
    for name in ["a", "b"] {
        let out = dir.path().join(name);
        let o = trellis()
            .args([
                "run",
                "suites/booking.kdl",
                "--filter",
                "price-first",
                "-q",
                "--out",
            ])
            .arg(&out)
            .output()
            .await
            .unwrap();
        assert!(matches!(o.status.code(), Some(0 | 1)), "{}", stderr(&o));
        journals.push(std::fs::read(out.join("journal.jsonl.zst")).unwrap());
    }
    let joined = dir.path().join("joined");
    std::fs::create_dir_all(&joined).unwrap();
    // zstd frames concatenate into one stream: the joined file reads as both journals.
    std::fs::write(joined.join("journal.jsonl.zst"), journals.concat()).unwrap();
    let o = trellis().arg("report").arg(&joined).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(said.contains("holds more than one run"), "{said}");
    assert!(!joined.join("trajectories.parquet").exists());
    assert_no_partial_files(&joined);
}

/// A pseudo-terminal that reports no size (`script`, some CI runners), or one too narrow for
/// the table's columns, gets full rows, not cells wrapped to one character; `COLUMNS` gives
/// the width when set.
#[tokio::test]
async fn a_terminal_without_a_size_gets_readable_tables() {
    let dir = tempfile::tempdir().unwrap();
    for (width, columns) in [(0, None), (0, Some("160")), (20, None)] {
        let mut cmd = trellis();
        cmd.args(["run", "suites/booking.kdl", "--replace", "--out"])
            .arg(dir.path().join("out"))
            .env_remove("COLUMNS")
            .stderr(Stdio::null());
        if let Some(columns) = columns {
            cmd.env("COLUMNS", columns);
        }
        let master = crate::stdout_on_terminal(&mut cmd, 0, width);
        let mut child = cmd.spawn().unwrap();
        // The command holds its copy of the slave end until dropped: the reads below end
        // only once no slave end is left open.
        drop(cmd);
        // Drain the terminal while the run writes (the child holds the only slave end).
        let reader = std::thread::spawn(move || {
            use std::io::Read as _;
            let mut file = std::fs::File::from(master);
            let mut out = Vec::new();
            let mut buf = [0u8; 4096];
            // Linux ends a pty's reads with EIO once the last slave end is closed.
            while let Ok(n) = file.read(&mut buf) {
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&buf[..n]);
            }
            String::from_utf8_lossy(&out).into_owned()
        });
        let status = wait(&mut child, Duration::from_secs(60)).await;
        assert_eq!(
            status.code(),
            Some(1),
            "one branch of booking fails on purpose"
        );
        let out = reader.join().unwrap();
        let row = |words: &[&str]| out.lines().any(|l| words.iter().all(|w| l.contains(w)));
        assert!(
            row(&["suite", "scenario", "pass rate"]),
            "the header on one line: {columns:?}: {out}"
        );
        assert!(
            row(&["booking", "┆", "book-duct-cleaning", "┆", "demo"]),
            "a row on one line: {columns:?}: {out}"
        );
    }
}

/// A fork of many branches: each transcript shown links a dozen of its node's siblings and
/// counts the rest, so the page grows with the transcripts, not with transcripts × siblings.
#[tokio::test]
async fn a_wide_fork_lists_a_dozen_siblings_per_transcript_and_counts_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let branches: String = (0..40)
        .map(|i| format!("    branch \"b{i}\" {{ user \"option {i}\"; expect reply contains=\"never said\"; }}\n"))
        .collect();
    let suite = dir.path().join("wide.kdl");
    std::fs::write(
        &suite,
        format!(
            "agent \"demo\" protocol=\"connexity\" builtin=\"booking\"\nscenario \"wide\" {{\n    user \"hi\"\n{branches}}}\n"
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    let lists: Vec<&str> = html
        .split("<span class=\"siblings\">")
        .skip(1)
        .map(|s| &s[..s.find("</span>").unwrap_or(s.len())])
        .collect();
    assert_eq!(lists.len(), 40, "one per transcript");
    for list in lists {
        assert_eq!(list.matches("<a href=").count(), 12, "{list}");
        assert!(list.ends_with(", and 27 more"), "{list}");
    }
}

/// junit.xml lists its cases in the plan's order, not in the order they finished: the
/// first planned scenario answers last here, and the repetitions and branches of the
/// second finish in whatever order the machine gives.
#[tokio::test]
async fn junit_lists_cases_in_the_plans_order_not_as_they_finished() {
    use super::support::{Behavior, MisbehavingServer, OK_BODY};
    let slow = MisbehavingServer::start(Behavior::Delayed {
        delay: Duration::from_millis(400),
        body: OK_BODY.to_owned(),
    })
    .await;
    let fast = MisbehavingServer::start(Behavior::Delayed {
        delay: Duration::ZERO,
        body: OK_BODY.to_owned(),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("order.kdl"),
        format!(
            "agent \"slow\" protocol=\"connexity\" url=\"{}\"\n\
             agent \"fast\" protocol=\"connexity\" url=\"{}\"\n\
             scenario \"first\" {{\n    agent \"slow\"\n    user \"hi\"\n    expect no-error\n}}\n\
             scenario \"second\" {{\n    agents \"fast\" \"slow\"\n    repeat 3\n    \
             user \"hi\"\n    branch \"b\" {{\n        user \"b\"\n    }}\n    \
             branch \"a\" {{\n        user \"a\"\n    }}\n    expect no-error\n}}\n",
            slow.url(),
            fast.url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path())
        .args(["-q", "--out"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let junit = std::fs::read_to_string(out.join("junit.xml")).unwrap();
    let names = case_names(&junit);
    let mut expected = vec!["first/main [slow #0]".to_owned()];
    for agent in ["fast", "slow"] {
        for rep in 0..3 {
            for branch in ["b", "a"] {
                expected.push(format!("second/{branch} [{agent} #{rep}]"));
            }
        }
    }
    assert_eq!(names, expected, "{junit}");
    // The journal has them as they finished: the slow scenario after the fast agent's.
    let finished: Vec<String> = journal_text(&out)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|e| Some(e.get("trajectory")?["scenario"].as_str()?.to_owned()))
        .collect();
    assert_ne!(finished.first().map(String::as_str), Some("first"));
}

/// An agent's forks come after the trajectory they fork from, ordered by their names, so
/// that they are listed alike in every run whichever finished first.
#[tokio::test]
async fn junit_lists_an_agents_forks_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(repo("suites/multiagent.kdl"))
        .args(["-q", "--filter", "complaint", "--out"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let junit = std::fs::read_to_string(out.join("junit.xml")).unwrap();
    let names = case_names(&junit);
    let expected: Vec<String> = [
        "support-http",
        "support-process",
        "support-tcp",
        "support-unix",
    ]
    .iter()
    .flat_map(|agent| {
        ["main~refund", "main~replacement"].map(|t| format!("complaint/{t} [{agent} #0]"))
    })
    .collect();
    assert_eq!(names, expected, "{junit}");
}

/// The names of junit.xml's test cases, in the file's order.
fn case_names(junit: &str) -> Vec<&str> {
    junit
        .lines()
        .filter_map(|l| l.trim().strip_prefix("<testcase name=\""))
        .filter_map(|l| l.split('"').next())
        .collect()
}

/// A TMPDIR that does not exist, or is too long for a socket's address, costs nothing: the
/// JUnit cases spill into the run's directory, and the socket builtin agent binds in /tmp
/// (both failed: junit.xml not written, and every call to `support` a setup fault).
#[tokio::test]
async fn an_unusable_tmpdir_loses_no_result_and_fails_no_agent() {
    let work = tempfile::tempdir().unwrap();
    let long = work.path().join("d".repeat(110));
    std::fs::create_dir_all(&long).unwrap();
    for (name, tmpdir) in [("missing", work.path().join("no/such/dir")), ("long", long)] {
        let out = work.path().join(name);
        let o = trellis()
            .args(["run", "suites", "-q", "--out"])
            .arg(&out)
            .env("TMPDIR", &tmpdir)
            .output()
            .await
            .unwrap();
        let said = format!("{}{}", stdout(&o), stderr(&o));
        assert_eq!(o.status.code(), Some(1), "{name}: {said}");
        assert!(out.join("junit.xml").is_file(), "{name}: {said}");
        assert!(!said.contains("setup fault"), "{name}: {said}");
        let trajectories = read_parquet(&out.join("trajectories.parquet"));
        let faults = strings(&trajectories, "fault_category");
        assert!(
            !faults.iter().any(|f| f.as_deref() == Some("setup")),
            "{name}: {faults:?}"
        );
    }
}

/// A run with more trajectories than the page lists: the filter bar's count says it is of
/// the listed ones ("500 of 500 shown" read as every failure of 600 being on the page), in
/// a real browser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_filter_count_of_a_page_that_lists_part_of_a_run_says_listed() {
    let binary = trellis_testkit::browser::chromium();
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"many\" {\n    repeat 600\n    user \"hi\"\n    expect reply contains=\"never said\"\n}\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .args(["run", "-q", "--out"])
        .arg(&out)
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let url = format!(
        "file://{}",
        out.join("report.html").canonicalize().unwrap().display()
    );
    tokio::task::block_in_place(|| {
        let mut browser = trellis_testkit::browser::Browser::launch(&binary);
        browser.page("Page.navigate", serde_json::json!({ "url": url }));
        browser.wait_for_event("Page.loadEventFired");
        let listed = browser
            .eval("document.querySelectorAll('details.run').length")
            .as_u64()
            .unwrap();
        assert!(listed < 600, "{listed} listed");
        assert_eq!(
            browser.eval("document.getElementById('shown').textContent"),
            format!("{listed} of {listed} listed shown")
        );
        assert!(
            browser
                .eval("document.querySelector('.filters + .note').textContent")
                .as_str()
                .unwrap()
                .contains(&format!("Not listed here: {} non-passing", 600 - listed)),
        );
    });
}

/// `compare.json` is a results file of `run --baseline`: one that cannot be written makes
/// the results incomplete (exit 3, said as an error), whatever the gate's verdict, and the
/// comparison's other files are still written.
#[tokio::test]
async fn a_comparison_that_cannot_be_written_is_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    let o = trellis()
        .args(["run", "suites/", "--filter", "price-first", "-q", "--out"])
        .arg(&base)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let head = dir.path().join("head");
    std::fs::create_dir(&head).unwrap();
    std::os::unix::fs::symlink("/dev/full", head.join("compare.json.partial")).unwrap();
    let o = trellis()
        .args(["run", "suites/", "--filter", "price-first", "-q", "--out"])
        .arg(&head)
        .arg("--baseline")
        .arg(&base)
        .output()
        .await
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("error:") && err.contains("compare.json"),
        "{err}"
    );
    assert!(head.join("compare.html").is_file());
    assert!(
        std::fs::read_to_string(head.join("junit.xml"))
            .unwrap()
            .contains("trellis gate")
    );
}
