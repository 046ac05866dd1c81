//! LLM judges in a run: `judge` and `outcome` criteria on turns, trajectories and scenarios,
//! scored by a judge on the fake LLM endpoint over real sockets, against the builtin booking
//! agent.

use trellis_engine::llm::{CacheMode, CacheUse, LlmCache};
use trellis_engine::record::{CriterionRecord, CriterionStatus, TrajectoryStatus};
use trellis_engine::render::EnvSnapshot;

use crate::support::llm::{FakeLlm, Reply, Rule};
use crate::support::{Run, run_suite, run_suite_with_cache};

fn suite(base_url: &str, checks: &str) -> String {
    format!(
        r#"
agent "demo" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{base_url}" model="judge-model" input-price=1.0 output-price=2.0
judge "strict" provider="fake" threshold=0.7
persona "p" type="polite-customer" {{
    description "Homeowner in Metro Vancouver"
    instructions "Answer briefly"
}}
scenario "book" {{
    persona "p"
    user-context {{ postal_code "V4T 0A7" }}
    expect-tool "check_service_area"
    user "Hi, I'd like to book a duct cleaning."
    user "It's V4T 0A7."
    {checks}
}}
"#
    )
}

fn criterion<'a>(run: &'a Run, needle: &str) -> &'a CriterionRecord {
    run.trajectories[0]
        .criteria
        .iter()
        .find(|c| c.criterion.contains(needle))
        .unwrap_or_else(|| panic!("no criterion {needle}: {:#?}", run.trajectories[0].criteria))
}

fn score(score: f64) -> Reply {
    Reply::text(format!(
        r#"{{"score": {score}, "label": "graded", "justification": "because {score}"}}"#
    ))
}

fn judges() -> Vec<Rule> {
    vec![
        Rule::when("TURN-CHECK", [score(0.9)]),
        Rule::when("POLITE-CHECK", [score(0.8)]),
        Rule::when("PERFECT-CHECK", [score(0.2)]),
        Rule::when(
            "Does this expected outcome hold",
            [Reply::text(
                r#"{"passed": true, "justification": "it quoted"}"#,
            )],
        ),
    ]
}

const CHECKS: &str = r#"
    expect judge "TURN-CHECK the agent quotes a price"
    outcome "The agent quotes a price for the cleaning"
    criteria {
        judge "POLITE-CHECK the agent is polite"
        judge "PERFECT-CHECK the agent is perfect" threshold=0.5
    }
"#;

#[tokio::test]
async fn judges_score_turn_trajectory_and_scenario_checks_from_the_whole_transcript() {
    let fake = FakeLlm::start(judges()).await;
    let run = run_suite(&suite(&fake.base_url(), CHECKS), 4, EnvSnapshot::new()).await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Failed, "{:#?}", t.criteria);

    let turn = criterion(&run, "TURN-CHECK");
    assert_eq!(
        (turn.status, turn.turn_index),
        (CriterionStatus::Passed, Some(1))
    );
    let verdict = turn.judge.as_deref().unwrap();
    assert_eq!(
        (verdict.judge.as_str(), verdict.rubric.as_str()),
        ("strict", "generic")
    );
    assert_eq!((verdict.score, verdict.threshold), (Some(0.9), 0.7));
    assert_eq!(verdict.justification.as_deref(), Some("because 0.9"));
    assert_eq!(verdict.call.model, "judge-model");
    assert!(verdict.call.input_tokens.unwrap() > 0);
    assert!(verdict.call.cost.unwrap() > 0.0);

    assert_eq!(
        criterion(&run, "POLITE-CHECK").status,
        CriterionStatus::Passed
    );
    let perfect = criterion(&run, "PERFECT-CHECK");
    assert_eq!(perfect.status, CriterionStatus::Failed);
    assert_eq!(
        perfect.judge.as_deref().unwrap().threshold,
        0.5,
        "the criterion's own"
    );
    assert!(
        perfect
            .detail
            .as_deref()
            .unwrap()
            .contains("score 0.20 < 0.50")
    );

    let outcome = criterion(&run, "quotes a price for the cleaning");
    assert_eq!(
        (outcome.kind.as_str(), outcome.status),
        ("outcome", CriterionStatus::Passed)
    );
    assert_eq!(outcome.judge.as_deref().unwrap().rubric, "outcome");

    // The trajectory sums its judge calls.
    let llm = t.llm.as_deref().unwrap();
    assert_eq!((llm.calls, llm.cache_hits), (4, 0));
    assert!(llm.input_tokens > 0 && llm.cost.unwrap() > 0.0);

    // The judge saw the persona, the user context, the expectations and the tool calls
    // with their results.
    assert_eq!(fake.calls(), 4);
    let prompt = fake
        .seen()
        .into_iter()
        .find(|r| r.last_message().contains("POLITE-CHECK"))
        .unwrap()
        .last_message();
    for needle in [
        "type: polite-customer",
        "Answer briefly",
        "V4T 0A7",
        "- check_service_area {}",
        "The agent quotes a price for the cleaning",
        "AGENT CALLS TOOL check_service_area",
        "TOOL RESULT (check_service_area)",
        "USER: It's V4T 0A7.",
    ] {
        assert!(prompt.contains(needle), "{needle} missing from:\n{prompt}");
    }
}

#[tokio::test]
async fn a_judge_that_fails_or_answers_garbage_makes_the_check_an_error_never_a_pass() {
    let fake = FakeLlm::start(vec![
        Rule::when("GARBAGE-CHECK", [Reply::text("Looks fine to me!")]),
        Rule::when("DOWN-CHECK", [Reply::Status(400, "model not found".into())]),
    ])
    .await;
    let checks = r#"
    criteria {
        judge "GARBAGE-CHECK anything"
        judge "DOWN-CHECK anything"
        tool "check_service_area"
    }
"#;
    let run = run_suite(&suite(&fake.base_url(), checks), 4, EnvSnapshot::new()).await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Error, "{:#?}", t.criteria);
    let garbage = criterion(&run, "GARBAGE-CHECK");
    assert_eq!(garbage.status, CriterionStatus::Error);
    assert!(
        garbage.detail.as_deref().unwrap().contains("unusable"),
        "{garbage:?}"
    );
    let down = criterion(&run, "DOWN-CHECK");
    assert_eq!(down.status, CriterionStatus::Error);
    assert!(
        down.detail.as_deref().unwrap().contains("model not found"),
        "{down:?}"
    );
    // What each failed with, for tables that count judge failures by kind.
    let category = |c: &CriterionRecord| c.judge.as_ref().and_then(|j| j.error_category.clone());
    assert_eq!(category(garbage).as_deref(), Some("unusable_answer"));
    assert_eq!(category(down).as_deref(), Some("http_4xx"));
    assert_eq!(category(criterion(&run, "check_service_area")), None);
    assert_eq!(run.summary.errors, 1);
}

/// A judge that cannot be asked (its provider's key is not set) leaves the check an
/// error that still records which judge, rubric and threshold it was to be judged by,
/// never an empty judge and a threshold of 0.
#[tokio::test]
async fn a_judge_without_its_key_records_who_would_have_judged() {
    let fake = FakeLlm::start(judges()).await;
    let checks =
        "expect judge \"TURN-CHECK a\"\n    criteria { judge \"POLITE-CHECK b\" threshold=0.8; }";
    let text = suite(&fake.base_url(), checks)
        .replace(
            "model=\"judge-model\"",
            "model=\"judge-model\" api-key-env=\"TRELLIS_TEST_NO_SUCH_KEY\"",
        )
        .replace("threshold=0.7", "threshold=0.7 rubric=\"policy_adherence\"");
    let run = run_suite(&text, 4, EnvSnapshot::new()).await;
    for (needle, threshold) in [("TURN-CHECK", 0.7), ("POLITE-CHECK", 0.8)] {
        let c = criterion(&run, needle);
        assert_eq!(c.status, CriterionStatus::Error, "{c:?}");
        assert!(
            c.detail
                .as_deref()
                .unwrap()
                .starts_with("judge unavailable"),
            "{c:?}"
        );
        let verdict = c.judge.as_ref().expect("the verdict says who");
        assert_eq!(verdict.judge, "strict", "{c:?}");
        assert_eq!(verdict.rubric, "policy_adherence", "{c:?}");
        assert_eq!(verdict.threshold, threshold, "{c:?}");
        assert_eq!(verdict.error_category.as_deref(), Some("setup"), "{c:?}");
    }
    assert!(fake.seen().is_empty(), "no judge was asked");
    assert!(
        criterion(&run, "TURN-CHECK")
            .detail
            .as_deref()
            .unwrap()
            .contains("`TRELLIS_TEST_NO_SUCH_KEY` (api-key-env) is not set"),
        "{:?}",
        criterion(&run, "TURN-CHECK")
    );
    // Set but empty (a CI secret a fork's pull request cannot read): said as such.
    let env = EnvSnapshot::from([("TRELLIS_TEST_NO_SUCH_KEY".to_owned(), String::new())]);
    let run = run_suite(&text, 4, env).await;
    let c = criterion(&run, "TURN-CHECK");
    assert!(
        c.detail
            .as_deref()
            .unwrap()
            .contains("`TRELLIS_TEST_NO_SUCH_KEY` (api-key-env) is empty"),
        "{c:?}"
    );
}

#[tokio::test]
async fn a_replay_only_rerun_gives_the_same_records_with_zero_llm_calls() {
    let fake = FakeLlm::start(judges()).await;
    let text = suite(&fake.base_url(), CHECKS)
        .replace("scenario \"book\" {", "scenario \"book\" {\n    repeat 2");
    let dir = tempfile::tempdir().unwrap();
    let first = run_suite_with_cache(
        &text,
        4,
        EnvSnapshot::new(),
        LlmCache::new(dir.path(), CacheMode::ReadWrite),
    )
    .await;
    assert_eq!(fake.calls(), 8, "four judged checks, two repetitions");
    let replay = run_suite_with_cache(
        &text,
        4,
        EnvSnapshot::new(),
        LlmCache::new(dir.path(), CacheMode::ReplayOnly),
    )
    .await;
    assert_eq!(fake.calls(), 8, "nothing sent on the replay");
    let summary = |run: &Run| {
        let mut rows: Vec<_> = run
            .trajectories
            .iter()
            .flat_map(|t| {
                t.criteria.iter().map(move |c| {
                    let j = c.judge.as_deref();
                    (
                        t.repetition,
                        c.criterion.clone(),
                        c.status,
                        c.detail.clone(),
                        j.and_then(|j| j.score).map(|s| s.to_string()),
                        j.map(|j| (j.call.input_tokens, j.call.output_tokens)),
                    )
                })
            })
            .collect();
        rows.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        rows
    };
    assert_eq!(summary(&first), summary(&replay));
    let hits = replay
        .trajectories
        .iter()
        .flat_map(|t| &t.criteria)
        .filter_map(|c| c.judge.as_deref())
        .filter(|j| j.call.cache == CacheUse::Hit)
        .count();
    assert_eq!(hits, 8);

    // A check the cache has never seen is an error that names the call.
    let changed = text.replace(
        "POLITE-CHECK the agent is polite",
        "POLITE-CHECK the agent is kind",
    );
    let miss = run_suite_with_cache(
        &changed,
        4,
        EnvSnapshot::new(),
        LlmCache::new(dir.path(), CacheMode::ReplayOnly),
    )
    .await;
    assert_eq!(fake.calls(), 8);
    let c = criterion(&miss, "is kind");
    assert_eq!(c.status, CriterionStatus::Error);
    let detail = c.detail.as_deref().unwrap();
    assert!(
        detail.contains("cache miss") && detail.contains("book"),
        "{detail}"
    );
}

fn panel_suite(base_url: &str, consensus: &str) -> String {
    format!(
        r#"
agent "demo" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{base_url}" model="m"
judge "a" provider="fake" model="judge-a" threshold=0.5
judge "b" provider="fake" model="judge-b" threshold=0.5
judge "c" provider="fake" model="judge-c" threshold=0.5
panel "trio" consensus="{consensus}" {{ judges "a" "b" "c"; }}
scenario "book" {{
    user "Hi, I'd like to book a duct cleaning."
    criteria {{ judge "PANEL-CHECK helpful" judge="trio"; }}
}}
"#
    )
}

#[tokio::test]
async fn a_panel_decides_by_its_consensus_rule_and_records_its_agreement() {
    // Two judges pass it (0.9, 0.6), one fails it (0.1).
    let rules = || {
        vec![
            Rule::for_model("judge-a", [score(0.9)]),
            Rule::for_model("judge-b", [score(0.6)]),
            Rule::for_model("judge-c", [score(0.1)]),
        ]
    };
    for (consensus, status, panel_score) in [
        ("majority", CriterionStatus::Passed, 2.0 / 3.0),
        ("mean", CriterionStatus::Passed, 1.6 / 3.0),
        ("minimum", CriterionStatus::Failed, 0.1),
        ("unanimous", CriterionStatus::Failed, 2.0 / 3.0),
    ] {
        let fake = FakeLlm::start(rules()).await;
        let run = run_suite(
            &panel_suite(&fake.base_url(), consensus),
            4,
            EnvSnapshot::new(),
        )
        .await;
        let c = criterion(&run, "PANEL-CHECK");
        assert_eq!(c.status, status, "{consensus}: {c:?}");
        let verdict = c.judge.as_deref().unwrap();
        assert_eq!(verdict.judge, "panel:trio");
        assert_eq!(verdict.rubric, "generic", "the members' rubric");
        // One provider, three models: the panel's call is not named after its first member.
        assert_eq!(verdict.call.provider, "fake");
        assert_eq!(verdict.call.model, "mixed");
        assert_eq!(verdict.consensus.as_deref(), Some(consensus));
        assert!(
            (verdict.score.unwrap() - panel_score).abs() < 1e-9,
            "{consensus}"
        );
        let agreement = if status == CriterionStatus::Passed {
            2.0
        } else {
            1.0
        } / 3.0;
        assert!(
            (verdict.agreement.unwrap() - agreement).abs() < 1e-9,
            "{consensus}"
        );
        assert_eq!(verdict.members.len(), 3);
        assert_eq!(fake.calls(), 3, "the judges are called once each");
    }

    // A member that cannot answer makes the panel's check an error, never a pass.
    let fake = FakeLlm::start(vec![
        Rule::for_model("judge-a", [score(0.9)]),
        Rule::for_model("judge-b", [score(0.9)]),
        Rule::for_model("judge-c", [Reply::text("no idea")]),
    ])
    .await;
    let run = run_suite(
        &panel_suite(&fake.base_url(), "majority"),
        4,
        EnvSnapshot::new(),
    )
    .await;
    let c = criterion(&run, "PANEL-CHECK");
    assert_eq!(c.status, CriterionStatus::Error);
    assert!(c.detail.as_deref().unwrap().contains("`c`"), "{c:?}");
    // Its bar is still the members', not 0.
    assert_eq!(c.judge.as_deref().unwrap().threshold, 0.5, "{c:?}");
    assert_eq!(
        c.judge.as_deref().unwrap().error_category.as_deref(),
        Some("unusable_answer"),
        "the failed member's"
    );
}

#[tokio::test]
async fn a_server_without_structured_output_is_asked_again_without_it() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::NoStructuredOutput(
        Box::new(score(0.9)),
    )])])
    .await;
    let checks = r#"criteria { judge "PLAIN-CHECK helpful"; }"#;
    let run = run_suite(&suite(&fake.base_url(), checks), 4, EnvSnapshot::new()).await;
    let c = criterion(&run, "PLAIN-CHECK");
    assert_eq!(c.status, CriterionStatus::Passed, "{c:?}");
    assert_eq!(c.judge.as_deref().unwrap().call.attempts, 2);
    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen[0].body.get("response_format").is_some());
    assert!(seen[1].body.get("response_format").is_none());
}

#[tokio::test]
async fn a_schema_the_server_fails_on_is_dropped_after_the_retries() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::SchemaRejected(
        500,
        Box::new(score(0.9)),
    )])])
    .await;
    let checks = r#"criteria { judge "PLAIN-CHECK helpful"; }"#;
    let run = run_suite(&suite(&fake.base_url(), checks), 4, EnvSnapshot::new()).await;
    let c = criterion(&run, "PLAIN-CHECK");
    assert_eq!(c.status, CriterionStatus::Passed, "{c:?}");
    let seen = fake.seen();
    // The provider's two retries of the 500, then once without the schema.
    assert_eq!(seen.len(), 4);
    assert!(
        seen[..3]
            .iter()
            .all(|s| s.body.get("response_format").is_some())
    );
    assert!(seen[3].body.get("response_format").is_none());
}

/// A judge on an OpenAI reasoning model (o-series, gpt-5), which refuses `max_tokens` and a
/// temperature of 0 by name: each is changed as the answer asks, and the judge answers.
#[tokio::test]
async fn a_judge_on_a_reasoning_model_sends_what_it_takes() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::ReasoningModel(Box::new(
        score(0.9),
    ))])])
    .await;
    let suite = |first: &str, second: &str| {
        format!(
            r#"
agent "demo" protocol="connexity" builtin="booking"
provider "o" kind="openai" base-url="{}" model="gpt-5-reasoning-test"
judge "strict" provider="o"
scenario "book" {{
    user "Hi, I'd like to book a duct cleaning."
    criteria {{ judge "{first} helpful"; judge "{second} polite"; }}
}}
"#,
            fake.base_url()
        )
    };
    let run = run_suite(
        &suite("REASONING-CHECK", "REASONING-AGAIN"),
        1,
        EnvSnapshot::new(),
    )
    .await;
    for needle in ["REASONING-CHECK", "REASONING-AGAIN"] {
        let c = criterion(&run, needle);
        assert_eq!(c.status, CriterionStatus::Passed, "{c:?}");
    }
    let first = fake.seen();
    let last = &first.last().unwrap().body;
    assert!(last.get("max_tokens").is_none(), "{last}");
    assert!(last.get("max_completion_tokens").is_some(), "{last}");
    assert!(last.get("temperature").is_none(), "{last}");
    // Learned: a later run's checks on the same URL and model are sent changed from the
    // start, one request each.
    let run = run_suite(
        &suite("REASONING-LATER", "REASONING-LAST"),
        1,
        EnvSnapshot::new(),
    )
    .await;
    for needle in ["REASONING-LATER", "REASONING-LAST"] {
        let c = criterion(&run, needle);
        assert_eq!(c.status, CriterionStatus::Passed, "{c:?}");
    }
    let later = &fake.seen()[first.len()..];
    assert_eq!(later.len(), 2, "{later:?}");
    for request in later {
        assert!(request.body.get("max_tokens").is_none(), "{}", request.body);
        assert!(
            request.body.get("temperature").is_none(),
            "{}",
            request.body
        );
    }
}
