//! LLM use per role and the run's LLM budget, through the binary: `LLM by role` in the
//! console, `llm_roles` in `summary.json`, and `--max-llm-calls` / `--max-llm-cost`
//! stopping a run gracefully (finished trajectories written, exit code 4), and a scenario's
//! `timeout` bounding its simulated user.

use serde_json::Value;

use super::support::llm::{FakeLlm, Reply, Rule};
use super::*;

fn suite(dir: &Path, base_url: &str) -> PathBuf {
    let path = dir.join("budget.kdl");
    let scenarios: String = (1..=4)
        .map(|i| {
            format!(
                "scenario \"s{i}\" {{\n    description \"Book a cleaning\"\n    max-turns 4\n    \
                 simulate turns=2\n    expect no-error\n}}\n"
            )
        })
        .collect();
    std::fs::write(
        &path,
        format!(
            r#"
agent "booking" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{base_url}" model="m" api-key-env="FAKE_KEY" \
    input-price=1.0 output-price=1.0
simulator provider="fake"
{scenarios}"#
        ),
    )
    .unwrap();
    path
}

fn script() -> Vec<Rule> {
    vec![
        Rule::when(
            "Did it break character",
            [Reply::text(
                r#"{"broke_character": false, "reason": "fine"}"#,
            )],
        ),
        Rule::simulator(
            "Book a cleaning",
            [
                Reply::text("Hi, I need a duct cleaning."),
                Reply::text("It's V4T 0A7."),
            ],
        ),
    ]
}

async fn run(suite: &Path, out: &Path, extra: &[&str]) -> Output {
    trellis()
        .args(["run", "--replace", "-j", "1", "--out"])
        .arg(out)
        .arg(suite)
        .args(extra)
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap()
}

/// `trellis run -j JOBS --max-llm-calls CALLS --out OUT SUITE`, with the fake provider's key.
async fn budgeted(jobs: u32, calls: u32, out: &Path, suite: &Path) -> Output {
    trellis()
        .arg("run")
        .args([
            "-j",
            &jobs.to_string(),
            "--max-llm-calls",
            &calls.to_string(),
            "--out",
        ])
        .arg(out)
        .arg(suite)
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap()
}

fn summary(out: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap()
}

#[tokio::test]
async fn calls_are_counted_per_role_once_each() {
    let fake = FakeLlm::start(script()).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = suite(dir.path(), &fake.base_url());
    let out = dir.path().join("all");
    let o = run(&suite, &out, &[]).await;
    let console = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{console}{}", stderr(&o));
    // Two simulated turns and one fidelity judge per scenario; the builtin booking agent
    // reports its own tokens on each of its 8 turns.
    let roles = &summary(&out)["stats"]["aggregates"]["llm_roles"];
    assert_eq!(roles["simulator"]["calls"], 8, "{roles}");
    assert_eq!(roles["judge"]["calls"], 4, "{roles}");
    assert_eq!(roles["agent"]["calls"], 8, "{roles}");
    assert_eq!(fake.calls(), 12);
    assert!(
        roles["judge"]["cost"].as_f64().is_some_and(|c| c > 0.0),
        "{roles}"
    );
    assert!(
        console.contains("LLM by role: agent 8 calls") && console.contains("judge 4 calls"),
        "{console}"
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("LLM calls by role"));
}

#[tokio::test]
async fn a_call_budget_stops_the_run_gracefully_and_keeps_what_finished() {
    let fake = FakeLlm::start(script()).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = suite(dir.path(), &fake.base_url());
    let out = dir.path().join("calls");
    // Two simulated turns and the fidelity judge: 3 is reached within the first scenario.
    // The booking agent's report of its own model's tokens is shown, not budgeted.
    let o = run(&suite, &out, &["--max-llm-calls", "3"]).await;
    let (console, err) = (stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(4), "{console}{err}");
    assert!(
        err.contains("the run stopped early: --max-llm-calls 3 reached"),
        "{err}"
    );
    let s = summary(&out);
    let counts = &s["stats"]["aggregates"]["counts"];
    let recorded = counts["trajectories"].as_u64().unwrap();
    assert!(recorded < 4, "{counts}");
    assert!(
        console.contains("of 4 planned (the run was stopped)"),
        "{console}"
    );
    // No call started after the budget was reached but those already in flight (-j 1).
    let journal = journal_text(&out);
    assert!(journal.contains("\"stopped_by\":\"--max-llm-calls 3 reached"));
    let roles = &s["stats"]["aggregates"]["llm_roles"];
    let sent: u64 = ["simulator", "judge"]
        .iter()
        .filter_map(|r| roles[r]["calls"].as_u64())
        .sum();
    assert_eq!(sent, 3, "{roles}");
    assert_eq!(fake.calls(), 3);
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("The run stopped early: --max-llm-calls 3 reached"));
}

#[tokio::test]
async fn a_cost_budget_stops_the_run_and_bad_budgets_are_usage_errors() {
    let fake = FakeLlm::start(script()).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = suite(dir.path(), &fake.base_url());
    let out = dir.path().join("cost");
    // Any priced simulator call costs more than this.
    let o = run(&suite, &out, &["--max-llm-cost", "0.000001"]).await;
    assert_eq!(o.status.code(), Some(4), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("--max-llm-cost 0.000001 reached"),
        "{}",
        stderr(&o)
    );

    for bad in [
        "--max-llm-calls=0",
        "--max-llm-calls=many",
        "--max-llm-cost=-1",
        "--max-llm-cost=NaN",
    ] {
        let o = run(&suite, &dir.path().join("bad"), &[bad]).await;
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        let flag = bad.split('=').next().unwrap_or_default();
        assert!(stderr(&o).contains(flag), "{}", stderr(&o));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_started_together_never_pass_the_call_budget() {
    // Every simulated user asks at once, and the model takes its time: counting calls only
    // as answers came back let all of them through.
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::slow(
        std::time::Duration::from_millis(300),
        Reply::text("Hi, I need a duct cleaning."),
    )])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "booking" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="m" api-key-env="FAKE_KEY"
simulator provider="fake"
scenario "many" {{
    description "Book a cleaning"
    repeat 20
    simulate turns=1
    expect no-error
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = budgeted(20, 2, &out, &path).await;
    assert_eq!(o.status.code(), Some(4), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 2, "calls sent past --max-llm-calls 2");
    assert!(
        stderr(&o).contains("--max-llm-calls 2 reached (2 calls sent)"),
        "{}",
        stderr(&o)
    );
    let roles = &summary(&out)["stats"]["aggregates"]["llm_roles"];
    assert_eq!(roles["simulator"]["calls"], 2, "{roles}");
}

/// A suite of one scenario run `repeat` times, each turn judged by the fake endpoint.
fn judged_suite(dir: &Path, base_url: &str, repeat: u32) -> PathBuf {
    let path = dir.join("judged.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "booking" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{base_url}" model="m" api-key-env="FAKE_KEY"
judge "j" provider="fake"
scenario "many" {{
    repeat {repeat}
    user "Hi, I'd like to book a duct cleaning."
    expect judge "The agent asks for the postal code"
}}
"#
        ),
    )
    .unwrap();
    path
}

/// Judge calls admitted before the budget ran out finish: they were sent and paid for, and
/// abandoning them (the run stops as the next call is refused) left every check unjudged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn judge_calls_in_flight_at_the_budget_finish_and_count() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::slow(
        std::time::Duration::from_millis(300),
        Reply::text(r#"{"score": 0.9, "label": "ok", "justification": "fine"}"#),
    )])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = judged_suite(dir.path(), &fake.base_url(), 12);
    let out = dir.path().join("out");
    let o = budgeted(12, 4, &out, &path).await;
    assert_eq!(o.status.code(), Some(4), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 4);
    let c = read_parquet(&out.join("criteria.parquet"));
    let passed = strings(&c, "status")
        .iter()
        .filter(|s| s.as_deref() == Some("passed"))
        .count();
    assert_eq!(passed, 4, "every admitted judge call answered its check");
    let roles = &summary(&out)["stats"]["aggregates"]["llm_roles"];
    assert_eq!(roles["judge"]["calls"], 4, "{roles}");
    // The trajectories count the calls made, as the run does: a call the budget refused
    // is none (each refused check counted one).
    let t = read_parquet(&out.join("trajectories.parquet"));
    let calls: u64 = t
        .column("llm_calls")
        .unwrap()
        .u64()
        .unwrap()
        .iter()
        .flatten()
        .sum();
    assert_eq!(calls, 4, "{t}");
    // A refused check keeps its judge's settings, as any judged check (only its call is
    // none).
    let c = read_parquet(&out.join("criteria.parquet"));
    assert!(
        strings(&c, "judge").iter().all(Option::is_some),
        "a refused check lost its judge: {c}"
    );

    // Resumed, the run judges the rest; its calls by role count the first attempt's too.
    let o = trellis()
        .args(["run", "-j", "12", "--resume"])
        .arg(&out)
        .arg(&path)
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 12);
    let roles = &summary(&out)["stats"]["aggregates"]["llm_roles"];
    assert_eq!(roles["judge"]["calls"], 12, "{roles}");
}

/// `rejudge` of a run the budget stopped judges the checks it left unjudged: their turns are
/// all in the journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejudge_judges_the_checks_a_budget_left_unjudged() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::text(
        r#"{"score": 0.9, "label": "ok", "justification": "fine"}"#,
    )])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = judged_suite(dir.path(), &fake.base_url(), 6);
    let out = dir.path().join("out");
    let o = budgeted(6, 2, &out, &path).await;
    assert_eq!(o.status.code(), Some(4), "{}{}", stdout(&o), stderr(&o));
    let again = dir.path().join("again");
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
    let recorded = read_parquet(&out.join("trajectories.parquet")).height();
    let unjudged = strings(&read_parquet(&out.join("criteria.parquet")), "status")
        .iter()
        .filter(|s| s.as_deref() == Some("skipped"))
        .count();
    assert!(unjudged > 0, "the budget left some check unjudged");
    let statuses = strings(&read_parquet(&again.join("criteria.parquet")), "status");
    assert_eq!(
        statuses
            .iter()
            .filter(|s| s.as_deref() == Some("passed"))
            .count(),
        recorded,
        "{statuses:?} {}{}",
        stdout(&o),
        stderr(&o)
    );
    // Every planned trajectory was recorded and only judging was cut: once rejudged, the
    // run covers its plan (it said "stopped before its work was done" for ever).
    assert_eq!(recorded, 6);
    let junit = std::fs::read_to_string(again.join("junit.xml")).unwrap();
    assert!(!junit.contains("the run covers its plan"), "{junit}");
}

#[tokio::test]
async fn an_agents_own_model_use_is_not_an_llm_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain.kdl");
    // The builtin booking agent reports its model's tokens on every turn; the run makes no
    // LLM call of its own.
    std::fs::write(
        &path,
        "agent \"booking\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"s\" {\n    repeat 3\n    user \"hi\"\n    expect no-error\n}\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = run(&path, &out, &["--max-llm-calls", "1"]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let roles = &summary(&out)["stats"]["aggregates"]["llm_roles"];
    assert_eq!(roles["agent"]["calls"], 3, "{roles}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scenarios_timeout_bounds_its_simulated_user_too() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::slow(
        std::time::Duration::from_secs(5),
        Reply::text("Hi, I need a duct cleaning."),
    )])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("slow-user.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "booking" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="m" api-key-env="FAKE_KEY"
simulator provider="fake"
scenario "slow-user" {{
    description "Book a cleaning"
    timeout "500ms"
    simulate turns=3
    expect no-error
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let o = run(&path, &dir.path().join("out"), &[]).await;
    let console = stdout(&o);
    // "Limit for the whole trajectory": not three simulated turns of 5 s each, passed.
    assert_eq!(o.status.code(), Some(1), "{console}{}", stderr(&o));
    assert!(started.elapsed() < std::time::Duration::from_secs(4));
    assert!(console.contains("simulator fault"), "{console}");
    assert!(console.contains("trajectory timeout"), "{console}");
}

#[tokio::test]
async fn a_model_under_test_is_budgeted_request_by_request_tool_rounds_included() {
    // Each turn asks for a tool, then answers: two requests a turn.
    let fake = FakeLlm::start(vec![
        Rule::when(
            "book please",
            [Reply::tool_call("lookup", serde_json::json!({}))],
        ),
        Rule::otherwise([Reply::text("Booked.")]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "model" protocol="openai" base-url="{}" model="m"
scenario "s" {{
    repeat 4
    user "book please"
    expect no-error
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    // Unbounded: 8 requests, each counted.
    let out = dir.path().join("all");
    let o = run(&path, &out, &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 8);
    let roles = &summary(&out)["stats"]["aggregates"]["llm_roles"];
    assert_eq!(roles["agent"]["calls"], 8, "{roles}");

    // Exactly the requests the run needs: reached with the last one, which cut nothing
    // off, so the run is complete and its verdict is its checks'.
    let out = dir.path().join("exact");
    let o = run(&path, &out, &["--max-llm-calls", "8"]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 16);
    let aggregates = &summary(&out)["stats"]["aggregates"];
    assert_eq!(aggregates["interrupted"], false, "{aggregates}");
    assert!(!stderr(&o).contains("stopped early"), "{}", stderr(&o));

    // Four requests allowed: two turns finish, and no request past the fourth is sent.
    let out = dir.path().join("bounded");
    let o = run(&path, &out, &["--max-llm-calls", "4"]).await;
    assert_eq!(o.status.code(), Some(4), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 20, "requests sent past --max-llm-calls 4");
    assert!(
        stderr(&o).contains("--max-llm-calls 4 reached (4 calls sent)"),
        "{}",
        stderr(&o)
    );
    let roles = &summary(&out)["stats"]["aggregates"]["llm_roles"];
    assert_eq!(roles["agent"]["calls"], 4, "{roles}");
    assert_eq!(summary(&out)["stats"]["aggregates"]["interrupted"], true);
    // The trajectory whose request was refused is not recorded as the agent's error.
    let t = read_parquet(&out.join("trajectories.parquet"));
    let statuses: Vec<Option<String>> = strings(&t, "status");
    assert_eq!(statuses.len(), 2, "{statuses:?}");
    assert!(
        statuses.iter().all(|s| s.as_deref() == Some("passed")),
        "{statuses:?}"
    );
    // `show` says the run stopped, not only that nothing failed.
    let o = trellis().arg("show").arg(&out).output().await.unwrap();
    let shown = stdout(&o);
    assert!(
        shown.contains("the run stopped before its end (")
            && shown.contains("): 2 of 4 planned trajectories recorded"),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_judge_the_budget_refused_leaves_the_run_stopped_not_complete() {
    // Two trajectories judged at once, the judge slow: the first call holds the one place,
    // the second is refused. Every unit started; the refused check is work not done.
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::slow(
        std::time::Duration::from_millis(300),
        Reply::text(r#"{"score": 1.0, "justification": "polite"}"#),
    )])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("judged.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "booking" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="m" api-key-env="FAKE_KEY"
judge "main" provider="fake"
scenario "s" {{
    repeat 2
    user "Hi, I'd like to book a duct cleaning."
    expect judge "the agent is polite"
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = budgeted(2, 1, &out, &path).await;
    assert_eq!(o.status.code(), Some(4), "{}{}", stdout(&o), stderr(&o));
    // The admitted call may itself be abandoned as the run stops; never more than one.
    assert!(fake.calls() <= 1, "{}", fake.calls());
    let aggregates = &summary(&out)["stats"]["aggregates"];
    assert_eq!(aggregates["interrupted"], true, "{aggregates}");
    // Every planned trajectory has its record: the stop cut one short, and no agent forked
    // (the console and JUnit said "with those its agents forked beyond the 2 planned").
    let said = format!(
        "{}{}{}",
        stdout(&o),
        stderr(&o),
        std::fs::read_to_string(out.join("junit.xml")).unwrap()
    );
    assert!(!said.contains("forked"), "{said}");
    assert!(
        said.contains("(the run was stopped: some were cut short)"),
        "{said}"
    );
    assert!(
        said.contains("all 2 planned trajectories recorded, some of them cut short"),
        "{said}"
    );
}

/// A panel one of whose members the budget refused is not judged, as a single judge the
/// budget refused is not: its check `skipped` (`budget`), the trajectory `skipped` with the
/// stop's reason, and `rejudge` or `--resume` judges it. It was the panel's `error` and the
/// trajectory's: an agent error, failing the gate, for an agent that passed everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panel_member_the_budget_refused_leaves_the_check_unjudged_not_an_error() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::text(
        r#"{"score": 1.0, "justification": "polite"}"#,
    )])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("panel.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "booking" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="m" api-key-env="FAKE_KEY"
judge "ja" provider="fake"
judge "jb" provider="fake"
panel "pm" {{
    judges "ja" "jb"
}}
scenario "s" {{
    user "Hi, I'd like to book a duct cleaning."
    expect judge "the agent is polite" judge="pm"
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = budgeted(1, 1, &out, &path).await;
    assert_eq!(o.status.code(), Some(4), "{}{}", stdout(&o), stderr(&o));
    let criteria = read_parquet(&out.join("criteria.parquet"));
    assert_eq!(strings(&criteria, "status"), [Some("skipped".to_string())]);
    assert_eq!(
        strings(&criteria, "judge_error_category"),
        [Some("budget".to_string())]
    );
    let detail = strings(&criteria, "detail");
    assert!(
        detail[0]
            .as_deref()
            .is_some_and(|d| d.starts_with("not checked: not sent: --max-llm-calls 1 reached")),
        "{detail:?}"
    );
    let trajectories = read_parquet(&out.join("trajectories.parquet"));
    assert_eq!(
        strings(&trajectories, "status"),
        [Some("skipped".to_string())]
    );
    assert!(!stdout(&o).contains("ERROR"), "{}", stdout(&o));
}

/// Once the budget is spent, a judge whose answer is in the LLM cache still answers: a cache
/// hit is no call ("cache hits do not count"). The check was left "not checked" and the run
/// exited 4, though nothing more would have been sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn judge_answers_in_the_cache_are_used_after_the_budget_is_spent() {
    let fake = FakeLlm::start(vec![
        Rule::when(
            "The agent answers",
            [Reply::text(
                r#"{"score": 0.9, "label": "ok", "justification": "fine"}"#,
            )],
        ),
        Rule::otherwise([Reply::text("Booked.")]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cached.kdl");
    std::fs::write(
        &path,
        format!(
            "provider \"fake\" kind=\"openai\" base-url=\"{0}\" model=\"m\" api-key-env=\"FAKE_KEY\"\n\
             judge \"j\" provider=\"fake\"\n\
             agent \"model\" protocol=\"openai\" base-url=\"{0}\" model=\"m\"\n\
             scenario \"s\" {{\n    user \"book please\"\n    expect judge \"The agent answers\"\n}}\n",
            fake.base_url()
        ),
    )
    .unwrap();
    let cache = dir.path().join("cache");
    let cache_args = ["--llm-cache", cache.to_str().unwrap()];
    let o = run(&path, &dir.path().join("first"), &cache_args).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    // The agent's call and the judge's.
    assert_eq!(fake.calls(), 2);

    // The agent (never answered from the cache) spends the one call allowed; the judge's
    // answer is the cache's.
    let mut args = cache_args.to_vec();
    args.extend(["--max-llm-calls", "1"]);
    let out = dir.path().join("second");
    let o = run(&path, &out, &args).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 3);
    let c = read_parquet(&out.join("criteria.parquet"));
    assert_eq!(strings(&c, "status"), [Some("passed".to_owned())], "{c}");
}

/// `count` scenarios of one user turn each, judged once, by a provider whose every input
/// token costs 1 (so a judge call costs a few hundred).
fn priced_suite(dir: &Path, base_url: &str, count: u32) -> PathBuf {
    let path = dir.join("priced.kdl");
    let scenarios: String = (1..=count)
        .map(|i| {
            format!(
                "scenario \"c{i}\" {{\n    user \"Hi, I'd like to book a duct cleaning.\"\n    \
                 criteria {{\n        judge \"The agent asks for the postal code\"\n    }}\n}}\n"
            )
        })
        .collect();
    std::fs::write(
        &path,
        format!(
            r#"
agent "booking" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{base_url}" model="m" api-key-env="FAKE_KEY" \
    input-price=1000000 output-price=0
judge "j" provider="fake"
{scenarios}"#
        ),
    )
    .unwrap();
    path
}

fn slow_verdict() -> Vec<Rule> {
    vec![Rule::otherwise([Reply::slow(
        std::time::Duration::from_millis(300),
        Reply::text(r#"{"score": 0.9, "label": "ok", "justification": "fine"}"#),
    )])]
}

/// Thirty judges asked at once, each dearer than the whole `--max-llm-cost`: all thirty were
/// sent before the first answer said what they cost, and the run, nothing refused, exited 0
/// saying nothing of the limit it passed thirty times over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_budget_holds_calls_started_together_and_stops_the_run() {
    let fake = FakeLlm::start(slow_verdict()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = priced_suite(dir.path(), &fake.base_url(), 30);
    let out = dir.path().join("out");
    let o = trellis()
        .args(["run", "-j", "30", "--max-llm-cost", "5", "--out"])
        .arg(&out)
        .arg(&path)
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    let (console, err) = (stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(4), "{console}{err}");
    // Alone, the first call goes whatever it may cost; it spends the budget, and no call
    // is sent after it.
    assert_eq!(fake.calls(), 1, "{console}{err}");
    assert!(
        err.contains("the run stopped early: --max-llm-cost 5 reached"),
        "{err}"
    );
    assert!(journal_text(&out).contains("\"stopped_by\":\"--max-llm-cost 5 reached"));
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("The run stopped early: --max-llm-cost 5 reached"));
    let roles = &summary(&out)["stats"]["aggregates"]["llm_roles"];
    assert_eq!(roles["judge"]["calls"], 1, "{roles}");
}

/// Calls in flight reserve what they may cost: with room for three and a half calls, three
/// go at once, a fourth alone once they have answered, and the run stops having passed the
/// limit by less than one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_budget_is_passed_by_at_most_one_call() {
    let fake = FakeLlm::start(slow_verdict()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = priced_suite(dir.path(), &fake.base_url(), 12);
    // What one call costs (the scenarios' judge requests are alike).
    let all = dir.path().join("all");
    let o = run(&path, &all, &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let judge = &summary(&all)["stats"]["aggregates"]["llm_roles"]["judge"];
    assert_eq!(judge["calls"], 12, "{judge}");
    let one = judge["cost"].as_f64().unwrap() / 12.0;
    assert!(one > 1.0, "{judge}");

    let limit = one * 3.5;
    let out = dir.path().join("out");
    let o = trellis()
        .args([
            "run",
            "-j",
            "12",
            "--max-llm-cost",
            &limit.to_string(),
            "--out",
        ])
        .arg(&out)
        .arg(&path)
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    let (console, err) = (stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(4), "{console}{err}");
    assert_eq!(fake.calls(), 12 + 4, "{console}{err}");
    let judge = &summary(&out)["stats"]["aggregates"]["llm_roles"]["judge"];
    let spent = judge["cost"].as_f64().unwrap();
    assert!(
        spent < limit + one,
        "spent {spent} of {limit}, one call {one}"
    );
    assert!(err.contains("--max-llm-cost"), "{err}");
}

/// Every request sent is one against `--max-llm-calls`: a judge's schema fallback (a 400 to
/// `response_format`, then asked without it) and another's retried 500s sent 8 requests
/// under `--max-llm-calls 4`, and the console said "judge 4 calls". The run's count by role
/// and the trajectories' `llm_calls` now both count requests sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_and_the_schema_fallback_count_against_the_call_budget() {
    let verdict = r#"{"score": 0.9, "label": "ok", "justification": "fine"}"#;
    let fake = FakeLlm::start(vec![
        Rule::when(
            "JH-400 first",
            [Reply::NoStructuredOutput(Box::new(Reply::text(verdict)))],
        ),
        Rule::when(
            "JF-500 second",
            [Reply::Status(500, "overloaded".to_owned())],
        ),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("retried.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "booking" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="m" api-key-env="FAKE_KEY" retries=2
judge "j" provider="fake" threshold=0.5
scenario "a" {{
    user "Hi, I'd like to book a duct cleaning."
    expect judge "JH-400 first"
    expect judge "JF-500 second"
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let llm_calls = |out: &Path| -> u64 {
        let t = read_parquet(&out.join("trajectories.parquet"));
        t.column("llm_calls")
            .unwrap()
            .u64()
            .unwrap()
            .iter()
            .flatten()
            .sum()
    };

    // Unbounded: 2 requests for the first judge, 3 + 3 for the second; every count says 8.
    let all = dir.path().join("all");
    let o = run(&path, &all, &[]).await;
    let console = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{console}{}", stderr(&o));
    assert_eq!(fake.calls(), 8);
    let roles = &summary(&all)["stats"]["aggregates"]["llm_roles"];
    assert_eq!(roles["judge"]["calls"], 8, "{roles}");
    assert_eq!(llm_calls(&all), 8);
    assert!(console.contains("judge 8 calls"), "{console}");

    // Four allowed: the fifth request, whichever judge's retry it is, is not sent.
    let out = dir.path().join("bounded");
    let o = run(&path, &out, &["--max-llm-calls", "4"]).await;
    let (console, err) = (stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(4), "{console}{err}");
    assert_eq!(fake.calls(), 8 + 4, "requests sent past --max-llm-calls 4");
    assert!(
        err.contains("the run stopped early: --max-llm-calls 4 reached (4 calls sent)"),
        "{err}"
    );
    let roles = &summary(&out)["stats"]["aggregates"]["llm_roles"];
    assert_eq!(roles["judge"]["calls"], 4, "{roles}");
    assert_eq!(llm_calls(&out), 4);
    // The judge whose retry was refused ends as a refused call does: not checked.
    let c = read_parquet(&out.join("criteria.parquet"));
    let details = strings(&c, "detail");
    assert!(
        details
            .iter()
            .flatten()
            .any(|d| d.contains("not checked: not sent: --max-llm-calls 4 reached")),
        "{details:?}"
    );
}

/// A judge whose ask with its schema is refused (400) and whose ask without it is the
/// cache's: one request sent and one answer from the cache, two in the run's count by role.
/// The trajectory counted the call as one (a cache hit, its request sent forgotten), so
/// `trajectories.llm_calls` summed to less than `llm_roles`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_fallback_answered_from_the_cache_counts_its_request_too() {
    let verdict = r#"{"score": 0.9, "label": "ok", "justification": "fine"}"#;
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::NoStructuredOutput(
        Box::new(Reply::text(verdict)),
    )])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fallback.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "booking" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="m" api-key-env="FAKE_KEY"
judge "j" provider="fake" threshold=0.5
scenario "a" {{
    user "Hi, I'd like to book a duct cleaning."
    expect judge "The agent answers"
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let cache = dir.path().join("cache");
    let cache_args = ["--llm-cache", cache.to_str().unwrap()];
    let counts = |out: &Path| -> (u64, u64, serde_json::Value) {
        let t = read_parquet(&out.join("trajectories.parquet"));
        let sum = |column: &str| -> u64 {
            t.column(column)
                .unwrap()
                .u64()
                .unwrap()
                .iter()
                .flatten()
                .sum()
        };
        let judge = summary(out)["stats"]["aggregates"]["llm_roles"]["judge"].clone();
        (sum("llm_calls"), sum("llm_cache_hits"), judge)
    };

    let first = dir.path().join("first");
    let o = run(&path, &first, &cache_args).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 2, "the ask with the schema, then without");
    let (calls, hits, judge) = counts(&first);
    assert_eq!((calls, hits), (2, 0));
    assert_eq!(judge["calls"], 2, "{judge}");

    // The ask with the schema is sent again (a refusal is not cached); the one without it
    // is the cache's.
    let second = dir.path().join("second");
    let o = run(&path, &second, &cache_args).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 3);
    let (calls, hits, judge) = counts(&second);
    assert_eq!(judge["calls"], 2, "{judge}");
    assert_eq!(
        (calls, hits),
        (2, 1),
        "trajectories.llm_calls against llm_roles {judge}"
    );
}

/// A 429 waited out is sent again: that request is one more against the budget.
#[tokio::test]
async fn a_rate_limited_resend_counts_against_the_call_budget() {
    let fake = FakeLlm::start(vec![Rule::otherwise([
        Reply::rate_limited("0"),
        Reply::text(r#"{"score": 0.9, "label": "ok", "justification": "fine"}"#),
    ])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = judged_suite(dir.path(), &fake.base_url(), 1);
    let out = dir.path().join("out");
    let o = run(&path, &out, &["--max-llm-calls", "1"]).await;
    assert_eq!(o.status.code(), Some(4), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fake.calls(), 1, "the re-send went past --max-llm-calls 1");
    let roles = &summary(&out)["stats"]["aggregates"]["llm_roles"];
    assert_eq!(roles["judge"]["calls"], 1, "{roles}");
}

/// Ctrl-C while simulated users waited for room under `--max-llm-cost`: the console said no
/// new call starts, yet once the request in flight answered, the next waiting one was sent
/// (3.5 s after the signal in the reviewer's run). A request waiting for room now wakes at the
/// stop and is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_refuses_requests_waiting_for_cost_room() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::slow(
        std::time::Duration::from_secs(2),
        Reply::text("Hi, I need a duct cleaning."),
    )])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("waiting.kdl");
    // Each simulator request reserves most of 1 (its prompt and output cap at 1000 per
    // million): under 1.5 a few are in flight and the others wait.
    std::fs::write(
        &path,
        format!(
            r#"
agent "booking" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{}" model="m" api-key-env="FAKE_KEY" \
    input-price=1000 output-price=1000
simulator provider="fake"
scenario "s" {{
    description "Book a cleaning"
    repeat 8
    simulate turns=2
    expect no-error
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let child = trellis()
        .args(["run", "-j", "8", "--max-llm-cost", "1.5", "--out"])
        .arg(dir.path().join("out"))
        .arg(&path)
        .env("FAKE_KEY", "k")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while fake.calls() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no simulator was asked"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Whatever was admitted together has arrived; the first answer is well over a second
    // away.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let before = fake.calls();
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on a child process id this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let o = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the run did not end after the signal")
        .unwrap();
    assert_eq!(o.status.code(), Some(130), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(
        fake.calls(),
        before,
        "requests sent after the stop: {}",
        stderr(&o)
    );
    assert!(
        before < 8,
        "no request waited for room: {before} sent at once"
    );
}

/// Two turns of a priced model agent, the second held for cost room until the first had
/// answered: its wait counted as the model's latency (a turn of a one-second model failed
/// `expect latency max="1500ms"` at two seconds) and against the scenario's `timeout`.
/// Waiting for the budget is as waiting for a provider's limits: not the agent's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_cost_room_is_neither_latency_nor_the_trajectorys_time() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::slow(
        std::time::Duration::from_secs(1),
        Reply::text("Hello, how can I help?"),
    )])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.kdl");
    // Each request reserves a little over 1 (its output cap of 1000 tokens and its prompt at
    // 1000 per million) and costs a few hundredths: under 1.5 the second waits for the first.
    std::fs::write(
        &path,
        format!(
            r#"
provider "fake" kind="openai" base-url="{}" model="m" api-key-env="FAKE_KEY" \
    max-tokens=1000 input-price=1000 output-price=1000
agent "bot" protocol="openai" provider="fake" system-prompt="You book duct cleanings."
scenario "s" {{
    repeat 2
    timeout "1800ms"
    user "hi"
    expect latency max="1500ms"
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .args(["run", "-j", "2", "--max-llm-cost", "1.5", "--out"])
        .arg(&out)
        .arg(&path)
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    let (console, err) = (stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(0), "{console}{err}");
    assert_eq!(fake.calls(), 2);
    assert_eq!(fake.max_in_flight(), 1, "the second did not wait for room");
    let turns = read_parquet(&out.join("turns.parquet"));
    let latencies: Vec<f64> = turns
        .column("latency_ms")
        .unwrap()
        .f64()
        .unwrap()
        .iter()
        .flatten()
        .collect();
    assert_eq!(latencies.len(), 2, "{turns}");
    assert!(
        latencies.iter().all(|ms| *ms < 1500.0),
        "{latencies:?}: the wait for room counted"
    );
}

/// Tool arguments a model double-encodes (a JSON string of an object) name no parameter:
/// they do not get past the tool's policy or its required parameter as a call with none.
/// The tool does not run and the model is told why, as for arguments that are not JSON.
#[tokio::test]
async fn tool_arguments_that_are_no_object_do_not_get_past_a_policy() {
    let fake = FakeLlm::start(vec![
        Rule::when(
            "refund please",
            [Reply::tool_call(
                "refund",
                serde_json::json!("{\"amount\": 100}"),
            )],
        ),
        Rule::otherwise([Reply::text("Done.")]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.kdl");
    std::fs::write(
        &path,
        format!(
            r#"
agent "model" protocol="openai" base-url="{}" model="m" {{
    tools "refund"
}}
tool "refund" {{
    param "amount" type="number" required=#true
    policy "amount" max=50
}}
scenario "s" {{
    user "refund please"
    expect no-error
}}
"#,
            fake.base_url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = run(&path, &out, &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let journal = journal_text(&out);
    assert!(
        journal.contains("not an object of named parameters: it did not run"),
        "{journal}"
    );
    assert!(!journal.contains("Executed refund"), "{journal}");
}
