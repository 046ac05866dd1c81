//! A run journal with a forking scenario, two repetitions, a failure, a fault and a skip.

use std::io::Write;
use std::path::Path;

use trellis_records::{ChatMessage, ToolCall, ToolCallFunction};
use trellis_records::{
    CriterionRecord, CriterionStatus, Fault, FaultCategory, JournalEntry, NodeRecord, RunInfo,
    RunSummary, ScenarioInfo, ToolCallRecord, TrajectoryRecord, TrajectoryStatus, TurnRecord,
};

pub const XSS: &str = "<script>alert(1)</script>";

pub fn run_info() -> RunInfo {
    RunInfo {
        run_id: "run-1".into(),
        started_at: "2025-01-01T10:00:00Z".into(),
        trellis_version: "0.1.0".into(),
        suites: vec!["shop".into(), "smoke".into()],
        jobs: 4,
        planned_trajectories: 6,
        scenarios: vec![ScenarioInfo {
            suite: "shop".into(),
            scenario: "booking".into(),
            name: Some("Booking with a <b>price</b> question".into()),
            description: Some("The customer books a duct cleaning.".into()),
            persona: Some(serde_json::json!({
                "id": "polite-customer",
                "type": "customer",
                "description": "Polite, gives details when asked",
            })),
            user_context: serde_json::json!({"postal_code": "V4T 0A7"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            agents: vec!["demo".into()],
            trajectories: vec!["accepts".into(), "asks-price".into()],
            fingerprints: Vec::new(),
            repeat: 2,
            instance: None,
            history: None,
        }],
        rejudged_from: None,
        strict: false,
        resumed_at: Vec::new(),
    }
}

fn turn(index: u32, user: &str, reply: Option<&str>) -> TurnRecord {
    let mut messages = Vec::new();
    if let Some(reply) = reply {
        messages.push(ChatMessage::assistant(reply));
    }
    TurnRecord {
        turn_index: index,
        kind: "user".into(),
        user_message: user.into(),
        reply: reply.map(str::to_owned),
        messages,
        started_ms: 100.0 * f64::from(index),
        latency_ms: 250.0 + f64::from(index),
        prompt_tokens: Some(10),
        completion_tokens: Some(5),
        total_tokens: Some(15),
        model: Some("demo-model".into()),
        provider: Some("demo".into()),
        attempts: 1,
        ..TurnRecord::default()
    }
}

/// A turn that calls two tools before answering, with intermediate text.
fn tool_turn(index: u32) -> TurnRecord {
    let call = |id: &str, name: &str, args: &str| ToolCall {
        id: id.into(),
        kind: "function".into(),
        function: ToolCallFunction {
            name: name.into(),
            arguments: args.into(),
        },
    };
    let mut t = turn(
        index,
        "It's V4T 0A7.",
        Some("We serve V4T 0A7. The price is $120."),
    );
    t.messages = vec![
        ChatMessage {
            role: "assistant".into(),
            content: Some("Let me check the service area.".into()),
            tool_calls: vec![
                call("call-1", "check_service_area", r#"{"zone":"V4T0A7"}"#),
                call("call-2", "get_quote", r#"{"service":"duct"}"#),
            ],
            ..ChatMessage::default()
        },
        ChatMessage {
            role: "tool".into(),
            content: Some(r#"{"served":true}"#.into()),
            tool_call_id: Some("call-1".into()),
            ..ChatMessage::default()
        },
        ChatMessage::assistant("We serve V4T 0A7. The price is $120."),
    ];
    t.tool_calls = vec![
        ToolCallRecord {
            call_id: "call-1".into(),
            name: "check_service_area".into(),
            arguments: r#"{"zone":"V4T0A7"}"#.into(),
            result: Some(r#"{"served":true}"#.into()),
        },
        ToolCallRecord {
            call_id: "call-2".into(),
            name: "get_quote".into(),
            arguments: r#"{"service":"duct"}"#.into(),
            result: None,
        },
    ];
    t
}

fn criterion(turn: Option<u32>, text: &str, passed: bool, detail: Option<&str>) -> CriterionRecord {
    CriterionRecord {
        turn_index: turn,
        criterion: text.into(),
        kind: text.split_whitespace().next().unwrap_or("").into(),
        status: if passed {
            CriterionStatus::Passed
        } else {
            CriterionStatus::Failed
        },
        detail: detail.map(str::to_owned),
        judge: None,
    }
}

fn node(
    scenario: &str,
    agent: &str,
    rep: u32,
    name: &str,
    parent: Option<&str>,
    turns: Vec<TurnRecord>,
) -> NodeRecord {
    NodeRecord {
        suite: if scenario == "booking" {
            "shop"
        } else {
            "smoke"
        }
        .into(),
        scenario: scenario.into(),
        agent: agent.into(),
        repetition: rep,
        node: name.into(),
        parent: parent.map(str::to_owned),
        turns: turns.into_iter().map(std::sync::Arc::new).collect(),
    }
}

fn trajectory(
    scenario: &str,
    name: &str,
    agent: &str,
    rep: u32,
    nodes: &[&str],
    status: TrajectoryStatus,
) -> TrajectoryRecord {
    TrajectoryRecord {
        suite: if scenario == "booking" {
            "shop"
        } else {
            "smoke"
        }
        .into(),
        scenario: scenario.into(),
        trajectory: name.into(),
        agent: agent.into(),
        protocol: "connexity".into(),
        repetition: rep,
        nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
        status,
        turns: u32::try_from(nodes.len()).unwrap() + 1,
        duration_ms: 1234.5,
        fault: None,
        skip_reason: None,
        criteria: Vec::new(),
        tags: vec!["booking".into()],
        agent_branches: Vec::new(),
        awaiting_human: None,
        sandbox_state: None,
        captures: Default::default(),
        llm: None,
        attack: None,
    }
}

/// Every entry of the run, in journal order, without `run_finished`.
pub fn entries() -> Vec<JournalEntry> {
    let mut out = vec![JournalEntry::RunStarted(std::sync::Arc::new(run_info()))];
    for rep in 0..2 {
        let first = turn(
            0,
            "Hi, I'd like to book a duct cleaning.",
            Some("Sure, what is your postal code?"),
        );
        out.push(JournalEntry::Node(node(
            "booking",
            "demo",
            rep,
            "start",
            None,
            vec![first, tool_turn(1)],
        )));
        out.push(JournalEntry::Node(node(
            "booking",
            "demo",
            rep,
            "accepts",
            Some("start"),
            vec![turn(2, "Tuesday works.", Some("Booked for Tuesday."))],
        )));
        out.push(JournalEntry::Node(node(
            "booking",
            "demo",
            rep,
            "accepts/then",
            Some("accepts"),
            vec![turn(3, "Thanks, bye.", Some("Bye!"))],
        )));
        let price_reply = if rep == 1 { XSS } else { "It is $120." };
        out.push(JournalEntry::Node(node(
            "booking",
            "demo",
            rep,
            "asks-price",
            Some("start"),
            vec![turn(2, "How much is that?", Some(price_reply))],
        )));
        out.push(JournalEntry::Node(node(
            "booking",
            "demo",
            rep,
            "asks-price/then",
            Some("asks-price"),
            vec![turn(3, "Thanks, bye.", Some("Bye!"))],
        )));
        let base = vec![
            criterion(Some(0), "reply contains=\"postal code\"", true, None),
            criterion(None, "turns max=8", true, Some("4 turns")),
        ];
        let mut accepts = trajectory(
            "booking",
            "accepts",
            "demo",
            rep,
            &["start", "accepts", "accepts/then"],
            TrajectoryStatus::Passed,
        );
        accepts.criteria = base.clone();
        accepts.captures.insert("quote".into(), "120".into());
        out.push(JournalEntry::Trajectory(Box::new(accepts)));
        let status = if rep == 1 {
            TrajectoryStatus::Failed
        } else {
            TrajectoryStatus::Passed
        };
        let mut price = trajectory(
            "booking",
            "asks-price",
            "demo",
            rep,
            &["start", "asks-price", "asks-price/then"],
            status,
        );
        price.criteria = base.clone();
        if rep == 1 {
            price.criteria.insert(
                1,
                criterion(
                    Some(2),
                    r#"reply matches="\$\d+""#,
                    false,
                    Some("reply has no price: <script>alert(1)</script>"),
                ),
            );
        }
        out.push(JournalEntry::Trajectory(Box::new(price)));
    }

    let mut faulted = turn(0, "ping", None);
    faulted.fault = Some(Fault::new(FaultCategory::Http5xx, "HTTP 503 from agent"));
    faulted.attempts = 3;
    out.push(JournalEntry::Node(node(
        "ping",
        "flaky",
        0,
        "start",
        None,
        vec![faulted],
    )));
    let mut error = trajectory(
        "ping",
        "main",
        "flaky",
        0,
        &["start"],
        TrajectoryStatus::Error,
    );
    error.fault = Some(Fault::new(FaultCategory::Http5xx, "HTTP 503 from agent"));
    error.tags = Vec::new();
    out.push(JournalEntry::Trajectory(Box::new(error)));

    let mut skipped = trajectory("later", "main", "flaky", 0, &[], TrajectoryStatus::Skipped);
    skipped.skip_reason = Some("needs a judge model; none configured".into());
    skipped.turns = 0;
    out.push(JournalEntry::Trajectory(Box::new(skipped)));
    out
}

pub fn summary() -> RunSummary {
    RunSummary {
        run_id: "run-1".into(),
        finished_at: "2025-01-01T10:01:00Z".into(),
        duration_ms: 60_000.0,
        trajectories: 6,
        passed: 3,
        failed: 1,
        errors: 1,
        skipped: 1,
        invalid: 0,
        llm_roles: Default::default(),
        stopped_by: None,
        interrupted: false,
        connections_redone: Default::default(),
        requests_resent: Default::default(),
        abandoned: Vec::new(),
        turns: 13,
    }
}

pub fn write_journal(dir: &Path, entries: &[JournalEntry], tail: &str) {
    let mut file = std::fs::File::create(dir.join("journal.jsonl")).unwrap();
    for entry in entries {
        serde_json::to_writer(&mut file, entry).unwrap();
        file.write_all(b"\n").unwrap();
    }
    file.write_all(tail.as_bytes()).unwrap();
}

/// A complete journal: every entry plus `run_finished`.
pub fn write_complete_journal(dir: &Path) {
    let mut all = entries();
    all.push(JournalEntry::RunFinished(summary()));
    write_journal(dir, &all, "");
}

/// Two runs compared: one scenario and its failing branch regressed, one criterion with
/// `why` as its head failure, the rest unchanged.
pub fn compare_page(why: &str) -> trellis_reports::ComparePage {
    use trellis_reports::{
        CompareMetric, ComparePage, CompareRate, CompareRow, CompareRun, CompareTally,
    };
    let rate = |base: (u64, u64), head: (u64, u64), verdict: &str| CompareRate {
        base: Some(CompareTally {
            passed: base.0,
            samples: base.1,
        }),
        head: Some(CompareTally {
            passed: head.0,
            samples: head.1,
        }),
        delta_points: Some((head.0 as f64 / head.1 as f64 - base.0 as f64 / base.1 as f64) * 100.0),
        p_value: (base.1 > 1).then_some(0.0123),
        verdict: verdict.into(),
    };
    let row = |trajectory: &str, criterion: &str, rate: CompareRate| CompareRow {
        suite: "shop".into(),
        scenario: "booking".into(),
        trajectory: trajectory.into(),
        agent: "demo".into(),
        turn_index: (!criterion.is_empty()).then_some(2),
        criterion: criterion.into(),
        rate,
        head_failure: None,
    };
    let mut criterion = row(
        "asks-price",
        "reply matches=\"\\$\\d+\"",
        rate((2, 2), (0, 2), "regressed"),
    );
    criterion.head_failure = Some(why.into());
    ComparePage {
        base: CompareRun {
            run_id: "run-1".into(),
            name: Some("nightly".into()),
            started_at: "2025-01-01T10:00:00Z".into(),
            finished: true,
        },
        head: CompareRun {
            run_id: "run-2".into(),
            name: None,
            started_at: "2025-01-02T10:00:00Z".into(),
            finished: true,
        },
        metrics: vec![
            CompareMetric {
                metric: "pass_rate".into(),
                base: Some(1.0),
                head: Some(0.75),
                delta: Some(-0.25),
                threshold: Some(0.0),
                p_value: None,
                verdict: "regressed".into(),
                agent: None,
                why: None,
            },
            CompareMetric {
                metric: "latency_mean_ms".into(),
                base: Some(120.0),
                head: Some(118.0),
                delta: Some(-2.0),
                threshold: Some(20.0),
                p_value: None,
                verdict: "unchanged".into(),
                agent: None,
                why: None,
            },
        ],
        scenarios: vec![CompareRow {
            trajectory: String::new(),
            ..row("", "", rate((4, 4), (3, 4), "regressed"))
        }],
        branches: vec![
            row("accepts", "", rate((2, 2), (2, 2), "unchanged")),
            row("asks-price", "", rate((2, 2), (1, 2), "regressed")),
        ],
        criteria: vec![
            row("accepts", "turns max=8", rate((2, 2), (2, 2), "unchanged")),
            criterion,
        ],
        regressions: vec![format!("booking asks-price: {why}")],
        regressed: true,
        notes: Vec::new(),
    }
}
