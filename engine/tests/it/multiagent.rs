//! The MultiAgentEval session against real agents: an axum HTTP agent, python3 processes
//! (long-lived and one per call) and a TCP agent, all written here. Each test drives the
//! session directly and checks what the agent received on the wire.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use trellis_engine::protocol::multiagent::session::{
    MultiAgentClient, MultiAgentOptions, MultiAgentSession, is_violation,
};
use trellis_engine::protocol::{AgentProtocol, Conversation, Session, Turn, TurnInput};
use trellis_engine::record::FaultCategory;
use trellis_engine::sandbox::{Exhausted, Policy, SandboxSpec, ToolAnswer, ToolSpec};
use trellis_engine::transport::http::{CallLimits, HttpTransport, RetryPolicy};
use trellis_engine::transport::line::{LineLimits, ProcessMode};

use crate::support::ctx;

type Decide = fn(&Value) -> Value;

/// What an agent received, in order.
type Received = Arc<Mutex<Vec<Value>>>;

/// An HTTP agent at `POST /execute_task` answering every request with `decide(request)`.
async fn http_agent(decide: Decide) -> (String, Received) {
    let received: Received = Arc::default();
    let router = Router::new()
        .route(
            "/execute_task",
            post(
                |State((decide, seen)): State<(Decide, Received)>,
                 axum::Json(request): axum::Json<Value>| async move {
                    let answer = decide(&request);
                    seen.lock().unwrap().push(request);
                    axum::Json(answer)
                },
            ),
        )
        .with_state((decide, received.clone()));
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (format!("http://{addr}/execute_task"), received)
}

fn http_client(url: &str, options: MultiAgentOptions) -> MultiAgentClient {
    MultiAgentClient::http(
        url,
        Vec::new(),
        CallLimits::default(),
        RetryPolicy::default(),
        HttpTransport::new(),
        options,
    )
    .unwrap()
}

const LINE_LIMITS: LineLimits = LineLimits {
    timeout: Duration::from_secs(10),
    max_line: 1024 * 1024,
};

fn options(tools: Vec<(&str, ToolSpec)>) -> MultiAgentOptions {
    let spec = SandboxSpec {
        tools: tools
            .into_iter()
            .map(|(name, tool)| (name.to_owned(), tool))
            .collect::<HashMap<_, _>>(),
        ..SandboxSpec::default()
    };
    MultiAgentOptions {
        sandbox: Arc::new(spec),
        ..MultiAgentOptions::default()
    }
}

fn customer_tools() -> MultiAgentOptions {
    options(vec![(
        "get_customer_details",
        ToolSpec::fixed(json!({"customer": "Jane Doe", "tier": "100 Mbps"})),
    )])
}

fn conversation() -> Conversation<'static> {
    Conversation {
        run_id: "run1",
        suite: "s",
        scenario: "sc",
        repetition: 0,
        node: "start",
        sandbox: None,
        llm: None,
    }
}

async fn user(session: &mut MultiAgentSession, text: &str) -> Turn {
    session.take_turn(TurnInput::User(text), &ctx(0)).await
}

fn task(request: &Value) -> &str {
    request["task_description"].as_str().unwrap_or_default()
}

/// The exact feedback the spec's harness sends for the customer lookup.
const CUSTOMER_FEEDBACK: &str = "Tool 'get_customer_details' returned: {\"customer\": \"Jane Doe\", \"tier\": \"100 Mbps\"}. Continue with the task.";

/// Looks the customer up, then answers from what the environment said.
fn customer_agent(request: &Value) -> Value {
    if task(request).starts_with("Tool 'get_customer_details' returned:") {
        json!({"action": "final_answer", "summary": "Jane Doe, 100 Mbps",
               "metadata": {"model": "ref-agent-1"}})
    } else {
        json!({"action": "call_tool", "tool_name": "get_customer_details",
               "tool_params": {"customer_id": "cust_123"},
               "tool_output": {"customer": "made up"}})
    }
}

#[tokio::test]
async fn a_tool_loop_over_http_feeds_the_sandbox_result_back() {
    let (url, received) = http_agent(customer_agent).await;
    let client = http_client(&url, customer_tools());
    let mut session = client.session();
    let turn = user(&mut session, "Identify the customer.").await;
    assert!(turn.fault.is_none(), "{:?}", turn.fault);
    assert_eq!(turn.reply.as_deref(), Some("Jane Doe, 100 Mbps"));
    assert_eq!(turn.model.as_deref(), Some("ref-agent-1"));
    assert_eq!(turn.exchanges.len(), 2);
    assert_eq!(&*turn.exchanges[0].label, "POST /execute_task");
    let requests = received.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    assert_eq!(task(&requests[0]), "Identify the customer.");
    assert_eq!(task(&requests[1]), CUSTOMER_FEEDBACK);
    assert_eq!(requests[1]["turn"], json!(2));
    // The environment entry carries the sandbox's result, not the agent's claimed output.
    assert_eq!(
        requests[1]["conversation_history"][2],
        json!({"role": "environment", "content": {"customer": "Jane Doe", "tier": "100 Mbps"}})
    );
    assert_eq!(turn.tool_calls.len(), 1);
    let call = &turn.tool_calls[0];
    assert_eq!(call.name, "get_customer_details");
    assert_eq!(call.arguments, r#"{"customer_id":"cust_123"}"#);
    // As the feedback quotes it (`json.dumps`).
    assert_eq!(
        call.result.as_deref(),
        Some(r#"{"customer": "Jane Doe", "tier": "100 Mbps"}"#)
    );
    let roles: Vec<&str> = turn.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["assistant", "tool", "assistant"]);
    // The agent's own tool_output stays in the recorded reply.
    assert!(
        turn.messages[0]
            .content
            .as_deref()
            .is_some_and(|c| c.contains("made up")),
        "{:?}",
        turn.messages[0]
    );
    assert_eq!(turn.messages[0].tool_calls[0].id, call.call_id);
    assert_eq!(
        turn.messages[1].tool_call_id.as_deref(),
        Some(call.call_id.as_str())
    );
}

/// Asks for $100, then corrects itself to the limit the governance error named.
fn refund_agent(request: &Value) -> Value {
    let task = task(request);
    if task.starts_with("GOVERNANCE ERROR") {
        json!({"action": "call_tool", "tool_name": "apply_refund", "tool_params": {"amount": 50}})
    } else if task.starts_with("Tool 'apply_refund' returned:") {
        json!({"action": "final_answer", "summary": "Refunded $50."})
    } else {
        json!({"action": "call_tool", "tool_name": "apply_refund", "tool_params": {"amount": 100}})
    }
}

fn refund_tools() -> MultiAgentOptions {
    options(vec![(
        "apply_refund",
        ToolSpec {
            policies: vec![Policy::max_limit(50.0)],
            ..ToolSpec::fixed(json!({"status": "success", "refunded": true}))
        },
    )])
}

#[tokio::test]
async fn a_policy_breach_is_fed_back_and_the_agent_self_corrects() {
    let (url, received) = http_agent(refund_agent).await;
    let client = http_client(&url, refund_tools());
    let mut session = client.session();
    let turn = user(&mut session, "Refund $100.").await;
    assert!(turn.fault.is_none(), "{:?}", turn.fault);
    assert_eq!(turn.reply.as_deref(), Some("Refunded $50."));
    let requests = received.lock().unwrap().clone();
    assert_eq!(
        task(&requests[1]),
        "GOVERNANCE ERROR: Amount 100 exceeds limit of 50.0. Please adjust your action."
    );
    assert_eq!(
        task(&requests[2]),
        "Tool 'apply_refund' returned: {\"status\": \"success\", \"refunded\": true}. Continue with the task."
    );
    assert_eq!(turn.tool_calls.len(), 2);
    assert!(
        is_violation(&turn.tool_calls[0]),
        "{:?}",
        turn.tool_calls[0]
    );
    assert!(
        !is_violation(&turn.tool_calls[1]),
        "{:?}",
        turn.tool_calls[1]
    );
    assert_eq!(session.violation_count(), 1);
    let boxed: &dyn Session = &session;
    assert_eq!(boxed.sandbox().map(|s| s.violation_count()), Some(1));
}

fn slow_agent(request: &Value) -> Value {
    if request["turn"] == json!(1) {
        json!({"action": "processing"})
    } else {
        json!({"action": "completed", "result": "All done."})
    }
}

#[tokio::test]
async fn processing_resends_the_same_task() {
    let (url, received) = http_agent(slow_agent).await;
    let mut session = http_client(&url, MultiAgentOptions::default()).session();
    let turn = user(&mut session, "Do the thing.").await;
    assert!(turn.fault.is_none(), "{:?}", turn.fault);
    assert_eq!(turn.reply.as_deref(), Some("All done."));
    let requests = received.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    assert_eq!(task(&requests[1]), "Do the thing.");
    assert_eq!(requests[1]["turn"], json!(2));
    assert_eq!(requests[1]["conversation_history"], json!([]));
    assert_eq!(turn.messages.len(), 2);
}

fn endless_agent(_: &Value) -> Value {
    json!({"action": "call_tool", "tool_name": "check_status", "tool_params": {}})
}

#[tokio::test]
async fn the_action_cap_ends_the_loop_with_a_fault() {
    let (url, received) = http_agent(endless_agent).await;
    let mut session = http_client(&url, MultiAgentOptions::default()).session();
    let turn = user(&mut session, "Check the status.").await;
    let fault = turn.fault.unwrap();
    assert_eq!(fault.category, FaultCategory::Protocol);
    assert!(
        fault.message.contains("no final answer after 5 actions"),
        "{}",
        fault.message
    );
    assert_eq!(received.lock().unwrap().len(), 5);
    assert_eq!(turn.tool_calls.len(), 5);
    // The harness default answers an undeclared tool.
    assert_eq!(
        turn.tool_calls[0].result.as_deref(),
        Some(r#"{"status": "success", "message": "Executed check_status"}"#)
    );
    assert_eq!(turn.reply, None);
}

#[tokio::test]
async fn an_unknown_action_and_an_error_end_the_turn_with_faults() {
    fn dancer(_: &Value) -> Value {
        json!({"action": "dance", "summary": "Dancing"})
    }
    fn refuser(_: &Value) -> Value {
        json!({"action": "error", "message": "I cannot handle refunds"})
    }
    let (url, _) = http_agent(dancer).await;
    let turn = user(
        &mut http_client(&url, MultiAgentOptions::default()).session(),
        "Dance.",
    )
    .await;
    let fault = turn.fault.unwrap();
    assert_eq!(fault.category, FaultCategory::AgentError);
    assert!(fault.message.contains("dance"), "{}", fault.message);

    let (url, _) = http_agent(refuser).await;
    let turn = user(
        &mut http_client(&url, MultiAgentOptions::default()).session(),
        "Refund.",
    )
    .await;
    let fault = turn.fault.unwrap();
    assert_eq!(fault.category, FaultCategory::AgentError);
    assert!(
        fault.message.contains("I cannot handle refunds"),
        "{}",
        fault.message
    );
    assert_eq!(turn.reply.as_deref(), Some("I cannot handle refunds"));
}

fn brancher(request: &Value) -> Value {
    match task(request) {
        "Continue on branch 1 of 2: ground." => {
            json!({"action": "final_answer", "summary": "by ground"})
        }
        "Continue on branch 2 of 2: air." => json!({"action": "final_answer", "summary": "by air"}),
        _ => {
            json!({"action": "branch", "metadata": {"reason": "try both carriers", "options": ["ground", "air"]}})
        }
    }
}

#[tokio::test]
async fn a_branch_action_ends_the_turn_and_each_copy_continues_one_alternative() {
    let (url, received) = http_agent(brancher).await;
    let mut session = http_client(&url, MultiAgentOptions::default()).session();
    let turn = user(&mut session, "Ship it.").await;
    assert!(turn.fault.is_none(), "{:?}", turn.fault);
    let branch = turn.branch.expect("a branch request");
    assert_eq!(branch.reason.as_deref(), Some("try both carriers"));
    assert_eq!(branch.options, vec!["ground", "air"]);
    assert_eq!(turn.reply.as_deref(), Some("try both carriers"));
    // Anything but a continuation is refused while the fork waits.
    let mut wrong = session.clone();
    let refused = user(&mut wrong, "Hello?").await;
    assert_eq!(refused.fault.unwrap().category, FaultCategory::Protocol);

    let mut copy = session.clone();
    let first = session
        .take_turn(
            TurnInput::Branch {
                index: 0,
                count: 2,
                option: "ground",
            },
            &ctx(1),
        )
        .await;
    let second = copy
        .take_turn(
            TurnInput::Branch {
                index: 1,
                count: 2,
                option: "air",
            },
            &ctx(1),
        )
        .await;
    assert_eq!(
        first.reply.as_deref(),
        Some("by ground"),
        "{:?}",
        first.fault
    );
    assert_eq!(
        second.reply.as_deref(),
        Some("by air"),
        "{:?}",
        second.fault
    );
    // The continuation carries the branch in the history, after the agent's branch reply.
    let seen = received.lock().unwrap().clone();
    let last = seen.last().unwrap();
    let history = last["conversation_history"].as_array().unwrap();
    assert_eq!(history[1]["content"]["action"], "branch");
    assert_eq!(
        history[2],
        json!({"role": "environment", "content": {"branch": {"index": 2, "count": 2, "option": "air", "reason": "try both carriers"}}})
    );
}

fn cautious_agent(request: &Value) -> Value {
    if task(request).starts_with("Approved") {
        json!({"action": "final_answer", "summary": "Refunded $600."})
    } else {
        json!({"action": "hitl_pause", "prompt": "Approve a $600 refund?"})
    }
}

#[tokio::test]
async fn a_hitl_pause_waits_for_the_human_answer() {
    let (url, received) = http_agent(cautious_agent).await;
    let mut session = http_client(&url, MultiAgentOptions::default()).session();
    let turn = user(&mut session, "Refund $600.").await;
    assert!(turn.fault.is_none(), "{:?}", turn.fault);
    assert_eq!(turn.reply.as_deref(), Some("Approve a $600 refund?"));
    assert_eq!(session.paused(), Some("Approve a $600 refund?"));

    // A user message while paused is refused, and the pause stands.
    let wrong = user(&mut session, "Hello?").await;
    assert_eq!(wrong.fault.unwrap().category, FaultCategory::Protocol);
    assert!(wrong.exchanges.is_empty());

    let human = TurnInput::Human {
        approve: true,
        message: Some("go ahead"),
    };
    let turn = session.take_turn(human, &ctx(1)).await;
    assert!(turn.fault.is_none(), "{:?}", turn.fault);
    assert_eq!(turn.reply.as_deref(), Some("Refunded $600."));
    assert_eq!(session.paused(), None);
    let requests = received.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    assert_eq!(task(&requests[1]), "Approved: go ahead");
    let roles: Vec<&str> = requests[1]["conversation_history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "agent"]);
    // The human entry enters the history once the agent answered it.
    let roles: Vec<&str> = session
        .dialogue()
        .history()
        .iter()
        .map(|entry| entry.role())
        .collect();
    assert_eq!(roles, ["user", "agent", "human", "agent"]);

    // A human answer with no pause waiting is a fault.
    let stray = session.take_turn(human, &ctx(2)).await;
    let fault = stray.fault.unwrap();
    assert_eq!(fault.category, FaultCategory::Protocol);
    assert!(fault.message.contains("did not pause"), "{}", fault.message);
}

/// Calls `next` once per user message, then reports what it got.
fn counting_agent(request: &Value) -> Value {
    let task = task(request);
    match task.strip_prefix("Tool 'next' returned: ") {
        Some(result) => json!({"action": "final_answer", "summary": result}),
        None => json!({"action": "call_tool", "tool_name": "next", "tool_params": {}}),
    }
}

#[tokio::test]
async fn a_fork_copies_the_dialogue_and_the_sandbox_independently() {
    let (url, received) = http_agent(counting_agent).await;
    let client = http_client(
        &url,
        options(vec![(
            "next",
            ToolSpec {
                answer: ToolAnswer::Sequence {
                    outputs: vec![json!({"n": 1}), json!({"n": 2}), json!({"n": 3})],
                    when_exhausted: Exhausted::Error,
                },
                ..ToolSpec::default()
            },
        )]),
    );
    let mut original = client.open(&conversation());
    let first = original.turn(TurnInput::User("one"), &ctx(0)).await;
    assert_eq!(
        first.reply.as_deref(),
        Some("{\"n\": 1}. Continue with the task.")
    );
    let mut fork = original.fork().expect("history-resending sessions fork");
    let a = original.turn(TurnInput::User("two"), &ctx(1)).await;
    let b = fork.turn(TurnInput::User("two, forked"), &ctx(1)).await;
    // Each copy has its own sequence cursor.
    assert_eq!(
        a.reply.as_deref(),
        Some("{\"n\": 2}. Continue with the task.")
    );
    assert_eq!(
        b.reply.as_deref(),
        Some("{\"n\": 2}. Continue with the task.")
    );
    let c = original.turn(TurnInput::User("three"), &ctx(2)).await;
    assert_eq!(
        c.reply.as_deref(),
        Some("{\"n\": 3}. Continue with the task.")
    );
    assert_eq!(original.sandbox().map(|s| s.calls().len()), Some(3));
    assert_eq!(fork.sandbox().map(|s| s.calls().len()), Some(2));
    // Both copies resent the same prefix.
    let requests = received.lock().unwrap().clone();
    let second_turn: Vec<&Value> = requests
        .iter()
        .filter(|r| matches!(task(r), "two" | "two, forked"))
        .collect();
    assert_eq!(second_turn.len(), 2);
    assert_eq!(
        second_turn[0]["conversation_history"],
        second_turn[1]["conversation_history"]
    );
    assert_eq!(
        second_turn[0]["conversation_history"]
            .as_array()
            .map(Vec::len),
        Some(4)
    );
}

/// A python3 agent: looks the customer up, then answers; it echoes each task on stderr.
const PYTHON_AGENT: &str = r#"
import json, sys
def answer(request):
    task = request.get("task_description", "")
    print("task: " + task, file=sys.stderr, flush=True)
    if task.startswith("Tool 'get_customer_details' returned:"):
        return {"action": "final_answer", "summary": "Jane Doe", "agent_name": "py-agent"}
    return {"action": "call_tool", "tool_name": "get_customer_details",
            "tool_params": {"customer_id": "cust_123"}}
"#;

fn python_command(main: &str) -> String {
    let script = format!("{PYTHON_AGENT}\n{main}");
    format!("python3 -u -c '{}'", script.replace('\'', r#"'"'"'"#))
}

fn process_client(command: &str, mode: ProcessMode) -> MultiAgentClient {
    MultiAgentClient::process(
        command,
        Vec::new(),
        None,
        LINE_LIMITS,
        RetryPolicy::default(),
        MultiAgentOptions {
            process_mode: mode,
            ..customer_tools()
        },
    )
}

#[tokio::test]
async fn python_process_agents_run_the_loop_in_both_modes() {
    let long_lived = python_command(
        "for line in sys.stdin:\n    print(json.dumps(answer(json.loads(line))), flush=True)",
    );
    let per_call = python_command("print(json.dumps(answer(json.loads(sys.stdin.read()))))");
    for (command, mode) in [
        (long_lived, ProcessMode::LongLived),
        (per_call, ProcessMode::PerCall),
    ] {
        let client = process_client(&command, mode);
        let mut session = client.session();
        let turn = user(&mut session, "Identify the customer.").await;
        assert!(turn.fault.is_none(), "{mode:?}: {:?}", turn.fault);
        assert_eq!(turn.reply.as_deref(), Some("Jane Doe"), "{mode:?}");
        assert_eq!(turn.model.as_deref(), Some("py-agent"), "{mode:?}");
        // The agent's stderr is the turn's log, and shows the exact feedback it received.
        let log = turn
            .messages
            .iter()
            .find(|m| m.role == "log")
            .and_then(|m| m.content.clone())
            .unwrap_or_default();
        // stderr is read concurrently with stdout: under load the last line may land in the
        // next turn's log, never out of order or garbled.
        let expected = format!("task: Identify the customer.\ntask: {CUSTOMER_FEEDBACK}\n");
        assert!(
            log.starts_with("task: Identify the customer.\n") && expected.starts_with(&log),
            "{mode:?}: {log:?}"
        );
        client.close().await;
    }
}

/// A long-lived agent that answers one line and exits: restarted for the next call of the
/// turn (the tool loop's feedback), not a fault.
#[tokio::test]
async fn a_long_lived_process_that_exits_after_an_answer_is_started_again() {
    let command = python_command(
        "print(json.dumps(answer(json.loads(sys.stdin.readline()))), flush=True)\nsys.exit(0)",
    );
    let client = process_client(&command, ProcessMode::LongLived);
    let mut session = client.session();
    let turn = user(&mut session, "Identify the customer.").await;
    assert!(turn.fault.is_none(), "{:?}", turn.fault);
    assert_eq!(turn.reply.as_deref(), Some("Jane Doe"));
    client.close().await;
}

#[tokio::test]
async fn a_process_that_logs_on_stdout_is_a_fault_naming_the_line() {
    let client = process_client(
        r#"while read -r line; do echo '[agent] loading model'; echo '{"action":"final_answer","summary":"x"}'; done"#,
        ProcessMode::LongLived,
    );
    let turn = user(&mut client.session(), "Go.").await;
    let fault = turn.fault.unwrap();
    // The agent broke the protocol (docs/wire.md, MultiAgentEval): not an answer cut short.
    assert_eq!(fault.category, FaultCategory::Protocol);
    assert!(
        fault.message.contains("[agent] loading model"),
        "{}",
        fault.message
    );
    client.close().await;
}

/// A TCP agent speaking newline-delimited JSON; counts the connections it accepted.
async fn tcp_agent(decide: Decide) -> (String, Arc<AtomicUsize>, Received) {
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let received: Received = Arc::default();
    let (count, seen) = (connections.clone(), received.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let seen = seen.clone();
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let request: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                    let mut answer = decide(&request).to_string();
                    seen.lock().unwrap().push(request);
                    answer.push('\n');
                    if write.write_all(answer.as_bytes()).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (format!("tcp://{addr}"), connections, received)
}

#[tokio::test]
async fn a_tcp_agent_runs_the_loop_per_call_or_on_one_connection() {
    for keep_open in [false, true] {
        let (address, connections, received) = tcp_agent(customer_agent).await;
        let client = MultiAgentClient::socket(
            &address,
            LINE_LIMITS,
            RetryPolicy::default(),
            MultiAgentOptions {
                keep_open,
                ..customer_tools()
            },
        )
        .unwrap();
        let turn = user(&mut client.session(), "Identify the customer.").await;
        assert!(turn.fault.is_none(), "{:?}", turn.fault);
        assert_eq!(turn.reply.as_deref(), Some("Jane Doe, 100 Mbps"));
        let requests = received.lock().unwrap().clone();
        assert_eq!(task(&requests[1]), CUSTOMER_FEEDBACK);
        let expected = if keep_open { 1 } else { 2 };
        assert_eq!(connections.load(Ordering::SeqCst), expected, "{keep_open}");
        client.close().await;
    }
}

/// A kept connection the agent closes after each answer (as harness-style servers do) is
/// opened again for the next call, not a fault.
#[tokio::test]
async fn a_kept_connection_the_agent_closes_after_each_answer_is_opened_again() {
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let count = connections.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                if let Ok(Some(line)) = lines.next_line().await {
                    let request: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                    let mut answer = customer_agent(&request).to_string();
                    answer.push('\n');
                    let _ = write.write_all(answer.as_bytes()).await;
                }
                // Closed after one answer.
            });
        }
    });
    let client = MultiAgentClient::socket(
        &format!("tcp://{addr}"),
        LINE_LIMITS,
        RetryPolicy::default(),
        MultiAgentOptions {
            keep_open: true,
            ..customer_tools()
        },
    )
    .unwrap();
    let turn = user(&mut client.session(), "Identify the customer.").await;
    assert!(turn.fault.is_none(), "{:?}", turn.fault);
    assert_eq!(turn.reply.as_deref(), Some("Jane Doe, 100 Mbps"));
    assert_eq!(connections.load(Ordering::SeqCst), 2);
    client.close().await;
}

#[test]
fn bad_endpoints_are_setup_errors() {
    let options = MultiAgentOptions::default;
    assert!(
        MultiAgentClient::socket(
            "tcp:nowhere",
            LINE_LIMITS,
            RetryPolicy::default(),
            options()
        )
        .is_err()
    );
    assert!(
        MultiAgentClient::http(
            "ftp://host/execute_task",
            Vec::new(),
            CallLimits::default(),
            RetryPolicy::default(),
            HttpTransport::new(),
            options()
        )
        .is_err()
    );
}
