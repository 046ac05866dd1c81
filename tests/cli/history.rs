//! Runs as a history: the tables of many runs read as one dataset, `trellis runs`, `trellis
//! compare` and `run --baseline` exit codes on synthetic histories written through the real
//! report writer, the JSON event stream and JUnit.

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use trellis_engine::record::{
    CriterionRecord, CriterionStatus, JournalEntry, NodeRecord, RunInfo, RunSummary,
    TrajectoryRecord, TrajectoryStatus, TurnRecord,
};

use super::*;

/// One repetition of one branch of the synthetic scenario `s/c`.
pub(super) struct Sample {
    branch: &'static str,
    repetition: u32,
    passed: bool,
    latency_ms: f64,
    /// The trajectory ended in an error (its agent call timed out), not a verdict.
    error: bool,
    /// With `error`: the agent answered, and a check's evaluator failed (a judge), not the
    /// turn.
    answered: bool,
    /// The agent it ran against (`a` unless said).
    agent: &'static str,
    /// The simulated user broke character: nothing was checked.
    invalid: bool,
    /// Its scenario of suite `s` (`c` unless said).
    scenario: &'static str,
}

pub(super) fn sample(
    branch: &'static str,
    repetition: u32,
    passed: bool,
    latency_ms: f64,
) -> Sample {
    Sample {
        branch,
        repetition,
        passed,
        latency_ms,
        error: false,
        answered: false,
        agent: "a",
        invalid: false,
        scenario: "c",
    }
}

/// Writes `runs_dir/name` as `trellis run` would: a journal, then every results file through
/// the real writer (`write_reports`, what `trellis report` runs).
pub(super) fn write_run(runs_dir: &Path, name: &str, started_at: &str, samples: &[Sample]) {
    let dir = runs_dir.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let run_id = format!("{}-{name}", started_at.replace([':', '-'], ""));
    let mut entries = vec![JournalEntry::RunStarted(std::sync::Arc::new(RunInfo {
        run_id: run_id.clone(),
        started_at: started_at.into(),
        trellis_version: "0.1.0".into(),
        suites: vec!["s".into()],
        jobs: 1,
        planned_trajectories: samples.len() as u64,
        ..RunInfo::default()
    }))];
    let (mut passed, mut failed, mut errors, mut invalid) = (0, 0, 0, 0);
    for s in samples {
        entries.push(JournalEntry::Node(NodeRecord {
            suite: "s".into(),
            scenario: s.scenario.into(),
            agent: s.agent.into(),
            repetition: s.repetition,
            node: s.branch.into(),
            parent: None,
            turns: vec![Arc::new(TurnRecord {
                turn_index: 0,
                user_message: "hi".into(),
                // Every sample runs at once, as `--jobs` runs them.
                started_ms: 0.0,
                latency_ms: s.latency_ms,
                attempts: 1,
                reply: (!s.error || s.answered).then(|| "hello".into()),
                fault: (s.error && !s.answered).then(|| trellis_engine::record::Fault {
                    category: trellis_engine::record::FaultCategory::Timeout,
                    message: "no answer within 1s".into(),
                    rate_limited: None,
                    back_after: None,
                }),
                ..TurnRecord::default()
            })],
        }));
        let status = if s.invalid {
            invalid += 1;
            CriterionStatus::Skipped
        } else if s.error {
            errors += 1;
            CriterionStatus::Skipped
        } else if s.passed {
            passed += 1;
            CriterionStatus::Passed
        } else {
            failed += 1;
            CriterionStatus::Failed
        };
        entries.push(JournalEntry::Trajectory(Box::new(TrajectoryRecord {
            suite: "s".into(),
            scenario: s.scenario.into(),
            trajectory: s.branch.into(),
            agent: s.agent.into(),
            protocol: "connexity".into(),
            repetition: s.repetition,
            nodes: vec![s.branch.into()],
            status: if s.invalid {
                TrajectoryStatus::Invalid
            } else if s.error {
                TrajectoryStatus::Error
            } else if s.passed {
                TrajectoryStatus::Passed
            } else {
                TrajectoryStatus::Failed
            },
            turns: 1,
            duration_ms: s.latency_ms,
            // As a run records it: the turn's fault ended the trajectory.
            fault: (s.error && !s.answered).then(|| trellis_engine::record::Fault {
                category: trellis_engine::record::FaultCategory::Timeout,
                message: "no answer within 1s".into(),
                rate_limited: None,
                back_after: None,
            }),
            skip_reason: None,
            criteria: vec![CriterionRecord {
                turn_index: Some(0),
                criterion: "reply contains=\"hello\"".into(),
                kind: "reply".into(),
                status,
                detail: (!s.passed).then(|| "reply was \"bye\"".into()),
                judge: None,
            }],
            tags: vec![],
            agent_branches: vec![],
            awaiting_human: None,
            sandbox_state: None,
            captures: Default::default(),
            llm: None,
            attack: None,
        })));
    }
    entries.push(JournalEntry::RunFinished(RunSummary {
        run_id,
        finished_at: started_at.into(),
        duration_ms: 1000.0,
        trajectories: samples.len() as u64,
        passed,
        failed,
        errors,
        skipped: 0,
        invalid,
        llm_roles: Default::default(),
        stopped_by: None,
        interrupted: false,
        connections_redone: Default::default(),
        requests_resent: Default::default(),
        abandoned: Vec::new(),
        turns: samples.len() as u64,
    }));
    let mut journal = std::fs::File::create(dir.join("journal.jsonl")).unwrap();
    for entry in &entries {
        serde_json::to_writer(&mut journal, entry).unwrap();
        journal.write_all(b"\n").unwrap();
    }
    drop(journal);
    let files =
        trellis_reports::write_reports(&dir, &trellis_reports::ReportOptions::default()).unwrap();
    assert!(files.not_written.is_empty(), "{:?}", files.not_written);
}

/// `trellis runs --json --dir RUNS`, which must succeed: the runs it lists.
pub(super) async fn runs_json(runs: &Path) -> Vec<serde_json::Value> {
    let o = trellis()
        .args(["runs", "--json", "--dir"])
        .arg(runs)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

pub(super) async fn compare(runs: &Path, args: &[&str]) -> std::process::Output {
    trellis()
        .arg("compare")
        .args(args)
        .arg("--dir")
        .arg(runs)
        .output()
        .await
        .unwrap()
}

/// Pinning a run that failed its own gate (its `compare.json` says so) pins it, and warns:
/// its regressions become the bar.
#[tokio::test]
async fn pinning_a_run_that_failed_its_gate_warns() {
    let runs = tempfile::tempdir().unwrap();
    write_run(
        runs.path(),
        "slow",
        "2026-01-01T00:00:00Z",
        &[sample("main", 0, true, 10.0)],
    );
    std::fs::write(
        runs.path().join("slow/compare.json"),
        serde_json::json!({"regressed": true, "base": {"run_id": "base-1"},
            "regressions": ["run latency_mean_ms: 60 → 180"]})
        .to_string(),
    )
    .unwrap();
    let o = trellis()
        .args(["runs", "pin", "slow", "--dir"])
        .arg(runs.path())
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("is now the pinned baseline"),
        "{}",
        stdout(&o)
    );
    assert!(
        stderr(&o).contains(
            "warning: it failed its own gate against base-1 (1 regression; the first: run \
             latency_mean_ms: 60 → 180)"
        ),
        "{}",
        stderr(&o)
    );
}

/// A scenario that passed and now ends in errors: its regression line names the fault, not
/// only the count of errors (the step summary and JUnit had it; the gate's line did not).
#[tokio::test]
async fn a_scenario_regressed_by_errors_says_the_fault() {
    let runs = tempfile::tempdir().unwrap();
    let samples = |error: bool| -> Vec<Sample> {
        (0..3)
            .map(|i| Sample {
                error,
                ..sample("main", i, true, 10.0)
            })
            .collect()
    };
    write_run(runs.path(), "base", "2026-01-01T00:00:00Z", &samples(false));
    write_run(runs.path(), "head", "2026-01-02T00:00:00Z", &samples(true));
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stdout(&o).contains(
            "scenario s/c [a]: 3/3 → 0/3 passed (p = 0.050) (in the head run: 3 errors); the \
             first fault: timeout: no answer within 1s"
        ),
        "{}",
        stdout(&o)
    );
}

#[tokio::test]
async fn compare_exits_1_when_a_branch_that_passed_fails() {
    let runs = tempfile::tempdir().unwrap();
    write_run(
        runs.path(),
        "base",
        "2026-01-01T00:00:00Z",
        &[sample("yes", 0, true, 100.0), sample("no", 0, true, 100.0)],
    );
    write_run(
        runs.path(),
        "head",
        "2026-01-02T00:00:00Z",
        &[sample("yes", 0, true, 100.0), sample("no", 0, false, 100.0)],
    );

    // Default: the last two finished runs.
    let o = compare(runs.path(), &[]).await;
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("REGRESSED"), "{text}");
    // Each line says how the head run's sample ended, and a check why it failed.
    assert!(
        text.contains("branch s/c no [a]: 1/1 → 0/1 passed (in the head run: 1 failed)"),
        "{text}"
    );
    assert!(
        text.contains(
            "check s/c no [a] (turn 0) `reply contains=\"hello\"`: 1/1 → 0/1 passed: reply was \"bye\""
        ),
        "{text}"
    );

    // The same comparison as a page.
    let page = runs.path().join("compare.html");
    let o = compare(
        runs.path(),
        &["base", "head", "--html", page.to_str().unwrap()],
    )
    .await;
    assert_eq!(o.status.code(), Some(1));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("20260102T000000Z-head"), "{html}");
    assert!(
        html.contains("reply was"),
        "the failing check's reason is missing"
    );
    // A device (`--html /dev/stdout`, here behind a link to /dev/null) is written to, not
    // replaced by a regular file renamed over it.
    let device = runs.path().join("device.html");
    std::os::unix::fs::symlink("/dev/null", &device).unwrap();
    let o = compare(
        runs.path(),
        &["base", "head", "--html", device.to_str().unwrap()],
    )
    .await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        std::fs::symlink_metadata(&device)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link was replaced by a file"
    );

    // A run without summary.json is compared from its journal.
    std::fs::remove_file(runs.path().join("head/summary.json")).unwrap();
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("branch s/c no [a]: 1/1 → 0/1 passed"));

    // Reversed, it is an improvement.
    let o = compare(runs.path(), &["head", "base"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));

    // A tolerated drop does not fail.
    let o = compare(
        runs.path(),
        &["base", "head", "--max-pass-rate-drop", "100"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));

    // JSON carries the same verdict.
    let o = compare(runs.path(), &["base", "head", "--json"]).await;
    assert_eq!(o.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(json["regressed"], true);
    let branch = json["branches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["trajectory"] == "no")
        .unwrap();
    assert_eq!(branch["rate"]["verdict"], "regressed");
    assert_eq!(branch["rate"]["delta_points"], -100.0);

    // Thresholds are checked.
    for bad in [["--alpha", "0"], ["--max-latency-increase", "-5"]] {
        let o = compare(runs.path(), &["base", "head", bad[0], bad[1]]).await;
        assert_eq!(o.status.code(), Some(2), "{bad:?}");
    }

    // An unknown run is a usage error.
    let o = compare(runs.path(), &["base", "nope"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no run `nope`"), "{}", stderr(&o));
}

#[tokio::test]
async fn with_repeats_one_failure_is_noise_and_a_collapse_is_a_regression() {
    let runs = tempfile::tempdir().unwrap();
    let all_pass: Vec<Sample> = (0..5).map(|r| sample("main", r, true, 100.0)).collect();
    let one_fails: Vec<Sample> = (0..5).map(|r| sample("main", r, r != 2, 100.0)).collect();
    let collapse: Vec<Sample> = (0..10).map(|r| sample("main", r, r < 2, 100.0)).collect();
    let base10: Vec<Sample> = (0..10).map(|r| sample("main", r, true, 100.0)).collect();
    write_run(runs.path(), "base", "2026-01-01T00:00:00Z", &all_pass);
    write_run(runs.path(), "flaky", "2026-01-02T00:00:00Z", &one_fails);
    write_run(runs.path(), "base10", "2026-01-03T00:00:00Z", &base10);
    write_run(runs.path(), "broken", "2026-01-04T00:00:00Z", &collapse);

    let o = compare(runs.path(), &["base", "flaky"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("noise"), "{}", stdout(&o));
    // Without the test every drop counts.
    let o = compare(runs.path(), &["base", "flaky", "--alpha", "1"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));

    let o = compare(runs.path(), &["base10", "broken"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
}

#[tokio::test]
async fn compare_gates_on_mean_latency_past_its_threshold() {
    let runs = tempfile::tempdir().unwrap();
    write_run(
        runs.path(),
        "fast",
        "2026-01-01T00:00:00Z",
        &[sample("main", 0, true, 100.0)],
    );
    write_run(
        runs.path(),
        "slow",
        "2026-01-02T00:00:00Z",
        &[sample("main", 0, true, 150.0)],
    );
    write_run(
        runs.path(),
        "slower-by-a-hair",
        "2026-01-03T00:00:00Z",
        &[sample("main", 0, true, 104.0)],
    );
    let o = compare(runs.path(), &["fast", "slow"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("run latency_mean_ms"), "{}", stdout(&o));
    let o = compare(
        runs.path(),
        &["fast", "slow", "--max-latency-increase", "60"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    // +4 %: within the threshold.
    let o = compare(runs.path(), &["fast", "slower-by-a-hair"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
}

/// An agent's own row with too few turns for the rank test regresses only at twice the
/// base's: one busy moment of an unchanged agent of two turns (41 → 67 ms, two identical
/// runs of the example suites) failed the gate beside a run's row that judged every turn.
#[tokio::test]
async fn an_agent_of_two_turns_regresses_only_at_twice_its_latency() {
    let runs = tempfile::tempdir().unwrap();
    let run = |few_ms: f64| {
        let mut samples: Vec<Sample> = (0..20)
            .map(|i| Sample {
                scenario: "many",
                ..sample("main", i, true, 100.0 + f64::from(i % 3))
            })
            .collect();
        samples.extend((0..2).map(|i| Sample {
            agent: "few",
            scenario: "few",
            ..sample("main", i, true, few_ms + f64::from(i))
        }));
        samples
    };
    write_run(runs.path(), "base", "2026-01-01T00:00:00Z", &run(40.0));
    write_run(runs.path(), "busy", "2026-01-02T00:00:00Z", &run(66.0));
    write_run(runs.path(), "slow", "2026-01-03T00:00:00Z", &run(100.0));
    let o = compare(runs.path(), &["base", "busy"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(
        flat(&stdout(&o)).contains("is not the 2× an agent's row with too few turns to test needs"),
        "{}",
        stdout(&o)
    );
    let o = compare(runs.path(), &["base", "slow"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("agent few latency_mean_ms"),
        "{}",
        stdout(&o)
    );
}

/// `baseline` beside a directory called `baseline` that holds another run, and a name that a
/// later `--out` gave to another run's directory, are refused, not guessed: the directory
/// won, and a gate compared with the wrong run, silently. `pinned` and paths are plain.
#[tokio::test]
async fn the_baseline_keyword_and_names_are_never_taken_by_a_directory() {
    let runs = tempfile::tempdir().unwrap();
    write_run(
        runs.path(),
        "good",
        "2026-01-01T00:00:00Z",
        &[sample("main", 0, true, 10.0)],
    );
    write_run(
        runs.path(),
        "head",
        "2026-01-03T00:00:00Z",
        &[sample("main", 0, false, 10.0)],
    );
    let runs_cmd = |args: &[&str]| {
        let mut cmd = trellis();
        cmd.arg("runs").args(args).arg("--dir").arg(runs.path());
        cmd
    };
    for args in [&["pin", "good"][..], &["name", "good", "nightly"]] {
        let o = runs_cmd(args).output().await.unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    // Later runs written to directories with those names, failing like the head.
    for dir in ["baseline", "nightly"] {
        write_run(
            runs.path(),
            dir,
            "2026-01-02T00:00:00Z",
            &[sample("main", 0, false, 10.0)],
        );
    }
    let o = compare(runs.path(), &["pinned", "head"]).await;
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("20260101T000000Z-good"),
        "{}",
        stdout(&o)
    );
    for word in ["baseline", "nightly"] {
        let o = compare(runs.path(), &[word, "head"]).await;
        assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
        assert!(
            stderr(&o).contains(&format!("`{word}` names both run 20260101T000000Z-good")),
            "{}",
            stderr(&o)
        );
    }
    // Its path names the directory's run.
    let o = compare(
        runs.path(),
        &[runs.path().join("nightly").to_str().unwrap(), "head"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

#[tokio::test]
async fn runs_are_listed_named_and_pinned() {
    let runs = tempfile::tempdir().unwrap();
    write_run(
        runs.path(),
        "one",
        "2026-01-02T00:00:00Z",
        &[sample("main", 0, true, 10.0)],
    );
    write_run(
        runs.path(),
        "two",
        "2026-01-01T00:00:00Z",
        &[sample("main", 0, false, 10.0)],
    );
    let runs_cmd = |args: &[&str]| {
        let mut cmd = trellis();
        cmd.arg("runs").args(args).arg("--dir").arg(runs.path());
        cmd
    };

    let o = runs_cmd(&["name", "one", "v1"]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = runs_cmd(&["name", "two", "v1"]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "a name is unique");
    assert!(stderr(&o).contains("already used"), "{}", stderr(&o));
    // `runs/one` is found as a directory before any name: it cannot name another run.
    let o = runs_cmd(&["name", "two", "one"]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("another run's directory name"),
        "{}",
        stderr(&o)
    );
    for pin in ["two", "v1"] {
        let o = runs_cmd(&["pin", pin]).output().await.unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }

    let o = runs_cmd(&["--json"]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let list: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let list = list.as_array().unwrap();
    // Oldest first, whatever the directory names say.
    let ids: Vec<&str> = list.iter().map(|r| r["run_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["20260101T000000Z-two", "20260102T000000Z-one"]);
    // Pinning is exclusive: the last pin wins.
    assert_eq!(list[0]["baseline"], false);
    assert_eq!(list[1]["baseline"], true);
    assert_eq!(list[1]["name"], "v1");

    let o = runs_cmd(&[]).output().await.unwrap();
    let text = stdout(&o);
    assert!(
        text.contains("pinned") && text.contains("v1") && text.contains("2 runs"),
        "{text}"
    );

    // `compare` without runs: the pinned baseline against the latest other run.
    let o = trellis()
        .args(["compare", "--json", "--dir"])
        .arg(runs.path())
        .output()
        .await
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(json["base"]["name"], "v1");
    assert_eq!(json["head"]["run_id"], "20260101T000000Z-two");
    assert_eq!(o.status.code(), Some(1));

    // A name that is the start of another run's id would take that prefix over: refused.
    let o = runs_cmd(&["name", "one", "20260101"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("start of another run's id"),
        "{}",
        stderr(&o)
    );
    // One given before such a run existed is ambiguous, never a guess.
    let o = runs_cmd(&["name", "two", "20260103"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    write_run(
        runs.path(),
        "three",
        "2026-01-03T00:00:00Z",
        &[sample("main", 0, true, 10.0)],
    );
    let o = runs_cmd(&["pin", "20260103"]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("matches several runs")
            && err.contains("20260101T000000Z-two")
            && err.contains("(named `20260103`)")
            && err.contains("20260103T000000Z-three"),
        "{err}"
    );
}

/// `compare`, `runs` and `--baseline` look a bare word up as a directory of the runs
/// directory before any name: a name that is the directory of watch's mirror, a shard, a
/// watch rerun, or anything else there would resolve to that directory, never to the run.
#[tokio::test]
async fn a_name_is_never_taken_by_a_directory_the_runs_list_leaves_out() {
    let runs = tempfile::tempdir().unwrap();
    let whole = [sample("main", 0, true, 10.0)];
    write_run(runs.path(), "base", "2026-01-01T00:00:00Z", &whole);
    write_run(runs.path(), "head", "2026-01-02T00:00:00Z", &whole);
    // Watch's mirror, one shard of a run, a watch rerun, and a directory with no run yet.
    write_run(runs.path(), "latest", "2026-01-03T00:00:00Z", &whole);
    trellis_reports::history::mark_watch_latest(&runs.path().join("latest"), "r").unwrap();
    write_run(runs.path(), "part-1", "2026-01-04T00:00:00Z", &whole);
    trellis_reports::history::RunMeta {
        run_id: "20260104T000000Z-part-1".into(),
        shard: Some(trellis_reports::history::ShardMeta {
            index: 1,
            count: 2,
            digest: "d".into(),
        }),
        ..Default::default()
    }
    .write(&runs.path().join("part-1"))
    .unwrap();
    write_run(
        runs.path(),
        "20260105T000000Z-r0001-beef",
        "2026-01-05T00:00:00Z",
        &whole,
    );
    std::fs::create_dir(runs.path().join("scratch")).unwrap();
    let runs_cmd = |args: &[&str]| {
        let mut cmd = trellis();
        cmd.arg("runs").args(args).arg("--dir").arg(runs.path());
        cmd
    };
    for name in ["latest", "part-1", "20260105T000000Z-r0001-beef", "scratch"] {
        let o = runs_cmd(&["name", "base", name]).output().await.unwrap();
        assert_eq!(o.status.code(), Some(2), "{name}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("`{name}` cannot be a run name")),
            "{name}: {}",
            stderr(&o)
        );
    }
    // `latest` is watch's before any watch ran.
    let fresh = tempfile::tempdir().unwrap();
    write_run(fresh.path(), "only", "2026-01-01T00:00:00Z", &whole);
    let o = trellis()
        .args(["runs", "name", "only", "latest", "--dir"])
        .arg(fresh.path())
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // The run's own directory name is still a name it can have.
    let o = runs_cmd(&["name", "base", "base"]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = runs_cmd(&["--json"]).output().await.unwrap();
    let listed: Vec<serde_json::Value> = serde_json::from_str(&stdout(&o)).unwrap();
    let names: Vec<&serde_json::Value> = listed.iter().map(|r| &r["name"]).collect();
    assert_eq!(
        names,
        [&serde_json::json!("base"), &serde_json::Value::Null]
    );
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

#[tokio::test]
async fn every_run_reads_as_one_dataset_from_polars_and_duckdb() {
    let root = tempfile::tempdir().unwrap();
    let runs = root.path().join("runs");
    for (name, label) in [("first", "model=a"), ("second", "model=b")] {
        let o = trellis()
            .args(["run", "suites/booking.kdl", "-q", "--label", label, "--out"])
            .arg(runs.join(name))
            .output()
            .await
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    }
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(runs.join("first/run.json")).unwrap())
            .unwrap();
    assert_eq!(meta["labels"]["model"], "a");
    assert_eq!(meta["endpoints"][0]["endpoint"], "builtin:booking");
    assert_eq!(meta["suite_fingerprint"].as_str().unwrap().len(), 64);

    let script = r#"
import sys
try:
    import polars as pl
    import duckdb
except ImportError as e:
    print("SKIP", e)
    sys.exit(0)
t = pl.scan_parquet("runs/**/trajectories.parquet").collect()
assert t["run_id"].n_unique() == 2, t
assert t["schema_version"].unique().to_list() == [2]
for table in ["turns", "tool_calls", "criteria"]:
    assert pl.scan_parquet(f"runs/**/{table}.parquet").collect()["run_id"].n_unique() == 2
r = pl.read_parquet("runs/*/runs.parquet").sort("labels")
assert r["labels"].to_list() == [["model=a"], ["model=b"]], r
assert r["suite_fingerprint"].n_unique() == 1
rows = duckdb.sql("SELECT run_id, count(*) FROM read_parquet('runs/*/trajectories.parquet') GROUP BY ALL").fetchall()
assert len(rows) == 2 and all(n == rows[0][1] for _, n in rows), rows
print("OK")
"#;
    let o = match tokio::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .current_dir(root.path())
        .output()
        .await
    {
        Ok(o) => o,
        Err(e) => {
            println!("note: python3 not available ({e}); the polars/DuckDB check was skipped");
            return;
        }
    };
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    if stdout(&o).starts_with("SKIP") {
        println!(
            "note: {}; the polars/DuckDB check was skipped",
            stdout(&o).trim()
        );
        return;
    }
    assert_eq!(stdout(&o).trim(), "OK");
}

#[tokio::test]
async fn run_with_a_baseline_exits_by_the_comparison_and_streams_json() {
    let runs = tempfile::tempdir().unwrap();
    let o = trellis()
        .args(["run", "suites/booking.kdl", "-q", "--out"])
        .arg(runs.path().join("base"))
        .output()
        .await
        .unwrap();
    // asks-price fails on purpose in every run.
    assert_eq!(o.status.code(), Some(1));

    let o = trellis()
        .args([
            "run",
            "suites/booking.kdl",
            "--message-format",
            "json",
            "--baseline",
            "base",
            // Local agents answer in milliseconds; their latency is not under test.
            "--max-latency-increase",
            "100000",
            "--out",
        ])
        .arg(runs.path().join("head"))
        .output()
        .await
        .unwrap();
    // The same failures as the baseline: nothing regressed.
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let events: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    assert_eq!(events.first().unwrap()["type"], "run_started");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "run_finished");
    assert_eq!(last["regressed"], false);
    assert_eq!(last["exit_code"], 0);
    // Every trajectory is in one of the five counts.
    let counted: u64 = ["passed", "failed", "errors", "skipped", "invalid"]
        .iter()
        .map(|k| last[k].as_u64().unwrap_or_else(|| panic!("{k}: {last}")))
        .sum();
    assert_eq!(Some(counted), last["trajectories"].as_u64(), "{last}");
    let finished: Vec<_> = events
        .iter()
        .filter(|e| e["type"] == "trajectory_finished")
        .collect();
    assert_eq!(
        finished.len() as u64,
        last["trajectories"].as_u64().unwrap()
    );
    let failing = finished.iter().find(|e| e["status"] == "failed").unwrap();
    assert!(
        failing["failed_criteria"][0]["criterion"].is_string(),
        "{failing}"
    );
    // compare.json reads back into the structure the HTML compare page renders.
    let comparison: trellis_reports::compare::Comparison = serde_json::from_str(
        &std::fs::read_to_string(runs.path().join("head/compare.json")).unwrap(),
    )
    .unwrap();
    assert!(!comparison.regressed);
    assert!(runs.path().join("head/compare.html").is_file());
    // Each run's page links the comparison it has, and only that.
    let page =
        |run: &str| std::fs::read_to_string(runs.path().join(run).join("report.html")).unwrap();
    let head_page = page("head");
    assert!(
        head_page.contains(r#"<a href="compare.html">"#),
        "the head's page does not link its comparison"
    );
    let base_label = comparison
        .base
        .name
        .as_deref()
        .unwrap_or(&comparison.base.run_id);
    assert!(head_page.contains(&format!("run <code>{base_label}</code>")));
    assert!(!page("base").contains(r#"href="compare.html""#));
    assert_eq!(
        comparison.base.dir,
        runs.path().join("base").display().to_string()
    );
    let text = std::fs::read_to_string(runs.path().join("head/summary.json")).unwrap();
    let typed: trellis_reports::Summary = serde_json::from_str(&text).unwrap();
    // book-duct-cleaning 2 × 3 repetitions, price-first 1, book-and-cancel 2.
    assert_eq!(typed.stats.aggregates.counts.trajectories, 9);
    // What the plan meant to run, as runs.parquet says.
    assert_eq!(typed.stats.aggregates.planned, 9);
    // The run's lock on its directory goes with the run.
    for run in ["base", "head"] {
        assert!(
            !runs.path().join(run).join(".trellis-run.lock").exists(),
            "{run} kept its lock file"
        );
    }
    let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(summary["schema_version"], 2);
    let branches = summary["stats"]["branches"].as_array().unwrap();
    let asks_price = branches
        .iter()
        .find(|b| b["trajectory"] == "asks-price")
        .unwrap();
    // Three repetitions, none passing: pass^3 and pass@3 are 0.
    assert_eq!(asks_price["repeats"]["samples"], 3);
    assert_eq!(asks_price["repeats"]["at_k"][2]["pass_at_k"], 0.0);

    // An unknown baseline is refused before anything runs.
    let o = trellis()
        .args(["run", "suites/booking.kdl", "--baseline", "nope", "--out"])
        .arg(runs.path().join("never"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(!runs.path().join("never").exists());
}

/// Run as a GitHub Actions step, a run annotates each failing scenario at the line that
/// declares it, in the workflow-command syntax the runner reads, and appends a summary to
/// the job's page; under a baseline, only what regressed is annotated, with the gate's
/// verdict, and the summary says it.
#[tokio::test]
async fn a_run_in_a_github_workflow_annotates_failures_and_writes_the_job_summary() {
    let work = tempfile::tempdir().unwrap();
    let summary = work.path().join("step-summary.md");
    let runs = work.path().join("runs");
    let in_workflow = |name: &str, extra: &[&str]| {
        let mut command = trellis();
        command
            .args(["run", "suites/booking.kdl", "--out"])
            .arg(runs.join(name))
            .args(["--max-latency-increase", "100000"])
            .args(extra)
            .env("GITHUB_ACTIONS", "true")
            .env("GITHUB_STEP_SUMMARY", &summary);
        command.output()
    };
    let o = in_workflow("base", &[]).await.unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = stdout(&o);
    let errors: Vec<&str> = text.lines().filter(|l| l.starts_with("::error ")).collect();
    // book-duct-cleaning's asks-price fails on purpose, at its `tool "create_booking"`
    // check on line 46.
    assert_eq!(errors.len(), 1, "{text}");
    // The path as the run was given it: relative to where it ran, the repository's root.
    assert!(
        errors[0].starts_with(
            "::error file=suites/booking.kdl,line=46,col=9,title=booking/book-duct-cleaning \
             [demo] failed::3 of 6 failed; tool \"create_booking\": "
        ),
        "{}",
        errors[0]
    );
    let written = std::fs::read_to_string(&summary).unwrap();
    assert!(written.starts_with("### Trellis run `"), "{written}");
    assert!(written.contains("| 9 | 6 | 3 | 0 | 0 | 0 |"), "{written}");
    assert!(
        written.contains("- `booking/book-duct-cleaning` [demo]: 3 of 6 failed: "),
        "{written}"
    );

    // Gated: the shared failure is not annotated, and the summary (appended) says so.
    let o = in_workflow("head", &["--baseline", "base"]).await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stdout(&o).contains("::error"), "{}", stdout(&o));
    let written = std::fs::read_to_string(&summary).unwrap();
    assert_eq!(written.matches("### Trellis run").count(), 2, "{written}");
    assert!(
        written.contains("**Gate: no regression** against the baseline `"),
        "{written}"
    );

    // Under --message-format json, stdout is the event stream: annotations go to stderr.
    let o = in_workflow("json", &["--message-format", "json"])
        .await
        .unwrap();
    assert!(
        stdout(&o).lines().all(|l| l.starts_with('{')),
        "{}",
        stdout(&o)
    );
    assert!(stderr(&o).contains("::error file="), "{}", stderr(&o));
}

/// A run whose simulated user broke character checked nothing in those trajectories: the
/// runs list says how many (its pass rate leaves them out, and read `100%` alone for a run
/// of one pass among seven), in the table and in `--json`.
#[tokio::test]
async fn the_runs_list_says_how_many_trajectories_were_invalid() {
    let runs = tempfile::tempdir().unwrap();
    let mut samples = vec![sample("main", 0, true, 10.0)];
    samples.extend((1..7).map(|i| Sample {
        invalid: true,
        ..sample("main", i, false, 10.0)
    }));
    write_run(runs.path(), "sim", "2026-01-01T00:00:00Z", &samples);
    let list = |json: bool| {
        let mut cmd = trellis();
        cmd.arg("runs").arg("--dir").arg(runs.path());
        if json {
            cmd.arg("--json");
        }
        cmd.output()
    };
    let o = list(true).await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let listed: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(listed[0]["trajectories"], 7);
    assert_eq!(listed[0]["passed"], 1);
    assert_eq!(listed[0]["invalid"], 6);
    let o = list(false).await.unwrap();
    assert!(stdout(&o).contains("6 invalid"), "{}", stdout(&o));
    // The directory `--out` gave it, beside its id: what its maker knows it by.
    assert!(stdout(&o).contains("┆ dir "), "{}", stdout(&o));
    assert!(stdout(&o).contains("┆ sim "), "{}", stdout(&o));
}

/// In a workflow whose step runs in a subdirectory (`working-directory: evals`), the
/// annotations name files from the repository's root ($GITHUB_WORKSPACE), where GitHub
/// looks for them. Under a baseline, a new scenario that fails the gate is annotated at
/// its line; an error's line in the job summary says its fault's category; and a failure
/// the baseline shares says so, instead of the summary claiming it of every failure.
#[tokio::test]
async fn github_annotations_name_files_from_the_workspace_and_say_what_the_gate_made_of_each() {
    let (_held, down) = refused_port();
    let workspace = tempfile::tempdir().unwrap();
    let evals = workspace.path().join("evals");
    std::fs::create_dir_all(evals.join("suites")).unwrap();
    let suite = evals.join("suites/s.kdl");
    std::fs::write(
        &suite,
        format!(
            r#"agent "a" protocol="connexity" builtin="booking"
agent "gone" protocol="connexity" url="http://127.0.0.1:{down}/agent/respond"
scenario "old" {{
    agent "a"
    user "Hi, I'd like to book a duct cleaning."
    expect reply contains="postal code"
}}
scenario "down" {{
    agent "gone"
    user "Hi"
    expect reply contains="hello"
}}
"#
        ),
    )
    .unwrap();
    let summary = workspace.path().join("step-summary.md");
    let in_workflow = |name: &str, extra: &[&str]| {
        let mut command = trellis();
        command
            .current_dir(&evals)
            .args(["run", "suites", "--quiet", "--out"])
            .arg(evals.join("runs").join(name))
            .args(["--max-latency-increase", "100000"])
            .args(extra)
            .env("GITHUB_ACTIONS", "true")
            .env("GITHUB_WORKSPACE", workspace.path())
            .env("GITHUB_STEP_SUMMARY", &summary);
        command.output()
    };
    let o = in_workflow("base", &[]).await.unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains(
            "::error file=evals/suites/s.kdl,line=8,title=s/down [gone] failed::1 of 1 ended \
             in an error; connect: could not connect to 127.0.0.1:"
        ),
        "{text}"
    );
    let written = std::fs::read_to_string(&summary).unwrap();
    assert!(
        written.contains("- `s/down` [gone]: 1 of 1 ended in an error: connect: could not connect"),
        "{written}"
    );

    // A new scenario that fails, beside the error the baseline had too.
    let mut text = std::fs::read_to_string(&suite).unwrap();
    text.push_str(
        "scenario \"newone\" {\n    agent \"a\"\n    user \"Hi\"\n    \
         expect reply contains=\"NEVER-SAID\"\n}\n",
    );
    std::fs::write(&suite, text).unwrap();
    std::fs::remove_file(&summary).unwrap();
    let o = in_workflow("head", &["--baseline", "base"]).await.unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = stdout(&o);
    let errors: Vec<&str> = text.lines().filter(|l| l.starts_with("::error")).collect();
    assert_eq!(errors.len(), 2, "{text}");
    assert!(
        errors[0].starts_with("::error title=Trellis gate::1 regression"),
        "{text}"
    );
    assert!(
        errors[1].starts_with(
            "::error file=evals/suites/s.kdl,line=13,title=s/newone [a] new and failing::new \
             in the head run, and failing: 0/1 passed; reply contains=\"NEVER-SAID\": "
        ),
        "{text}"
    );
    let written = std::fs::read_to_string(&summary).unwrap();
    assert!(written.contains("**Gate: regressed**"), "{written}");
    assert!(
        written.contains(
            "- `s/down` [gone]: 1 of 1 ended in an error (as in the baseline: 0/1 → 0/1 \
             passed): connect: could not connect"
        ),
        "{written}"
    );
    assert!(!written.contains("failures it shares"), "{written}");

    // Suites outside the workspace have no path GitHub can place: no `file=`, rather than
    // one relative to somewhere else.
    let elsewhere = tempfile::tempdir().unwrap();
    let o = trellis()
        .current_dir(&evals)
        .args(["run", "suites", "--quiet", "--out"])
        .arg(evals.join("runs/outside"))
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_WORKSPACE", elsewhere.path())
        .output()
        .await
        .unwrap();
    let text = stdout(&o);
    let errors: Vec<&str> = text.lines().filter(|l| l.starts_with("::error")).collect();
    assert!(!errors.is_empty(), "{text}");
    assert!(errors.iter().all(|e| !e.contains("file=")), "{text}");
}

/// A scenario the baseline checked, taken out of the suite: it passes the gate (without
/// `--gate-removed`), and the pull request is told where its reviewers look: a warning
/// annotation, the job summary naming it, and the JUnit gate case's output; not only the
/// console.
#[tokio::test]
async fn a_scenario_taken_out_is_said_on_the_pull_request_and_in_junit() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("suites")).unwrap();
    let suite = dir.path().join("suites/s.kdl");
    let scenario = |name: &str| {
        format!(
            "scenario \"{name}\" {{\n    agent \"a\"\n    user \"Hi, I'd like to book a duct \
             cleaning.\"\n    expect reply contains=\"postal code\"\n}}\n"
        )
    };
    let head = "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n";
    std::fs::write(
        &suite,
        format!("{head}{}{}", scenario("kept"), scenario("gone")),
    )
    .unwrap();
    let summary = dir.path().join("step-summary.md");
    let run = |name: &str, extra: &[&str]| {
        let mut command = trellis();
        command
            .current_dir(dir.path())
            .args(["run", "suites", "--quiet", "--out"])
            .arg(dir.path().join("runs").join(name))
            .args(["--max-latency-increase", "100000"])
            .args(extra)
            .env("GITHUB_ACTIONS", "true")
            .env("GITHUB_WORKSPACE", dir.path())
            .env("GITHUB_STEP_SUMMARY", &summary);
        command.output()
    };
    let o = run("base", &[]).await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    std::fs::write(&suite, format!("{head}{}", scenario("kept"))).unwrap();
    std::fs::remove_file(&summary).unwrap();
    let o = run("head", &["--baseline", "base"]).await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains(
            "::warning title=Trellis gate::1 scenario that the base run checked is not in the \
             head run"
        ),
        "{text}"
    );
    let written = std::fs::read_to_string(&summary).unwrap();
    assert!(written.contains("**Gate: no regression**"), "{written}");
    assert!(written.contains("**Note:** 1 scenario"), "{written}");
    assert!(
        written.contains("- `s/gone` [a]: checked in the baseline, not in this run"),
        "{written}"
    );
    let junit = std::fs::read_to_string(dir.path().join("runs/head/junit.xml")).unwrap();
    assert!(
        junit.contains("no regression past the thresholds; but 1 scenario that the base run"),
        "{junit}"
    );
}

/// Taking a test out, or running it fewer times, is shown and counted; with `--gate-removed`
/// it fails the comparison, one line each.
#[tokio::test]
async fn gate_removed_fails_on_what_the_head_run_no_longer_checks() {
    let runs = tempfile::tempdir().unwrap();
    let mut base: Vec<Sample> = (0..3).map(|i| sample("kept", i, true, 100.0)).collect();
    base.push(sample("dropped", 0, true, 100.0));
    write_run(runs.path(), "base", "2026-01-01T00:00:00Z", &base);
    write_run(
        runs.path(),
        "head",
        "2026-01-02T00:00:00Z",
        &[sample("kept", 0, true, 100.0)],
    );
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let text = stdout(&o);
    assert!(
        text.contains(
            "note: 1 branch that the base run checked is not in the head run (verdict \
             `removed`: branch s/c dropped [a]), and 2 scenarios or branches are checked in fewer \
             repetitions: they do not fail the comparison unless --gate-removed is given"
        ),
        "{text}"
    );
    assert!(text.contains("--gate-removed"), "{text}");

    let o = compare(runs.path(), &["base", "head", "--gate-removed", "--json"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let c: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(c["thresholds"]["gate_removed"], true);
    assert!(c.get("taken_out").is_none(), "{c}");
    let regressions: Vec<&str> = c["regressions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r.as_str())
        .collect();
    assert_eq!(
        regressions,
        [
            "scenario s/c [a]: checked in 3 repetitions in the base run, 1 in the head run",
            "branch s/c kept [a]: checked in 3 repetitions in the base run, 1 in the head run",
            "branch s/c dropped [a]: checked in the base run, not in the head run",
        ],
        "{c}"
    );
}

/// A comparison's lists are cut at twenty rows, those that gate first, and the rest counted
/// by verdict: a head run filtered to a few of a baseline's many branches listed every one
/// removed (17,860 lines in a CI log for a dataset of 10,000 rows).
#[tokio::test]
async fn a_comparison_lists_twenty_rows_gating_ones_first_and_counts_the_rest() {
    let runs = tempfile::tempdir().unwrap();
    let mut base: Vec<Sample> = (0..40)
        .map(|i| {
            let name: &'static str = Box::leak(format!("b{i:02}").into_boxed_str());
            sample(name, 0, true, 100.0)
        })
        .collect();
    base.push(sample("zkept", 0, true, 100.0));
    write_run(runs.path(), "base", "2026-01-01T00:00:00Z", &base);
    write_run(
        runs.path(),
        "head",
        "2026-01-02T00:00:00Z",
        &[sample("zkept", 0, false, 100.0)],
    );
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let text = stdout(&o);
    let branches: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "branches")
        .skip(4)
        .take_while(|l| l.starts_with('│'))
        .collect();
    assert_eq!(branches.len(), 20, "{text}");
    // The regression first, though `zkept` sorts last.
    assert!(
        branches[0].contains("zkept") && branches[0].contains("regressed"),
        "{text}"
    );
    assert!(
        text.contains(
            "… and 21 more (21 removed): listed in full by --json (and in the run's \
             compare.json under --baseline)"
        ),
        "{text}"
    );
    let o = compare(runs.path(), &["base", "head", "--json"]).await;
    let c: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(c["branches"].as_array().unwrap().len(), 41, "{c}");
}

/// Makes the one-turn run written by `write_run` in `dir` one that a signal stopped, and
/// writes its results again from the journal.
async fn mark_stopped(dir: &std::path::Path) {
    let journal = dir.join("journal.jsonl");
    let text = std::fs::read_to_string(&journal).unwrap();
    assert!(text.contains("\"turns\":1}}"), "{text}");
    std::fs::write(
        &journal,
        text.replace("\"turns\":1}}", "\"turns\":1,\"interrupted\":true}}"),
    )
    .unwrap();
    let o = trellis().arg("report").arg(dir).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// A head run stopped part-way checked fewer repetitions because it was stopped: the
/// comparison fails for the stop, and no note says its fewer repetitions do not fail it.
#[tokio::test]
async fn a_stopped_head_run_is_not_said_to_have_fewer_repetitions_that_do_not_fail() {
    let runs = tempfile::tempdir().unwrap();
    let base: Vec<Sample> = (0..3).map(|i| sample("kept", i, true, 100.0)).collect();
    write_run(runs.path(), "base", "2026-01-01T00:00:00Z", &base);
    write_run(
        runs.path(),
        "head",
        "2026-01-02T00:00:00Z",
        &[sample("kept", 0, true, 100.0)],
    );
    let o = compare(runs.path(), &["base", "head"]).await;
    assert!(stdout(&o).contains("fewer repetitions"), "{}", stdout(&o));
    mark_stopped(&runs.path().join("head")).await;
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let text = stdout(&o);
    assert!(text.contains("the head run was stopped"), "{text}");
    assert!(!text.contains("fewer repetitions"), "{text}");
    assert!(!text.contains("do not fail the comparison"), "{text}");
}

/// A branch a stopped head run did not reach was not run: not `removed` from the suites.
#[tokio::test]
async fn a_branch_a_stopped_head_run_did_not_reach_is_not_run_not_removed() {
    let runs = tempfile::tempdir().unwrap();
    write_run(
        runs.path(),
        "base",
        "2026-01-01T00:00:00Z",
        &[
            sample("first", 0, true, 100.0),
            sample("second", 0, true, 100.0),
        ],
    );
    write_run(
        runs.path(),
        "head",
        "2026-01-02T00:00:00Z",
        &[sample("first", 0, true, 100.0)],
    );
    mark_stopped(&runs.path().join("head")).await;
    let o = compare(runs.path(), &["base", "head", "--json"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let c: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let second = c["branches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["trajectory"] == "second")
        .unwrap();
    assert_eq!(second["rate"]["verdict"], "not_run", "{second}");
    // And its checks: not listed as "taken out, or its text edited".
    let checks: Vec<&serde_json::Value> = c["criteria"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["trajectory"] == "second")
        .collect();
    assert!(!checks.is_empty(), "{c}");
    for check in checks {
        assert_eq!(check["rate"]["verdict"], "not_run", "{check}");
    }
    let o = compare(runs.path(), &["base", "head"]).await;
    assert!(!stdout(&o).contains("taken out"), "{}", stdout(&o));
    // The run's pass rate is that of what happened to finish: not compared.
    let rate = c["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["metric"] == "pass_rate" && m["agent"].is_null())
        .unwrap();
    assert_eq!(rate["verdict"], "not_comparable", "{rate}");
    assert!(
        rate["why"]
            .as_str()
            .is_some_and(|w| w.starts_with("the head run stopped before its end")),
        "{rate}"
    );
}

/// A run stopped before its work was done holds a head run to part of its plan: refused as
/// `run --baseline` before anything runs (as `runs pin` refuses it), and a regression of
/// `compare`, whose JSON says the base was stopped.
#[tokio::test]
async fn a_stopped_run_is_no_baseline() {
    let runs = tempfile::tempdir().unwrap();
    write_run(
        runs.path(),
        "stopped",
        "2026-01-01T00:00:00Z",
        &[sample("yes", 0, true, 100.0)],
    );
    mark_stopped(&runs.path().join("stopped")).await;
    // Two scenarios and two branches the stopped base never reached, failing in the head.
    let other = |scenario: &'static str| Sample {
        scenario,
        ..sample("main", 0, false, 100.0)
    };
    write_run(
        runs.path(),
        "head",
        "2026-01-02T00:00:00Z",
        &[
            sample("yes", 0, true, 100.0),
            sample("later", 0, false, 100.0),
            sample("last", 0, false, 100.0),
            other("d"),
            other("e"),
        ],
    );

    let o = compare(runs.path(), &["stopped", "head", "--json"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let c: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    // Said once, not as scenarios new in the head run.
    let said: Vec<&str> = c["regressions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r.as_str())
        .collect();
    assert!(
        said.iter().any(|r| r.starts_with(
            "2 scenarios that the base run never reached (it stopped before its end) fail in \
             the head run (the first: "
        )),
        "{said:?}"
    );
    assert!(
        said.iter().any(|r| r.starts_with(
            "2 branches that the base run never reached (it stopped before its end) fail in \
             the head run (the first: s/c "
        )),
        "{said:?}"
    );
    assert!(
        !said
            .iter()
            .any(|r| r.contains("new in the head run") || r.contains("not checked in the base")),
        "{said:?}"
    );
    assert_eq!(c["base"]["stopped"], true, "{}", c["base"]);
    assert_eq!(c["head"]["stopped"], false, "{}", c["head"]);
    assert!(
        c["regressions"][0]
            .as_str()
            .unwrap()
            .starts_with("the base run was stopped before its work was done"),
        "{}",
        c["regressions"]
    );

    let o = trellis()
        .args([
            "run",
            "suites/booking.kdl",
            "--baseline",
            "stopped",
            "--out",
        ])
        .arg(runs.path().join("never"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(
        err.contains("was stopped before its work was done"),
        "{err}"
    );
    assert!(err.contains("--resume"), "{err}");
    assert!(!runs.path().join("never").exists());
}

/// Under `--baseline`, `junit.xml` carries the gate's verdict as a suite of its own: a CI
/// that reads only JUnit sees the regression, and whether the run regressed at all; and
/// `report.html` states it in its banner. A rebuilt report and a finished run resumed with
/// the same baseline keep one such case and one banner.
#[tokio::test]
async fn junit_and_the_report_carry_the_gates_verdict_under_a_baseline() {
    let work = tempfile::tempdir().unwrap();
    let suites = work.path().join("suites");
    std::fs::create_dir_all(suites.join("shared")).unwrap();
    std::fs::copy(
        repo("suites/shared/agents.kdl"),
        suites.join("shared/agents.kdl"),
    )
    .unwrap();
    let suite = |contains: &str| {
        std::fs::write(
            suites.join("gate.kdl"),
            format!(
                "include \"shared/agents.kdl\"\nscenario \"hello\" {{\n    agent \"demo\"\n    \
                 user \"Hi, I'd like to book a duct cleaning.\"\n    expect reply \
                 contains=\"{contains}\"\n}}\n"
            ),
        )
        .unwrap();
    };
    let runs = work.path().join("runs");
    let run = |name: &str, extra: &[&str]| {
        let mut command = trellis();
        command
            .arg("run")
            .arg(&suites)
            .args(["-q", "--max-latency-increase", "100000", "--out"])
            .arg(runs.join(name))
            .args(extra);
        command.output()
    };
    let junit = |name: &str| std::fs::read_to_string(runs.join(name).join("junit.xml")).unwrap();
    let page = |name: &str| std::fs::read_to_string(runs.join(name).join("report.html")).unwrap();
    suite("postal code");
    let o = run("base", &[]).await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!junit("base").contains("trellis gate"));

    let o = run("same", &["--baseline", "base"]).await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let xml = junit("same");
    assert!(
        xml.contains("<testsuites name=\"trellis ") && xml.contains(" tests=\"2\" failures=\"0\""),
        "{xml}"
    );
    assert!(
        xml.contains(
            "<testcase name=\"no regression against the baseline\" classname=\"trellis\" \
             time=\"0.000\">\n      <system-out>compared with the baseline "
        ) && xml.contains(": no regression past the thresholds</system-out>"),
        "{xml}"
    );
    assert!(
        page("same").contains(
            "<div class=\"banner ok\" id=\"compared\"><b>The gate passed: no regression</b> \
             against the baseline, run <code>"
        ),
        "{}",
        page("same")
    );

    suite("no such words");
    let o = run("head", &["--baseline", "base"]).await.unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let check_gate = |xml: &str| {
        assert_eq!(
            xml.matches("<testsuite name=\"trellis gate\"").count(),
            1,
            "{xml}"
        );
        let totals = xml.lines().nth(1).unwrap();
        assert!(
            totals.contains(" tests=\"2\" failures=\"2\" errors=\"0\""),
            "{totals}"
        );
        assert!(
            xml.contains("<failure type=\"regression\" message=\"3 regressions against "),
            "{xml}"
        );
        assert!(xml.ends_with("  </testsuite>\n</testsuites>\n"), "{xml}");
    };
    let check_page = |html: &str| {
        assert_eq!(html.matches(" id=\"compared\"").count(), 1, "{html}");
        assert!(
            html.contains(
                "<div class=\"banner regressed\" id=\"compared\"><b>The gate failed: 3 \
                 regressions</b>"
            ) && html.contains("<li>scenario gate&#x2f;hello [demo]: 1&#x2f;1 → 0&#x2f;1 passed"),
            "{html}"
        );
    };
    check_gate(&junit("head"));
    check_page(&page("head"));

    // Rebuilt from the journal, the file has the gate again, once.
    let o = trellis()
        .arg("report")
        .arg(runs.join("head"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    check_gate(&junit("head"));
    check_page(&page("head"));
    // Rebuilt into another directory, the page's link to the comparison finds it there.
    let o = trellis()
        .arg("report")
        .arg(runs.join("head"))
        .arg("--out")
        .arg(runs.join("rebuilt"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    check_page(&page("rebuilt"));
    assert!(page("rebuilt").contains("href=\"compare.html\""));
    for name in ["compare.html", "compare.json"] {
        assert_eq!(
            std::fs::read(runs.join("rebuilt").join(name)).unwrap(),
            std::fs::read(runs.join("head").join(name)).unwrap(),
            "{name}"
        );
    }
    // A finished run resumed with its baseline gives the gate's answer again, once.
    let o = trellis()
        .arg("run")
        .arg(&suites)
        .args(["-q", "--baseline", "base", "--resume"])
        .arg(runs.join("head"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    check_gate(&junit("head"));
    check_page(&page("head"));
}

#[tokio::test]
async fn junit_has_one_case_per_repetition_and_suites_take_wall_time() {
    let out = tempfile::tempdir().unwrap();
    let o = trellis()
        .args(["run", "suites/booking.kdl", "-q", "--out"])
        .arg(out.path())
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let xml = std::fs::read_to_string(out.path().join("junit.xml")).unwrap();
    let t = read_parquet(&out.path().join("trajectories.parquet"));
    assert_eq!(xml.matches("<testcase ").count(), t.height());
    for repetition in 0..3 {
        assert!(
            xml.contains(&format!(
                "book-duct-cleaning/asks-price [demo #{repetition}]"
            )),
            "{xml}"
        );
    }
    assert!(
        xml.contains("<failure message=\"criterion failed: "),
        "{xml}"
    );

    // Two trajectories of 100 ms each at the same time: the suite took 0.1 s, not 0.2 s.
    let runs = tempfile::tempdir().unwrap();
    write_run(
        runs.path(),
        "overlap",
        "2026-01-01T00:00:00Z",
        &[sample("yes", 0, true, 100.0), sample("no", 0, false, 100.0)],
    );
    let overlap = std::fs::read_to_string(runs.path().join("overlap/junit.xml")).unwrap();
    assert!(
        overlap.contains("<testsuite name=\"s\" tests=\"2\" failures=\"1\" errors=\"0\" skipped=\"0\" time=\"0.100\""),
        "{overlap}"
    );
    assert!(
        overlap.contains(
            "criterion failed: reply contains=&quot;hello&quot;: reply was &quot;bye&quot;"
        ),
        "{overlap}"
    );
    // The suite's time is its wall time: no more than the sum of its cases' times.
    let time_of = |element: &str| -> f64 {
        let start = xml.find(element).unwrap();
        let rest = &xml[start..];
        let t = rest.find("time=\"").unwrap() + 6;
        rest[t..t + rest[t..].find('"').unwrap()].parse().unwrap()
    };
    let suite = time_of("<testsuite name=\"booking\"");
    let cases: f64 = xml
        .match_indices("<testcase ")
        .map(|(i, _)| {
            let rest = &xml[i..];
            let t = rest.find("time=\"").unwrap() + 6;
            rest[t..t + rest[t..].find('"').unwrap()]
                .parse::<f64>()
                .unwrap()
        })
        .sum();
    assert!(suite <= cases + 0.002, "suite {suite}s, cases {cases}s");
}

#[tokio::test]
async fn report_out_rebuilds_into_another_directory_and_leaves_the_run_alone() {
    let runs = tempfile::tempdir().unwrap();
    write_run(
        runs.path(),
        "run",
        "2026-01-01T00:00:00Z",
        &[sample("main", 0, false, 10.0)],
    );
    let run = runs.path().join("run");
    let before = std::fs::metadata(run.join("report.html"))
        .unwrap()
        .modified()
        .unwrap();
    let elsewhere = runs.path().join("elsewhere/nested");
    let o = trellis()
        .arg("report")
        .arg(&run)
        .arg("--out")
        .arg(&elsewhere)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for name in [
        "trajectories.parquet",
        "report.html",
        "junit.xml",
        "summary.json",
    ] {
        assert!(elsewhere.join(name).is_file(), "{name} missing");
    }
    // Transcripts are read back from the run's journal, not from the output directory.
    let html = std::fs::read_to_string(elsewhere.join("report.html")).unwrap();
    assert!(html.contains("hello"), "the transcript is missing");
    let after = std::fs::metadata(run.join("report.html"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(before, after);
    assert!(trellis_engine::journal::find(&elsewhere).is_none());
}

/// Reports rebuilt into the runs directory (`trellis report RUN --out runs/rebuilt`) are a
/// copy of RUN, not another run: the listing has RUN once, `compare`'s "last two" are two
/// runs (they were RUN and its copy, refused as a run compared with itself), and the copy
/// says in its `run.json` what RUN ran, without the name given to RUN's directory.
#[tokio::test]
async fn reports_rebuilt_next_to_the_runs_are_not_another_run() {
    let work = tempfile::tempdir().unwrap();
    let ids = run_back_to_back(work.path(), 2).await;
    let runs = work.path().join("runs");
    let o = trellis()
        .args(["runs", "name", &ids[1], "head", "--dir"])
        .arg(&runs)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rebuilt = runs.join("rebuilt");
    let o = trellis()
        .arg("report")
        .arg(runs.join(&ids[1]))
        .arg("--out")
        .arg(&rebuilt)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    let meta = |dir: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap()
    };
    let (run, copy) = (meta(&runs.join(&ids[1])), meta(&rebuilt));
    assert_eq!(copy["run_id"], ids[1].as_str());
    assert_eq!(copy["source"], run["source"]);
    assert!(
        copy["source"]["files"][0]["path"]
            .as_str()
            .unwrap()
            .ends_with("booking.kdl")
    );
    assert_eq!(run["name"], "head");
    assert!(copy.get("name").is_none(), "{copy}");

    let listed = runs_json(&runs).await;
    let listed: Vec<(&str, &str)> = listed
        .iter()
        .map(|r| (r["run_id"].as_str().unwrap(), r["dir"].as_str().unwrap()))
        .collect();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[1].0, ids[1]);
    assert!(listed[1].1.ends_with(&ids[1]), "{listed:?}");

    let o = compare(&runs, &["--json", "--max-latency-increase", "100000"]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let c: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(c["base"]["run_id"], ids[0]);
    assert_eq!(c["head"]["run_id"], ids[1]);
}

#[tokio::test]
async fn colour_follows_clicolor_force_and_no_color() {
    let runs = tempfile::tempdir().unwrap();
    write_run(
        runs.path(),
        "base",
        "2026-01-01T00:00:00Z",
        &[sample("main", 0, true, 10.0)],
    );
    write_run(
        runs.path(),
        "head",
        "2026-01-02T00:00:00Z",
        &[sample("main", 0, false, 10.0)],
    );
    let run = |no_color: bool| {
        let mut cmd = trellis();
        cmd.args(["compare", "--dir"]).arg(runs.path());
        cmd.env("CLICOLOR_FORCE", "1").env_remove("NO_COLOR");
        if no_color {
            cmd.env("NO_COLOR", "1");
        }
        cmd
    };
    let o = run(false).output().await.unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("\u{1b}["), "no colour: {}", stdout(&o));
    let o = run(true).output().await.unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        !stdout(&o).contains('\u{1b}'),
        "colour despite NO_COLOR: {}",
        stdout(&o)
    );
    // Piped without either: plain text.
    let o = trellis()
        .args(["compare", "--dir"])
        .arg(runs.path())
        .env_remove("CLICOLOR_FORCE")
        .env_remove("NO_COLOR")
        .output()
        .await
        .unwrap();
    assert!(!stdout(&o).contains('\u{1b}'), "{}", stdout(&o));
}

/// A run directory whose name is not UTF-8 is listed by `runs --json` as text (its bytes
/// read lossily), not a reason to refuse the whole list.
#[tokio::test]
async fn runs_json_lists_a_run_whose_directory_name_is_not_utf8() {
    use std::os::unix::ffi::OsStrExt;
    let runs = tempfile::tempdir().unwrap();
    write_run(
        runs.path(),
        "plain",
        "2026-01-01T00:00:00Z",
        &[sample("main", 0, true, 10.0)],
    );
    write_run(
        runs.path(),
        "odd",
        "2026-01-02T00:00:00Z",
        &[sample("main", 0, true, 10.0)],
    );
    let odd = runs.path().join(std::ffi::OsStr::from_bytes(b"odd-\xff"));
    std::fs::rename(runs.path().join("odd"), &odd).unwrap();
    let list = runs_json(runs.path()).await;
    let dirs: Vec<&str> = list.iter().filter_map(|r| r["dir"].as_str()).collect();
    assert_eq!(dirs.len(), 2, "{list:?}");
    assert!(dirs.iter().any(|d| d.ends_with("odd-\u{fffd}")), "{dirs:?}");
}

#[tokio::test]
async fn runs_in_a_missing_directory_is_an_empty_history() {
    let dir = tempfile::tempdir().unwrap();
    // `history` is another name of `runs` (it was taken for `list`, the scenarios).
    for command in ["runs", "history"] {
        let o = trellis()
            .args([command, "--dir"])
            .arg(dir.path().join("none"))
            .output()
            .await
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{command}: {}", stderr(&o));
        assert!(stdout(&o).contains("no runs in"), "{}", stdout(&o));
    }
    let o = trellis()
        .args(["compare", "--dir"])
        .arg(dir.path().join("none"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("two finished runs"), "{}", stderr(&o));
}

#[tokio::test]
async fn a_failure_in_a_shared_prefix_is_reported_at_the_prefix() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("prefix.kdl"),
        r#"agent "chat" protocol="connexity" builtin="booking"
scenario "fails-early" {
    agent "chat"
    repeat 2
    user "Hi, I'd like to book a duct cleaning."
    expect reply contains="words the agent never says"
    branch "accepts" { user "Tuesday works." }
    branch "asks-price" { user "How much is that?" }
}
"#,
    )
    .unwrap();
    let out = dir.path().join("run");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("prefix.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains(
            "PREFIX prefix/fails-early [chat] at shared node `start`: failed in 2 of 2 \
             executions, which fails 4 trajectories below it"
        ),
        "{text}"
    );

    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let nodes = summary["stats"]["nodes"].as_array().unwrap();
    let root = nodes.iter().find(|n| n["parent"].is_null()).unwrap();
    assert_eq!(root["reached"], 4);
    assert_eq!(root["failed_here"], 4);
    assert_eq!(root["executions"], 2);
    assert_eq!(root["executions_failed_here"], 2);
    for branch in nodes.iter().filter(|n| !n["parent"].is_null()) {
        assert_eq!(branch["failed_here"], 0, "{branch}");
        assert_eq!(branch["failed_above"], 2, "{branch}");
    }
}

/// The run ids `trellis run --message-format json` reported, in the order the runs were made.
async fn run_back_to_back(work: &Path, count: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..count {
        let o = trellis()
            .current_dir(work)
            .args(["run", "--filter", "price-first", "--message-format", "json"])
            .arg(repo("suites/booking.kdl"))
            .output()
            .await
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
        let last: serde_json::Value =
            serde_json::from_str(stdout(&o).lines().last().unwrap()).unwrap();
        ids.push(last["run_id"].as_str().unwrap().to_owned());
    }
    ids
}

#[tokio::test]
async fn runs_made_back_to_back_are_listed_and_compared_in_the_order_they_started() {
    let work = tempfile::tempdir().unwrap();
    // Runs of one scenario take well under a second: most of them start in the same one.
    let ids = run_back_to_back(work.path(), 4).await;
    let runs = work.path().join("runs");
    // `ls runs/` shows the order too.
    let mut dirs: Vec<String> = std::fs::read_dir(&runs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    assert_eq!(dirs, ids);

    let listed = runs_json(&runs).await;
    let listed: Vec<&str> = listed
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ids);

    // "The last two" are the two that started last, older first.
    let o = compare(&runs, &["--json", "--max-latency-increase", "100000"]).await;
    let c: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(c["base"]["run_id"], ids[2]);
    assert_eq!(c["head"]["run_id"], ids[3]);
}

/// `latest/`, where `trellis watch` mirrors its current state, is left out of `runs` and of
/// `compare`'s defaults; named, it is refused too instead of being pinned (a pin nothing
/// would then find: `compare` fell back to the last two runs and `run --baseline` said
/// nothing was pinned) or compared.
#[tokio::test]
async fn watch_latest_mirror_cannot_be_pinned_or_compared() {
    let runs = tempfile::tempdir().unwrap();
    let whole = [sample("main", 0, true, 10.0)];
    write_run(runs.path(), "base", "2026-01-01T00:00:00Z", &whole);
    write_run(runs.path(), "head", "2026-01-02T00:00:00Z", &whole);
    write_run(runs.path(), "latest", "2026-01-03T00:00:00Z", &whole);

    let mirror = runs.path().join("latest");
    let by_path = mirror.to_str().unwrap();
    for args in [
        &["runs", "pin", "latest"][..],
        &["runs", "pin", by_path],
        &["runs", "name", "latest", "mine"],
        &["compare", "base", "latest"],
        &["compare", "latest"],
    ] {
        let o = trellis()
            .args(args)
            .arg("--dir")
            .arg(runs.path())
            .output()
            .await
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stdout(&o));
        assert!(
            stderr(&o).contains("where `trellis watch` mirrors its current state"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    assert!(
        !mirror.join("run.json").exists(),
        "the mirror was pinned or named"
    );
    let o = compare(runs.path(), &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("head 20260102T000000Z-head"),
        "{}",
        stdout(&o)
    );
}

#[tokio::test]
async fn watch_reruns_are_not_runs_of_the_history() {
    let runs = tempfile::tempdir().unwrap();
    let whole = [
        sample("main", 0, true, 10.0),
        sample("main", 1, true, 10.0),
        sample("other", 0, true, 10.0),
    ];
    write_run(runs.path(), "base", "2026-01-01T00:00:00Z", &whole);
    write_run(runs.path(), "head", "2026-01-02T00:00:00Z", &whole);
    // What `trellis watch` records per rerun: only what reran. One marked in its run.json,
    // one from before it was marked, known by its name alone.
    write_run(
        runs.path(),
        "20260103T000000.000Z-r0001-1a2b",
        "2026-01-03T00:00:00Z",
        &[sample("main", 0, false, 10.0)],
    );
    let marked = runs.path().join("20260103T000000.000Z-r0001-1a2b");
    trellis_reports::history::mark_watch_rerun(&marked, "20260103T000000.000Z-r0001-1a2b", 1)
        .unwrap();
    std::fs::rename(&marked, runs.path().join("rerun-marked")).unwrap();
    write_run(
        runs.path(),
        "20260104T000000Z-r0002-beef",
        "2026-01-04T00:00:00Z",
        &[sample("main", 0, false, 10.0)],
    );

    let listed = runs_json(runs.path()).await;
    let dirs: Vec<&str> = listed
        .iter()
        .map(|r| r["dir"].as_str().unwrap().rsplit('/').next().unwrap())
        .collect();
    assert_eq!(dirs, ["base", "head"]);

    // Without runs, compare takes the last two whole runs.
    let o = compare(runs.path(), &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("OK"), "{}", stdout(&o));

    // Named as a baseline, a rerun is refused, saying why.
    let o = trellis()
        .args(["compare", "rerun-marked", "head", "--dir"])
        .arg(runs.path())
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("rerun of `trellis watch`"),
        "{}",
        stderr(&o)
    );

    // The report's trends leave reruns out: only base is drawn before head.
    let o = trellis()
        .arg("report")
        .arg(runs.path().join("head"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let html = std::fs::read_to_string(runs.path().join("head/report.html")).unwrap();
    assert!(
        html.contains("20260101T000000Z-base"),
        "no trend point for base"
    );
    assert!(
        !html.contains("r0001-1a2b"),
        "a rerun is drawn in the trend"
    );
    assert!(
        !html.contains("r0002-beef"),
        "a rerun is drawn in the trend"
    );
}

#[tokio::test]
async fn baseline_mistakes_are_explained() {
    let work = tempfile::tempdir().unwrap();
    // A first run with `--baseline` and nothing pinned yet.
    // Run from the repository, where `./suites` (the default paths) exists.
    let o = trellis()
        .arg("run")
        .arg("--out")
        .arg(work.path().join("runs/first"))
        .args(["--baseline", "suites/booking.kdl"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let err = stderr(&o);
    // The optional value took the suite path: say to put the flag after the paths.
    assert!(err.contains("put --baseline after"), "{err}");

    let o = trellis()
        .current_dir(work.path())
        .arg("run")
        .arg(repo("suites/booking.kdl"))
        .arg("--baseline")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(err.contains("trellis runs pin"), "{err}");
    assert!(!work.path().join("runs").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_runs_pass_and_an_agent_twice_as_slow_is_a_latency_regression() {
    use super::support::{Behavior, MisbehavingServer, OK_BODY};
    let runs = tempfile::tempdir().unwrap();
    let run = |name: &'static str, delay_ms: u64| {
        let runs = runs.path().to_path_buf();
        async move {
            let server = MisbehavingServer::start(Behavior::Delayed {
                delay: std::time::Duration::from_millis(delay_ms),
                body: OK_BODY.to_owned(),
            })
            .await;
            let suite = format!(
                "agent \"slow\" protocol=\"connexity\" url=\"{}\"\n\
                 scenario \"hello\" {{\n    agent \"slow\"\n    repeat 8\n    \
                 user \"hi\"\n    user \"again\"\n    expect no-error\n}}\n",
                server.url()
            );
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("slow.kdl"), suite).unwrap();
            let o = trellis()
                .arg("run")
                .arg(dir.path())
                .args(["-q", "--out"])
                .arg(runs.join(name))
                .output()
                .await
                .unwrap();
            assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
        }
    };
    // At the same time, so a busy machine slows both alike: the test is about the agent.
    tokio::join!(run("base", 50), run("slower", 100));
    // Identical runs of an agent that answers in 500 ms, one after the other: on a loaded
    // machine (CI runners, parallel builds and tests) every turn of a whole run can take tens
    // of milliseconds longer, a real shift of what was measured that no test on the turns
    // can call noise; 20% of 500 ms is above it.
    let same = [
        "same0", "same1", "same2", "same3", "same4", "same5", "same6", "same7",
    ];
    for name in same {
        run(name, 500).await;
    }

    // Every ordered pair of the eight identical runs: 56 comparisons, none regressed.
    let mut regressed = Vec::new();
    for base in same {
        for head in same.into_iter().filter(|h| *h != base) {
            let o = compare(runs.path(), &[base, head]).await;
            if o.status.code() != Some(0) {
                regressed.push(format!("{base} → {head}:\n{}", stdout(&o)));
            }
        }
    }
    assert!(regressed.is_empty(), "{}", regressed.join("\n"));

    let o = compare(runs.path(), &["base", "slower", "--json"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let c: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let latency = c["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["metric"] == "latency_mean_ms")
        .unwrap();
    assert_eq!(latency["verdict"], "regressed", "{latency}");
    assert!(latency["p_value"].as_f64().unwrap() < 0.001, "{latency}");
}

/// One scenario of eight became three times slower. Its turns are an eighth of the run's,
/// so neither the run's median nor its agent's moved; judged alone against the rest of the
/// run, the scenario regressed, and the gate fails naming it. A scenario with one turn a
/// side as much slower is not gated (no test can tell one turn from chance), and says so.
#[tokio::test]
async fn one_scenario_three_times_slower_fails_the_gate_though_the_run_median_holds() {
    let runs = tempfile::tempdir().unwrap();
    const SCENARIOS: [&str; 8] = ["a1", "a2", "a3", "a4", "a5", "a6", "a7", "slow"];
    let samples = |slow_ms: f64, once_ms: f64| -> Vec<Sample> {
        let mut all = Vec::new();
        for scenario in SCENARIOS {
            let ms = if scenario == "slow" { slow_ms } else { 60.0 };
            all.extend((0..10).map(|i| Sample {
                scenario,
                ..sample("main", i, true, ms + f64::from(i % 7))
            }));
        }
        all.push(Sample {
            scenario: "once",
            ..sample("main", 0, true, once_ms)
        });
        all
    };
    write_run(
        runs.path(),
        "base",
        "2026-01-01T00:00:00Z",
        &samples(60.0, 60.0),
    );
    write_run(
        runs.path(),
        "same",
        "2026-01-02T00:00:00Z",
        &samples(60.0, 60.0),
    );
    write_run(
        runs.path(),
        "head",
        "2026-01-03T00:00:00Z",
        &samples(180.0, 180.0),
    );
    let o = compare(runs.path(), &["base", "same"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));

    let o = compare(runs.path(), &["base", "head", "--json"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let c: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let run = c["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["metric"] == "latency_mean_ms")
        .unwrap();
    assert_ne!(run["verdict"], "regressed", "{run}");
    let of = |name: &str| {
        c["scenarios"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["scenario"] == name)
            .unwrap_or_else(|| panic!("no scenario {name}"))["latency"]
            .clone()
    };
    assert_eq!(of("slow")["verdict"], "regressed", "{}", of("slow"));
    assert!(
        of("slow")["p_value"].as_f64().unwrap() < 0.001,
        "{}",
        of("slow")
    );
    assert_eq!(of("a1")["verdict"], "unchanged", "{}", of("a1"));
    assert_eq!(of("once")["verdict"], "ungated", "{}", of("once"));
    let regressions = c["regressions"].as_array().unwrap();
    assert_eq!(regressions.len(), 1, "{regressions:?}");
    assert!(
        regressions[0]
            .as_str()
            .unwrap()
            .starts_with("scenario s/slow [a] latency_mean_ms: 62.400 → 182.400 (mean +120 ms"),
        "{regressions:?}"
    );

    // The console names it and why; the one-turn scenario says why it is not gated.
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let text = stdout(&o);
    assert!(
        text.contains("s/slow [a] latency_mean_ms regressed: mean +120 ms"),
        "{text}"
    );
    assert!(
        text.contains(
            "s/once [a] latency_mean_ms not gated: mean +120 ms; too few turns (1 and 1)"
        ),
        "{text}"
    );
}

/// One agent of two became ten times slower. It answers a third of the turns, so the run's
/// median turn hardly moved and the run's latency is `noise`; judged alone, the agent's
/// turns regressed, and the gate fails saying which agent and why.
#[tokio::test]
async fn one_agent_ten_times_slower_fails_the_gate_though_the_run_median_holds() {
    let runs = tempfile::tempdir().unwrap();
    let samples = |demo_ms: f64| -> Vec<Sample> {
        let mut all: Vec<Sample> = (0..60)
            .map(|i| sample("main", i, true, 20.0 + f64::from(i % 5)))
            .collect();
        all.extend((0..30).map(|i| Sample {
            agent: "demo",
            ..sample("main", i, true, demo_ms + f64::from(i % 5))
        }));
        all
    };
    write_run(runs.path(), "base", "2026-01-01T00:00:00Z", &samples(30.0));
    write_run(runs.path(), "head", "2026-01-02T00:00:00Z", &samples(330.0));
    let o = compare(runs.path(), &["base", "head", "--json"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let c: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let latency: Vec<&serde_json::Value> = c["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["metric"] == "latency_mean_ms")
        .collect();
    assert_eq!(latency.len(), 3, "{latency:?}");
    let run = latency[0];
    assert!(run.get("agent").is_none(), "{run}");
    assert_eq!(run["verdict"], "noise", "{run}");
    assert!(
        run["why"].as_str().unwrap().contains("median turn moved"),
        "{run}"
    );
    let of = |agent: &str| {
        latency
            .iter()
            .find(|m| m["agent"] == agent)
            .unwrap_or_else(|| panic!("no latency of {agent}: {latency:?}"))
    };
    assert_eq!(of("demo")["verdict"], "regressed", "{}", of("demo"));
    assert_eq!(of("a")["verdict"], "unchanged", "{}", of("a"));
    let regressions = c["regressions"].to_string();
    assert!(
        regressions.contains("agent demo latency_mean_ms: 32.000 → 332.000 (mean +300 ms"),
        "{regressions}"
    );

    // The console says it too, and why the run's own latency is noise.
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let text = stdout(&o);
    assert!(text.contains("latency_mean_ms [demo]"), "{text}");
    assert!(text.contains("latency_mean_ms noise: mean"), "{text}");
    assert!(text.contains("- agent demo latency_mean_ms"), "{text}");

    // Only one agent: no row of its own (the run's is the agent's).
    write_run(
        runs.path(),
        "one",
        "2026-01-03T00:00:00Z",
        &samples(30.0)[..60],
    );
    write_run(
        runs.path(),
        "one-again",
        "2026-01-04T00:00:00Z",
        &samples(30.0)[..60],
    );
    let o = compare(runs.path(), &["one", "one-again", "--json"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let c: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let metrics = c["metrics"].as_array().unwrap();
    assert!(
        metrics.iter().all(|m| m.get("agent").is_none()),
        "{metrics:?}"
    );
}

/// 40 turns of about `ms` milliseconds each (`ms` to `ms + 6`).
fn turns(ms: f64) -> Vec<Sample> {
    (0..40)
        .map(|i| sample("main", i, true, ms + f64::from(i % 7)))
        .collect()
}

/// Gives the run in `dir` the id `name` and the suite fingerprint `fingerprint`.
fn set_fingerprint(dir: &Path, name: &str, fingerprint: &str) {
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("run.json")).unwrap_or_default())
            .unwrap_or_else(|_| serde_json::json!({}));
    meta["run_id"] = serde_json::json!(name);
    meta["suite_fingerprint"] = serde_json::json!(fingerprint);
    std::fs::write(dir.join("run.json"), meta.to_string()).unwrap();
}

/// A run made while the machine was busier is slower in every turn, which the rank test
/// alone calls a regression. With three earlier runs of the same suites, one of them as
/// slow, it is the spread runs have here: `noise`, exit 0. Runs of other suites do not count,
/// nor runs whose own comparison found their latency regressed.
#[tokio::test]
async fn a_run_no_slower_than_earlier_runs_of_the_same_suites_is_not_a_latency_regression() {
    let runs = tempfile::tempdir().unwrap();
    let fingerprint = |name: &str, fingerprint: &str| {
        set_fingerprint(&runs.path().join(name), name, fingerprint);
    };
    for (name, day, ms) in [
        ("e1", 1, 15.0),
        ("busy", 2, 50.0),
        ("e3", 3, 16.0),
        ("base", 4, 15.0),
        ("head", 5, 50.0),
    ] {
        write_run(
            runs.path(),
            name,
            &format!("2026-01-0{day}T00:00:00Z"),
            &turns(ms),
        );
    }
    // Earlier runs of other suites: the head is slower than the base, past every test.
    for name in ["e1", "busy", "e3"] {
        fingerprint(name, "other suites");
    }
    for name in ["base", "head"] {
        fingerprint(name, "same suites");
    }
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("latency_mean_ms"), "{}", stdout(&o));

    for name in ["e1", "busy", "e3"] {
        fingerprint(name, "same suites");
    }
    let o = compare(runs.path(), &["base", "head", "--json"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let c: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let latency = c["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["metric"] == "latency_mean_ms")
        .unwrap();
    assert_eq!(latency["verdict"], "noise", "{latency}");

    // The slow earlier run failed its own gate on latency (`run --baseline` wrote that
    // next to it): a slower agent, not a busier machine. Counting it let every later run
    // as slow pass; it no longer counts, and two earlier runs are too few to say.
    std::fs::write(
        runs.path().join("busy/compare.json"),
        serde_json::json!({"metrics": [
            {"metric": "latency_mean_ms", "verdict": "regressed"}
        ]})
        .to_string(),
    )
    .unwrap();
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("latency_mean_ms"), "{}", stdout(&o));
}

/// An earlier run whose agent hung (every turn a 1 s timeout) measured its faults, not the
/// machine: counted, it made a head run 8 times slower than the base "noise".
#[tokio::test]
async fn an_earlier_run_of_timeouts_does_not_widen_the_latency_spread() {
    let runs = tempfile::tempdir().unwrap();
    for (name, day, ms, error) in [
        ("e1", 1, 50.0, false),
        ("e2", 2, 50.0, false),
        ("hung", 3, 1000.0, true),
        ("base", 4, 50.0, false),
        ("head", 5, 400.0, false),
    ] {
        let mut samples = turns(ms);
        for s in &mut samples {
            s.error = error;
        }
        write_run(
            runs.path(),
            name,
            &format!("2026-01-0{day}T00:00:00Z"),
            &samples,
        );
        set_fingerprint(&runs.path().join(name), name, "same suites");
    }
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("run latency_mean_ms"), "{}", stdout(&o));
}

/// An earlier run whose judge failed (trajectories in error, every turn answered) measured
/// the machine as any other: it counts in the spread, where dropping it switched the spread
/// off with fewer than three runs left.
#[tokio::test]
async fn an_earlier_run_whose_judge_failed_still_counts_in_the_latency_spread() {
    let runs = tempfile::tempdir().unwrap();
    for (name, day, ms, judge_failed) in [
        ("e1", 1, 100.0, false),
        ("busy", 2, 160.0, true),
        ("e3", 3, 100.0, false),
        ("base", 4, 100.0, false),
        ("head", 5, 150.0, false),
    ] {
        let mut samples = turns(ms);
        for s in &mut samples {
            s.error = judge_failed;
            s.answered = judge_failed;
        }
        write_run(
            runs.path(),
            name,
            &format!("2026-01-0{day}T00:00:00Z"),
            &samples,
        );
        set_fingerprint(&runs.path().join(name), name, "same suites");
    }
    // No slower than the busy run was: noise.
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
}

/// Runs made after the base without a gate may be the slower agent itself: three plain runs
/// of it do not make the next one noise. A later run that passed its own latency gate does
/// count.
#[tokio::test]
async fn ungated_runs_after_the_base_do_not_widen_the_latency_spread() {
    let runs = tempfile::tempdir().unwrap();
    for (name, day, ms) in [
        ("base", 1, 15.0),
        ("slow1", 2, 50.0),
        ("slow2", 3, 50.0),
        ("slow3", 4, 50.0),
        ("head", 5, 50.0),
    ] {
        write_run(
            runs.path(),
            name,
            &format!("2026-01-0{day}T00:00:00Z"),
            &turns(ms),
        );
        set_fingerprint(&runs.path().join(name), name, "same suites");
    }
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("latency_mean_ms"), "{}", stdout(&o));

    // Gated, and let through as `noise`: a rise the gate could not tell from the machine,
    // which may be the slower agent getting through; counted, each raised the bar for the
    // next (an agent twice as slow passed every run after one lucky median). Not counted.
    let verdict = |verdict: &str| {
        for name in ["slow1", "slow2", "slow3"] {
            std::fs::write(
                runs.path().join(name).join("compare.json"),
                serde_json::json!({"metrics": [
                    {"metric": "latency_mean_ms", "verdict": verdict}
                ]})
                .to_string(),
            )
            .unwrap();
        }
    };
    verdict("noise");
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));

    // Gated and unchanged: they count.
    verdict("unchanged");
    let o = compare(runs.path(), &["base", "head", "--json"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    // The verdict names the run that set the spread, to be looked at when it was a slower
    // agent that got through.
    let c: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let why = c["metrics"][1]["why"].as_str().unwrap().to_owned();
    assert!(why.contains(" ms, run 20260104T000000Z-slow3)"), "{why}");

    // The run's latency unchanged but an agent's let through as noise: as the run's.
    for name in ["slow1", "slow2", "slow3"] {
        std::fs::write(
            runs.path().join(name).join("compare.json"),
            serde_json::json!({"metrics": [
                {"metric": "latency_mean_ms", "verdict": "unchanged"},
                {"metric": "latency_mean_ms", "agent": "a", "verdict": "noise"}
            ]})
            .to_string(),
        )
        .unwrap();
    }
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));

    // Two of them passed their gate on the run's latency but regressed on a scenario's: a
    // slower agent in part, not a busier machine. Not counted (two left: too few to say).
    for name in ["slow2", "slow3"] {
        std::fs::write(
            runs.path().join(name).join("compare.json"),
            serde_json::json!({
                "metrics": [{"metric": "latency_mean_ms", "verdict": "unchanged"}],
                "scenarios": [{"scenario": "c", "latency": {"verdict": "regressed"}}]
            })
            .to_string(),
        )
        .unwrap();
    }
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scenario_skipped_because_its_needs_failed_is_not_run_and_a_regression() {
    use super::support::MisbehavingServer;
    let runs = tempfile::tempdir().unwrap();
    let run = |name: &'static str, reply: &'static str| {
        let runs = runs.path().to_path_buf();
        async move {
            let body = format!(
                r#"{{"messages":[{{"role":"assistant","content":"{reply}"}}],"model":"m","provider":"p"}}"#
            );
            let server = MisbehavingServer::respond(200, &body).await;
            let suite = format!(
                "agent \"bot\" protocol=\"connexity\" url=\"{}\"\n\
                 scenario \"login\" {{\n    agent \"bot\"\n    user \"hi\"\n    \
                 expect {{ reply contains=\"Hello\" }}\n}}\n\
                 scenario \"order\" {{\n    agent \"bot\"\n    needs \"login\"\n    \
                 user \"order\"\n    expect {{ reply contains=\"Hello\" }}\n}}\n",
                server.url()
            );
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("needs.kdl"), suite).unwrap();
            let o = trellis()
                .arg("run")
                .arg(dir.path())
                .args(["-q", "--out"])
                .arg(runs.join(name))
                .output()
                .await
                .unwrap();
            assert!(o.status.code().is_some(), "{}", stderr(&o));
        }
    };
    run("base", "Hello there.").await;
    run("head", "Goodbye.").await;

    let o = compare(
        runs.path(),
        &["base", "head", "--max-latency-increase", "100000"],
    )
    .await;
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("not run (needs `login`, which did not pass)"),
        "{out}"
    );
    assert!(!out.contains("removed"), "{out}");
    assert!(
        out.contains("scenario needs/order [bot]: not run (needs `login`"),
        "{out}"
    );
    let o = compare(
        runs.path(),
        &["base", "head", "--json", "--max-latency-increase", "100000"],
    )
    .await;
    let c: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let order = c["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["scenario"] == "order")
        .unwrap();
    assert_eq!(order["rate"]["verdict"], "not_run", "{order}");
    assert!(
        c["criteria"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| k["scenario"] == "order")
            .all(|k| k["rate"]["verdict"] == "not_run"),
        "{c}"
    );
}

#[tokio::test]
async fn a_run_never_replaces_or_becomes_its_own_baseline() {
    let runs = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        let mut cmd = trellis();
        cmd.args(["run", "suites/booking.kdl", "-q"])
            .args(extra)
            .arg("--out")
            .arg(runs.path().join("base"));
        cmd
    };
    // asks-price fails on purpose.
    assert_eq!(run(&[]).output().await.unwrap().status.code(), Some(1));
    let o = trellis()
        .args(["runs", "pin", "base", "--dir"])
        .arg(runs.path())
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let journal = std::fs::read(runs.path().join("base/journal.jsonl.zst")).unwrap();

    // Replaced and compared with itself it would "pass" whatever the new run found.
    let o = run(&["--replace", "--baseline"]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("compared with itself"),
        "{}",
        stderr(&o)
    );
    let o = run(&["--replace"]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("runs unpin"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(runs.path().join("base/journal.jsonl.zst")).unwrap(),
        journal,
        "the baseline is untouched"
    );
}

#[tokio::test]
async fn runs_given_by_path_keep_one_pin_and_unique_names_in_their_own_directory() {
    let here = tempfile::tempdir().unwrap();
    let there = tempfile::tempdir().unwrap();
    for (name, at) in [
        ("one", "2026-01-01T00:00:00Z"),
        ("two", "2026-01-02T00:00:00Z"),
    ] {
        write_run(there.path(), name, at, &[sample("main", 0, true, 10.0)]);
    }
    let runs_cmd = |args: &[&str], run: &str| {
        let mut cmd = trellis();
        cmd.arg("runs")
            .arg(args[0])
            .arg(there.path().join(run))
            .args(&args[1..])
            .arg("--dir")
            .arg(here.path());
        cmd
    };
    for run in ["one", "two"] {
        let o = runs_cmd(&["pin"], run).output().await.unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let o = runs_cmd(&["name", "v1"], "one").output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = runs_cmd(&["name", "v1"], "two").output().await.unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "a name is unique where the run is"
    );
    let list = trellis_reports::history::list_runs(there.path()).unwrap();
    let pinned: Vec<&str> = list
        .iter()
        .filter(|r| r.baseline)
        .map(|r| r.dir.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(pinned, ["two"], "one pin per runs directory");
    // Another run's id can never be used as a name: ids are looked up first.
    let id = list[1].run_id.clone();
    let o = runs_cmd(&["name", &id], "one").output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("another run's id"), "{}", stderr(&o));
}

#[tokio::test]
async fn a_run_that_checked_nothing_is_not_pinned_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", down.local_addr().unwrap());
    drop(down);
    let suite = dir.path().join("down.kdl");
    std::fs::write(
        &suite,
        format!(
            "agent \"gone\" protocol=\"connexity\" url=\"{url}\"\n\
             scenario \"a\" {{ user \"hi\"; expect no-error }}\n\
             scenario \"b\" {{ user \"hi\"; expect no-error }}\n"
        ),
    )
    .unwrap();
    let runs = dir.path().join("runs");
    let o = trellis()
        .args(["run", "-q", "--out"])
        .arg(runs.join("first"))
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let pin = |extra: &'static [&'static str]| {
        let runs = runs.clone();
        async move {
            trellis()
                .args(["runs", "pin", "first", "--dir"])
                .arg(&runs)
                .args(extra)
                .output()
                .await
                .unwrap()
        }
    };
    let o = pin(&[]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = flat(&stderr(&o));
    assert!(
        said.contains("all 2 of its trajectories ended in an error"),
        "{said}"
    );
    assert!(said.contains("--force"), "{said}");
    let listed = runs_json(&runs).await;
    assert_eq!(listed[0]["baseline"], false, "{listed:?}");
    let o = pin(&["--force"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[tokio::test]
async fn checks_a_faulted_trajectory_never_reached_are_the_same_checks_not_added_and_removed() {
    let agent = support::MisbehavingServer::respond(200, support::OK_BODY).await;
    let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down_url = format!("http://{}/", down.local_addr().unwrap());
    drop(down);
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    for (name, url) in [("up", agent.url()), ("down", down_url)] {
        // One suite name (the file's) for both: only the agent's address differs.
        std::fs::create_dir_all(dir.path().join(name)).unwrap();
        let suite = dir.path().join(name).join("s.kdl");
        std::fs::write(
            &suite,
            format!(
                "agent \"bot\" protocol=\"connexity\" url=\"{url}\"\n\
                 scenario \"s\" {{\n    user \"one\"\n    expect no-error\n    user \"two\"\n    \
                 expect reply contains=\"Hello\"\n    user \"three\"\n    \
                 expect reply contains=\"there\"\n}}\n"
            ),
        )
        .unwrap();
        let o = trellis()
            .args(["run", "-q", "--out"])
            .arg(runs.join(name))
            .arg(&suite)
            .output()
            .await
            .unwrap();
        assert!(o.status.code().is_some(), "{}", stderr(&o));
    }
    let o = trellis()
        .args(["compare", "up", "down", "--json", "--dir"])
        .arg(&runs)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let c: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let checks = c["criteria"].as_array().unwrap();
    // Three checks on their three turns, whichever run reached them.
    assert_eq!(checks.len(), 3, "{checks:#?}");
    for check in checks {
        assert!(check["turn_index"].is_u64(), "{check}");
        let verdict = check["rate"]["verdict"].as_str().unwrap();
        assert!(!["added", "removed"].contains(&verdict), "{check}");
    }
    let o = trellis()
        .args(["compare", "up", "down", "--dir"])
        .arg(&runs)
        .output()
        .await
        .unwrap();
    assert!(!stdout(&o).contains("only in the"), "{}", stdout(&o));
}

/// What the head run no longer has is said once, by kind: a removed scenario and branch in
/// their tables, and in the note with the check taken out of a branch both runs have; that
/// check alone is counted under the tables (the checks of the removed branch and scenario
/// were counted a second time, and the note read "3 the base run checked are not…").
#[tokio::test]
async fn what_the_head_run_no_longer_has_is_counted_once_by_kind() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let base = "agent \"shop\" protocol=\"connexity\" builtin=\"booking\"\n\
                scenario \"one\" {\n    user \"hello\"\n    expect no-error\n    \
                expect reply contains=\"a\"\n    branch \"x\" {\n        user \"price?\"\n        \
                expect no-error\n    }\n    branch \"y\" {\n        user \"book\"\n        \
                expect no-error\n    }\n}\n\
                scenario \"two\" {\n    user \"hi\"\n    expect no-error\n}\n";
    let head = "agent \"shop\" protocol=\"connexity\" builtin=\"booking\"\n\
                scenario \"one\" {\n    user \"hello\"\n    expect no-error\n    \
                branch \"x\" {\n        user \"price?\"\n        expect no-error\n    }\n}\n";
    for (name, text) in [("base", base), ("head", head)] {
        std::fs::create_dir_all(dir.path().join(name)).unwrap();
        let suite = dir.path().join(name).join("s.kdl");
        std::fs::write(&suite, text).unwrap();
        let o = trellis()
            .args(["run", "-q", "--out"])
            .arg(runs.join(name))
            .arg(&suite)
            .output()
            .await
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let o = trellis()
        .args(["compare", "base", "head", "--dir"])
        .arg(&runs)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = flat(&stdout(&o));
    assert!(
        text.contains(
            "1 check is only in the base run, in scenarios and branches of both (listed with \
             --json)"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "note: 1 scenario, 1 branch and 1 check that the base run checked are not in the \
             head run (verdict `removed`: scenario s/two [shop], branch s/one y [shop], check \
             s/one x [shop] (turn 0) `reply contains=\"a\"`)"
        ),
        "{text}"
    );
}

/// The gate never passes on nothing: a head run whose agent was down for every trajectory
/// (two repetitions each, too few for the pass rate's test to call 2/2 → 0/2 anything but
/// noise), a base run that checked nothing, and a scenario new in the head run that fails.
#[tokio::test]
async fn the_gate_fails_a_run_that_checked_nothing_and_a_new_failure() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    // A port nothing listens on: every call is refused.
    let (_held, closed) = refused_port();
    let scenario = "scenario \"hello\" {\n    agent \"a\"\n    repeat 2\n    \
                    user \"Hi, I'd like to book a duct cleaning.\"\n    \
                    expect reply contains=\"postal code\"\n}\n";
    let up = format!("agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n{scenario}");
    let down = format!(
        "agent \"a\" protocol=\"connexity\" url=\"http://127.0.0.1:{closed}/agent/respond\" \
         {{ retries 0 }}\n{scenario}"
    );
    let new_failing = format!(
        "{up}scenario \"new-one\" {{\n    agent \"a\"\n    user \"Hi\"\n    \
         expect reply contains=\"no agent says this\"\n}}\n"
    );
    let run = |name: &'static str, suite: String, baseline: Option<&'static str>| {
        let (dir, runs) = (dir.path().to_owned(), runs.clone());
        async move {
            // One suite (its name is its file's), as it changes from run to run: under
            // another name every scenario is another, and nothing would be compared.
            let file = dir.join(name).join("gate.kdl");
            std::fs::create_dir_all(dir.join(name)).unwrap();
            std::fs::write(&file, suite).unwrap();
            let mut cmd = trellis();
            cmd.arg("run")
                .arg(&file)
                .args(["-q", "--out"])
                .arg(runs.join(name));
            if let Some(base) = baseline {
                cmd.args(["--baseline", base, "--max-latency-increase", "100000"]);
            }
            cmd.output().await.unwrap()
        }
    };
    let o = run("base", up.clone(), None).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));

    let o = run("down", down, Some("base")).await;
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o)
            .contains("the head run checked nothing: all 2 of its trajectories ended in an error"),
        "{}",
        stdout(&o)
    );

    // Held against the run that checked nothing, a healthy run is not passed either.
    let o = trellis()
        .args(["compare", "--dir"])
        .arg(&runs)
        .args(["down", "base", "--max-latency-increase", "100000"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("the base run checked nothing"),
        "{}",
        stdout(&o)
    );

    let o = run("added", new_failing, Some("base")).await;
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("new-one [a]: new in the head run, and failing: 0/1 passed"),
        "{}",
        stdout(&o)
    );

    // The same suite again passes the gate: the rules add nothing to an unchanged run.
    let o = run("again", up, Some("base")).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

/// A run whose journal cannot be read (and no summary.json to read instead) is refused by
/// `compare`, as by `report`, instead of compared as a run of "0 of 0 planned trajectories".
#[tokio::test]
async fn compare_refuses_a_run_whose_journal_cannot_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let o = trellis()
        .args([
            "run",
            "suites/booking.kdl",
            "--filter",
            "price-first",
            "-q",
            "--out",
        ])
        .arg(runs.join("base"))
        .output()
        .await
        .unwrap();
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", stderr(&o));
    let damaged = runs.join("damaged");
    std::fs::create_dir_all(&damaged).unwrap();
    std::fs::copy(runs.join("base/run.json"), damaged.join("run.json")).unwrap();
    std::fs::write(damaged.join("journal.jsonl.zst"), b"not a journal at all").unwrap();
    let o = trellis()
        .arg("compare")
        .arg(runs.join("base"))
        .arg(&damaged)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("no `run_started` entry"),
        "{}",
        stderr(&o)
    );
}

/// A run compared with itself (by two of its names) is refused: it always "passed".
#[tokio::test]
async fn a_run_compared_with_itself_is_refused() {
    let runs = tempfile::tempdir().unwrap();
    write_run(
        runs.path(),
        "only",
        "2026-01-01T00:00:00Z",
        &[sample("main", 0, true, 10.0)],
    );
    let o = compare(runs.path(), &["only", "20260101T000000Z-only"]).await;
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("would be compared with itself"),
        "{}",
        stderr(&o)
    );
}

/// `--replace` of a named run's directory says that the name goes with it: a later
/// `--baseline NAME` found nothing, and nothing had said why.
#[tokio::test]
async fn replacing_a_named_run_says_its_name_goes() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let run = |extra: &'static [&'static str]| {
        let out = runs.join("nightly");
        async move {
            trellis()
                .args([
                    "run",
                    "suites/booking.kdl",
                    "--filter",
                    "price-first",
                    "-q",
                    "--out",
                ])
                .arg(out)
                .args(extra)
                .output()
                .await
                .unwrap()
        }
    };
    let o = run(&[]).await;
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", stderr(&o));
    let o = trellis()
        .args(["runs", "name", "nightly", "release-1.0", "--dir"])
        .arg(&runs)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(&["--replace"]).await;
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("named `release-1.0`; the name goes with it"),
        "{}",
        stderr(&o)
    );
}

/// An empty run name (an unset CI variable, `--baseline "$BASELINE"`) names no run: it was
/// the start of every run id, so with one run it pinned, named or gated against that run.
#[tokio::test]
async fn an_empty_run_name_is_refused_everywhere_a_run_is_named() {
    let work = tempfile::tempdir().unwrap();
    let runs = work.path().join("runs");
    let o = trellis()
        .args(["run", "suites/booking.kdl", "-q", "--out"])
        .arg(runs.join("a"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    for args in [
        vec!["runs", "pin", ""],
        vec!["runs", "name", "", "nightly"],
        vec!["compare", "", "a"],
    ] {
        let o = trellis()
            .current_dir(work.path())
            .args(&args)
            .output()
            .await
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("an empty run name names no run"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    let o = trellis()
        .current_dir(work.path())
        .arg("run")
        .arg(repo("suites/booking.kdl"))
        .args(["-q", "--baseline", "", "--out", "runs/b"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!runs.join("b").exists(), "nothing ran");
}

/// `trellis report` of a mistyped directory fails without making it, or its `--out`.
#[tokio::test]
async fn report_of_a_mistyped_directory_creates_nothing() {
    let work = tempfile::tempdir().unwrap();
    let typo = work.path().join("typo").join("run-dir");
    let o = trellis().arg("report").arg(&typo).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!work.path().join("typo").exists());
    let out = work.path().join("outdir");
    let o = trellis()
        .arg("report")
        .arg(work.path().join("typo2"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!out.exists() && !work.path().join("typo2").exists());
}

/// A damaged `run.json` hides only its own run: `trellis runs` lists the others with a
/// warning, and a run named by its whole id is compared beside it; the pinned baseline,
/// which the damaged run may be, is refused with what to do.
#[tokio::test]
async fn a_damaged_run_json_hides_only_its_own_run() {
    let work = tempfile::tempdir().unwrap();
    let runs = work.path().join("runs");
    for name in ["a", "b", "c"] {
        let o = trellis()
            .arg("run")
            .arg(repo("suites/booking.kdl"))
            .args(["-q", "--out"])
            .arg(runs.join(name))
            .output()
            .await
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    }
    let in_work = |args: &[&str]| {
        let mut command = trellis();
        command.current_dir(work.path()).args(args);
        command.output()
    };
    let o = in_work(&["runs", "pin", "runs/a"]).await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(runs.join("a/run.json")).unwrap()).unwrap();
    let id_a = meta["run_id"].as_str().unwrap().to_owned();
    std::fs::write(runs.join("c/run.json"), "{bad").unwrap();

    let o = in_work(&["runs"]).await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("runs/c is not listed"),
        "{}",
        stderr(&o)
    );
    assert!(
        stdout(&o).contains(&id_a) && stdout(&o).contains("2 runs"),
        "{}",
        stdout(&o)
    );
    let o = in_work(&["compare", &id_a, "runs/b"]).await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = in_work(&["compare", "pinned", "runs/b"]).await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        crate::flat(&stderr(&o)).contains("name a run by its directory, its whole id or its name"),
        "{}",
        stderr(&o)
    );
}

/// A path to a directory that holds no run is said to be one, not "no run `/x` in runs".
#[tokio::test]
async fn a_directory_that_is_not_a_run_is_said_to_be_one() {
    let work = tempfile::tempdir().unwrap();
    let plain = work.path().join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let o = trellis()
        .current_dir(work.path())
        .args(["compare", "./plain", "./plain"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        crate::flat(&stderr(&o)).contains("is a directory, but not a run's"),
        "{}",
        stderr(&o)
    );
}

/// A scenario worse than the baseline by too little to tell from chance passes the gate;
/// in a GitHub workflow a warning on the pull request says so (only the job summary did).
#[tokio::test]
async fn a_drop_within_chance_is_a_github_warning_not_a_silent_pass() {
    use super::support::{Behavior, MisbehavingServer, OK_BODY};
    let sorry = r#"{"messages":[{"role":"assistant","content":"Sorry, I cannot."}]}"#.to_owned();
    let ok = (200, OK_BODY.to_owned());
    // The base's three answers, then the head's: one of them wrong.
    let server = MisbehavingServer::start(Behavior::Sequence(vec![
        ok.clone(),
        ok.clone(),
        ok.clone(),
        ok.clone(),
        (200, sorry),
        ok,
    ]))
    .await;
    let work = tempfile::tempdir().unwrap();
    std::fs::write(
        work.path().join("s.kdl"),
        format!(
            "agent \"a\" protocol=\"connexity\" url=\"{}\"\n\
             scenario \"greets\" {{\n    repeat 3\n    user \"hi\"\n    \
             expect reply contains=\"Hello\"\n}}\n",
            server.url()
        ),
    )
    .unwrap();
    let run = |name: &str, extra: &[&str]| {
        let mut command = trellis();
        command
            .current_dir(work.path())
            .args(["run", "s.kdl", "--jobs", "1", "--out"])
            .arg(work.path().join("runs").join(name))
            .args(extra)
            .env("GITHUB_ACTIONS", "true");
        command.output()
    };
    let o = run("base", &[]).await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run("head", &["--baseline", "base"]).await.unwrap();
    // 3/3 → 2/3 is within chance (p 0.5): the gate passes.
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let text = stdout(&o);
    assert!(!text.contains("::error"), "{text}");
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("::warning"))
        .collect();
    assert_eq!(warnings.len(), 1, "{text}");
    assert!(
        warnings[0].contains("title=s/greets [a] worse (within chance)::worse than the baseline"),
        "{}",
        warnings[0]
    );
    assert!(warnings[0].contains("3/3 → 2/3"), "{}", warnings[0]);
}
