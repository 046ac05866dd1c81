//! `trellis run` with LLM judges on the fake LLM endpoint: judged checks in the tables,
//! Connexity's per-metric scores, the response cache, and the key kept out of every file.

use serde_json::{Value, json};

use super::support::llm::{FakeLlm, Reply, Rule};
use super::*;

const KEY: &str = "sk-cli-test-key-7f3a";

fn connexity_answer() -> Reply {
    let metrics: serde_json::Map<String, Value> = [
        "tool_routing",
        "parameter_extraction",
        "result_interpretation",
        "grounding_fidelity",
        "instruction_compliance",
        "information_gathering",
        "conversation_management",
        "response_delivery",
    ]
    .iter()
    .map(|m| {
        let low = *m == "information_gathering";
        (
            (*m).to_string(),
            json!({"score": if low { 2 } else { 5 }, "label": "ok", "justification": "seen",
                   "failure_code": if low { json!("asked_twice") } else { json!(null) }}),
        )
    })
    .collect();
    Reply::text(json!({"metrics": metrics, "justification": "good overall"}).to_string())
}

fn suite(dir: &std::path::Path, base_url: &str) -> std::path::PathBuf {
    let path = dir.join("judged.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "demo" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{base_url}" model="judge-m" api-key-env="FAKE_KEY" \
    input-price=1.0 output-price=1.0
judge "main" provider="fake"
scenario "book" {{
    outcome "The agent quotes a price"
    user "Hi, I'd like to book a duct cleaning."
    user "It's V4T 0A7."
    criteria {{
        judge "CONNEXITY-CHECK overall" rubric="connexity"
        judge "ECHO-CHECK anything"
    }}
}}
"#
        ),
    )
    .unwrap();
    path
}

/// `trellis rejudge RUN SUITE --out OUT`, with the fake provider's key.
async fn rejudge(
    run: &std::path::Path,
    suite: &std::path::Path,
    out: impl AsRef<std::path::Path>,
) -> Output {
    trellis()
        .arg("rejudge")
        .arg(run)
        .arg(suite)
        .arg("--out")
        .arg(out.as_ref())
        .env("FAKE_KEY", KEY)
        .output()
        .await
        .unwrap()
}

async fn run(suite: &std::path::Path, out: &std::path::Path, extra: &[&str]) -> Output {
    trellis()
        .args(["run", "--quiet", "--replace", "--out"])
        .arg(out)
        .arg(suite)
        .args(extra)
        .env("FAKE_KEY", KEY)
        .output()
        .await
        .unwrap()
}

/// A provider's key a model echoes in a successful answer is redacted in every record, as
/// in an error body: the reply of a model under test reached through the provider, a judge's
/// justification, in the key's own spelling, JSON-escaped (`\/` for `/`) and percent-encoded
/// in part, in the
/// journal, the tables, the report, JUnit and the response cache.
#[tokio::test]
async fn a_provider_key_echoed_in_an_answer_is_redacted_in_every_record() {
    const SLASHED: &str = "sk-ab/cd+ef==XYZ9-echoed";
    let escaped = SLASHED.replace('/', "\\/");
    // Percent-encoded in part, as a hand-written encoder that knew only `/` writes it.
    let partly = SLASHED.replace('/', "%2F");
    let fake = FakeLlm::start(vec![
        Rule {
            system: Some("AGENT-UNDER-TEST".into()),
            ..Rule::otherwise([Reply::text(format!("your key is {SLASHED}"))])
        },
        Rule::otherwise([Reply::text(format!(
            r#"{{"score": 0.9, "justification": "raw {SLASHED} escaped {escaped} pct {partly}"}}"#
        ))]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("echo.kdl");
    std::fs::write(
        &suite,
        format!(
            r#"
provider "fake" kind="openai" base-url="{}" model="m" api-key-env="FAKE_KEY"
agent "model" protocol="openai" provider="fake" system-prompt="AGENT-UNDER-TEST"
judge "main" provider="fake"
scenario "echo" {{
    user "What is my key?"
    expect judge "the agent is polite"
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let cache = dir.path().join("cache");
    let o = trellis()
        .args(["run", "--out"])
        .arg(&out)
        .arg(&suite)
        .arg("--llm-cache")
        .arg(&cache)
        .env("FAKE_KEY", SLASHED)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 2);
    let mut files = vec![(out.join("journal"), journal_text(&out))];
    for name in [
        "turns.parquet",
        "criteria.parquet",
        "report.html",
        "junit.xml",
    ] {
        let bytes = std::fs::read(out.join(name)).unwrap();
        files.push((out.join(name), String::from_utf8_lossy(&bytes).into_owned()));
    }
    for shard in std::fs::read_dir(&cache).unwrap() {
        for entry in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            let path = entry.unwrap().path();
            files.push((path.clone(), std::fs::read_to_string(&path).unwrap()));
        }
    }
    for (path, text) in &files {
        // Any spelling: the key's tail is in none of them.
        assert!(!text.contains("ef==XYZ9"), "{}: {text}", path.display());
    }
    let journal = &files[0].1;
    assert!(journal.contains("your key is [redacted]"), "{journal}");
    assert!(
        journal.contains("raw [redacted] escaped [redacted] pct [redacted]"),
        "{journal}"
    );
    let df = read_parquet(&out.join("turns.parquet"));
    assert_eq!(
        strings(&df, "reply"),
        [Some("your key is [redacted]".to_owned())]
    );
    // The model under test names the provider it is reached through.
    assert_eq!(strings(&df, "provider"), [Some("fake".to_owned())]);
}

/// A judge that echoes the provider's key leaves it in no cache entry: the cache is shared
/// and committed. The entry is written redacted, and a replay-only rerun still reads it.
#[tokio::test]
async fn a_key_the_model_echoes_is_not_written_to_the_cache() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::text(format!(
        r#"{{"score": 0.9, "justification": "polite; your key {KEY} works"}}"#
    ))])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = one_judged_check(dir.path(), &fake.base_url(), "ECHO");
    let cache = dir.path().join("cache");
    let cache_arg = cache.to_str().unwrap();
    let o = run(
        &suite,
        &dir.path().join("first"),
        &["--llm-cache", cache_arg],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let mut entries = 0;
    for shard in std::fs::read_dir(&cache).unwrap() {
        for entry in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            assert!(!text.contains(KEY), "{text}");
            assert!(!text.contains("7f3a"), "{text}");
            assert!(text.contains("[redacted]"), "{text}");
            entries += 1;
        }
    }
    assert_eq!(entries, 1);
    let o = run(
        &suite,
        &dir.path().join("replayed"),
        &["--llm-cache", cache_arg, "--llm-cache-mode", "replay-only"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 1, "replay-only sends nothing");
}

/// An agent that echoes the header secret it was sent puts it in the judge's prompt, which a
/// cache entry stores: the entry is written with it redacted, and a replay-only rerun still
/// reads it (the key is the request as sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_secret_the_agent_echoes_is_not_written_to_the_cache() {
    const SECRET: &str = "s3cr3t-header-4b5c6d";
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::text(
        r#"{"score": 0.9, "justification": "fine"}"#,
    )])])
    .await;
    let (addr, _agent) = super::faults::echoing_agent().await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("echo.kdl");
    std::fs::write(
        &suite,
        format!(
            r#"
agent "web" protocol="connexity" url="http://{addr}/agent/respond" retries=0 {{
    header "Authorization" "Bearer {{{{ env.ECHO_TOKEN }}}}"
}}
provider "fake" kind="openai" base-url="{base}" model="judge-m" api-key-env="FAKE_KEY"
judge "main" provider="fake"
scenario "echoes" {{
    user "hello"
    expect judge "the agent greets the user"
}}
"#,
            base = fake.base_url()
        ),
    )
    .unwrap();
    let cache = dir.path().join("cache");
    let run = |out: &str, mode: &str| {
        trellis()
            .args(["run", "--quiet", "--out"])
            .arg(dir.path().join(out))
            .arg(&suite)
            .arg("--llm-cache")
            .arg(&cache)
            .args(["--llm-cache-mode", mode])
            .env("FAKE_KEY", KEY)
            .env("ECHO_TOKEN", SECRET)
            .output()
    };
    let o = run("first", "read-write").await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        fake.seen()
            .iter()
            .any(|r| r.body.to_string().contains(SECRET)),
        "the judge was shown the echo"
    );
    let mut entries = 0;
    for shard in std::fs::read_dir(&cache).unwrap() {
        for entry in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            assert!(!text.contains(SECRET), "{text}");
            assert!(text.contains("you sent Bearer [redacted]"), "{text}");
            entries += 1;
        }
    }
    assert_eq!(entries, 1);
    let o = run("replayed", "replay-only").await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 1, "replay-only sends nothing");
}

#[tokio::test]
async fn judged_checks_fill_the_tables_and_a_replay_only_rerun_sends_nothing() {
    let fake = FakeLlm::start(vec![
        Rule::when("CONNEXITY-CHECK", [connexity_answer()]),
        // A server that leaks the request headers, key included, in its error body.
        Rule::when("ECHO-CHECK", [Reply::EchoHeaders(400)]),
        Rule::when(
            "Does this expected outcome hold",
            [Reply::text(
                r#"{"passed": true, "justification": "quoted $120"}"#,
            )],
        ),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = suite(dir.path(), &fake.base_url());
    let cache = dir.path().join("cache");
    let cache_arg = cache.to_str().unwrap();
    let out = dir.path().join("first");
    let o = run(&suite, &out, &["--llm-cache", cache_arg]).await;
    // The echoing judge is an error check: the trajectory is an error, exit 1.
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    // The echoing judge is asked twice: a 4xx is retried once without structured output.
    assert_eq!(fake.calls(), 4);

    let criteria = read_parquet(&out.join("criteria.parquet"));
    let status = strings(&criteria, "status");
    let text = strings(&criteria, "criterion");
    let row = |needle: &str| {
        text.iter()
            .position(|t| t.as_deref().is_some_and(|t| t.contains(needle)))
            .unwrap()
    };
    let connexity = row("CONNEXITY-CHECK");
    assert_eq!(status[connexity].as_deref(), Some("passed"));
    let score = criteria
        .column("score")
        .unwrap()
        .f64()
        .unwrap()
        .get(connexity);
    // All fives but information_gathering (.10) at 2: 100 - 0.10 * 60 = 94.
    assert!((score.unwrap() - 0.94).abs() < 1e-9, "{score:?}");
    assert_eq!(
        strings(&criteria, "rubric")[connexity].as_deref(),
        Some("connexity")
    );
    assert_eq!(
        strings(&criteria, "judge_model")[connexity].as_deref(),
        Some("judge-m")
    );
    // The run's mean judge score (what `compare` gates on) averages the scores given.
    let scores: Vec<f64> = criteria
        .column("score")
        .unwrap()
        .f64()
        .unwrap()
        .iter()
        .flatten()
        .collect();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let mean = summary["stats"]["aggregates"]["mean_score"]
        .as_f64()
        .unwrap();
    let expected = scores.iter().sum::<f64>() / scores.len() as f64 * 100.0;
    assert!((mean - expected).abs() < 1e-9, "{mean} vs {expected}");
    assert_eq!(status[row("ECHO-CHECK")].as_deref(), Some("error"));
    let categories = strings(&criteria, "judge_error_category");
    assert_eq!(
        categories[row("ECHO-CHECK")].as_deref(),
        Some("http_4xx"),
        "the judge's failure has its category in the table"
    );
    assert_eq!(categories[connexity], None);
    let echoed = strings(&criteria, "detail")[row("ECHO-CHECK")]
        .clone()
        .unwrap();
    assert!(
        echoed.contains("Bearer [redacted]"),
        "the echo was quoted: {echoed}"
    );
    assert_eq!(status[row("quotes a price")].as_deref(), Some("passed"));

    let metrics = read_parquet(&out.join("rubric_scores.parquet"));
    assert_eq!(metrics.height(), 8);
    let codes: Vec<Option<String>> = strings(&metrics, "failure_code");
    assert_eq!(
        codes.iter().flatten().collect::<Vec<_>>(),
        [&"asked_twice".to_string()]
    );
    // The report shows each metric's score and reasons under its check, the low one marked.
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        html.contains(
            "<tr class=\"low\"><td><code>information_gathering</code></td><td class=\"n\">2&#x2f;5</td>\
             <td>ok <code>asked_twice</code></td><td>seen</td></tr>"
        ),
        "{}",
        html.split("<table class=\"metrics\">")
            .nth(1)
            .unwrap_or("no metrics table")
    );
    assert!(html.contains("<td><code>tool_routing</code></td><td class=\"n\">5&#x2f;5</td>"));

    // The key is in no file of the run, though the server echoed it back.
    for entry in std::fs::read_dir(&out).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(KEY), "{} holds the key", path.display());
    }
    assert!(!stdout(&o).contains(KEY) && !stderr(&o).contains(KEY));

    // Replay: the cached answers, no request (the failed call was not cached: it is an
    // error again, as a miss).
    let again = dir.path().join("again");
    let o = run(
        &suite,
        &again,
        &["--llm-cache", cache_arg, "--llm-cache-mode", "replay-only"],
    )
    .await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(fake.calls(), 4, "replay-only sends nothing");
    let replayed = read_parquet(&again.join("criteria.parquet"));
    assert_eq!(
        strings(&replayed, "status")[connexity].as_deref(),
        Some("passed")
    );
    let hits = replayed.column("judge_cache_hit").unwrap().bool().unwrap();
    assert_eq!(hits.get(connexity), Some(true));
    let echo = strings(&replayed, "detail")[row("ECHO-CHECK")]
        .clone()
        .unwrap();
    assert!(echo.contains("cache miss"), "{echo}");

    // The mode needs a directory.
    let o = trellis()
        .args(["run", "--llm-cache-mode", "replay-only"])
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[tokio::test]
async fn rejudge_rescores_a_recorded_run_with_the_current_judges_without_any_agent() {
    let fake = FakeLlm::start(vec![
        Rule::when("CONNEXITY-CHECK", [connexity_answer()]),
        Rule::when(
            "ECHO-CHECK",
            [Reply::text(r#"{"score": 1, "label": "ok"}"#)],
        ),
        Rule::when(
            "Does this expected outcome hold",
            [Reply::text(
                r#"{"passed": true, "justification": "quoted"}"#,
            )],
        ),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = suite(dir.path(), &fake.base_url());
    let first = dir.path().join("first");
    let o = run(&suite, &first, &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 3);

    // The suite now asks more of the Connexity score (0.94 < 0.95), and has a judged check
    // the run never recorded: it is named, not judged.
    let text = std::fs::read_to_string(&suite)
        .unwrap()
        .replace(
            r#"rubric="connexity""#,
            r#"rubric="connexity" threshold=0.95"#,
        )
        .replace(
            r#"judge "ECHO-CHECK anything""#,
            "judge \"ECHO-CHECK anything\"\n        judge \"NEW-CHECK brevity\"",
        );
    std::fs::write(&suite, text).unwrap();
    let again = dir.path().join("rejudged");
    let o = rejudge(&first, &suite, &again).await;
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("rejudged 3 check(s)"), "{}", stdout(&o));
    assert!(stdout(&o).contains("1 changed status"), "{}", stdout(&o));
    assert!(
        stderr(&o)
            .contains("note: 1 judged check of the suites not in the recorded run, so not judged")
            && stderr(&o).contains("  - judged/book: judge \"NEW-CHECK brevity\""),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        fake.calls(),
        6,
        "the judges were asked again, the new check not"
    );

    let runs = read_parquet(&again.join("runs.parquet"));
    let original = strings(&read_parquet(&first.join("runs.parquet")), "run_id")[0].clone();
    assert_eq!(strings(&runs, "rejudged_from")[0], original);
    // `trellis runs` says what it is: the same transcripts judged again, not a run.
    let o = crate::trellis()
        .args(["runs", "--dir"])
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    let listed = stdout(&o);
    let line = listed
        .lines()
        .find(|l| l.contains("rejudge of"))
        .unwrap_or_else(|| panic!("no rejudge state: {listed}"));
    assert!(
        line.contains(original.as_deref().unwrap_or_default()),
        "{listed}"
    );
    let t = read_parquet(&again.join("trajectories.parquet"));
    assert_eq!(strings(&t, "status")[0].as_deref(), Some("failed"));
    // The transcript is the recorded one: no agent was called.
    let turns = |d: &std::path::Path| strings(&read_parquet(&d.join("turns.parquet")), "reply");
    assert_eq!(turns(&first), turns(&again));
    // The re-scored run's end is a run's end: when it finished, how long it took, the
    // original's agent turns, and its own judge calls by role.
    let row = |d: &std::path::Path, column: &str| {
        read_parquet(&d.join("runs.parquet"))
            .column(column)
            .unwrap()
            .get(0)
            .unwrap()
            .to_string()
    };
    let finished = row(&again, "finished_at");
    assert!(
        finished.contains('T') && finished.contains('Z'),
        "{finished}"
    );
    assert_ne!(row(&again, "duration_ms"), "0.0");
    assert_eq!(row(&again, "turns"), row(&first, "turns"));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(again.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(
        summary["stats"]["aggregates"]["llm_roles"]["judge"]["calls"], 3,
        "{summary}"
    );
}

/// A judged check on one branch is recorded by that branch's trajectory only: a rejudge of
/// the same suite names none as new.
#[tokio::test]
async fn rejudge_names_no_branch_check_as_new_when_another_branch_recorded_it() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::text(
        r#"{"score": 1, "label": "ok"}"#,
    )])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("branches.kdl");
    std::fs::write(
        &suite,
        format!(
            r#"
agent "demo" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="judge-m" api-key-env="FAKE_KEY"
judge "main" provider="fake"
scenario "book" {{
    user "Hi, I'd like to book a duct cleaning."
    branch "yes" {{
        user "It's V4T 0A7."
        expect judge "YES-CHECK asks for a date"
    }}
    branch "no" {{
        user "Never mind."
        expect judge "NO-CHECK says goodbye"
    }}
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let first = dir.path().join("first");
    let o = run(&suite, &first, &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let o = rejudge(&first, &suite, dir.path().join("again")).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("rejudged 2 check(s)"), "{}", stdout(&o));
    assert!(
        !stderr(&o).contains("not in the recorded run"),
        "{}",
        stderr(&o)
    );
}

/// A check on the shared prefix is one verdict for every branch, in `rejudge` as in the
/// run: judged once, not once per trajectory (two draws of a judge could pass and fail the
/// same turn, and each draw is a call paid for).
#[tokio::test]
async fn rejudge_judges_a_shared_prefix_check_once_for_every_branch() {
    // Each judge call scores lower than the one before: a second call for the same turn
    // would disagree with the first.
    let fake = FakeLlm::start(vec![Rule::otherwise([
        Reply::text(r#"{"score": 0.9, "justification": "first"}"#),
        Reply::text(r#"{"score": 0.2, "justification": "second"}"#),
        Reply::text(r#"{"score": 0.1, "justification": "third"}"#),
    ])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("prefix.kdl");
    std::fs::write(
        &suite,
        format!(
            r#"
agent "demo" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="judge-m" api-key-env="FAKE_KEY"
judge "main" provider="fake" threshold=0.5
scenario "book" {{
    user "Hi, I'd like to book a duct cleaning."
    expect judge "PREFIX-CHECK greets the customer"
    branch "yes" {{
        user "It's V4T 0A7."
    }}
    branch "no" {{
        user "Never mind."
    }}
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let first = dir.path().join("first");
    let o = run(&suite, &first, &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 1, "the run judges the prefix once");
    let again = dir.path().join("again");
    let o = rejudge(&first, &suite, &again).await;
    assert_eq!(fake.calls(), 2, "{}{}", stdout(&o), stderr(&o));
    // The second answer (0.2) for both branches: failed, both of them.
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let criteria = read_parquet(&again.join("criteria.parquet"));
    let trajectories = strings(&criteria, "trajectory");
    let statuses = strings(&criteria, "status");
    assert_eq!(trajectories.len(), 2, "{criteria}");
    assert_ne!(trajectories[0], trajectories[1]);
    let failed = Some("failed".to_string());
    assert_eq!(statuses, [failed.clone(), failed], "{criteria}");
}

#[tokio::test]
async fn rejudge_shows_the_judge_the_history_the_run_sent_not_the_file_as_it_is_now() {
    let fake = FakeLlm::start(vec![Rule::when(
        "HISTORY-CHECK",
        [Reply::text(r#"{"score": 1, "label": "ok"}"#)],
    )])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let conv = dir.path().join("conv.json");
    std::fs::write(
        &conv,
        r#"[{"role": "user", "content": "ORIGINAL order A-1"}, {"role": "assistant", "content": "Got it."}]"#,
    )
    .unwrap();
    let suite = dir.path().join("history.kdl");
    std::fs::write(
        &suite,
        format!(
            r#"
agent "demo" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="judge-m" api-key-env="FAKE_KEY"
judge "main" provider="fake"
scenario "s" {{
    history path="conv.json"
    user "Hi, I'd like to book a duct cleaning."
    criteria {{
        judge "HISTORY-CHECK the agent remembers the order"
    }}
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let first = dir.path().join("first");
    let o = run(&suite, &first, &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    std::fs::write(
        &conv,
        r#"[{"role": "user", "content": "EDITED since"}, {"role": "assistant", "content": "Sure."}]"#,
    )
    .unwrap();
    let o = rejudge(&first, &suite, dir.path().join("rejudged")).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let prompts: Vec<String> = fake.seen().iter().map(|r| r.body.to_string()).collect();
    assert_eq!(prompts.len(), 2, "{prompts:?}");
    for prompt in &prompts {
        assert!(prompt.contains("ORIGINAL order A-1"), "{prompt}");
        assert!(!prompt.contains("EDITED since"), "{prompt}");
    }
}

/// A trajectory that `stop-on-failure` ended at a judged check is not passed by a rejudge
/// that finds the check holds: the steps after it were never sent.
#[tokio::test]
async fn rejudge_does_not_pass_a_trajectory_stopped_at_a_check_that_now_holds() {
    let fake = FakeLlm::start(vec![Rule::when(
        "STOP-CHECK",
        [
            Reply::text(r#"{"score": 0, "label": "no"}"#),
            Reply::text(r#"{"score": 1, "label": "ok"}"#),
        ],
    )])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("stops.kdl");
    std::fs::write(
        &suite,
        format!(
            r#"
agent "demo" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="judge-m" api-key-env="FAKE_KEY"
judge "main" provider="fake"
scenario "s" {{
    stop-on-failure #true
    user "Hi, I'd like to book a duct cleaning."
    expect judge "STOP-CHECK the agent asks for the postal code"
    user "It's V4T 0A7."
    expect reply contains="NEVER SAID"
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let first = dir.path().join("first");
    let o = run(&suite, &first, &[]).await;
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let again = dir.path().join("rejudged");
    let o = rejudge(&first, &suite, &again).await;
    let said = format!("{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 2, "{said}");
    let t = read_parquet(&again.join("trajectories.parquet"));
    assert_eq!(
        strings(&t, "status")[0].as_deref(),
        Some("skipped"),
        "{said}"
    );
    let reason = strings(&t, "skip_reason")[0].clone().unwrap_or_default();
    assert!(reason.contains("stop-on-failure"), "{reason}");
}

#[tokio::test]
async fn a_stop_signal_ends_a_rejudge_with_its_exit_code_and_leaves_no_lock() {
    let fast = FakeLlm::start(vec![Rule::otherwise([Reply::text(
        r#"{"score": 1, "label": "ok", "passed": true, "justification": "quoted"}"#,
    )])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = suite(dir.path(), &fast.base_url());
    let first = dir.path().join("first");
    let o = run(&suite, &first, &[]).await;
    assert!(first.join(crate::JOURNAL).is_file(), "{}", stderr(&o));

    // The judges now take far longer than the test waits: only the signal can end it.
    let slow = FakeLlm::start(vec![Rule::otherwise([Reply::slow(
        std::time::Duration::from_secs(120),
        Reply::text("{}"),
    )])])
    .await;
    let text = std::fs::read_to_string(&suite)
        .unwrap()
        .replace(&fast.base_url(), &slow.base_url());
    std::fs::write(&suite, text).unwrap();
    for (signal, code, name) in [
        (libc::SIGTERM, 143, "SIGTERM"),
        (libc::SIGINT, 130, "SIGINT"),
    ] {
        let again = dir.path().join(format!("rejudged-{name}"));
        let calls_before = slow.calls();
        let child = trellis()
            .arg("rejudge")
            .arg(&first)
            .arg(&suite)
            .arg("--out")
            .arg(&again)
            .env("FAKE_KEY", KEY)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while slow.calls() == calls_before {
            assert!(std::time::Instant::now() < deadline, "no judge was asked");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let pid = i32::try_from(child.id().unwrap()).unwrap();
        // SAFETY: kill(2) on a child process id this test spawned and has not reaped yet.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let o = tokio::time::timeout(std::time::Duration::from_secs(20), child.wait_with_output())
            .await
            .expect("rejudge did not exit after the signal")
            .unwrap();
        assert_eq!(o.status.code(), Some(code), "{}", stderr(&o));
        assert!(stderr(&o).contains(name), "{}", stderr(&o));
        // Nothing half-rejudged is left, not even the lock or the empty directory.
        assert!(!again.join(".trellis-run.lock").exists());
        assert!(!again.exists(), "{} is left behind", again.display());
    }
}

#[tokio::test]
async fn the_llm_example_is_valid_and_fully_runnable() {
    let o = trellis()
        .args(["check", "examples/llm/"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Judges and a simulator are configured: nothing is reported as unable to run.
    assert!(!stderr(&o).contains("not_runnable"), "{}", stderr(&o));
}

/// A suite of one scenario whose one check is `expect judge "{check} the agent is polite"`,
/// judged on `base_url`.
fn one_judged_check(dir: &std::path::Path, base_url: &str, check: &str) -> std::path::PathBuf {
    let path = dir.join("judged-once.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "demo" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{base_url}" model="judge-m" api-key-env="FAKE_KEY"
judge "main" provider="fake"
scenario "greet" {{
    user "Hi, I'd like to book a duct cleaning."
    expect judge "{check} the agent is polite"
}}
"#
        ),
    )
    .unwrap();
    path
}

#[tokio::test]
async fn an_unusable_judge_answer_is_not_kept_in_the_response_cache() {
    // The judge answers prose once, then what it should.
    let fake = FakeLlm::start(vec![Rule::when(
        "PROSE-CHECK",
        [
            Reply::text("I think it is fine."),
            Reply::text(r#"{"score": 1.0, "justification": "polite"}"#),
        ],
    )])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = one_judged_check(dir.path(), &fake.base_url(), "PROSE-CHECK");
    let cache = dir.path().join("cache");
    let cache_arg = ["--llm-cache", cache.to_str().unwrap()];
    let o = run(&path, &dir.path().join("first"), &cache_arg).await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let sent = fake.calls();
    // The next run asks again, rather than replaying the unusable answer for ever.
    let o = run(&path, &dir.path().join("second"), &cache_arg).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(fake.calls() > sent);
    // And keeps the good answer: a third run sends nothing.
    let sent = fake.calls();
    let o = run(&path, &dir.path().join("third"), &cache_arg).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), sent);
}

/// A judge whose words say the opposite of its score (`{"score": 0.9, "passed": false}`)
/// gives no verdict: the check is `error` (`unusable_answer`), not passed by the score.
#[tokio::test]
async fn a_judge_whose_words_contradict_its_score_gives_no_verdict() {
    for (answer, status, detail) in [
        (
            r#"{"score": 0.9, "passed": false, "justification": "no"}"#,
            "error",
            "but it said `passed: false`",
        ),
        (
            r#"{"score": 0.95, "label": "fail", "justification": "failed completely"}"#,
            "error",
            "but it said the label `fail`",
        ),
        (
            r#"{"score": 0.9, "verdict": "pass", "label": "fail"}"#,
            "error",
            "two verdicts that disagree",
        ),
        (
            r#"{"score": 0.9, "label": "pass", "justification": "polite"}"#,
            "passed",
            "score 0.90 >= 0.50",
        ),
    ] {
        let fake = FakeLlm::start(vec![Rule::when("WORDS-CHECK", [Reply::text(answer)])]).await;
        let dir = tempfile::tempdir().unwrap();
        let path = one_judged_check(dir.path(), &fake.base_url(), "WORDS-CHECK");
        let out = dir.path().join("out");
        run(&path, &out, &[]).await;
        let c = read_parquet(&out.join("criteria.parquet"));
        let at = strings(&c, "kind")
            .iter()
            .position(|k| k.as_deref() == Some("judge"))
            .unwrap_or_else(|| panic!("{c}"));
        assert_eq!(
            strings(&c, "status")[at].as_deref(),
            Some(status),
            "{answer}: {c}"
        );
        let said = strings(&c, "detail")[at].clone().unwrap_or_default();
        assert!(said.contains(detail), "{answer}: {said}");
        if status == "error" {
            assert_eq!(
                strings(&c, "judge_error_category")[at].as_deref(),
                Some("unusable_answer"),
                "{answer}"
            );
        }
    }
}

/// A judge's answer cut at its token limit (`finish_reason: length`) is unusable, and the
/// detail says it was cut off and what to raise, not only "no score".
#[tokio::test]
async fn a_judge_answer_cut_at_its_token_limit_says_so() {
    let body = json!({
        "id": "x", "object": "chat.completion", "model": "judge-m",
        "choices": [{"index": 0, "finish_reason": "length",
            "message": {"role": "assistant", "content": "{\"score\": 0."}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    });
    let fake = FakeLlm::start(vec![Rule::when(
        "CUT-CHECK",
        [Reply::Raw(body.to_string())],
    )])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = one_judged_check(dir.path(), &fake.base_url(), "CUT-CHECK");
    let out = dir.path().join("out");
    run(&path, &out, &[]).await;
    let c = read_parquet(&out.join("criteria.parquet"));
    let at = strings(&c, "kind")
        .iter()
        .position(|k| k.as_deref() == Some("judge"))
        .unwrap_or_else(|| panic!("{c}"));
    assert_eq!(strings(&c, "status")[at].as_deref(), Some("error"), "{c}");
    let detail = strings(&c, "detail")[at].clone().unwrap_or_default();
    assert!(detail.contains("cut off at its token limit"), "{detail}");
    assert!(detail.contains("max-tokens"), "{detail}");
}

/// The response cache is keyed by where the request goes too: a provider pointed at another
/// server (a bigger model under the same provider id and model name) is asked, not answered
/// with the first server's cached verdicts.
#[tokio::test]
async fn a_provider_pointed_at_another_server_is_not_answered_from_the_cache() {
    let answer = r#"{"score": 1.0, "justification": "polite"}"#;
    let first = FakeLlm::start(vec![Rule::when("MOVED-CHECK", [Reply::text(answer)])]).await;
    let second = FakeLlm::start(vec![Rule::when("MOVED-CHECK", [Reply::text(answer)])]).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cache_arg = ["--llm-cache", cache.to_str().unwrap()];
    let path = one_judged_check(dir.path(), &first.base_url(), "MOVED-CHECK");
    let o = run(&path, &dir.path().join("first"), &cache_arg).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(first.calls(), 1);
    // The same suite again: answered from the cache.
    let o = run(&path, &dir.path().join("again"), &cache_arg).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(first.calls(), 1);
    let path = one_judged_check(dir.path(), &second.base_url(), "MOVED-CHECK");
    let o = run(&path, &dir.path().join("moved"), &cache_arg).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        second.calls(),
        1,
        "the moved provider was answered from the cache"
    );
}

#[tokio::test]
async fn a_judge_that_fails_with_and_without_its_schema_says_both() {
    let fake = FakeLlm::start(vec![Rule::when(
        "DOWN-CHECK",
        [Reply::Status(500, "overloaded".into())],
    )])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = one_judged_check(dir.path(), &fake.base_url(), "DOWN-CHECK");
    let out = dir.path().join("out");
    let o = run(&path, &out, &[]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = journal_text(&out);
    assert!(
        text.contains(
            "the judge call failed with its JSON schema and again without it (6 attempts in \
             all)"
        ),
        "{text}"
    );
    // With the schema and without it, each with the provider's retries of a 5xx: the
    // detail counts them all (it said the second call's 3).
    assert_eq!(fake.calls(), 6);
    // The JSON stream says why the trajectory is `error`: the check whose judge failed.
    let o = run(
        &path,
        &dir.path().join("json"),
        &["--message-format", "json"],
    )
    .await;
    let finished: serde_json::Value = stdout(&o)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["type"] == "trajectory_finished")
        .expect("a trajectory_finished event");
    assert_eq!(finished["status"], "error", "{finished}");
    let checks = finished["failed_criteria"].as_array().unwrap();
    assert_eq!(checks.len(), 1, "{finished}");
    assert_eq!(checks[0]["status"], "error", "{finished}");
    assert!(
        checks[0]["detail"]
            .as_str()
            .unwrap()
            .contains("the judge call failed"),
        "{finished}"
    );
}

/// Judge and outcome statements are templates, as user messages are: the judge reads them
/// rendered in the trajectory's scope (user context, captures), the list of expected
/// outcomes in every judge's prompt included, and `check` reports an undefined variable in
/// one at its place.
#[tokio::test]
async fn judge_statements_are_rendered_for_the_judge_and_checked() {
    let pass = r#"{"score": 1, "passed": true, "label": "pass", "justification": "ok"}"#;
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::text(pass)])]).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = |judge: &str| {
        format!(
            r#"
agent "demo" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="judge-m" api-key-env="FAKE_KEY"
judge "main" provider="fake"
scenario "greet" {{
    user-context {{ day "Tuesday" }}
    outcome "SCENARIO-OUTCOME booked for {{{{ user_context.day }}}}"
    user "Hi, I'd like to book a duct cleaning."
    capture "asked" regex="(postal code)"
    expect judge "{judge}"
    criteria {{
        outcome "CRITERIA-OUTCOME it asked for the {{{{ vars.asked }}}}"
    }}
}}
"#,
            fake.base_url()
        )
    };
    let good = dir.path().join("good.kdl");
    std::fs::write(
        &good,
        suite(
            r#"EXPECT-JUDGE greets on {{ user_context.day }}" rubric="RUBRIC-TEXT grade the ask for the {{ vars.asked }} on {{ user_context.day }}"#,
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("run")
        .arg(&good)
        .arg("--out")
        .arg(dir.path().join("out"))
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let sent: String = fake
        .seen()
        .iter()
        .map(|r| r.body.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    for rendered in [
        "EXPECT-JUDGE greets on Tuesday",
        "RUBRIC-TEXT grade the ask for the postal code on Tuesday",
        "SCENARIO-OUTCOME booked for Tuesday",
        "CRITERIA-OUTCOME it asked for the postal code",
    ] {
        assert!(sent.contains(rendered), "{rendered} not in: {sent}");
    }
    assert!(!sent.contains("{{"), "a template reached the judge: {sent}");
    // Re-scored later, the statements reach the judge rendered again, each found by the
    // text the run recorded.
    let before = fake.calls();
    let o = trellis()
        .arg("rejudge")
        .arg(dir.path().join("out"))
        .arg(&good)
        .arg("--out")
        .arg(dir.path().join("rejudged"))
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let again: String = fake.seen()[before..]
        .iter()
        .map(|r| r.body.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(fake.calls() - before, 3, "{}", stdout(&o));
    assert!(again.contains("EXPECT-JUDGE greets on Tuesday"), "{again}");
    assert!(
        again.contains("RUBRIC-TEXT grade the ask for the postal code on Tuesday"),
        "{again}"
    );
    assert!(
        again.contains("CRITERIA-OUTCOME it asked for the postal code"),
        "{again}"
    );
    assert!(
        !again.contains("{{"),
        "a template reached the judge: {again}"
    );
    // The record keeps the statement as written: the same check in every run.
    let c = read_parquet(&dir.path().join("out/criteria.parquet"));
    assert!(
        strings(&c, "criterion")
            .iter()
            .flatten()
            .any(|s| s.contains("{{ user_context.day }}")),
        "{c}"
    );

    let bad = dir.path().join("bad.kdl");
    std::fs::write(&bad, suite("EXPECT-JUDGE greets on {{ user_context.dya }}")).unwrap();
    let o = trellis().arg("check").arg(&bad).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(
        said.contains("undefined template variable `user_context.dya`")
            && said.contains("bad.kdl:"),
        "{said}"
    );
    // A rubric is checked as the statement is: at its place.
    std::fs::write(
        &bad,
        suite(r#"EXPECT-JUDGE greets" rubric="RUBRIC-TEXT on {{ user_context.dya }}"#),
    )
    .unwrap();
    let o = trellis().arg("check").arg(&bad).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(
        said.contains("undefined template variable `user_context.dya`")
            && said.contains("bad.kdl:10:"),
        "{said}"
    );
    // A judge's own default rubric serves every scenario: it has no scope to render in.
    let text = std::fs::read_to_string(&good).unwrap().replace(
        r#"judge "main" provider="fake""#,
        r#"judge "main" provider="fake" rubric="Grade it on {{ user_context.day }}""#,
    );
    std::fs::write(&bad, text).unwrap();
    let o = trellis().arg("check").arg(&bad).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(
        said.contains("a judge's default rubric is not a template") && said.contains("bad.kdl:4:"),
        "{said}"
    );
}

/// In a `for-each` scenario a check's `rubric=` is rendered with the row, as its statement
/// is: the judge is instructed with the row's values, and the record's criterion, which
/// quotes the rubric, says what the judge read.
#[tokio::test]
async fn a_judge_rubric_reads_the_row_of_a_for_each_instance() {
    let pass = r#"{"score": 1, "passed": true, "label": "pass", "justification": "ok"}"#;
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::text(pass)])]).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rows.jsonl"),
        "{\"tone\": \"FORMAL-TONE\"}\n",
    )
    .unwrap();
    let suite = dir.path().join("rows.kdl");
    std::fs::write(
        &suite,
        format!(
            r#"
agent "demo" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="judge-m" api-key-env="FAKE_KEY"
judge "main" provider="fake"
dataset "rows" path="rows.jsonl"
scenario "greet" for-each="rows" {{
    user "Hi, I'd like to book a duct cleaning."
    expect judge "the agent greets" rubric="Grade whether the register is {{{{ row.tone }}}}"
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = run(&suite, &out, &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let sent: String = fake
        .seen()
        .iter()
        .map(|r| r.body.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        sent.contains("Grade whether the register is FORMAL-TONE") && !sent.contains("{{"),
        "{sent}"
    );
    let c = read_parquet(&out.join("criteria.parquet"));
    let criteria: Vec<String> = strings(&c, "criterion").into_iter().flatten().collect();
    assert!(
        criteria
            .iter()
            .any(|s| s.contains("rubric=\"Grade whether the register is FORMAL-TONE\"")),
        "{criteria:?}"
    );
}

/// The judge is shown the tool calls `expect-tool` expects with their parameters rendered,
/// as the checks compare them: user context and captures, in the run and in a rejudge (it
/// read `{"order_id":"{{ user_context.order }}"}`).
#[tokio::test]
async fn expected_tool_calls_reach_the_judge_rendered() {
    let pass = r#"{"score": 1, "passed": true, "label": "pass", "justification": "ok"}"#;
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::text(pass)])]).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("refund.kdl");
    std::fs::write(
        &suite,
        format!(
            r##"
agent "sup" protocol="multiagent" builtin="support"
provider "fake" kind="openai" base-url="{}" model="judge-m" api-key-env="FAKE_KEY"
judge "main" provider="fake"
scenario "refund" {{
    user-context {{ order "A-1002" }}
    user "Refund $30 for order {{{{ user_context.order }}}}"
    capture "oid" regex=#"order (A-\d+)"#
    expect-tool "apply_refund" order_id="{{{{ user_context.order }}}}"
    expect-tool "get_order" order_id="{{{{ vars.oid }}}}"
    outcome "the order is refunded"
}}
"##,
            fake.base_url()
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--out")
        .arg(dir.path().join("out"))
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let prompts = |from: usize| {
        fake.seen()[from..]
            .iter()
            .map(|r| r.body.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let sent = prompts(0);
    for rendered in [
        r#"apply_refund {\"order_id\":\"A-1002\"}"#,
        r#"get_order {\"order_id\":\"A-1002\"}"#,
    ] {
        assert!(sent.contains(rendered), "{rendered} not in: {sent}");
    }
    assert!(!sent.contains("{{"), "a template reached the judge: {sent}");
    let before = fake.calls();
    let o = trellis()
        .arg("rejudge")
        .arg(dir.path().join("out"))
        .arg(&suite)
        .arg("--out")
        .arg(dir.path().join("rejudged"))
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let again = prompts(before);
    assert!(
        again.contains(r#"get_order {\"order_id\":\"A-1002\"}"#),
        "{again}"
    );
    assert!(
        !again.contains("{{"),
        "a template reached the judge: {again}"
    );
}

/// A judged check in a shared prefix is one call, however many branches share it: the
/// console's engine-calls line counts each call once, as the endpoint sees them and as the
/// per-role line does (it summed the trajectories' records, a call per branch).
#[tokio::test]
async fn the_console_counts_a_shared_prefixs_judge_call_once() {
    let pass = r#"{"score": 1, "label": "pass", "justification": "ok"}"#;
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::text(pass)])]).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("shared.kdl");
    std::fs::write(
        &suite,
        format!(
            r#"
agent "demo" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="judge-m" api-key-env="FAKE_KEY"
judge "main" provider="fake"
scenario "greet" {{
    user "Hi, I'd like to book a duct cleaning."
    expect judge "the agent is polite"
    branch "a" {{
        user "It's V4T 0A7."
        expect no-error
    }}
    branch "b" {{
        user "Never mind."
        expect no-error
    }}
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--out")
        .arg(dir.path().join("out"))
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 1);
    let line = stdout(&o)
        .lines()
        .find(|l| l.starts_with("LLM (judges"))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("{}", stdout(&o)));
    assert!(line.contains(": 1 call,"), "{line}");
}

/// A judged check the base run scored and the head run skipped (its provider taken out of
/// the suite) fails the comparison: the gate passed on it, listed as "not comparable".
#[tokio::test]
async fn a_check_the_head_run_no_longer_judges_fails_the_comparison() {
    let fake = FakeLlm::start(vec![Rule::when(
        "GATE-CHECK",
        [Reply::text(r#"{"score": 1.0, "justification": "polite"}"#)],
    )])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let judged = format!(
        r#"
agent "demo" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="judge-m" api-key-env="FAKE_KEY"
judge "main" provider="fake"
scenario "greet" {{
    user "Hi, I'd like to book a duct cleaning."
    branch "plain" {{
        user "Thanks."
        expect no-error
    }}
    branch "judged" {{
        user "Bye."
        expect judge "GATE-CHECK the agent is polite"
    }}
}}
scenario "solo" {{
    user "Hi."
    expect no-error
    criteria {{
        judge "GATE-CHECK the agent is kind"
    }}
}}
"#,
        fake.base_url()
    );
    let path = dir.path().join("gate.kdl");
    std::fs::write(&path, &judged).unwrap();
    let runs = dir.path().join("runs");
    let o = run(&path, &runs.join("base"), &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let unjudged: String = judged
        .lines()
        .filter(|l| !l.starts_with("provider") && !l.starts_with("judge"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&path, unjudged).unwrap();
    let o = run(&path, &runs.join("head"), &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));

    let o = super::history::compare(&runs, &["base", "head"]).await;
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}{}", stderr(&o));
    assert!(text.contains("REGRESSED"), "{text}");
    assert!(
        text.contains(
            "branch gate/greet judged [demo]: not run (checked in 1 of the base run's \
             repetitions, in none of the head run's)"
        ),
        "{text}"
    );
    // The branch's own check is said once, by its branch.
    assert!(
        !text.contains("`judge \"GATE-CHECK the agent is polite\"`: not checked"),
        "{text}"
    );
    assert!(
        text.contains("`judge \"GATE-CHECK the agent is kind\"`: not checked"),
        "{text}"
    );
}

/// A run a signal stopped while its judge was thinking (every trajectory recorded, one check
/// left unjudged) is complete once `rejudge` has judged that check: its JUnit and `compare`
/// said "stopped before its work was done" for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejudging_the_checks_a_signal_left_unjudged_completes_the_run() {
    let fake = FakeLlm::start(vec![Rule::otherwise([
        Reply::slow(
            std::time::Duration::from_secs(120),
            Reply::text(r#"{"score": 1.0, "justification": "polite"}"#),
        ),
        Reply::text(r#"{"score": 1.0, "justification": "polite"}"#),
    ])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = one_judged_check(dir.path(), &fake.base_url(), "STOP-CHECK");
    let runs = dir.path().join("runs");
    let child = trellis()
        .args(["run", "-q", "--out"])
        .arg(runs.join("stopped"))
        .arg(&path)
        .env("FAKE_KEY", KEY)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while fake.calls() == 0 {
        assert!(std::time::Instant::now() < deadline, "no judge was asked");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on a child process id this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let o = tokio::time::timeout(std::time::Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("the run did not exit after the signal")
        .unwrap();
    assert_eq!(o.status.code(), Some(143), "{}", stderr(&o));

    let o = rejudge(&runs.join("stopped"), &path, runs.join("rejudged")).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let junit = std::fs::read_to_string(runs.join("rejudged/junit.xml")).unwrap();
    assert!(!junit.contains("the run covers its plan"), "{junit}");
    let o = trellis()
        .args(["compare", "stopped", "rejudged", "--dir"])
        .arg(&runs)
        .output()
        .await
        .unwrap();
    assert!(
        !stdout(&o).contains("the head run was stopped"),
        "{}",
        stdout(&o)
    );
}

/// A rejudged run re-scores an earlier run's transcripts: a later run's report does not draw
/// it as a point of its trends (the same conversations would count twice). It has a
/// `run.json` naming the run it re-scored.
#[tokio::test]
async fn a_rejudged_run_is_not_a_point_of_later_trends() {
    let fake = FakeLlm::start(vec![Rule::when(
        "TREND-CHECK",
        [Reply::text(r#"{"score": 1.0, "justification": "polite"}"#)],
    )])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = one_judged_check(dir.path(), &fake.base_url(), "TREND-CHECK");
    let runs = dir.path().join("runs");
    let o = run(&path, &runs.join("first"), &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = rejudge(&runs.join("first"), &path, runs.join("rejudged")).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(runs.join("rejudged/run.json")).unwrap())
            .unwrap();
    let first: Value =
        serde_json::from_str(&std::fs::read_to_string(runs.join("first/run.json")).unwrap())
            .unwrap();
    assert_eq!(meta["rejudged_from"], first["run_id"], "{meta}");
    let o = run(&path, &runs.join("later"), &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let html = std::fs::read_to_string(runs.join("later/report.html")).unwrap();
    let rejudged_id = meta["run_id"].as_str().unwrap();
    assert!(
        html.contains(first["run_id"].as_str().unwrap()),
        "no trend point for the first run"
    );
    assert!(
        !html.contains(rejudged_id),
        "the rejudged run is drawn in the trend"
    );
}

/// A rejudged directory's `trajectories.llm_*` columns are its own calls, as its
/// `llm_roles` are: the checks judged now, not the original's simulated user, fidelity
/// judge and judges (they were the original run's, kept in its directory).
#[tokio::test]
async fn a_rejudged_trajectorys_llm_columns_count_the_rejudges_own_calls() {
    let fake = FakeLlm::start(vec![
        Rule::when(
            "Did it break character",
            [Reply::text(
                r#"{"broke_character": false, "reason": "fine"}"#,
            )],
        ),
        Rule::simulator(
            "Book a cleaning",
            [Reply::text("Hi, I need a duct cleaning.")],
        ),
        Rule::otherwise([Reply::text(r#"{"score": 1.0, "justification": "polite"}"#)]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "demo" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="judge-m" api-key-env="FAKE_KEY"
judge "main" provider="fake"
simulator provider="fake"
scenario "greet" {{
    description "Book a cleaning"
    simulate turns=1
    criteria {{
        judge "LLM-COLUMNS-CHECK the agent is polite"
    }}
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let first = dir.path().join("first");
    let o = run(&path, &first, &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let again = dir.path().join("rejudged");
    let o = rejudge(&first, &path, &again).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let calls = |d: &std::path::Path| -> Vec<Option<u64>> {
        read_parquet(&d.join("trajectories.parquet"))
            .column("llm_calls")
            .unwrap()
            .u64()
            .unwrap()
            .iter()
            .collect()
    };
    // The simulated user, the fidelity judge and the judge; then the judge alone.
    assert_eq!(calls(&first), [Some(3)]);
    assert_eq!(calls(&again), [Some(1)]);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(again.join("summary.json")).unwrap())
            .unwrap();
    let roles = &summary["stats"]["aggregates"]["llm_roles"];
    assert_eq!(roles["judge"]["calls"], 1, "{roles}");
    assert!(roles.get("simulator").is_none(), "{roles}");
}

/// A `--llm-cache` that cannot be used is said before the run: it had turned caching off
/// silently, every judge call made and paid again on each run.
#[tokio::test]
async fn an_unusable_llm_cache_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("afile");
    std::fs::write(&file, "x").unwrap();
    for (mode, what) in [
        ("read-write", "is not a directory"),
        ("replay-only", "is not a directory"),
    ] {
        let o = trellis()
            .args(["run", "suites/booking.kdl", "-q", "--llm-cache"])
            .arg(&file)
            .args(["--llm-cache-mode", mode, "--out"])
            .arg(dir.path().join(mode))
            .output()
            .await
            .unwrap();
        let err = stderr(&o);
        assert!(
            err.contains("warning: --llm-cache: ") && err.contains(what),
            "{mode}: {err}"
        );
    }
    let o = trellis()
        .args(["run", "suites/booking.kdl", "-q", "--llm-cache"])
        .arg(dir.path().join("fresh"))
        .args(["--out"])
        .arg(dir.path().join("ok"))
        .output()
        .await
        .unwrap();
    assert!(!stderr(&o).contains("--llm-cache"), "{}", stderr(&o));
}

/// A trajectory whose every check could not run says why, as its first check says it: the
/// count alone ("none of its 1 check could be evaluated") sent the reader to the report.
#[tokio::test]
async fn a_skipped_trajectory_says_why_its_checks_did_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\nscenario \"j\" {\n    \
         agent \"a\"\n    user \"hi\"\n    expect judge \"polite\" threshold=0.5\n}\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .args(["-q", "--out"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    let said = stdout(&o);
    assert!(
        said.contains(
            "SKIP 1 trajectory: none of its 1 check could be evaluated (no judge configured"
        ),
        "{said}"
    );
    let junit = std::fs::read_to_string(out.join("junit.xml")).unwrap();
    assert!(
        junit.contains("could be evaluated (no judge configured"),
        "{junit}"
    );
}
