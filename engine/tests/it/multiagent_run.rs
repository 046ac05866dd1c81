//! MultiAgentEval through the whole engine: suites run against a python3 agent process
//! (one process per call, as the real harness runs them), checking what the records say of
//! the sandbox, policies, HITL answers and the forks the agent asks for.

use trellis_engine::record::{CriterionStatus, TrajectoryRecord, TrajectoryStatus};
use trellis_engine::render::EnvSnapshot;
use trellis_testkit::{Run, run_suite};

/// A stateless support agent: every answer follows from `task_description` alone.
const AGENT: &str = r#"
import json, re, sys
req = json.loads(sys.stdin.read())
task = req.get("task_description", "")
def say(obj):
    obj["name"] = "py-desk"
    print(json.dumps(obj))
    sys.exit(0)
m = re.search(r"limit of ([0-9]+(?:[.][0-9]+)?)", task)
if task.startswith("GOVERNANCE ERROR") and m:
    say({"action": "call_tool", "tool_name": "apply_refund", "tool_params": {"order_id": "A-1", "amount": float(m.group(1))}})
if task.startswith("Tool 'get_order' returned"):
    amount = json.loads(task[len("Tool 'get_order' returned: "):task.rindex(". Continue")])["amount"]
    say({"action": "call_tool", "tool_name": "apply_refund", "tool_params": {"order_id": "A-1", "amount": amount}})
if task.startswith("Tool 'apply_refund' returned"):
    say({"action": "final_answer", "summary": "Refund done"})
if task.startswith("Crash"):
    sys.stderr.write("segfault in the planner\n")
    sys.exit(3)
if task.startswith("Refund"):
    say({"action": "call_tool", "tool_name": "get_order", "tool_params": {"order_id": "A-1"}})
if task.startswith("Raise"):
    say({"action": "hitl_pause", "reason": "Credit above 500 needs a manager"})
if task.startswith("Approved"):
    say({"action": "final_answer", "summary": "Credit raised"})
if task.startswith("Rejected"):
    say({"action": "final_answer", "summary": "Credit unchanged"})
if task.startswith("Resolve"):
    say({"action": "branch", "metadata": {"reason": "several ways", "options": ["refund", "replacement", "voucher"]}})
b = re.match(r"Continue on branch (\d+) of (\d+): (.*)\.$", task)
if b and b.group(3) == "voucher":
    say({"action": "branch", "metadata": {"reason": "voucher size", "options": ["small", "large"]}})
if b:
    say({"action": "final_answer", "summary": "Resolved by " + b.group(3)})
say({"action": "error", "summary": "Unsupported task: " + task})
"#;

struct Agent {
    _dir: tempfile::TempDir,
    command: String,
}

fn agent() -> Agent {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("agent.py");
    std::fs::write(&script, AGENT).unwrap();
    let command = format!("python3 {}", script.display());
    Agent { _dir: dir, command }
}

async fn run(agent: &Agent, scenarios: &str) -> Run {
    let suite = format!(
        r##"
agent "desk" protocol="multiagent" command="{}"
tool "get_order" {{
    mock returns=#"{{"order_id":"A-1","amount":120}}"#
}}
tool "apply_refund" {{
    policy "amount" max=50
    mock returns=#"{{"status":"refunded"}}"# {{
        state path="orders.A-1.status" value="refunded"
    }}
}}
{scenarios}
"##,
        agent.command
    );
    run_suite(&suite, 4, EnvSnapshot::default()).await
}

fn trajectory<'a>(run: &'a Run, name: &str) -> &'a TrajectoryRecord {
    run.trajectories
        .iter()
        .find(|t| t.trajectory == name)
        .unwrap_or_else(|| {
            panic!(
                "no trajectory `{name}` in {:?}",
                run.trajectories
                    .iter()
                    .map(|t| &t.trajectory)
                    .collect::<Vec<_>>()
            )
        })
}

fn check<'a>(t: &'a TrajectoryRecord, kind: &str) -> &'a trellis_engine::record::CriterionRecord {
    t.criteria
        .iter()
        .find(|c| c.kind == kind)
        .unwrap_or_else(|| panic!("no `{kind}` check in {:?}", t.criteria))
}

#[tokio::test]
async fn a_policy_breach_is_corrected_and_the_final_state_is_checked() {
    let agent = agent();
    let run = run(
        &agent,
        r##"
scenario "refund" {
    initial-state { orders { A-1 { status "open" } } }
    user "Refund order A-1"
    expect reply contains="Refund done"
    criteria {
        state path="orders.A-1.status" equals="refunded"
        state path="orders.A-1" equals-json=#"{"status": "refunded"}"#
        state path="orders.A-1.status" contains-json=#"["cancelled", "refunded"]"#
        violations max=1
        tool "apply_refund" amount=50
    }
}
scenario "refund-strict" {
    user "Refund order A-1"
    criteria {
        violations max=0
        no-error
        state path="orders.B-2.status" equals="open"
    }
}
"##,
    )
    .await;
    let refund = trajectory(&run, "main");
    let refund = if refund.scenario == "refund" {
        refund
    } else {
        run.trajectories
            .iter()
            .find(|t| t.scenario == "refund")
            .unwrap()
    };
    assert_eq!(refund.status, TrajectoryStatus::Passed, "{refund:#?}");
    assert_eq!(
        refund.sandbox_state.as_ref().unwrap()["orders"]["A-1"]["status"],
        "refunded"
    );
    // The breach went back to the agent and it retried within the limit.
    let node = run.nodes.iter().find(|n| n.scenario == "refund").unwrap();
    let calls: Vec<(&str, &str)> = node.turns[0]
        .tool_calls
        .iter()
        .map(|c| (c.name.as_str(), c.arguments.as_str()))
        .collect();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(
        calls[1].1.contains("120") && calls[2].1.contains("50"),
        "{calls:?}"
    );
    assert_eq!(node.turns[0].model.as_deref(), Some("py-desk"));

    let strict = run
        .trajectories
        .iter()
        .find(|t| t.scenario == "refund-strict")
        .unwrap();
    assert_eq!(strict.status, TrajectoryStatus::Failed);
    let violations = check(strict, "violations");
    assert_eq!(violations.status, CriterionStatus::Failed);
    assert!(
        violations
            .detail
            .as_deref()
            .unwrap()
            .contains("1 policy violation")
    );
    assert_eq!(check(strict, "no-error").status, CriterionStatus::Failed);
    let state = check(strict, "state");
    assert_eq!(state.status, CriterionStatus::Failed);
    assert!(
        state
            .detail
            .as_deref()
            .unwrap()
            .contains("not in the state"),
        "{state:?}"
    );
}

#[tokio::test]
async fn hitl_steps_answer_the_pause_and_an_unanswered_pause_is_reported() {
    let agent = agent();
    let run = run(
        &agent,
        r#"
scenario "credit" {
    user "Raise the credit limit of C-7 to 900"
    expect reply contains="manager"
    branch "approved" {
        hitl approve message="ok by me"
        expect reply equals="Credit raised"
    }
    branch "rejected" {
        hitl reject
        expect reply equals="Credit unchanged"
    }
    branch "ignored" {
        user "Any news?"
    }
    branch "left-waiting" {
        expect reply contains="manager"
    }
}
scenario "no-pause" {
    user "Refund order A-1"
    hitl approve
}
"#,
    )
    .await;
    assert_eq!(
        trajectory(&run, "approved").status,
        TrajectoryStatus::Passed,
        "{:#?}",
        trajectory(&run, "approved")
    );
    assert_eq!(
        trajectory(&run, "rejected").status,
        TrajectoryStatus::Passed
    );
    let human = run.nodes.iter().find(|n| n.node == "approved").unwrap();
    assert_eq!(human.turns[0].kind, "human");
    assert_eq!(human.turns[0].user_message, "ok by me");

    let ignored = trajectory(&run, "ignored");
    assert_eq!(ignored.status, TrajectoryStatus::Failed);
    let hitl = check(ignored, "hitl");
    assert!(
        hitl.detail
            .as_deref()
            .unwrap()
            .contains("paused for a human"),
        "{hitl:?}"
    );
    // Ending while the agent waits is not a failure in itself, and says so.
    let waiting = trajectory(&run, "left-waiting");
    assert_eq!(waiting.status, TrajectoryStatus::Passed);
    assert_eq!(
        waiting.awaiting_human.as_deref(),
        Some("Credit above 500 needs a manager")
    );
    let no_pause = run
        .trajectories
        .iter()
        .find(|t| t.scenario == "no-pause")
        .unwrap();
    assert_eq!(no_pause.status, TrajectoryStatus::Failed);
    assert!(
        check(no_pause, "hitl")
            .detail
            .as_deref()
            .unwrap()
            .contains("did not pause")
    );
}

#[tokio::test]
async fn every_alternative_of_an_agent_branch_is_explored_within_the_limits() {
    let agent = agent();
    let run = run(
        &agent,
        r#"
scenario "resolve" {
    user "Resolve the complaint on A-1"
    expect reply contains="Resolved by"
    user "Thanks"
}
"#,
    )
    .await;
    let mut names: Vec<&str> = run
        .trajectories
        .iter()
        .map(|t| t.trajectory.as_str())
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            "main~refund",
            "main~replacement",
            "main~voucher~large",
            "main~voucher~small"
        ]
    );
    let large = trajectory(&run, "main~voucher~large");
    assert_eq!(large.agent_branches.len(), 2);
    assert_eq!(large.agent_branches[0].option, "voucher");
    assert_eq!(large.agent_branches[0].index, 3);
    assert_eq!(large.agent_branches[1].depth, 2);
    assert_eq!(
        large.nodes,
        vec!["start", "start~voucher", "start~voucher~large"]
    );
    // The agent's "Thanks" is unsupported: its error ends each continuation, recorded.
    assert_eq!(large.status, TrajectoryStatus::Error);
    let replacement = run
        .nodes
        .iter()
        .find(|n| n.node == "start~replacement")
        .unwrap();
    assert_eq!(replacement.parent.as_deref(), Some("start"));
    assert_eq!(replacement.turns[0].kind, "branch");
    assert_eq!(replacement.turns[0].user_message, "replacement");
    assert_eq!(
        replacement.turns[0].reply.as_deref(),
        Some("Resolved by replacement")
    );
    // The prefix ran once: one node record for `start`.
    assert_eq!(run.nodes.iter().filter(|n| n.node == "start").count(), 1);

    // Limits: one alternative per branch action, one level deep.
    let limited = self::run(
        &agent,
        r#"
scenario "resolve" {
    agent-branches breadth=2 depth=1
    user "Resolve the complaint on A-1"
}
"#,
    )
    .await;
    let mut names: Vec<&str> = limited
        .trajectories
        .iter()
        .map(|t| t.trajectory.as_str())
        .collect();
    names.sort();
    assert_eq!(names, vec!["main~refund", "main~replacement"]);
    let first = trajectory(&limited, "main~refund");
    assert_eq!(first.agent_branches[0].unexplored, vec!["voucher"]);
    assert!(
        first.agent_branches[0]
            .limited_by
            .as_deref()
            .unwrap()
            .starts_with("breadth")
    );
}

#[tokio::test]
async fn an_agent_process_that_dies_is_a_fault_on_its_turn_and_the_run_goes_on() {
    let agent = agent();
    let run = run(
        &agent,
        r#"
scenario "crash" {
    user "Crash now"
    user "Refund order A-1"
}
scenario "fine" {
    user "Refund order A-1"
    expect reply contains="Refund done"
}
"#,
    )
    .await;
    let crash = run
        .trajectories
        .iter()
        .find(|t| t.scenario == "crash")
        .unwrap();
    assert_eq!(crash.status, TrajectoryStatus::Error);
    let fault = crash.fault.as_ref().unwrap();
    assert!(
        fault.message.contains("exit status: 3")
            && fault.message.contains("segfault in the planner"),
        "{fault:?}"
    );
    assert_eq!(crash.turns, 1);
    let fine = run
        .trajectories
        .iter()
        .find(|t| t.scenario == "fine")
        .unwrap();
    assert_eq!(fine.status, TrajectoryStatus::Passed, "{fine:#?}");
}
