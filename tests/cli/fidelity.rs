//! Simulator fidelity end to end: a scripted simulated user on the fake LLM endpoint breaks
//! character in known ways (empty answers, the agent's voice, a repeat, a loop, a break
//! only the judge sees) against the builtin booking agent; every such trajectory is
//! `invalid` with the right reason, never `failed`, in the console, JUnit, the tables and
//! the pass rate; `retries-invalid` draws again (past the response cache).

use serde_json::Value;

use super::support::llm::{FakeLlm, Reply, Rule};
use super::*;

/// One scenario per way to break character, each recognised by its description in the
/// simulator's system prompt (and in the fidelity judge's question).
fn suite(dir: &Path, base_url: &str) -> PathBuf {
    let path = dir.join("fidelity.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "booking" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{base_url}" model="sim-m" api-key-env="FAKE_KEY"
simulator provider="fake"

scenario "empty" {{
    description "SCENARIO-EMPTY: book a cleaning"
    max-turns 6
    simulate until-done
    expect no-error
}}
scenario "voice" {{
    description "SCENARIO-VOICE: book a cleaning"
    max-turns 6
    simulate until-done
    expect no-error
}}
scenario "repeat" {{
    description "SCENARIO-REPEAT: book a cleaning"
    max-turns 6
    simulate until-done
    expect no-error
}}
scenario "loop" {{
    description "SCENARIO-LOOP: book a cleaning"
    max-turns 12
    simulate until-done
    expect no-error
}}
scenario "judged" {{
    description "SCENARIO-JUDGED: book a cleaning"
    max-turns 6
    simulate until-done
    expect no-error
    expect reply contains="NEVER-SAID"
}}
scenario "fine" {{
    description "SCENARIO-FINE: book a cleaning"
    max-turns 6
    simulate until-done
    expect no-error
}}
scenario "retried" {{
    description "SCENARIO-RETRIED: book a cleaning"
    simulator retries-invalid=2
    max-turns 6
    simulate until-done
    expect no-error
}}
"#
        ),
    )
    .unwrap();
    path
}

fn script() -> Vec<Rule> {
    let verdict = |broke: bool, reason: &str| {
        Reply::text(format!(
            r#"{{"broke_character": {broke}, "reason": "{reason}"}}"#
        ))
    };
    vec![
        // The fidelity judge: its question holds the scenario's description.
        Rule::when(
            "SCENARIO-JUDGED",
            [verdict(
                true,
                "invented a second address the user never had",
            )],
        ),
        Rule::when(
            "Did it break character",
            [verdict(false, "stayed the customer")],
        ),
        // A role label and nothing else, on the first try and both retries. (An answer
        // without any text is not stored in the response cache; this one is.)
        Rule::simulator("SCENARIO-EMPTY", [Reply::text("User:")]),
        Rule::simulator(
            "SCENARIO-VOICE",
            [
                Reply::text("Hi, I need a duct cleaning."),
                Reply::text(
                    "Thank you for confirming the delivery. I will proceed with the refund \
                     process.",
                ),
            ],
        ),
        Rule::simulator(
            "SCENARIO-REPEAT",
            [
                Reply::text("Hi, I need a duct cleaning."),
                Reply::text("My postal code is V4T 0A7."),
                Reply::text("My postal code is V4T 0A7."),
            ],
        ),
        // Two messages, over and over: the conversation cycles.
        Rule::simulator(
            "SCENARIO-LOOP",
            [
                Reply::text("Hello there"),
                Reply::text("What does a cleaning cost?"),
                Reply::text("Hello there"),
                Reply::text("What does a cleaning cost?"),
                Reply::text("Hello there"),
                Reply::text("What does a cleaning cost?"),
                Reply::text("Hello there"),
            ],
        ),
        Rule::simulator(
            "SCENARIO-JUDGED",
            [
                Reply::text("Hi, I need a duct cleaning."),
                Reply::text("It's V4T 0A7, thanks. [END]"),
            ],
        ),
        Rule::simulator(
            "SCENARIO-FINE",
            [
                Reply::text("Hi, I need a duct cleaning."),
                Reply::text("It's V4T 0A7, thanks. [END]"),
            ],
        ),
        // In order of arrival, not by turn: the first attempt speaks as the agent, the
        // retry (a different cache key, so a real call) is a customer.
        Rule::when(
            "",
            [
                Reply::text("How can I help you today?"),
                Reply::text("Hi, I need a duct cleaning. [END]"),
            ],
        )
        .in_system("SCENARIO-RETRIED"),
    ]
}

#[tokio::test]
async fn a_simulator_that_breaks_character_makes_invalid_trajectories_never_failed_ones() {
    let fake = FakeLlm::start(script()).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = suite(dir.path(), &fake.base_url());
    let out = dir.path().join("run");
    let cache = dir.path().join("cache");
    let o = trellis()
        .args(["run", "--replace", "--out"])
        .arg(&out)
        .arg("--llm-cache")
        .arg(&cache)
        .arg(&suite)
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    let (console, err) = (stdout(&o), stderr(&o));
    if std::env::var_os("SHOW_CONSOLE").is_some() {
        eprintln!("{console}{err}");
    }
    // Nothing failed: invalid trajectories are not the agent's failures.
    assert_eq!(o.status.code(), Some(0), "{console}{err}");

    let trajectories = read_parquet(&out.join("trajectories.parquet"));
    let names = strings(&trajectories, "scenario");
    let trajectory = strings(&trajectories, "trajectory");
    let status = strings(&trajectories, "status");
    let of = |scenario: &str, name: &str| {
        (0..names.len())
            .find(|&i| {
                names[i].as_deref() == Some(scenario) && trajectory[i].as_deref() == Some(name)
            })
            .and_then(|i| status[i].clone())
            .unwrap_or_else(|| panic!("no {scenario} {name}: {names:?} {trajectory:?}"))
    };
    for scenario in ["empty", "voice", "repeat", "loop", "judged"] {
        assert_eq!(of(scenario, "main"), "invalid", "{scenario}\n{console}");
    }
    assert_eq!(of("fine", "main"), "passed", "{console}");
    assert_eq!(of("retried", "main"), "invalid", "{console}");
    assert_eq!(of("retried", "main@retry1"), "passed", "{console}");
    assert!(!status.iter().any(|s| s.as_deref() == Some("failed")));

    // The reasons, as `criteria.kind = "fidelity"` rows.
    let criteria = read_parquet(&out.join("criteria.parquet"));
    let kinds = strings(&criteria, "kind");
    let scenarios = strings(&criteria, "scenario");
    let checks = strings(&criteria, "status");
    let details = strings(&criteria, "detail");
    let reason = |scenario: &str| -> String {
        (0..kinds.len())
            .find(|&i| {
                kinds[i].as_deref() == Some("fidelity")
                    && scenarios[i].as_deref() == Some(scenario)
                    && checks[i].as_deref() == Some("failed")
            })
            .and_then(|i| details[i].clone())
            .unwrap_or_else(|| panic!("no failed fidelity check for {scenario}"))
    };
    assert!(
        reason("empty").starts_with("empty message"),
        "{}",
        reason("empty")
    );
    assert!(
        reason("voice").starts_with("agent's voice"),
        "{}",
        reason("voice")
    );
    assert!(
        reason("repeat").starts_with("repeat"),
        "{}",
        reason("repeat")
    );
    assert!(
        reason("loop").starts_with("cycle: turns 2–3 repeat turns 0–1"),
        "{}",
        reason("loop")
    );
    assert!(
        reason("judged").contains("invented a second address"),
        "{}",
        reason("judged")
    );
    // Every other check of an invalid trajectory is skipped, whichever way it went: the
    // judged one's `no-error` (it held) and `reply contains` (it did not).
    let criterion = strings(&criteria, "criterion");
    for i in 0..kinds.len() {
        let invalid = ["empty", "voice", "repeat", "loop", "judged"]
            .contains(&scenarios[i].as_deref().unwrap_or_default());
        if invalid && kinds[i].as_deref() != Some("fidelity") {
            assert_eq!(checks[i].as_deref(), Some("skipped"), "{:?}", criterion[i]);
            assert_eq!(
                details[i].as_deref(),
                Some("not checked: the simulated user broke character")
            );
        }
    }
    assert!(
        (0..kinds.len())
            .any(|i| scenarios[i].as_deref() == Some("judged")
                && kinds[i].as_deref() == Some("reply")),
        "the judged scenario's reply check is recorded"
    );
    // The loop stopped at its second cycle, not at max-turns.
    let turns = trajectories.column("turns").unwrap().u32().unwrap();
    let looped = (0..names.len())
        .find(|&i| names[i].as_deref() == Some("loop"))
        .unwrap();
    assert_eq!(turns.get(looped), Some(4));

    // The console counts them apart and says why.
    assert!(
        console.contains("6 invalid (left out of pass rates)"),
        "{console}"
    );
    assert!(console.contains("INVALID"), "{console}");
    assert!(console.contains("invented a second address"), "{console}");

    // JUnit: skipped, with the reason.
    let junit = std::fs::read_to_string(out.join("junit.xml")).unwrap();
    assert!(
        junit.contains("<skipped message=\"invalid: cycle: turns 2–3"),
        "{junit}"
    );
    assert!(junit.contains("failures=\"0\""), "{junit}");

    // The pass rate leaves them out: 2 passed of 2 that said something about the agent.
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let aggregates = &summary["stats"]["aggregates"];
    assert_eq!(aggregates["counts"]["invalid"], 6, "{aggregates}");
    assert_eq!(aggregates["pass_rate"], 1.0, "{aggregates}");

    // The HTML report shows them.
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("invalid (simulated user broke character)"));
    // The summary tables count them in a column of their own, so a row's statuses add up
    // to its total.
    assert!(
        html.contains("<th class=\"n\" title=\"the simulated user broke character\">invalid</th>"),
        "the summary tables have no invalid column"
    );
    assert!(
        html.contains("<td class=\"n\">6</td>"),
        "no row counts the 6 invalid"
    );
    // Their checks were left out on purpose: not "checks that did not run" (the console
    // does not count them either).
    assert!(
        !html.contains("did not run, on"),
        "the banner counts invalid trajectories"
    );

    // Every answer, the retry's included, was cached under its attempt: a replay-only
    // rerun sends nothing and comes out the same.
    let calls = fake.calls();
    let again = dir.path().join("again");
    let o = trellis()
        .args([
            "run",
            "--quiet",
            "--replace",
            "--llm-cache-mode",
            "replay-only",
            "--out",
        ])
        .arg(&again)
        .arg("--llm-cache")
        .arg(&cache)
        .arg(&suite)
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), calls);
    let rerun = read_parquet(&again.join("trajectories.parquet"));
    let mut first: Vec<_> = trajectory.iter().zip(&status).collect();
    let (t2, s2) = (strings(&rerun, "trajectory"), strings(&rerun, "status"));
    let mut second: Vec<_> = t2.iter().zip(&s2).collect();
    first.sort();
    second.sort();
    assert_eq!(first, second);
}

#[tokio::test]
async fn a_simulated_user_that_ends_before_saying_anything_is_invalid() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::text("[END]")])]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("silent.kdl");
    let text = |fidelity: &str| {
        format!(
            r#"
agent "booking" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="sim-m" api-key-env="FAKE_KEY"
simulator provider="fake" {fidelity}
scenario "silent" {{
    description "Book a cleaning"
    simulate until-done
    expect-tool "create_booking"
}}
"#,
            fake.base_url()
        )
    };
    let run = |out: &str| {
        trellis()
            .args(["run", "--out"])
            .arg(dir.path().join(out))
            .arg(&path)
            .env("FAKE_KEY", "k")
            .output()
    };
    // No conversation: nothing to fail the agent on (it was a failed `create_booking`
    // check), nor to pass it on.
    std::fs::write(&path, text("")).unwrap();
    let o = run("guarded").await.unwrap();
    let console = stdout(&o);
    assert!(console.contains("1 invalid"), "{console}{}", stderr(&o));
    assert!(
        console.contains("ended the conversation before saying anything"),
        "{console}"
    );
    assert!(
        !console.contains("1 failed") && !console.contains("1 passed"),
        "{console}"
    );
    // With the guards off, the simulator failed.
    std::fs::write(&path, text("fidelity=#false")).unwrap();
    let o = run("unguarded").await.unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stdout(&o).contains("simulator fault"), "{}", stdout(&o));
}

/// A simulated user's answer cut at its token limit is no message: it is asked again, and
/// with every answer cut the simulator failed (guards off) saying why; nothing broken off
/// mid-word is sent to the agent.
#[tokio::test]
async fn a_simulated_message_cut_at_the_token_limit_is_never_sent() {
    let cut = serde_json::json!({"id": "x", "object": "chat.completion", "model": "sim-m",
        "choices": [{"index": 0, "message": {"role": "assistant",
            "content": "Hi, I would like to book a duct clea"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}});
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::Raw(cut.to_string())])]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "booking" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="sim-m" api-key-env="FAKE_KEY"
simulator provider="fake" fidelity=#false
scenario "cut" {{
    description "Book a cleaning"
    simulate until-done
    expect no-error
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .args(["run", "--out"])
        .arg(&out)
        .arg(&path)
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let console = stdout(&o);
    assert!(console.contains("simulator fault"), "{console}");
    assert!(console.contains("cut at its token limit"), "{console}");
    let journal = journal_text(&out);
    assert!(
        !journal.contains("\"user_message\":\"Hi, I would"),
        "{journal}"
    );
    assert!(fake.calls() > 1, "asked again");
}

#[tokio::test]
async fn a_fidelity_judge_answer_that_does_not_parse_is_asked_again_next_run() {
    // Prose once, then the verdict it should have given.
    let fake = FakeLlm::start(vec![
        Rule::when(
            "Did it break character",
            [
                Reply::text("Looks fine to me."),
                Reply::text(r#"{"broke_character": false, "reason": "stayed the customer"}"#),
            ],
        ),
        Rule::simulator(
            "SCENARIO-FINE",
            [
                Reply::text("Hi, I need a duct cleaning."),
                Reply::text("It's V4T 0A7, thanks. [END]"),
            ],
        ),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fine.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "booking" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="sim-m" api-key-env="FAKE_KEY"
simulator provider="fake"
scenario "fine" {{
    description "SCENARIO-FINE: book a cleaning"
    max-turns 6
    simulate until-done
    expect no-error
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let cache = dir.path().join("cache");
    let fidelity_detail = |out: &Path| -> String {
        let criteria = read_parquet(&out.join("criteria.parquet"));
        let kinds = strings(&criteria, "kind");
        let details = strings(&criteria, "detail");
        let statuses = strings(&criteria, "status");
        (0..kinds.len())
            .find(|&i| kinds[i].as_deref() == Some("fidelity"))
            .map(|i| format!("{:?} {:?}", statuses[i], details[i]))
            .unwrap_or_default()
    };
    let status = |out: &Path| {
        strings(&read_parquet(&out.join("trajectories.parquet")), "status")
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
    };
    let mut seen = Vec::new();
    // The first under --strict: the fidelity check did not run, so it fails (it passed).
    // Then a replay of the cache, which has no usable fidelity answer: an error, as the
    // replay-only mode promises for a miss (it was skipped, and the run passed). Then a
    // run that asks again.
    for (name, extra, code, want) in [
        ("first", &["--strict"][..], 1, "failed"),
        (
            "replay",
            &["--llm-cache-mode", "replay-only"][..],
            1,
            "error",
        ),
        ("second", &[][..], 0, "passed"),
    ] {
        let out = dir.path().join(name);
        let o = trellis()
            .args(["run", "--replace", "--out"])
            .arg(&out)
            .arg("--llm-cache")
            .arg(&cache)
            .args(extra)
            .arg(&path)
            .env("FAKE_KEY", "k")
            .output()
            .await
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(code),
            "{name}: {}{}",
            stdout(&o),
            stderr(&o)
        );
        assert_eq!(status(&out), [want], "{name}");
        seen.push(fidelity_detail(&out));
    }
    // Re-scoring the --strict run decides as it did: its fidelity check still did not run,
    // so the trajectory stays failed (rejudge decided without --strict, and passed it).
    let rejudged = dir.path().join("rejudged");
    let o = trellis()
        .arg("rejudge")
        .arg(dir.path().join("first"))
        .arg(&path)
        .arg("--out")
        .arg(&rejudged)
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    assert_eq!(
        status(&rejudged),
        ["failed"],
        "{}{}",
        stdout(&o),
        stderr(&o)
    );
    // The first run could not use the answer; the second asked again and could.
    assert!(seen[0].contains("not judged"), "{seen:?}");
    assert!(
        seen[1].contains("error") && seen[1].contains("cache miss"),
        "{seen:?}"
    );
    assert!(seen[2].contains("passed"), "{seen:?}");
}

/// Shards whose simulated users were drawn again (`main@retry1`) merge: the retry counts for
/// its planned trajectory, as in a run that was not split.
#[tokio::test]
async fn shards_with_simulated_user_retries_merge() {
    let fake = FakeLlm::start(script()).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = suite(dir.path(), &fake.base_url());
    let mut shards = Vec::new();
    for shard in ["1/2", "2/2"] {
        let out = dir.path().join(format!("shard-{}", &shard[..1]));
        let o = trellis()
            .args(["run", "-q", "--shard", shard, "--out"])
            .arg(&out)
            .arg(&suite)
            .env("FAKE_KEY", "k")
            .output()
            .await
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
        shards.push(out);
    }
    let merged = dir.path().join("merged");
    let o = trellis()
        .arg("merge")
        .args(&shards)
        .arg("--out")
        .arg(&merged)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let t = read_parquet(&merged.join("trajectories.parquet"));
    let names: Vec<_> = strings(&t, "trajectory").into_iter().flatten().collect();
    assert!(names.iter().any(|n| n == "main@retry1"), "{names:?}");
    assert_eq!(names.len(), 8, "{names:?}");
}

/// A fidelity judge the LLM budget refused left the simulated user unchecked: the
/// trajectory is not passed (as for a judge the budget refused, `--resume` runs it again),
/// and a rejudge, which judges the `judge` checks left but not fidelity, neither passes it
/// nor calls the run complete. It passed, with the fidelity row "not judged", and the
/// rejudged run said it covered its plan.
#[tokio::test]
async fn a_fidelity_judge_the_budget_refused_leaves_the_trajectory_unpassed_and_rejudge_short() {
    let fake = FakeLlm::start(vec![
        Rule::when(
            "Did it break character",
            [Reply::text(
                r#"{"broke_character": false, "reason": "stayed the customer"}"#,
            )],
        ),
        Rule::simulator(
            "SCENARIO-FINE",
            [
                Reply::text("Hi, I need a duct cleaning."),
                Reply::text("It's V4T 0A7, thanks."),
                Reply::text("[END]"),
            ],
        ),
        Rule::otherwise([Reply::text(r#"{"score": 1.0, "justification": "fine"}"#)]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("budget.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "booking" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="sim-m" api-key-env="FAKE_KEY"
judge "main" provider="fake"
simulator provider="fake"
scenario "fine" {{
    description "SCENARIO-FINE: book a cleaning"
    max-turns 6
    simulate until-done
    expect no-error
    criteria {{
        judge "JUDGE-CHECK the agent is polite"
    }}
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let out = dir.path().join("bounded");
    // The simulated user's three calls (the last ends the conversation), then nothing: the fidelity judge is refused.
    let o = trellis()
        .args(["run", "--max-llm-calls", "3", "--out"])
        .arg(&out)
        .arg(&path)
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 3);
    let row = |out: &Path, kind: &str| -> String {
        let criteria = read_parquet(&out.join("criteria.parquet"));
        let kinds = strings(&criteria, "kind");
        let details = strings(&criteria, "detail");
        let statuses = strings(&criteria, "status");
        (0..kinds.len())
            .find(|&i| kinds[i].as_deref() == Some(kind))
            .map(|i| format!("{:?} {:?}", statuses[i], details[i]))
            .unwrap_or_default()
    };
    let status = |out: &Path| strings(&read_parquet(&out.join("trajectories.parquet")), "status");
    assert!(
        row(&out, "fidelity").contains("not checked: not sent: --max-llm-calls 3 reached"),
        "{}",
        row(&out, "fidelity")
    );
    assert_eq!(status(&out), [Some("skipped".to_owned())]);

    let again = dir.path().join("rejudged");
    let o = trellis()
        .arg("rejudge")
        .arg(&out)
        .arg(&path)
        .arg("--out")
        .arg(&again)
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    assert!(
        matches!(o.status.code(), Some(0 | 4)),
        "{}{}",
        stdout(&o),
        stderr(&o)
    );
    // The judge check was judged now; the fidelity check was not, and says so.
    assert!(
        row(&again, "judge").contains("passed"),
        "{}",
        row(&again, "judge")
    );
    assert!(
        row(&again, "fidelity").contains("not checked: not sent: --max-llm-calls 3"),
        "{}",
        row(&again, "fidelity")
    );
    assert_eq!(status(&again), [Some("skipped".to_owned())]);
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(again.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(
        summary["stats"]["aggregates"]["interrupted"], true,
        "{summary}"
    );
    let junit = std::fs::read_to_string(again.join("junit.xml")).unwrap();
    assert!(
        junit.contains("stopped before its work was done"),
        "{junit}"
    );
}

/// A persona written with templates is filled in by the scenario that plays it: the
/// simulated user is told `user_context`'s values (the scenario's persona, before any
/// capture) and a branch's persona reads the captures made before its `simulate`; the
/// judge reads the persona filled in too. `check` places a read that is not in scope at the
/// persona's text, once for all the scenarios that play it.
#[tokio::test]
async fn persona_texts_are_filled_in_by_the_scenario_that_plays_them() {
    let fake = FakeLlm::start(vec![
        Rule::when(
            "Does this expected outcome hold",
            [Reply::text(r#"{"passed": true, "justification": "ok"}"#)],
        ),
        Rule::otherwise([Reply::text("Hi, I'd like to book a duct cleaning. [END]")]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("personas.kdl");
    let text = |name_read: &str| {
        format!(
            r#"
agent "booking" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="sim-m" api-key-env="FAKE_KEY"
simulator provider="fake" fidelity=#false
judge "j" provider="fake"
persona "homeowner" type="homeowner" {{
    description "PERSONA-DESC named {{{{ {name_read} }}}} in {{{{ scenario.id }}}}"
}}
scenario "filled" {{
    persona "homeowner"
    user-context {{ name "Ada" }}
    outcome "the agent answers"
    user "Hi"
    capture "said" regex="([A-Za-z]+)"
    branch "other" {{
        simulate turns=1
    }}
    branch "inline" {{
        persona type="caller" {{ instructions "BRANCH-INSTR say {{{{ vars.said }}}}" }}
        simulate turns=1
    }}
}}
scenario "also" {{
    persona "homeowner"
    user-context {{ name "Bo" }}
    user "Hi"
    simulate turns=1
    expect no-error
}}
"#,
            fake.base_url()
        )
    };
    std::fs::write(&path, text("user_context.name")).unwrap();
    let o = trellis()
        .args(["run", "--out"])
        .arg(dir.path().join("out"))
        .arg(&path)
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    let sent: String = fake
        .seen()
        .iter()
        .map(|r| r.body.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        sent.contains("PERSONA-DESC named Ada in filled")
            && sent.contains("PERSONA-DESC named Bo in also"),
        "{sent}\n{}{}",
        stdout(&o),
        stderr(&o)
    );
    assert!(sent.contains("BRANCH-INSTR say "), "{sent}");
    assert!(!sent.contains("{{"), "a template reached the LLM: {sent}");

    std::fs::write(&path, text("user_context.nme")).unwrap();
    let o = trellis().arg("check").arg(&path).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert_eq!(
        said.matches("undefined template variable `user_context.nme`")
            .count(),
        1,
        "{said}"
    );
    assert!(
        said.contains("persona `homeowner`, played in scenario `filled`")
            && said.contains("personas.kdl:7:"),
        "{said}"
    );

    // An `env` variable it reads that is not set: `check` warns, as for any template, and
    // the run skips the scenarios that play it, saying why, rather than play the braces.
    std::fs::write(&path, text("env.TRELLIS_TEST_UNSET_NAME")).unwrap();
    let o = trellis()
        .arg("check")
        .arg(&path)
        .env_remove("TRELLIS_TEST_UNSET_NAME")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = trellis()
        .args(["run", "--out"])
        .arg(dir.path().join("unset"))
        .arg(&path)
        .env("FAKE_KEY", "k")
        .env_remove("TRELLIS_TEST_UNSET_NAME")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let t = read_parquet(&dir.path().join("unset/trajectories.parquet"));
    let reasons: Vec<Option<String>> = strings(&t, "skip_reason");
    assert!(
        reasons.iter().all(|r| r.as_deref()
            == Some("its persona `homeowner` could not be filled in: environment variable not set: `TRELLIS_TEST_UNSET_NAME`")),
        "{reasons:?}"
    );
}
