//! Reusing recorded turns across runs (`RunOptions::reuse`, what `trellis watch` runs with):
//! a conversation that repeats a recorded one is answered from the records, and the agent
//! is called from the first input that differs. Against a counting agent (or the fake LLM)
//! on a real socket.

use std::collections::HashMap;
use std::sync::Arc;

use trellis_engine::event::{self, Event};
use trellis_engine::execute::{self, RunOptions, TurnMemo};
use trellis_engine::plan::{Plan, Selection};
use trellis_engine::record::{NodeRecord, TrajectoryRecord};
use trellis_testkit::{MisbehavingServer, OK_BODY};

pub(crate) fn plan(text: &str) -> Plan {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("suite.kdl");
    std::fs::write(&path, text).unwrap();
    let project =
        trellis_dsl::load(&[&path], &trellis_engine::protocol::registry::specs()).unwrap();
    Plan::build_with_env(
        &project,
        &Selection::default(),
        Arc::new(Default::default()),
    )
    .unwrap()
}

/// A run's options: `jobs` calls at once, turns answered from `reuse`, `first` started first.
fn options(jobs: usize, reuse: Option<Arc<TurnMemo>>, first: Vec<usize>) -> RunOptions {
    RunOptions {
        run_id: "reuse".into(),
        jobs,
        stop: Default::default(),
        abandon: Default::default(),
        grace_end: Default::default(),
        strict: false,
        reuse,
        transport: None,
        llm_cache: trellis_engine::llm::LlmCache::disabled(),
        launcher: Some(Arc::new(trellis_agents::BuiltinLauncher::new())),
        resume: None,
        replay_users: None,
        first,
        llm_budget: Default::default(),
        telemetry: Default::default(),
    }
}

/// One run with `memo`; its nodes and trajectories.
pub(crate) async fn run(
    plan: Plan,
    memo: &Arc<TurnMemo>,
    salt: u64,
) -> (Vec<NodeRecord>, Vec<TrajectoryRecord>) {
    let salts: HashMap<String, u64> = plan
        .scenarios
        .iter()
        .map(|s| (format!("{}/{}", s.suite, s.scenario.id.value), salt))
        .collect();
    memo.begin_run(salts);
    let options = options(4, Some(memo.clone()), Vec::new());
    let (tx, mut rx) = event::channel();
    let engine = execute::spawn(plan, options, tx);
    let mut nodes = Vec::new();
    let mut trajectories = Vec::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Node(n) => nodes.push(n),
            Event::Trajectory(t) => trajectories.push(*t),
            _ => {}
        }
    }
    engine.await.unwrap();
    memo.finish_run(true);
    (nodes, trajectories)
}

fn suite(url: &str, right: &str, max: u32) -> String {
    format!(
        r#"agent "bot" protocol="connexity" url="{url}"
scenario "s" {{
    user "hello"
    branch "left" {{
        user "go left"
    }}
    branch "right" {{
        user "{right}"
        user "and on"
    }}
    criteria {{
        turns max={max}
    }}
}}
"#
    )
}

#[tokio::test]
async fn a_changed_branch_calls_the_agent_from_its_first_changed_step_only() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let memo = Arc::new(TurnMemo::new());
    let (first_nodes, first) = run(plan(&suite(&agent.url(), "go right", 5)), &memo, 1).await;
    assert_eq!(agent.requests(), 4);
    assert_eq!(first.len(), 2);
    let ids = |nodes: &[NodeRecord]| {
        type Ids = (String, u32, Option<Arc<str>>, Option<String>);
        let mut ids: Vec<Ids> = nodes
            .iter()
            .flat_map(|n| {
                n.turns.iter().map(|t| {
                    (
                        n.node.clone(),
                        t.turn_index,
                        t.trace_id.clone(),
                        t.span_id.clone(),
                    )
                })
            })
            .collect();
        ids.sort();
        ids
    };
    // Each turn's ids are those its request carried.
    for (_, _, trace, span) in ids(&first_nodes) {
        let traceparent = format!("00-{}-{}-01", trace.unwrap(), span.unwrap());
        assert!(
            agent
                .recorded()
                .iter()
                .any(|r| r.header("traceparent").as_deref() == Some(traceparent.as_str())),
            "{traceparent}"
        );
    }

    // Nothing changed: nothing is called, every turn is marked reused, and keeps the ids
    // its request carried (its spans name them).
    let (nodes, again) = run(plan(&suite(&agent.url(), "go right", 5)), &memo, 1).await;
    assert_eq!(agent.requests(), 4);
    assert!(nodes.iter().flat_map(|n| &n.turns).all(|t| t.reused));
    assert_eq!(ids(&nodes), ids(&first_nodes));
    assert_eq!(memo.calls(), 0);
    for t in &again {
        assert_eq!(
            t.turns,
            first
                .iter()
                .find(|f| f.trajectory == t.trajectory)
                .unwrap()
                .turns
        );
    }

    // One branch: its two steps only, on top of the rebuilt history.
    run(plan(&suite(&agent.url(), "go RIGHT", 5)), &memo, 1).await;
    assert_eq!(agent.requests(), 6);
    let sent = agent.recorded();
    let history = sent[4].json();
    let messages: Vec<&str> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        messages,
        ["hello", "Hello there.", "go RIGHT"],
        "the reused turn is in the history"
    );

    // Checks only: re-checked, not called, and the new limit decides.
    let (_, checked) = run(plan(&suite(&agent.url(), "go RIGHT", 1)), &memo, 1).await;
    assert_eq!(agent.requests(), 6);
    assert!(
        checked
            .iter()
            .all(|t| t.status == trellis_engine::record::TrajectoryStatus::Failed)
    );

    // Another salt (the agent's definition changed): everything is called again.
    run(plan(&suite(&agent.url(), "go RIGHT", 5)), &memo, 2).await;
    assert_eq!(agent.requests(), 10);
}

#[tokio::test]
async fn a_recorded_fault_is_reused_until_the_steps_change() {
    let agent = MisbehavingServer::respond(500, "down").await;
    let memo = Arc::new(TurnMemo::new());
    let text = suite(&agent.url(), "go right", 5);
    let (_, first) = run(plan(&text), &memo, 1).await;
    let calls = agent.requests();
    assert!(first.iter().all(|t| t.fault.is_some()));
    let (_, again) = run(plan(&text), &memo, 1).await;
    assert_eq!(
        agent.requests(),
        calls,
        "the same conversation, the same answer"
    );
    assert!(again.iter().all(|t| t.fault.is_some()));
}

/// An agent that was down answered nothing of the conversation: its "connection refused"
/// is not replayed once it is back up (watch reported a working agent as refusing
/// connections until a step changed), while a 500 above is kept.
#[tokio::test]
async fn an_agent_that_was_down_is_asked_again_when_it_is_back() {
    let addr = trellis_testkit::closed_port().await;
    let url = format!("http://{addr}/agent/respond");
    let memo = Arc::new(TurnMemo::new());
    let text = suite(&url, "go right", 5);
    let (_, down) = run(plan(&text), &memo, 1).await;
    assert!(down.iter().all(|t| {
        t.fault
            .as_ref()
            .is_some_and(|f| f.category == trellis_engine::record::FaultCategory::Connect)
    }));
    let agent = trellis_testkit::MisbehavingServer::start_at(
        addr,
        trellis_testkit::Behavior::Respond {
            status: 200,
            body: trellis_testkit::OK_BODY.into(),
        },
    )
    .await;
    let (_, back) = run(plan(&text), &memo, 1).await;
    assert!(agent.requests() > 0, "the agent was not asked again");
    assert!(back.iter().all(|t| t.fault.is_none()), "{back:?}");
}

fn support_suite(approval: &str) -> String {
    format!(
        r##"agent "desk" protocol="multiagent" builtin="support"
tool "apply_refund" {{
    policy "amount" max=50
    mock returns=#"{{"status": "success"}}"# {{
        state path="orders.A-1001.refund" value="partial"
    }}
}}
tool "set_credit_limit" {{
    mock returns=#"{{"status": "success"}}"# {{
        state path="limit" value=900
    }}
}}
scenario "refund" {{
    user "Refund $120 for order A-1001"
    expect violations max=1
    criteria {{
        state path="orders.A-1001.refund" equals="partial"
    }}
}}
scenario "credit" {{
    user "Raise the credit limit of customer C-7 to 900"
    branch "approved" {{
        hitl approve message="{approval}"
        expect state path="limit" equals=900
    }}
    branch "rejected" {{
        hitl reject
        expect state path="limit" absent=#true
    }}
}}
scenario "complaint" {{
    user "Resolve the complaint on order A-1001"
    expect no-error
}}
"##
    )
}

/// MultiAgentEval sessions are rebuilt from the recorded replies as turns are reused: the
/// tool sandbox, a pending pause and a fork the agent asked for come back without calling
/// the agent, so checks on them still hold, and a changed step calls only from there.
#[tokio::test]
async fn multiagent_sessions_are_rebuilt_from_the_records() {
    let memo = Arc::new(TurnMemo::new());
    let (_, first) = run(plan(&support_suite("Go ahead")), &memo, 1).await;
    let called = memo.calls();
    assert!(called > 0);
    let statuses = |ts: &[TrajectoryRecord]| {
        let mut s: Vec<(String, String)> = ts
            .iter()
            .map(|t| (t.trajectory.clone(), t.status.as_str().to_owned()))
            .collect();
        s.sort();
        s
    };
    assert!(
        first.iter().all(|t| t.status.as_str() == "passed"),
        "{first:#?}"
    );

    let (nodes, again) = run(plan(&support_suite("Go ahead")), &memo, 1).await;
    assert_eq!(memo.calls(), 0, "nothing changed: no agent call");
    assert!(nodes.iter().flat_map(|n| &n.turns).all(|t| t.reused));
    assert_eq!(statuses(&again), statuses(&first));
    assert!(again.iter().any(|t| t.trajectory == "main~replacement"));
    let refund = again.iter().find(|t| t.scenario == "refund").unwrap();
    assert_eq!(
        refund.sandbox_state.as_ref().unwrap()["orders"]["A-1001"]["refund"],
        "partial"
    );

    // A changed human answer calls the agent for that branch's turn only.
    let (_, changed) = run(plan(&support_suite("Fine by me")), &memo, 1).await;
    assert_eq!(memo.calls(), 1, "only the approved branch's answer");
    assert_eq!(statuses(&changed), statuses(&first));
}

fn openai_suite(base_url: &str, last: &str) -> String {
    format!(
        r#"agent "bot" protocol="openai" base-url="{base_url}" model="m" tools="ticket"
tool "ticket" {{
    sequence {{ output "T-1"; output "T-2"; output "T-3"; }}
}}
scenario "s" {{
    user "next ticket please"
    user "thanks"
    user "{last}"
}}
"#
    )
}

/// An `openai` agent's conversation lives in the session: a reused prefix (a tool call and
/// its result included) is rebuilt from the records without calling the model, and the
/// first changed step is sent with that whole history, the sandbox where the prefix left it.
#[tokio::test]
async fn openai_sessions_are_rebuilt_from_the_records_tool_calls_included() {
    use crate::support::llm::{FakeLlm, Reply, Rule};
    use serde_json::json;

    let fake = FakeLlm::start(vec![
        Rule::when("ticket please", [Reply::tool_call("ticket", json!({}))]),
        Rule::when("T-", [Reply::text("Opened.")]),
        Rule::otherwise([Reply::text("ok")]),
    ])
    .await;
    let memo = Arc::new(TurnMemo::new());
    let (_, first) = run(
        plan(&openai_suite(&fake.base_url(), "another ticket please")),
        &memo,
        1,
    )
    .await;
    assert!(first[0].fault.is_none(), "{first:#?}");
    assert_eq!(fake.calls(), 5, "two rounds, one, two rounds");

    let (nodes, _) = run(
        plan(&openai_suite(&fake.base_url(), "another ticket please")),
        &memo,
        1,
    )
    .await;
    assert_eq!(fake.calls(), 5, "nothing changed: the model is not called");
    assert!(nodes.iter().flat_map(|n| &n.turns).all(|t| t.reused));

    let (nodes, changed) = run(
        plan(&openai_suite(&fake.base_url(), "one more ticket please")),
        &memo,
        1,
    )
    .await;
    assert!(changed[0].fault.is_none(), "{changed:#?}");
    assert_eq!(fake.calls(), 7, "only the changed step's two rounds");
    let turns: Vec<_> = nodes.iter().flat_map(|n| &n.turns).collect();
    assert_eq!(
        turns.iter().map(|t| t.reused).collect::<Vec<_>>(),
        [true, true, false]
    );
    // The sequence moved on with the reused call, as it did when it was made.
    assert_eq!(turns[2].tool_calls[0].result.as_deref(), Some(r#""T-2""#));

    let seen = fake.seen();
    let messages = seen[5].body["messages"].as_array().unwrap();
    let shape: Vec<(&str, &str)> = messages
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or(""),
                m["content"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("user", "next ticket please"),
            ("assistant", ""),
            ("tool", r#""T-1""#),
            ("assistant", "Opened."),
            ("user", "thanks"),
            ("assistant", "ok"),
            ("user", "one more ticket please"),
        ],
        "{messages:#?}"
    );
    assert_eq!(messages[1]["tool_calls"][0]["function"]["name"], "ticket");
    assert_eq!(messages[1]["tool_calls"][0]["id"], "call_0");
    assert_eq!(messages[2]["tool_call_id"], "call_0");
}

/// A suite of one-turn scenarios named `ids`, against the Connexity agent at `url`.
fn one_turn_scenarios(url: &str, ids: &[impl AsRef<str>]) -> String {
    let mut text = format!("agent \"bot\" protocol=\"connexity\" url=\"{url}\"\n");
    for id in ids {
        let id = id.as_ref();
        text.push_str(&format!("scenario \"{id}\" {{\n    user \"hi\"\n}}\n"));
    }
    text
}

/// The scenarios of `text` in the order their trajectories finished, with one call slot and
/// the scenarios `first` started first.
async fn finished_in(text: &str, first: Vec<usize>) -> Vec<String> {
    let (tx, mut rx) = event::channel();
    let engine = execute::spawn(plan(text), options(1, None, first), tx);
    let mut order = Vec::new();
    while let Some(event) = rx.recv().await {
        if let Event::Trajectory(t) = event {
            order.push(t.scenario.clone());
        }
    }
    engine.await.unwrap();
    order
}

/// `RunOptions::first` (what watch starts first: the scenarios a save changed) decides which
/// scenarios take the call slots first; with one slot, the order they finish in.
#[tokio::test]
async fn the_scenarios_named_first_start_before_the_others() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let text = one_turn_scenarios(&agent.url(), &["a", "b", "c", "d"]);
    assert_eq!(finished_in(&text, Vec::new()).await, ["a", "b", "c", "d"]);
    // Named twice, or past the plan: each scenario still runs once.
    assert_eq!(
        finished_in(&text, vec![3, 1, 3, 9]).await,
        ["d", "b", "a", "c"]
    );
    assert_eq!(agent.requests(), 8);
}

/// A scenario's plan (and the suite model it holds) is freed when the scenario ends, not
/// with the run: a run of tens of thousands of scenarios would otherwise hold them all
/// beside its results until its last scenario ends. One call at a time to an agent that
/// takes 50 ms, so that each result is read while the next call is under way.
#[tokio::test]
async fn a_scenarios_plan_is_freed_when_the_scenario_ends() {
    let agent = MisbehavingServer::start(trellis_testkit::Behavior::Delayed {
        delay: std::time::Duration::from_millis(50),
        body: OK_BODY.to_string(),
    })
    .await;
    let ids = ["a", "b", "c", "d"];
    let text = one_turn_scenarios(&agent.url(), &ids);
    let plan = plan(&text);
    let models: Vec<std::sync::Weak<trellis_dsl::model::Scenario>> = plan
        .scenarios
        .iter()
        .map(|s| Arc::downgrade(&s.scenario))
        .collect();
    let alive = |models: &[std::sync::Weak<_>]| -> Vec<&str> {
        ids.iter()
            .zip(models)
            .filter(|(_, m)| m.strong_count() > 0)
            .map(|(id, _)| *id)
            .collect()
    };
    let (tx, mut rx) = event::channel();
    let engine = execute::spawn(plan, options(1, None, Vec::new()), tx);
    let mut seen = Vec::new();
    while let Some(event) = rx.recv().await {
        if let Event::Trajectory(t) = event {
            seen.push((t.scenario.clone(), alive(&models)));
        }
    }
    engine.await.unwrap();
    assert_eq!(seen.len(), 4, "{seen:?}");
    // Not freed before it ran.
    assert!(
        ["b", "c", "d"].iter().all(|id| seen[0].1.contains(id)),
        "{seen:?}"
    );
    // When the third result comes, the last scenario's call is under way and the first two
    // have ended (the second one 50 ms before): theirs are freed, the last one's is not.
    assert_eq!(seen[2].0, "c");
    assert!(
        !["a", "b"].iter().any(|id| seen[2].1.contains(id)) && seen[2].1.contains(&"d"),
        "{seen:?}"
    );
    assert!(alive(&models).is_empty());
}

/// More scenarios than the run starts at once (three per job): the ones started as others
/// end follow the same order, `first` and then the plan's.
#[tokio::test]
async fn the_order_holds_past_the_scenarios_started_at_once() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let ids: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
    let text = one_turn_scenarios(&agent.url(), &ids);
    assert_eq!(finished_in(&text, Vec::new()).await, ids);
    assert_eq!(
        finished_in(&text, vec![9, 4]).await,
        ["s9", "s4", "s0", "s1", "s2", "s3", "s5", "s6", "s7", "s8"]
    );
    assert_eq!(agent.requests(), 20);
}
