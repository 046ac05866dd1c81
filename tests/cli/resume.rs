//! `trellis run --resume DIR`: a run killed with SIGKILL goes on in its own directory as the
//! same run. Finished trajectories are kept and never sent to the agent again (counted on a
//! real socket by a test server that records every request); a suite edit that changes a
//! finished trajectory is refused; a finished run, a locked directory and a directory
//! without a journal are told apart.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use trellis_engine::journal::JournalWriter;

use super::support::{Behavior, MisbehavingServer, OK_BODY};
use super::*;

/// A Connexity agent that answers "Hello there." after `delay` and records every request.
async fn agent(delay: Duration) -> MisbehavingServer {
    MisbehavingServer::start(Behavior::Delayed {
        delay,
        body: OK_BODY.into(),
    })
    .await
}

/// The user messages of each request the agent got, in order (a request carries the whole
/// conversation so far).
fn conversations(server: &MisbehavingServer) -> Vec<Vec<String>> {
    server
        .recorded()
        .iter()
        .map(|r| {
            r.json()["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "user")
                .map(|m| m["content"].as_str().unwrap().to_owned())
                .collect()
        })
        .collect()
}

/// `scenarios` one-turn scenarios `s0`, `s1`, … whose message names them, against `url`.
fn linear_suite(url: &str, scenarios: usize) -> String {
    let mut text =
        format!("agent \"bot\" protocol=\"connexity\" url=\"{url}\" {{ timeout \"30s\" }}\n");
    for i in 0..scenarios {
        text.push_str(&format!(
            "scenario \"s{i}\" {{\n    user \"hello s{i}\"\n    expect reply contains=\"Hello\"\n}}\n"
        ));
    }
    text
}

fn run_in(suite: &Path, extra: &[&str]) -> tokio::process::Command {
    let mut cmd = trellis();
    cmd.arg("run").arg(suite).args(extra);
    cmd
}

/// The journal's entries as JSON, in order.
fn entries(out: &Path) -> Vec<serde_json::Value> {
    journal_text(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The trajectories a run still writing has recorded: its journal's last line may be half
/// written, so only the lines that read whole count (`entries` insists on every line, for a
/// finished run; polled, it failed now and then on a loaded machine).
fn recorded_so_far(out: &Path) -> usize {
    journal_text(out)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e.get("trajectory").is_some())
        .count()
}

/// The `trajectory` entries of the journal.
fn trajectory_entries(out: &Path) -> Vec<serde_json::Value> {
    entries(out)
        .into_iter()
        .filter_map(|e| e.get("trajectory").cloned())
        .collect()
}

/// Rewrites `out`'s journal with only the lines `keep` accepts and no end, as a run killed
/// at that point leaves it (derived files are left as they were: resume replaces them).
fn cut_journal(out: &Path, keep: impl Fn(&serde_json::Value) -> bool) {
    let kept: Vec<String> = journal_text(out)
        .lines()
        .filter(|l| {
            let entry: serde_json::Value = serde_json::from_str(l).unwrap();
            entry.get("run_finished").is_none() && keep(&entry)
        })
        .map(str::to_owned)
        .collect();
    let mut writer = JournalWriter::create_at(&out.join(JOURNAL)).unwrap();
    for line in kept {
        writer.append_line(line.as_bytes()).unwrap();
    }
    // Not finished: the stream ends as a killed writer leaves it.
    drop(writer);
}

/// Whether a journal entry belongs to scenario `name` (nodes and trajectories).
fn of_scenario(entry: &serde_json::Value, name: &str) -> bool {
    ["node", "trajectory"]
        .iter()
        .any(|kind| entry.get(kind).is_some_and(|e| e["scenario"] == name))
}

/// (scenario, trajectory, repetition) of every row of `trajectories.parquet`, with how
/// often each appears.
fn trajectory_rows(out: &Path) -> BTreeMap<(String, String, u32), usize> {
    let t = read_parquet(&out.join("trajectories.parquet"));
    let scenarios = strings(&t, "scenario");
    let names = strings(&t, "trajectory");
    let reps: Vec<u32> = t
        .column("repetition")
        .unwrap()
        .u32()
        .unwrap()
        .iter()
        .map(Option::unwrap)
        .collect();
    let mut rows = BTreeMap::new();
    for ((s, n), r) in scenarios.into_iter().zip(names).zip(reps) {
        *rows.entry((s.unwrap(), n.unwrap(), r)).or_insert(0) += 1;
    }
    rows
}

/// Runs `suite` into `out` one call at a time and sends `signal` once the journal holds
/// `after` trajectories; returns the run's exit code.
async fn run_until(suite: &Path, out: &Path, after: usize, signal: i32) -> Option<i32> {
    let mut child = run_in(suite, &["--jobs", "1", "-q", "--out"])
        .arg(out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while recorded_so_far(out) < after {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the run never recorded {after} trajectories"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on a child process this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    child.wait().await.unwrap().code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_halfway_resumes_and_no_finished_trajectory_is_sent_again() {
    const SCENARIOS: usize = 12;
    let server = agent(Duration::from_millis(100)).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    std::fs::write(&suite, linear_suite(&server.url(), SCENARIOS)).unwrap();
    let out = dir.path().join("out");

    let code = run_until(&suite, &out, SCENARIOS / 2, libc::SIGKILL).await;
    assert_eq!(code, None, "killed by a signal");
    let run_id = entries(&out)[0]["run_started"]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let finished_before: Vec<String> = trajectory_entries(&out)
        .iter()
        .map(|t| t["scenario"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        finished_before.len() >= SCENARIOS / 2 && finished_before.len() < SCENARIOS,
        "killed halfway: {finished_before:?}"
    );
    assert!(!out.join("trajectories.parquet").exists());
    let sent_before = server.requests();

    let o = run_in(&suite, &["--jobs", "1", "--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("resuming run {run_id}")),
        "{}",
        stderr(&o)
    );

    // The agent heard each unfinished scenario once more and no finished one.
    let sent_after: Vec<String> = conversations(&server)[sent_before..]
        .iter()
        .map(|c| c.last().unwrap().clone())
        .collect();
    for s in &finished_before {
        assert!(
            !sent_after.contains(&format!("hello {s}")),
            "{s} finished before the kill and was sent again: {sent_after:?}"
        );
    }
    for i in 0..SCENARIOS {
        let s = format!("s{i}");
        if !finished_before.contains(&s) {
            let times = sent_after
                .iter()
                .filter(|m| **m == format!("hello {s}"))
                .count();
            assert_eq!(times, 1, "{s} after the resume: {sent_after:?}");
        }
    }

    // One run: every trajectory once in the tables and the journal, under the run's id.
    let rows = trajectory_rows(&out);
    assert_eq!(rows.len(), SCENARIOS, "{rows:?}");
    assert!(rows.values().all(|&n| n == 1), "{rows:?}");
    let t = read_parquet(&out.join("trajectories.parquet"));
    assert!(
        strings(&t, "run_id")
            .iter()
            .all(|id| id.as_deref() == Some(&*run_id))
    );
    assert!(
        strings(&t, "status")
            .iter()
            .all(|s| s.as_deref() == Some("passed"))
    );
    assert_eq!(read_parquet(&out.join("turns.parquet")).height(), SCENARIOS);
    let all = entries(&out);
    let starts: Vec<_> = all
        .iter()
        .filter(|e| e.get("run_started").is_some())
        .collect();
    assert_eq!(starts.len(), 1);
    assert_eq!(starts[0]["run_started"]["run_id"], run_id.as_str());
    assert_eq!(
        starts[0]["run_started"]["resumed_at"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    assert_eq!(trajectory_entries(&out).len(), SCENARIOS);
    let end = &all.last().unwrap()["run_finished"];
    assert_eq!(end["trajectories"], SCENARIOS);
    assert_eq!(end["passed"], SCENARIOS);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let aggregates = &summary["stats"]["aggregates"];
    assert_eq!(aggregates["finished"], true);
    assert_eq!(aggregates["counts"]["passed"], SCENARIOS);
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(!html.contains("Did not finish"));
    let junit = std::fs::read_to_string(out.join("junit.xml")).unwrap();
    assert!(junit.contains(&format!("tests=\"{SCENARIOS}\"")), "{junit}");
    assert!(!std::fs::read_dir(&out).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".partial")
    }));

    // Once more: the run is over, nothing runs.
    let sent = server.requests();
    let o = run_in(&suite, &["--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("already finished"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("changed since"), "{}", stderr(&o));
    assert_eq!(server.requests(), sent);
    // Edited since: still nothing runs, and it says the edit did not run.
    let text = std::fs::read_to_string(&suite).unwrap();
    std::fs::write(&suite, format!("{text}\n// edited\n")).unwrap();
    let o = run_in(&suite, &["--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("changed since this run"),
        "{}",
        stderr(&o)
    );
    assert_eq!(server.requests(), sent);
    std::fs::write(&suite, text).unwrap();
    // A gate that asks for --strict does not pass on verdicts decided without it.
    let o = run_in(&suite, &["--strict", "--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("recorded without --strict"),
        "{}",
        stderr(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stopped_by_sigterm_goes_on_where_it_stopped() {
    let server = agent(Duration::from_millis(100)).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    std::fs::write(&suite, linear_suite(&server.url(), 6)).unwrap();
    let out = dir.path().join("out");
    assert_eq!(run_until(&suite, &out, 2, libc::SIGTERM).await, Some(143));
    // A graceful stop writes the journal's end, with fewer trajectories than planned.
    assert!(journal_text(&out).contains("\"run_finished\""));
    let finished_before: Vec<String> = trajectory_entries(&out)
        .iter()
        .map(|t| t["scenario"].as_str().unwrap().to_owned())
        .collect();
    assert!(finished_before.len() < 6, "{finished_before:?}");
    let sent_before = server.requests();
    let o = run_in(&suite, &["--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let sent_after: Vec<String> = conversations(&server)[sent_before..]
        .iter()
        .map(|c| c[0].clone())
        .collect();
    assert_eq!(
        sent_after.len(),
        6 - finished_before.len(),
        "{sent_after:?}"
    );
    for s in &finished_before {
        assert!(
            !sent_after.contains(&format!("hello {s}")),
            "{s} sent again"
        );
    }
    let rows = trajectory_rows(&out);
    assert_eq!(rows.len(), 6);
    assert!(rows.values().all(|&n| n == 1));
    let ends = entries(&out)
        .iter()
        .filter(|e| e.get("run_finished").is_some())
        .count();
    assert_eq!(ends, 1, "the stopped attempt's end is not kept");
}

/// A scenario whose need the stop cut short is left for `--resume`, not recorded skipped
/// "because its need did not pass": resumed, the need passes and so does the dependant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependant_of_a_need_the_stop_cut_short_runs_when_resumed() {
    let server = agent(Duration::from_millis(300)).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    std::fs::write(
        &suite,
        format!(
            "agent \"bot\" protocol=\"connexity\" url=\"{}\" {{ timeout \"30s\" }}\n\
             scenario \"login\" {{\n    user \"hello login\"\n    user \"again\"\n    \
             expect reply contains=\"Hello\"\n}}\n\
             scenario \"after-login\" {{\n    needs \"login\"\n    user \"hello after\"\n    \
             expect reply contains=\"Hello\"\n}}\n",
            server.url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let mut child = run_in(&suite, &["-q", "--out"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while server.requests() == 0 {
        assert!(started.elapsed() < Duration::from_secs(60), "no request");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on a child process this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    assert_eq!(child.wait().await.unwrap().code(), Some(130));
    let recorded: Vec<String> = trajectory_entries(&out)
        .iter()
        .map(|t| format!("{} {}", t["scenario"], t["status"]))
        .collect();
    assert!(recorded.is_empty(), "{recorded:?}");

    let o = run_in(&suite, &["--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut recorded: Vec<String> = trajectory_entries(&out)
        .iter()
        .map(|t| format!("{} {}", t["scenario"], t["status"]))
        .collect();
    recorded.sort();
    assert_eq!(
        recorded,
        ["\"after-login\" \"passed\"", "\"login\" \"passed\""]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_that_drops_calls_in_flight_still_records_the_runs_end() {
    let fast = agent(Duration::ZERO).await;
    let stuck = agent(Duration::from_secs(120)).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    std::fs::write(
        &suite,
        format!(
            "agent \"fast\" protocol=\"connexity\" url=\"{}\"\n\
             agent \"stuck\" protocol=\"connexity\" url=\"{}\" {{ timeout \"300s\" }}\n\
             scenario \"quick\" {{\n    agent \"fast\"\n    user \"hi\"\n    \
             expect reply contains=\"Hello\"\n}}\n\
             scenario \"hung\" {{\n    agent \"stuck\"\n    user \"hi\"\n    \
             expect reply contains=\"Hello\"\n}}\n",
            fast.url(),
            stuck.url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let mut child = run_in(&suite, &["--jobs", "2", "--out"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while recorded_so_far(&out) == 0 || stuck.requests() == 0 {
        assert!(started.elapsed() < Duration::from_secs(60), "never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    // The second SIGTERM drops the call still waiting on the stuck agent at once, as the
    // end of the grace period would. It is sent once the first has been taken (said on
    // stderr): two sent at once can arrive as one.
    use tokio::io::AsyncBufReadExt as _;
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut said = String::new();
    // SAFETY: kill(2) on a child process this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    while !said.contains("stopping:") {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the stop is said")
            .unwrap()
            .expect("stderr open until the stop is said");
        said.push_str(&line);
        said.push('\n');
    }
    // SAFETY: as above; the child has not exited (it waits for its stuck call).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    while let Some(line) = lines.next_line().await.unwrap() {
        said.push_str(&line);
        said.push('\n');
    }
    let o = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the run ended")
        .unwrap();
    assert_eq!(o.status.code(), Some(143), "{said}");
    assert!(said.contains("again: stopping now"), "{said}");
    // A stop, not a crash: the journal has its end, which says the run was cut short.
    let end = entries(&out)
        .into_iter()
        .find_map(|e| e.get("run_finished").cloned())
        .expect("the journal records the run's end");
    assert_eq!(end["interrupted"], true, "{end}");
    assert_eq!(end["passed"], 1, "{end}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        summary["stats"]["aggregates"]["finished"], true,
        "{summary}"
    );
    assert_eq!(
        summary["stats"]["aggregates"]["interrupted"], true,
        "{summary}"
    );
    // The console's table lists what finished.
    assert!(stdout(&o).contains("quick"), "{}", stdout(&o));
    let runs = trellis()
        .args(["runs", "--dir"])
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    assert!(stdout(&runs).contains("stopped"), "{}", stdout(&runs));
}

const TREE: &str = r#"
scenario "tree" {
    user "tree start"
    expect reply contains="Hello"
    branch "a" {
        user "tree branch a"
        expect reply contains="Hello"
    }
    branch "b" {
        user "tree branch b"
        expect reply contains="Hello"
    }
}
"#;

/// The tree suite run to its end against `server`, then its journal cut as if the run was
/// killed just after branch `a` was recorded: the shared `start` is in the journal on `a`'s
/// path, branch `b` is not. The directory, the suite file, its text and the run's `--out`.
async fn tree_cut_after_a(
    server: &MisbehavingServer,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    String,
    std::path::PathBuf,
) {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let text = format!("{}{TREE}", linear_suite(&server.url(), 0));
    std::fs::write(&suite, &text).unwrap();
    let out = dir.path().join("out");
    let o = run_in(&suite, &["--jobs", "1", "--out"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    cut_journal(&out, |e| {
        let node = e.get("node").map(|n| n["node"].as_str().unwrap());
        let trajectory = e
            .get("trajectory")
            .map(|t| t["trajectory"].as_str().unwrap());
        node != Some("b") && trajectory != Some("b")
    });
    (dir, suite, text, out)
}

#[tokio::test]
async fn an_unfinished_branch_sends_the_shared_prefix_again_and_a_finished_one_nothing() {
    let server = agent(Duration::ZERO).await;
    let (_dir, suite, _, out) = tree_cut_after_a(&server).await;
    let sent_before = server.requests();

    let o = run_in(&suite, &["--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let sent: Vec<Vec<String>> = conversations(&server)[sent_before..].to_vec();
    assert_eq!(
        sent,
        [
            vec!["tree start".to_owned()],
            vec!["tree start".to_owned(), "tree branch b".to_owned()]
        ]
    );
    let rows = trajectory_rows(&out);
    assert_eq!(
        rows.keys().map(|(_, t, _)| t.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert!(rows.values().all(|&n| n == 1));
    // `b`'s own node holds the prefix it sent again, marked as a replay, and its record
    // has the prefix's check, judged on that replay.
    let nodes: Vec<serde_json::Value> = entries(&out)
        .into_iter()
        .filter_map(|e| e.get("node").cloned())
        .collect();
    assert_eq!(
        nodes
            .iter()
            .map(|n| n["node"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["start", "a", "b"]
    );
    let replayed: Vec<bool> = nodes[2]["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["replay"].as_bool().unwrap_or(false))
        .collect();
    assert_eq!(replayed, [true, false]);
    let b = trajectory_entries(&out)
        .into_iter()
        .find(|t| t["trajectory"] == "b")
        .unwrap();
    assert_eq!(b["status"], "passed");
    assert_eq!(b["nodes"], serde_json::json!(["start", "b"]));
    assert_eq!(b["criteria"].as_array().unwrap().len(), 2, "{b}");
    assert_eq!(read_parquet(&out.join("turns.parquet")).height(), 4);
}

#[tokio::test]
async fn an_edit_to_a_finished_trajectory_is_refused_and_other_edits_resume() {
    let server = agent(Duration::ZERO).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let original = linear_suite(&server.url(), 4);
    std::fs::write(&suite, &original).unwrap();
    let out = dir.path().join("out");
    let o = run_in(&suite, &["--out"]).arg(&out).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let fingerprint = || {
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
        meta["suite_fingerprint"].as_str().unwrap().to_owned()
    };
    let started_as = fingerprint();
    // Killed when s0 and s1 had finished.
    cut_journal(&out, |e| !of_scenario(e, "s2") && !of_scenario(e, "s3"));
    let journal = std::fs::read(out.join(JOURNAL)).unwrap();
    let sent_before = server.requests();

    let refused = |text: String, extra: &'static [&'static str], why: &'static str| {
        let suite = suite.clone();
        let out = out.clone();
        let journal = journal.clone();
        async move {
            std::fs::write(&suite, text).unwrap();
            let o = run_in(&suite, extra)
                .arg("--resume")
                .arg(&out)
                .output()
                .await
                .unwrap();
            assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
            let err = stderr(&o);
            assert!(err.contains("cannot resume run"), "{err}");
            assert!(err.contains(why), "{err}");
            assert_eq!(std::fs::read(out.join(JOURNAL)).unwrap(), journal, "{err}");
        }
    };
    refused(
        original.replace("hello s0", "hello there s0"),
        &[],
        "suite/s0 main [bot]: what it sends changed",
    )
    .await;
    refused(
        original.replace(
            "user \"hello s1\"\n    expect reply contains=\"Hello\"",
            "user \"hello s1\"\n    expect reply contains=\"Hell\"",
        ),
        &[],
        "suite/s1 main [bot]: what it checks changed",
    )
    .await;
    refused(
        original.clone(),
        &["--filter", "s1"],
        "suite/s0 main [bot]: its scenario is not in this plan",
    )
    .await;
    // A selection that leaves out a scenario nothing of which finished: the run would end
    // "finished" without ever checking it.
    refused(
        original.clone(),
        &["--filter", "s0", "--filter", "s1", "--filter", "s3"],
        "1 scenario it planned is not in this plan",
    )
    .await;
    refused(original.clone(), &["--strict"], "recorded without --strict").await;
    assert_eq!(
        server.requests(),
        sent_before,
        "a refused resume calls nothing"
    );

    // Edits that leave s0 and s1 alone: an unfinished scenario, a new one.
    let edited = format!(
        "{}scenario \"s4\" {{\n    user \"hello s4\"\n    expect reply contains=\"Hello\"\n}}\n",
        original.replace("hello s3", "hello again s3")
    );
    std::fs::write(&suite, edited).unwrap();
    let o = run_in(&suite, &["--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut sent: Vec<String> = conversations(&server)[sent_before..]
        .iter()
        .map(|c| c[0].clone())
        .collect();
    sent.sort();
    assert_eq!(sent, ["hello again s3", "hello s2", "hello s4"]);
    let rows = trajectory_rows(&out);
    assert_eq!(
        rows.keys().map(|(s, _, _)| s.as_str()).collect::<Vec<_>>(),
        ["s0", "s1", "s2", "s3", "s4"]
    );
    // The run is one of the suite as it is now: the history does not take it for a run of
    // the suite it started with.
    let now = fingerprint();
    assert_ne!(now, started_as);
    let runs = read_parquet(&out.join("runs.parquet"));
    assert_eq!(strings(&runs, "suite_fingerprint"), [Some(now)]);
}

/// One two-turn scenario `s` repeated `repeat` times, against `url`.
fn repeated_suite(url: &str, repeat: u32) -> String {
    format!(
        "{}scenario \"s\" {{\n    repeat {repeat}\n    user \"hello\"\n    expect reply \
         contains=\"Hello\"\n    user \"again\"\n    expect reply contains=\"Hello\"\n}}\n",
        linear_suite(url, 0)
    )
}

/// Runs `suite` with `--resume out` and checks it is refused with `why`, leaving the journal
/// as it was.
async fn refused_resume(suite: &Path, out: &Path, why: &str) {
    let journal = std::fs::read(out.join(JOURNAL)).unwrap();
    let o = run_in(suite, &["--resume"])
        .arg(out)
        .output()
        .await
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot resume run"), "{err}");
    assert!(err.contains(why), "{err}");
    assert_eq!(std::fs::read(out.join(JOURNAL)).unwrap(), journal, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_repeat_is_refused_naming_the_repetitions_it_would_drop_and_a_higher_resumes() {
    let server = agent(Duration::from_millis(100)).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    std::fs::write(&suite, repeated_suite(&server.url(), 20)).unwrap();
    let out = dir.path().join("out");
    assert_eq!(run_until(&suite, &out, 3, libc::SIGTERM).await, Some(143));
    let finished = trajectory_entries(&out);
    assert!(
        finished
            .iter()
            .all(|t| t["repetition"].as_u64().unwrap() < 8),
        "{finished:?}"
    );
    let sent_before = server.requests();

    // Repetitions 8 to 19 never ran: resumed with `repeat 8`, the run would end finished
    // without them.
    std::fs::write(&suite, repeated_suite(&server.url(), 8)).unwrap();
    refused_resume(
        &suite,
        &out,
        "suite/s [bot]: repetitions 8–19 (`repeat` 8 now, 20 planned)",
    )
    .await;
    std::fs::write(&suite, repeated_suite(&server.url(), 19)).unwrap();
    refused_resume(
        &suite,
        &out,
        "suite/s [bot]: repetition 19 (`repeat` 19 now",
    )
    .await;
    assert_eq!(
        server.requests(),
        sent_before,
        "a refused resume calls nothing"
    );

    // More repetitions than planned: the plan only grows, and the new ones run.
    std::fs::write(&suite, repeated_suite(&server.url(), 22)).unwrap();
    let o = run_in(&suite, &["--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = trajectory_rows(&out);
    assert_eq!(rows.len(), 22, "{rows:?}");
    assert!(rows.values().all(|&n| n == 1));
}

#[tokio::test]
async fn a_branch_taken_out_or_renamed_is_refused_finished_or_not() {
    let server = agent(Duration::ZERO).await;
    // Killed after branch `a` was recorded, before `b`.
    let (_dir, suite, original, out) = tree_cut_after_a(&server).await;
    let sent_before = server.requests();
    let without_b = original.replace(
        "    branch \"b\" {\n        user \"tree branch b\"\n        expect reply \
         contains=\"Hello\"\n    }\n",
        "",
    );
    assert_ne!(without_b, original);
    std::fs::write(&suite, &without_b).unwrap();
    refused_resume(
        &suite,
        &out,
        "suite/tree [bot]: trajectory `b` (no longer in the scenario)",
    )
    .await;
    std::fs::write(&suite, original.replace("branch \"b\"", "branch \"b2\"")).unwrap();
    refused_resume(&suite, &out, "trajectory `b` (no longer in the scenario)").await;
    assert_eq!(
        server.requests(),
        sent_before,
        "a refused resume calls nothing"
    );

    // A branch added: the plan only grows.
    std::fs::write(
        &suite,
        original.replace(
            "    branch \"b\" {",
            "    branch \"c\" {\n        user \"tree branch c\"\n    }\n    branch \"b\" {",
        ),
    )
    .unwrap();
    let o = run_in(&suite, &["--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = trajectory_rows(&out);
    assert_eq!(
        rows.keys().map(|(_, t, _)| t.as_str()).collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
}

/// `runs/latest` is watch's mirror of its last rerun, under that rerun's id: finished there,
/// a run would be hidden from `trellis runs` and cleared by the next watch, as `--out
/// runs/latest` would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_s_mirror_killed_during_a_rerun_is_not_resumed() {
    let server = agent(Duration::from_secs(2)).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("suite.kdl"), linear_suite(&server.url(), 2)).unwrap();
    let mut watch = trellis()
        .current_dir(dir.path())
        .args(["watch", "suite.kdl", "--out", "runs"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed during its first rerun, before anything finished: the mirror's journal (kept
    // beside `latest/` until the rerun finishes) has the rerun's `run_started` and nothing
    // else, so nothing but its run.json says it is not a run cut short.
    let latest = dir.path().join("runs").join(".latest.next");
    let started = Instant::now();
    while !journal_text(&latest).contains("\"run_started\"") || server.requests() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "watch never started its rerun in {}",
            latest.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    watch.kill().await.unwrap();
    assert!(
        trajectory_entries(&latest).is_empty(),
        "a trajectory finished"
    );
    let journal = std::fs::read(latest.join(JOURNAL)).unwrap();
    let sent = server.requests();
    // Nor is it listed as a run, under its hidden name.
    let o = trellis()
        .current_dir(dir.path())
        .args(["runs", "--dir", "runs", "--json"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let listed: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "{listed}");

    // By its name, and by its run.json wherever it is copied.
    let copy = dir.path().join("runs").join("copy");
    for (mirror, spelled) in [(&latest, "runs/.latest.next"), (&copy, "runs/copy")] {
        if mirror == &copy {
            std::fs::rename(&latest, &copy).unwrap();
        }
        let o = trellis()
            .current_dir(dir.path())
            .args(["run", "suite.kdl", "--resume", spelled])
            .output()
            .await
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{spelled}: {err}");
        assert!(
            err.contains("is where `trellis watch` mirrors its current state, not a run"),
            "{spelled}: {err}"
        );
        assert_eq!(std::fs::read(mirror.join(JOURNAL)).unwrap(), journal);
    }
    assert_eq!(server.requests(), sent, "a refused resume calls nothing");
}

#[tokio::test]
async fn a_plain_journal_of_an_earlier_version_resumes_only_before_anything_finished() {
    let server = agent(Duration::ZERO).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    std::fs::write(&suite, linear_suite(&server.url(), 2)).unwrap();
    let out = dir.path().join("out");
    let o = run_in(&suite, &["--out"]).arg(&out).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // As an earlier trellis wrote it: plain lines, no fingerprints, killed after s0.
    let old = |keep_s0: bool| {
        let lines: Vec<String> = entries(&out)
            .into_iter()
            .filter(|e| e.get("run_finished").is_none())
            .filter(|e| !of_scenario(e, "s1") && (keep_s0 || !of_scenario(e, "s0")))
            .map(|mut e| {
                if let Some(info) = e.get_mut("run_started") {
                    for s in info["scenarios"].as_array_mut().unwrap() {
                        s.as_object_mut().unwrap().remove("fingerprints");
                    }
                }
                e.to_string()
            })
            .collect();
        lines.join("\n") + "\n"
    };
    let (with_s0, nothing_finished) = (old(true), old(false));
    std::fs::remove_file(out.join(JOURNAL)).unwrap();
    std::fs::write(out.join("journal.jsonl"), &with_s0).unwrap();
    let o = run_in(&suite, &["--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("recorded by an earlier trellis"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read_to_string(out.join("journal.jsonl")).unwrap(),
        with_s0
    );

    // Nothing finished: nothing to check, the run goes on and its journal is rewritten in
    // the current form.
    std::fs::write(out.join("journal.jsonl"), &nothing_finished).unwrap();
    let sent = server.requests();
    let o = run_in(&suite, &["--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(server.requests(), sent + 2);
    assert!(!out.join("journal.jsonl").exists());
    assert!(out.join(JOURNAL).is_file());
    assert_eq!(trajectory_rows(&out).len(), 2);
}

#[tokio::test]
async fn resume_tells_apart_a_directory_in_use_an_empty_journal_and_no_journal() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    // An agent that takes its time: the first run is still writing when the resume comes.
    let slow = agent(Duration::from_secs(30)).await;
    std::fs::write(&suite, linear_suite(&slow.url(), 1)).unwrap();
    let out = dir.path().join("out");
    let mut running = run_in(&suite, &["-q", "--out"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while slow.requests() == 0 {
        assert!(started.elapsed() < Duration::from_secs(30), "no request");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let o = run_in(&suite, &["--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("another trellis run is writing to"),
        "{}",
        stderr(&o)
    );
    // What to do is wait for that run, not write elsewhere: the run to finish is here.
    assert!(
        stderr(&o).contains("resume it once that run has ended"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("--out"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("ended  "), "{}", stderr(&o));
    running.kill().await.unwrap();

    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = run_in(&suite, &["--resume"])
        .arg(&empty)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("holds no run to resume: it has no journal"),
        "{}",
        stderr(&o)
    );
    let o = run_in(&suite, &["--resume"])
        .arg(dir.path().join("typo"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
    assert!(!dir.path().join("typo").exists());

    // Killed before its first entry was flushed: nothing to keep, the run starts over.
    let fast = agent(Duration::ZERO).await;
    std::fs::write(&suite, linear_suite(&fast.url(), 2)).unwrap();
    let early = dir.path().join("early");
    std::fs::create_dir(&early).unwrap();
    std::fs::File::create(early.join(JOURNAL)).unwrap();
    let o = run_in(&suite, &["--resume"])
        .arg(&early)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("starts over"), "{}", stderr(&o));
    assert_eq!(fast.requests(), 2);
    assert_eq!(trajectory_rows(&early).len(), 2);
}

#[tokio::test]
async fn a_finished_run_whose_reports_were_lost_gets_them_back_without_running() {
    let server = agent(Duration::ZERO).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    std::fs::write(&suite, linear_suite(&server.url(), 2)).unwrap();
    let out = dir.path().join("out");
    let o = run_in(&suite, &["--out"]).arg(&out).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Killed while writing its reports: the journal has its end, the files are gone.
    for file in ["trajectories.parquet", "summary.json", "report.html"] {
        std::fs::remove_file(out.join(file)).unwrap();
    }
    let sent = server.requests();
    let o = run_in(&suite, &["--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("already finished"), "{}", stderr(&o));
    assert!(stderr(&o).contains("written again"), "{}", stderr(&o));
    assert_eq!(server.requests(), sent);
    assert_eq!(trajectory_rows(&out).len(), 2);
    assert!(out.join("summary.json").is_file());
}

#[tokio::test]
async fn a_fork_killed_between_its_continuations_runs_again_whole_and_records_each_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let suite = repo("suites/multiagent.kdl");
    let o = run_in(&suite, &["-q", "--out"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let whole = trajectory_rows(&out);
    // The agent forks `complaint`'s `main` into `refund` and `replacement`; killed after
    // `replacement` was recorded on one agent, before `refund` was.
    let lost = |t: &serde_json::Value| {
        t["scenario"] == "complaint"
            && t["agent"] == "support-http"
            && t["trajectory"] == "main~refund"
    };
    assert!(trajectory_entries(&out).iter().any(lost));
    cut_journal(&out, |e| !e.get("trajectory").is_some_and(lost));

    let o = run_in(&suite, &["-q", "--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(trajectory_rows(&out), whole);
    let mut recorded: Vec<(String, String, String)> = trajectory_entries(&out)
        .iter()
        .map(|t| {
            let s = |k: &str| t[k].as_str().unwrap().to_owned();
            (s("scenario"), s("agent"), s("trajectory"))
        })
        .collect();
    let all = recorded.len();
    recorded.sort();
    recorded.dedup();
    assert_eq!(recorded.len(), all, "a continuation recorded twice");
    assert_eq!(all, whole.values().sum::<usize>());
}

#[tokio::test]
async fn resuming_a_finished_run_that_failed_exits_with_its_verdict() {
    let server = agent(Duration::ZERO).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let failing = linear_suite(&server.url(), 1).replace(
        r#"expect reply contains="Hello""#,
        r#"expect reply contains="Goodbye""#,
    );
    assert_ne!(failing, linear_suite(&server.url(), 1));
    std::fs::write(&suite, failing).unwrap();
    let out = dir.path().join("out");
    let o = run_in(&suite, &["--out"]).arg(&out).output().await.unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let sent = server.requests();
    // A pod restarted after its shard ended reports what the shard found, not success.
    let o = run_in(&suite, &["--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("1 failed"), "{}", stderr(&o));
    assert_eq!(server.requests(), sent);
    // A script reading the JSON stream gets its last line, the verdict, all the same.
    let o = run_in(&suite, &["--message-format", "json", "--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let last: serde_json::Value =
        serde_json::from_str(stdout(&o).lines().last().unwrap_or("null")).unwrap();
    assert_eq!(last["type"], "run_finished", "{last}");
    assert_eq!(
        (&last["failed"], &last["trajectories"], &last["exit_code"]),
        (
            &serde_json::json!(1),
            &serde_json::json!(1),
            &serde_json::json!(1)
        ),
        "{last}"
    );

    // Gated on a baseline that failed the same way, the run passed its gate: resumed with
    // that --baseline (a CI step retried), it passes again rather than failing on its
    // own failures.
    let runs = dir.path().join("runs");
    let gated = runs.join("gated");
    let o = run_in(&suite, &["--out"])
        .arg(runs.join("base"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let o = run_in(&suite, &["--baseline", "base", "--out"])
        .arg(&gated)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let o = run_in(&suite, &["--baseline", "base", "--resume"])
        .arg(&gated)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("no regression"), "{}", stdout(&o));
    // Against another baseline, `run.json` links the comparison `compare.json` holds.
    let o = run_in(&suite, &["--out"])
        .arg(runs.join("other"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let o = run_in(&suite, &["--baseline", "other", "--resume"])
        .arg(&gated)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(gated.join("run.json")).unwrap()).unwrap();
    let compared: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(gated.join("compare.json")).unwrap())
            .unwrap();
    assert_eq!(meta["compared_with"], compared["base"]["run_id"], "{meta}");
    // And its page names that baseline, not the one it was first compared with.
    let html = std::fs::read_to_string(gated.join("report.html")).unwrap();
    let base_id = compared["base"]["run_id"].as_str().unwrap();
    assert!(
        html.contains(base_id),
        "report.html does not name {base_id}"
    );
}

/// `trellis compare BASE HEAD` with runs/BASE and runs/HEAD.
async fn compare_in(runs: &Path, base: &str, head: &str) -> std::process::Output {
    trellis()
        .arg("compare")
        .args([base, head])
        .arg("--dir")
        .arg(runs)
        .output()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_or_killed_run_never_passes_a_comparison() {
    let server = agent(Duration::from_millis(100)).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    std::fs::write(&suite, linear_suite(&server.url(), 6)).unwrap();
    let runs = dir.path().join("runs");
    let o = run_in(&suite, &["-q", "--out"])
        .arg(runs.join("full"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    assert_eq!(
        run_until(&suite, &runs.join("stopped"), 2, libc::SIGTERM).await,
        Some(143)
    );
    // The run says it was stopped, which counting cannot always tell (below).
    let end = entries(&runs.join("stopped"))
        .into_iter()
        .find_map(|e| e.get("run_finished").cloned())
        .expect("a stopped run reaches its end");
    assert_eq!(end["interrupted"], true, "{end}");
    let o = compare_in(&runs, "full", "stopped").await;
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("the head run was stopped after"), "{out}");
    // What it did not reach is not run, never removed from the suites.
    assert!(out.contains("not run (the head run was stopped"), "{out}");
    assert!(!out.contains("removed"), "{out}");
    // Without arguments the stopped run is the latest finished one: the same verdict.
    let o = trellis()
        .arg("compare")
        .arg("--dir")
        .arg(&runs)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));

    assert_eq!(
        run_until(&suite, &runs.join("killed"), 2, libc::SIGKILL).await,
        None
    );
    let o = compare_in(&runs, "full", "killed").await;
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("the head run never reached its end"),
        "{}",
        stdout(&o)
    );

    // Finished, it compares as any run.
    let o = run_in(&suite, &["-q", "--resume"])
        .arg(runs.join("stopped"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = compare_in(&runs, "full", "stopped").await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

#[tokio::test]
async fn a_stopped_run_of_a_forking_agent_fails_the_comparison_though_it_recorded_more_than_planned()
 {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let suite = repo("suites/multiagent.kdl");
    for name in ["full", "stopped"] {
        let o = run_in(&suite, &["-q", "--out"])
            .arg(runs.join(name))
            .output()
            .await
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    // What a stop leaves when one of a fork's continuations was still in flight: the
    // journal's end says the run was interrupted, one continuation is missing, and the
    // others the agent forked still put the count above the plan.
    let stopped = runs.join("stopped");
    let lost = |e: &serde_json::Value| {
        e.get("trajectory").is_some_and(|t| {
            t["scenario"] == "complaint"
                && t["agent"] == "support-http"
                && t["trajectory"] == "main~refund"
        })
    };
    let mut kept: Vec<serde_json::Value> =
        entries(&stopped).into_iter().filter(|e| !lost(e)).collect();
    assert_eq!(kept.len() + 1, entries(&stopped).len());
    let planned = kept[0]["run_started"]["planned_trajectories"]
        .as_u64()
        .unwrap();
    let recorded = kept
        .iter()
        .filter(|e| e.get("trajectory").is_some())
        .count() as u64;
    assert!(recorded > planned, "{recorded} recorded, {planned} planned");
    let end = kept.last_mut().unwrap();
    assert!(end.get("run_finished").is_some(), "{end}");
    end["run_finished"]["interrupted"] = true.into();
    end["run_finished"]["trajectories"] = recorded.into();
    let mut writer = JournalWriter::create_at(&stopped.join(JOURNAL)).unwrap();
    for entry in &kept {
        writer.append_line(entry.to_string().as_bytes()).unwrap();
    }
    writer.finish().unwrap();
    let o = trellis()
        .arg("report")
        .arg(&stopped)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    let o = compare_in(&runs, "full", "stopped").await;
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("the head run was stopped before its work was done"),
        "{}",
        stdout(&o)
    );
    let listed = super::history::runs_json(&runs).await;
    let stopped_of = |name: &str| {
        listed
            .iter()
            .find(|r| r["dir"].as_str().unwrap().ends_with(name))
            .map(|r| r["stopped"].clone())
    };
    assert_eq!(stopped_of("stopped"), Some(true.into()), "{listed:?}");
    assert_eq!(stopped_of("full"), Some(false.into()), "{listed:?}");
    let html = std::fs::read_to_string(stopped.join("report.html")).unwrap();
    assert!(html.contains("Stopped before its end"));
    assert!(!html.contains(&format!("of {planned} planned trajectories (")));

    // Resumed, the missing continuation runs and the comparison passes.
    let o = run_in(&suite, &["-q", "--resume"])
        .arg(&stopped)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        trajectory_rows(&stopped),
        trajectory_rows(&runs.join("full"))
    );
    // Latency aside: the builtin answers in about a millisecond, which a busy test machine
    // can make many times that, and no agent changed.
    let o = trellis()
        .args([
            "compare",
            "full",
            "stopped",
            "--latency-noise-ms",
            "60000",
            "--dir",
        ])
        .arg(&runs)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_waits_for_a_run_that_is_writing_and_keeps_to_its_own_out() {
    let server = agent(Duration::from_millis(100)).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    std::fs::write(&suite, linear_suite(&server.url(), 6)).unwrap();
    let live = dir.path().join("live");
    let mut child = run_in(&suite, &["--jobs", "1", "-q", "--out"])
        .arg(&live)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while recorded_so_far(&live) == 0 {
        assert!(started.elapsed() < Duration::from_secs(60), "no trajectory");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let o = trellis().arg("report").arg(&live).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("is in use by another trellis command (the run recording it"),
        "{}",
        stderr(&o)
    );
    // Into another --out too: the run is what to wait for, not the --out (which said
    // "choose another --out").
    let o = trellis()
        .arg("report")
        .arg(&live)
        .arg("--out")
        .arg(dir.path().join("copy"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!stderr(&o).contains("another --out"), "{}", stderr(&o));
    // The run it left alone puts all its files in place.
    assert_eq!(child.wait().await.unwrap().code(), Some(0));
    assert!(live.join("trajectories.parquet").is_file());

    // A rebuild into a directory that holds another run is refused, and changes nothing.
    let other = dir.path().join("other");
    let o = run_in(&suite, &["-q", "--out"])
        .arg(&other)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let before = std::fs::read(other.join("summary.json")).unwrap();
    let o = trellis()
        .arg("report")
        .arg(&live)
        .arg("--out")
        .arg(&other)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("holds another run"), "{}", stderr(&o));
    assert_eq!(std::fs::read(other.join("summary.json")).unwrap(), before);
    // Into its own directory, or a new one, it rebuilds.
    for out in [&live, &dir.path().join("rebuilt")] {
        let o = trellis()
            .arg("report")
            .arg(&live)
            .arg("--out")
            .arg(out)
            .output()
            .await
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
}

/// An AgentScope server keeps each conversation under its `session_id`, across processes: a
/// `--resume` must not give a trajectory the id of one the killed attempt already talked in
/// (the run id is the same and each process numbers its sessions from 1).
#[tokio::test]
async fn a_resumed_trajectory_gets_a_fresh_server_session() {
    let mut server = trellis()
        .args(["agent", "weather"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(server.stdout.take().unwrap()));
    let url = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        format!(
            "agent \"w\" protocol=\"agentscope\" url=\"{url}\"\n\
             scenario \"a\" {{\n    user \"What's the weather in Paris today?\"\n    \
             expect no-error\n}}\n\
             scenario \"b\" {{\n    user \"And the forecast for Tokyo?\"\n    \
             user \"Which cities did I ask about?\"\n    \
             expect reply contains=\"Tokyo\" not-contains=\"Paris\"\n}}\n"
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = run_in(&suite, &["--jobs", "1", "-q", "--out"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // As if killed after `a`: `b` runs again in a new process, against the same server.
    cut_journal(&out, |e| !of_scenario(e, "b"));
    let o = run_in(&suite, &["-q", "--resume"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(
        trajectory_rows(&out)
            .keys()
            .map(|k| k.0.as_str())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
}

/// A finished instance whose dataset row changed is refused naming the columns, one no
/// step names among them; an instance whose steps changed with the same row keeps the
/// general reason.
#[tokio::test]
async fn a_changed_dataset_row_is_named_by_its_columns() {
    let server = agent(Duration::ZERO).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let rows = dir.path().join("rows.csv");
    std::fs::write(&rows, "id,q,notes\n1,hello,first\n2,hi,second\n").unwrap();
    let text = format!(
        "{}dataset \"d\" path=\"rows.csv\"\nscenario \"s\" for-each=\"d\" {{\n    \
         row-id \"{{{{ row.id }}}}\"\n    user \"{{{{ row.q }}}}\"\n    \
         expect reply contains=\"Hello\"\n}}\n",
        linear_suite(&server.url(), 0)
    );
    std::fs::write(&suite, &text).unwrap();
    let out = dir.path().join("out");
    let o = run_in(&suite, &["--out"]).arg(&out).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    cut_journal(&out, |e| !of_scenario(e, "s[2]"));

    std::fs::write(&rows, "id,q,notes\n1,hello,edited\n2,hi,second\n").unwrap();
    refused_resume(
        &suite,
        &out,
        "suite/s[1] main [bot]: its dataset row changed (`notes`)",
    )
    .await;
    std::fs::write(&rows, "id,q,notes\n1,hello,first\n2,hi,second\n").unwrap();
    std::fs::write(&suite, text.replace("{{ row.q }}", "{{ row.q }}!")).unwrap();
    refused_resume(&suite, &out, "suite/s[1] main [bot]: what it sends changed").await;
}

/// Nothing is reported finished that a `kill -9` loses: every `trajectory_finished` line a
/// script read before the kill names a trajectory the journal holds (the journal is flushed
/// in batches; a line printed before its entry reached the disk was a result that vanished,
/// and ran again on `--resume`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_trajectory_reported_finished_survives_a_kill() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    std::fs::write(
        &suite,
        r#"agent "demo" protocol="connexity" builtin="booking"
scenario "busy" {
    repeat 6000
    user "How much does a duct cleaning cost?"
    expect reply contains="$249"
}
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let mut child = run_in(
        &suite,
        &["--jobs", "64", "--message-format", "json", "--out"],
    )
    .arg(&out)
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut reported = std::collections::BTreeSet::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        let event: serde_json::Value = serde_json::from_str(&line).unwrap();
        if event["type"] == "trajectory_finished" {
            reported.insert(event["repetition"].as_u64().unwrap());
            // A third of the run: it is still going when the kill comes.
            if reported.len() == 2000 {
                break;
            }
        }
    }
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on a child process this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    child.wait().await.unwrap();
    let recorded: std::collections::BTreeSet<u64> = journal_text(&out)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|e| e.get("trajectory")?["repetition"].as_u64())
        .collect();
    assert!(
        !journal_text(&out).contains("\"run_finished\""),
        "the run ended before it was killed: nothing was tested"
    );
    let lost: Vec<&u64> = reported.difference(&recorded).collect();
    assert!(
        lost.is_empty(),
        "{} of {} trajectories reported finished are not in the journal: {:?}…",
        lost.len(),
        reported.len(),
        &lost[..lost.len().min(10)]
    );

    // Resumed, its start event says when the run started, as the journal and the tables
    // do, and when this attempt did; it reports only what it runs now.
    let first_start = entries(&out)[0]["run_started"]["started_at"].clone();
    let o = run_in(
        &suite,
        &["--jobs", "64", "--message-format", "json", "--resume"],
    )
    .arg(&out)
    .output()
    .await
    .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let events: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events[0]["type"], "run_started", "{}", events[0]);
    assert_eq!(events[0]["started_at"], first_start, "{}", events[0]);
    assert_eq!(
        events[0]["resumed_at"].as_array().map(Vec::len),
        Some(1),
        "{}",
        events[0]
    );
    let finished_now = events
        .iter()
        .filter(|e| e["type"] == "trajectory_finished")
        .count();
    assert_eq!(
        finished_now,
        6_000 - recorded.len(),
        "only what was left ran"
    );
}
