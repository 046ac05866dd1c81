//! `user` steps on a Fixie agent: the fake LLM endpoint (over real sockets) plays Fixie's LLM
//! in the few-shot loop against the builtin `numbers` agent, through the executor.

use trellis_engine::llm::{CacheMode, CacheUse, LlmCache};
use trellis_engine::record::{FaultCategory, TrajectoryStatus, TurnRecord};
use trellis_engine::render::EnvSnapshot;

use crate::support::llm::{FakeLlm, Reply, Rule};
use crate::support::{Run, run_suite, run_suite_with_cache};

fn suite(base_url: &str, scenarios: &str) -> String {
    format!(
        r#"
agent "numbers" protocol="fixie" builtin="numbers"
provider "fake" kind="openai" base-url="{base_url}" model="fixie-model"
{scenarios}
"#
    )
}

const SUMS: &str = r#"
scenario "sums" {
    user "What is 2 plus 3, plus 10?"
    expect reply contains="15"
    expect tool "add" text="5, 10"
    user "Roll a die."
    expect reply contains="rolled"
    criteria { no-error; }
}
"#;

/// A model that adds twice (guessing a result after its second call, which must be
/// ignored), answers, then rolls a die.
fn adder() -> Vec<Rule> {
    vec![
        Rule::when("Q: What is 2 plus 3", [Reply::text("Ask Func[add]: 2, 3")]),
        Rule::when(
            "Func[add] says: 5",
            [Reply::text(
                "Ask Func[add]: 5, 10\nFunc[add] says: 99\nA: 99",
            )],
        ),
        Rule::when(
            "Func[add] says: 15",
            [Reply::text("A: 2 plus 3 is 5, and 5 plus 10 is 15.")],
        ),
        Rule::when("Q: Roll a die.", [Reply::text("Ask Func[genrand]: 1, 6")]),
        Rule::when("Func[genrand] says:", [Reply::text("A: You rolled it.")]),
    ]
}

fn turns(run: &Run) -> Vec<&TurnRecord> {
    run.nodes
        .iter()
        .flat_map(|n| &n.turns)
        .map(|t| &**t)
        .collect()
}

#[tokio::test]
async fn user_steps_run_the_few_shot_loop_with_real_function_calls() {
    let fake = FakeLlm::start(adder()).await;
    let dir = tempfile::tempdir().unwrap();
    let text = suite(&fake.base_url(), SUMS);
    let run = run_suite_with_cache(
        &text,
        4,
        EnvSnapshot::new(),
        LlmCache::new(dir.path(), CacheMode::ReadWrite),
    )
    .await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Passed, "{t:#?}");
    let turns = turns(&run);
    assert_eq!(turns.len(), 2);
    let first = turns[0];
    assert_eq!(
        first.reply.as_deref(),
        Some("2 plus 3 is 5, and 5 plus 10 is 15.")
    );
    // Both calls really reached the agent: its answers, not the model's guess of 99.
    let calls: Vec<(&str, &str, Option<&str>)> = first
        .tool_calls
        .iter()
        .map(|c| (c.name.as_str(), c.arguments.as_str(), c.result.as_deref()))
        .collect();
    assert_eq!(
        calls,
        [
            ("add", r#"{"text":"2, 3"}"#, Some("5")),
            ("add", r#"{"text":"5, 10"}"#, Some("15")),
        ]
    );
    let labels: Vec<&str> = first.exchanges.iter().map(|e| e.label.as_str()).collect();
    assert_eq!(labels, ["POST /add", "POST /add"]);
    assert_eq!(first.llm.len(), 3, "one LLM call per round");
    assert_eq!(first.provider.as_deref(), Some("fake"));
    assert_eq!(first.model.as_deref(), Some("fixie-model"));
    let rolled = turns[1].tool_calls[0].result.as_deref().unwrap();
    assert!(
        matches!(rolled, "1" | "2" | "3" | "4" | "5" | "6"),
        "{rolled}"
    );
    assert_eq!(t.llm.as_deref().map(|u| u.calls), Some(5));
    assert_eq!(fake.calls(), 5);

    // The model was given the agent's base prompt and few-shots, and the second query came
    // after the whole first exchange.
    let seen = fake.seen();
    let system = seen[0].body["messages"][0]["content"].as_str().unwrap();
    for needle in [
        "Func[add]",
        "A: The random number is 17.",
        "Ask Func[NAME]: INPUT",
    ] {
        assert!(system.contains(needle), "{needle} missing from:\n{system}");
    }
    let fourth: Vec<&str> = seen[3].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        &fourth[1..],
        [
            "Q: What is 2 plus 3, plus 10?",
            "Ask Func[add]: 2, 3",
            "Func[add] says: 5",
            "Ask Func[add]: 5, 10",
            "Func[add] says: 15",
            "A: 2 plus 3 is 5, and 5 plus 10 is 15.",
            "Q: Roll a die.",
        ]
    );

    // A replay answers every round from the cache: the model is not asked again.
    let replay = run_suite_with_cache(
        &text,
        4,
        EnvSnapshot::new(),
        LlmCache::new(dir.path(), CacheMode::ReplayOnly),
    )
    .await;
    assert_eq!(replay.trajectories[0].status, TrajectoryStatus::Passed);
    assert_eq!(fake.calls(), 5);
    let replayed = self::turns(&replay);
    assert!(
        replayed
            .iter()
            .flat_map(|t| &t.llm)
            .all(|c| c.cache == CacheUse::Hit)
    );
    assert_eq!(
        replay.trajectories[0].llm.as_deref().map(|u| u.cache_hits),
        Some(5)
    );
}

#[tokio::test]
async fn broken_model_lines_are_protocol_faults_naming_the_line() {
    let fake = FakeLlm::start(vec![
        Rule::when("Q: Say hi", [Reply::text("Sure thing, hello there!")]),
        Rule::when("Q: Multiply", [Reply::text("Ask Func[multiply]: 2, 3")]),
        Rule::when("Q: Count forever", [Reply::text("Ask Func[add]: 1, 1")]),
        Rule::when("Func[add] says: 2", [Reply::text("Ask Func[add]: 1, 1")]),
    ])
    .await;
    let text = suite(
        &fake.base_url(),
        r#"
scenario "garbage" { user "Say hi"; }
scenario "unknown" { user "Multiply 2 and 3"; }
scenario "endless" { user "Count forever"; }
"#,
    );
    let run = run_suite(&text, 4, EnvSnapshot::new()).await;
    let fault_of = |scenario: &str| {
        let t = run
            .trajectories
            .iter()
            .find(|t| t.scenario == scenario)
            .unwrap();
        assert_eq!(t.status, TrajectoryStatus::Error, "{t:#?}");
        t.fault.clone().unwrap()
    };
    let garbage = fault_of("garbage");
    assert_eq!(garbage.category, FaultCategory::Protocol);
    assert!(
        garbage.message.contains("Sure thing, hello there!"),
        "{}",
        garbage.message
    );
    let unknown = fault_of("unknown");
    assert_eq!(unknown.category, FaultCategory::Protocol);
    assert!(
        unknown.message.contains("Ask Func[multiply]: 2, 3") && unknown.message.contains("add"),
        "{}",
        unknown.message
    );
    let endless = fault_of("endless");
    assert_eq!(endless.category, FaultCategory::Protocol);
    assert!(endless.message.contains("8 times"), "{}", endless.message);
    // The cap counts function calls: every one of them was made and recorded.
    let endless_turn = run
        .nodes
        .iter()
        .filter(|n| n.scenario == "endless")
        .flat_map(|n| &n.turns)
        .next()
        .unwrap();
    assert_eq!(endless_turn.tool_calls.len(), 8);
    assert_eq!(endless_turn.llm.len(), 9);
}

#[tokio::test]
async fn without_a_provider_user_steps_on_fixie_are_skipped_saying_what_to_add() {
    let text = r#"
agent "numbers" protocol="fixie" builtin="numbers"
scenario "sums" { user "What is 2 plus 3?"; }
"#;
    let run = run_suite(text, 4, EnvSnapshot::new()).await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Skipped);
    let why = t.skip_reason.as_deref().unwrap_or_default();
    assert!(why.contains("add a `provider`"), "{why}");
}

#[tokio::test]
async fn a_simulated_user_talks_to_a_fixie_agent_through_the_same_provider() {
    let mut rules = vec![Rule::when(
        "conversation starts",
        [Reply::text("What is 2 plus 3, plus 10?")],
    )];
    rules.extend(adder());
    let fake = FakeLlm::start(rules).await;
    let text = suite(
        &fake.base_url(),
        r#"
simulator provider="fake"
persona "p" type="curious" { description "Asks sums"; }
scenario "simulated" {
    persona "p"
    simulate turns=1
    expect reply contains="15"
}
"#,
    );
    let run = run_suite(&text, 4, EnvSnapshot::new()).await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Passed, "{t:#?}");
    let turns = turns(&run);
    assert_eq!(turns[0].user_message, "What is 2 plus 3, plus 10?");
    assert_eq!(turns[0].simulator.len(), 1);
    assert_eq!(turns[0].llm.len(), 3);
    // The simulator, Fixie's LLM thrice, and the fidelity judge (the lone provider judges):
    // its answer here is no verdict, so the check is recorded as not run. The calls are the
    // requests sent: the judge's unscripted 500 is retried and asked again without its
    // schema, six requests.
    assert_eq!(t.llm.as_deref().map(|u| u.calls), Some(10));
    assert_eq!(fake.calls(), 10);
    let fidelity = t.criteria.iter().find(|c| c.kind == "fidelity");
    assert_eq!(
        fidelity.map(|c| c.status),
        Some(trellis_engine::record::CriterionStatus::Skipped),
        "{t:#?}"
    );
}

#[tokio::test]
async fn a_reused_prefix_is_restored_into_the_transcript_without_asking_the_model_again() {
    use std::sync::Arc;
    use trellis_engine::execute::TurnMemo;
    let mut rules = adder();
    rules.push(Rule::when(
        "Q: And roll two dice.",
        [Reply::text("A: Roll them yourself.")],
    ));
    let fake = FakeLlm::start(rules).await;
    let memo = Arc::new(TurnMemo::new());
    let text = suite(&fake.base_url(), SUMS);
    crate::reuse::run(crate::reuse::plan(&text), &memo, 1).await;
    assert_eq!(fake.calls(), 5);

    // Only the second query changed: the first turn is reused, the model is asked once.
    let changed = text.replace(
        "user \"Roll a die.\"\n    expect reply contains=\"rolled\"",
        "user \"And roll two dice.\"",
    );
    let (nodes, trajectories) = crate::reuse::run(crate::reuse::plan(&changed), &memo, 1).await;
    assert_eq!(
        trajectories[0].status,
        TrajectoryStatus::Passed,
        "{trajectories:#?}"
    );
    let turns: Vec<_> = nodes.iter().flat_map(|n| &n.turns).collect();
    assert!(turns[0].reused);
    assert_eq!(turns[1].reply.as_deref(), Some("Roll them yourself."));
    assert_eq!(fake.calls(), 6);
    let last = fake.seen().pop().unwrap();
    let contents: Vec<&str> = last.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        &contents[1..],
        [
            "Q: What is 2 plus 3, plus 10?",
            "Ask Func[add]: 2, 3",
            "Func[add] says: 5",
            "Ask Func[add]: 5, 10",
            "Func[add] says: 15",
            "A: 2 plus 3 is 5, and 5 plus 10 is 15.",
            "Q: And roll two dice.",
        ]
    );
}
