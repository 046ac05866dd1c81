//! `trellis variance` and `run --replay-users` end to end: an agent (an `openai` model on
//! the fake LLM endpoint), a simulated user and a judge, each made noisy in turn, while the
//! other two stay deterministic; the decomposition names the noisy one.

use serde_json::Value;

use super::support::llm::{FakeLlm, Reply, Rule};
use super::*;

/// Alternating answers, long enough that the last (repeating) one is never reached.
fn alternating(a: &str, b: &str) -> Vec<Reply> {
    (0..200)
        .map(|i| Reply::text(if i % 2 == 0 { a } else { b }))
        .collect()
}

fn rule_for(model: &str, contains: Option<&str>, replies: Vec<Reply>) -> Rule {
    Rule {
        contains: contains.map(str::to_owned),
        model: Some(model.to_owned()),
        system: None,
        replies,
        by_turn: false,
    }
}

fn suite(dir: &Path, url: &str) -> PathBuf {
    let path = dir.join("variance.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "bot" protocol="openai" base-url="{url}" model="agent-m" system-prompt="You book cleanings."
provider "fake" kind="openai" base-url="{url}" model="judge-m" api-key-env="FAKE_KEY"
simulator provider="fake" model="sim-m" fidelity=#false
judge "main" provider="fake"

scenario "book" {{
    description "A customer books a cleaning"
    simulate turns=1
    outcome "the agent booked a slot"
}}
"#
        ),
    )
    .unwrap();
    path
}

async fn run_once(dir: &Path, suite: &Path) -> PathBuf {
    let out = dir.join("runs").join("first");
    let o = trellis()
        .env("FAKE_KEY", "k")
        .args(["run", "-q", "--out"])
        .arg(&out)
        .arg(suite)
        .output()
        .await
        .unwrap();
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "{}{}",
        stdout(&o),
        stderr(&o)
    );
    out
}

/// `trellis variance RUN [SUITE]`: without SUITE, the suites RUN recorded.
async fn variance(dir: &Path, run: &Path, suite: Option<&Path>) -> (Value, String) {
    variance_exiting(dir, run, suite, 0).await
}

/// [`variance`], which must exit `code`.
async fn variance_exiting(
    dir: &Path,
    run: &Path,
    suite: Option<&Path>,
    code: i32,
) -> (Value, String) {
    let o = trellis()
        .env("FAKE_KEY", "k")
        .args(["variance", "--repeats", "4", "--json", "--dir"])
        .arg(dir.join("runs"))
        .arg(run)
        .args(suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(code), "{}{}", stdout(&o), stderr(&o));
    let text = std::fs::read_to_string(run.join("variance.json")).unwrap();
    (serde_json::from_str(&text).unwrap(), stderr(&o))
}

fn judge_says(passed: bool) -> String {
    format!(r#"{{"passed": {passed}, "justification": "read it"}}"#)
}

/// `trellis show` tells a simulated user's turn from a scripted one.
#[tokio::test]
async fn show_labels_the_simulated_users_turns() {
    let fake = FakeLlm::start(vec![
        rule_for("judge-m", None, vec![Reply::text(judge_says(true))]),
        rule_for(
            "sim-m",
            None,
            vec![Reply::text("Book me a cleaning please.")],
        ),
        rule_for("agent-m", None, vec![Reply::text("Booked: slot XYZZY.")]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = suite(dir.path(), &fake.base_url());
    let run = run_once(dir.path(), &suite).await;
    let o = trellis()
        .args(["show", "--all"])
        .arg(&run)
        .output()
        .await
        .unwrap();
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(out.contains("  turn 0 (simulated user, "), "{out}");
    assert!(
        out.contains("    user: Book me a cleaning please."),
        "{out}"
    );
}

#[tokio::test]
async fn a_noisy_agent_is_the_source() {
    let fake = FakeLlm::start(vec![
        // The judge passes exactly the confirmed bookings.
        rule_for(
            "judge-m",
            Some("XYZZY"),
            vec![Reply::text(judge_says(true))],
        ),
        rule_for("judge-m", None, vec![Reply::text(judge_says(false))]),
        rule_for(
            "sim-m",
            None,
            vec![Reply::text("Book me a cleaning please.")],
        ),
        rule_for(
            "agent-m",
            None,
            alternating("Booked: slot XYZZY.", "Sorry, we are closed."),
        ),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = suite(dir.path(), &fake.base_url());
    let run = run_once(dir.path(), &suite).await;
    // No suite paths: the run's own, from its run.json.
    let (v, plan) = variance(dir.path(), &run, None).await;
    assert!(plan.is_empty() || !plan.contains("panicked"), "{plan}");
    let overall = &v["overall"];
    assert_eq!(overall["source"], "agent", "{v:#}");
    assert_eq!(overall["judge"].as_f64(), Some(0.0), "{v:#}");
    assert_eq!(overall["user"].as_f64(), Some(0.0), "{v:#}");
    assert!(overall["agent"].as_f64().unwrap() > 0.2, "{v:#}");
    // Each estimate has its interval, around it; a judge that never varied has [0, 0].
    let agent = overall["agent"].as_f64().unwrap();
    let (low, high) = (
        overall["agent_interval"]["low"].as_f64().unwrap(),
        overall["agent_interval"]["high"].as_f64().unwrap(),
    );
    assert!(
        low <= agent + 1e-9 && agent <= high + 1e-9 && low < high,
        "{v:#}"
    );
    assert_eq!(
        overall["judge_interval"]["high"].as_f64(),
        Some(0.0),
        "{v:#}"
    );
    assert!(v["intervals"]["seed"].as_u64().is_some(), "{v:#}");
    // The replayed run marks its simulated turns as recorded (the agent's first answer
    // cannot diverge before the user's first message).
    let turns = read_parquet(&run.join("variance/agent/turns.parquet"));
    let sources = strings(&turns, "user_source");
    assert!(!sources.is_empty());
    assert!(
        sources.iter().all(|s| s.as_deref() == Some("recorded")),
        "{sources:?}"
    );
    // The conditions' runs say what they are: a glob over every run's tables that keeps the
    // runs (`kind` `run` or `merged`, docs/results.md) leaves them out.
    for condition in ["agent", "free"] {
        let runs = read_parquet(&run.join(format!("variance/{condition}/runs.parquet")));
        assert_eq!(strings(&runs, "kind"), [Some("variance".to_owned())]);
    }
    // The HTML report shows the section.
    let html = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(html.contains("Variance by source"), "no variance section");
    assert!(
        html.contains(&format!("[{low:.3}, {high:.3}]")),
        "the report does not show the agent's interval"
    );
}

#[tokio::test]
async fn a_noisy_simulated_user_is_the_source() {
    let fake = FakeLlm::start(vec![
        rule_for(
            "judge-m",
            Some("XYZZY"),
            vec![Reply::text(judge_says(true))],
        ),
        rule_for("judge-m", None, vec![Reply::text(judge_says(false))]),
        rule_for(
            "sim-m",
            None,
            alternating("Book me a cleaning please.", "Cancel my cleaning."),
        ),
        // A deterministic agent: its answer follows the user's request.
        rule_for(
            "agent-m",
            Some("Book me"),
            vec![Reply::text("Booked: slot XYZZY.")],
        ),
        rule_for("agent-m", None, vec![Reply::text("It is cancelled.")]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = suite(dir.path(), &fake.base_url());
    let run = run_once(dir.path(), &suite).await;
    let (v, _) = variance(dir.path(), &run, Some(&suite)).await;
    let overall = &v["overall"];
    assert_eq!(overall["source"], "user", "{v:#}");
    assert_eq!(overall["agent"].as_f64(), Some(0.0), "{v:#}");
    assert_eq!(overall["judge"].as_f64(), Some(0.0), "{v:#}");
    assert!(overall["user"].as_f64().unwrap() > 0.2, "{v:#}");
}

#[tokio::test]
async fn a_flipping_judge_is_the_source() {
    let fake = FakeLlm::start(vec![
        rule_for(
            "judge-m",
            None,
            alternating(&judge_says(true), &judge_says(false)),
        ),
        rule_for(
            "sim-m",
            None,
            vec![Reply::text("Book me a cleaning please.")],
        ),
        rule_for("agent-m", None, vec![Reply::text("Booked: slot XYZZY.")]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = suite(dir.path(), &fake.base_url());
    let run = run_once(dir.path(), &suite).await;
    let (v, _) = variance(dir.path(), &run, Some(&suite)).await;
    let overall = &v["overall"];
    assert_eq!(overall["source"], "judge", "{v:#}");
    assert!(overall["judge"].as_f64().unwrap() > 0.2, "{v:#}");
    assert_eq!(overall["agent"].as_f64(), Some(0.0), "{v:#}");
    assert_eq!(overall["user"].as_f64(), Some(0.0), "{v:#}");
}

/// A judge that fails every call gives outcomes that never vary: its share read 0.000, as
/// stable as a judge can be, with nothing to say every judgment was an error. It says so.
#[tokio::test]
async fn a_judge_that_always_fails_is_not_shown_as_stable_without_a_word() {
    // The run's judge answers; every later call fails (the last reply repeats).
    let fake = FakeLlm::start(vec![
        rule_for(
            "judge-m",
            None,
            vec![
                Reply::text(judge_says(true)),
                Reply::Status(500, "overloaded".into()),
            ],
        ),
        rule_for(
            "sim-m",
            None,
            vec![Reply::text("Book me a cleaning please.")],
        ),
        rule_for("agent-m", None, vec![Reply::text("Booked: slot XYZZY.")]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = suite(dir.path(), &fake.base_url());
    let run = run_once(dir.path(), &suite).await;
    // Nothing was measured: exit 1, and variance.json says why beside its figures.
    let (v, err) = variance_exiting(dir.path(), &run, Some(&suite), 1).await;
    assert!(
        err.contains("every judgment of the judge condition ended in an error"),
        "{err}"
    );
    let warnings = v["warnings"].as_array().map(Vec::len).unwrap_or(0);
    assert_eq!(warnings, 3, "{v:#}");
    // Its checks could not be judged in the agent's and the fresh runs either: their
    // shares say nothing, and that is said too, blaming the judge, not the agent.
    let err = crate::flat(&err);
    for condition in ["agent", "free"] {
        assert!(
            err.contains(&format!(
                "warning: every trajectory of the {condition} condition ended in an error, \
                 in their checks: is a judge failing?"
            )),
            "{err}"
        );
    }
    assert!(!err.contains("is the agent down"), "{err}");
}

#[tokio::test]
async fn a_run_that_does_not_exist_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let suite = suite(dir.path(), "http://127.0.0.1:9/v1");
    let o = trellis()
        .args(["variance", "--dir"])
        .arg(dir.path().join("runs"))
        .arg("no-such-run")
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("no-such-run"), "{}", stderr(&o));
}

/// `trellis variance RUN` plans from the suite files RUN recorded; a file edited or removed
/// since is refused by name (with the way out), an old run.json without them asks for the
/// paths, and given paths override the record.
#[tokio::test]
async fn the_recorded_suites_must_be_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let suites = dir.path().join("suites");
    std::fs::create_dir_all(suites.join("shared")).unwrap();
    std::fs::write(
        suites.join("shared/agents.kdl"),
        "agent \"demo\" protocol=\"connexity\" builtin=\"booking\"\n",
    )
    .unwrap();
    let suite = suites.join("main.kdl");
    std::fs::write(
        &suite,
        r#"
include "shared/agents.kdl"
scenario "hello" {
    agent "demo"
    user "Hi, I'd like to book a duct cleaning."
    expect reply contains="postal code"
    outcome "the agent asks where the customer lives"
}
dataset "people" path="data/people.csv"
scenario "greet" for-each="people" {
    agent "demo"
    row-id "p{{ row.id }}"
    user "Hi, I am {{ row.name }} and I'd like to book a duct cleaning."
    expect reply contains="postal code"
}
"#,
    )
    .unwrap();
    std::fs::create_dir_all(suites.join("data")).unwrap();
    std::fs::write(suites.join("data/people.csv"), "id,name\n1,Ann\n").unwrap();
    let run = dir.path().join("runs").join("first");
    let o = trellis()
        .current_dir(dir.path())
        .args(["run", "-q", "--out", "runs/first", "suites"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    let files: Vec<&str> = meta["source"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(files.len(), 2, "{meta:#}");
    assert!(
        files.iter().all(|f| Path::new(f).is_absolute()),
        "{files:?}"
    );

    let variance = |paths: Vec<PathBuf>| {
        let mut cmd = trellis();
        cmd.args(["variance", "--repeats", "2", "--dir"])
            .arg(dir.path().join("runs"))
            .arg("first")
            .args(paths);
        async move { cmd.output().await.unwrap() }
    };
    let o = variance(vec![]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(run.join("variance.json").is_file());
    // The outcome check was skipped (no judge configured): there is nothing to re-judge.
    assert!(
        stderr(&o).contains("judge: the run judged no check"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("judge condition"), "{}", stderr(&o));

    // A dataset row edited (not a suite file): refused, naming the trajectory.
    std::fs::write(suites.join("data/people.csv"), "id,name\n1,Bob\n").unwrap();
    let o = variance(vec![]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("now plan main/greet[p1] `main` differently"),
        "{}",
        stderr(&o)
    );
    std::fs::write(suites.join("data/people.csv"), "id,name\n1,Ann\n").unwrap();

    // An edit: refused, naming the file.
    let original = std::fs::read_to_string(&suite).unwrap();
    std::fs::write(&suite, original.replace("Hi, I'd", "Hello, I'd")).unwrap();
    let o = variance(vec![]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("main.kdl has changed since"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("PATHS"), "{}", stderr(&o));
    // Given paths override the record (the edited scenario is still `hello`), with a
    // warning that it no longer means what the run ran.
    let o = variance(vec![suites.clone()]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("warning: the suites given plan main/hello `main` differently"),
        "{}",
        stderr(&o)
    );
    std::fs::write(&suite, &original).unwrap();

    // A file gone: refused, naming it.
    std::fs::remove_file(suites.join("shared/agents.kdl")).unwrap();
    let o = variance(vec![]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("agents.kdl is gone"), "{}", stderr(&o));

    // A run.json from before the source was recorded: the paths are asked for.
    let mut old = meta.clone();
    old.as_object_mut().unwrap().remove("source");
    std::fs::write(run.join("run.json"), old.to_string()).unwrap();
    let o = variance(vec![]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("does not record which suites"),
        "{}",
        stderr(&o)
    );
}

/// Requests the fake LLM saw for `model`.
fn asked(fake: &FakeLlm, model: &str) -> usize {
    fake.seen()
        .iter()
        .filter(|r| r.body["model"] == model)
        .count()
}

/// SIGTERM while the users-replayed condition runs: its calls in flight are cut off as
/// `run`'s are, the free condition never starts, and what finished (the judge condition,
/// two repetitions) is decomposed, written and marked partial, with `run`'s exit code.
#[tokio::test]
async fn a_stop_signal_decomposes_what_finished() {
    // The agent answers the recorded run and two repetitions in time, then never does.
    let mut agent = vec![Reply::text("Booked: slot XYZZY."); 3];
    agent.push(Reply::slow(
        std::time::Duration::from_secs(120),
        Reply::text("Booked, too late."),
    ));
    let fake = FakeLlm::start(vec![
        rule_for("judge-m", None, vec![Reply::text(judge_says(true))]),
        rule_for(
            "sim-m",
            None,
            vec![Reply::text("Book me a cleaning please.")],
        ),
        rule_for("agent-m", None, agent),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = suite(dir.path(), &fake.base_url());
    let run = run_once(dir.path(), &suite).await;
    let child = trellis()
        .env("FAKE_KEY", "k")
        .args(["variance", "--repeats", "4", "--dir"])
        .arg(dir.path().join("runs"))
        .arg(&run)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The run's call, then four repetitions' (two answered, two hanging); the run's
    // judgment, four re-judgments and the two answered repetitions' judgments.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while asked(&fake, "agent-m") < 5 || asked(&fake, "judge-m") < 7 {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent condition never got going: {} agent, {} judge calls",
            asked(&fake, "agent-m"),
            asked(&fake, "judge-m")
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The fake counts a judge call when it arrives: give the last answer time to be read
    // (the hanging repetitions wait far longer than this).
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on a child process id this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let o = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("variance did not stop")
        .unwrap();
    assert_eq!(o.status.code(), Some(143), "{}{}", stdout(&o), stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("terminated (SIGTERM): stopping"),
        "no word of the stop: {err}"
    );
    assert!(
        err.contains(
            "agent condition stopped: 2 of 4 trajectory runs recorded (2 passed, 0 failed \
             or error, 0 invalid, 0 skipped)"
        ),
        "{err}"
    );
    assert!(
        !err.contains("free condition"),
        "the free condition ran: {err}"
    );
    assert!(err.contains("partial: terminated (SIGTERM)"), "{err}");
    assert!(stdout(&o).contains("overall"), "no table: {}", stdout(&o));
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("variance.json")).unwrap()).unwrap();
    assert_eq!(v["complete"], false, "{v:#}");
    assert!(
        v["stopped"]
            .as_str()
            .is_some_and(|s| s.contains("(SIGTERM) during the agent condition")),
        "{v:#}"
    );
    let overall = &v["overall"];
    assert_eq!(overall["judge_condition"]["outcomes"], 4, "{v:#}");
    assert_eq!(overall["agent_condition"]["outcomes"], 2, "{v:#}");
    assert_eq!(overall["free_condition"]["outcomes"], 0, "{v:#}");
    assert!(v["runs"].get("free").is_none(), "{v:#}");
    // No lock is left behind: the same command runs again to its end.
    let fast = FakeLlm::start(vec![
        rule_for("judge-m", None, vec![Reply::text(judge_says(true))]),
        rule_for(
            "sim-m",
            None,
            vec![Reply::text("Book me a cleaning please.")],
        ),
        rule_for("agent-m", None, vec![Reply::text("Booked: slot XYZZY.")]),
    ])
    .await;
    let edited = std::fs::read_to_string(&suite)
        .unwrap()
        .replace(&fake.base_url(), &fast.base_url());
    std::fs::write(&suite, edited).unwrap();
    let o = trellis()
        .env("FAKE_KEY", "k")
        .args(["variance", "--repeats", "2", "-q", "--dir"])
        .arg(dir.path().join("runs"))
        .arg(&run)
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    // --quiet: no plan and no progress (the agent's new address is a warning still).
    let err = stderr(&o);
    assert!(
        !err.contains("variance of run") && !err.contains("variance:"),
        "--quiet said: {err}"
    );
    assert!(err.contains("differently from run"), "{err}");
}

/// `--max-llm-calls` bounds the three conditions together: reached in the users-replayed
/// condition, it stops there (exit 4, as `run`), and what finished is decomposed.
#[tokio::test]
async fn the_llm_call_budget_stops_variance_with_a_partial_result() {
    let fake = FakeLlm::start(vec![
        rule_for("judge-m", None, vec![Reply::text(judge_says(true))]),
        rule_for(
            "sim-m",
            None,
            vec![Reply::text("Book me a cleaning please.")],
        ),
        rule_for("agent-m", None, vec![Reply::text("Booked: slot XYZZY.")]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = suite(dir.path(), &fake.base_url());
    let run = run_once(dir.path(), &suite).await;
    let before = fake.calls();
    // Four re-judgments, then two calls of the users-replayed condition's budget.
    let o = trellis()
        .env("FAKE_KEY", "k")
        .args([
            "variance",
            "--repeats",
            "4",
            "--max-llm-calls",
            "6",
            "--dir",
        ])
        .arg(dir.path().join("runs"))
        .arg(&run)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("partial: the LLM budget"),
        "{}",
        stderr(&o)
    );
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("variance.json")).unwrap()).unwrap();
    assert_eq!(v["complete"], false, "{v:#}");
    assert!(
        v["stopped"]
            .as_str()
            .is_some_and(|s| s.contains("budget") && s.contains("agent condition")),
        "{v:#}"
    );
    assert_eq!(v["overall"]["judge_condition"]["outcomes"], 4, "{v:#}");
    assert_eq!(v["overall"]["free_condition"]["outcomes"], 0, "{v:#}");
    // The budget, plus at most the calls already in flight (--jobs) when it was reached.
    let spent = fake.calls() - before;
    assert!((6..=6 + 8).contains(&spent), "{spent} calls");

    // Once a complete measurement is there, a stopped one does not replace it: it is
    // written beside it, and said.
    let (complete, _) = variance(dir.path(), &run, None).await;
    assert_eq!(complete["complete"], true, "{complete:#}");
    let o = trellis()
        .env("FAKE_KEY", "k")
        .args([
            "variance",
            "--repeats",
            "4",
            "--max-llm-calls",
            "6",
            "--dir",
        ])
        .arg(dir.path().join("runs"))
        .arg(&run)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{}{}", stdout(&o), stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("the complete variance.json of an earlier `trellis variance` is kept"),
        "{err}"
    );
    let kept: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("variance.json")).unwrap()).unwrap();
    assert_eq!(kept, complete);
    let partial: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("variance.partial.json")).unwrap())
            .unwrap();
    assert_eq!(partial["complete"], false, "{partial:#}");
}
